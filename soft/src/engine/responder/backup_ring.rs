//! The backup ring of Lesokhin17 §5 (Figs. 5-6), for the `backup` receive-fault policy
//! (`crate::receive_fault`): a small pinned ring per queue pair, owned by the NIC's
//! driver, where a SEND whose receive buffer faults is stored and acknowledged; once the
//! fault is resolved the driver copies it into the receive buffer. Receive completions
//! are reported in order: one that arrives behind a parked message waits with it
//! ([`HeldReceive`]), as Fig. 6's NIC "does not report the reception of new packets to the
//! IOuser until all previous page faults have been handled".

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use crate::engine::{completion, Engine, KeyedExtent};
use crate::receive_fault::BACKUP_RING_MAX_MESSAGES;
use crate::{dma, Inner};
use pagewire_nic::{Access, Completion, Sge, WcOpcode, WcStatus};
use pagewire_sys::{self as sys, AnonMapping, Extent};

/// A queue pair's backup ring: pinned memory registered with this NIC (`lkey`), used as a
/// byte ring in which messages are stored whole and released in arrival order.
pub(crate) struct BackupRing {
    mem: AnonMapping,
    lkey: u32,
    /// Byte counters: the oldest byte in use and the next free byte (`end - start` used).
    start: u64,
    end: u64,
    messages: usize,
}

/// A message being stored in the backup ring (in `Incoming::parked`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parked {
    /// Where it is stored.
    pub(in crate::engine) at: u64,
    /// The ring's end counter before and after it was reserved.
    pub(in crate::engine) end_before: u64,
    pub(in crate::engine) end_after: u64,
    /// The pages of the receive buffer to fault in.
    pub(in crate::engine) fault: Extent,
    /// When the fault was taken (monotonic ns).
    pub(in crate::engine) since_ns: u64,
}

/// A receive completion the queue pair holds back until the parked messages ahead of it
/// are in place.
pub(crate) enum HeldReceive {
    /// Placed in its buffer.
    Ready(Completion),
    /// In the backup ring, to be copied into `sges` once `parked.fault` is resolved.
    Parked {
        completion: Completion,
        sges: SmallVec<[Sge; 2]>,
        parked: Parked,
    },
}

impl BackupRing {
    /// A ring over `mem`, registered (pinned) as `lkey`.
    pub(crate) fn new(mem: AnonMapping, lkey: u32) -> BackupRing {
        BackupRing {
            mem,
            lkey,
            start: 0,
            end: 0,
            messages: 0,
        }
    }

    /// The registration that pins it.
    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Room for a message of `len` bytes whose receive faulted on `fault`: where to store
    /// it, or `None` when the ring is full (the message is dropped).
    pub(in crate::engine) fn reserve(&mut self, len: u64, fault: Extent) -> Option<Parked> {
        let cap = self.mem.len() as u64;
        if len > cap || self.messages >= BACKUP_RING_MAX_MESSAGES {
            return None;
        }
        let off = self.end % cap;
        // A message is stored whole: one that would wrap starts at the ring's base.
        let pad = if off + len > cap { cap - off } else { 0 };
        if self.end + pad + len - self.start > cap {
            return None;
        }
        let at = self.mem.addr() + (self.end + pad) % cap;
        let end_before = self.end;
        self.end += pad + len;
        self.messages += 1;
        Some(Parked {
            at,
            end_before,
            end_after: self.end,
            fault,
            since_ns: sys::monotonic_ns(),
        })
    }

    /// Gives back the newest reservation (a message abandoned before its last packet).
    pub(in crate::engine) fn unreserve(&mut self, p: &Parked) {
        debug_assert_eq!(
            self.end, p.end_after,
            "only the newest reservation goes back"
        );
        self.end = p.end_before;
        self.messages -= 1;
    }

    /// Frees the oldest message, `p`.
    fn release(&mut self, p: &Parked) {
        self.start = p.end_after;
        self.messages -= 1;
        if self.messages == 0 {
            (self.start, self.end) = (0, 0);
        }
    }

    /// The stored message at `at` as the engine addresses memory.
    pub(in crate::engine) fn keyed(&self, at: u64, len: u64) -> KeyedExtent {
        KeyedExtent {
            key: self.lkey,
            addr: at,
            len,
        }
    }
}

impl Engine {
    /// Reports a receive completion of `qpn`, or holds it behind the parked messages ahead.
    pub(in crate::engine) fn complete_receive(&mut self, qpn: u32, c: Completion) {
        let Some(qp) = self.qps[qpn as usize].as_mut() else {
            return;
        };
        if qp.responder.held.is_empty() {
            let cq = qp.recv_cq;
            self.push_completion(cq, c);
        } else {
            qp.responder.held.push_back(HeldReceive::Ready(c));
        }
    }
}

impl Inner {
    /// The driver's part for the backup ring of `qpn`: resolves the fault of each parked
    /// message in order, copies it into its receive buffer and reports the completions
    /// held behind it.
    pub(in crate::engine) fn drain_held(&self, eng: &mut Engine, qpn: u32) {
        loop {
            let Some(qp) = eng.qps[qpn as usize].as_mut() else {
                return;
            };
            let Some(front) = qp.responder.held.pop_front() else {
                return;
            };
            let cq = qp.recv_cq;
            let c = match front {
                HeldReceive::Ready(c) => c,
                HeldReceive::Parked {
                    completion: c,
                    sges,
                    parked,
                } => {
                    let status = self.place_parked(&sges, c.byte_len as u64, &parked);
                    let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                    if let Some(ring) = qp.responder.backup.as_mut() {
                        ring.release(&parked);
                    }
                    let rf = &self.counters.receive_fault;
                    rf.backup_held_ns
                        .fetch_add(sys::monotonic_ns().saturating_sub(parked.since_ns), Relaxed);
                    if status != WcStatus::Success {
                        self.counters.error_completions.fetch_add(1, Relaxed);
                        let failed = completion(c.wr_id, status, WcOpcode::Recv, 0, None, qpn);
                        eng.push_completion(cq, failed);
                        let flushed = eng.enter_error(qpn, "a receive buffer is not mapped".into());
                        self.counters.error_completions.fetch_add(flushed, Relaxed);
                        continue;
                    }
                    c
                }
            };
            eng.push_completion(cq, c);
        }
    }

    /// Resolves a parked message's fault (the driver's work, timed as a responder fault)
    /// and copies it from the ring into its receive buffer.
    fn place_parked(&self, sges: &[Sge], len: u64, p: &Parked) -> WcStatus {
        if !self.resolve_responder_fault(p.fault.addr, p.fault.len, true, p.since_ns) {
            return WcStatus::LocalProtectionError;
        }
        let keyed: SmallVec<[KeyedExtent; 2]> = sges.iter().map(KeyedExtent::from).collect();
        let Ok((_held, dst)) = self.hold_own(&keyed, 0, len, Access::LOCAL_WRITE) else {
            return WcStatus::LocalProtectionError;
        };
        match dma::scatter(&dst, 0, p.at, len) {
            Ok(()) => WcStatus::Success,
            Err(_) => WcStatus::LocalProtectionError,
        }
    }
}

/// The held receives of a queue pair entering the error state: those placed complete as
/// they are, the parked ones are flushed (their bytes never reached the buffer).
pub(in crate::engine) fn flush_held(held: &mut VecDeque<HeldReceive>, qpn: u32) -> Vec<Completion> {
    held.drain(..)
        .map(|h| match h {
            HeldReceive::Ready(c) => c,
            HeldReceive::Parked { completion: c, .. } => completion(
                c.wr_id,
                WcStatus::WrFlushError,
                WcOpcode::Recv,
                0,
                None,
                qpn,
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(bytes: usize) -> BackupRing {
        BackupRing::new(AnonMapping::new(bytes).unwrap(), 0)
    }

    fn page() -> Extent {
        Extent { addr: 0, len: 4096 }
    }

    #[test]
    fn messages_are_stored_whole_and_released_in_order() {
        let mut r = ring(16 << 10);
        let base = r.mem.addr();
        let a = r.reserve(6 << 10, page()).unwrap();
        let b = r.reserve(6 << 10, page()).unwrap();
        assert_eq!((a.at, b.at), (base, base + (6 << 10)));
        // 4 KiB left at the end, but 6 KiB needed and the front is taken: full.
        assert!(r.reserve(6 << 10, page()).is_none());
        r.release(&a);
        // Now it wraps to the base, skipping the 4 KiB tail.
        let c = r.reserve(6 << 10, page()).unwrap();
        assert_eq!(c.at, base);
        assert!(
            r.reserve(1, page()).is_none(),
            "the skipped tail is not free"
        );
        r.release(&b);
        // Free now: b's 6 KiB after c; the skipped tail stays counted until c goes.
        assert!(r.reserve(8 << 10, page()).is_none());
        let d = r.reserve(6 << 10, page()).unwrap();
        assert_eq!(d.at, base + (6 << 10));
        r.unreserve(&d);
        r.release(&c);
        assert_eq!((r.start, r.end, r.messages), (0, 0, 0));
        assert!(
            r.reserve((16 << 10) + 1, page()).is_none(),
            "larger than the ring"
        );
    }

    #[test]
    fn the_ring_holds_at_most_its_message_count() {
        let mut r = ring(1 << 20);
        let held: Vec<_> = (0..BACKUP_RING_MAX_MESSAGES)
            .map(|_| r.reserve(64, page()).unwrap())
            .collect();
        assert!(r.reserve(64, page()).is_none());
        r.release(&held[0]);
        assert!(r.reserve(64, page()).is_some());
    }
}
