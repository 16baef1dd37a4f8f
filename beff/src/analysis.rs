//! From measured bandwidths to b_eff (b_eff 3.6, "analyzing the measurements and computing
//! b_eff").
//!
//! The measurement gives, for every repetition, pattern, message length and method, the
//! bandwidth of the slowest process (`minbw`, bytes/s: bytes it sent / time). The official
//! analysis path is
//!
//! ```text
//! b(pattern, L) = max over methods and repetitions of minbw · accumulation(pattern)
//! b(pattern)    = arithmetic average of b(pattern, L) over the 21 lengths
//! b_eff         = logavg( logavg over ring patterns of b(pattern),
//!                         logavg over random patterns of b(pattern) )
//! ```
//!
//! where `logavg` is the geometric mean (`exp` of the mean `ln`). The same ring/random
//! averaging per length gives b_eff at each length (b_eff at Lmax is the last), and per
//! method (the method columns of the per-length table).

use crate::lengths::MESSAGE_LENGTHS;
use crate::patterns::PatternKind;

/// How many methods b_eff measures (Sendrecv, Alltoallv, Irecv+Isend+Waitall).
pub const METHODS: usize = 3;

/// Bandwidths in bytes/s indexed by repetition, pattern, message length and method (b_eff's
/// `bw[REPETITIONS][PATTERNS][MSGLENGTHS][METHODS]`), stored flat so that it can be reduced
/// over processes in one call.
#[derive(Clone, Debug, PartialEq)]
pub struct Bandwidths {
    /// Repetitions.
    pub repetitions: usize,
    /// Patterns.
    pub patterns: usize,
    /// The values, repetition-major.
    pub values: Vec<f64>,
}

impl Bandwidths {
    /// All zero.
    pub fn new(repetitions: usize, patterns: usize) -> Bandwidths {
        Bandwidths {
            repetitions,
            patterns,
            values: vec![0.0; repetitions * patterns * MESSAGE_LENGTHS * METHODS],
        }
    }

    fn index(&self, rep: usize, pat: usize, msg: usize, method: usize) -> usize {
        debug_assert!(rep < self.repetitions && pat < self.patterns);
        ((rep * self.patterns + pat) * MESSAGE_LENGTHS + msg) * METHODS + method
    }

    /// The bandwidth of one measurement.
    pub fn get(&self, rep: usize, pat: usize, msg: usize, method: usize) -> f64 {
        self.values[self.index(rep, pat, msg, method)]
    }

    /// Sets the bandwidth of one measurement.
    pub fn set(&mut self, rep: usize, pat: usize, msg: usize, method: usize, value: f64) {
        let i = self.index(rep, pat, msg, method);
        self.values[i] = value;
    }
}

/// The geometric mean (b_eff's `logavg`); NaN if a value is not positive (b_eff prints an
/// error and returns 999999999) or there are none.
pub fn logavg(values: &[f64]) -> f64 {
    if values.is_empty() || values.iter().any(|&v| v <= 0.0 || v.is_nan()) {
        return f64::NAN;
    }
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// The ring, random and combined averages of one value per pattern (b_eff's `logavg_pat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Averages {
    /// Geometric mean over the ring patterns.
    pub rings: f64,
    /// Geometric mean over the random patterns.
    pub random: f64,
    /// Geometric mean of the two: b_eff's value.
    pub both: f64,
}

/// The ring, random and combined averages of `per_pattern` (other kinds are ignored).
pub fn logavg_patterns(per_pattern: &[f64], kinds: &[PatternKind]) -> Averages {
    let of = |kind| -> Vec<f64> {
        per_pattern
            .iter()
            .zip(kinds)
            .filter(|(_, k)| **k == kind)
            .map(|(v, _)| *v)
            .collect()
    };
    let rings = logavg(&of(PatternKind::Ring));
    let random = logavg(&of(PatternKind::Random));
    Averages {
        rings,
        random,
        both: logavg(&[rings, random]),
    }
}

/// What a run reports, all bandwidths accumulated over processes in bytes/s.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Analysis {
    /// Processes.
    pub processes: usize,
    /// b(pattern, L) of the official path, per pattern: 21 lengths, then their average.
    pub pattern_length: Vec<[f64; MESSAGE_LENGTHS + 1]>,
    /// Ring/random averages per length, then of the per-length averages (b_eff's
    /// `b_eff_*_msg`); `per_length[21].both` is b_eff.
    pub per_length: [Averages; MESSAGE_LENGTHS + 1],
    /// The same per method (b_eff's 4th analysis path, `b_eff_*_msg_mthd`).
    pub per_method_length: [[Averages; MESSAGE_LENGTHS + 1]; METHODS],
    /// Half a round trip of 1 byte between ranks 0 and 1, seconds (0 with one process).
    pub pingpong_latency: f64,
    /// Ping-pong bandwidth at Lmax between ranks 0 and 1 (0 with one process).
    pub pingpong_bandwidth: f64,
}

impl Analysis {
    /// b_eff, accumulated over processes.
    pub fn b_eff(&self) -> f64 {
        self.per_length[MESSAGE_LENGTHS].both
    }

    /// b_eff at Lmax, rings and random patterns.
    pub fn at_lmax(&self) -> f64 {
        self.per_length[MESSAGE_LENGTHS - 1].both
    }

    /// b_eff at Lmax, ring patterns only.
    pub fn at_lmax_rings(&self) -> f64 {
        self.per_length[MESSAGE_LENGTHS - 1].rings
    }

    /// b_eff's latency of rings and random patterns: the time per 1-byte message of a
    /// process, from b_eff at 1 byte, in seconds.
    pub fn latency(&self) -> f64 {
        self.processes as f64 / self.per_length[0].both
    }

    /// The same from the ring patterns only.
    pub fn latency_rings(&self) -> f64 {
        self.processes as f64 / self.per_length[0].rings
    }
}

/// The official analysis path and the informational ones b_eff prints, from the
/// minimum-over-processes bandwidths `min_bw` of patterns of the given kinds and
/// accumulation factors.
pub fn analyze(
    min_bw: &Bandwidths,
    kinds: &[PatternKind],
    accumulation: &[f64],
    processes: usize,
) -> Analysis {
    let patterns = min_bw.patterns;
    assert_eq!(kinds.len(), patterns);
    assert_eq!(accumulation.len(), patterns);
    // b(pattern, L, method): the best repetition, accumulated.
    let best_rep = |pat: usize, msg: usize, m: usize| -> f64 {
        (0..min_bw.repetitions)
            .map(|rep| min_bw.get(rep, pat, msg, m) * accumulation[pat])
            .fold(0.0, f64::max)
    };
    let with_average = |f: &dyn Fn(usize) -> f64| -> [f64; MESSAGE_LENGTHS + 1] {
        let mut row = [0.0; MESSAGE_LENGTHS + 1];
        for (msg, v) in row.iter_mut().enumerate().take(MESSAGE_LENGTHS) {
            *v = f(msg);
        }
        row[MESSAGE_LENGTHS] = row[..MESSAGE_LENGTHS].iter().sum::<f64>() / MESSAGE_LENGTHS as f64;
        row
    };
    let pattern_length: Vec<[f64; MESSAGE_LENGTHS + 1]> = (0..patterns)
        .map(|pat| {
            with_average(&|msg| {
                (0..METHODS)
                    .map(|m| best_rep(pat, msg, m))
                    .fold(0.0, f64::max)
            })
        })
        .collect();
    let column = |rows: &[[f64; MESSAGE_LENGTHS + 1]], msg: usize| -> Vec<f64> {
        rows.iter().map(|r| r[msg]).collect()
    };
    let per_length =
        std::array::from_fn(|msg| logavg_patterns(&column(&pattern_length, msg), kinds));
    let per_method_length = std::array::from_fn(|m| {
        let rows: Vec<[f64; MESSAGE_LENGTHS + 1]> = (0..patterns)
            .map(|pat| with_average(&|msg| best_rep(pat, msg, m)))
            .collect();
        std::array::from_fn(|msg| logavg_patterns(&column(&rows, msg), kinds))
    });
    // The ping-pong pair, Sendrecv: b_eff's latency_onePingPong and b_asymp_onePingPong.
    let (mut pingpong_latency, mut pingpong_bandwidth) = (0.0, 0.0);
    if let Some(pat) = kinds.iter().position(|k| *k == PatternKind::PingPongPair) {
        let first = best_rep(pat, 0, 0);
        if first > 0.0 {
            pingpong_latency = accumulation[pat] / first;
        }
        pingpong_bandwidth = best_rep(pat, MESSAGE_LENGTHS - 1, 0);
    }
    Analysis {
        processes,
        pattern_length,
        per_length,
        per_method_length,
        pingpong_latency,
        pingpong_bandwidth,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn logavg_is_the_geometric_mean() {
        assert!(close(logavg(&[2.0, 8.0]), 4.0));
        assert!(close(logavg(&[1e6, 1e6, 8e6]), 2e6));
        assert!(logavg(&[1.0, 0.0]).is_nan());
        assert!(logavg(&[]).is_nan());
    }

    /// Two processes, two repetitions, two rings, two random patterns and the ping-pong
    /// pair, with values chosen so each step can be done by hand.
    #[test]
    fn b_eff_of_fixed_inputs_by_hand() {
        use PatternKind::*;
        let kinds = [Ring, Ring, Random, Random, PingPongPair];
        let acc = [2.0, 2.0, 2.0, 2.0, 1.0];
        let mut bw = Bandwidths::new(2, 5);
        for msg in 0..MESSAGE_LENGTHS {
            for m in 0..METHODS {
                // Ring 0: 1e6 in repetition 0, 0.5e6 in 1, except Alltoallv at Lmax: 22e6.
                let v = if msg == 20 && m == 1 { 22e6 } else { 1e6 };
                bw.set(0, 0, msg, m, v);
                bw.set(1, 0, msg, m, 0.5e6);
                // Ring 1: best is Irecv+Isend in repetition 1, 8e6.
                bw.set(0, 1, msg, m, 1e6);
                bw.set(1, 1, msg, m, if m == 2 { 8e6 } else { 1e6 });
                // Random: 4.5e6 and 0.5e6.
                bw.set(0, 2, msg, m, 4.5e6);
                bw.set(0, 3, msg, m, 0.5e6);
            }
            // Ping-pong, Sendrecv only: 1 byte in 0.5 us; 5e9 B/s at Lmax.
            let pp = match msg {
                0 => 2e6,
                20 => 5e9,
                _ => 1e6,
            };
            bw.set(0, 4, msg, 0, pp);
        }
        let a = analyze(&bw, &kinds, &acc, 2);
        // b(ring 0, L) = 2 · 1e6 below Lmax and 2 · 22e6 at Lmax: average over 21 lengths
        // (20 · 2e6 + 44e6) / 21 = 4e6 (an arithmetic average, not a geometric one).
        assert!(close(a.pattern_length[0][0], 2e6));
        assert!(close(a.pattern_length[0][20], 44e6));
        assert!(close(a.pattern_length[0][21], 4e6));
        assert!(close(a.pattern_length[1][21], 16e6));
        assert!(close(a.pattern_length[2][21], 9e6));
        assert!(close(a.pattern_length[3][21], 1e6));
        // Rings: sqrt(4e6 · 16e6) = 8e6; random: sqrt(9e6 · 1e6) = 3e6;
        // b_eff = sqrt(8e6 · 3e6) = sqrt(24) e6.
        let avg = a.per_length[21];
        assert!(close(avg.rings, 8e6));
        assert!(close(avg.random, 3e6));
        assert!(close(a.b_eff(), 24f64.sqrt() * 1e6));
        // At Lmax: rings sqrt(44e6 · 16e6), random 3e6, both (44·16·9·1)^(1/4) e6.
        assert!(close(a.at_lmax_rings(), (44.0f64 * 16.0).sqrt() * 1e6));
        assert!(close(a.at_lmax(), (44.0f64 * 16.0 * 9.0).powf(0.25) * 1e6));
        // Latency: n / b_eff(1 byte) = 2 / ((2 · 16 · 9 · 1)^(1/4) e6) s.
        assert!(close(a.latency(), 2.0 / (288f64.powf(0.25) * 1e6)));
        assert!(close(a.latency_rings(), 2.0 / (32f64.sqrt() * 1e6)));
        // The pair: 1 / 2e6 s = 0.5 us and 5000 MB/s.
        assert!(close(a.pingpong_latency, 0.5e-6));
        assert!(close(a.pingpong_bandwidth, 5e9));
        // Per method: Sendrecv never sees the 22e6 nor the 8e6 -> rings sqrt(2e6 · 2e6).
        assert!(close(a.per_method_length[0][21].rings, 2e6));
        assert!(close(
            a.per_method_length[2][21].rings,
            (2e6f64 * 16e6).sqrt()
        ));
        assert!(close(a.per_method_length[0][21].random, 3e6));
    }
}
