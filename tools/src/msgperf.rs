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
    /// Resident and pinned memory after using 64 MiB of a 1 GiB buffer (seed 000 §6.1).
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

/// Runs `kernel` for every size on ranks 0 and 1 of `world` (others wait in a barrier-like
/// receive, as IMB's PingPong does). Returns the rows on rank 0.
///
/// `off_cache`: when set, every repetition uses the next buffer of a span of that many bytes
/// (IMB's `-off_cache`), so buffers are cold in the CPU caches and, what matters for
/// `pindown`, new to the registration cache until the span has been cycled through.
pub fn run(
    world: &SimpleCommunicator,
    kernel: Kernel,
    sizes: &[usize],
    iters: Option<usize>,
    window: usize,
    off_cache: Option<usize>,
) -> Vec<Row> {
    let me = world.rank();
    let mut rows = Vec::new();
    let max = sizes.iter().copied().max().unwrap_or(0);
    let span = off_cache.map_or(max.max(1), |s| s.max(max).max(1) + max);
    let mut buf = vec![0u8; span];
    let mut bufs: Vec<Vec<u8>> = if kernel == Kernel::Stream {
        (0..window).map(|_| vec![0u8; max.max(1)]).collect()
    } else {
        Vec::new()
    };
    for &size in sizes {
        let reps = iters.unwrap_or_else(|| imb_repetitions(size));
        if me > 1 {
            continue;
        }
        let peer = world.process_at_rank(1 - me);
        // Buffer `i` of the rotation (page-aligned steps), or always the first.
        let step = size.div_ceil(4096).max(1) * 4096;
        let nbuf = off_cache.map_or(1, |s| (s / step).max(1));
        let at = |i: usize| (i % nbuf) * step;
        // Warm-up, as IMB does before each size.
        for i in 0..reps.min(10) {
            let o = at(i);
            pingpong_once(&peer, me, &mut buf[o..o + size]);
        }
        sync_pair(&peer, me);
        let row = match kernel {
            Kernel::Footprint => continue,
            Kernel::Pingpong => {
                let t0 = pagewire::time();
                for i in 0..reps {
                    let o = at(i + 10);
                    pingpong_once(&peer, me, &mut buf[o..o + size]);
                }
                let t = (pagewire::time() - t0) / reps as f64 / 2.0 * 1e6;
                Row {
                    bytes: size,
                    repetitions: reps,
                    t_usec: t,
                    mbytes_per_sec: if t > 0.0 { size as f64 / t } else { 0.0 },
                }
            }
            Kernel::Stream => {
                let _ = at;
                let rounds = reps.div_ceil(window).max(1);
                let t0 = pagewire::time();
                for _ in 0..rounds {
                    stream_once(&peer, me, &mut bufs, size);
                }
                let msgs = rounds * window;
                let t = (pagewire::time() - t0) / msgs as f64 * 1e6;
                Row {
                    bytes: size,
                    repetitions: msgs,
                    t_usec: t,
                    mbytes_per_sec: if t > 0.0 { size as f64 / t } else { 0.0 },
                }
            }
        };
        if me == 0 {
            rows.push(row);
        }
    }
    rows
}

/// Resident and pinned bytes (VmRSS, VmLck) of ranks 0 and 1 after moving 64 MiB back and
/// forth through the first 64 MiB of a 1 GiB anonymous buffer (mapped, never touched
/// otherwise), as seed 000 section 6.1 compares them.
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
}
