//! Message-layer benchmarks: IMB's PingPong (half the round trip of a blocking send and
//! receive) and a streaming bandwidth test (a window of nonblocking sends, then one
//! acknowledgement), both printed in IMB PingPong's columns
//! (`#bytes #repetitions t[usec] Mbytes/sec`, MB = 10^6 bytes).

mod report;

use pagewire::request;
use pagewire::traits::*;
use pagewire::SimpleCommunicator;
use serde::Serialize;

pub use report::{print, print_counters, Row, RowCounters, REG_BUCKETS};

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
