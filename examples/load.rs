//! Load: every rank sends `--messages` messages (10,000 in the full run) of random sizes
//! (log-uniform from 0 B to `--max-size`, 1 MiB by default, so across the eager and the
//! rendezvous range) with random tags to random peers, and receives with wildcards only
//! (any source, any tag): posted nonblocking receives, blocking receives and matched probes.
//! Every received byte is checked, and so is the order: MPI's non-overtaking rule holds per
//! (source, tag) pair, so the n-th message a rank gets from a source with a tag must be the
//! n-th that source sent it with that tag. At the end the per-pair and total counts are
//! compared (nothing lost, nothing duplicated, nothing left over) and rank 0 prints each
//! rank's peak resident memory (`VmHWM`) as min/median/max.
//!
//! The whole plan (who sends what to whom, with which tag) follows from `--seed`, which every
//! rank knows, so each rank knows how many messages it will receive; a message's bytes follow
//! from (seed, source, sequence number, offset). A failed check prints what differed with the
//! seed and ends the rank with status 1; no progress for `--stall` seconds (60) prints the
//! state of the rank and ends it the same way. `--inject corrupt|duplicate|drop` makes rank 0
//! flip a byte of, send twice, or leave out its first non-empty message from the middle of its
//! plan, to show that the checks catch each (`tests/load.rs`).
//!
//! ```sh
//! cargo build --release --bin pwrun --example load
//! PAGEWIRE_MODE=odp target/release/pwrun -n 16 -- target/release/examples/load --messages 10000
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pagewire as mpi;

use mpi::collective::SystemOperation;
use mpi::request;
use mpi::traits::*;

/// Sends in flight per rank at most (and receives posted at most).
const DEFAULT_WINDOW: usize = 8;
/// Tags a message may carry.
const TAGS: [i32; 5] = [0, 1, 2, 77, 30_000];

/// Ends the rank at once with a message: a panic inside a request scope would wait for the
/// scope's requests, which may never complete once the checks have failed.
macro_rules! fail {
    ($($arg:tt)*) => {{
        eprintln!("load: FAILED: {}", format!($($arg)*));
        std::process::exit(1)
    }};
}

struct Args {
    messages: usize,
    seed: u64,
    max_size: usize,
    window: usize,
    stall: Duration,
    inject: Option<Inject>,
}

/// A fault rank 0 puts into its own sends, to show that the checks catch it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inject {
    Corrupt,
    Duplicate,
    Drop,
}

fn usage() -> ! {
    eprintln!(
        "usage: load [--messages N (10000)] [--seed S (1)] [--max-size BYTES (1048576)] \
         [--window W (8)] [--stall SECONDS (60)] [--inject corrupt|duplicate|drop]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        messages: 10_000,
        seed: 1,
        max_size: 1 << 20,
        window: DEFAULT_WINDOW,
        stall: Duration::from_secs(60),
        inject: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> u64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match flag.as_str() {
            "--messages" => a.messages = value() as usize,
            "--seed" => a.seed = value(),
            "--max-size" => a.max_size = value() as usize,
            "--window" => a.window = (value() as usize).max(1),
            "--stall" => a.stall = Duration::from_secs(value()),
            "--inject" => {
                a.inject = Some(match it.next().as_deref() {
                    Some("corrupt") => Inject::Corrupt,
                    Some("duplicate") => Inject::Duplicate,
                    Some("drop") => Inject::Drop,
                    _ => usage(),
                })
            }
            _ => usage(),
        }
    }
    a
}

/// splitmix64's finaliser: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One planned message.
#[derive(Clone, Copy)]
struct Planned {
    dest: u16,
    tag: i32,
    len: u32,
    synchronous: bool,
}

/// What `source` sends, in order, from the shared seed: a destination other than itself,
/// a tag, a length (1 in 32 empty, else log-uniform in 1..=max_size) and 1 in 16 sends
/// synchronous.
fn plan_of(args: &Args, size: usize, source: usize) -> Vec<Planned> {
    let mut rng = Rng(mix(args.seed ^ mix(source as u64 + 1)));
    let log_max = (args.max_size as f64 + 1.0).log2();
    (0..args.messages)
        .map(|_| {
            let mut dest = rng.below(size as u64 - 1) as usize;
            if dest >= source {
                dest += 1;
            }
            let tag = TAGS[rng.below(TAGS.len() as u64) as usize];
            let len = if args.max_size == 0 || rng.below(32) == 0 {
                0
            } else {
                ((rng.unit() * log_max).exp2() as usize).clamp(1, args.max_size)
            };
            Planned {
                dest: dest as u16,
                tag,
                len: len as u32,
                synchronous: rng.below(16) == 0,
            }
        })
        .collect()
}

/// The key of message `seq` of `source`: its bytes are a function of the key and the offset.
fn key_of(seed: u64, source: usize, seq: usize) -> u64 {
    mix(seed ^ mix(((source as u64) << 40) ^ seq as u64 ^ 0x5bd1_e995))
}

fn word(key: u64, k: usize) -> [u8; 8] {
    mix(key.wrapping_add((k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))).to_le_bytes()
}

fn fill(buf: &mut [u8], key: u64) {
    for (k, chunk) in buf.chunks_mut(8).enumerate() {
        let w = word(key, k);
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// The first offset where `buf` is not the bytes of `key`.
fn first_difference(buf: &[u8], key: u64) -> Option<usize> {
    buf.chunks(8).enumerate().find_map(|(k, chunk)| {
        let w = word(key, k);
        (chunk != &w[..chunk.len()])
            .then(|| 8 * k + chunk.iter().zip(w).position(|(a, b)| *a != b).unwrap_or(0))
    })
}

/// The receiving side's book: per (source, tag), the messages still to come, in the order
/// the source sends them.
struct Checker {
    me: usize,
    seed: u64,
    expected: Vec<Vec<VecDeque<(usize, usize)>>>,
    remaining: usize,
    received_from: Vec<u64>,
    received_bytes: u64,
}

impl Checker {
    fn new(me: usize, seed: u64, plans: &[Vec<Planned>]) -> Checker {
        let mut expected = vec![vec![VecDeque::new(); TAGS.len()]; plans.len()];
        let mut remaining = 0;
        for (source, plan) in plans.iter().enumerate() {
            for (seq, m) in plan.iter().enumerate() {
                if m.dest as usize == me {
                    let t = TAGS.iter().position(|&t| t == m.tag).unwrap();
                    expected[source][t].push_back((seq, m.len as usize));
                    remaining += 1;
                }
            }
        }
        Checker {
            me,
            seed,
            expected,
            remaining,
            received_from: vec![0; plans.len()],
            received_bytes: 0,
        }
    }

    /// Checks one received message: `how` it was received, its status and its bytes.
    fn check(&mut self, how: &str, status: mpi::Status, data: &[u8]) {
        let (me, seed) = (self.me, self.seed);
        let source = status.source_rank();
        let tag = status.tag();
        let count = status.count_bytes();
        let Some(t) = TAGS.iter().position(|&x| x == tag) else {
            fail!("rank {me} ({how}): a message from {source} with tag {tag}, which no rank sends (seed {seed})")
        };
        if source < 0 || source as usize >= self.expected.len() {
            fail!("rank {me} ({how}): a message from rank {source} (seed {seed})");
        }
        let source = source as usize;
        let Some((seq, len)) = self.expected[source][t].pop_front() else {
            fail!(
                "rank {me} ({how}): one message too many from rank {source} with tag {tag} \
                 ({count} bytes): duplicated or misdelivered (seed {seed})"
            )
        };
        if count != len {
            fail!(
                "rank {me} ({how}): from rank {source} tag {tag}: expected message #{seq} of \
                 {len} bytes, got {count} bytes: lost, reordered or duplicated (seed {seed})"
            );
        }
        if let Some(at) = first_difference(&data[..count], key_of(seed, source, seq)) {
            fail!(
                "rank {me} ({how}): from rank {source} tag {tag}: message #{seq} of {len} \
                 bytes differs at offset {at} (seed {seed})"
            );
        }
        self.remaining -= 1;
        self.received_from[source] += 1;
        self.received_bytes += count as u64;
    }

    /// The next expected message of every pair still waiting, for a stall report.
    fn waiting(&self) -> String {
        let mut out = Vec::new();
        for (s, tags) in self.expected.iter().enumerate() {
            for (t, q) in tags.iter().enumerate() {
                if let Some((seq, len)) = q.front() {
                    out.push(format!(
                        "from {s} tag {}: #{seq} ({len} B) and {} more",
                        TAGS[t],
                        q.len() - 1
                    ));
                }
            }
        }
        out.join("; ")
    }
}

/// This process's `NAME:` line of /proc/self/status, in KiB.
fn proc_status_kib(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn summary(kib: &mut [u64]) -> String {
    kib.sort_unstable();
    let mib = |k: u64| k as f64 / 1024.0;
    format!(
        "min={:.1} median={:.1} max={:.1} MiB",
        mib(kib[0]),
        mib(kib[kib.len() / 2]),
        mib(kib[kib.len() - 1])
    )
}

fn main() {
    let args = parse_args();
    let universe = mpi::initialize().unwrap();
    let world = universe.world();
    let (me, size) = (world.rank() as usize, world.size() as usize);
    if size < 2 {
        fail!("needs at least 2 ranks");
    }
    if size > u16::MAX as usize || args.max_size > u32::MAX as usize {
        usage();
    }
    let mode = universe.mode_name();
    let hwm_start = proc_status_kib("VmHWM");
    if me == 0 {
        println!(
            "load: mode={mode} ranks={size} messages={} seed={} max_size={} window={}",
            args.messages, args.seed, args.max_size, args.window
        );
    }

    let plans: Vec<Vec<Planned>> = (0..size).map(|s| plan_of(&args, size, s)).collect();
    let mine = &plans[me];
    let mut checker = Checker::new(me, args.seed, &plans);
    let mut sent_to = vec![0u64; size];
    let mut sent_bytes = 0u64;

    let mut send_pool: Vec<Vec<u8>> = (0..args.window).map(|_| vec![0u8; args.max_size]).collect();
    let mut recv_pool: Vec<Vec<u8>> = (0..args.window).map(|_| vec![0u8; args.max_size]).collect();
    let mut scratch = vec![0u8; args.max_size];
    let mut next_send = 0usize;
    let mut drains = 0u64;
    let mut cancelled = 0u64;
    let mut last_progress = Instant::now();
    let victim = match args.inject {
        Some(_) if me == 0 => (mine.len() / 2..mine.len()).find(|&i| mine[i].len > 0),
        _ => None,
    };

    world.barrier();
    let start = Instant::now();
    // Rounds: each starts up to `window` sends from the send pool and posts up to `window`
    // wildcard receives into the receive pool, then polls. Posted receives are completed in
    // the order they were posted (the order they match in); while none is posted the rank
    // takes what arrives with blocking wildcard receives and matched probes, so it never
    // stops receiving while its own sends wait for receivers. A round ends when its sends are
    // done: receives still posted then are cancelled (last posted first, so the ones that
    // matched are a prefix) if the rank has more to send, else waited for. Waiting for them
    // while sends are left could deadlock: every rank waiting for messages nobody sends.
    while next_send < mine.len() || checker.remaining > 0 {
        request::scope(|scope| {
            let mut sends = Vec::new();
            for buf in send_pool.iter_mut() {
                let Some(m) = mine.get(next_send) else { break };
                let buf = &mut buf[..m.len as usize];
                fill(buf, key_of(args.seed, me, next_send));
                let injected = victim == Some(next_send);
                if injected && args.inject == Some(Inject::Corrupt) {
                    buf[buf.len() / 2] ^= 1;
                }
                let buf: &[u8] = buf;
                let to = world.process_at_rank(m.dest as i32);
                if injected && args.inject == Some(Inject::Drop) {
                    next_send += 1;
                    continue;
                }
                if injected && args.inject == Some(Inject::Duplicate) {
                    sends.push(to.immediate_send_with_tag(scope, buf, m.tag));
                }
                sends.push(if m.synchronous {
                    to.immediate_synchronous_send_with_tag(scope, buf, m.tag)
                } else {
                    to.immediate_send_with_tag(scope, buf, m.tag)
                });
                sent_to[m.dest as usize] += 1;
                sent_bytes += m.len as u64;
                next_send += 1;
            }
            let mut recvs = VecDeque::new();
            for buf in recv_pool.iter_mut().take(checker.remaining) {
                recvs.push_back(
                    world
                        .any_process()
                        .immediate_receive_into(scope, &mut buf[..]),
                );
            }
            while !sends.is_empty() || !recvs.is_empty() {
                let mut progressed = false;
                while let Some(front) = recvs.pop_front() {
                    match front.test_with_data() {
                        Ok((status, data)) => {
                            checker.check("posted receive", status, data);
                            progressed = true;
                        }
                        Err(front) => {
                            recvs.push_front(front);
                            break;
                        }
                    }
                }
                if recvs.is_empty() && checker.remaining > 0 {
                    let any = world.any_process();
                    if any.immediate_probe().is_some() {
                        drains += 1;
                        if drains % 2 == 0 {
                            let status = any.receive_into(&mut scratch[..]);
                            checker.check("blocking receive", status, &scratch);
                        } else if let Some((msg, status)) = any.immediate_matched_probe() {
                            let buf = &mut scratch[..status.count_bytes()];
                            let got = msg.matched_receive_into(buf);
                            if got.source_rank() != status.source_rank()
                                || got.tag() != status.tag()
                                || got.count_bytes() != status.count_bytes()
                            {
                                fail!(
                                    "rank {me}: a matched probe said {status:?}, its receive \
                                     got {got:?} (seed {})",
                                    args.seed
                                );
                            }
                            checker.check("matched probe", got, buf);
                        }
                        progressed = true;
                    }
                }
                let before = sends.len();
                sends = sends.into_iter().filter_map(|r| r.test().err()).collect();
                progressed |= sends.len() != before;
                if sends.is_empty() && next_send < mine.len() && !recvs.is_empty() {
                    for r in recvs.iter().rev() {
                        r.cancel();
                    }
                    let mut cancelled_before = false;
                    for mut r in recvs.drain(..) {
                        let (status, data) = loop {
                            match r.test_with_data() {
                                Ok(done) => break done,
                                Err(again) => r = again,
                            }
                        };
                        if status.is_cancelled() {
                            cancelled += 1;
                            cancelled_before = true;
                        } else if cancelled_before {
                            fail!(
                                "rank {me}: a receive matched {status:?} after an earlier \
                                 posted one was cancelled (seed {})",
                                args.seed
                            );
                        } else {
                            checker.check("posted receive, cancel refused", status, data);
                        }
                    }
                    progressed = true;
                }
                if progressed {
                    last_progress = Instant::now();
                } else {
                    if last_progress.elapsed() > args.stall {
                        fail!(
                            "rank {me}: no progress for {} s: {next_send} of {} sent ({} not \
                             completed), {} still to receive ({} receives posted); waiting \
                             for {} (seed {})",
                            args.stall.as_secs(),
                            mine.len(),
                            sends.len(),
                            checker.remaining,
                            recvs.len(),
                            checker.waiting(),
                            args.seed
                        );
                    }
                    // 16 ranks share 2 cores here: an idle poll gives the CPU away.
                    std::thread::yield_now();
                }
            }
        });
    }
    let seconds = start.elapsed().as_secs_f64();
    world.barrier();

    // Nothing may be left over once everyone has sent and received everything.
    for _ in 0..100 {
        if let Some(s) = world.any_process().immediate_probe() {
            fail!(
                "rank {me}: a message left over after the load: {s:?} (seed {})",
                args.seed
            );
        }
        std::thread::yield_now();
    }

    // Per pair: what each source says it sent me is what I received from it, and the plan.
    let mut sent_to_me = vec![0u64; size];
    world.all_to_all_into(&sent_to[..], &mut sent_to_me[..]);
    for s in 0..size {
        let planned = plans[s].iter().filter(|m| m.dest as usize == me).count() as u64;
        if sent_to_me[s] != checker.received_from[s] || sent_to_me[s] != planned {
            fail!(
                "rank {me}: from rank {s}: {} sent, {} received, {planned} planned (seed {})",
                sent_to_me[s],
                checker.received_from[s],
                args.seed
            );
        }
    }
    let counters = universe.try_with_p2p(|p| p.counters()).ok();
    let mine_totals = [
        next_send as u64,
        checker.received_from.iter().sum::<u64>(),
        sent_bytes,
        checker.received_bytes,
        counters.as_ref().map_or(0, |c| c.eager_sent),
        counters.as_ref().map_or(0, |c| c.rndv_sent),
        counters.as_ref().map_or(0, |c| c.unexpected),
        drains,
        cancelled,
    ];
    let mut totals = [0u64; 9];
    world.all_reduce_into(&mine_totals[..], &mut totals[..], SystemOperation::sum());
    let [sent, received, bytes_sent, bytes_received, eager, rndv, unexpected, drained, cancels] =
        totals;
    if sent != received || bytes_sent != bytes_received || sent != (size * args.messages) as u64 {
        fail!(
            "rank {me}: {sent} messages ({bytes_sent} B) sent, {received} ({bytes_received} B) \
             received, {} planned (seed {})",
            size * args.messages,
            args.seed
        );
    }
    let mut slowest = 0f64;
    world.all_reduce_into(&seconds, &mut slowest, SystemOperation::max());

    // Peak resident memory at start-up and at the end; resident anonymous and shared memory
    // (the soft NIC's rings and tables) at the end.
    let memory = [
        hwm_start,
        proc_status_kib("VmHWM"),
        proc_status_kib("RssAnon"),
        proc_status_kib("RssShmem"),
    ];
    let root = world.process_at_rank(0);
    if me == 0 {
        let mut all = vec![0u64; memory.len() * size];
        root.gather_into_root(&memory[..], &mut all[..]);
        let column =
            |i: usize| -> Vec<u64> { all.iter().skip(i).step_by(memory.len()).copied().collect() };
        let per_rank = column(1)
            .iter()
            .map(|k| (k / 1024).to_string())
            .collect::<Vec<_>>()
            .join(",");
        println!(
            "load: mode={mode} ranks={size} messages={} seed={} sent={sent} received={received} \
             bytes={bytes_sent} eager={eager} rendezvous={rndv} unexpected={unexpected} \
             drained={drained} cancelled={cancels} seconds={slowest:.1} ok",
            args.messages, args.seed
        );
        println!(
            "load: mode={mode} peak resident memory per rank (VmHWM) {}; after start-up {}; \
             per rank MiB: {per_rank}",
            summary(&mut column(1)),
            summary(&mut column(0))
        );
        println!(
            "load: mode={mode} resident at the end: anonymous {}; shared {}",
            summary(&mut column(2)),
            summary(&mut column(3))
        );
    } else {
        root.gather_into(&memory[..]);
    }
}
