//! The per-queue record of posted work requests ([`WrRing`]) that gives every completion its
//! caller's `wr_id` and opcode.
//!
//! **Why bookkeeping.** `ibv_poll_cq(3)`: "If the completion status is other than
//! IBV_WC_SUCCESS, only the following attributes are valid: wr_id, status, qp_num, and
//! vendor_err." The trait's [`Completion`](pagewire_nic::Completion) always carries an opcode,
//! so each queue pair keeps a ring per queue ([`WrRing`]) holding the caller's `wr_id` and the
//! opcode of every posted request, and the NIC is given the ring's sequence number as `wr_id`
//! instead (bit 63 set for the receive queue, `wr::RECV_BIT`). RC queues complete in order, so
//! a completion for sequence `s` also retires the unsignaled sends before it; the ring is
//! exactly as deep as the hardware queue (`ibv_create_qp` tells), so a full ring is a full
//! queue.
#![forbid(unsafe_code)]

use pagewire_nic::WcOpcode;

/// One posted work request, by ring sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    seq: u64,
    wr_id: u64,
    opcode: WcOpcode,
}

/// The requests posted to one queue of one queue pair, in posting order.
#[derive(Debug)]
pub(super) struct WrRing {
    /// Requests the queue may hold (0: none at all).
    depth: u64,
    /// At least one, so that sequence numbers index it.
    slots: Vec<Option<Slot>>,
    /// Sequence of the next request.
    head: u64,
    /// Oldest request not known to be complete.
    tail: u64,
}

impl WrRing {
    /// A ring for a queue of `depth` requests.
    pub(super) fn new(depth: u32) -> WrRing {
        WrRing {
            depth: u64::from(depth),
            slots: vec![None; depth.max(1) as usize],
            head: 0,
            tail: 0,
        }
    }

    /// Requests posted and not known to be complete.
    pub(super) fn outstanding(&self) -> u64 {
        self.head - self.tail
    }

    /// Records a request; returns its sequence, or `None` when the queue is full.
    pub(super) fn push(&mut self, wr_id: u64, opcode: WcOpcode) -> Option<u64> {
        let cap = self.slots.len() as u64;
        if self.outstanding() >= self.depth {
            return None;
        }
        let seq = self.head;
        self.slots[(seq % cap) as usize] = Some(Slot { seq, wr_id, opcode });
        self.head += 1;
        Some(seq)
    }

    /// Forgets the request just pushed (its post failed, so the NIC never saw it).
    pub(super) fn unpush(&mut self, seq: u64) {
        if seq + 1 == self.head {
            let cap = self.slots.len() as u64;
            self.slots[(seq % cap) as usize] = None;
            self.head = seq;
        }
    }

    /// A completion for `seq`: the caller's `wr_id` and opcode. Everything posted before
    /// `seq` on this queue is complete too (RC completes in order; unsignaled sends produce
    /// no entry).
    pub(super) fn complete(&mut self, seq: u64) -> Option<(u64, WcOpcode)> {
        let cap = self.slots.len() as u64;
        let slot = self.slots[(seq % cap) as usize].filter(|s| s.seq == seq)?;
        if seq >= self.tail {
            self.tail = seq + 1;
        }
        Some((slot.wr_id, slot.opcode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_return_wr_ids_and_retire_unsignaled_predecessors() {
        let mut r = WrRing::new(3);
        let a = r.push(100, WcOpcode::RdmaWrite).unwrap();
        let b = r.push(101, WcOpcode::RdmaWrite).unwrap();
        let c = r.push(102, WcOpcode::Send).unwrap();
        assert_eq!(
            r.push(103, WcOpcode::Send),
            None,
            "full at the queue's depth"
        );
        // Only `b` was signaled: its completion retires `a` as well.
        assert_eq!(r.complete(b), Some((101, WcOpcode::RdmaWrite)));
        assert_eq!(r.outstanding(), 1);
        let d = r.push(103, WcOpcode::RdmaRead).unwrap();
        let e = r.push(104, WcOpcode::Send).unwrap();
        assert_eq!(r.push(105, WcOpcode::Send), None);
        // After an error every outstanding request completes (flushed), in order.
        assert_eq!(r.complete(c), Some((102, WcOpcode::Send)));
        assert_eq!(r.complete(d), Some((103, WcOpcode::RdmaRead)));
        assert_eq!(r.complete(e), Some((104, WcOpcode::Send)));
        assert_eq!(r.outstanding(), 0);
        // `a`'s slot was reused by `d`: an entry for it is unknown.
        assert_eq!(r.complete(a), None);
    }

    /// A queue pair created with no send (or receive) requests holds none: the completion
    /// queue accounting promised it nothing.
    #[test]
    fn a_ring_of_depth_zero_takes_nothing() {
        let mut r = WrRing::new(0);
        assert_eq!(r.push(1, WcOpcode::Send), None);
        assert_eq!(r.outstanding(), 0);
    }

    #[test]
    fn a_failed_post_is_forgotten() {
        let mut r = WrRing::new(2);
        let a = r.push(1, WcOpcode::Send).unwrap();
        r.unpush(a);
        assert_eq!(r.outstanding(), 0);
        assert_eq!(r.complete(a), None);
        assert_eq!(r.push(2, WcOpcode::Send), Some(0));
    }
}
