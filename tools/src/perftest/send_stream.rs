//! `send_bw`, perftest's `ib_send_bw`: a stream of SENDs into a ring of posted receives,
//! with receive-side network page faults injected at a given frequency
//! (Lesokhin17 §6.4 and Fig. 10, whose benchmarks "synthetically generate rNPFs at a variable
//! specified frequency" and "pre-fault the receive ring at startup"), or a ring that
//! starts cold (Lesokhin17 §5, Fig. 4). Throughput is what the receiver sees: messages
//! completed in its receive queue over time. What the receiving NIC does on a fault is the
//! job's `PAGEWIRE_SOFT_RNPF` policy.
//!
//! An injected fault is a receive posted on memory the NIC has never mapped, so the SEND
//! that lands in it faults once: a *minor* fault on anonymous pages the CPU has written
//! (resident; the fault only maps them), a *major* fault on pages of a file on disk that
//! were dropped from the page cache (the fault reads them back). The receive ring itself is
//! mapped for the NIC before the stream by a prefetch (`ibv_advise_mr`), unless
//! `--cold-ring`; so is the sender's buffer.

use super::*;
use pagewire_transport::sys::{self, FileMapping};

/// The kind of receive-side fault `--rnpf-every` injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Pages in memory, unknown to the NIC: the fault maps them.
    Minor,
    /// Pages of a file on disk, not in the page cache: the fault reads them.
    Major,
}

/// Receive faults injected into a `send_bw` stream.
#[derive(Clone, Debug, Serialize)]
pub struct InjectedFaults {
    /// One receive in this many lands on memory the NIC has never mapped.
    pub every: usize,
    /// Minor or major.
    pub kind: FaultKind,
    /// Where the file of major faults is created (a directory on a disk).
    pub dir: std::path::PathBuf,
}

/// The receiver's view of one `send_bw` size.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StreamReport {
    /// Message size.
    pub bytes: usize,
    /// Messages received.
    pub messages: usize,
    /// Receives posted on never-mapped memory.
    pub faults: usize,
    /// Pages of the major-fault file still in the page cache when the stream started (0:
    /// every such fault read the disk).
    pub cached_at_start: usize,
    /// From the sender's start to the last receive completion, seconds (one host's
    /// monotonic clock).
    pub seconds: f64,
    /// Receive throughput over time: (end of window in ms since the start, MB/s in it).
    pub timeline: Vec<(f64, f64)>,
    /// When every buffer of the receive ring had been filled once (the completion of
    /// receive number `rx_depth`), ms since the start: how long a cold ring takes to warm
    /// (Lesokhin17 Fig. 4).
    pub ring_filled_ms: Option<f64>,
}

impl StreamReport {
    fn to_words(&self) -> Vec<f64> {
        let mut w = vec![
            self.bytes as f64,
            self.messages as f64,
            self.faults as f64,
            self.cached_at_start as f64,
            self.seconds,
            self.ring_filled_ms.unwrap_or(-1.0),
        ];
        w.extend(self.timeline.iter().flat_map(|(t, b)| [*t, *b]));
        w
    }

    fn from_words(w: &[f64]) -> anyhow::Result<StreamReport> {
        anyhow::ensure!(
            w.len() >= 6 && (w.len() - 6) % 2 == 0,
            "malformed stream report"
        );
        let timeline: Vec<(f64, f64)> = w[6..].chunks_exact(2).map(|c| (c[0], c[1])).collect();
        Ok(StreamReport {
            bytes: w[0] as usize,
            messages: w[1] as usize,
            faults: w[2] as usize,
            cached_at_start: w[3] as usize,
            seconds: w[4],
            ring_filled_ms: (w[5] >= 0.0).then_some(w[5]),
            timeline,
        })
    }
}

/// Throughput over time from completion times (ms from the start): `bins` equal spans of
/// the run, each with its end and the MB/s completed in it.
pub(super) fn windows(stamps_ms: &[f64], bins: usize, size: usize) -> Vec<(f64, f64)> {
    let Some(&end) = stamps_ms.last() else {
        return Vec::new();
    };
    let bins = bins.max(1);
    let width = (end / bins as f64).max(1e-6);
    let mut counts = vec![0usize; bins];
    for &t in stamps_ms {
        counts[((t / width) as usize).min(bins - 1)] += 1;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, &n)| ((i + 1) as f64 * width, (n * size) as f64 / (width * 1e3)))
        .collect()
}

/// The receive buffers of the never-mapped receives.
enum FaultPool<'a> {
    None,
    Minor(Registered<'a>),
    /// The registration drops (deregisters) before the mapping goes.
    Major {
        _region: Option<Region<&'a SoftNic>>,
        map: FileMapping,
        lkey: u32,
    },
}

impl FaultPool<'_> {
    fn at(&self, k: usize, size: usize) -> (u64, u32) {
        match self {
            FaultPool::None => unreachable!("no faults injected"),
            FaultPool::Minor(r) => (r.addr() + (k * size) as u64, r.lkey),
            FaultPool::Major { map, lkey, .. } => (map.addr() + (k * size) as u64, *lkey),
        }
    }
}

/// One size of `send_bw`. Rank 0 sends, rank 1 receives; the report comes back on rank 0.
pub(super) fn send_bandwidth(
    ctx: &Ctx<'_>,
    cfg: &PerftestConfig,
    size: usize,
    iters: usize,
) -> anyhow::Result<Option<(SizeResult, StreamReport)>> {
    anyhow::ensure!(size > 0, "send_bw needs a size of at least 1 byte");
    let rx_depth = cfg.rx_depth.clamp(1, 4096);
    if ctx.boot.rank() == 1 {
        let words = receive(ctx, cfg, size, iters, rx_depth)?;
        let bytes: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
        ctx.boot.allgather(&bytes)?;
        return Ok(None);
    }
    let src = Registered::new(ctx, size, cfg.mr, true)?;
    if cfg.mr != MrMode::Pinned {
        src.prefetch(0, size, false)?;
    }
    ctx.boot.barrier()?; // the receives are posted: go
                         // The stream starts now (the host's monotonic clock, which both ranks read).
    let start_ns = sys::monotonic_ns();
    send_stream(ctx, &src, size, iters, cfg.tx_depth)?;
    ctx.boot.allgather(&start_ns.to_le_bytes())?;
    let all = ctx.boot.allgather(&[])?;
    let words: Vec<f64> = all[1]
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let stream = StreamReport::from_words(&words)?;
    let avg = (size * iters) as f64 / stream.seconds.max(1e-9) / 1e6;
    let peak = stream.timeline.iter().map(|w| w.1).fold(avg, f64::max);
    Ok(Some((
        SizeResult {
            bytes: size,
            iterations: iters,
            bw_peak_mbs: Some(peak),
            bw_avg_mbs: Some(avg),
            msg_rate_mpps: Some(iters as f64 / stream.seconds.max(1e-9) / 1e6),
            lat_us: None,
            memcpy: 0.0,
            ratio_to_memcpy: 0.0,
        },
        stream,
    )))
}

/// The sender: `n` SENDs of `src`, at most `depth` outstanding.
fn send_stream(
    ctx: &Ctx<'_>,
    src: &Registered<'_>,
    size: usize,
    n: usize,
    depth: usize,
) -> anyhow::Result<()> {
    let (mut posted, mut done) = (0usize, 0usize);
    while done < n {
        while posted < n && posted - done < depth.max(1) {
            post(
                ctx,
                posted as u64,
                Opcode::Send,
                &[sge(src.addr(), size, src.lkey)],
                false,
            )?;
            posted += 1;
        }
        ctx.wait()?;
        done += 1;
    }
    Ok(())
}

/// The receiver: warms its ring (unless `--cold-ring`), then times `iters` receives, one
/// in `every` on never-mapped memory. Returns its report as words.
fn receive(
    ctx: &Ctx<'_>,
    cfg: &PerftestConfig,
    size: usize,
    iters: usize,
    rx_depth: usize,
) -> anyhow::Result<Vec<f64>> {
    let ring = Registered::new(ctx, size * rx_depth, cfg.mr, false)?;
    let slot = |i: usize| {
        sge(
            ring.addr() + ((i % rx_depth) * size) as u64,
            size,
            ring.lkey,
        )
    };
    let faults = cfg.rnpf.as_ref().map_or(0, |f| iters / f.every.max(1));
    let pool = match cfg.rnpf.as_ref() {
        None => FaultPool::None,
        Some(_) if faults == 0 => FaultPool::None,
        Some(f) if f.kind == FaultKind::Minor => {
            FaultPool::Minor(Registered::new(ctx, size * faults, cfg.mr, true)?)
        }
        Some(f) => {
            let m = FileMapping::evicted_in(&f.dir, size * faults).map_err(|e| {
                anyhow::anyhow!("the file for major faults in {}: {e}", f.dir.display())
            })?;
            let region = match ctx.implicit {
                Some(_) => None,
                None => Some(Region::register(
                    ctx.nic,
                    m.addr(),
                    m.len() as u64,
                    cfg.mr.access(),
                )?),
            };
            let lkey = region
                .as_ref()
                .map_or(ctx.implicit.unwrap_or_default(), Region::lkey);
            FaultPool::Major {
                _region: region,
                map: m,
                lkey,
            }
        }
    };
    if !cfg.cold_ring && cfg.mr != MrMode::Pinned {
        // Warm: the NIC maps the whole ring before the stream (`ibv_advise_mr`).
        ring.prefetch(0, size * rx_depth, true)?;
    }
    let every = cfg.rnpf.as_ref().map_or(usize::MAX, |f| f.every.max(1));
    let mut injected = 0usize;
    let mut post_next = |j: usize| -> anyhow::Result<()> {
        let s = if faults > 0 && (j + 1) % every == 0 && injected < faults {
            let (addr, lkey) = pool.at(injected, size);
            injected += 1;
            sge(addr, size, lkey)
        } else {
            slot(j)
        };
        post_recv(ctx, j as u64, &[s])
    };
    let mut next = 0usize;
    while next < iters.min(rx_depth) {
        post_next(next)?;
        next += 1;
    }
    let cached_at_start = match &pool {
        FaultPool::Major { map, .. } => map.cached_pages()?,
        _ => 0,
    };
    ctx.boot.barrier()?;
    // Completion times on the host's monotonic clock; the sender's start comes after the
    // stream (this rank's NIC may take messages before this thread leaves the barrier).
    let mut stamps_ns = Vec::with_capacity(iters);
    while stamps_ns.len() < iters {
        ctx.wait()?;
        stamps_ns.push(sys::monotonic_ns());
        if next < iters {
            post_next(next)?;
            next += 1;
        }
    }
    let all = ctx.boot.allgather(&[])?;
    let start_ns = u64::from_le_bytes(all[0][..8].try_into()?);
    let stamps_ms: Vec<f64> = stamps_ns
        .iter()
        .map(|&t| t.saturating_sub(start_ns) as f64 / 1e6)
        .collect();
    let seconds = stamps_ms.last().copied().unwrap_or(0.0) / 1e3;
    let report = StreamReport {
        bytes: size,
        messages: iters,
        faults,
        cached_at_start,
        seconds,
        timeline: windows(&stamps_ms, (iters / 20).clamp(1, 100), size),
        ring_filled_ms: stamps_ms.get(rx_depth - 1).copied(),
    };
    Ok(report.to_words())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_give_throughput_and_reports_round_trip() {
        // 64 KiB messages: 10 in the first 10 ms (slow), then 10 per ms for 4 ms.
        let mut stamps: Vec<f64> = (1..=10).map(|i| i as f64).collect();
        stamps.extend((1..=40).map(|i| 10.0 + i as f64 * 0.1));
        let w = windows(&stamps, 7, 64 << 10);
        assert_eq!(w.len(), 7);
        // 2 ms bins: the first holds the message at 1 ms (64 KiB in 2 ms), the sixth the
        // 20 from 10.1 to 12 ms; the last one also takes the run's final stamp.
        assert!(
            (w[0].0 - 2.0).abs() < 1e-9 && (w[0].1 - 32.768).abs() < 1e-6,
            "{w:?}"
        );
        assert!((w[5].1 - 655.36).abs() < 1e-6, "{w:?}");
        assert!((w[6].1 - 688.128).abs() < 1e-6, "{w:?}");
        let report = StreamReport {
            bytes: 65536,
            messages: 50,
            faults: 2,
            cached_at_start: 0,
            seconds: 0.014,
            timeline: w.clone(),
            ring_filled_ms: Some(12.0),
        };
        let back = StreamReport::from_words(&report.to_words()).unwrap();
        assert_eq!((back.timeline, back.ring_filled_ms), (w, Some(12.0)));
        assert!(StreamReport::from_words(&[1.0, 2.0]).is_err());
    }
}
