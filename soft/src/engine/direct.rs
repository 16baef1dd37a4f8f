//! RDMA WRITE and READ to a CMA-capable peer, executed by the requester's engine with one
//! kernel copy after the check on the target's TPT; a target page that is not present is a
//! responder network page fault, filed with the target's driver thread.

use std::sync::atomic::Ordering::Relaxed;

use super::requester::FAULT_RECHECK;
use super::responder::cache_miss::dropped;
use super::translate::Untranslated;
use super::NUDGE_AFTER;
use super::{fault_extent, CoarseClock, Held, OpKind, OpState, SendOp};
use crate::receive_fault::ReceiveFaultPolicy;
use crate::tpt::claim_tag;
use crate::{Inner, Peer};
use pagewire_nic::{Access, DataPath, Sge, WcStatus};
use pagewire_sys::{self as sys, CmaDirection, Extent};

impl Inner {
    /// RDMA WRITE or READ by one kernel copy, after the TPT check on the target (through
    /// the translation caches, if the NICs have them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn execute_direct(
        &self,
        op: &mut SendOp,
        sges: &[Sge],
        inline: Option<&[u8]>,
        peer: &Peer,
        qpn: u32,
        remote_qpn: u32,
        clock: &mut CoarseClock,
    ) {
        let (raddr, rkey, write) = match op.kind {
            OpKind::Write { addr, rkey, .. } => (addr, rkey, true),
            OpKind::Read { addr, rkey } => (addr, rkey, false),
            OpKind::Send { .. } | OpKind::Atomic { .. } => {
                unreachable!("sends and atomics are packets")
            }
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
            None => self.local_extents(sges, need_local, qpn, &mut op.translated),
        };
        // The local holds last until the copy is done.
        let (_held, local) = match local {
            Ok(l) => l,
            Err(Untranslated::Refused(s)) => {
                op.state = OpState::Done(s);
                return;
            }
            Err(Untranslated::Missed(wait)) => {
                op.state = dropped(wait, 0);
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
        // The target NIC's translation cache: a miss drops the request (Azimi03).
        if let Err(wait) = self.translate_remote(peer, remote_qpn, rkey, &mut op.translated) {
            op.state = dropped(wait, clock.fresh() + NUDGE_AFTER);
            return;
        }
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
                if write && self.receive_fault.policy == ReceiveFaultPolicy::Drop {
                    // Under `drop` the target discards it without a word: it goes out again
                    // when the retransmission timer fires (`receive_fault.rs`).
                    self.counters.receive_fault.dropped.fetch_add(1, Relaxed);
                    let after = self.receive_fault.retransmit_after_ns().expect("drop");
                    op.state = OpState::Rnr {
                        retry_at: clock.fresh() + after,
                        fault: None,
                    };
                    return;
                }
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
}
