//! The responder side of a queue pair: receives, packets from the rings, placing SENDs and
//! staged WRITEs, answering staged READs, and acknowledging through the requester's
//! acknowledgement line.

use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use super::{
    completion, fault_extent, total_len, Engine, Incoming, IncomingKind, KeyedExtent, OpState,
    QueuePair, ReadOut, RecvOp,
};
use crate::error::{Error, Result};
use crate::nic::soft::ack::Nak;
use crate::nic::soft::dma;
use crate::nic::soft::ring::{
    self, Header, Kind, Slot, CMA_DESCRIPTOR, FIRST, HAS_IMM, LAST, MAX_DESCRIPTOR_EXTENTS, MTU,
};
use crate::nic::soft::Inner;
use crate::nic::{Access, DataPath, RecvWr, Sge, WcOpcode, WcStatus};
use crate::sys::{self, CmaDirection, Extent};

/// Takes the receive at the front of the queue, with its scatter-gather entries.
fn take_receive(qp: &mut QueuePair) -> (RecvOp, SmallVec<[Sge; 2]>) {
    let r = qp.rq.pop_front().expect("a receive is posted");
    let sges = qp.rq_sges.drain(..r.sges as usize).collect();
    (r, sges)
}

/// Puts back the receive an abandoned message had taken.
fn restore_receive(qp: &mut QueuePair, rx: Incoming) {
    if let Some((r, sges)) = rx.recv {
        for s in sges.iter().rev() {
            qp.rq_sges.push_front(*s);
        }
        qp.rq.push_front(r);
    }
}

impl Inner {
    pub(crate) fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<()> {
        let mut eng = self.engine.lock();
        let qp = eng.qp_mut(qpn)?;
        if qp.rq.len() >= qp.caps.max_recv_wr as usize {
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
            qp.rq.push_back(op);
            qp.rq_sges.extend(wr.sgl.iter().copied());
        }
        Ok(())
    }

    /// Accepted every request below `msn_end` of the requester's queue pair `src_qpn` at
    /// rank `from`.
    fn ack(&self, from: usize, src_qpn: u32, msn_end: u64) {
        self.peers[from].mem.ack_line(src_qpn).ack(msn_end);
    }

    /// Refused request `msn` of the requester's queue pair `src_qpn` at rank `from`.
    fn nak(&self, from: usize, src_qpn: u32, msn: u64, why: Nak) {
        if matches!(why, Nak::Rnr { .. }) {
            self.counters.rnr_nacks_sent.fetch_add(1, Relaxed);
        }
        self.peers[from].mem.ack_line(src_qpn).nak(msn, why);
    }

    /// Refuses request `msn` for good with `status`: the requester's queue pair will enter
    /// the error state, so nothing after it is accepted either.
    fn refuse(&self, eng: &mut Engine, from: usize, qpn: u32, h: &Header, status: WcStatus) {
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        qp.refusing = true;
        qp.rx = None;
        self.nak(from, h.src_qpn, h.msn, Nak::Error(status.code()));
    }

    pub(super) fn handle_packet(&self, eng: &mut Engine, from: usize, h: Header, slot: Slot<'_>) {
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
            Kind::Send | Kind::Write | Kind::WriteImm | Kind::ReadRequest => {
                self.handle_request(eng, from, kind, &h, slot)
            }
            Kind::ReadResponse => self.handle_read_response(eng, &h, slot),
        }
    }

    /// A packet from `from` to queue pair `qpn` broke the protocol: the queue pair enters the
    /// error state (its receives complete flushed, so the application learns of it), it
    /// takes nothing more from that peer, and one line on stderr says why.
    fn malformed_packet(&self, eng: &mut Engine, from: usize, qpn: u32, why: &'static str) {
        let why = format!("rank {from} sent a malformed packet ({why})");
        let flushed = eng.enter_error(qpn, why.clone());
        if let Some(qp) = eng.qps[qpn as usize].as_mut() {
            if !qp.refusing {
                qp.refusing = true;
                qp.rx = None;
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
        slot: Slot<'_>,
    ) {
        let qpn = h.dst_qpn;
        let qp = eng.qps[qpn as usize].as_mut().expect("checked by caller");
        if qp.refusing {
            return;
        }
        if qp.error.is_some() {
            if h.flags & FIRST != 0 {
                self.refuse(eng, from, qpn, h, WcStatus::RemoteOperationError);
            }
            return;
        }
        if h.msn != qp.expected_msn {
            return; // behind a refused request (go-back-N) or a duplicate
        }
        if qp.discard_msn == Some(h.msn) {
            if h.flags & FIRST == 0 {
                return;
            }
            qp.discard_msn = None;
        }
        if kind == Kind::Send
            && h.flags & (FIRST | LAST | CMA_DESCRIPTOR) == FIRST | LAST
            && h.code == 0
            && qp.rx.is_none()
            && self.deliver_single_send(eng, from, h, slot)
        {
            return;
        }
        let qp = eng.qps[qpn as usize].as_mut().expect("checked by caller");
        let mut rx = if h.flags & FIRST != 0 {
            if let Some(old) = qp.rx.take() {
                // A retransmission of a message whose first packets were taken: the receive
                // it consumed is posted again.
                restore_receive(qp, old);
            }
            if h.code != 0 {
                // The requester could not read its own buffer: nothing of it is taken.
                qp.discard_msn = Some(h.msn);
                return;
            }
            match self.accept_request(eng, from, kind, h) {
                Some(rx) => rx,
                None => return,
            }
        } else {
            match qp.rx.take() {
                Some(rx) if rx.msn == h.msn => rx,
                other => {
                    qp.rx = other;
                    return;
                }
            }
        };
        let recv_cq = eng.qps[qpn as usize].as_ref().expect("exists").recv_cq;
        if h.code != 0 {
            // The requester failed mid-message: drop it; its receive stays posted.
            let qp = eng.qps[qpn as usize].as_mut().expect("exists");
            restore_receive(qp, rx);
            qp.discard_msn = Some(h.msn);
            return;
        }
        // Move the payload.
        let moved = if h.flags & CMA_DESCRIPTOR != 0 {
            if kind == Kind::WriteImm {
                Ok(()) // data already placed by the initiator
            } else {
                self.pull_payload(from, h, slot, &rx)
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
                        dma::scatter(&dst, 0, slot.payload_addr(), len).map_err(|_| ())
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
            qp.expected_msn += 1;
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
            qp.rx = Some(rx);
            return;
        }
        qp.expected_msn += 1;
        let msn_end = qp.expected_msn;
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
        if let Some(c) = c {
            eng.push_completion(recv_cq, c);
        }
        rx.recv = None;
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
        slot: Slot<'_>,
    ) -> bool {
        let qpn = h.dst_qpn;
        let qp = eng.qps[qpn as usize].as_mut().expect("checked by caller");
        let Some(&r) = qp.rq.front() else {
            return false;
        };
        if r.sges != 1 || h.total_len > r.capacity || h.payload_len as u64 != h.total_len {
            return false;
        }
        let sge = qp.rq_sges[0];
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
        if guard.translation.detached() {
            self.counters.detached_bytes.fetch_add(len, Relaxed);
        }
        if dma::copy(target.addr, slot.payload_addr(), len).is_err() {
            return false;
        }
        drop(guard);
        self.counters.add_bytes(DataPath::Staged, len);
        qp.rq.pop_front();
        qp.rq_sges.pop_front();
        qp.rx_fault = None;
        qp.expected_msn += 1;
        let (msn_end, recv_cq) = (qp.expected_msn, qp.recv_cq);
        let imm = (h.flags & HAS_IMM != 0).then_some(h.imm);
        eng.push_completion(
            recv_cq,
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
        slot: Slot<'_>,
        rx: &Incoming,
    ) -> Result<(), WcStatus> {
        let mut desc = [0u8; 16 * MAX_DESCRIPTOR_EXTENTS];
        let n = (h.payload_len as usize).min(desc.len()) / 16 * 16;
        slot.read_payload(&mut desc[..n]);
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

    /// The first packet of a request: checks keys, lengths and pages, takes a receive.
    /// `None` when it was refused (answered with a NAK) or needs nothing more (a READ).
    fn accept_request(
        &self,
        eng: &mut Engine,
        from: usize,
        kind: Kind,
        h: &Header,
    ) -> Option<Incoming> {
        let qpn = h.dst_qpn;
        let src_qpn = h.src_qpn;
        let me = &self.peers[self.rank];
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        let recv_cq = qp.recv_cq;
        let data_placed = kind == Kind::WriteImm && h.flags & CMA_DESCRIPTOR != 0;
        // Where the bytes go.
        let targets: SmallVec<[KeyedExtent; 2]>;
        // The parts of `targets` that lie in ODP regions (checked for faults below).
        let mut odp_targets: SmallVec<[Extent; 2]> = SmallVec::new();
        let mut take_recv = false;
        match kind {
            Kind::Send | Kind::WriteImm => {
                let Some(&r) = qp.rq.front() else {
                    qp.discard_msn = Some(h.msn);
                    self.nak(from, src_qpn, h.msn, Nak::Rnr { fault: None });
                    return None;
                };
                if kind == Kind::Send {
                    let sgl: SmallVec<[Sge; 2]> =
                        qp.rq_sges.iter().take(r.sges as usize).copied().collect();
                    let failure = if h.total_len > r.capacity {
                        Some((
                            WcStatus::LocalLengthError,
                            WcStatus::RemoteInvalidRequest,
                            format!(
                                "a {}-byte send arrived for a {}-byte receive",
                                h.total_len, r.capacity
                            ),
                        ))
                    } else {
                        None
                    };
                    let local = if failure.is_none() {
                        self.local_targets(&sgl)
                    } else {
                        Err(())
                    };
                    let failure = failure.or_else(|| {
                        local.is_err().then(|| {
                            (
                                WcStatus::LocalProtectionError,
                                WcStatus::RemoteOperationError,
                                "a receive buffer failed its key check".to_string(),
                            )
                        })
                    });
                    if let Some((local_status, remote_status, why)) = failure {
                        take_receive(qp);
                        qp.expected_msn += 1;
                        self.counters.error_completions.fetch_add(1, Relaxed);
                        let len = if local_status == WcStatus::LocalLengthError {
                            h.total_len as u32
                        } else {
                            0
                        };
                        eng.push_completion(
                            recv_cq,
                            completion(r.wr_id, local_status, WcOpcode::Recv, len, None, qpn),
                        );
                        let flushed = eng.enter_error(qpn, why);
                        self.counters.error_completions.fetch_add(flushed, Relaxed);
                        self.refuse(eng, from, qpn, h, remote_status);
                        return None;
                    }
                    let (extents, odp) = local.expect("checked");
                    // Fault-check only the ODP parts of what this message fills.
                    let mut at = 0u64;
                    for (e, on_demand) in extents.iter().zip(&odp) {
                        let take = e.len.min(h.total_len.saturating_sub(at));
                        if *on_demand && take > 0 {
                            odp_targets.push(Extent {
                                addr: e.addr,
                                len: take,
                            });
                        }
                        at += e.len;
                    }
                    targets = sgl.iter().map(KeyedExtent::from).collect();
                } else {
                    targets = smallvec::smallvec![KeyedExtent {
                        key: h.rkey,
                        addr: h.remote_addr,
                        len: h.total_len,
                    }];
                }
                take_recv = true;
            }
            Kind::Write | Kind::ReadRequest => {
                targets = smallvec::smallvec![KeyedExtent {
                    key: h.rkey,
                    addr: h.remote_addr,
                    len: h.total_len,
                }];
            }
            Kind::ReadResponse => unreachable!("not a request"),
        }
        // Remote key checks for WRITE / READ / WRITE WITH IMM (not for zero length), also
        // for a WRITE WITH IMM whose bytes the initiator placed already.
        if kind != Kind::Send && h.total_len > 0 {
            let need = if kind == Kind::ReadRequest {
                Access::REMOTE_READ
            } else {
                Access::REMOTE_WRITE
            };
            match me
                .mem
                .tpt()
                .acquire(h.rkey, h.remote_addr, h.total_len, need)
            {
                Ok(g) => {
                    if g.translation.on_demand() {
                        odp_targets = smallvec::smallvec![Extent {
                            addr: h.remote_addr,
                            len: h.total_len,
                        }];
                    }
                    if g.translation.detached() {
                        self.counters.detached_bytes.fetch_add(h.total_len, Relaxed);
                    }
                }
                Err(_) => {
                    eng.qps[qpn as usize].as_mut().expect("exists").expected_msn += 1;
                    self.refuse(eng, from, qpn, h, WcStatus::RemoteAccessError);
                    return None;
                }
            }
        }
        // Receive-side network page faults: answer receiver-not-ready, let the driver map
        // the pages, and take the retransmission (seed 000 section 4, "rNPFs").
        if !odp_targets.is_empty() && !data_placed {
            let span =
                odp_targets
                    .iter()
                    .fold(None, |acc, e| match (acc, self.missing_span(me, *e)) {
                        (None, s) => s,
                        (a, None) => a,
                        (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
                    });
            if let Some(span) = span {
                let range = fault_extent(span);
                let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                if let Some((m, seq)) = qp.rx_fault {
                    if m == h.msn && me.mem.npf_slot(qpn).outcome(seq) == Some(false) {
                        // The memory is not mapped: the request fails.
                        qp.rx_fault = None;
                        qp.expected_msn += 1;
                        let status = if kind == Kind::Send {
                            WcStatus::RemoteOperationError
                        } else {
                            WcStatus::RemoteAccessError
                        };
                        if take_recv {
                            let (r, _) = take_receive(qp);
                            self.counters.error_completions.fetch_add(1, Relaxed);
                            eng.push_completion(
                                recv_cq,
                                completion(
                                    r.wr_id,
                                    WcStatus::LocalProtectionError,
                                    WcOpcode::Recv,
                                    0,
                                    None,
                                    qpn,
                                ),
                            );
                            let flushed =
                                eng.enter_error(qpn, "a receive buffer is not mapped".into());
                            self.counters.error_completions.fetch_add(flushed, Relaxed);
                        }
                        self.refuse(eng, from, qpn, h, status);
                        return None;
                    }
                }
                let write = kind != Kind::ReadRequest;
                // Filed on this rank's own memory: the next pass (this application's or
                // the driver thread's) serves it.
                let seq = me.mem.npf_slot(qpn).file(range.addr, range.len, write);
                let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                qp.rx_fault = Some((h.msn, seq));
                qp.discard_msn = Some(h.msn);
                self.nak(from, src_qpn, h.msn, Nak::Rnr { fault: Some(seq) });
                return None;
            }
        }
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        qp.rx_fault = None;
        match kind {
            Kind::ReadRequest => {
                qp.reads_out.push_back(ReadOut {
                    msn: h.msn,
                    dst_qpn: src_qpn,
                    source: targets[0],
                    sent: 0,
                });
                qp.expected_msn += 1;
                let msn_end = qp.expected_msn;
                self.ack(from, src_qpn, msn_end);
                eng.mark_busy(qpn);
                None // nothing more to receive for it
            }
            Kind::Write => Some(Incoming {
                msn: h.msn,
                kind: IncomingKind::Write,
                imm: None,
                targets,
                need: Access::REMOTE_WRITE,
                total: h.total_len,
                recv: None,
            }),
            Kind::Send | Kind::WriteImm => {
                let (r, sges) = take_receive(qp);
                let k = if kind == Kind::Send {
                    IncomingKind::Send { wr_id: r.wr_id }
                } else {
                    IncomingKind::WriteImm { wr_id: r.wr_id }
                };
                let imm = (h.flags & HAS_IMM != 0).then_some(h.imm);
                Some(Incoming {
                    msn: h.msn,
                    kind: k,
                    imm,
                    targets,
                    need: if kind == Kind::Send {
                        Access::LOCAL_WRITE
                    } else {
                        Access::REMOTE_WRITE
                    },
                    total: h.total_len,
                    recv: Some((r, sges)),
                })
            }
            Kind::ReadResponse => unreachable!(),
        }
    }

    /// Receive buffers: key and LOCAL_WRITE checks (faults are handled by the caller).
    /// Returns the extents and, for each, whether it lies in an ODP region.
    #[allow(clippy::type_complexity)]
    fn local_targets(
        &self,
        sgl: &[Sge],
    ) -> Result<(SmallVec<[Extent; 2]>, SmallVec<[bool; 2]>), ()> {
        let tpt = self.own.tpt();
        let mut extents = SmallVec::new();
        let mut odp = SmallVec::new();
        for s in sgl.iter().filter(|s| s.len > 0) {
            let g = tpt
                .acquire(s.lkey, s.addr, s.len as u64, Access::LOCAL_WRITE)
                .map_err(|_| ())?;
            extents.push(Extent {
                addr: g.translation.dma_addr(s.addr),
                len: s.len as u64,
            });
            if g.translation.detached() {
                self.counters
                    .detached_bytes
                    .fetch_add(s.len as u64, Relaxed);
            }
            odp.push(g.translation.on_demand());
        }
        Ok((extents, odp))
    }

    /// Staged READ responses: stream the requested bytes back as ring space allows.
    pub(super) fn send_read_responses(&self, eng: &mut Engine, qpn: u32) {
        let Some(qp) = eng.qps[qpn as usize].as_mut() else {
            return;
        };
        let peer = qp.peer;
        while let Some(r) = qp.reads_out.front_mut() {
            loop {
                let chunk = (r.source.len - r.sent).min(MTU as u64);
                let last = r.sent + chunk == r.source.len;
                let h = Header {
                    kind: Kind::ReadResponse as u8,
                    flags: if last { LAST } else { 0 } | if r.sent == 0 { FIRST } else { 0 },
                    dst_qpn: r.dst_qpn,
                    src_qpn: qpn,
                    msn: r.msn,
                    total_len: r.source.len,
                    offset: r.sent,
                    payload_len: chunk as u32,
                    ..Header::default()
                };
                // Checked again for every packet: a region deregistered mid-READ ends the
                // READ with a remote access error instead of sending what is mapped there now.
                let src = self.hold_own(
                    std::slice::from_ref(&r.source),
                    r.sent,
                    chunk,
                    Access::REMOTE_READ,
                );
                let Ok((_held, src)) = src else {
                    let refused = Header {
                        flags: FIRST | LAST,
                        code: WcStatus::RemoteAccessError.code(),
                        payload_len: 0,
                        ..h
                    };
                    if !self.push_packet(peer, &refused, |_| Ok(())) {
                        self.peers[peer].mem.wake_driver_if_asleep();
                        return;
                    }
                    break;
                };
                let pushed = self.push_packet(peer, &h, |s| match src.first() {
                    Some(e) => dma::copy(s.payload_addr(), e.addr, chunk),
                    None => Ok(()), // a zero-length READ
                });
                if !pushed {
                    // Ring full: the requester drains it when it polls, or its driver.
                    self.peers[peer].mem.wake_driver_if_asleep();
                    return;
                }
                self.counters.add_bytes(DataPath::Staged, chunk);
                r.sent += chunk;
                if last {
                    break;
                }
            }
            qp.reads_out.pop_front();
        }
    }

    /// The requester's side of a staged READ: a response packet.
    fn handle_read_response(&self, eng: &mut Engine, h: &Header, slot: Slot<'_>) {
        let Ok(qp) = eng.qp_mut(h.dst_qpn) else {
            return;
        };
        let QueuePair { sq, sq_sges, .. } = qp;
        let Some(op) = sq.iter_mut().find(|o| o.msn == Some(h.msn)) else {
            return;
        };
        if op.state != OpState::AwaitingResponse {
            return;
        }
        if h.code != 0 {
            op.state = OpState::Done(WcStatus::from_code(h.code));
            return;
        }
        let len = h.payload_len as u64;
        if h.offset.checked_add(len).is_none_or(|end| end > op.total) {
            op.state = OpState::Done(WcStatus::RemoteOperationError);
            return;
        }
        let dst: SmallVec<[KeyedExtent; 2]> = sq_sges
            [op.sges.0 as usize..(op.sges.0 + op.sges.1) as usize]
            .iter()
            .map(KeyedExtent::from)
            .collect();
        let placed = self
            .hold_own(&dst, h.offset, len, Access::LOCAL_WRITE)
            .map_err(|_| ())
            .and_then(|(_held, dst)| {
                dma::scatter(&dst, 0, slot.payload_addr(), len).map_err(|_| ())
            });
        if placed.is_err() {
            op.state = OpState::Done(WcStatus::LocalProtectionError);
            return;
        }
        self.counters.add_bytes(DataPath::Staged, len);
        op.sent = op.sent.max(h.offset + len);
        if h.flags & LAST != 0 {
            op.state = OpState::Done(WcStatus::Success);
        }
    }
}
