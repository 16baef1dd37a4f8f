//! Counters of the NIC's bounded translation cache (the soft NIC's
//! `PAGEWIRE_SOFT_TPT_CACHE`, `soft/src/tpt_cache.rs`): lookups that hit and missed, the
//! misses its driver thread filled and where their time went, and how long requests waited
//! to be retransmitted after a miss. After Azimi03, which reports
//! a lookup cache's miss ratio, its miss penalty split into "miss delay" (until the
//! handler runs) and "miss processing" (servicing it), and the slowdown they cause.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The live part of the counters that this process keeps (hits and misses are kept in the
/// cache itself, which peers' engines also look up).
#[derive(Debug, Default)]
pub struct LiveTptCacheCounters {
    fills: AtomicU64,
    fill_wait_ns: AtomicU64,
    fill_model_ns: AtomicU64,
    stall_ns: AtomicU64,
}

impl LiveTptCacheCounters {
    /// One miss filled by this rank's driver: `wait_ns` from the miss to the handler taking
    /// it up (real), `model_ns` of modelled processing.
    pub fn record_fill(&self, wait_ns: u64, model_ns: u64) {
        self.fills.fetch_add(1, Relaxed);
        self.fill_wait_ns.fetch_add(wait_ns, Relaxed);
        self.fill_model_ns.fetch_add(model_ns, Relaxed);
    }

    /// A request of this rank waited `ns` after a miss before it went out again.
    pub fn add_stall(&self, ns: u64) {
        self.stall_ns.fetch_add(ns, Relaxed);
    }

    /// This process's part of the counters (hits and misses zero).
    pub fn snapshot(&self) -> TptCacheCounters {
        TptCacheCounters {
            fills: self.fills.load(Relaxed),
            fill_wait_ns: self.fill_wait_ns.load(Relaxed),
            fill_model_ns: self.fill_model_ns.load(Relaxed),
            stall_ns: self.stall_ns.load(Relaxed),
            ..TptCacheCounters::default()
        }
    }
}

/// The translation cache's counters at one moment; all zero with the cache off
/// (Azimi03, section V).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TptCacheCounters {
    /// Lookups in this NIC's cache that found the entry (by this rank's engine, or by a
    /// peer's engine playing this NIC's part on the CMA path).
    pub hits: u64,
    /// Lookups in this NIC's cache that missed: each dropped its request.
    pub misses: u64,
    /// Misses this rank's driver (the interrupt-handler analogue) filled.
    pub fills: u64,
    /// Of the fills: time from the miss to the handler taking it up, in nanoseconds (the
    /// seed's "miss delay"; real: the driver thread's wake-up or the owner's next poll).
    pub fill_wait_ns: u64,
    /// Of the fills: modelled processing time, in nanoseconds (the seed's "miss processing
    /// time", 5–500 µs).
    pub fill_model_ns: u64,
    /// Time this rank's requests waited after a miss until they were retransmitted, in
    /// nanoseconds (the slowdown's source).
    pub stall_ns: u64,
}

impl TptCacheCounters {
    /// Words of [`TptCacheCounters::to_words`].
    pub const WORDS: usize = 6;

    /// The counters in field order.
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        [
            self.hits,
            self.misses,
            self.fills,
            self.fill_wait_ns,
            self.fill_model_ns,
            self.stall_ns,
        ]
    }

    /// The inverse of [`TptCacheCounters::to_words`].
    pub fn from_words(w: &[u64; Self::WORDS]) -> TptCacheCounters {
        TptCacheCounters {
            hits: w[0],
            misses: w[1],
            fills: w[2],
            fill_wait_ns: w[3],
            fill_model_ns: w[4],
            stall_ns: w[5],
        }
    }

    /// Counter-wise difference `self - earlier`.
    pub fn since(&self, earlier: &TptCacheCounters) -> TptCacheCounters {
        let (a, b) = (self.to_words(), earlier.to_words());
        TptCacheCounters::from_words(&std::array::from_fn(|i| a[i] - b[i]))
    }

    /// Misses per lookup in percent (`None` without lookups).
    pub fn miss_percent(&self) -> Option<f64> {
        let n = self.hits + self.misses;
        (n > 0).then(|| 100.0 * self.misses as f64 / n as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_round_trip_subtract_and_give_a_miss_rate() {
        let live = LiveTptCacheCounters::default();
        live.record_fill(2_000, 50_000);
        live.add_stall(200_000);
        let c = TptCacheCounters {
            hits: 3,
            misses: 1,
            ..live.snapshot()
        };
        assert_eq!(TptCacheCounters::from_words(&c.to_words()), c);
        assert_eq!(
            (c.fills, c.fill_wait_ns, c.fill_model_ns),
            (1, 2_000, 50_000)
        );
        assert_eq!(c.miss_percent(), Some(25.0));
        assert_eq!(c.since(&c), TptCacheCounters::default());
        assert_eq!(TptCacheCounters::default().miss_percent(), None);
    }
}
