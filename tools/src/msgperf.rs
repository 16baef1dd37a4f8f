//! Message-layer benchmarks: IMB's PingPong (half the round trip of a blocking send and
//! receive) and a streaming bandwidth test (a window of nonblocking sends, then one
//! acknowledgement), both printed in IMB PingPong's columns
//! (`#bytes #repetitions t[usec] Mbytes/sec`, MB = 10^6 bytes).

use pagewire::request;
use pagewire::traits::*;
use pagewire::SimpleCommunicator;
use serde::Serialize;

/// Which kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// IMB PingPong.
    Pingpong,
    /// Windowed streaming bandwidth.
    Stream,
    /// Resident and pinned memory after using 64 MiB of a 1 GiB buffer (Lesokhin17 §6.1).
    Footprint,
}

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

/// The order of the buffers of an off-cache rotation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// IMB's: buffer `i mod n` at repetition `i`, each buffer once per cycle (the worst
    /// case of an LRU cache smaller than the span).
    #[default]
    Cyclic,
    /// Buffers drawn from a Zipf(1) distribution (buffer `k` with weight `1/(k+1)`), the
    /// same seeded sequence on both ranks: a few hot buffers and a long cold tail, where
    /// eviction policies differ.
    Zipf,
}

/// The buffer index of each repetition: `count` indices below `n`.
pub fn buffer_sequence(pattern: Pattern, n: usize, count: usize) -> Vec<usize> {
    match pattern {
        Pattern::Cyclic => (0..count).map(|i| i % n.max(1)).collect(),
        Pattern::Zipf => {
            let mut cdf = Vec::with_capacity(n);
            let mut total = 0.0;
            for k in 0..n.max(1) {
                total += 1.0 / (k + 1) as f64;
                cdf.push(total);
            }
            // xorshift64*, fixed seed: both ranks draw the same sequence.
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            (0..count)
                .map(|_| {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    let u = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64
                        / (1u64 << 53) as f64
                        * total;
                    cdf.partition_point(|&c| c < u).min(n.max(1) - 1)
                })
                .collect()
        }
    }
}

/// How [`run`] runs its kernels.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Repetitions per size (default: IMB's rule).
    pub iters: Option<usize>,
    /// Messages per window of the streaming kernel.
    pub window: usize,
    /// IMB's `-off_cache`: rotate through buffers spanning this many bytes.
    pub off_cache: Option<usize>,
    /// The order in which the off-cache buffers are used.
    pub pattern: Pattern,
    /// Discard each buffer's pages (`MADV_DONTNEED`) before every repetition, untimed: the
    /// first touch of every message, by the CPU and by the NIC (ODP faults, pin-down
    /// misses), is in the timing.
    pub cold: bool,
    /// PingPong with a buffer with gaps: the message's bytes in runs of `.0` bytes, `.1`
    /// bytes apart (an MPI vector of bytes: the scatter-gather rendezvous).
    pub vector: Option<(usize, usize)>,
    /// Which calls the PingPong kernel makes.
    pub layer: Layer,
}

/// The calls a PingPong repetition makes: the rsmpi-shaped API a user calls, or the message
/// layer beneath it, so that one run shows what the API adds to a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    /// `Process::send` and `Process::receive_into`.
    #[default]
    Api,
    /// The message layer's blocking `send` and `recv` on the world's context (its
    /// `RefCell` borrow included, a few nanoseconds).
    Message,
}

/// The vector of bytes `size` message bytes make in runs of `run` bytes with `hole` bytes
/// between them, and the bytes it spans.
fn byte_vector(size: usize, run: usize, hole: usize) -> (pagewire::datatype::UserDatatype, usize) {
    let run = run.clamp(1, size.max(1));
    let count = size.div_ceil(run);
    let t = pagewire::datatype::UserDatatype::vector(
        count as pagewire::Count,
        run as pagewire::Count,
        (run + hole) as pagewire::Count,
        &u8::equivalent_datatype(),
    );
    (t, count * (run + hole) - hole)
}

/// PingPong of one element of `t` (a [`byte_vector`]) in `buf`.
fn pingpong_vector(
    peer: &pagewire::Process<'_>,
    me: i32,
    buf: &mut [u8],
    t: &pagewire::datatype::UserDatatype,
) {
    use pagewire::datatype::{MutView, View};
    let fits = "the buffer spans the vector";
    if me == 0 {
        peer.send(&View::over_bytes(&*buf, 1, t).expect(fits));
        peer.receive_into(&mut MutView::over_bytes(buf, 1, t).expect(fits));
    } else {
        peer.receive_into(&mut MutView::over_bytes(&mut *buf, 1, t).expect(fits));
        peer.send(&View::over_bytes(&*buf, 1, t).expect(fits));
    }
}

/// IMB's repetition rule: `min(1000, 40 MiB / size)`, 1000 for size 0.
pub fn imb_repetitions(size: usize) -> usize {
    match (40usize << 20).checked_div(size) {
        None => 1000,
        Some(r) => r.clamp(1, 1000),
    }
}

/// Sizes 0 and 2^min..=2^max, as `-msglog min:max` gives them.
pub fn msglog_sizes(min: u32, max: u32) -> Vec<usize> {
    std::iter::once(0)
        .chain((min..=max).map(|e| 1usize << e))
        .collect()
}

/// Runs `kernel` for every size on ranks 0 and 1 of `u`'s world (others wait, as IMB's
/// PingPong's do). Returns the rows on rank 0.
///
/// With `off_cache`, every repetition uses the next buffer of a span of that many bytes
/// (IMB's `-off_cache`), so buffers are cold in the CPU caches and, what matters for
/// `pindown`, new to the registration cache until the span has been cycled through.
pub fn run(u: &pagewire::Universe, kernel: Kernel, sizes: &[usize], o: RunOptions) -> Vec<Row> {
    let world = u.world();
    let me = world.rank();
    let mut rows = Vec::new();
    let max = sizes.iter().copied().max().unwrap_or(0);
    let span = match o.vector {
        Some((run, hole)) => byte_vector(max, run, hole).1.max(1),
        None => o.off_cache.map_or(max.max(1), |s| s.max(max).max(1) + max),
    };
    let window = o.window.max(1);
    let mut mapping = pagewire::sys::AnonMapping::new(span).expect("mmap of the buffers");
    let mut bufs: Vec<Vec<u8>> = if kernel == Kernel::Stream {
        (0..window).map(|_| vec![0u8; max.max(1)]).collect()
    } else {
        Vec::new()
    };
    for &size in sizes {
        let reps = o.iters.unwrap_or_else(|| imb_repetitions(size));
        if me > 1 {
            continue;
        }
        let peer = world.process_at_rank(1 - me);
        // Buffer `i` of the rotation (page-aligned steps), or always the first.
        let step = size.div_ceil(4096).max(1) * 4096;
        let nbuf = o.off_cache.map_or(1, |s| (s / step).max(1));
        let order = buffer_sequence(o.pattern, nbuf, reps + 10);
        let at = |i: usize| order[i] * step;
        // Untimed: drop the pages of the next buffer, then make sure the peer has too.
        let make_cold = |m: &mut pagewire::sys::AnonMapping, off: usize| {
            if o.cold && size > 0 {
                m.discard(off, step.min(span - off))
                    .expect("madvise(MADV_DONTNEED)");
                sync_pair(&peer, me);
            }
        };
        // Warm-up, as IMB does before each size.
        let vector = o.vector.map(|(run, hole)| byte_vector(size, run, hole).0);
        let once = |m: &mut pagewire::sys::AnonMapping, off: usize| match (&vector, o.layer) {
            (Some(t), _) => pingpong_vector(&peer, me, m.as_mut_slice(), t),
            (None, Layer::Api) => pingpong_once(&peer, me, &mut m.as_mut_slice()[off..off + size]),
            (None, Layer::Message) => u.with_p2p_mut(|p2p| {
                pingpong_message_layer(p2p, me as usize, &mut m.as_mut_slice()[off..off + size])
            }),
        };
        for i in 0..reps.min(10) {
            let off = at(i);
            make_cold(&mut mapping, off);
            once(&mut mapping, off);
        }
        sync_pair(&peer, me);
        let before = RowCounters::now(u);
        let (t, repetitions, messages) = match kernel {
            Kernel::Footprint => continue,
            Kernel::Pingpong => {
                let mut t = 0.0;
                for i in 0..reps {
                    let off = at(i + 10);
                    make_cold(&mut mapping, off);
                    let t0 = pagewire::time();
                    once(&mut mapping, off);
                    t += pagewire::time() - t0;
                }
                (t / reps as f64 / 2.0 * 1e6, reps, 2 * reps)
            }
            Kernel::Stream => {
                let rounds = reps.div_ceil(window).max(1);
                let t0 = pagewire::time();
                for _ in 0..rounds {
                    stream_once(&peer, me, &mut bufs, size);
                }
                let msgs = rounds * window;
                ((pagewire::time() - t0) / msgs as f64 * 1e6, msgs, msgs)
            }
        };
        let mine = RowCounters::now(u).zip(before, u64::wrapping_sub);
        if me == 0 {
            let mut theirs = [0u64; RowCounters::N];
            peer.receive_into(&mut theirs[..]);
            rows.push(Row {
                bytes: size,
                repetitions,
                t_usec: t,
                mbytes_per_sec: if t > 0.0 { size as f64 / t } else { 0.0 },
                counters: RowCounters {
                    messages: messages as u64,
                    ..mine.zip(RowCounters::from_array(theirs), u64::wrapping_add)
                },
            });
        } else {
            peer.send(&mine.to_array()[..]);
        }
    }
    rows
}

/// Resident and pinned bytes (VmRSS, VmLck) of ranks 0 and 1 after moving 64 MiB back and
/// forth through the first 64 MiB of a 1 GiB anonymous buffer (mapped, never touched
/// otherwise), as Lesokhin17 section 6.1 compares them.
pub fn footprint(world: &SimpleCommunicator) -> Option<[(u64, u64); 2]> {
    const BIG: usize = 1 << 30;
    const USED: usize = 64 << 20;
    let me = world.rank();
    if me > 1 {
        return None;
    }
    let peer = world.process_at_rank(1 - me);
    let mut big = pagewire::sys::AnonMapping::new(BIG).expect("mmap of 1 GiB");
    let mem = big.as_mut_slice();
    for _ in 0..3 {
        pingpong_once(&peer, me, &mut mem[..USED]);
    }
    let (lck, rss) = pagewire::sys::vm_locked_and_resident().expect("/proc/self/status");
    let mine = [rss, lck];
    let mut theirs = [0u64; 2];
    if me == 0 {
        peer.receive_into(&mut theirs[..]);
        Some([(mine[0], mine[1]), (theirs[0], theirs[1])])
    } else {
        peer.send(&mine[..]);
        None
    }
}

fn pingpong_once(peer: &pagewire::Process<'_>, me: i32, buf: &mut [u8]) {
    if me == 0 {
        peer.send(&*buf);
        peer.receive_into(buf);
    } else {
        peer.receive_into(&mut *buf);
        peer.send(&*buf);
    }
}

/// [`pingpong_once`] on the message layer: the calls `Process::send` and `receive_into` make
/// beneath the API, on the world communicator's context (0) and tag 0.
fn pingpong_message_layer(p2p: &mut pagewire::msg::PointToPoint, me: usize, buf: &mut [u8]) {
    let peer = 1 - me;
    let fail = |e| panic!("pw-msgperf: the message layer failed: {e}");
    if me == 0 {
        p2p.send(peer, 0, 0, buf).unwrap_or_else(fail);
        p2p.recv(Some(peer), Some(0), 0, buf).unwrap_or_else(fail);
    } else {
        p2p.recv(Some(peer), Some(0), 0, buf).unwrap_or_else(fail);
        p2p.send(peer, 0, 0, buf).unwrap_or_else(fail);
    }
}

fn sync_pair(peer: &pagewire::Process<'_>, me: i32) {
    let mut b = [0u8; 1];
    if me == 0 {
        peer.send(&b[..]);
        peer.receive_into(&mut b[..]);
    } else {
        peer.receive_into(&mut b[..]);
        peer.send(&b[..]);
    }
}

fn stream_once(peer: &pagewire::Process<'_>, me: i32, bufs: &mut [Vec<u8>], size: usize) {
    request::scope(|scope| {
        let reqs: Vec<_> = if me == 0 {
            bufs.iter()
                .map(|b| peer.immediate_send(scope, &b[..size]))
                .collect()
        } else {
            bufs.iter_mut()
                .map(|b| peer.immediate_receive_into(scope, &mut b[..size]))
                .collect()
        };
        request::wait_all(reqs);
    });
    // One acknowledgement per window, so the sender cannot run ahead.
    let mut ack = [0u8; 1];
    if me == 0 {
        peer.receive_into(&mut ack[..]);
    } else {
        peer.send(&ack[..]);
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
    use super::*;

    #[test]
    fn repetitions_follow_imb() {
        assert_eq!(imb_repetitions(0), 1000);
        assert_eq!(imb_repetitions(32768), 1000);
        assert_eq!(imb_repetitions(65536), 640);
        assert_eq!(imb_repetitions(4 << 20), 10);
        assert_eq!(msglog_sizes(0, 2), vec![0, 1, 2, 4]);
    }

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

    #[test]
    fn buffer_sequences_cycle_or_follow_zipf() {
        assert_eq!(
            buffer_sequence(Pattern::Cyclic, 3, 7),
            vec![0, 1, 2, 0, 1, 2, 0]
        );
        let z = buffer_sequence(Pattern::Zipf, 100, 20_000);
        assert_eq!(
            z,
            buffer_sequence(Pattern::Zipf, 100, 20_000),
            "deterministic"
        );
        assert!(z.iter().all(|&k| k < 100));
        let count = |k| z.iter().filter(|&&x| x == k).count() as f64;
        // Zipf(1) over 100: P(0) = 1/H(100) = 0.193, P(1) = 0.096.
        assert!((count(0) / 20_000.0 - 0.193).abs() < 0.02, "{}", count(0));
        assert!((count(0) / count(1) - 2.0).abs() < 0.3);
        assert_eq!(buffer_sequence(Pattern::Zipf, 1, 3), vec![0, 0, 0]);
    }
}
