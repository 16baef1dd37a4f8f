//! The measurement loop of b_eff 3.6: every repetition runs every message length, every
//! pattern and every method, with loop lengths chosen so that one length and method takes
//! about `time_per_loop` seconds summed over the patterns.
//!
//! How it follows b_eff:
//!
//! - **Loop lengths** are decided by rank 0 and broadcast. Each repetition starts with a
//!   trial pass at 1 byte with 10 loops; from its time `max_loops = 10 · time_per_loop /
//!   t` and the 1-byte loop length is `max_loops / 2`. Each following length takes the
//!   previous loop length divided by the length's growth (2, or the geometric factor),
//!   times `max(1, time_per_loop / t_previous)`, between 1 and `max_loops`.
//! - **The two largest lengths are shortened** when the expected time of both exceeds
//!   `max_for_last_two` (60 s; 1 s with `--test`): they then use only the method that was
//!   best at the length before, with one loop, and the largest only in 2 repetitions; that
//!   method's result is copied to the others (b_eff's CAUTION note).
//! - **Timing:** a barrier before each pattern and method; one untimed loop first below
//!   the 18th length; `bandwidth = length · loops · exchanges / time` per process, where
//!   exchanges are this process's sendrecv calls in the pattern. Processes outside a pattern
//!   report infinity, so the minimum over processes is over those that took part.
//! - **Buffers:** a send and a receive buffer of `6 · (Lmax + 16)` bytes each; every message
//!   uses the next 8-byte-aligned slot, wrapping round, so consecutive messages touch
//!   different memory (which a pin-down cache and ODP notice).
//! - **Data check:** as in b_eff, the first and last byte of every message are checked; with
//!   `verify` every byte is (and the receive area is overwritten before each receive).
//!
//! Where it differs: the Alltoallv method packs the blocks in rank order (displacements
//! are the prefix sums of the counts), so it sends the messages of a loop from one
//! contiguous window (the same memory b_eff would use, without the 8-byte padding between
//! the two blocks). The facade has no `send_receive` call, so Sendrecv is an immediate
//! receive, a blocking send and a wait, which is how MPI libraries implement it.

mod buffers;
mod runner;

use pagewire::traits::*;
use pagewire::{SystemOperation, Universe};
use pagewire_tools::msgperf::RowCounters;

use crate::analysis::{Bandwidths, METHODS};
use crate::lengths::MESSAGE_LENGTHS;
use crate::patterns::Pattern;
use crate::Result;

pub use buffers::message_byte;
use buffers::Buffers;
use runner::Runner;

/// Repetitions of the largest length when the last two are shortened.
const MIN_REPETITIONS: usize = 2;
/// Untimed loops before the timed ones.
const PRE_LOOPS: usize = 1;
/// The untimed loops run below this length index.
const WITH_PRELOOPS: usize = 18;
/// The shortest loop.
const MIN_LOOPS: u64 = 1;
/// Loops of the trial pass at 1 byte.
const PRE_MSG_LOOPS: u64 = 10;
/// Message slots per loop the buffers are sized for (b_eff's `MAXSR`).
const MAX_EXCHANGES: usize = 6;

/// A transfer method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `MPI_Sendrecv` per exchange (plain send or receive where one side is absent).
    Sendrecv,
    /// One `MPI_Alltoallv` per loop with the pattern's counts.
    Alltoallv,
    /// `MPI_Irecv` + `MPI_Isend` per exchange, then `MPI_Waitall`.
    Nonblocking,
}

impl Method {
    /// The three, in b_eff's order (its method numbers 0, 1, 2).
    pub const ALL: [Method; METHODS] = [Method::Sendrecv, Method::Alltoallv, Method::Nonblocking];

    /// b_eff's short label.
    pub fn label(self) -> &'static str {
        match self {
            Method::Sendrecv => "Sndrcv",
            Method::Alltoallv => "Alltoal",
            Method::Nonblocking => "non-blk",
        }
    }
}

/// How long and how carefully to measure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// Repetitions of the whole measurement (3; 2 with `--short`).
    pub repetitions: usize,
    /// Target seconds per length and method, summed over patterns (0.5; 0.05 with
    /// `--short`; 0.005 with `--test`).
    pub time_per_loop: f64,
    /// Longest expected time of the two largest lengths before they are shortened (60 s;
    /// 1 s with `--test`).
    pub max_for_last_two: f64,
    /// Whether the two largest lengths may be shortened at all.
    pub shorten_last_two: bool,
    /// Check every byte of every message, not only the first and last.
    pub verify: bool,
}

/// What the measurement loop leaves on rank 0.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// Minimum over processes of each bandwidth (rank 0; other ranks hold their own).
    pub min_bw: Bandwidths,
    /// Loop lengths decided by rank 0: `[length][repetition][method]`.
    pub loop_lengths: Vec<Vec<[u64; METHODS]>>,
    /// Whether the two largest lengths were shortened in any repetition.
    pub shortened: bool,
    /// Seconds of the measurement loop (maximum over processes).
    pub elapsed: f64,
    /// Messages checked, all processes.
    pub messages_checked: u64,
    /// Per length: what the buffer mode and NIC did, summed over processes (pagewire's
    /// transport only).
    pub counters: Option<Vec<RowCounters>>,
}

/// The loop length of the first length after the trial pass took `trial_time` seconds for
/// `PRE_MSG_LOOPS` loops: `(max_loops, loops)`.
pub fn first_loop_length(trial_time: f64, time_per_loop: f64) -> (u64, u64) {
    let max_loops = if trial_time > 0.0 {
        ((PRE_MSG_LOOPS as f64 * (time_per_loop / trial_time)) as u64).max(PRE_MSG_LOOPS)
    } else {
        PRE_MSG_LOOPS
    };
    (max_loops, max_loops / 2)
}

/// The loop length of the next length: the previous one divided by the length's growth
/// `step`, stretched by `time_per_loop / previous_time` when that was short, between
/// `MIN_LOOPS` and `max_loops` (kept if the previous time is 0).
pub fn next_loop_length(
    previous_loops: u64,
    previous_time: f64,
    step: f64,
    time_per_loop: f64,
    max_loops: u64,
) -> u64 {
    if previous_time <= 0.0 {
        return previous_loops;
    }
    let scaled = previous_loops as f64 / step * (time_per_loop / previous_time).max(1.0);
    (scaled.min(max_loops as f64) as u64).max(MIN_LOOPS)
}

/// Runs the measurement loop on every process of `universe`'s world.
pub fn measure(
    universe: &Universe,
    patterns: &[Pattern],
    lengths: &[usize; MESSAGE_LENGTHS],
    factor: f64,
    settings: &Settings,
) -> Result<Measurement> {
    let world = universe.world();
    let me = world.rank() as usize;
    let root = world.process_at_rank(0);
    let npat = patterns.len();
    let reps = settings.repetitions;
    let lmax = lengths[MESSAGE_LENGTHS - 1];
    let buffer_len = (lmax + 16) * MAX_EXCHANGES;
    let mut runner = Runner {
        universe,
        world: universe.world(),
        me,
        buffers: Buffers {
            send: vec![0; buffer_len],
            recv: vec![0; buffer_len],
            next: 0,
            verify: settings.verify,
            checked: 0,
        },
    };
    let mut bw = Bandwidths::new(reps, npat);
    // measure[rep][pat][msg][method]
    let mut measured = vec![vec![[[true; METHODS]; MESSAGE_LENGTHS]; npat]; reps];
    for (pat, p) in patterns.iter().enumerate() {
        if p.sendrecv_only() {
            for rep in measured.iter_mut() {
                for msg in rep[pat].iter_mut() {
                    msg[1] = false;
                    msg[2] = false;
                }
            }
        }
    }
    let mut best_method: Vec<Vec<Option<usize>>> = vec![vec![None; npat]; reps];
    let mut loop_lengths = vec![vec![[0u64; METHODS]; reps]; MESSAGE_LENGTHS];
    let mut comm_times = vec![vec![[0f64; METHODS]; reps]; MESSAGE_LENGTHS];
    let mut min_looptimes = vec![vec![[f64::INFINITY; METHODS]; reps]; MESSAGE_LENGTHS];
    let mut repetitions = [reps; MESSAGE_LENGTHS];
    let mut max_loops = [PRE_MSG_LOOPS; METHODS];
    let mut shortened = false;
    let mut counters = vec![RowCounters::default(); MESSAGE_LENGTHS];
    let mut messages = [0u64; MESSAGE_LENGTHS];

    world.try_barrier()?;
    let all_begin = pagewire::time();
    for rep in 0..reps {
        let mut trial = true;
        let mut msg = 0;
        while msg < MESSAGE_LENGTHS {
            if rep >= repetitions[msg] {
                for pat in 0..npat {
                    for m in 0..METHODS {
                        let v = bw.get(0, pat, msg, m);
                        bw.set(rep, pat, msg, m, v);
                    }
                }
                msg += 1;
                continue;
            }
            let before = runner.counters();
            let len = lengths[msg];
            if me == 0 {
                for m in 0..METHODS {
                    let loops = if msg == 0 && trial {
                        PRE_MSG_LOOPS
                    } else if msg == 0 {
                        let (max, loops) =
                            first_loop_length(comm_times[0][rep][m], settings.time_per_loop);
                        max_loops[m] = max;
                        loops
                    } else {
                        let step = if msg <= crate::lengths::MAX_FACT_2 {
                            2.0
                        } else {
                            factor
                        };
                        let mut loops = next_loop_length(
                            loop_lengths[msg - 1][rep][m],
                            comm_times[msg - 1][rep][m],
                            step,
                            settings.time_per_loop,
                            max_loops[m],
                        );
                        if settings.shorten_last_two && msg == MESSAGE_LENGTHS - 2 {
                            let expected = min_looptimes[msg - 1][rep][m]
                                * npat as f64
                                * 4.0
                                * (factor + factor * factor)
                                * reps as f64
                                * METHODS as f64
                                / loop_lengths[msg - 1][rep][m].max(1) as f64;
                            if expected > settings.max_for_last_two {
                                loops = 0;
                            }
                        }
                        loops
                    };
                    loop_lengths[msg][rep][m] = loops;
                }
            }
            root.try_broadcast_into(&mut loop_lengths[msg][rep][..])?;
            let min_loops = loop_lengths[msg][rep]
                .iter()
                .copied()
                .fold(PRE_MSG_LOOPS, u64::min);
            if min_loops == 0 {
                // The two largest lengths: only the method best at the length before, one
                // loop; the largest only in MIN_REPETITIONS repetitions.
                shortened = true;
                let mut best = vec![0i64; npat];
                if me == 0 {
                    for (pat, b) in best.iter_mut().enumerate() {
                        let previous = |m: usize| bw.get(rep, pat, msg - 1, m);
                        let candidates = (1..METHODS).filter(|&m| measured[rep][pat][msg - 1][m]);
                        *b = candidates.fold(0, |best, m| {
                            if previous(m) >= previous(best) {
                                m
                            } else {
                                best
                            }
                        }) as i64;
                    }
                }
                root.try_broadcast_into(&mut best[..])?;
                repetitions[msg + 1] = MIN_REPETITIONS;
                let last_runs = rep < repetitions[msg + 1];
                loop_lengths[msg][rep] = [1; METHODS];
                loop_lengths[msg + 1][rep] = [u64::from(last_runs); METHODS];
                for (pat, &b) in best.iter().enumerate() {
                    let b = b as usize;
                    best_method[rep][pat] = Some(b);
                    measured[rep][pat][msg] = std::array::from_fn(|m| m == b);
                    measured[rep][pat][msg + 1] = std::array::from_fn(|m| m == b && last_runs);
                }
            }
            for (pat, p) in patterns.iter().enumerate() {
                let exchanges = &p.exchanges[me];
                for (m, &method) in Method::ALL.iter().enumerate() {
                    if !measured[rep][pat][msg][m] {
                        continue;
                    }
                    runner.world.try_barrier()?;
                    let loops = loop_lengths[msg][rep][m] as usize;
                    if exchanges.is_empty() || loops == 0 {
                        bw.set(rep, pat, msg, m, f64::INFINITY);
                        continue;
                    }
                    let pre = if msg < WITH_PRELOOPS { PRE_LOOPS } else { 0 };
                    let t = runner.run(method, exchanges, len, msg, pre, loops)?;
                    let sent = exchanges.iter().filter(|e| e.send_to.is_some()).count();
                    messages[msg] += ((pre + loops) * sent) as u64;
                    comm_times[msg][rep][m] += t;
                    min_looptimes[msg][rep][m] = min_looptimes[msg][rep][m].min(t);
                    let v = if t > 0.0 {
                        (len * loops * exchanges.len()) as f64 / t
                    } else {
                        f64::INFINITY
                    };
                    bw.set(rep, pat, msg, m, v);
                }
                if let Some(b) = best_method[rep][pat] {
                    let v = bw.get(rep, pat, msg, b);
                    for m in 0..METHODS {
                        bw.set(rep, pat, msg, m, v);
                    }
                }
            }
            for t in min_looptimes[msg][rep].iter_mut() {
                if t.is_infinite() {
                    *t = 0.0;
                }
            }
            if let (Some(before), Some(after)) = (before, runner.counters()) {
                let delta = after.zip(before, u64::wrapping_sub);
                counters[msg] = counters[msg].zip(delta, u64::wrapping_add);
            }
            if trial {
                trial = false;
            } else {
                msg += 1;
            }
        }
    }
    let elapsed_here = pagewire::time() - all_begin;

    // Reductions to rank 0: the slowest process per measurement, the longest loop.
    let mut min_bw = Bandwidths::new(reps, npat);
    let mut elapsed = [0f64];
    // Per length the counters with this process's own message count, then the number of
    // messages checked.
    const N: usize = RowCounters::N;
    let mut sums = vec![0u64; MESSAGE_LENGTHS * N + 1];
    let mine: Vec<u64> = counters
        .iter()
        .zip(messages)
        .flat_map(|(c, messages)| RowCounters { messages, ..*c }.to_array())
        .chain([runner.buffers.checked])
        .collect();
    if me == 0 {
        root.try_reduce_into_root(
            &bw.values[..],
            &mut min_bw.values[..],
            SystemOperation::min(),
        )?;
        root.try_reduce_into_root(
            &[elapsed_here][..],
            &mut elapsed[..],
            SystemOperation::max(),
        )?;
        root.try_reduce_into_root(&mine[..], &mut sums[..], SystemOperation::sum())?;
    } else {
        root.try_reduce_into(&bw.values[..], SystemOperation::min())?;
        root.try_reduce_into(&[elapsed_here][..], SystemOperation::max())?;
        root.try_reduce_into(&mine[..], SystemOperation::sum())?;
        min_bw = bw;
    }
    let counters = runner.counters().map(|_| {
        sums.chunks_exact(N)
            .map(|c| RowCounters::from_array(c.try_into().expect("N counters")))
            .collect()
    });
    Ok(Measurement {
        min_bw,
        loop_lengths,
        shortened,
        elapsed: elapsed[0],
        messages_checked: sums[MESSAGE_LENGTHS * N],
        counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_lengths_follow_the_time_budget() {
        // Trial: 10 loops took 1 ms of a 50 ms budget -> max 500 loops, start with 250.
        assert_eq!(first_loop_length(1e-3, 0.05), (500, 250));
        // A trial slower than the budget still allows 10 loops.
        assert_eq!(first_loop_length(1.0, 0.05), (10, 5));
        // Doubling the length halves the loops, stretched when the last length was quick:
        // 250 / 2 · (0.05 / 0.01) = 625, capped at 500.
        assert_eq!(next_loop_length(250, 0.01, 2.0, 0.05, 500), 500);
        assert_eq!(next_loop_length(250, 0.05, 2.0, 0.05, 500), 125);
        // A slow previous length is not shrunk further than by the step; never below 1.
        assert_eq!(next_loop_length(250, 1.0, 2.0, 0.05, 500), 125);
        assert_eq!(next_loop_length(1, 1.0, 2.0, 0.05, 500), 1);
        assert_eq!(next_loop_length(7, 0.0, 2.0, 0.05, 500), 7);
    }
}
