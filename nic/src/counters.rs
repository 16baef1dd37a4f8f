//! NIC counters (docs/architecture.md: registrations, pinned bytes, network page
//! faults by side and their resolution time, RNR retries, invalidations, bytes per data path).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::receive_fault_counters::{LiveReceiveFaultCounters, ReceiveFaultCounters};
use super::tpt_cache_counters::{LiveTptCacheCounters, TptCacheCounters};

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

/// A copy of the counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// Memory regions registered.
    pub registrations: u64,
    /// Memory regions deregistered.
    pub deregistrations: u64,
    /// Bytes pinned (mlocked) by this NIC now.
    pub pinned_now: u64,
    /// Most bytes pinned at once.
    pub pinned_peak: u64,
    /// Network page faults on this rank's memory raised by its own work requests.
    pub npf_requester: u64,
    /// Network page faults on this rank's memory raised by peers' requests (rNPFs) and by
    /// incoming sends, resolved by this rank's driver thread.
    pub npf_responder: u64,
    /// Pages mapped by resolving faults.
    pub npf_pages: u64,
    /// Faults that could not be resolved (memory not mapped): error completions.
    pub npf_failed: u64,
    /// Total time spent resolving faults, in nanoseconds (requester: inline; responder: from
    /// the request to the driver thread marking the pages present).
    pub npf_resolve_ns: u64,
    /// Resolution-time histogram (bucket `i`: under `2^i` µs).
    pub npf_histogram: [u64; NPF_HISTOGRAM_BUCKETS],
    /// Of `npf_resolve_ns`: from filing a responder fault to the driver thread taking it up.
    pub npf_wait_ns: u64,
    /// Of `npf_resolve_ns`: the operating system's work (mapping pages, marking them
    /// present).
    pub npf_os_ns: u64,
    /// Of `npf_resolve_ns`: time the `npf-model` profile added for the NIC's firmware
    /// (modelled, Lesokhin17 Table 4; 0 on the default profile).
    pub npf_model_ns: u64,
    /// The longest fault resolution, in nanoseconds (kept as a level by `since`).
    pub npf_max_ns: u64,
    /// Fine resolution-time histogram (16 buckets per doubling from 1 µs), for percentiles
    /// ([`CountersSnapshot::npf_percentile_us`]).
    pub npf_latency: Latencies,
    /// Pages mapped by `advise` (prefetch).
    pub prefetch_pages: u64,
    /// Receiver-not-ready answers this rank sent (no receive posted, or a receive NPF).
    pub rnr_nacks_sent: u64,
    /// Work requests this rank retried after a receiver-not-ready answer or an rNPF.
    pub rnr_retries: u64,
    /// ODP pages whose present bit was cleared because the mapping changed.
    pub invalidated_pages: u64,
    /// Payload bytes moved by one kernel copy between address spaces.
    pub bytes_cma: u64,
    /// Payload bytes staged through the shared-memory ring.
    pub bytes_staged: u64,
    /// Payload bytes copied at post time for inline sends.
    pub bytes_inline: u64,
    /// Completions with a status other than success.
    pub error_completions: u64,
    /// System calls the NIC made in the application's threads (none per message
    /// while both sides poll; only to move bytes between processes, pin, fault or sleep).
    /// The driver thread's timed sleeps and wake-ups are not counted: they follow the clock
    /// and the machine's load, not the messages.
    pub syscalls: u64,
    /// Total time spent registering, in nanoseconds (pinning included).
    pub registration_ns: u64,
    /// Total time spent deregistering, in nanoseconds (unpinning included).
    pub deregistration_ns: u64,
    /// Registration-time histogram (bucket `i`: under `2^i` µs).
    pub registration_histogram: [u64; NPF_HISTOGRAM_BUCKETS],
    /// Deregistration-time histogram (bucket `i`: under `2^i` µs).
    pub deregistration_histogram: [u64; NPF_HISTOGRAM_BUCKETS],
    /// Pinned regions whose range the application unmapped or replaced while registered:
    /// the NIC keeps using the pages it pinned.
    pub detached_regions: u64,
    /// Payload bytes the NIC moved to or from pages the application no longer maps
    /// (through detached regions): data the application will never see, or stale data sent.
    pub detached_bytes: u64,
    /// The NIC's bounded translation cache (all zero when it is off, the default).
    pub tpt_cache: TptCacheCounters,
    /// The receive-fault policy's drops, backup-ring stores and timer retransmissions (all
    /// zero under the default `rnr` policy).
    pub receive_fault: ReceiveFaultCounters,
}

impl CountersSnapshot {
    /// The counters as little-endian bytes (for sending a peer's counters to a reporter).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = vec![
            self.registrations,
            self.deregistrations,
            self.pinned_now,
            self.pinned_peak,
            self.npf_requester,
            self.npf_responder,
            self.npf_pages,
            self.npf_failed,
            self.npf_resolve_ns,
            self.prefetch_pages,
            self.rnr_nacks_sent,
            self.rnr_retries,
            self.invalidated_pages,
            self.bytes_cma,
            self.bytes_staged,
            self.bytes_inline,
            self.error_completions,
            self.syscalls,
            self.registration_ns,
            self.deregistration_ns,
            self.detached_regions,
            self.detached_bytes,
            self.npf_wait_ns,
            self.npf_os_ns,
            self.npf_model_ns,
            self.npf_max_ns,
        ];
        w.extend_from_slice(&self.npf_histogram);
        w.extend_from_slice(&self.registration_histogram);
        w.extend_from_slice(&self.deregistration_histogram);
        w.extend_from_slice(&self.npf_latency.0);
        w.extend_from_slice(&self.tpt_cache.to_words());
        w.extend_from_slice(&self.receive_fault.to_words());
        w.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// The inverse of [`CountersSnapshot::to_bytes`]; `None` if the length is wrong.
    pub fn from_bytes(b: &[u8]) -> Option<CountersSnapshot> {
        const SCALARS: usize = 26;
        const H: usize = NPF_HISTOGRAM_BUCKETS;
        const L: usize = NPF_LATENCY_BUCKETS;
        const T: usize = TptCacheCounters::WORDS;
        const R: usize = ReceiveFaultCounters::WORDS;
        if b.len() != (SCALARS + 3 * H + L + T + R) * 8 {
            return None;
        }
        let w: Vec<u64> = b
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Some(CountersSnapshot {
            registrations: w[0],
            deregistrations: w[1],
            pinned_now: w[2],
            pinned_peak: w[3],
            npf_requester: w[4],
            npf_responder: w[5],
            npf_pages: w[6],
            npf_failed: w[7],
            npf_resolve_ns: w[8],
            prefetch_pages: w[9],
            rnr_nacks_sent: w[10],
            rnr_retries: w[11],
            invalidated_pages: w[12],
            bytes_cma: w[13],
            bytes_staged: w[14],
            bytes_inline: w[15],
            error_completions: w[16],
            syscalls: w[17],
            registration_ns: w[18],
            deregistration_ns: w[19],
            detached_regions: w[20],
            detached_bytes: w[21],
            npf_wait_ns: w[22],
            npf_os_ns: w[23],
            npf_model_ns: w[24],
            npf_max_ns: w[25],
            npf_latency: Latencies(std::array::from_fn(|i| w[SCALARS + 3 * H + i])),
            npf_histogram: std::array::from_fn(|i| w[SCALARS + i]),
            registration_histogram: std::array::from_fn(|i| w[SCALARS + H + i]),
            deregistration_histogram: std::array::from_fn(|i| w[SCALARS + 2 * H + i]),
            tpt_cache: TptCacheCounters::from_words(&std::array::from_fn(|i| {
                w[SCALARS + 3 * H + L + i]
            })),
            receive_fault: ReceiveFaultCounters::from_words(&std::array::from_fn(|i| {
                w[SCALARS + 3 * H + L + T + i]
            })),
        })
    }

    /// Mean registration time in microseconds (0 when there was none).
    pub fn registration_mean_us(&self) -> f64 {
        mean_us(self.registration_ns, self.registrations)
    }

    /// Mean deregistration time in microseconds (0 when there was none).
    pub fn deregistration_mean_us(&self) -> f64 {
        mean_us(self.deregistration_ns, self.deregistrations)
    }

    /// Mean NPF resolution time in microseconds (0 when there was none).
    pub fn npf_mean_us(&self) -> f64 {
        let n = self.npf_requester + self.npf_responder;
        if n == 0 {
            0.0
        } else {
            self.npf_resolve_ns as f64 / n as f64 / 1000.0
        }
    }

    /// Faults resolved on both sides.
    pub fn npf_count(&self) -> u64 {
        self.npf_requester + self.npf_responder
    }

    /// The `p`-th percentile (0 < p ≤ 100) of fault resolution time in microseconds, from
    /// the fine histogram (the middle of the bucket it falls in: within 3 % of the value,
    /// and never above the longest fault, which is kept exactly); 0 when there was no fault.
    pub fn npf_percentile_us(&self, p: f64) -> f64 {
        let n: u64 = self.npf_latency.0.iter().sum();
        if n == 0 {
            return 0.0;
        }
        let rank = ((p / 100.0) * n as f64).ceil().clamp(1.0, n as f64) as u64;
        let mut seen = 0;
        let mut bucket = NPF_LATENCY_BUCKETS - 1;
        for (i, c) in self.npf_latency.0.iter().enumerate() {
            seen += c;
            if seen >= rank {
                bucket = i;
                break;
            }
        }
        let mid = latency_bucket_mid_us(bucket);
        if self.npf_max_ns > 0 {
            mid.min(self.npf_max_ns as f64 / 1000.0)
        } else {
            mid
        }
    }

    /// Mean of one part of the fault time (`npf_wait_ns`, `npf_os_ns`, `npf_model_ns`, or
    /// `npf_resolve_ns` for the whole), in microseconds per fault.
    pub fn npf_part_mean_us(&self, part_ns: u64) -> f64 {
        mean_us(part_ns, self.npf_count())
    }

    /// The data path that moved most payload bytes.
    pub fn main_data_path(&self) -> Option<DataPath> {
        match (self.bytes_cma, self.bytes_staged) {
            (0, 0) => None,
            (c, s) if c >= s => Some(DataPath::Cma),
            _ => Some(DataPath::Staged),
        }
    }

    /// Counter-wise difference `self - earlier` (peaks and levels kept from `self`).
    pub fn since(&self, earlier: &CountersSnapshot) -> CountersSnapshot {
        CountersSnapshot {
            registrations: self.registrations - earlier.registrations,
            deregistrations: self.deregistrations - earlier.deregistrations,
            pinned_now: self.pinned_now,
            pinned_peak: self.pinned_peak,
            npf_requester: self.npf_requester - earlier.npf_requester,
            npf_responder: self.npf_responder - earlier.npf_responder,
            npf_pages: self.npf_pages - earlier.npf_pages,
            npf_failed: self.npf_failed - earlier.npf_failed,
            npf_resolve_ns: self.npf_resolve_ns - earlier.npf_resolve_ns,
            npf_histogram: std::array::from_fn(|i| {
                self.npf_histogram[i] - earlier.npf_histogram[i]
            }),
            npf_wait_ns: self.npf_wait_ns - earlier.npf_wait_ns,
            npf_os_ns: self.npf_os_ns - earlier.npf_os_ns,
            npf_model_ns: self.npf_model_ns - earlier.npf_model_ns,
            npf_max_ns: self.npf_max_ns,
            npf_latency: Latencies(std::array::from_fn(|i| {
                self.npf_latency.0[i] - earlier.npf_latency.0[i]
            })),
            prefetch_pages: self.prefetch_pages - earlier.prefetch_pages,
            rnr_nacks_sent: self.rnr_nacks_sent - earlier.rnr_nacks_sent,
            rnr_retries: self.rnr_retries - earlier.rnr_retries,
            invalidated_pages: self.invalidated_pages - earlier.invalidated_pages,
            bytes_cma: self.bytes_cma - earlier.bytes_cma,
            bytes_staged: self.bytes_staged - earlier.bytes_staged,
            bytes_inline: self.bytes_inline - earlier.bytes_inline,
            error_completions: self.error_completions - earlier.error_completions,
            syscalls: self.syscalls - earlier.syscalls,
            registration_ns: self.registration_ns - earlier.registration_ns,
            deregistration_ns: self.deregistration_ns - earlier.deregistration_ns,
            registration_histogram: std::array::from_fn(|i| {
                self.registration_histogram[i] - earlier.registration_histogram[i]
            }),
            deregistration_histogram: std::array::from_fn(|i| {
                self.deregistration_histogram[i] - earlier.deregistration_histogram[i]
            }),
            detached_regions: self.detached_regions - earlier.detached_regions,
            detached_bytes: self.detached_bytes - earlier.detached_bytes,
            tpt_cache: self.tpt_cache.since(&earlier.tpt_cache),
            receive_fault: self.receive_fault.since(&earlier.receive_fault),
        }
    }
}

fn mean_us(total_ns: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        total_ns as f64 / n as f64 / 1000.0
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
    fn snapshots_round_trip_through_bytes() {
        let c = Counters::default();
        c.record_npf(
            false,
            3,
            NpfTiming {
                total_ns: 70_000,
                wait_ns: 1_000,
                os_ns: 9_000,
                model_ns: 60_000,
            },
        );
        c.add_pinned(4096);
        c.add_bytes(DataPath::Staged, 99);
        let s = c.snapshot();
        assert_eq!(CountersSnapshot::from_bytes(&s.to_bytes()), Some(s));
        assert_eq!(CountersSnapshot::from_bytes(&[0; 8]), None);
    }

    #[test]
    fn npf_percentiles_come_within_a_bucket_of_the_samples() {
        let c = Counters::default();
        // 100 faults of 101..=200 µs, and one of 464 µs (Lesokhin17 Table 4's 4 KB maximum).
        for us in 101..=200u64 {
            c.record_npf(
                true,
                1,
                NpfTiming {
                    total_ns: us * 1000,
                    os_ns: us * 100,
                    ..NpfTiming::default()
                },
            );
        }
        c.record_npf(
            true,
            1,
            NpfTiming {
                total_ns: 464_000,
                ..NpfTiming::default()
            },
        );
        let s = c.snapshot();
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.04;
        assert!(
            near(s.npf_percentile_us(50.0), 151.0),
            "{}",
            s.npf_percentile_us(50.0)
        );
        assert!(
            near(s.npf_percentile_us(95.0), 196.0),
            "{}",
            s.npf_percentile_us(95.0)
        );
        assert_eq!(s.npf_percentile_us(100.0), 464.0, "the maximum is exact");
        assert_eq!(s.npf_max_ns, 464_000);
        // 100 µs × (101 + ... + 200) / 10 over 101 faults.
        assert!(near(s.npf_part_mean_us(s.npf_os_ns), 1_505.0 / 101.0));
        assert_eq!(CountersSnapshot::default().npf_percentile_us(99.0), 0.0);
        // Every bucket's middle lies inside the bucket.
        for i in 1..NPF_LATENCY_BUCKETS {
            let mid_ns = (latency_bucket_mid_us(i) * 1000.0) as u64;
            assert_eq!(latency_bucket(mid_ns), i, "bucket {i}");
        }
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
