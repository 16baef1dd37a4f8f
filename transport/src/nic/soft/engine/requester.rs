//! The requester side of a queue pair: posting, transmitting, executing RDMA by CMA,
//! reading acknowledgements, and completing requests in order.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use smallvec::SmallVec;

use super::{
    completion, fault_extent, nanos, total_len, CoarseClock, Engine, Held, OpKind, OpState,
    QueuePair, SendOp, MAX_MSG_BYTES, SEND_CMA_MIN,
};
use crate::error::{Error, Result};
use crate::nic::counters::NpfTiming;
use crate::nic::soft::ack::Nak;
use crate::nic::soft::dma;
use crate::nic::soft::ring::{Header, Kind, Slot, CMA_DESCRIPTOR, FIRST, HAS_IMM, LAST, MTU};
use crate::nic::soft::tpt::claim_tag;
use crate::nic::soft::{Inner, Peer};
use crate::nic::{Access, DataPath, Opcode, SendWr, Sge, WcOpcode, WcStatus, PAGE_SIZE};
use crate::sys::{self, CmaDirection, Extent};

/// How long a request may wait on a peer before its liveness is checked (ns).
const LIVENESS_AFTER: u64 = nanos(Duration::from_millis(5));
/// How long a request may wait for its acknowledgement before the peer's driver thread is
/// woken (when the peer's application is not polling and its driver sleeps): the soft NIC's
/// retransmission timer (ns).
const NUDGE_AFTER: u64 = nanos(Duration::from_micros(200));
/// Fallback retry time when a filed fault is not answered, the owner may be gone (ns).
const FAULT_RECHECK: u64 = nanos(Duration::from_millis(100));

impl Inner {
    pub(crate) fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<()> {
        let mut guard = self.engine.lock();
        let eng = &mut *guard;
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
        qp.check_sges(wr.sgl.len())?;
        let total = total_len(wr.sgl);
        if total > MAX_MSG_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a work request of {total} bytes: the soft NIC carries at most {MAX_MSG_BYTES} \
                 bytes per work request (its max_msg_sz, as rxe's); split it"
            )));
        }
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
        let mut state = if qp.error.is_some() {
            OpState::Done(WcStatus::WrFlushError)
        } else {
            OpState::Pending
        };
        if wr.inline {
            if matches!(kind, OpKind::Read { .. }) {
                return Err(Error::InvalidArgument("RDMA READ cannot be inline".into()));
            }
            if total > qp.caps.max_inline as u64 {
                return Err(Error::InvalidArgument(format!(
                    "{total} inline bytes; the queue pair allows {}",
                    qp.caps.max_inline
                )));
            }
        }
        let now = eng.clock.now();
        let qp = eng.qps[qpn as usize].as_mut().expect("looked up above");
        let inline_at = if wr.inline {
            // The payload is copied now (the buffers may be reused once this returns): a
            // bad address completes the request with a local protection error.
            let at = qp.sq_inline.len();
            qp.sq_inline.resize(at + total as usize, 0);
            let mut dst = qp.sq_inline[at..].as_mut_ptr() as u64;
            for s in wr.sgl {
                if dma::copy(dst, s.addr, s.len as u64).is_err() {
                    state = OpState::Done(WcStatus::LocalProtectionError);
                    break;
                }
                dst += s.len as u64;
            }
            crate::nic::counters::add_serialized(&self.counters.bytes_inline, total);
            Some(at as u32)
        } else {
            None
        };
        let sges = (qp.sq_sges.len() as u32, wr.sgl.len() as u32);
        qp.sq_sges.extend_from_slice(wr.sgl);
        qp.sq.push_back(SendOp {
            wr_id: wr.wr_id,
            kind,
            msn: None,
            total,
            sent: 0,
            state,
            since: now,
            checked_alive: now,
            sges,
            inline_at,
            rnr_count: 0,
            signaled: wr.signaled,
            data_placed: false,
        });
        eng.mark_busy(qpn);
        self.transmit(eng, qpn);
        self.complete_front(eng, qpn);
        Ok(())
    }

    /// Reads the responder's acknowledgement line of `qpn`: completes what it accepted,
    /// and handles a NAK (go back and retransmit, or fail the request).
    pub(super) fn check_acknowledgements(&self, eng: &mut Engine, qpn: u32) {
        let Engine { qps, clock, .. } = eng;
        let Some(qp) = qps[qpn as usize].as_mut() else {
            return;
        };
        if qp.error.is_some() || qp.sq.is_empty() {
            return;
        }
        let line = self.own.ack_line(qpn);
        let acked = line.acked();
        if acked != qp.acked {
            qp.acked = acked;
            for op in qp.sq.iter_mut() {
                let accepted = op.msn.is_some_and(|m| m < acked);
                if accepted
                    && op.state == OpState::AwaitingResponse
                    && !matches!(op.kind, OpKind::Read { .. })
                {
                    op.state = OpState::Done(WcStatus::Success);
                }
            }
        }
        let Some((serial, msn, why)) = line.nak_since(qp.nak_seen) else {
            return;
        };
        qp.nak_seen = serial;
        let Some(idx) = qp.sq.iter().position(|o| o.msn == Some(msn)) else {
            return;
        };
        let (timer, limit) = (qp.caps.rnr_timer_us, qp.caps.rnr_retry);
        let op = &mut qp.sq[idx];
        if !matches!(op.state, OpState::AwaitingResponse | OpState::Transmitting) {
            return;
        }
        let fault = match why {
            Nak::Error(code) => {
                op.state = OpState::Done(WcStatus::from_code(code));
                return;
            }
            Nak::Rnr { fault } => fault,
        };
        op.rnr_count += 1;
        self.counters.rnr_retries.fetch_add(1, Relaxed);
        op.state = if limit != 7 && op.rnr_count > limit as u32 {
            OpState::Done(WcStatus::RnrRetryExceeded)
        } else {
            let wait = if fault.is_some() {
                FAULT_RECHECK
            } else {
                timer as u64 * 1000
            };
            OpState::Rnr {
                retry_at: clock.fresh() + wait,
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

    /// Transmits what the send queue of `qpn` has pending, and runs its timers.
    pub(super) fn transmit(&self, eng: &mut Engine, qpn: u32) {
        let Engine { qps, clock, .. } = eng;
        let Some(qp) = qps[qpn as usize].as_mut() else {
            return;
        };
        let Some(remote_qpn) = qp.remote_qpn else {
            return;
        };
        if qp.error.is_some() {
            return;
        }
        let QueuePair {
            sq,
            sq_sges,
            sq_inline,
            cursor,
            next_msn,
            peer_polls_seen,
            peer: peer_rank,
            ..
        } = qp;
        let peer = &self.peers[*peer_rank];
        let mut earlier_done = true;
        let mut i = 0;
        while i < sq.len() {
            let first_outstanding = earlier_done;
            let op = &mut sq[i];
            let sges = &sq_sges[op.sges.0 as usize..(op.sges.0 + op.sges.1) as usize];
            let inline = op
                .inline_at
                .map(|at| &sq_inline[at as usize..at as usize + op.total as usize]);
            match op.state {
                OpState::Done(_) => {}
                OpState::AwaitingResponse => {
                    if let Some(now) = clock.tick() {
                        if now.saturating_sub(op.since) > NUDGE_AFTER {
                            // The responder has not taken it: if its application is not
                            // polling and its driver sleeps, wake the driver.
                            let polls = peer.mem.app_polls();
                            if polls == *peer_polls_seen && !peer.mem.app_in_nic() {
                                peer.mem.wake_driver_if_asleep();
                            }
                            *peer_polls_seen = polls;
                        }
                        if now.saturating_sub(op.checked_alive) > LIVENESS_AFTER {
                            op.checked_alive = now;
                            if !peer.is_alive() {
                                op.state = OpState::Done(WcStatus::RetryExceeded);
                            }
                        }
                    }
                }
                OpState::Rnr { retry_at, fault } => {
                    let resolved = fault.map(|seq| peer.mem.npf_slot(remote_qpn).outcome(seq));
                    match resolved {
                        Some(Some(false)) => op.state = OpState::Done(WcStatus::RemoteAccessError),
                        Some(Some(true)) => op.state = OpState::Pending,
                        _ if clock.tick().is_some_and(|now| now >= retry_at) => {
                            if peer.is_alive() {
                                op.state = OpState::Pending;
                            } else {
                                op.state = OpState::Done(WcStatus::RetryExceeded);
                            }
                        }
                        _ => break,
                    }
                    if op.state != OpState::Pending {
                        earlier_done &= matches!(op.state, OpState::Done(_));
                        i += 1;
                        continue;
                    }
                    op.sent = 0;
                    continue;
                }
                OpState::Pending | OpState::Transmitting => {
                    if i < *cursor {
                        *cursor = i;
                    }
                    let direct =
                        peer.cma && !matches!(op.kind, OpKind::Send { .. }) && !op.data_placed;
                    if direct {
                        if !first_outstanding {
                            break; // fence: earlier requests must complete first
                        }
                        self.execute_direct(op, sges, inline, peer, remote_qpn, clock);
                        if matches!(op.state, OpState::Rnr { .. }) {
                            break;
                        }
                        if op.state == OpState::Pending {
                            continue; // data placed, immediate still to send
                        }
                    } else {
                        if op.msn.is_none() {
                            op.msn = Some(*next_msn);
                            *next_msn += 1;
                        }
                        if !self.transmit_packets(
                            op, sges, inline, *peer_rank, qpn, remote_qpn, peer.cma,
                        ) {
                            // Ring full: the peer must drain it. A peer that died never will
                            // (issue 15, item 6): its liveness is checked as for a request
                            // awaiting its response.
                            if op.state != OpState::Transmitting {
                                op.state = OpState::Transmitting;
                                op.checked_alive = clock.now();
                            } else if let Some(now) = clock.tick() {
                                if now.saturating_sub(op.checked_alive) > LIVENESS_AFTER {
                                    op.checked_alive = now;
                                    if !peer.is_alive() {
                                        op.state = OpState::Done(WcStatus::RetryExceeded);
                                    }
                                }
                            }
                            if op.state == OpState::Transmitting {
                                // If its application is not polling, only its driver
                                // thread can.
                                peer.mem.wake_driver_if_asleep();
                                break;
                            }
                        }
                        if !matches!(op.state, OpState::Done(_)) {
                            op.state = OpState::AwaitingResponse;
                            op.since = clock.now();
                            op.checked_alive = op.since;
                            if !peer.cma && !matches!(op.kind, OpKind::Send { .. }) {
                                // One-sided work for the peer's engine.
                                peer.mem.wake_driver_if_asleep();
                            }
                        }
                    }
                    *cursor = i + 1;
                }
            }
            earlier_done &= matches!(sq[i].state, OpState::Done(_));
            i += 1;
        }
    }

    /// RDMA WRITE or READ by one kernel copy, after the TPT check on the target.
    fn execute_direct(
        &self,
        op: &mut SendOp,
        sges: &[Sge],
        inline: Option<&[u8]>,
        peer: &Peer,
        remote_qpn: u32,
        clock: &mut CoarseClock,
    ) {
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
        let local = match inline {
            Some(data) => Ok((
                Held::new(),
                smallvec::smallvec![Extent {
                    addr: data.as_ptr() as u64,
                    len: data.len() as u64,
                }],
            )),
            None => self.local_extents(sges, need_local),
        };
        // The local holds last until the copy is done.
        let (_held, local) = match local {
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
            if peer.is_alive() {
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
        // Claimed in this rank's segment, so the target tells this hold from a dead one's.
        let claim = (self.own.remote_claim(), claim_tag(peer.rank, rkey));
        let guard = match peer
            .mem
            .tpt()
            .acquire_claimed(rkey, raddr, op.total, need, claim)
        {
            Ok(g) => g,
            Err(_) => {
                op.state = OpState::Done(WcStatus::RemoteAccessError);
                return;
            }
        };
        let remote = Extent {
            addr: guard.translation.dma_addr(raddr),
            len: op.total,
        };
        if guard.translation.detached() {
            self.counters.detached_bytes.fetch_add(op.total, Relaxed);
        }
        if guard.translation.on_demand() {
            if let Some(span) = self.missing_span(peer, remote) {
                // rNPF: the target's NIC answers receiver-not-ready while its driver thread
                // maps the pages; we retry when it says the fault is resolved.
                let range = fault_extent(span);
                let seq = peer
                    .mem
                    .npf_slot(remote_qpn)
                    .file(range.addr, range.len, write);
                peer.mem.wake_driver_if_asleep();
                op.rnr_count += 1;
                self.counters.rnr_retries.fetch_add(1, Relaxed);
                op.state = OpState::Rnr {
                    retry_at: clock.fresh() + FAULT_RECHECK,
                    fault: Some(seq),
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

    /// Sends the packets of a request from where it stopped; false when the ring filled up
    /// first. A local protection error ends the request (`Done`) and returns true.
    #[allow(clippy::too_many_arguments)]
    fn transmit_packets(
        &self,
        op: &mut SendOp,
        sges: &[Sge],
        inline: Option<&[u8]>,
        peer: usize,
        qpn: u32,
        remote_qpn: u32,
        cma: bool,
    ) -> bool {
        // The local holds last until this call returns: every packet it sends is read under
        // them.
        let (_held, local) = if inline.is_some() || op.data_placed {
            (Held::new(), SmallVec::new())
        } else {
            let need = if matches!(op.kind, OpKind::Read { .. }) {
                Access::LOCAL_WRITE
            } else {
                Access::NONE
            };
            match self.local_extents(sges, need) {
                Ok(l) => l,
                Err(s) => {
                    op.state = OpState::Done(s);
                    return true;
                }
            }
        };
        let base = Header {
            dst_qpn: remote_qpn,
            src_qpn: qpn,
            msn: op.msn.expect("assigned before transmission"),
            total_len: op.total,
            ..Header::default()
        };
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
            OpKind::Write { imm, addr, rkey } if op.data_placed => {
                // The bytes are in place; the responder checks the key once more before it
                // reports them (a peer cannot claim a WRITE it had no right to make).
                let h = Header {
                    kind: Kind::WriteImm as u8,
                    flags: FIRST | LAST | HAS_IMM | CMA_DESCRIPTOR,
                    imm: imm.unwrap_or(0),
                    remote_addr: addr,
                    rkey,
                    ..base
                };
                self.push_packet(peer, &h, |_| Ok(()))
            }
            OpKind::Send { imm } if cma && inline.is_none() && op.total >= SEND_CMA_MIN => {
                // The receiver pulls the payload from our memory with one kernel copy.
                let mut desc: SmallVec<[u8; 64]> = SmallVec::with_capacity(local.len() * 16);
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
                    let mut faulted = false;
                    let pushed = self.push_packet(peer, &h, |s| {
                        let r = match inline {
                            Some(d) => {
                                s.write_payload(&d[offset as usize..(offset + chunk) as usize]);
                                Ok(())
                            }
                            None => dma::gather(s.payload_addr(), &local, offset, chunk),
                        };
                        faulted = r.is_err();
                        r
                    });
                    if faulted {
                        op.state = OpState::Done(WcStatus::LocalProtectionError);
                        return true;
                    }
                    if !pushed {
                        return false;
                    }
                    if inline.is_none() {
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

    /// Pushes one packet to `peer`, filling its payload with `fill`; false if the ring is
    /// full. If `fill` fails (the source is not mapped), the header goes out with a local
    /// protection error code so that the receiver drops the message it belongs to.
    pub(super) fn push_packet(
        &self,
        peer: usize,
        h: &Header,
        fill: impl FnOnce(&Slot<'_>) -> std::io::Result<()>,
    ) -> bool {
        let mem = &self.peers[peer].mem;
        let ring = mem.ring_from(self.rank);
        let Some(slot) = ring.reserve() else {
            return false;
        };
        if fill(&slot).is_err() {
            let mut bad = *h;
            bad.code = WcStatus::LocalProtectionError.code();
            bad.payload_len = 0;
            ring.publish(slot, &bad);
        } else {
            ring.publish(slot, h);
        }
        crate::nic::soft::inbox::announce(&ring, mem.pending(), self.rank);
        true
    }

    /// Checks a local scatter-gather list against this NIC's table and resolves requester
    /// network page faults on its ODP parts in one batch. Returns the extents, and the holds
    /// that keep their regions registered while the caller moves their bytes.
    pub(super) fn local_extents(
        &self,
        sgl: &[Sge],
        need: Access,
    ) -> Result<(Held<'_>, SmallVec<[Extent; 2]>), WcStatus> {
        let tpt = self.own.tpt();
        let (mut held, mut out) = (Held::new(), SmallVec::new());
        for s in sgl {
            if s.len == 0 {
                continue;
            }
            let guard = tpt
                .acquire(s.lkey, s.addr, s.len as u64, need)
                .map_err(|_| WcStatus::LocalProtectionError)?;
            let e = Extent {
                addr: guard.translation.dma_addr(s.addr),
                len: s.len as u64,
            };
            if guard.translation.detached() {
                self.counters.detached_bytes.fetch_add(e.len, Relaxed);
            }
            if guard.translation.on_demand() {
                if let Some(span) = self.missing_span(&self.peers[self.rank], e) {
                    let range = fault_extent(span);
                    let t0 = sys::monotonic_ns();
                    if !self.resolve_fault(
                        range.addr,
                        range.len,
                        need.contains(Access::LOCAL_WRITE),
                    ) {
                        return Err(WcStatus::LocalProtectionError);
                    }
                    let os_ns = sys::monotonic_ns() - t0;
                    let model_ns = self.profile.charge_npf_hardware();
                    self.counters.record_npf(
                        true,
                        range.len / PAGE_SIZE,
                        NpfTiming {
                            total_ns: sys::monotonic_ns() - t0,
                            wait_ns: 0,
                            os_ns,
                            model_ns,
                        },
                    );
                }
            }
            out.push(e);
            held.push(guard);
        }
        Ok((held, out))
    }

    /// The first and last page of `e` (in `owner`'s address space) that the NIC may not
    /// use: not present in its bitmap, or — where the owner has no memory monitor keeping
    /// the bits true — present there but no longer mapped in the owner's page tables (which
    /// clears their bit).
    pub(super) fn missing_span(&self, owner: &Peer, e: Extent) -> Option<(u64, u64)> {
        let bits = owner.mem.present();
        let missing = bits.missing_span(e.addr, e.len);
        if owner.mem.odp_monitored() {
            return missing;
        }
        let Some(pm) = &owner.pagemap else {
            return missing;
        };
        let pages = sys::page_span(e.addr, e.len).1 / PAGE_SIZE;
        let mut mapped = Vec::with_capacity(pages as usize);
        if sys::pages_mapped(pm, e.addr, e.len, &mut mapped).is_err() {
            return missing;
        }
        let first = e.addr / PAGE_SIZE;
        let mut span = missing;
        for (i, m) in mapped.iter().enumerate() {
            let page = first + i as u64;
            if !m && bits.clear_page(page) {
                self.counters.invalidated_pages.fetch_add(1, Relaxed);
                span = Some(match span {
                    Some((a, b)) => (a.min(page), b.max(page)),
                    None => (page, page),
                });
            }
        }
        span
    }

    /// Delivers completions of finished requests at the front of the send queue, in order;
    /// an error puts the queue pair in the error state and flushes the rest.
    pub(super) fn complete_front(&self, eng: &mut Engine, qpn: u32) {
        loop {
            let Some(qp) = eng.qps[qpn as usize].as_mut() else {
                return;
            };
            let Some(&SendOp {
                state: OpState::Done(status),
                kind,
                wr_id,
                total,
                signaled,
                ..
            }) = qp.sq.front()
            else {
                return;
            };
            qp.sq.pop_front();
            if qp.sq.is_empty() {
                qp.sq_sges.clear();
                qp.sq_inline.clear();
            }
            qp.cursor = qp.cursor.saturating_sub(1);
            let opcode = match kind {
                OpKind::Send { .. } => WcOpcode::Send,
                OpKind::Write { .. } => WcOpcode::RdmaWrite,
                OpKind::Read { .. } => WcOpcode::RdmaRead,
            };
            let len = if opcode == WcOpcode::RdmaRead {
                total as u32
            } else {
                0
            };
            let send_cq = qp.send_cq;
            if status != WcStatus::Success || signaled {
                if status != WcStatus::Success {
                    self.counters.error_completions.fetch_add(1, Relaxed);
                }
                eng.push_completion(send_cq, completion(wr_id, status, opcode, len, None, qpn));
            }
            if status != WcStatus::Success {
                let flushed =
                    eng.enter_error(qpn, format!("work request {wr_id} ended with {status}"));
                self.counters.error_completions.fetch_add(flushed, Relaxed);
            }
        }
    }
}
