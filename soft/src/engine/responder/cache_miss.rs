//! The engine's side of the bounded translation cache (`tpt_cache.rs`,
//! Azimi03): looking a request's keys up in the caches, the
//! drop that a miss causes and the filed miss, and when the dropped request goes out again.
//! With the cache off every lookup is one load that finds it off.

use crate::engine::NUDGE_AFTER;
use crate::engine::{CoarseClock, MissWait, OpState, QueuePair, SendOp};
use crate::layout::RankMemory;
use crate::tpt_cache::MissSide;
use crate::{Inner, Peer};
use pagewire_nic::WcStatus;
use pagewire_sys as sys;

/// The state of a request a miss has just dropped.
pub(in crate::engine) fn dropped(wait: MissWait, retry_at: u64) -> OpState {
    OpState::TranslationMiss {
        retry_at,
        since_ns: sys::monotonic_ns(),
        wait,
    }
}

/// `key` (a request's entry `bit`) through the cache of the rank owning `mem`, unless the
/// request translated it already; a miss is filed in that rank's `side` slot of `qpn` and
/// its driver woken, and its sequence number returned.
fn through_cache(
    mem: &RankMemory,
    qpn: u32,
    side: MissSide,
    key: u32,
    bit: u32,
    translated: &mut u32,
) -> Result<(), u64> {
    if *translated & bit != 0 || mem.tpt_cache().lookup(key) {
        *translated |= bit;
        return Ok(());
    }
    let seq = mem.miss_slot(qpn, side).file(key as u64, 0, false);
    mem.wake_driver_if_asleep();
    Err(seq)
}

impl Inner {
    /// Requester: `key` (the request's entry `bit`) through this NIC's own cache, unless the
    /// request translated it already. A miss is filed for the driver, which is woken.
    pub(in crate::engine) fn translate_local(
        &self,
        qpn: u32,
        key: u32,
        bit: u32,
        translated: &mut u32,
    ) -> Result<(), MissWait> {
        through_cache(&self.own, qpn, MissSide::Requester, key, bit, translated)
            .map_err(|seq| MissWait::Local { seq, bit })
    }

    /// The target's key `rkey` through the target's cache, this engine playing the target
    /// NIC's part (the CMA path). A miss is filed in the target's responder slot of
    /// `remote_qpn` and its driver woken.
    pub(in crate::engine) fn translate_remote(
        &self,
        peer: &Peer,
        remote_qpn: u32,
        rkey: u32,
        translated: &mut u32,
    ) -> Result<(), MissWait> {
        let bit = crate::engine::REMOTE_KEY;
        through_cache(
            &peer.mem,
            remote_qpn,
            MissSide::Responder,
            rkey,
            bit,
            translated,
        )
        .map_err(|seq| MissWait::Remote { seq, bit })
    }

    /// A request waiting after a miss: false while it must wait on; true once its state
    /// changed (to `Pending`, to go out again, or to an error for a peer that died). The time
    /// it waited is counted as stall.
    pub(in crate::engine) fn after_miss(
        &self,
        op: &mut SendOp,
        peer: &Peer,
        qpn: u32,
        remote_qpn: u32,
        clock: &mut CoarseClock,
    ) -> bool {
        let OpState::TranslationMiss {
            retry_at,
            since_ns,
            wait,
        } = op.state
        else {
            return true;
        };
        match wait {
            MissWait::Local { seq, bit } => {
                let slot = self.own.miss_slot(qpn, MissSide::Requester);
                if slot.outcome(seq).is_none() {
                    return false;
                }
                op.translated |= bit;
            }
            MissWait::Remote { .. } | MissWait::Dropped => {
                let Some(now) = clock.tick().filter(|&now| now >= retry_at) else {
                    return false;
                };
                if !peer.is_alive() {
                    op.state = OpState::Done(WcStatus::RetryExceeded);
                    return true;
                }
                if let MissWait::Remote { seq, bit } = wait {
                    let slot = peer.mem.miss_slot(remote_qpn, MissSide::Responder);
                    if slot.outcome(seq).is_none() {
                        // The retransmission finds the entry still being filled: dropped
                        // again, and the timer starts over.
                        op.state = OpState::TranslationMiss {
                            retry_at: now + NUDGE_AFTER,
                            since_ns,
                            wait,
                        };
                        return false;
                    }
                    op.translated |= bit;
                }
            }
        }
        self.counters
            .tpt_cache
            .add_stall(sys::monotonic_ns().saturating_sub(since_ns));
        op.state = OpState::Pending;
        true
    }

    /// Responder (the staged path): the keys of request `msn` — `(bit, key)` each — through
    /// this NIC's cache. False when the request is to be dropped: a key missed (filed for
    /// the driver, which is woken) or the miss filed for its earlier transmission is still
    /// being filled. Each key is looked up once per request, and the one a fill was made for
    /// is taken as translated when the retransmission comes.
    pub(in crate::engine) fn translate_incoming(
        &self,
        qp: &mut QueuePair,
        msn: u64,
        keys: &[(u32, u32)],
    ) -> bool {
        let mut mask = match qp.responder.rx_translated {
            Some((m, mask)) if m == msn => mask,
            _ => 0,
        };
        let slot = self.own.miss_slot(qp.qpn, MissSide::Responder);
        if let Some((m, seq, bit)) = qp.responder.rx_miss.take() {
            if m == msn {
                if slot.outcome(seq).is_none() {
                    qp.responder.rx_miss = Some((m, seq, bit));
                    return false;
                }
                mask |= bit;
            }
        }
        let cache = self.own.tpt_cache();
        for &(bit, key) in keys {
            if mask & bit != 0 || cache.lookup(key) {
                mask |= bit;
                continue;
            }
            let seq = slot.file(key as u64, 0, false);
            self.own.wake_driver_if_asleep();
            qp.responder.rx_miss = Some((msn, seq, bit));
            qp.responder.rx_translated = Some((msn, mask));
            return false;
        }
        qp.responder.rx_translated = Some((msn, mask));
        true
    }
}
