//! Counters of the soft NIC's receive-fault policies
//! (`PAGEWIRE_SOFT_RNPF`, `soft/src/receive_fault.rs`): requests dropped on a receive-side
//! network page fault, messages parked in the backup ring, and the retransmissions the
//! requester's timer made. After Lesokhin17 §4-5 (RNR NACK, drop,
//! backup ring) and Fig. 10.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The live counters: each field is the live value of the [`ReceiveFaultCounters`] field of
/// the same name.
#[allow(missing_docs)]
#[derive(Debug, Default)]
pub struct LiveReceiveFaultCounters {
    pub dropped: AtomicU64,
    pub backup_full: AtomicU64,
    pub backed_up: AtomicU64,
    pub backup_bytes: AtomicU64,
    pub backup_held_ns: AtomicU64,
    pub timeout_retransmits: AtomicU64,
}

impl LiveReceiveFaultCounters {
    /// The counters now.
    pub fn snapshot(&self) -> ReceiveFaultCounters {
        ReceiveFaultCounters {
            dropped: self.dropped.load(Relaxed),
            backup_full: self.backup_full.load(Relaxed),
            backed_up: self.backed_up.load(Relaxed),
            backup_bytes: self.backup_bytes.load(Relaxed),
            backup_held_ns: self.backup_held_ns.load(Relaxed),
            timeout_retransmits: self.timeout_retransmits.load(Relaxed),
        }
    }
}

/// The receive-fault policy's counters at one moment (all zero under the default `rnr`
/// policy, whose NACKs are `rnr_nacks_sent` and `rnr_retries`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiveFaultCounters {
    /// Requests this NIC discarded on a receive-side fault, silently (policy `drop`, or
    /// `backup` with its ring full): the requester retransmits when its timer fires. Counted
    /// by the engine that played the receiving NIC (on the CMA path, an RDMA WRITE's
    /// initiator).
    pub dropped: u64,
    /// Of `dropped`: those the backup ring had no room for.
    pub backup_full: u64,
    /// Messages stored in the backup ring on a receive-side fault and copied into place once
    /// it was resolved (policy `backup`).
    pub backed_up: u64,
    /// Their bytes.
    pub backup_bytes: u64,
    /// Time those messages spent in the backup ring, in nanoseconds (fault resolution and
    /// waiting for earlier ones).
    pub backup_held_ns: u64,
    /// Requests this rank's requester sent again because no acknowledgement came within
    /// the retransmission timeout (`PAGEWIRE_SOFT_ACK_TIMEOUT`).
    pub timeout_retransmits: u64,
}

impl ReceiveFaultCounters {
    /// Words of [`ReceiveFaultCounters::to_words`].
    pub const WORDS: usize = 6;

    /// The counters in field order.
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        [
            self.dropped,
            self.backup_full,
            self.backed_up,
            self.backup_bytes,
            self.backup_held_ns,
            self.timeout_retransmits,
        ]
    }

    /// The inverse of [`ReceiveFaultCounters::to_words`].
    pub fn from_words(w: &[u64; Self::WORDS]) -> ReceiveFaultCounters {
        ReceiveFaultCounters {
            dropped: w[0],
            backup_full: w[1],
            backed_up: w[2],
            backup_bytes: w[3],
            backup_held_ns: w[4],
            timeout_retransmits: w[5],
        }
    }

    /// Counter-wise difference `self - earlier`.
    pub fn since(&self, earlier: &ReceiveFaultCounters) -> ReceiveFaultCounters {
        let (a, b) = (self.to_words(), earlier.to_words());
        ReceiveFaultCounters::from_words(&std::array::from_fn(|i| a[i] - b[i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_round_trip_and_subtract() {
        let live = LiveReceiveFaultCounters::default();
        live.dropped.fetch_add(3, Relaxed);
        live.backed_up.fetch_add(2, Relaxed);
        live.backup_bytes.fetch_add(128 << 10, Relaxed);
        let c = live.snapshot();
        assert_eq!(ReceiveFaultCounters::from_words(&c.to_words()), c);
        let later = ReceiveFaultCounters {
            timeout_retransmits: 5,
            dropped: 4,
            ..c
        };
        let d = later.since(&c);
        assert_eq!((d.dropped, d.timeout_retransmits, d.backed_up), (1, 5, 0));
    }
}
