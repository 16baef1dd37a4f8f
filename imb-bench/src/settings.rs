//! IMB's run-time settings and the rules derived from them: repetitions per size, warm-up,
//! the `-off_cache` buffer rotation and the process counts of `-npmin`.

use serde::{Deserialize, Serialize};

/// IMB's `MSGSPERSAMPLE`: repetitions for small messages.
pub const MSGS_PER_SAMPLE: usize = 1000;
/// IMB's `OVERALL_VOL`, in MiB: at most this much data per size and process.
pub const OVERALL_VOL_MIB: usize = 40;
/// IMB's `CACHE_UNIT`: `-off_cache` sizes are in MiB.
pub const CACHE_UNIT: f64 = 1_048_576.0;
/// IMB's `CACHE_SIZE` (MiB), used by `-off_cache -1`.
pub const DEFAULT_CACHE_SIZE_MIB: f64 = 8.0;
/// IMB's `CACHE_LINE_SIZE` (bytes), used when `-off_cache` gives none.
pub const DEFAULT_CACHE_LINE: usize = 64;
/// IMB's `N_BARR`: barriers before each timed loop.
pub const N_BARRIERS: usize = 2;
/// IMB's `SECS_PER_SAMPLE`: `-time`'s default.
pub const SECS_PER_SAMPLE: f64 = 10.0;
/// `sizeof(assign_type)` (a float): IMB's buffers are never smaller.
pub const ASSIGN_SIZE: usize = 4;

/// The memory of IMB-RMA's windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    /// Over memory the benchmark allocated, as IMB-RMA's `MPI_Win_create` (`Window::from_vec`;
    /// between ranks of one host puts and gets are then kernel copies into the peer's memory).
    #[default]
    Create,
    /// Memory the window allocates (`MPI_Win_allocate`, `Window::allocate`; between ranks of
    /// one host a shared-memory segment, moved by loads and stores).
    Allocate,
}

/// How the repetition count is chosen (IMB's `-iter_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IterPolicy {
    /// IMB's default: the repetitions of [`Iterations::repetitions`], reduced when a
    /// preparatory run shows that they would take longer than `-time` seconds.
    #[default]
    Dynamic,
    /// Exactly [`Iterations::repetitions`].
    Off,
}

/// IMB's iteration control (`-iter`, `-iter_policy`, `-time`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Iterations {
    /// Repetitions for small messages (`-iter`'s first value).
    pub msgs_per_sample: usize,
    /// Bytes per size and process at most (`-iter`'s second value, in MiB).
    pub overall_vol: usize,
    /// The policy.
    pub policy: IterPolicy,
    /// Seconds per size at most (`-time`).
    pub secs: f64,
}

impl Default for Iterations {
    fn default() -> Self {
        Iterations {
            msgs_per_sample: MSGS_PER_SAMPLE,
            overall_vol: OVERALL_VOL_MIB << 20,
            policy: IterPolicy::Dynamic,
            secs: SECS_PER_SAMPLE,
        }
    }
}

impl Iterations {
    /// Parses `-iter msgspersample[,overall_vol]` (overall_vol in MiB, as IMB).
    pub fn parse(s: &str) -> Result<Iterations, String> {
        let mut it = s.split(',').map(|v| v.trim().parse::<usize>());
        let bad = || format!("-iter {s}: expected msgspersample[,overall_vol_MiB], e.g. 1000,40");
        let msgs = it
            .next()
            .and_then(|r| r.ok())
            .filter(|&n| n > 0)
            .ok_or_else(bad)?;
        let vol = match it.next() {
            None => OVERALL_VOL_MIB,
            Some(r) => r.ok().filter(|&n| n > 0).ok_or_else(bad)?,
        };
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(Iterations {
            msgs_per_sample: msgs,
            overall_vol: vol << 20,
            ..Iterations::default()
        })
    }

    /// IMB's repetitions for `size`: `min(msgspersample, overall_vol / size)`, at least 1;
    /// `msgspersample` at size 0 (before the dynamic policy's time limit).
    pub fn repetitions(&self, size: usize) -> usize {
        match self.overall_vol.checked_div(size) {
            None => self.msgs_per_sample,
            Some(r) => r.min(self.msgs_per_sample).max(1),
        }
    }
}

/// IMB's warm-up before each size: a tenth of the repetitions, at least `min(10, n)`.
pub fn warmup_repetitions(n_sample: usize) -> usize {
    let w = n_sample / 10;
    if w < 10 {
        n_sample.min(10)
    } else {
        w
    }
}

/// `-off_cache cache_size[,cache_line_size]`: the last-level cache to defeat.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OffCache {
    /// Cache size in MiB (a float, as IMB takes it).
    pub cache_size_mib: f64,
    /// Cache line size in bytes.
    pub cache_line: usize,
}

impl OffCache {
    /// Parses IMB's argument: `-1` (IMB's defaults, 8 MiB and 64 B), `SIZE` or `SIZE,LINE`.
    pub fn parse(s: &str) -> Result<OffCache, String> {
        let bad = || {
            format!("-off_cache {s}: expected -1, cache_size (MiB) or cache_size,cache_line_size")
        };
        let mut parts = s.split(',');
        let size: f64 = parts
            .next()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(bad)?;
        let line = match parts.next() {
            None => DEFAULT_CACHE_LINE,
            Some(v) => v.trim().parse().ok().filter(|&l| l > 0).ok_or_else(bad)?,
        };
        if parts.next().is_some() || !size.is_finite() {
            return Err(bad());
        }
        if size < 0.0 {
            return Ok(OffCache {
                cache_size_mib: DEFAULT_CACHE_SIZE_MIB,
                cache_line: DEFAULT_CACHE_LINE,
            });
        }
        Ok(OffCache {
            cache_size_mib: size,
            cache_line: line,
        })
    }

    /// The rotation of a buffer of `len` bytes over `n_sample` repetitions, as IMB computes
    /// it: each message starts `offset` bytes after the previous one (its length rounded up
    /// to whole cache lines, plus one line), over `buffers` positions that span at least
    /// twice the cache (at most one per repetition); then it starts again.
    pub fn rotation(&self, len: usize, n_sample: usize) -> Rotation {
        if self.cache_size_mib <= 0.0 {
            return Rotation::NONE;
        }
        let line = self.cache_line;
        let offset = (len.div_ceil(line) + 1) * line;
        let span = 2.0 * self.cache_size_mib * CACHE_UNIT;
        let positions = ((span + offset as f64 - 1.0) / offset as f64).floor() as usize;
        Rotation {
            offset,
            buffers: positions.min(n_sample).max(1),
        }
    }
}

/// Where repetition `i`'s message is in its buffer: at `(i mod buffers) * offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rotation {
    /// Bytes between consecutive positions.
    pub offset: usize,
    /// Positions before the rotation starts again.
    pub buffers: usize,
}

impl Rotation {
    /// No rotation: every repetition uses the start of the buffer.
    pub const NONE: Rotation = Rotation {
        offset: 0,
        buffers: 1,
    };

    /// Byte offset of repetition `i`.
    pub fn at(&self, i: usize) -> usize {
        (i % self.buffers) * self.offset
    }

    /// Bytes to allocate for messages of `len` bytes: IMB's `max(len, buffers * offset)`.
    pub fn alloc(&self, len: usize) -> usize {
        len.max(self.buffers * self.offset)
    }
}

/// The process counts a benchmark runs with on `world` ranks with `-npmin npmin`: IMB's
/// `max(1, min(world, npmin))`, doubled up to `world`, which comes last. Benchmarks of two
/// processes ([`crate::bench::Kind::SingleTransfer`]) run with `min(2, world)` only.
pub fn process_counts(world: usize, npmin: usize, two_only: bool) -> Vec<usize> {
    if two_only {
        return vec![world.min(2)];
    }
    let mut np = world.min(npmin).max(1);
    let mut out = vec![np];
    while np < world {
        np = (np * 2).min(world);
        out.push(np);
    }
    out
}

/// Sizes 0 and `2^min ..= 2^max` (`-msglog min:max`; IMB's default `0:22`).
pub fn msglog_sizes(min: u32, max: u32) -> Vec<usize> {
    std::iter::once(0)
        .chain((min..=max).map(|e| 1usize << e))
        .collect()
}

/// Parses `-msglog`: `min:max`, or `max` alone (min 0), as IMB.
pub fn parse_msglog(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("-msglog {s}: expected MIN:MAX (0 <= MIN <= MAX <= 30) or MAX");
    let (a, b) = match s.split_once(':') {
        Some((a, b)) => (a.trim().parse().ok(), b.trim().parse().ok()),
        None => (Some(0), s.trim().parse().ok()),
    };
    match (a, b) {
        (Some(a), Some(b)) if a <= b && b <= 30 => Ok((a, b)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetitions_follow_imb() {
        let it = Iterations::default();
        let reps: Vec<usize> = [0, 1, 32768, 65536, 131072, 1 << 20, 4 << 20]
            .iter()
            .map(|&s| it.repetitions(s))
            .collect();
        // The reference run's #repetitions column.
        assert_eq!(reps, [1000, 1000, 1000, 640, 320, 40, 10]);
        assert_eq!(it.repetitions(64 << 20), 1);
        let custom = Iterations::parse("200,1").unwrap();
        assert_eq!(custom.repetitions(4096), 200);
        assert_eq!(custom.repetitions(65536), 16);
        assert!(Iterations::parse("0").is_err());
        assert_eq!(warmup_repetitions(1000), 100);
        assert_eq!(warmup_repetitions(640), 64);
        assert_eq!(warmup_repetitions(40), 10);
        assert_eq!(warmup_repetitions(5), 5);
    }

    #[test]
    fn off_cache_rotation_is_imbs() {
        let oc = OffCache::parse("-1").unwrap();
        assert_eq!(
            oc,
            OffCache {
                cache_size_mib: 8.0,
                cache_line: 64
            }
        );
        // 1 KiB: 16 lines + 1 = 1088 B apart, ceil(16 MiB / 1088) = 15420 > 1000 repetitions.
        let r = oc.rotation(1024, 1000);
        assert_eq!(
            r,
            Rotation {
                offset: 1088,
                buffers: 1000
            }
        );
        // 64 KiB: 65600 B apart, ceil(16777216 / 65600) = 256 positions, span > 2 x cache.
        let r = oc.rotation(65536, 640);
        assert_eq!(
            r,
            Rotation {
                offset: 65600,
                buffers: 256
            }
        );
        assert!(r.buffers * r.offset >= 16 << 20);
        assert_eq!(r.alloc(65536), 256 * 65600);
        let at: Vec<usize> = (0..258).map(|i| r.at(i)).collect();
        assert_eq!(at[1], 65600);
        assert_eq!(at[256], 0);
        let distinct: std::collections::HashSet<_> = at[..256].iter().collect();
        assert_eq!(distinct.len(), 256);
        // 4 MiB: 5 positions (ceil(16 MiB / (4 MiB + 64))), capped by the 10 repetitions.
        assert_eq!(oc.rotation(4 << 20, 10).buffers, 4);
        assert_eq!(oc.rotation(4 << 20, 3).buffers, 3);
        let oc = OffCache::parse("2.5,128").unwrap();
        assert_eq!(oc.rotation(0, 1000).offset, 128);
        assert_eq!(
            OffCache::parse("0").unwrap().rotation(8, 10),
            Rotation::NONE
        );
        assert!(OffCache::parse("x").is_err());
    }

    #[test]
    fn process_counts_double_from_npmin() {
        assert_eq!(process_counts(4, 2, false), [2, 4]);
        assert_eq!(process_counts(3, 2, false), [2, 3]);
        assert_eq!(process_counts(1, 2, false), [1]);
        assert_eq!(process_counts(8, 1, false), [1, 2, 4, 8]);
        assert_eq!(process_counts(5, 1, false), [1, 2, 4, 5]);
        assert_eq!(process_counts(4, 2, true), [2]);
        assert_eq!(process_counts(1, 2, true), [1]);
        assert_eq!(parse_msglog("0:4"), Ok((0, 4)));
        assert_eq!(parse_msglog("3"), Ok((0, 3)));
        assert!(parse_msglog("5:4").is_err());
        assert_eq!(msglog_sizes(0, 2), [0, 1, 2, 4]);
    }
}
