//! The soft NIC's engine: queue pairs, completion queues and the RC protocol over the rings.
//!
//! Requester side: a queue pair's send queue is processed strictly in order. SENDs (and, on
//! the staged path, WRITEs and READs) become packets; RDMA WRITE and READ to a CMA-capable
//! peer are executed directly by this engine after checking the target's TPT, once every
//! earlier request of the queue pair has completed (so a WRITE followed by a SEND is seen in
//! that order). Completions are delivered in posting order.
//!
//! Responder side: requests are accepted only in message-sequence order; a request that
//! cannot be taken (no receive posted, or its pages are not present) is answered
//! receiver-not-ready and every later packet of the queue pair is dropped until the
//! requester goes back and retransmits from it (go-back-N, as RC does).

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::ring::{Header, Kind, Slot, CMA_DESCRIPTOR, FIRST, HAS_IMM, LAST, MTU};
use super::tpt::Refusal;
use super::{Inner, Peer, MAX_QPS};
use crate::error::{Error, Result};
use crate::nic::{
    Access, Completion, DataPath, Opcode, QpCaps, RecvWr, SendWr, Sge, WcOpcode, WcStatus,
    PAGE_SIZE,
};
use crate::sys::{self, CmaDirection, Extent};

/// How long a request may wait on a peer before its liveness is checked.
const LIVENESS_AFTER: Duration = Duration::from_millis(5);
/// Fallback retry time when a filed fault is not answered (the owner may be gone).
const FAULT_RECHECK: Duration = Duration::from_millis(100);
/// Packets taken from one inbound ring per progress pass (fairness between peers).
const RX_BUDGET: usize = 64;

pub(crate) struct Engine {
    cqs: Vec<Option<CompletionQueue>>,
    qps: Vec<Option<QueuePair>>,
    /// Control packets (acknowledgements) waiting for ring space, per peer.
    outbox: Vec<VecDeque<Header>>,
}

struct CompletionQueue {
    depth: usize,
    entries: VecDeque<Completion>,
}

pub(crate) struct QueuePair {
    qpn: u32,
    pub(crate) peer: usize,
    send_cq: u32,
    recv_cq: u32,
    caps: QpCaps,
    pub(crate) remote_qpn: Option<u32>,
    error: Option<String>,
    sq: VecDeque<SendOp>,
    /// Index in `sq` of the first request not completely transmitted.
    cursor: usize,
    next_msn: u64,
    rq: VecDeque<RecvOp>,
    /// Next request sequence number this responder accepts.
    expected_msn: u64,
    /// A multi-packet request being received.
    rx: Option<Incoming>,
    /// Packets of this message are dropped until its first packet comes again.
    discard_msn: Option<u64>,
    /// The last receive-side fault filed: (msn, fault sequence number).
    rx_fault: Option<(u64, u64)>,
    /// READ responses being sent (staged path).
    reads_out: VecDeque<ReadOut>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Send {
        imm: Option<u32>,
    },
    Write {
        addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    Read {
        addr: u64,
        rkey: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpState {
    Pending,
    Transmitting,
    AwaitingResponse,
    Rnr {
        retry_at: Instant,
        /// (rank owning the faulting memory, its NPF slot, fault sequence number).
        fault: Option<(usize, u32, u64)>,
    },
    Done(WcStatus),
}

struct SendOp {
    wr_id: u64,
    kind: OpKind,
    signaled: bool,
    /// Message sequence number, given when the request first goes on the wire (requests
    /// executed directly by CMA never do).
    msn: Option<u64>,
    sgl: Vec<Sge>,
    inline: Option<Vec<u8>>,
    total: u64,
    state: OpState,
    sent: u64,
    /// The payload of a WRITE WITH IMM already went by CMA; only the immediate is left.
    data_placed: bool,
    rnr_count: u32,
    since: Instant,
    checked_alive: Instant,
}

struct RecvOp {
    wr_id: u64,
    sgl: Vec<Sge>,
    capacity: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum IncomingKind {
    Send { wr_id: u64 },
    Write,
    WriteImm { wr_id: u64 },
}

struct Incoming {
    msn: u64,
    kind: IncomingKind,
    imm: Option<u32>,
    targets: Vec<Extent>,
    total: u64,
}

struct ReadOut {
    msn: u64,
    dst_qpn: u32,
    source: Extent,
    sent: u64,
}

impl Engine {
    pub(crate) fn new(ranks: usize) -> Engine {
        Engine {
            cqs: Vec::new(),
            qps: (0..MAX_QPS).map(|_| None).collect(),
            outbox: (0..ranks).map(|_| VecDeque::new()).collect(),
        }
    }

    pub(crate) fn create_cq(&mut self, depth: u32) -> Result<u32> {
        if depth == 0 {
            return Err(Error::InvalidArgument("completion queue depth 0".into()));
        }
        self.cqs.push(Some(CompletionQueue {
            depth: depth as usize,
            entries: VecDeque::new(),
        }));
        Ok(self.cqs.len() as u32 - 1)
    }

    pub(crate) fn create_qp(
        &mut self,
        peer: usize,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
    ) -> Result<u32> {
        for cq in [send_cq, recv_cq] {
            if self.cqs.get(cq as usize).is_none_or(Option::is_none) {
                return Err(Error::InvalidArgument(format!("no completion queue {cq}")));
            }
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
            sq: VecDeque::new(),
            cursor: 0,
            next_msn: 0,
            rq: VecDeque::new(),
            expected_msn: 0,
            rx: None,
            discard_msn: None,
            rx_fault: None,
            reads_out: VecDeque::new(),
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

    pub(crate) fn drain_cq(
        &mut self,
        cq: u32,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Result<usize> {
        let q = self
            .cqs
            .get_mut(cq as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::InvalidArgument(format!("no completion queue {cq}")))?;
        let n = max.min(q.entries.len());
        out.extend(q.entries.drain(..n));
        Ok(n)
    }

    /// Whether READ responses or control packets are waiting to be sent.
    pub(crate) fn has_responder_work(&self) -> bool {
        self.outbox.iter().any(|o| !o.is_empty())
            || self.qps.iter().flatten().any(|q| !q.reads_out.is_empty())
    }

    fn push_completion(&mut self, cq: u32, c: Completion) {
        if let Some(Some(q)) = self.cqs.get_mut(cq as usize) {
            // An overrun queue keeps the newest entries' count honest by growing; verbs would
            // raise an async CQ error instead. The queue depth is a sizing hint here.
            let _ = q.depth;
            q.entries.push_back(c);
        }
    }
}

fn total_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| s.len as u64).sum()
}

/// The sub-range `[offset, offset+len)` of the byte stream the extents describe.
fn slice_extents(extents: &[Extent], mut offset: u64, mut len: u64) -> Vec<Extent> {
    let mut out = Vec::new();
    for e in extents {
        if len == 0 {
            break;
        }
        if offset >= e.len {
            offset -= e.len;
            continue;
        }
        let take = (e.len - offset).min(len);
        out.push(Extent {
            addr: e.addr + offset,
            len: take,
        });
        len -= take;
        offset = 0;
    }
    out
}

impl Inner {
    pub(crate) fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<()> {
        let mut eng = self.engine.lock();
        let qp = eng.qp_mut(qpn)?;
        if qp.remote_qpn.is_none() {
            return Err(Error::InvalidArgument(format!(
                "queue pair {qpn} is not connected (call connect with the peer's endpoint first)"
            )));
        }
        if qp.sq.len() >= qp.caps.max_send_wr as usize {
            return Err(Error::Exhausted {
                what: "send queue",
                limit: qp.caps.max_send_wr as u64,
                hint: "poll the send completion queue before posting more",
            });
        }
        if wr.sgl.len() > qp.caps.max_sge as usize {
            return Err(Error::InvalidArgument(format!(
                "{} scatter-gather entries; the queue pair allows {}",
                wr.sgl.len(),
                qp.caps.max_sge
            )));
        }
        let total = total_len(wr.sgl);
        let kind = match wr.opcode {
            Opcode::Send => OpKind::Send { imm: None },
            Opcode::SendWithImm(imm) => OpKind::Send { imm: Some(imm) },
            Opcode::RdmaWrite { remote_addr, rkey } => OpKind::Write {
                addr: remote_addr,
                rkey,
                imm: None,
            },
            Opcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => OpKind::Write {
                addr: remote_addr,
                rkey,
                imm: Some(imm),
            },
            Opcode::RdmaRead { remote_addr, rkey } => OpKind::Read {
                addr: remote_addr,
                rkey,
            },
        };
        let inline = if wr.inline {
            if matches!(kind, OpKind::Read { .. }) {
                return Err(Error::InvalidArgument("RDMA READ cannot be inline".into()));
            }
            if total > qp.caps.max_inline as u64 {
                return Err(Error::InvalidArgument(format!(
                    "{total} inline bytes; the queue pair allows {}",
                    qp.caps.max_inline
                )));
            }
            let mut data = vec![0u8; total as usize];
            let local = [Extent {
                addr: data.as_mut_ptr() as u64,
                len: total,
            }];
            let src: Vec<Extent> = wr
                .sgl
                .iter()
                .map(|s| Extent {
                    addr: s.addr,
                    len: s.len as u64,
                })
                .collect();
            sys::cma_copy(self.pid, CmaDirection::Read, &local, &src)
                .map_err(|e| Error::os("reading inline send data", e))?;
            self.counters.bytes_inline.fetch_add(total, Relaxed);
            Some(data)
        } else {
            None
        };
        let now = Instant::now();
        let state = if qp.error.is_some() {
            OpState::Done(WcStatus::WrFlushError)
        } else {
            OpState::Pending
        };
        qp.sq.push_back(SendOp {
            wr_id: wr.wr_id,
            kind,
            signaled: wr.signaled,
            msn: None,
            sgl: wr.sgl.to_vec(),
            inline,
            total,
            state,
            sent: 0,
            data_placed: false,
            rnr_count: 0,
            since: now,
            checked_alive: now,
        });
        self.progress_qp(&mut eng, qpn);
        Ok(())
    }

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
        if wr.sgl.len() > qp.caps.max_sge as usize {
            return Err(Error::InvalidArgument(format!(
                "{} scatter-gather entries; the queue pair allows {}",
                wr.sgl.len(),
                qp.caps.max_sge
            )));
        }
        let op = RecvOp {
            wr_id: wr.wr_id,
            sgl: wr.sgl.to_vec(),
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
        }
        Ok(())
    }

    /// One pass of the engine: inbound packets from every peer, waiting control packets,
    /// then every queue pair's requests and READ responses.
    pub(crate) fn progress(&self, eng: &mut Engine) {
        // The driver's work, done by whichever thread of the owner gets there first: a
        // polling application serves faults on its memory at once, and the driver thread
        // serves them while the application computes.
        self.serve_faults();
        for p in 0..self.peers.len() {
            let ring = self.own.ring_from(p);
            for _ in 0..RX_BUDGET {
                let Some((h, slot)) = ring.peek() else { break };
                self.handle_packet(eng, p, h, slot);
                ring.pop();
            }
        }
        for p in 0..self.peers.len() {
            while let Some(h) = eng.outbox[p].front().copied() {
                if !self.push_packet(p, &h, |_| Ok(())) {
                    break;
                }
                eng.outbox[p].pop_front();
            }
        }
        for qpn in 0..MAX_QPS as u32 {
            if eng.qps[qpn as usize].is_some() {
                self.progress_qp(eng, qpn);
            }
        }
    }

    /// Pushes one packet to `peer`, filling its payload with `fill`; false if the ring is full.
    fn push_packet(
        &self,
        peer: usize,
        h: &Header,
        fill: impl FnOnce(&Slot<'_>) -> std::io::Result<()>,
    ) -> bool {
        let ring = self.peers[peer].mem.ring_from(self.rank);
        let Some(slot) = ring.reserve() else {
            return false;
        };
        if fill(&slot).is_err() {
            // The payload could not be read (the source vanished); send the header with an
            // error code so the receiver fails the request instead of taking garbage.
            let mut bad = *h;
            bad.code = WcStatus::LocalProtectionError.code();
            ring.publish(slot, &bad);
            return true;
        }
        ring.publish(slot, h);
        true
    }

    /// Sends a control packet now or queues it behind earlier ones.
    fn send_control(&self, eng: &mut Engine, peer: usize, h: Header) {
        if !eng.outbox[peer].is_empty() || !self.push_packet(peer, &h, |_| Ok(())) {
            eng.outbox[peer].push_back(h);
        }
    }

    fn ack(
        &self,
        eng: &mut Engine,
        peer: usize,
        dst_qpn: u32,
        src_qpn: u32,
        msn: u64,
        status: WcStatus,
    ) {
        let h = Header {
            kind: Kind::Ack as u8,
            flags: FIRST | LAST,
            code: status.code(),
            dst_qpn,
            src_qpn,
            msn,
            ..Header::default()
        };
        self.send_control(eng, peer, h);
    }

    fn rnr_nack(
        &self,
        eng: &mut Engine,
        peer: usize,
        dst_qpn: u32,
        src_qpn: u32,
        msn: u64,
        fault_seq: Option<u64>,
    ) {
        self.counters.rnr_nacks_sent.fetch_add(1, Relaxed);
        let h = Header {
            kind: Kind::RnrNack as u8,
            flags: FIRST | LAST,
            code: fault_seq.is_some() as u16,
            dst_qpn,
            src_qpn,
            msn,
            offset: fault_seq.unwrap_or(0),
            ..Header::default()
        };
        self.send_control(eng, peer, h);
    }

    fn handle_packet(&self, eng: &mut Engine, from: usize, h: Header, slot: Slot<'_>) {
        let Some(kind) = h.kind() else { return };
        // Only packets of a queue pair connected to the sender's queue pair count.
        match eng.qps.get(h.dst_qpn as usize).and_then(Option::as_ref) {
            Some(qp) if qp.peer == from && qp.remote_qpn == Some(h.src_qpn) => {}
            _ => return,
        }
        match kind {
            Kind::Send | Kind::Write | Kind::WriteImm | Kind::ReadRequest => {
                self.handle_request(eng, from, kind, &h, slot)
            }
            Kind::Ack => self.finish_op(eng, h.dst_qpn, h.msn, WcStatus::from_code(h.code)),
            Kind::RnrNack => self.handle_rnr(eng, &h),
            Kind::ReadResponse => self.handle_read_response(eng, &h, slot),
        }
    }

    fn finish_op(&self, eng: &mut Engine, qpn: u32, msn: u64, status: WcStatus) {
        let Ok(qp) = eng.qp_mut(qpn) else { return };
        if let Some(op) = qp.sq.iter_mut().find(|o| o.msn == Some(msn)) {
            if matches!(op.state, OpState::AwaitingResponse | OpState::Transmitting) {
                op.state = OpState::Done(status);
            }
        }
    }

    fn handle_rnr(&self, eng: &mut Engine, h: &Header) {
        let Ok(qp) = eng.qp_mut(h.dst_qpn) else {
            return;
        };
        let Some(idx) = qp.sq.iter().position(|o| o.msn == Some(h.msn)) else {
            return;
        };
        let peer = qp.peer;
        let remote_qpn = qp.remote_qpn.unwrap_or(0);
        let (timer, limit) = (qp.caps.rnr_timer_us, qp.caps.rnr_retry);
        let op = &mut qp.sq[idx];
        if !matches!(op.state, OpState::AwaitingResponse | OpState::Transmitting) {
            return;
        }
        op.rnr_count += 1;
        self.counters.rnr_retries.fetch_add(1, Relaxed);
        op.state = if limit != 7 && op.rnr_count > limit as u32 {
            OpState::Done(WcStatus::RnrRetryExceeded)
        } else {
            let fault = (h.code == 1).then_some((peer, remote_qpn, h.offset));
            let wait = if fault.is_some() {
                FAULT_RECHECK
            } else {
                Duration::from_micros(timer as u64)
            };
            OpState::Rnr {
                retry_at: Instant::now() + wait,
                fault,
            }
        };
        // Go back: everything after the refused request is retransmitted after it.
        for later in qp.sq.iter_mut().skip(idx + 1) {
            if matches!(
                later.state,
                OpState::AwaitingResponse | OpState::Transmitting
            ) {
                later.state = OpState::Pending;
                later.sent = 0;
            }
        }
        qp.cursor = qp.cursor.min(idx);
    }

    fn handle_read_response(&self, eng: &mut Engine, h: &Header, slot: Slot<'_>) {
        let Ok(qp) = eng.qp_mut(h.dst_qpn) else {
            return;
        };
        let Some(op) = qp.sq.iter_mut().find(|o| o.msn == Some(h.msn)) else {
            return;
        };
        if op.state != OpState::AwaitingResponse {
            return;
        }
        if h.code != 0 {
            op.state = OpState::Done(WcStatus::from_code(h.code));
            return;
        }
        let dst: Vec<Extent> = op
            .sgl
            .iter()
            .map(|s| Extent {
                addr: s.addr,
                len: s.len as u64,
            })
            .collect();
        let dst = slice_extents(&dst, h.offset, h.payload_len as u64);
        let src = [Extent {
            addr: slot.payload_addr(),
            len: h.payload_len as u64,
        }];
        if sys::cma_copy(self.pid, CmaDirection::Write, &src, &dst).is_err() {
            op.state = OpState::Done(WcStatus::LocalProtectionError);
            return;
        }
        self.counters
            .add_bytes(DataPath::Staged, h.payload_len as u64);
        op.sent = op.sent.max(h.offset + h.payload_len as u64);
        if h.flags & LAST != 0 {
            op.state = OpState::Done(WcStatus::Success);
        }
    }

    /// Checks a local scatter-gather list against this NIC's table and resolves requester
    /// network page faults on its ODP parts in one batch. Returns the extents.
    fn local_extents(&self, sgl: &[Sge], need: Access) -> Result<Vec<Extent>, WcStatus> {
        let tpt = self.own.tpt();
        let mut out = Vec::with_capacity(sgl.len());
        for s in sgl {
            if s.len == 0 {
                continue;
            }
            let guard = tpt
                .acquire(s.lkey, s.addr, s.len as u64, need)
                .map_err(|_| WcStatus::LocalProtectionError)?;
            let e = Extent {
                addr: s.addr,
                len: s.len as u64,
            };
            if guard.translation.on_demand() {
                let missing = self.missing_pages(&self.peers[self.rank], e);
                if let Some(range) = fault_range(&missing) {
                    let t0 = sys::monotonic_ns();
                    if !self.resolve_fault(
                        range.addr,
                        range.len,
                        need.contains(Access::LOCAL_WRITE),
                    ) {
                        return Err(WcStatus::LocalProtectionError);
                    }
                    self.counters
                        .record_npf(true, range.len / PAGE_SIZE, sys::monotonic_ns() - t0);
                }
            }
            out.push(e);
        }
        Ok(out)
    }

    /// Pages of `e` (in `owner`'s address space) that the NIC may not use: not present in
    /// its bitmap, or — where the owner has no memory monitor keeping the bits true — present
    /// there but no longer mapped in the owner's page tables (which clears their bit).
    fn missing_pages(&self, owner: &Peer, e: Extent) -> Vec<u64> {
        let bits = owner.mem.present();
        let mut missing = bits.missing(e.addr, e.len);
        let pages = sys::page_span(e.addr, e.len).1 / PAGE_SIZE;
        if (missing.len() as u64) < pages && !owner.mem.odp_monitored() {
            if let Some(pm) = &owner.pagemap {
                let mut mapped = Vec::with_capacity(pages as usize);
                if sys::pages_mapped(pm, e.addr, e.len, &mut mapped).is_ok() {
                    let first = e.addr / PAGE_SIZE;
                    for (i, m) in mapped.iter().enumerate() {
                        let page = first + i as u64;
                        if !m && bits.clear_page(page) {
                            self.counters.invalidated_pages.fetch_add(1, Relaxed);
                            missing.push(page);
                        }
                    }
                    missing.sort_unstable();
                }
            }
        }
        missing
    }

    fn progress_qp(&self, eng: &mut Engine, qpn: u32) {
        self.send_read_responses(eng, qpn);
        self.transmit(eng, qpn);
        self.complete_front(eng, qpn);
    }

    fn transmit(&self, eng: &mut Engine, qpn: u32) {
        let Some(qp) = eng.qps[qpn as usize].as_mut() else {
            return;
        };
        let Some(remote_qpn) = qp.remote_qpn else {
            return;
        };
        if qp.error.is_some() {
            return;
        }
        let peer = &self.peers[qp.peer];
        let now = Instant::now();
        let mut i = 0;
        while i < qp.sq.len() {
            let first_outstanding = i == 0;
            let op = &mut qp.sq[i];
            match op.state {
                OpState::Done(_) => {}
                OpState::AwaitingResponse => {
                    if now.duration_since(op.checked_alive) > LIVENESS_AFTER {
                        op.checked_alive = now;
                        if !peer_alive(peer) {
                            op.state = OpState::Done(WcStatus::RetryExceeded);
                        }
                    }
                }
                OpState::Rnr { retry_at, fault } => {
                    let resolved = fault.map(|(owner, slot, seq)| {
                        self.peers[owner].mem.npf_slot(slot).outcome(seq)
                    });
                    match resolved {
                        Some(Some(false)) => op.state = OpState::Done(WcStatus::RemoteAccessError),
                        Some(Some(true)) => op.state = OpState::Pending,
                        _ if now >= retry_at => {
                            if peer_alive(peer) {
                                op.state = OpState::Pending;
                            } else {
                                op.state = OpState::Done(WcStatus::RetryExceeded);
                            }
                        }
                        _ => break,
                    }
                    if op.state != OpState::Pending {
                        i += 1;
                        continue;
                    }
                    op.sent = 0;
                    i = i.max(qp.cursor.min(i));
                    continue;
                }
                OpState::Pending | OpState::Transmitting => {
                    if i < qp.cursor {
                        qp.cursor = i;
                    }
                    let direct =
                        peer.cma && !matches!(op.kind, OpKind::Send { .. }) && !op.data_placed;
                    if direct {
                        if !first_outstanding {
                            break; // fence: earlier requests must complete first
                        }
                        self.execute_direct(op, peer, remote_qpn);
                        if matches!(op.state, OpState::Rnr { .. }) {
                            break;
                        }
                        if op.state == OpState::Pending {
                            continue; // data placed, immediate still to send
                        }
                    } else if !{
                        if op.msn.is_none() {
                            op.msn = Some(qp.next_msn);
                            qp.next_msn += 1;
                        }
                        self.transmit_packets(op, qp.peer, qpn, remote_qpn, peer.cma)
                    } {
                        op.state = OpState::Transmitting;
                        // Ring full: the peer must drain it. If its application is not
                        // polling, only its driver thread can, so wake it.
                        peer.mem.ring_doorbell();
                        break;
                    } else {
                        op.state = OpState::AwaitingResponse;
                        if !peer.cma && !matches!(op.kind, OpKind::Send { .. }) {
                            peer.mem.ring_doorbell(); // one-sided work for the peer's NIC
                        }
                    }
                    if now.duration_since(op.since) > LIVENESS_AFTER && !peer_alive(peer) {
                        op.state = OpState::Done(WcStatus::RetryExceeded);
                    }
                    qp.cursor = i + 1;
                }
            }
            i += 1;
        }
    }

    /// RDMA WRITE or READ by one kernel copy, after the TPT check on the target.
    fn execute_direct(&self, op: &mut SendOp, peer: &Peer, remote_qpn: u32) {
        let (raddr, rkey, write) = match op.kind {
            OpKind::Write { addr, rkey, .. } => (addr, rkey, true),
            OpKind::Read { addr, rkey } => (addr, rkey, false),
            OpKind::Send { .. } => unreachable!("sends are packets"),
        };
        let need_local = if write {
            Access::NONE
        } else {
            Access::LOCAL_WRITE
        };
        let local = match &op.inline {
            Some(data) => Ok(vec![Extent {
                addr: data.as_ptr() as u64,
                len: data.len() as u64,
            }]),
            None => self.local_extents(&op.sgl, need_local),
        };
        let local = match local {
            Ok(l) => l,
            Err(s) => {
                op.state = OpState::Done(s);
                return;
            }
        };
        let imm_follows = matches!(op.kind, OpKind::Write { imm: Some(_), .. });
        let finish = |op: &mut SendOp| {
            if imm_follows {
                op.data_placed = true;
                op.state = OpState::Pending;
            } else {
                op.state = OpState::Done(WcStatus::Success);
            }
        };
        if op.total == 0 {
            // Zero-length RDMA: no key is checked and nothing moves (IB spec 9.4.x), but the
            // request still needs the peer's acknowledgement: to a dead peer it times out,
            // which is what liveness probes rely on.
            if peer_alive(peer) {
                finish(op);
            } else {
                op.state = OpState::Done(WcStatus::RetryExceeded);
            }
            return;
        }
        let need = if write {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        let tpt = peer.mem.tpt();
        let guard = match tpt.acquire(rkey, raddr, op.total, need) {
            Ok(g) => g,
            Err(_) => {
                op.state = OpState::Done(WcStatus::RemoteAccessError);
                return;
            }
        };
        let remote = Extent {
            addr: raddr,
            len: op.total,
        };
        if guard.translation.on_demand() {
            if let Some(range) = fault_range(&self.missing_pages(peer, remote)) {
                // rNPF: the target's NIC answers receiver-not-ready while its driver thread
                // maps the pages; we retry when it says the fault is resolved.
                let seq = peer
                    .mem
                    .npf_slot(remote_qpn)
                    .file(range.addr, range.len, write);
                peer.mem.ring_doorbell();
                op.rnr_count += 1;
                self.counters.rnr_retries.fetch_add(1, Relaxed);
                op.state = OpState::Rnr {
                    retry_at: Instant::now() + FAULT_RECHECK,
                    fault: Some((peer.rank, remote_qpn, seq)),
                };
                return;
            }
        }
        let dir = if write {
            CmaDirection::Write
        } else {
            CmaDirection::Read
        };
        match sys::cma_copy(peer.pid, dir, &local, &[remote]) {
            Ok(n) => {
                self.counters.add_bytes(DataPath::Cma, n);
                drop(guard);
                finish(op);
            }
            Err(e) => {
                op.state = OpState::Done(match e.raw_os_error() {
                    Some(libc::ESRCH) => WcStatus::RetryExceeded,
                    _ if !sys::is_mapped_all(&local) => WcStatus::LocalProtectionError,
                    _ => WcStatus::RemoteAccessError,
                });
            }
        }
    }

    /// Sends the packets of a request; false when the ring filled up first.
    fn transmit_packets(
        &self,
        op: &mut SendOp,
        peer: usize,
        qpn: u32,
        remote_qpn: u32,
        cma: bool,
    ) -> bool {
        if op.sent == 0 && op.state == OpState::Pending && op.inline.is_none() && !op.data_placed {
            let need = if matches!(op.kind, OpKind::Read { .. }) {
                Access::LOCAL_WRITE
            } else {
                Access::NONE
            };
            if let Err(s) = self.local_extents(&op.sgl, need) {
                op.state = OpState::Done(s);
                return true;
            }
        }
        let base = Header {
            dst_qpn: remote_qpn,
            src_qpn: qpn,
            msn: op.msn.expect("assigned before transmission"),
            total_len: op.total,
            ..Header::default()
        };
        let local: Vec<Extent> = op
            .sgl
            .iter()
            .map(|s| Extent {
                addr: s.addr,
                len: s.len as u64,
            })
            .collect();
        match op.kind {
            OpKind::Read { addr, rkey } => {
                let h = Header {
                    kind: Kind::ReadRequest as u8,
                    flags: FIRST | LAST,
                    remote_addr: addr,
                    rkey,
                    ..base
                };
                self.push_packet(peer, &h, |_| Ok(()))
            }
            OpKind::Write { imm, .. } if op.data_placed => {
                let h = Header {
                    kind: Kind::WriteImm as u8,
                    flags: FIRST | LAST | HAS_IMM | CMA_DESCRIPTOR,
                    imm: imm.unwrap_or(0),
                    ..base
                };
                self.push_packet(peer, &h, |_| Ok(()))
            }
            OpKind::Send { imm } if cma && op.inline.is_none() && op.total > 0 => {
                // The receiver pulls the payload from our memory with one kernel copy.
                let mut desc = Vec::with_capacity(local.len() * 16);
                for e in local.iter().filter(|e| e.len > 0) {
                    desc.extend_from_slice(&e.addr.to_le_bytes());
                    desc.extend_from_slice(&e.len.to_le_bytes());
                }
                let h = Header {
                    kind: Kind::Send as u8,
                    flags: FIRST | LAST | CMA_DESCRIPTOR | if imm.is_some() { HAS_IMM } else { 0 },
                    imm: imm.unwrap_or(0),
                    payload_len: desc.len() as u32,
                    ..base
                };
                self.push_packet(peer, &h, |s| {
                    s.write_payload(&desc);
                    Ok(())
                })
            }
            OpKind::Send { .. } | OpKind::Write { .. } => {
                let (kind, imm, raddr, rkey) = match op.kind {
                    OpKind::Send { imm } => (Kind::Send, imm, 0, 0),
                    OpKind::Write {
                        addr,
                        rkey,
                        imm: Some(i),
                    } => (Kind::WriteImm, Some(i), addr, rkey),
                    OpKind::Write {
                        addr,
                        rkey,
                        imm: None,
                    } => (Kind::Write, None, addr, rkey),
                    OpKind::Read { .. } => unreachable!(),
                };
                loop {
                    let chunk = (op.total - op.sent).min(MTU as u64);
                    let mut flags = 0;
                    if op.sent == 0 {
                        flags |= FIRST;
                    }
                    if op.sent + chunk == op.total {
                        flags |= LAST;
                    }
                    if imm.is_some() {
                        flags |= HAS_IMM;
                    }
                    let h = Header {
                        kind: kind as u8,
                        flags,
                        imm: imm.unwrap_or(0),
                        offset: op.sent,
                        remote_addr: raddr,
                        rkey,
                        payload_len: chunk as u32,
                        ..base
                    };
                    let offset = op.sent;
                    let pushed = self.push_packet(peer, &h, |s| match &op.inline {
                        Some(d) => {
                            s.write_payload(&d[offset as usize..(offset + chunk) as usize]);
                            Ok(())
                        }
                        None => {
                            let src = slice_extents(&local, offset, chunk);
                            let dst = [Extent {
                                addr: s.payload_addr(),
                                len: chunk,
                            }];
                            sys::cma_copy(self.pid, CmaDirection::Read, &dst, &src).map(|_| ())
                        }
                    });
                    if !pushed {
                        return false;
                    }
                    if op.inline.is_none() {
                        self.counters.add_bytes(DataPath::Staged, chunk);
                    }
                    op.sent += chunk;
                    if op.sent == op.total {
                        return true;
                    }
                }
            }
        }
    }

    /// Delivers completions of finished requests at the front of the send queue, in order;
    /// an error puts the queue pair in the error state and flushes the rest.
    fn complete_front(&self, eng: &mut Engine, qpn: u32) {
        let mut out: Vec<(u32, Completion)> = Vec::new();
        {
            let Some(qp) = eng.qps[qpn as usize].as_mut() else {
                return;
            };
            while let Some(OpState::Done(status)) = qp.sq.front().map(|o| o.state) {
                let op = qp.sq.pop_front().expect("front exists");
                qp.cursor = qp.cursor.saturating_sub(1);
                let opcode = match op.kind {
                    OpKind::Send { .. } => WcOpcode::Send,
                    OpKind::Write { .. } => WcOpcode::RdmaWrite,
                    OpKind::Read { .. } => WcOpcode::RdmaRead,
                };
                let len = if opcode == WcOpcode::RdmaRead {
                    op.total as u32
                } else {
                    0
                };
                if status != WcStatus::Success || op.signaled {
                    out.push((
                        qp.send_cq,
                        completion(op.wr_id, status, opcode, len, None, qpn),
                    ));
                }
                if status != WcStatus::Success && qp.error.is_none() {
                    qp.error = Some(format!("work request {} ended with {status}", op.wr_id));
                    for rest in qp.sq.iter_mut() {
                        rest.state = OpState::Done(WcStatus::WrFlushError);
                    }
                    for r in qp.rq.drain(..) {
                        out.push((
                            qp.recv_cq,
                            completion(
                                r.wr_id,
                                WcStatus::WrFlushError,
                                WcOpcode::Recv,
                                0,
                                None,
                                qpn,
                            ),
                        ));
                    }
                }
            }
        }
        for (cq, c) in out {
            if c.status != WcStatus::Success {
                self.counters.error_completions.fetch_add(1, Relaxed);
            }
            eng.push_completion(cq, c);
        }
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
        let (recv_cq, src_qpn) = (qp.recv_cq, h.src_qpn);
        if qp.error.is_some() {
            if h.flags & FIRST != 0 {
                self.ack(
                    eng,
                    from,
                    src_qpn,
                    qpn,
                    h.msn,
                    WcStatus::RemoteOperationError,
                );
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
        if h.flags & FIRST != 0 {
            qp.rx = None;
            match self.accept_request(eng, from, kind, h) {
                Accept::Taken => {}
                Accept::Refused => return,
            }
        }
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        let Some(rx) = qp.rx.as_mut() else { return };
        if rx.msn != h.msn {
            return;
        }
        // Move the payload.
        let moved = if h.code != 0 {
            Err(WcStatus::from_code(h.code))
        } else if h.flags & CMA_DESCRIPTOR != 0 {
            if kind == Kind::WriteImm {
                Ok(()) // data already placed by the initiator
            } else {
                let mut desc = vec![0u8; h.payload_len as usize];
                slot.read_payload(&mut desc);
                let src: Vec<Extent> = desc
                    .chunks_exact(16)
                    .map(|c| Extent {
                        addr: u64::from_le_bytes(c[0..8].try_into().expect("8")),
                        len: u64::from_le_bytes(c[8..16].try_into().expect("8")),
                    })
                    .collect();
                let dst = slice_extents(&rx.targets, 0, rx.total);
                match sys::cma_copy(self.peers[from].pid, CmaDirection::Read, &dst, &src) {
                    Ok(n) => {
                        self.counters.add_bytes(DataPath::Cma, n);
                        Ok(())
                    }
                    Err(_) if !sys::is_mapped_all(&dst) => Err(WcStatus::LocalProtectionError),
                    Err(_) => Err(WcStatus::RemoteOperationError),
                }
            }
        } else if h.payload_len > 0 {
            let dst = slice_extents(&rx.targets, h.offset, h.payload_len as u64);
            let src = [Extent {
                addr: slot.payload_addr(),
                len: h.payload_len as u64,
            }];
            match sys::cma_copy(self.pid, CmaDirection::Write, &src, &dst) {
                Ok(n) => {
                    self.counters.add_bytes(DataPath::Staged, n);
                    Ok(())
                }
                Err(_) => Err(WcStatus::LocalProtectionError),
            }
        } else {
            Ok(())
        };
        if let Err(status) = moved {
            let rx = qp.rx.take().expect("present");
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
            self.ack(eng, from, src_qpn, qpn, h.msn, remote);
            return;
        }
        if h.flags & LAST != 0 {
            let rx = qp.rx.take().expect("present");
            qp.expected_msn += 1;
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
            self.ack(eng, from, src_qpn, qpn, h.msn, WcStatus::Success);
        }
    }

    /// The first packet of a request: checks keys, lengths and pages, takes a receive.
    fn accept_request(&self, eng: &mut Engine, from: usize, kind: Kind, h: &Header) -> Accept {
        let qpn = h.dst_qpn;
        let src_qpn = h.src_qpn;
        let me = &self.peers[self.rank];
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        let recv_cq = qp.recv_cq;
        let data_placed = kind == Kind::WriteImm && h.flags & CMA_DESCRIPTOR != 0;
        // Where the bytes go, and which right that needs.
        let targets: Vec<Extent>;
        // The parts of `targets` that lie in ODP regions (checked for faults below).
        let mut odp_targets: Vec<Extent> = Vec::new();
        let mut recv: Option<RecvOp> = None;
        match kind {
            Kind::Send | Kind::WriteImm => {
                let Some(r) = qp.rq.front() else {
                    qp.discard_msn = Some(h.msn);
                    self.rnr_nack(eng, from, src_qpn, qpn, h.msn, None);
                    return Accept::Refused;
                };
                if kind == Kind::Send {
                    if h.total_len > r.capacity {
                        let r = qp.rq.pop_front().expect("front");
                        qp.expected_msn += 1;
                        qp.discard_msn = Some(h.msn);
                        qp.error = Some(format!(
                            "a {}-byte send arrived for a {}-byte receive",
                            h.total_len, r.capacity
                        ));
                        self.counters.error_completions.fetch_add(1, Relaxed);
                        eng.push_completion(
                            recv_cq,
                            completion(
                                r.wr_id,
                                WcStatus::LocalLengthError,
                                WcOpcode::Recv,
                                h.total_len as u32,
                                None,
                                qpn,
                            ),
                        );
                        self.flush_receives(eng, qpn);
                        self.ack(
                            eng,
                            from,
                            src_qpn,
                            qpn,
                            h.msn,
                            WcStatus::RemoteInvalidRequest,
                        );
                        return Accept::Refused;
                    }
                    let (extents, odp) = match self.local_targets(&r.sgl) {
                        Ok(e) => e,
                        Err(()) => {
                            let r = qp.rq.pop_front().expect("front");
                            qp.expected_msn += 1;
                            qp.discard_msn = Some(h.msn);
                            qp.error = Some("a receive buffer failed its key check".into());
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
                            self.flush_receives(eng, qpn);
                            self.ack(
                                eng,
                                from,
                                src_qpn,
                                qpn,
                                h.msn,
                                WcStatus::RemoteOperationError,
                            );
                            return Accept::Refused;
                        }
                    };
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
                    targets = slice_extents(&extents, 0, h.total_len);
                } else {
                    targets = vec![Extent {
                        addr: h.remote_addr,
                        len: h.total_len,
                    }];
                }
                recv = Some(RecvOp {
                    wr_id: r.wr_id,
                    sgl: Vec::new(),
                    capacity: r.capacity,
                });
            }
            Kind::Write | Kind::ReadRequest => {
                targets = vec![Extent {
                    addr: h.remote_addr,
                    len: h.total_len,
                }];
            }
            _ => unreachable!("not a request"),
        }
        // Remote key checks for WRITE / READ / WRITE WITH IMM (not for zero length).
        if kind != Kind::Send && h.total_len > 0 && !data_placed {
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
                        odp_targets = targets.clone();
                    }
                }
                Err(_) => {
                    let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                    qp.expected_msn += 1;
                    qp.discard_msn = Some(h.msn);
                    self.ack(eng, from, src_qpn, qpn, h.msn, WcStatus::RemoteAccessError);
                    return Accept::Refused;
                }
            }
        }
        // Receive-side network page faults: answer receiver-not-ready, let the driver map
        // the pages, and take the retransmission (seed 000 section 4, "rNPFs").
        if !odp_targets.is_empty() && !data_placed {
            let missing: Vec<u64> = odp_targets
                .iter()
                .flat_map(|e| self.missing_pages(me, *e))
                .collect();
            if let Some(range) = fault_range(&missing) {
                let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                if let Some((m, seq)) = qp.rx_fault {
                    if m == h.msn && me.mem.npf_slot(qpn).outcome(seq) == Some(false) {
                        // The memory is not mapped: the request fails.
                        qp.rx_fault = None;
                        qp.expected_msn += 1;
                        qp.discard_msn = Some(h.msn);
                        let status = if kind == Kind::Send {
                            WcStatus::RemoteOperationError
                        } else {
                            WcStatus::RemoteAccessError
                        };
                        if let Some(r) = recv {
                            qp.rq.pop_front();
                            qp.error = Some("a receive buffer is not mapped".into());
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
                            self.flush_receives(eng, qpn);
                        }
                        self.ack(eng, from, src_qpn, qpn, h.msn, status);
                        return Accept::Refused;
                    }
                }
                let write = kind != Kind::ReadRequest;
                let seq = me.mem.npf_slot(qpn).file(range.addr, range.len, write);
                let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                qp.rx_fault = Some((h.msn, seq));
                qp.discard_msn = Some(h.msn);
                me.mem.ring_doorbell();
                self.rnr_nack(eng, from, src_qpn, qpn, h.msn, Some(seq));
                return Accept::Refused;
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
                Accept::Refused // nothing more to receive for it
            }
            Kind::Write => {
                qp.rx = Some(Incoming {
                    msn: h.msn,
                    kind: IncomingKind::Write,
                    imm: None,
                    targets,
                    total: h.total_len,
                });
                Accept::Taken
            }
            Kind::Send | Kind::WriteImm => {
                let r = recv.expect("set above");
                qp.rq.pop_front();
                let k = if kind == Kind::Send {
                    IncomingKind::Send { wr_id: r.wr_id }
                } else {
                    IncomingKind::WriteImm { wr_id: r.wr_id }
                };
                let imm = (h.flags & HAS_IMM != 0).then_some(h.imm);
                qp.rx = Some(Incoming {
                    msn: h.msn,
                    kind: k,
                    imm,
                    targets,
                    total: h.total_len,
                });
                Accept::Taken
            }
            _ => unreachable!(),
        }
    }

    /// Receive buffers: key and LOCAL_WRITE checks (faults are handled by the caller).
    fn local_targets(&self, sgl: &[Sge]) -> Result<(Vec<Extent>, Vec<bool>), ()> {
        let tpt = self.own.tpt();
        let mut extents = Vec::with_capacity(sgl.len());
        let mut odp = Vec::with_capacity(sgl.len());
        for s in sgl.iter().filter(|s| s.len > 0) {
            let g = tpt
                .acquire(s.lkey, s.addr, s.len as u64, Access::LOCAL_WRITE)
                .map_err(|_: Refusal| ())?;
            extents.push(Extent {
                addr: s.addr,
                len: s.len as u64,
            });
            odp.push(g.translation.on_demand());
        }
        Ok((extents, odp))
    }

    fn flush_receives(&self, eng: &mut Engine, qpn: u32) {
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        let cq = qp.recv_cq;
        let flushed: Vec<u64> = qp.rq.drain(..).map(|r| r.wr_id).collect();
        for wr_id in flushed {
            eng.push_completion(
                cq,
                completion(wr_id, WcStatus::WrFlushError, WcOpcode::Recv, 0, None, qpn),
            );
        }
    }

    /// Staged READ responses: stream the requested bytes back as ring space allows.
    fn send_read_responses(&self, eng: &mut Engine, qpn: u32) {
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
                let src = [Extent {
                    addr: r.source.addr + r.sent,
                    len: chunk,
                }];
                let pushed = self.push_packet(peer, &h, |s| {
                    if chunk == 0 {
                        return Ok(());
                    }
                    let dst = [Extent {
                        addr: s.payload_addr(),
                        len: chunk,
                    }];
                    sys::cma_copy(self.pid, CmaDirection::Read, &dst, &src).map(|_| ())
                });
                if !pushed {
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
}

enum Accept {
    Taken,
    Refused,
}

/// The batch to fault in: from the first to the last missing page.
fn fault_range(missing: &[u64]) -> Option<Extent> {
    let (first, last) = (missing.iter().min()?, missing.iter().max()?);
    Some(Extent {
        addr: first * PAGE_SIZE,
        len: (last - first + 1) * PAGE_SIZE,
    })
}

fn peer_alive(peer: &Peer) -> bool {
    peer.process.as_ref().is_none_or(|p| p.is_alive())
}

fn completion(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slicing_extents_crosses_boundaries() {
        let e = [
            Extent { addr: 100, len: 10 },
            Extent { addr: 1000, len: 5 },
            Extent {
                addr: 5000,
                len: 20,
            },
        ];
        assert_eq!(
            slice_extents(&e, 8, 10),
            vec![
                Extent { addr: 108, len: 2 },
                Extent { addr: 1000, len: 5 },
                Extent { addr: 5000, len: 3 }
            ]
        );
        assert_eq!(
            slice_extents(&e, 15, 2),
            vec![Extent { addr: 5000, len: 2 }]
        );
        assert!(slice_extents(&e, 0, 0).is_empty());
    }

    #[test]
    fn fault_batches_span_first_to_last_missing_page() {
        assert_eq!(fault_range(&[]), None);
        assert_eq!(
            fault_range(&[7, 3, 5]),
            Some(Extent {
                addr: 3 * PAGE_SIZE,
                len: 5 * PAGE_SIZE
            })
        );
    }
}
