//! The requester side of a queue pair: posting, reading acknowledgements, the send queue's
//! pass (timers, and each request handed to RDMA by CMA, [`super::direct`], or to the
//! staged path, [`super::staged`]), and completing requests in order.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::responder::cache_miss::dropped;
use super::{
    completion, nanos, total_len, AtomicOp, Engine, MissWait, OpKind, OpState, SendOp,
    MAX_MSG_BYTES, NUDGE_AFTER,
};
use crate::ack::Nak;
use crate::dma;
use crate::Inner;
use pagewire_nic::{Opcode, SendWr, Sge, WcOpcode, WcStatus, ATOMIC_BYTES};
use pagewire_sys::error::{Error, Result};

/// How long a request may wait on a peer before its liveness is checked (ns).
const LIVENESS_AFTER: u64 = nanos(Duration::from_millis(5));
/// Times a request goes out again after its retransmission timer fired before it fails
/// with a retry-exceeded completion (IB's `retry_cnt` at its maximum, 7).
const TRANSPORT_RETRIES: u32 = 7;
/// Fallback retry time when a filed fault is not answered, the owner may be gone (ns).
pub(super) const FAULT_RECHECK: u64 = nanos(Duration::from_millis(100));

/// The requester's half of a queue pair: its send queue, processed strictly in order, and
/// what it has read of the responder's acknowledgements. Only this module touches it; the
/// rest of the engine asks ([`Requester::is_idle`], [`Requester::successful_response`]).
#[derive(Default)]
pub(super) struct Requester {
    sq: VecDeque<SendOp>,
    /// The scatter-gather entries of the requests in `sq` (`SendOp::sges` indexes it);
    /// emptied whenever `sq` is.
    sq_sges: Vec<Sge>,
    /// The payloads of inline requests in `sq`, copied at post time; emptied with `sq`.
    sq_inline: Vec<u8>,
    /// Index in `sq` of the first request not completely transmitted.
    cursor: usize,
    next_msn: u64,
    /// The responder's cumulative acknowledgement as last read.
    acked: u64,
    /// The serial of the last NAK handled.
    nak_seen: u64,
    /// The peer application's poll count when this queue pair last looked (see `transmit`).
    peer_polls_seen: u64,
}

impl Requester {
    /// Whether no request is in the send queue.
    pub(super) fn is_idle(&self) -> bool {
        self.sq.is_empty()
    }

    /// The queue pair entered the error state: every request not yet completed completes
    /// flushed.
    pub(super) fn flush(&mut self) {
        for op in self.sq.iter_mut() {
            if !matches!(op.state, OpState::Done(_)) {
                op.state = OpState::Done(WcStatus::WrFlushError);
            }
        }
    }

    /// The request of sequence number `msn` if it waits for its response (a staged READ's
    /// data, an atomic's old value), with its scatter-gather entries, when the response
    /// (status `code`) carries data; a response with an error status completes the request
    /// with it instead (`None`).
    pub(super) fn successful_response(
        &mut self,
        msn: u64,
        code: u16,
    ) -> Option<(&mut SendOp, &[Sge])> {
        let op = self.sq.iter_mut().find(|o| o.msn == Some(msn))?;
        if op.state != OpState::AwaitingResponse {
            return None;
        }
        if code != 0 {
            op.state = OpState::Done(WcStatus::from_code(code));
            return None;
        }
        let sges = &self.sq_sges[op.sges.0 as usize..(op.sges.0 + op.sges.1) as usize];
        Some((op, sges))
    }
}

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
        if qp.requester.sq.len() >= qp.caps.max_send_wr as usize {
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
            Opcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => OpKind::Atomic {
                addr: remote_addr,
                rkey,
                op: AtomicOp::FetchAdd { add },
            },
            Opcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => OpKind::Atomic {
                addr: remote_addr,
                rkey,
                op: AtomicOp::CmpSwap { compare, swap },
            },
        };
        if matches!(kind, OpKind::Atomic { .. })
            && (wr.inline || wr.sgl.len() != 1 || total != ATOMIC_BYTES as u64)
        {
            return Err(Error::InvalidArgument(format!(
                "an atomic work request needs one scatter-gather entry of {ATOMIC_BYTES} bytes                  for the old value, not inline; this one has {} entries, {total} bytes{}",
                wr.sgl.len(),
                if wr.inline { ", inline" } else { "" }
            )));
        }
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
            let at = qp.requester.sq_inline.len();
            qp.requester.sq_inline.resize(at + total as usize, 0);
            let mut dst = qp.requester.sq_inline[at..].as_mut_ptr() as u64;
            for s in wr.sgl {
                if dma::copy(dst, s.addr, s.len as u64).is_err() {
                    state = OpState::Done(WcStatus::LocalProtectionError);
                    break;
                }
                dst += s.len as u64;
            }
            pagewire_nic::counters::add_serialized(&self.counters.bytes_inline, total);
            Some(at as u32)
        } else {
            None
        };
        let sges = (qp.requester.sq_sges.len() as u32, wr.sgl.len() as u32);
        qp.requester.sq_sges.extend_from_slice(wr.sgl);
        qp.requester.sq.push_back(SendOp {
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
            timeouts: 0,
            translated: 0,
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
        if qp.error.is_some() || qp.requester.sq.is_empty() {
            return;
        }
        let line = self.own.ack_line(qpn);
        let acked = line.acked();
        if acked != qp.requester.acked {
            qp.requester.acked = acked;
            // Progress restarts the retransmission timer of what is still outstanding (as
            // an HCA's timer runs from the last acknowledgement).
            let now = self
                .receive_fault
                .retransmit_after_ns()
                .map(|_| clock.now());
            for op in qp.requester.sq.iter_mut() {
                let accepted = op.msn.is_some_and(|m| m < acked);
                // A request the retransmission timer sent back (Pending, Transmitting) may
                // have been accepted the first time meanwhile: the responder ignores the
                // copy and acknowledges nothing more, so it completes here. (After an RNR
                // go-back nothing behind the refused request has been accepted.)
                if !matches!(
                    op.state,
                    OpState::AwaitingResponse | OpState::Pending | OpState::Transmitting
                ) {
                    continue;
                }
                // READs and atomics complete with their response, not the acknowledgement.
                if accepted && !matches!(op.kind, OpKind::Read { .. } | OpKind::Atomic { .. }) {
                    op.state = OpState::Done(WcStatus::Success);
                } else if let (Some(now), OpState::AwaitingResponse) = (now, op.state) {
                    op.since = now;
                }
            }
        }
        let Some((serial, msn, why)) = line.nak_since(qp.requester.nak_seen) else {
            return;
        };
        qp.requester.nak_seen = serial;
        let Some(idx) = qp.requester.sq.iter().position(|o| o.msn == Some(msn)) else {
            return;
        };
        let (timer, limit) = (qp.caps.rnr_timer_us, qp.caps.rnr_retry);
        let op = &mut qp.requester.sq[idx];
        if !matches!(op.state, OpState::AwaitingResponse | OpState::Transmitting) {
            return;
        }
        op.state = match why {
            Nak::Error(code) => {
                op.state = OpState::Done(WcStatus::from_code(code));
                return;
            }
            // Dropped by a translation-cache miss at the target: retransmitted when the
            // retransmission timer fires.
            Nak::TranslationMiss => dropped(MissWait::Dropped, clock.fresh() + NUDGE_AFTER),
            Nak::Rnr { fault } => {
                op.rnr_count += 1;
                self.counters.rnr_retries.fetch_add(1, Relaxed);
                if limit != 7 && op.rnr_count > limit as u32 {
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
                }
            }
        };
        // Go back: everything after the refused request is retransmitted after it.
        for later in qp.requester.sq.iter_mut().skip(idx + 1) {
            if matches!(
                later.state,
                OpState::AwaitingResponse | OpState::Transmitting
            ) {
                later.state = OpState::Pending;
                later.sent = 0;
            }
        }
        qp.requester.cursor = qp.requester.cursor.min(idx);
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
        let peer_rank = &qp.peer;
        let Requester {
            sq,
            sq_sges,
            sq_inline,
            cursor,
            next_msn,
            peer_polls_seen,
            ..
        } = &mut qp.requester;
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
                    // The retransmission timer, under the receive-fault policies whose
                    // NICs discard requests (`drop`, `backup` when its ring is full): it
                    // runs for the oldest request not yet acknowledged, and the go-back
                    // starts from it.
                    let timed_out = first_outstanding
                        && self
                            .receive_fault
                            .retransmit_after_ns()
                            .is_some_and(|after| clock.now().saturating_sub(op.since) > after);
                    if timed_out && op.msn.is_some() {
                        op.timeouts += 1;
                        self.counters
                            .receive_fault
                            .timeout_retransmits
                            .fetch_add(1, Relaxed);
                        if op.timeouts > TRANSPORT_RETRIES {
                            op.state = OpState::Done(WcStatus::RetryExceeded);
                        } else {
                            // Go back to it: it and everything after it go out again.
                            for later in sq.iter_mut().skip(i) {
                                if matches!(
                                    later.state,
                                    OpState::AwaitingResponse | OpState::Transmitting
                                ) {
                                    later.state = OpState::Pending;
                                    later.sent = 0;
                                }
                            }
                            *cursor = (*cursor).min(i);
                            continue;
                        }
                    }
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
                OpState::Rnr { .. } | OpState::TranslationMiss { .. } => {
                    if let OpState::Rnr { retry_at, fault } = op.state {
                        let resolved = fault.map(|seq| peer.mem.npf_slot(remote_qpn).outcome(seq));
                        op.state = match resolved {
                            Some(Some(false)) => OpState::Done(WcStatus::RemoteAccessError),
                            Some(Some(true)) => OpState::Pending,
                            _ if clock.tick().is_some_and(|now| now >= retry_at) => {
                                if peer.is_alive() {
                                    OpState::Pending
                                } else {
                                    OpState::Done(WcStatus::RetryExceeded)
                                }
                            }
                            _ => break,
                        };
                    } else if !self.after_miss(op, peer, qpn, remote_qpn, clock) {
                        break; // go-back-N: nothing after it goes out before it
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
                    // Atomics always go to the peer's engine (a kernel copy is not atomic).
                    let direct = peer.cma
                        && !matches!(op.kind, OpKind::Send { .. } | OpKind::Atomic { .. })
                        && !op.data_placed;
                    if direct {
                        if !first_outstanding {
                            break; // fence: earlier requests must complete first
                        }
                        self.execute_direct(op, sges, inline, peer, qpn, remote_qpn, clock);
                        if matches!(
                            op.state,
                            OpState::Rnr { .. } | OpState::TranslationMiss { .. }
                        ) {
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
                            // Ring full: the peer must drain it. A peer that died never will:
                            // its liveness is checked as for a request
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
                        if matches!(op.state, OpState::TranslationMiss { .. }) {
                            break; // nothing went out; it waits for its own driver's fill
                        }
                        if !matches!(op.state, OpState::Done(_)) {
                            op.state = OpState::AwaitingResponse;
                            // A running retransmission timer starts from the true time.
                            op.since = match self.receive_fault.retransmit_after_ns() {
                                Some(_) => clock.fresh(),
                                None => clock.now(),
                            };
                            op.checked_alive = op.since;
                            let one_sided = !matches!(op.kind, OpKind::Send { .. });
                            if one_sided && (!peer.cma || matches!(op.kind, OpKind::Atomic { .. }))
                            {
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
            }) = qp.requester.sq.front()
            else {
                return;
            };
            qp.requester.sq.pop_front();
            if qp.requester.sq.is_empty() {
                qp.requester.sq_sges.clear();
                qp.requester.sq_inline.clear();
            }
            qp.requester.cursor = qp.requester.cursor.saturating_sub(1);
            let opcode = match kind {
                OpKind::Send { .. } => WcOpcode::Send,
                OpKind::Write { .. } => WcOpcode::RdmaWrite,
                OpKind::Read { .. } => WcOpcode::RdmaRead,
                OpKind::Atomic {
                    op: AtomicOp::FetchAdd { .. },
                    ..
                } => WcOpcode::FetchAdd,
                OpKind::Atomic {
                    op: AtomicOp::CmpSwap { .. },
                    ..
                } => WcOpcode::CompSwap,
            };
            let len = match opcode {
                WcOpcode::RdmaRead | WcOpcode::FetchAdd | WcOpcode::CompSwap => total as u32,
                _ => 0,
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
