//! NIC counters (docs/architecture.md: registrations, pinned bytes, network page
//! faults by side and their resolution time, RNR retries, invalidations, bytes per data path).
//!
//! This file holds the live counters a provider updates and the resolution-time histograms;
//! `snapshot.rs` holds [`CountersSnapshot`], the copy that is reported, compared and sent.

mod snapshot;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::receive_fault_counters::LiveReceiveFaultCounters;
use super::tpt_cache_counters::LiveTptCacheCounters;

pub use snapshot::CountersSnapshot;

/// How payload bytes travelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// One kernel copy between address spaces (`process_vm_readv`/`writev`, "CMA").
    Cma,
    /// Staged through the shared-memory ring (two copies).
    Staged,
}

/// Buckets of the NPF resolution-time histogram: bucket `i` counts resolutions that took
/// less than `2^i` microseconds (the last bucket takes the rest).
pub const NPF_HISTOGRAM_BUCKETS: usize = 20;

/// Sub-buckets per doubling of the fine NPF latency histogram (`npf_latency`): a bucket is
/// 1/16 of its octave wide (3–6 % of the value), fine enough to set percentiles beside
/// Lesokhin17 Table 4's (215 against 250 µs).
const NPF_LATENCY_SUBS: usize = 16;
/// Octaves of the fine histogram, from 1 µs: the last ends at 2^24 µs (about 17 s).
const NPF_LATENCY_OCTAVES: usize = 24;
/// Buckets of the fine NPF latency histogram: one for under 1 µs, then
/// `NPF_LATENCY_OCTAVES` doublings of `NPF_LATENCY_SUBS` buckets each.
pub const NPF_LATENCY_BUCKETS: usize = 1 + NPF_LATENCY_SUBS * NPF_LATENCY_OCTAVES;

/// The fine histogram bucket of a duration in nanoseconds.
fn latency_bucket(nanos: u64) -> usize {
    let micros = nanos as f64 / 1000.0;
    if micros < 1.0 {
        return 0;
    }
    let octave = micros.log2().floor() as usize;
    if octave >= NPF_LATENCY_OCTAVES {
        return NPF_LATENCY_BUCKETS - 1;
    }
    let sub = ((micros / (1u64 << octave) as f64 - 1.0) * NPF_LATENCY_SUBS as f64) as usize;
    1 + octave * NPF_LATENCY_SUBS + sub.min(NPF_LATENCY_SUBS - 1)
}

/// The middle of fine histogram bucket `i`, in microseconds.
fn latency_bucket_mid_us(i: usize) -> f64 {
    if i == 0 {
        return 0.5;
    }
    let (octave, sub) = ((i - 1) / NPF_LATENCY_SUBS, (i - 1) % NPF_LATENCY_SUBS);
    let base = (1u64 << octave) as f64;
    base * (1.0 + (sub as f64 + 0.5) / NPF_LATENCY_SUBS as f64)
}

/// The live fine histogram (an array too long for `#[derive(Default)]`).
#[derive(Debug)]
pub struct LiveLatencies(pub [AtomicU64; NPF_LATENCY_BUCKETS]);

impl Default for LiveLatencies {
    fn default() -> Self {
        LiveLatencies(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// Counts per bucket of the fine NPF latency histogram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latencies(pub [u64; NPF_LATENCY_BUCKETS]);

impl Default for Latencies {
    fn default() -> Self {
        Latencies([0; NPF_LATENCY_BUCKETS])
    }
}

/// Where the time of one network page fault went (Lesokhin17 Fig. 3(a)'s breakdown, as far as
/// the soft NIC has its parts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NpfTiming {
    /// From the fault to its resolution, as the faulting engine waits for it.
    pub total_ns: u64,
    /// From filing the fault to the driver thread taking it up (the interrupt and the
    /// handler's invocation, Fig. 3(a) (i)–(ii)); 0 for a requester fault, which the
    /// engine resolves itself.
    pub wait_ns: u64,
    /// The operating system's work: mapping the pages and marking them present for the NIC
    /// ((iii)–(iv)), real on every profile.
    pub os_ns: u64,
    /// Time added by the `npf-model` profile for the NIC's firmware (Lesokhin17 Table 4);
    /// 0 on the default profile.
    pub model_ns: u64,
}

/// Adds `n` to a counter only one thread updates at a time (readers may see it late).
#[inline]
pub fn add_serialized(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

/// The histogram bucket of a duration: `i` such that it took under `2^i` µs.
fn micros_bucket(nanos: u64) -> usize {
    let micros = nanos / 1000;
    ((u64::BITS - micros.leading_zeros()) as usize).min(NPF_HISTOGRAM_BUCKETS - 1)
}

/// Live counters, updated with relaxed atomics from a provider's data path. Each field is
/// the live value of the [`CountersSnapshot`] field of the same name.
#[allow(missing_docs)]
#[derive(Debug, Default)]
pub struct Counters {
    pub registrations: AtomicU64,
    pub deregistrations: AtomicU64,
    pub pinned_now: AtomicU64,
    pub pinned_peak: AtomicU64,
    pub npf_requester: AtomicU64,
    pub npf_responder: AtomicU64,
    pub npf_pages: AtomicU64,
    pub npf_failed: AtomicU64,
    pub npf_resolve_ns: AtomicU64,
    pub npf_histogram: [AtomicU64; NPF_HISTOGRAM_BUCKETS],
    pub npf_wait_ns: AtomicU64,
    pub npf_os_ns: AtomicU64,
    pub npf_model_ns: AtomicU64,
    pub npf_max_ns: AtomicU64,
    pub npf_latency: LiveLatencies,
    pub prefetch_pages: AtomicU64,
    pub rnr_nacks_sent: AtomicU64,
    pub rnr_retries: AtomicU64,
    pub invalidated_pages: AtomicU64,
    pub bytes_cma: AtomicU64,
    pub bytes_staged: AtomicU64,
    pub bytes_inline: AtomicU64,
    pub error_completions: AtomicU64,
    /// System calls this NIC made (the soft provider: `sys::syscalls_made` at snapshot).
    pub syscalls: AtomicU64,
    pub registration_ns: AtomicU64,
    pub deregistration_ns: AtomicU64,
    pub registration_histogram: [AtomicU64; NPF_HISTOGRAM_BUCKETS],
    pub deregistration_histogram: [AtomicU64; NPF_HISTOGRAM_BUCKETS],
    pub detached_regions: AtomicU64,
    pub detached_bytes: AtomicU64,
    pub tpt_cache: LiveTptCacheCounters,
    pub receive_fault: LiveReceiveFaultCounters,
}

impl Counters {
    /// Counts `bytes` newly pinned (and the peak).
    #[inline]
    pub fn add_pinned(&self, bytes: u64) {
        let now = self.pinned_now.fetch_add(bytes, Relaxed) + bytes;
        self.pinned_peak.fetch_max(now, Relaxed);
    }

    /// Counts `bytes` unpinned.
    #[inline]
    pub fn sub_pinned(&self, bytes: u64) {
        self.pinned_now.fetch_sub(bytes, Relaxed);
    }

    /// Counts one registration (`register`) or deregistration that took `nanos`.
    pub fn record_registration(&self, register: bool, nanos: u64) {
        let (total, histogram) = if register {
            (&self.registration_ns, &self.registration_histogram)
        } else {
            (&self.deregistration_ns, &self.deregistration_histogram)
        };
        if register {
            self.registrations.fetch_add(1, Relaxed);
        } else {
            self.deregistrations.fetch_add(1, Relaxed);
        }
        total.fetch_add(nanos, Relaxed);
        histogram[micros_bucket(nanos)].fetch_add(1, Relaxed);
    }

    /// Counts one resolved network page fault over `pages` pages and where its time went.
    pub fn record_npf(&self, requester: bool, pages: u64, t: NpfTiming) {
        if requester {
            self.npf_requester.fetch_add(1, Relaxed);
        } else {
            self.npf_responder.fetch_add(1, Relaxed);
        }
        self.npf_pages.fetch_add(pages, Relaxed);
        self.npf_resolve_ns.fetch_add(t.total_ns, Relaxed);
        self.npf_wait_ns.fetch_add(t.wait_ns, Relaxed);
        self.npf_os_ns.fetch_add(t.os_ns, Relaxed);
        self.npf_model_ns.fetch_add(t.model_ns, Relaxed);
        self.npf_max_ns.fetch_max(t.total_ns, Relaxed);
        self.npf_histogram[micros_bucket(t.total_ns)].fetch_add(1, Relaxed);
        self.npf_latency.0[latency_bucket(t.total_ns)].fetch_add(1, Relaxed);
    }

    /// Counts payload bytes by path. Callers are serialised (the soft engine's lock), so a
    /// load and a store do, without a locked instruction on the data path.
    #[inline]
    pub fn add_bytes(&self, path: DataPath, bytes: u64) {
        let c = match path {
            DataPath::Cma => &self.bytes_cma,
            DataPath::Staged => &self.bytes_staged,
        };
        add_serialized(c, bytes);
    }

    /// A consistent-enough copy for reporting.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            registrations: self.registrations.load(Relaxed),
            deregistrations: self.deregistrations.load(Relaxed),
            pinned_now: self.pinned_now.load(Relaxed),
            pinned_peak: self.pinned_peak.load(Relaxed),
            npf_requester: self.npf_requester.load(Relaxed),
            npf_responder: self.npf_responder.load(Relaxed),
            npf_pages: self.npf_pages.load(Relaxed),
            npf_failed: self.npf_failed.load(Relaxed),
            npf_resolve_ns: self.npf_resolve_ns.load(Relaxed),
            npf_histogram: std::array::from_fn(|i| self.npf_histogram[i].load(Relaxed)),
            npf_wait_ns: self.npf_wait_ns.load(Relaxed),
            npf_os_ns: self.npf_os_ns.load(Relaxed),
            npf_model_ns: self.npf_model_ns.load(Relaxed),
            npf_max_ns: self.npf_max_ns.load(Relaxed),
            npf_latency: Latencies(std::array::from_fn(|i| self.npf_latency.0[i].load(Relaxed))),
            prefetch_pages: self.prefetch_pages.load(Relaxed),
            rnr_nacks_sent: self.rnr_nacks_sent.load(Relaxed),
            rnr_retries: self.rnr_retries.load(Relaxed),
            invalidated_pages: self.invalidated_pages.load(Relaxed),
            bytes_cma: self.bytes_cma.load(Relaxed),
            bytes_staged: self.bytes_staged.load(Relaxed),
            bytes_inline: self.bytes_inline.load(Relaxed),
            error_completions: self.error_completions.load(Relaxed),
            syscalls: self.syscalls.load(Relaxed),
            registration_ns: self.registration_ns.load(Relaxed),
            deregistration_ns: self.deregistration_ns.load(Relaxed),
            registration_histogram: std::array::from_fn(|i| {
                self.registration_histogram[i].load(Relaxed)
            }),
            deregistration_histogram: std::array::from_fn(|i| {
                self.deregistration_histogram[i].load(Relaxed)
            }),
            detached_regions: self.detached_regions.load(Relaxed),
            detached_bytes: self.detached_bytes.load(Relaxed),
            tpt_cache: self.tpt_cache.snapshot(),
            receive_fault: self.receive_fault.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npf_histogram_buckets_by_log2_microseconds() {
        let c = Counters::default();
        let t = |ns| NpfTiming {
            total_ns: ns,
            ..NpfTiming::default()
        };
        c.record_npf(true, 1, t(500)); // 0 us -> bucket 0
        c.record_npf(false, 2, t(3_000)); // 3 us -> bucket 2
        c.record_npf(false, 1, t(u64::MAX / 2)); // clamps to the last bucket
        let s = c.snapshot();
        assert_eq!(s.npf_histogram[0], 1);
        assert_eq!(s.npf_histogram[2], 1);
        assert_eq!(s.npf_histogram[NPF_HISTOGRAM_BUCKETS - 1], 1);
        assert_eq!((s.npf_requester, s.npf_responder, s.npf_pages), (1, 2, 4));
    }

    #[test]
    fn pinned_peak_follows_the_maximum() {
        let c = Counters::default();
        c.add_pinned(100);
        c.add_pinned(50);
        c.sub_pinned(120);
        c.add_pinned(10);
        let s = c.snapshot();
        assert_eq!((s.pinned_now, s.pinned_peak), (40, 150));
    }
}
