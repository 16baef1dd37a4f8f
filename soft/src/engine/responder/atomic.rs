//! Atomics (`FETCH_ADD`, `CMP_SWAP`): the requester sends one request packet; the
//! responder's engine, which is the target's NIC, runs the operation on the word with a
//! locked instruction once, when it accepts the request in message-sequence order (so a
//! retransmitted copy is never run again), keeps the old value until the response goes
//! out, and the requester places it in its 8-byte scatter-gather entry.
//!
//! A locked instruction on the target's own memory makes the soft NIC's atomics atomic with
//! respect to each other and to the target's CPU (`IBV_ATOMIC_GLOB`), and they need no
//! action from the target's application: when it does not poll, its driver thread runs them.
//! They always take the staged path, also to a peer reachable by CMA: the kernel's copy
//! between address spaces is not atomic.

use crate::dma;
use crate::engine::staged::SettleLink;
use crate::engine::{AtomicOut, Engine, KeyedExtent, OpState, QueuePair};
use crate::ring::{Header, Kind, Payload, FIRST, LAST};
use crate::Inner;
use pagewire_nic::{Access, WcStatus};

use crate::engine::queue_pair::AtomicOp;

impl Inner {
    /// The responder runs an accepted atomic request on `target` (checked against the table
    /// by the caller) and queues its result.
    pub(in crate::engine) fn execute_atomic(
        &self,
        qp: &mut QueuePair,
        h: &Header,
        payload: Payload<'_>,
        target: KeyedExtent,
    ) {
        let mut operands = [0u8; 16];
        payload.read(&mut operands);
        let word = |i: usize| u64::from_le_bytes(operands[i * 8..i * 8 + 8].try_into().expect("8"));
        let op = AtomicOp::decode(h.imm, [word(0), word(1)]);
        // Checked again under a hold, as every access is: a region deregistered meanwhile
        // makes it a remote access error.
        let result = self
            .hold_own(std::slice::from_ref(&target), 0, 8, Access::REMOTE_ATOMIC)
            .map_err(|_| WcStatus::RemoteAccessError)
            .and_then(|(_held, at)| {
                op.execute(at[0].addr)
                    .map_err(|_| WcStatus::RemoteAccessError)
            });
        let (code, old) = match result {
            Ok(old) => (0, old),
            Err(status) => (status.code(), 0),
        };
        qp.responder.atomics_out.push_back(AtomicOut {
            msn: h.msn,
            dst_qpn: h.src_qpn,
            code,
            old,
        });
    }

    /// Sends the results of executed atomics as ring space allows.
    pub(in crate::engine) fn send_atomic_responses(&self, eng: &mut Engine, qpn: u32) {
        let Some(qp) = eng.qps[qpn as usize].as_mut() else {
            return;
        };
        if qp.responder.atomics_out.is_empty() {
            return;
        }
        let peer = qp.peer;
        let _settle = SettleLink::new(self, peer);
        while let Some(&a) = qp.responder.atomics_out.front() {
            let h = Header {
                kind: Kind::AtomicResponse as u8,
                flags: FIRST | LAST,
                code: a.code,
                dst_qpn: a.dst_qpn,
                src_qpn: qpn,
                msn: a.msn,
                total_len: 8,
                payload_len: if a.code == 0 { 8 } else { 0 },
                ..Header::default()
            };
            let pushed = self.push_packet(peer, &h, |s| {
                if a.code == 0 {
                    s.write_payload(&a.old.to_le_bytes());
                }
                Ok(())
            });
            if !pushed {
                // Ring full: the requester drains it when it polls, or its driver.
                self.peers[peer].mem.wake_driver_if_asleep();
                return;
            }
            qp.responder.atomics_out.pop_front();
        }
    }

    /// The requester's side: the old value of its atomic, into its scatter-gather entry.
    pub(in crate::engine) fn handle_atomic_response(
        &self,
        eng: &mut Engine,
        h: &Header,
        payload: Payload<'_>,
    ) {
        let Ok(qp) = eng.qp_mut(h.dst_qpn) else {
            return;
        };
        let Some((op, sges)) = qp.requester.successful_response(h.msn, h.code) else {
            return;
        };
        let mut old = [0u8; 8];
        payload.read(&mut old);
        let sge = KeyedExtent::from(&sges[0]);
        let placed = self
            .hold_own(std::slice::from_ref(&sge), 0, 8, Access::LOCAL_WRITE)
            .map_err(|_| ())
            .and_then(|(_held, dst)| {
                dma::copy(dst[0].addr, old.as_ptr() as u64, 8).map_err(|_| ())
            });
        op.sent = 8;
        op.state = OpState::Done(match placed {
            Ok(()) => WcStatus::Success,
            Err(()) => WcStatus::LocalProtectionError,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_round_trip_through_their_wire_form() {
        for op in [
            AtomicOp::FetchAdd { add: u64::MAX },
            AtomicOp::CmpSwap {
                compare: 7,
                swap: 1 << 63,
            },
        ] {
            let (code, operands) = op.encode();
            assert_eq!(AtomicOp::decode(code, operands), op);
        }
    }

    #[test]
    fn execution_changes_only_the_word() {
        let mut words = [10u64, 20, 30];
        let at = words.as_mut_ptr() as u64 + 8;
        assert_eq!(AtomicOp::FetchAdd { add: 5 }.execute(at).unwrap(), 20);
        let cas = AtomicOp::CmpSwap {
            compare: 25,
            swap: 99,
        };
        assert_eq!(cas.execute(at).unwrap(), 25);
        assert_eq!(cas.execute(at).unwrap(), 99, "compare fails: unchanged");
        assert_eq!(words, [10, 99, 30]);
    }
}
