//! What a message-layer benchmark reports: its [`Row`]s, the [`RowCounters`] that explain
//! them (summed over ranks 0 and 1), and how both are printed.

use serde::Serialize;

/// One row.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Message size.
    pub bytes: usize,
    /// Timed repetitions.
    pub repetitions: usize,
    /// Microseconds per message (PingPong: half a round trip).
    pub t_usec: f64,
    /// Bandwidth, MB/s (10^6 B/s).
    pub mbytes_per_sec: f64,
    /// What the buffer mode and the NIC did during the timed repetitions, both ranks.
    pub counters: RowCounters,
}

/// The counters that explain a row: deltas over its timed repetitions, summed over ranks 0
/// and 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RowCounters {
    /// Timed data messages sent by ranks 0 and 1 (not the benchmark's own synchronisation).
    pub messages: u64,
    /// Pin-down cache hits.
    pub hits: u64,
    /// Pin-down cache misses (registrations made).
    pub misses: u64,
    /// Pin-down cache evictions.
    pub evictions: u64,
    /// Transfers that fell back to copying.
    pub fallbacks: u64,
    /// Registrations (pin-down) or present pages (ODP) invalidated.
    pub invalidations: u64,
    /// Network page faults on the initiator's own memory.
    pub npf_requester: u64,
    /// Network page faults on the target's memory.
    pub npf_responder: u64,
    /// Pages made present by faults.
    pub npf_pages: u64,
    /// Pages made present by prefetch.
    pub prefetch_pages: u64,
    /// System calls the NICs made (none per small message while both poll).
    pub syscalls: u64,
    /// Memory regions registered (pinned, for non-ODP regions).
    pub registrations: u64,
    /// Time spent registering, in nanoseconds.
    pub registration_ns: u64,
    /// Memory regions deregistered.
    pub deregistrations: u64,
    /// Time spent deregistering, in nanoseconds.
    pub deregistration_ns: u64,
    /// Registration-time histogram (bucket `i`: under `2^i` µs).
    pub registration_histogram: [u64; REG_BUCKETS],
}

/// Buckets of the registration-time histogram.
pub const REG_BUCKETS: usize = pagewire_transport::nic::counters::NPF_HISTOGRAM_BUCKETS;

impl RowCounters {
    /// How many counters (the length of [`RowCounters::to_array`]).
    pub const N: usize = 15 + REG_BUCKETS;

    /// This rank's totals so far (zeros on the mpi transport, which has no pagewire
    /// counters).
    pub fn now(u: &pagewire::Universe) -> RowCounters {
        u.try_with_p2p(|p| {
            let (c, m, n) = (p.counters(), p.mode_counters(), p.nic_counters());
            RowCounters {
                messages: c.eager_sent + c.rndv_sent, // replaced by the kernel's own count
                hits: m.hits,
                misses: m.misses,
                evictions: m.evictions,
                fallbacks: m.fallbacks,
                invalidations: m.invalidations,
                npf_requester: n.npf_requester,
                npf_responder: n.npf_responder,
                npf_pages: n.npf_pages,
                prefetch_pages: n.prefetch_pages,
                syscalls: n.syscalls,
                registrations: n.registrations,
                registration_ns: n.registration_ns,
                deregistrations: n.deregistrations,
                deregistration_ns: n.deregistration_ns,
                registration_histogram: n.registration_histogram,
            }
        })
        .unwrap_or_default()
    }

    /// The counters in field order, e.g. to send or reduce them as one buffer.
    pub fn to_array(self) -> [u64; Self::N] {
        let head = [
            self.messages,
            self.hits,
            self.misses,
            self.evictions,
            self.fallbacks,
            self.invalidations,
            self.npf_requester,
            self.npf_responder,
            self.npf_pages,
            self.prefetch_pages,
            self.syscalls,
            self.registrations,
            self.registration_ns,
            self.deregistrations,
            self.deregistration_ns,
        ];
        std::array::from_fn(|i| {
            head.get(i)
                .copied()
                .unwrap_or_else(|| self.registration_histogram[i - head.len()])
        })
    }

    /// The inverse of [`RowCounters::to_array`].
    pub fn from_array(a: [u64; Self::N]) -> RowCounters {
        RowCounters {
            messages: a[0],
            hits: a[1],
            misses: a[2],
            evictions: a[3],
            fallbacks: a[4],
            invalidations: a[5],
            npf_requester: a[6],
            npf_responder: a[7],
            npf_pages: a[8],
            prefetch_pages: a[9],
            syscalls: a[10],
            registrations: a[11],
            registration_ns: a[12],
            deregistrations: a[13],
            deregistration_ns: a[14],
            registration_histogram: std::array::from_fn(|i| a[15 + i]),
        }
    }

    /// Combines two sets counter by counter (e.g. `u64::wrapping_sub` for a delta).
    pub fn zip(self, other: RowCounters, f: impl Fn(u64, u64) -> u64) -> RowCounters {
        let (a, b) = (self.to_array(), other.to_array());
        RowCounters::from_array(std::array::from_fn(|i| f(a[i], b[i])))
    }

    /// Pin-down hit rate in percent (`None` without lookups).
    pub fn hit_rate(&self) -> Option<f64> {
        let lookups = self.hits + self.misses;
        (lookups > 0).then(|| 100.0 * self.hits as f64 / lookups as f64)
    }

    /// Network page faults per message.
    pub fn npfs_per_message(&self) -> f64 {
        (self.npf_requester + self.npf_responder) as f64 / self.messages.max(1) as f64
    }

    /// Mean time per registration in µs (`None` without any).
    pub fn registration_us(&self) -> Option<f64> {
        (self.registrations > 0)
            .then(|| self.registration_ns as f64 / self.registrations as f64 / 1000.0)
    }

    /// Mean time per deregistration in µs (`None` without any).
    pub fn deregistration_us(&self) -> Option<f64> {
        (self.deregistrations > 0)
            .then(|| self.deregistration_ns as f64 / self.deregistrations as f64 / 1000.0)
    }

    /// NIC system calls per message.
    pub fn syscalls_per_message(&self) -> f64 {
        self.syscalls as f64 / self.messages.max(1) as f64
    }
}

/// Prints rows in IMB PingPong's layout under a `# Benchmarking NAME` header.
pub fn print(name: &str, procs: i32, rows: &[Row]) {
    println!("#---------------------------------------------------");
    println!("# Benchmarking {name} ");
    println!("# #processes = {procs} ");
    println!("#---------------------------------------------------");
    println!("       #bytes #repetitions      t[usec]   Mbytes/sec");
    for r in rows {
        println!(
            "{:>13}{:>13}{:>13.2}{:>13.2}",
            r.bytes, r.repetitions, r.t_usec, r.mbytes_per_sec
        );
    }
    println!();
}

/// Prints, after a table, what explains each row: pin-down hit rate and misses, ODP faults
/// per message, invalidations and fallbacks (both ranks, timed repetitions only). Kept
/// apart so the table above stays comparable with IMB's.
pub fn print_counters(rows: &[Row]) {
    println!("# counters of ranks 0+1 over the timed repetitions:");
    println!("#      #bytes   hit%     misses  evictions  fallbacks  invalid.   NPF/msg  NPF pages  prefetched  syscalls/msg  reg[usec]  dereg[usec]");
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    for r in rows {
        let c = &r.counters;
        let hit = c
            .hit_rate()
            .map_or_else(|| "-".to_string(), |h| format!("{h:.1}"));
        println!(
            "# {:>11} {:>6} {:>10} {:>10} {:>10} {:>9} {:>9.2} {:>10} {:>11} {:>13.3} {:>10} {:>12}",
            r.bytes,
            hit,
            c.misses,
            c.evictions,
            c.fallbacks,
            c.invalidations,
            c.npfs_per_message(),
            c.npf_pages,
            c.prefetch_pages,
            c.syscalls_per_message(),
            us(c.registration_us()),
            us(c.deregistration_us())
        );
    }
    if rows.iter().any(|r| r.counters.registrations > 0) {
        println!("# registrations by time (µs, bucket upper bounds), over the timed repetitions:");
        let last = rows
            .iter()
            .filter_map(|r| {
                r.counters
                    .registration_histogram
                    .iter()
                    .rposition(|&n| n > 0)
            })
            .max()
            .unwrap_or(0);
        let mut head = format!("# {:>11}", "#bytes");
        for b in 0..=last {
            head += &format!(" {:>7}", format!("<{}", 1u64 << b));
        }
        println!("{head}");
        for r in rows.iter().filter(|r| r.counters.registrations > 0) {
            let mut line = format!("# {:>11}", r.bytes);
            for b in 0..=last {
                line += &format!(" {:>7}", r.counters.registration_histogram[b]);
            }
            println!("{line}");
        }
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::RowCounters;

    #[test]
    fn row_counters_combine_and_explain() {
        let a = RowCounters {
            messages: 10,
            hits: 3,
            misses: 1,
            npf_requester: 4,
            npf_responder: 1,
            ..Default::default()
        };
        let b = RowCounters::from_array(a.to_array());
        assert_eq!(a, b);
        let sum = a.zip(b, u64::wrapping_add);
        assert_eq!((sum.messages, sum.hits), (20, 6));
        assert_eq!(sum.hit_rate(), Some(75.0));
        assert_eq!(sum.npfs_per_message(), 0.5);
        assert_eq!(RowCounters::default().hit_rate(), None);
    }
}
