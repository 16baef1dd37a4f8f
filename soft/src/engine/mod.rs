//! The soft NIC's engine: queue pairs, completion queues and the RC protocol over the rings.
//!
//! It costs what a NIC costs. Posting and polling are loads and stores: a SEND
//! up to the inline size is copied into the work request at post time, a SEND up to
//! [`SEND_CMA_MIN`] is copied into the peer's ring at post time (from registered memory, by
//! the NIC's DMA, [`super::dma`]) and out of it into the posted receive buffer by the
//! receiver's engine, and acknowledgements are written into the requester's memory
//! ([`super::ack`]). The kernel is entered only to move bytes between address spaces (RDMA
//! WRITE and READ, and larger SENDs, with one kernel copy), to fault pages in and to sleep.
//! A pass costs O(active work): the rings with packets ([`super::inbox`]) and the queue
//! pairs with requests outstanding, and it reads the clock only when a timer could be due.
//!
//! - [`requester`]: the send queue, processed strictly in order. SENDs (and, on the staged
//!   path, WRITEs and READs) become packets; RDMA WRITE and READ to a CMA-capable peer are
//!   executed by this engine after checking the target's TPT, once every earlier request of
//!   the queue pair has completed (so a WRITE after a SEND lands after it). Completions are
//!   delivered in posting order. RDMA by CMA is in [`direct`], the packets of the staged
//!   path in [`staged`], local translation and the requester's page faults in [`translate`].
//! - [`responder`]: requests are accepted only in message-sequence order; one that cannot be
//!   taken (no receive posted, or its pages are not present) is answered receiver-not-ready
//!   and every later packet of the queue pair is dropped until the requester goes back and
//!   retransmits from it (go-back-N, as RC does). A request's first packet is checked in
//!   `responder/accept.rs`; staged READs are answered in `responder/read_response.rs`. A
//!   receive-side page fault
//!   is answered as the job's policy says (`receive_fault.rs`): receiver-not-ready, a silent
//!   drop that the requester's retransmission timer recovers, or a SEND parked in the
//!   queue pair's [`responder::backup_ring`] and placed once the fault is resolved.
//!
//! A queue pair ([`queue_pair`]) holds its two halves as types of their own, each with
//! private state: [`requester::Requester`] (the send queue) and [`responder::Responder`]
//! (the receive queue, the request being received, what it owes the requester), touched
//! only by their modules; this file holds the engine, its completion queues and clock, the keyed
//! extents a transfer holds ([`KeyedExtent`], [`crate::Inner::hold_own`]) and one pass.

mod direct;
mod queue_pair;
mod requester;
mod responder;
mod staged;
mod translate;

use std::collections::VecDeque;
use std::time::Instant;

use smallvec::SmallVec;

use super::inbox::Inbox;
use super::ring::Payload;
use super::tpt::{InUse, Refusal};
use super::MAX_QPS;
use pagewire_nic::{Access, Completion, QpCaps, Sge, WcOpcode, WcStatus};
use pagewire_sys::error::{Error, Result};
use pagewire_sys::Extent;
pub(crate) use queue_pair::AtomicOp;
use queue_pair::{
    AtomicOut, Incoming, IncomingKind, MissWait, OpKind, OpState, QueuePair, ReadOut, RecvOp,
    SendOp, REMOTE_KEY,
};
use requester::Requester;
pub(crate) use responder::BackupRing;
use responder::Responder;

/// SENDs of at least this many bytes to a CMA-capable peer are pulled by the receiver with
/// one kernel copy; smaller ones are copied through the ring (two CPU copies, no system
/// call). Measured on the development machine: a 64 KiB SEND through the ring took about
/// as long as the system call and its copy (docs/results.md, "Choosing the defaults").
pub(crate) const SEND_CMA_MIN: u64 = 64 << 10;

/// How long a request may wait for its acknowledgement before the peer's driver thread is
/// woken (when the peer's application is not polling and its driver sleeps): the soft NIC's
/// retransmission timer (ns). Also when a request dropped by a translation-cache miss at the
/// target goes out again (`cache_miss.rs`).
pub(super) const NUDGE_AFTER: u64 = nanos(std::time::Duration::from_micros(200));

/// The most bytes one work request carries (`max_msg_sz`; 2 GiB, as rxe reports): a
/// completion's byte count is 32 bits.
pub(crate) const MAX_MSG_BYTES: u64 = 1 << 31;

/// Packets taken from one inbound ring per pass (fairness between peers).
const RX_BUDGET: usize = 64;

/// How many clock readings a pass may skip: the engine's clock is read again after this
/// many uses (timers are checked against a time at most this stale).
const CLOCK_REUSE: u32 = 64;

/// The engine's view of the time, in nanoseconds since it started: the OS clock read at
/// most every [`CLOCK_REUSE`] uses.
#[derive(Debug)]
pub(crate) struct CoarseClock {
    start: Instant,
    now: u64,
    uses: u32,
}

impl CoarseClock {
    fn new() -> CoarseClock {
        CoarseClock {
            start: Instant::now(),
            now: 0,
            uses: 0,
        }
    }

    /// The time, possibly a few passes old.
    pub(crate) fn now(&mut self) -> u64 {
        self.uses += 1;
        if self.uses >= CLOCK_REUSE {
            self.fresh()
        } else {
            self.now
        }
    }

    /// The time, but only on every [`CLOCK_REUSE`]th use (when the OS clock is read): timers
    /// are checked then, and cost a counter otherwise.
    pub(crate) fn tick(&mut self) -> Option<u64> {
        self.uses += 1;
        (self.uses >= CLOCK_REUSE).then(|| self.fresh())
    }

    /// The time now (for setting a deadline).
    pub(crate) fn fresh(&mut self) -> u64 {
        self.uses = 0;
        self.now = self.start.elapsed().as_nanos() as u64;
        self.now
    }
}

/// Nanoseconds of a duration, for the engine's clock.
pub(crate) const fn nanos(d: std::time::Duration) -> u64 {
    d.as_nanos() as u64
}

pub(crate) struct Engine {
    cqs: Vec<Option<CompletionQueue>>,
    qps: Vec<Option<QueuePair>>,
    /// Queue pairs with requests in their send queue or READ responses to stream.
    busy: Vec<u32>,
    inbox: Inbox,
    clock: CoarseClock,
}

struct CompletionQueue {
    depth: usize,
    /// Entries the queue pairs using it may produce at once (their send and receive depths).
    reserved: usize,
    entries: VecDeque<Completion>,
}

/// A piece of a work request's memory as the NIC must check it at every access: the key it
/// was named with, its address in the owner's space and its length. The engine translates
/// it under a hold for each packet it moves ([`crate::Inner::hold_own`]), so a region deregistered
/// mid-message stops the message instead of its bytes landing in whatever the application
/// maps there next, and a detached region's bytes keep going to its pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyedExtent {
    pub key: u32,
    pub addr: u64,
    pub len: u64,
}

impl From<&Sge> for KeyedExtent {
    fn from(s: &Sge) -> KeyedExtent {
        KeyedExtent {
            key: s.lkey,
            addr: s.addr,
            len: s.len as u64,
        }
    }
}

/// Holds on this rank's table that keep a transfer's memory registered while bytes move.
pub(crate) type Held<'a> = SmallVec<[InUse<'a>; 2]>;

impl Engine {
    pub(crate) fn new(ranks: usize) -> Engine {
        Engine {
            cqs: Vec::new(),
            qps: (0..MAX_QPS).map(|_| None).collect(),
            busy: Vec::new(),
            inbox: Inbox::new(ranks),
            clock: CoarseClock::new(),
        }
    }

    pub(crate) fn create_cq(&mut self, depth: u32) -> Result<u32> {
        if depth == 0 {
            return Err(Error::InvalidArgument("completion queue depth 0".into()));
        }
        self.cqs.push(Some(CompletionQueue {
            depth: depth as usize,
            reserved: 0,
            entries: VecDeque::with_capacity((depth as usize).min(4096)),
        }));
        Ok(self.cqs.len() as u32 - 1)
    }

    pub(crate) fn create_qp(
        &mut self,
        peer: usize,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
        backup: Option<BackupRing>,
    ) -> Result<u32> {
        for cq in [send_cq, recv_cq] {
            if self.cqs.get(cq as usize).is_none_or(Option::is_none) {
                return Err(Error::InvalidArgument(format!("no completion queue {cq}")));
            }
        }
        // Every completion the queue pair can have outstanding must fit its queues, as
        // verbs requires (an overrun would be an asynchronous CQ error there).
        let mut want = [
            (send_cq, caps.max_send_wr as usize),
            (recv_cq, caps.max_recv_wr as usize),
        ];
        if send_cq == recv_cq {
            want = [(send_cq, want[0].1 + want[1].1), (recv_cq, 0)];
        }
        for (cq, n) in want {
            let q = self.cqs[cq as usize].as_ref().expect("checked above");
            if q.reserved + n > q.depth {
                return Err(Error::InvalidArgument(format!(
                    "completion queue {cq} of depth {} cannot hold {n} more completions \
                     ({} taken by its queue pairs); create it with at least {}",
                    q.depth,
                    q.reserved,
                    q.reserved + n
                )));
            }
        }
        for (cq, n) in want {
            self.cqs[cq as usize]
                .as_mut()
                .expect("checked above")
                .reserved += n;
        }
        let qpn = self
            .qps
            .iter()
            .position(Option::is_none)
            .ok_or(Error::Exhausted {
                what: "queue pairs",
                limit: MAX_QPS as u64,
                hint: "use one queue pair per peer",
            })? as u32;
        self.qps[qpn as usize] = Some(QueuePair {
            qpn,
            peer,
            send_cq,
            recv_cq,
            caps,
            remote_qpn: None,
            error: None,
            busy: false,
            requester: Requester::default(),
            responder: Responder::new(backup),
        });
        Ok(qpn)
    }

    pub(crate) fn qp(&self, qpn: u32) -> Result<&QueuePair> {
        self.qps
            .get(qpn as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::InvalidArgument(format!("no queue pair {qpn}")))
    }

    pub(crate) fn qp_mut(&mut self, qpn: u32) -> Result<&mut QueuePair> {
        self.qps
            .get_mut(qpn as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::InvalidArgument(format!("no queue pair {qpn}")))
    }

    /// Moves up to `max` completions of `cq` into `out`: how many, or `None` if there is no
    /// such queue.
    pub(crate) fn drain_cq(
        &mut self,
        cq: u32,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Option<usize> {
        let q = self.cqs.get_mut(cq as usize)?.as_mut()?;
        let n = max.min(q.entries.len());
        for _ in 0..n {
            out.push(q.entries.pop_front().expect("counted"));
        }
        Some(n)
    }

    /// Whether requests or READ responses are outstanding (the driver thread keeps
    /// driving the engine for an application that is not polling while there are).
    pub(crate) fn has_work(&self) -> bool {
        !self.busy.is_empty()
    }

    fn push_completion(&mut self, cq: u32, c: Completion) {
        if let Some(Some(q)) = self.cqs.get_mut(cq as usize) {
            // `create_qp` reserved room for every completion its queue pairs can produce.
            debug_assert!(q.entries.len() < q.depth, "completion queue {cq} overrun");
            q.entries.push_back(c);
        }
    }

    /// Puts `qpn` on the busy list (it has requests or READ responses outstanding).
    fn mark_busy(&mut self, qpn: u32) {
        if let Some(Some(qp)) = self.qps.get_mut(qpn as usize) {
            if !qp.busy {
                qp.busy = true;
                self.busy.push(qpn);
            }
        }
    }

    /// The queue pair enters the error state: every request not yet completed and every
    /// posted receive complete flushed, and what is posted later too. Returns how many
    /// receives were flushed.
    fn enter_error(&mut self, qpn: u32, why: String) -> u64 {
        let Some(qp) = self.qps[qpn as usize].as_mut() else {
            return 0;
        };
        if qp.error.is_some() {
            return 0;
        }
        qp.error = Some(why);
        qp.requester.flush();
        let cq = qp.recv_cq;
        let (held, flushed) = qp.responder.flush(qpn);
        for c in held {
            self.push_completion(cq, c);
        }
        for &wr_id in &flushed {
            self.push_completion(
                cq,
                completion(wr_id, WcStatus::WrFlushError, WcOpcode::Recv, 0, None, qpn),
            );
        }
        self.mark_busy(qpn);
        flushed.len() as u64
    }
}

fn total_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| s.len as u64).sum()
}

pub(super) fn completion(
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    qp_num: u32,
) -> Completion {
    Completion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm,
        qp_num,
    }
}

/// The batch to fault in, as pages: from the first to the last missing page.
fn fault_extent(span: (u64, u64)) -> Extent {
    let page = pagewire_nic::PAGE_SIZE;
    Extent {
        addr: span.0 * page,
        len: (span.1 - span.0 + 1) * page,
    }
}

impl super::Inner {
    /// Holds, in this rank's table, the entries behind bytes `[offset, offset+len)` of the
    /// stream `keyed` describes, with rights `need`, and returns where those bytes are now
    /// (in a detached region's copy of its pages, if so). The memory stays registered until
    /// the holds drop: deregistration waits for them.
    pub(super) fn hold_own(
        &self,
        keyed: &[KeyedExtent],
        offset: u64,
        len: u64,
        need: Access,
    ) -> std::result::Result<(Held<'_>, SmallVec<[Extent; 2]>), Refusal> {
        let tpt = self.own.tpt();
        let end = offset.checked_add(len).ok_or(Refusal::OutOfBounds)?;
        let (mut held, mut out) = (Held::new(), SmallVec::new());
        let mut at = 0u64;
        for k in keyed {
            let (start, stop) = (at, at.saturating_add(k.len));
            at = stop;
            if stop <= offset {
                continue;
            }
            if start >= end {
                break;
            }
            let from = offset.max(start) - start;
            let n = end.min(stop) - start - from;
            if n == 0 {
                continue;
            }
            let addr = k.addr.wrapping_add(from); // a wrapped address fails the bounds check
            let g = tpt.acquire(k.key, addr, n, need)?;
            out.push(Extent {
                addr: g.translation.dma_addr(addr),
                len: n,
            });
            held.push(g);
        }
        if at < end {
            return Err(Refusal::OutOfBounds);
        }
        Ok((held, out))
    }

    /// One pass of the engine: inbound packets from the rings that have them, then the
    /// queue pairs with work outstanding.
    pub(crate) fn progress(&self, eng: &mut Engine) {
        // The driver's work, done by whichever thread of the owner gets there first: a
        // polling application serves faults on its memory at once, and the driver thread
        // serves them while the application computes.
        self.serve_faults();
        self.serve_translation_misses();
        self.pump_links(eng);
        let due = eng
            .inbox
            .due(self.own.pending(), |src| self.own.ring_from(src));
        for src in due {
            let any = self.drain_ring(eng, src);
            if eng.inbox.drained(src, any, |s| self.own.ring_from(s)) {
                // Leaving the hot set: its watch flag is down now; a packet published while
                // the sender still saw it up is taken here.
                self.drain_ring(eng, src);
            }
        }
        let mut i = 0;
        while i < eng.busy.len() {
            let qpn = eng.busy[i];
            self.progress_qp(eng, qpn);
            let idle = eng.qps[qpn as usize]
                .as_ref()
                .is_none_or(|q| q.requester.is_idle() && q.responder.is_idle());
            if idle {
                if let Some(q) = eng.qps[qpn as usize].as_mut() {
                    q.busy = false;
                }
                eng.busy.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Takes the packets waiting in the ring from `src`; whether there were any.
    fn drain_ring(&self, eng: &mut Engine, src: usize) -> bool {
        if src >= self.peers.len() {
            return false;
        }
        let ring = self.own.ring_from(src);
        let mut any = false;
        for _ in 0..RX_BUDGET {
            let Some((h, slot)) = ring.peek() else { break };
            self.handle_packet(eng, src, h, Payload::Slot(slot));
            ring.pop();
            any = true;
        }
        any
    }

    fn progress_qp(&self, eng: &mut Engine, qpn: u32) {
        self.drain_held(eng, qpn);
        self.send_read_responses(eng, qpn);
        self.send_atomic_responses(eng, qpn);
        self.check_acknowledgements(eng, qpn);
        self.complete_front(eng, qpn);
        self.transmit(eng, qpn);
        self.complete_front(eng, qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_batches_span_first_to_last_missing_page() {
        assert_eq!(
            fault_extent((3, 7)),
            Extent {
                addr: 3 * pagewire_nic::PAGE_SIZE,
                len: 5 * pagewire_nic::PAGE_SIZE
            }
        );
    }

    #[test]
    fn the_coarse_clock_is_read_again_after_its_reuse_count() {
        let mut c = CoarseClock::new();
        let t0 = c.fresh();
        assert_eq!(nanos(std::time::Duration::from_micros(3)), 3000);
        std::thread::sleep(std::time::Duration::from_millis(2));
        for _ in 0..CLOCK_REUSE - 1 {
            assert_eq!(c.now(), t0);
        }
        assert!(c.now() > t0);
        for _ in 0..CLOCK_REUSE - 1 {
            assert_eq!(c.tick(), None);
        }
        assert!(c.tick().is_some());
    }
}
