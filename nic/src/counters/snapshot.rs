//! [`CountersSnapshot`]: the NIC counters copied at one moment, as they are reported,
//! subtracted to count over an interval, and sent to a peer as bytes.

use super::{
    latency_bucket_mid_us, DataPath, Latencies, NPF_HISTOGRAM_BUCKETS, NPF_LATENCY_BUCKETS,
};
use crate::receive_fault_counters::ReceiveFaultCounters;
use crate::tpt_cache_counters::TptCacheCounters;

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
    use super::CountersSnapshot;
    use crate::counters::{
        latency_bucket, latency_bucket_mid_us, Counters, DataPath, NpfTiming, NPF_LATENCY_BUCKETS,
    };

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
}
