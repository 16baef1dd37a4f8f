//! The responder side of a queue pair: receives, packets from the rings, placing SENDs and
//! staged WRITEs, and acknowledging through the requester's acknowledgement line. A
//! request's first packet is checked in [`accept`]; staged READs are answered in
//! [`read_response`], atomics in [`atomic`]; SENDs parked on a receive fault wait in the
//! [`backup_ring`]; translation-cache misses are in [`cache_miss`]. The responder's state
//! ([`Responder`]) is private to this module and these.

mod accept;
pub(super) mod atomic;
pub(super) mod backup_ring;
pub(super) mod cache_miss;
mod read_response;

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

pub(crate) use backup_ring::BackupRing;
use backup_ring::HeldReceive;

use super::{
    completion, total_len, AtomicOut, Engine, Incoming, IncomingKind, QueuePair, ReadOut, RecvOp,
};
use crate::ack::Nak;
use crate::dma;
use crate::ring::{
    self, Header, Kind, Payload, CMA_DESCRIPTOR, FIRST, HAS_IMM, LAST, MAX_DESCRIPTOR_EXTENTS,
};
use crate::Inner;
use pagewire_nic::{Access, Completion, DataPath, RecvWr, Sge, WcOpcode, WcStatus};
use pagewire_sys::error::{Error, Result};
use pagewire_sys::{self as sys, CmaDirection, Extent};

/// The responder's half of a queue pair: its receive queue, the request being received, and
/// what it owes the requester (READ responses, atomics' results, held completions). Only
/// this module and its children (`accept`, `atomic`, `backup_ring`, `cache_miss`,
/// `read_response`) touch it; the rest of the engine asks ([`Responder::is_idle`]) or tells
/// ([`Responder::flush`]).
pub(super) struct Responder {
    rq: VecDeque<RecvOp>,
    /// The scatter-gather entries of the receives in `rq`, in order.
    rq_sges: VecDeque<Sge>,
    /// Next request sequence number this responder accepts.
    expected_msn: u64,
    /// A multi-packet request being received.
    rx: Option<Incoming>,
    /// Packets of this message are dropped until its first packet comes again.
    discard_msn: Option<u64>,
    /// The last receive-side fault filed: (msn, fault sequence number).
    rx_fault: Option<(u64, u64)>,
    /// The keys of request `.0` translated through the cache so far (`.1`: bit `i` for
    /// receive entry `i`, [`super::REMOTE_KEY`] for the key it names).
    rx_translated: Option<(u64, u32)>,
    /// The last translation-cache miss filed for a request: (msn, sequence number in this
    /// rank's responder miss slot of the queue pair, its key's bit).
    rx_miss: Option<(u64, u64, u32)>,
    /// An error NAK was sent: nothing more is accepted (the requester's queue pair is in
    /// the error state once it reads it).
    refusing: bool,
    /// READ responses being sent (staged path).
    reads_out: VecDeque<ReadOut>,
    /// Results of atomics executed here, waiting for room in the requester's ring. An
    /// atomic runs once, when its request is accepted; its result is kept until it is sent
    /// (what an HCA keeps in its responder resources for atomics).
    atomics_out: VecDeque<AtomicOut>,
    /// The backup ring (receive-fault policy `backup` only).
    backup: Option<BackupRing>,
    /// Receive completions held behind messages parked in the backup ring, in order.
    held: VecDeque<HeldReceive>,
}

impl Responder {
    /// A responder with nothing posted, parking SENDs in `backup` under the `backup`
    /// receive-fault policy.
    pub(super) fn new(backup: Option<BackupRing>) -> Responder {
        Responder {
            rq: VecDeque::new(),
            rq_sges: VecDeque::new(),
            expected_msn: 0,
            rx: None,
            discard_msn: None,
            rx_fault: None,
            rx_translated: None,
            rx_miss: None,
            refusing: false,
            reads_out: VecDeque::new(),
            atomics_out: VecDeque::new(),
            backup,
            held: VecDeque::new(),
        }
    }

    /// Whether it owes the requester nothing (no READ response, atomic result or held
    /// completion left to send).
    pub(super) fn is_idle(&self) -> bool {
        self.reads_out.is_empty() && self.atomics_out.is_empty() && self.held.is_empty()
    }

    /// The queue pair `qpn` entered the error state: the completions held behind parked
    /// messages (those parked flushed), then every posted receive's work request id (they
    /// complete flushed).
    pub(super) fn flush(&mut self, qpn: u32) -> (Vec<Completion>, SmallVec<[u64; 16]>) {
        let held = backup_ring::flush_held(&mut self.held, qpn);
        self.rq_sges.clear();
        (held, self.rq.drain(..).map(|r| r.wr_id).collect())
    }
}

/// Puts back the receive an abandoned message had taken, and its room in the backup ring.
fn restore_receive(qp: &mut QueuePair, rx: Incoming) {
    if let (Some(p), Some(ring)) = (&rx.parked, qp.responder.backup.as_mut()) {
        ring.unreserve(p);
    }
    if let Some((r, sges)) = rx.recv {
        for s in sges.iter().rev() {
            qp.responder.rq_sges.push_front(*s);
        }
        qp.responder.rq.push_front(r);
    }
}

impl Inner {
    pub(crate) fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<()> {
        let mut eng = self.engine.lock();
        let qp = eng.qp_mut(qpn)?;
        if qp.responder.rq.len() >= qp.caps.max_recv_wr as usize {
            return Err(Error::Exhausted {
                what: "receive queue",
                limit: qp.caps.max_recv_wr as u64,
                hint: "poll the receive completion queue before posting more",
            });
        }
        qp.check_sges(wr.sgl.len())?;
        let op = RecvOp {
            wr_id: wr.wr_id,
            sges: wr.sgl.len() as u32,
            capacity: total_len(wr.sgl),
        };
        if qp.error.is_some() {
            let (cq, qpn) = (qp.recv_cq, qp.qpn);
            eng.push_completion(
                cq,
                completion(
                    op.wr_id,
                    WcStatus::WrFlushError,
                    WcOpcode::Recv,
                    0,
                    None,
                    qpn,
                ),
            );
        } else {
            qp.responder.rq.push_back(op);
            qp.responder.rq_sges.extend(wr.sgl.iter().copied());
        }
        Ok(())
    }

    /// Accepted every request below `msn_end` of the requester's queue pair `src_qpn` at
    /// rank `from`.
    pub(super) fn ack(&self, from: usize, src_qpn: u32, msn_end: u64) {
        if !self.ack_by_link(from, src_qpn, msn_end) {
            self.peers[from].mem.ack_line(src_qpn).ack(msn_end);
        }
    }

    /// Refused request `msn` of the requester's queue pair `src_qpn` at rank `from`.
    pub(super) fn nak(&self, from: usize, src_qpn: u32, msn: u64, why: Nak) {
        if matches!(why, Nak::Rnr { .. }) {
            self.counters.rnr_nacks_sent.fetch_add(1, Relaxed);
        }
        if !self.nak_by_link(from, src_qpn, msn, why) {
            self.peers[from].mem.ack_line(src_qpn).nak(msn, why);
        }
    }

    /// Refuses request `msn` for good with `status`: the requester's queue pair will enter
    /// the error state, so nothing after it is accepted either.
    pub(super) fn refuse(
        &self,
        eng: &mut Engine,
        from: usize,
        qpn: u32,
        h: &Header,
        status: WcStatus,
    ) {
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        qp.responder.refusing = true;
        qp.responder.rx = None;
        self.nak(from, h.src_qpn, h.msn, Nak::Error(status.code()));
    }

    pub(crate) fn handle_packet(
        &self,
        eng: &mut Engine,
        from: usize,
        h: Header,
        payload: Payload<'_>,
    ) {
        // Only packets of a queue pair connected to the sender's queue pair count (others
        // are dropped, as an RC NIC drops packets for a queue pair it does not have).
        match eng.qps.get(h.dst_qpn as usize).and_then(Option::as_ref) {
            Some(qp) if qp.peer == from && qp.remote_qpn == Some(h.src_qpn) => {}
            _ => return,
        }
        let kind = match ring::validate(&h) {
            Ok(kind) => kind,
            Err(why) => return self.malformed_packet(eng, from, h.dst_qpn, why),
        };
        match kind {
            Kind::Send | Kind::Write | Kind::WriteImm | Kind::ReadRequest | Kind::AtomicRequest => {
                self.handle_request(eng, from, kind, &h, payload)
            }
            Kind::ReadResponse => self.handle_read_response(eng, &h, payload),
            Kind::AtomicResponse => self.handle_atomic_response(eng, &h, payload),
        }
    }

    /// A packet from `from` to queue pair `qpn` broke the protocol: the queue pair enters the
    /// error state (its receives complete flushed, so the application learns of it), it
    /// takes nothing more from that peer, and one line on stderr says why.
    fn malformed_packet(&self, eng: &mut Engine, from: usize, qpn: u32, why: &'static str) {
        let why = format!("rank {from} sent a malformed packet ({why})");
        let flushed = eng.enter_error(qpn, why.clone());
        if let Some(qp) = eng.qps[qpn as usize].as_mut() {
            if !qp.responder.refusing {
                qp.responder.refusing = true;
                qp.responder.rx = None;
                eprintln!(
                    "pagewire: rank {}: {why}; its queue pair {qpn} is in the error state",
                    self.rank
                );
            }
        }
        self.counters.error_completions.fetch_add(flushed, Relaxed);
    }

    fn handle_request(
        &self,
        eng: &mut Engine,
        from: usize,
        kind: Kind,
        h: &Header,
        payload: Payload<'_>,
    ) {
        let qpn = h.dst_qpn;
        let qp = eng.qps[qpn as usize].as_mut().expect("checked by caller");
        if qp.responder.refusing {
            return;
        }
        if qp.error.is_some() {
            if h.flags & FIRST != 0 {
                self.refuse(eng, from, qpn, h, WcStatus::RemoteOperationError);
            }
            return;
        }
        if h.msn != qp.responder.expected_msn {
            return; // behind a refused request (go-back-N) or a duplicate
        }
        if qp.responder.discard_msn == Some(h.msn) {
            if h.flags & FIRST == 0 {
                return;
            }
            qp.responder.discard_msn = None;
        }
        if kind == Kind::Send
            && h.flags & (FIRST | LAST | CMA_DESCRIPTOR) == FIRST | LAST
            && h.code == 0
            && qp.responder.rx.is_none()
            && self.deliver_single_send(eng, from, h, payload)
        {
            return;
        }
        let qp = eng.qps[qpn as usize].as_mut().expect("checked by caller");
        let mut rx = if h.flags & FIRST != 0 {
            if let Some(old) = qp.responder.rx.take() {
                // A retransmission of a message whose first packets were taken: the receive
                // it consumed is posted again.
                restore_receive(qp, old);
            }
            if h.code != 0 {
                // The requester could not read its own buffer: nothing of it is taken.
                qp.responder.discard_msn = Some(h.msn);
                return;
            }
            match self.accept_request(eng, from, kind, h, payload) {
                Some(rx) => rx,
                None => return,
            }
        } else {
            match qp.responder.rx.take() {
                Some(rx) if rx.msn == h.msn => rx,
                other => {
                    qp.responder.rx = other;
                    return;
                }
            }
        };
        let recv_cq = eng.qps[qpn as usize].as_ref().expect("exists").recv_cq;
        if h.code != 0 {
            // The requester failed mid-message: drop it; its receive stays posted.
            let qp = eng.qps[qpn as usize].as_mut().expect("exists");
            restore_receive(qp, rx);
            qp.responder.discard_msn = Some(h.msn);
            return;
        }
        // Move the payload.
        let moved = if h.flags & CMA_DESCRIPTOR != 0 {
            if kind == Kind::WriteImm {
                Ok(()) // data already placed by the initiator
            } else {
                self.pull_payload(from, h, payload, &rx)
            }
        } else if h.payload_len > 0 {
            let len = h.payload_len as u64;
            if h.offset.checked_add(len).is_none_or(|end| end > rx.total) {
                Err(WcStatus::RemoteOperationError)
            } else {
                // Checked again for this packet: the region may have been deregistered
                // since the first one (a WRITE's target: remote access error).
                let placed = self
                    .hold_own(&rx.targets, h.offset, len, rx.need)
                    .map_err(|_| ())
                    .and_then(|(_held, dst)| {
                        dma::scatter(&dst, 0, payload.addr(), len).map_err(|_| ())
                    });
                match placed {
                    Ok(()) => {
                        self.counters.add_bytes(DataPath::Staged, len);
                        Ok(())
                    }
                    Err(()) => Err(WcStatus::LocalProtectionError),
                }
            }
        } else {
            Ok(())
        };
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        if let Err(status) = moved {
            qp.responder.expected_msn += 1;
            let remote = match status {
                WcStatus::LocalProtectionError if rx.kind == IncomingKind::Write => {
                    WcStatus::RemoteAccessError
                }
                WcStatus::LocalProtectionError => WcStatus::RemoteOperationError,
                s => s,
            };
            if let IncomingKind::Send { wr_id } | IncomingKind::WriteImm { wr_id } = rx.kind {
                let c = completion(wr_id, status, WcOpcode::Recv, 0, None, qpn);
                self.counters.error_completions.fetch_add(1, Relaxed);
                eng.push_completion(recv_cq, c);
            }
            self.refuse(eng, from, qpn, h, remote);
            return;
        }
        if h.flags & LAST == 0 {
            qp.responder.rx = Some(rx);
            return;
        }
        qp.responder.expected_msn += 1;
        let msn_end = qp.responder.expected_msn;
        let c = match rx.kind {
            IncomingKind::Send { wr_id } => Some(completion(
                wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                rx.total as u32,
                rx.imm,
                qpn,
            )),
            IncomingKind::WriteImm { wr_id } => Some(completion(
                wr_id,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                rx.total as u32,
                rx.imm,
                qpn,
            )),
            IncomingKind::Write => None,
        };
        match (c, rx.parked, rx.recv.take()) {
            (Some(completion), Some(parked), Some((_, sges))) => {
                // In the backup ring: acknowledged now, placed once its fault is resolved.
                qp.responder.held.push_back(HeldReceive::Parked {
                    completion,
                    sges,
                    parked,
                });
                eng.mark_busy(qpn);
            }
            (Some(c), ..) => eng.complete_receive(qpn, c),
            (None, ..) => {}
        }
        self.ack(from, h.src_qpn, msn_end);
    }

    /// The common case of a SEND, without building the state of a multi-packet message: one
    /// packet into a one-entry receive that is pinned or present. False (nothing done) for
    /// anything else, which the general path then handles — including every error.
    fn deliver_single_send(
        &self,
        eng: &mut Engine,
        from: usize,
        h: &Header,
        payload: Payload<'_>,
    ) -> bool {
        let qpn = h.dst_qpn;
        let qp = eng.qps[qpn as usize].as_mut().expect("checked by caller");
        let Some(&r) = qp.responder.rq.front() else {
            return false;
        };
        if r.sges != 1 || h.total_len > r.capacity || h.payload_len as u64 != h.total_len {
            return false;
        }
        let sge = qp.responder.rq_sges[0];
        let Ok(guard) =
            self.own
                .tpt()
                .acquire(sge.lkey, sge.addr, sge.len as u64, Access::LOCAL_WRITE)
        else {
            return false;
        };
        let len = h.total_len;
        let target = Extent {
            addr: guard.translation.dma_addr(sge.addr),
            len,
        };
        if guard.translation.on_demand()
            && len > 0
            && self.missing_span(&self.peers[self.rank], target).is_some()
        {
            return false;
        }
        // A key the translation cache lacks takes the general path, which counts the miss
        // (the last check before the copy, so that a hit is counted once).
        if !self.own.tpt_cache().probe(sge.lkey) {
            return false;
        }
        if guard.translation.detached() {
            self.counters.detached_bytes.fetch_add(len, Relaxed);
        }
        if dma::copy(target.addr, payload.addr(), len).is_err() {
            return false;
        }
        drop(guard);
        self.counters.add_bytes(DataPath::Staged, len);
        qp.responder.rq.pop_front();
        qp.responder.rq_sges.pop_front();
        qp.responder.rx_fault = None;
        qp.responder.expected_msn += 1;
        let msn_end = qp.responder.expected_msn;
        let imm = (h.flags & HAS_IMM != 0).then_some(h.imm);
        eng.complete_receive(
            qpn,
            completion(
                r.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                len as u32,
                imm,
                qpn,
            ),
        );
        self.ack(from, h.src_qpn, msn_end);
        true
    }

    /// A SEND whose payload the requester left in its memory (a CMA descriptor): pulls it
    /// into the receive with one kernel copy.
    fn pull_payload(
        &self,
        from: usize,
        h: &Header,
        payload: Payload<'_>,
        rx: &Incoming,
    ) -> Result<(), WcStatus> {
        let mut desc = [0u8; 16 * MAX_DESCRIPTOR_EXTENTS];
        let n = (h.payload_len as usize).min(desc.len()) / 16 * 16;
        payload.read(&mut desc[..n]);
        let src: SmallVec<[Extent; 4]> = desc[..n]
            .chunks_exact(16)
            .map(|c| Extent {
                addr: u64::from_le_bytes(c[0..8].try_into().expect("8")),
                len: u64::from_le_bytes(c[8..16].try_into().expect("8")),
            })
            .collect();
        let described = src.iter().try_fold(0u64, |sum, e| sum.checked_add(e.len));
        if described != Some(rx.total) {
            return Err(WcStatus::RemoteOperationError);
        }
        let (_held, dst) = self
            .hold_own(&rx.targets, 0, rx.total, rx.need)
            .map_err(|_| WcStatus::LocalProtectionError)?;
        match sys::cma_copy(self.peers[from].pid, CmaDirection::Read, &dst, &src) {
            Ok(n) => {
                self.counters.add_bytes(DataPath::Cma, n);
                Ok(())
            }
            Err(_) if !sys::is_mapped_all(&dst) => Err(WcStatus::LocalProtectionError),
            Err(_) => Err(WcStatus::RemoteOperationError),
        }
    }
}
