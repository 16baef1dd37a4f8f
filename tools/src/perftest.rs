//! The perftest of pagewire: `ib_write_bw`, `ib_write_lat`, `ib_read_bw`, `ib_read_lat` and
//! `ib_send_lat` reproduced on the NIC trait, two ranks, rank 0 the client (initiator) and
//! rank 1 the server.
//!
//! Memory-region modes (`--mr`): `pinned` (mlock'ed regions), `odp` (explicit ODP regions,
//! warmed by untimed warm-up iterations), `odp-prefetch` (explicit ODP regions mapped ahead
//! of use with `advise`), `implicit-odp` (one ODP region for the whole address space).
//!
//! `--cold`: every iteration uses memory the NIC has never seen. The initiator maps a fresh
//! buffer per iteration and, for `pinned`, `odp` and `odp-prefetch`, registers it (and
//! deregisters it after its completion), so dynamic registration and requester faults are
//! inside the timed loop; `odp-prefetch` advises it there too. The target's landing or
//! source memory is a fresh slice of a never-touched span per iteration in the ODP modes
//! (responder faults in the timed loop); with `odp-prefetch` the target prefetches its whole
//! span before the loop (a receiver that knows where data will land, ODP13); with
//! `pinned` the target's buffer is registered once (pinning it per iteration would need a
//! key exchange per message). The `memcpy` reference copies the same sizes in the same run,
//! into a fresh destination per iteration under `--cold`.
//!
//! `--resident` (with `--cold`): the fresh buffers and spans are written by the CPU before
//! they are registered, so the NIC's faults find the pages in memory and only map them —
//! Lesokhin17's minor network page faults (Table 4). Without it, a fault on a fresh page also
//! allocates and zeroes it. Both print a per-size table of the faults: where their time went
//! and their 50/95/99 %/max, next to Lesokhin17's figures (the
//! `PAGEWIRE_SOFT_PROFILE=npf-model` profile adds the NIC firmware's part).

mod measure;
mod npf;
mod send_stream;
mod setup;

pub use send_stream::{FaultKind, InjectedFaults, StreamReport};

use std::time::{Duration, Instant};

use pagewire_transport::boot::Bootstrap;
use pagewire_transport::nic::soft::SoftNic;
use pagewire_transport::nic::{
    Access, Advice, Completion, CountersSnapshot, Endpoint, Nic, Opcode, QpCaps, RecvWr, Region,
    SendWr, Sge, WcStatus,
};
use pagewire_transport::sys::AnonMapping;
use serde::Serialize;

use measure::*;
use setup::*;

/// Which test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    /// RDMA WRITE bandwidth (`ib_write_bw`).
    #[value(name = "write_bw", alias = "write-bw")]
    WriteBw,
    /// RDMA WRITE ping-pong latency, half round trip (`ib_write_lat`).
    #[value(name = "write_lat", alias = "write-lat")]
    WriteLat,
    /// RDMA READ bandwidth (`ib_read_bw`).
    #[value(name = "read_bw", alias = "read-bw")]
    ReadBw,
    /// RDMA READ latency, whole round trip (`ib_read_lat`).
    #[value(name = "read_lat", alias = "read-lat")]
    ReadLat,
    /// SEND/RECV ping-pong latency, half round trip (`ib_send_lat`).
    #[value(name = "send_lat", alias = "send-lat")]
    SendLat,
    /// SEND/RECV stream bandwidth as the receiver sees it (`ib_send_bw`), optionally with
    /// receive-side network page faults injected (`--rnpf-every`) or a cold receive ring.
    #[value(name = "send_bw", alias = "send-bw")]
    SendBw,
}

impl TestKind {
    fn is_bw(self) -> bool {
        matches!(
            self,
            TestKind::WriteBw | TestKind::ReadBw | TestKind::SendBw
        )
    }

    fn title(self) -> &'static str {
        match self {
            TestKind::WriteBw => "RDMA_Write BW Test",
            TestKind::WriteLat => "RDMA_Write Latency Test",
            TestKind::ReadBw => "RDMA_Read BW Test",
            TestKind::ReadLat => "RDMA_Read Latency Test",
            TestKind::SendLat => "Send Latency Test",
            TestKind::SendBw => "Send BW Test",
        }
    }
}

/// How the buffers are registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum MrMode {
    /// Pinned (mlock) regions.
    Pinned,
    /// Explicit on-demand-paging regions.
    Odp,
    /// Explicit ODP regions prefetched with `advise` before use.
    OdpPrefetch,
    /// One implicit ODP region for the whole address space.
    ImplicitOdp,
}

impl MrMode {
    fn access(self) -> Access {
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        match self {
            MrMode::Pinned => rw,
            _ => rw | Access::ON_DEMAND,
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct PerftestConfig {
    /// The test.
    pub test: TestKind,
    /// Message sizes in bytes.
    pub sizes: Vec<usize>,
    /// Iterations per size; `None` for the default (5000 for bandwidth, 1000 for latency,
    /// capped so one size moves at most 1 GiB, or 256 MiB for latency).
    pub iters: Option<usize>,
    /// Registration mode.
    pub mr: MrMode,
    /// Fresh memory every iteration.
    pub cold: bool,
    /// Fresh memory written by the CPU before the NIC sees it (pages resident, unknown to
    /// the NIC): faults only map them.
    pub resident: bool,
    /// Outstanding work requests in bandwidth tests (perftest's `tx_depth`).
    pub tx_depth: usize,
    /// `send_bw`: receives posted at once (perftest's `rx_depth`).
    pub rx_depth: usize,
    /// `send_bw`: receive-side faults to inject.
    pub rnpf: Option<InjectedFaults>,
    /// `send_bw`: the receive ring starts unmapped (no warm-up pass).
    pub cold_ring: bool,
}

/// One size's result.
#[derive(Clone, Debug, Serialize)]
pub struct SizeResult {
    /// Message size.
    pub bytes: usize,
    /// Timed iterations.
    pub iterations: usize,
    /// Bandwidth tests: best bandwidth over 1/16 of the iterations, MB/s (10^6 B/s).
    pub bw_peak_mbs: Option<f64>,
    /// Bandwidth tests: average bandwidth, MB/s.
    pub bw_avg_mbs: Option<f64>,
    /// Bandwidth tests: messages per second, millions.
    pub msg_rate_mpps: Option<f64>,
    /// Latency tests: microseconds (min, typical = median, max, average, 99%, 99.9%).
    pub lat_us: Option<LatencyStats>,
    /// The same-run memcpy reference: MB/s for bandwidth tests, microseconds per copy for
    /// latency tests.
    pub memcpy: f64,
    /// This test's figure over the memcpy figure (bandwidth ratio, or latency ratio).
    pub ratio_to_memcpy: f64,
}

/// Latency distribution in microseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LatencyStats {
    /// Fastest iteration.
    pub min: f64,
    /// Median.
    pub typical: f64,
    /// Slowest iteration.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// The whole run, as `--json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct PerftestReport {
    /// The test.
    pub test: TestKind,
    /// Registration mode.
    pub mr: MrMode,
    /// Whether buffers were fresh every iteration.
    pub cold: bool,
    /// Provider and data path.
    pub provider: String,
    /// The soft NIC's cost profile (`PAGEWIRE_SOFT_PROFILE`).
    pub profile: String,
    /// What the receiving NIC does on a receive-side fault (`PAGEWIRE_SOFT_RNPF`).
    pub receive_fault: String,
    /// `send_bw`: the injected faults, if any.
    pub rnpf: Option<InjectedFaults>,
    /// `send_bw`: the receiver's view of each size.
    pub streams: Vec<StreamReport>,
    /// The network page faults of each size, by side.
    pub npf: Vec<npf::NpfRow>,
    /// Per-size results.
    pub results: Vec<SizeResult>,
    /// Counters of the client (initiator) over the run.
    #[serde(skip)]
    pub client: CountersSnapshot,
    /// Counters of the server (target) over the run.
    #[serde(skip)]
    pub server: CountersSnapshot,
    /// The counters as JSON-friendly pairs: (side, name, value).
    pub counters: Vec<(String, String, f64)>,
    /// Where each rank ran (CPU set, NUMA node, binding), in rank order; filled by the
    /// driver (`placement::gather_boot`).
    pub placement: Vec<String>,
}

/// Sizes perftest's `--all` runs: 2 B to 8 MiB, doubling.
pub fn all_sizes() -> Vec<usize> {
    (1..=23).map(|e| 1usize << e).collect()
}

fn default_iters(test: TestKind, size: usize) -> usize {
    if test.is_bw() {
        5000.min(((1usize << 30) / size.max(1)).max(16))
    } else {
        1000.min(((256usize << 20) / size.max(1)).max(16))
    }
}

/// Runs the perftest on this rank (collective: both ranks call it). Returns the report on
/// rank 0, `None` on rank 1.
pub fn run(
    boot: &dyn Bootstrap,
    nic: &SoftNic,
    cfg: &PerftestConfig,
) -> anyhow::Result<Option<PerftestReport>> {
    anyhow::ensure!(
        boot.size() == 2,
        "pw-perftest runs on exactly 2 ranks, not {}",
        boot.size()
    );
    let me = boot.rank();
    let caps = QpCaps {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        ..QpCaps::default()
    };
    // Room for every completion the one queue pair can have outstanding.
    let cq = nic.create_cq(caps.max_send_wr + caps.max_recv_wr)?;
    let qp = nic.create_qp(1 - me, cq, cq, caps)?;
    let all = boot.allgather(&nic.endpoint(qp)?.0)?;
    nic.connect(qp, &Endpoint(all[1 - me].clone()))?;
    // Deregistered when the run ends, on either rank, however it ends.
    let implicit_region = match cfg.mr {
        MrMode::ImplicitOdp => Some(Region::implicit_odp(nic, MrMode::ImplicitOdp.access())?),
        _ => None,
    };
    let ctx = Ctx {
        boot,
        nic,
        qp,
        cq,
        implicit: implicit_region.as_ref().map(Region::lkey),
    };
    boot.barrier()?;
    let start_counters = nic.counters();
    let mut results = Vec::new();
    let mut npf_rows = Vec::new();
    let mut streams = Vec::new();
    anyhow::ensure!(
        cfg.test == TestKind::SendBw || (cfg.rnpf.is_none() && !cfg.cold_ring),
        "--rnpf-every and --cold-ring are options of send_bw"
    );
    anyhow::ensure!(
        cfg.test != TestKind::SendBw || !cfg.cold,
        "send_bw has no --cold; use --cold-ring or --rnpf-every"
    );
    anyhow::ensure!(
        cfg.mr != MrMode::Pinned || (cfg.rnpf.is_none() && !cfg.cold_ring),
        "receive faults need unpinned memory: use --mr odp or --mr implicit-odp"
    );
    for &size in &cfg.sizes {
        let before = nic.counters();
        anyhow::ensure!(
            size > 0 || cfg.test.is_bw(),
            "latency tests need a size of at least 1 byte"
        );
        let iters = cfg.iters.unwrap_or_else(|| default_iters(cfg.test, size));
        let r = match cfg.test {
            TestKind::WriteBw | TestKind::ReadBw => bandwidth(&ctx, cfg, size, iters)?,
            TestKind::WriteLat => write_latency(&ctx, cfg, size, iters)?,
            TestKind::ReadLat => read_latency(&ctx, cfg, size, iters)?,
            TestKind::SendLat => send_latency(&ctx, cfg, size, iters)?,
            TestKind::SendBw => {
                send_stream::send_bandwidth(&ctx, cfg, size, iters)?.map(|(r, stream)| {
                    streams.push(stream);
                    r
                })
            }
        };
        boot.barrier()?;
        // Both sides' faults of this size (collective; the server's arrive as bytes).
        let delta = boot.allgather(&nic.counters().since(&before).to_bytes())?;
        if me == 0 {
            let side = |b: &[u8]| {
                CountersSnapshot::from_bytes(b)
                    .ok_or_else(|| anyhow::anyhow!("malformed counters from a rank"))
            };
            npf_rows.extend(npf::rows(size, &side(&delta[0])?, &side(&delta[1])?));
        }
        if let Some(r) = r {
            let (memcpy, ratio) = memcpy_reference(cfg, size, iters.min(2000), &r);
            results.push(SizeResult {
                memcpy,
                ratio_to_memcpy: ratio,
                ..r
            });
        }
    }
    let mine = nic.counters().since(&start_counters);
    let both = boot.allgather(&mine.to_bytes())?;
    if me != 0 {
        return Ok(None);
    }
    let server = CountersSnapshot::from_bytes(&both[1])
        .ok_or_else(|| anyhow::anyhow!("malformed counters from rank 1"))?;
    let provider = format!(
        "soft ({})",
        if nic.uses_cma(1) {
            "CMA: one kernel copy"
        } else {
            "staged through the shared-memory ring"
        }
    );
    let counters = counter_rows(&mine, &server);
    Ok(Some(PerftestReport {
        test: cfg.test,
        mr: cfg.mr,
        cold: cfg.cold,
        provider,
        profile: match nic.describe_tpt_cache() {
            Some(cache) => format!("{}; {cache}", nic.profile().describe()),
            None => nic.profile().describe().to_string(),
        },
        receive_fault: nic.receive_fault().describe(),
        rnpf: cfg.rnpf.clone(),
        streams,
        npf: npf_rows,
        results,
        client: mine,
        server,
        counters,
        placement: Vec::new(),
    }))
}

/// The counters `pw-perftest` reports: (JSON key, table label, value).
fn counter_items(c: &CountersSnapshot) -> Vec<(&'static str, &'static str, f64)> {
    vec![
        ("registrations", "registrations", c.registrations as f64),
        (
            "pinned_peak_bytes",
            "pinned bytes, peak",
            c.pinned_peak as f64,
        ),
        (
            "npf_requester",
            "NPFs, requester side",
            c.npf_requester as f64,
        ),
        (
            "npf_responder",
            "NPFs, responder side",
            c.npf_responder as f64,
        ),
        ("npf_pages", "pages mapped by NPFs", c.npf_pages as f64),
        ("npf_mean_us", "mean NPF resolution [usec]", c.npf_mean_us()),
        (
            "prefetch_pages",
            "pages prefetched",
            c.prefetch_pages as f64,
        ),
        ("rnr_retries", "RNR retries", c.rnr_retries as f64),
        ("rnr_nacks_sent", "RNR NACKs sent", c.rnr_nacks_sent as f64),
        (
            "rnpf_dropped",
            "requests dropped on a fault",
            c.receive_fault.dropped as f64,
        ),
        (
            "rnpf_backed_up",
            "messages via the backup ring",
            c.receive_fault.backed_up as f64,
        ),
        (
            "timeout_retransmits",
            "retransmissions after timeout",
            c.receive_fault.timeout_retransmits as f64,
        ),
        (
            "invalidated_pages",
            "invalidated pages",
            c.invalidated_pages as f64,
        ),
        ("bytes_cma", "bytes moved by CMA", c.bytes_cma as f64),
        (
            "bytes_staged",
            "bytes staged through the ring",
            c.bytes_staged as f64,
        ),
    ]
}

fn counter_rows(
    client: &CountersSnapshot,
    server: &CountersSnapshot,
) -> Vec<(String, String, f64)> {
    let mut rows = Vec::new();
    for (side, c) in [("client", client), ("server", server)] {
        for (key, _, v) in counter_items(c) {
            rows.push((side.to_string(), key.to_string(), v));
        }
    }
    rows
}

/// Prints the report as perftest-style tables followed by the counters.
pub fn print(report: &PerftestReport, iters_note: bool) {
    let dash = "-".repeat(87);
    println!("{dash}");
    println!("                    {}", report.test.title());
    println!(" Provider        : {}", report.provider);
    println!(" Profile         : {}", report.profile);
    for (rank, line) in report.placement.iter().enumerate() {
        println!(" Rank {rank}          : {line}");
    }
    println!(
        " Memory region   : {:?}{}",
        report.mr,
        if report.cold {
            ", cold (fresh buffers every iteration)"
        } else {
            ", warm"
        }
    );
    if iters_note {
        println!(" Iterations      : default, capped so one size moves at most 1 GiB (bw) / 256 MiB (lat)");
    }
    println!("{dash}");
    if report.test.is_bw() {
        println!(
            " {:<10} {:<12} {:>16} {:>18} {:>14} {:>14} {:>9}",
            "#bytes",
            "#iterations",
            "BW peak[MB/sec]",
            "BW average[MB/sec]",
            "MsgRate[Mpps]",
            "memcpy[MB/sec]",
            "ratio"
        );
        for r in &report.results {
            println!(
                " {:<10} {:<12} {:>16.2} {:>18.2} {:>14.6} {:>14.2} {:>9.3}",
                r.bytes,
                r.iterations,
                r.bw_peak_mbs.unwrap_or(0.0),
                r.bw_avg_mbs.unwrap_or(0.0),
                r.msg_rate_mpps.unwrap_or(0.0),
                r.memcpy,
                r.ratio_to_memcpy
            );
        }
    } else {
        println!(
            " {:<8} {:<12} {:>12} {:>12} {:>17} {:>12} {:>13} {:>12} {:>14} {:>14} {:>9}",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
            "99%[usec]",
            "99.9%[usec]",
            "memcpy[usec]",
            "ratio"
        );
        for r in &report.results {
            let l = r.lat_us.expect("latency test");
            println!(
                " {:<8} {:<12} {:>12.2} {:>12.2} {:>17.2} {:>12.2} {:>13.2} {:>12.2} {:>14.2} {:>14.3} {:>9.2}",
                r.bytes, r.iterations, l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999, r.memcpy, r.ratio_to_memcpy
            );
        }
    }
    println!("{dash}");
    println!(
        " ratio: bandwidth over the same-run memcpy bandwidth (bw tests), or typical latency over"
    );
    println!(" the same-run median memcpy time (latency tests); memcpy copies into a fresh mapping under --cold.");
    println!("{dash}");
    if report.test == TestKind::SendBw {
        print_streams(report, &dash);
    }
    npf::print(&report.npf, &report.profile, &dash);
    println!(
        " NIC counters over the run        {:>16} {:>16}",
        "client", "server"
    );
    let (c, s) = (&report.client, &report.server);
    for ((_, label, a), (_, _, b)) in counter_items(c).into_iter().zip(counter_items(s)) {
        let show = |v: f64| {
            if v.fract() == 0.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        };
        println!(" {label:<32} {:>16} {:>16}", show(a), show(b));
    }
    let path = |c: &CountersSnapshot| {
        c.main_data_path()
            .map_or("-".to_string(), |p| format!("{p:?}"))
    };
    println!(" {:<32} {:>16} {:>16}", "data path", path(c), path(s));
    println!("{dash}");
}

/// `send_bw`'s receiver view: the policy, the injected faults and, for a cold ring, the
/// throughput over time.
fn print_streams(report: &PerftestReport, dash: &str) {
    println!(" Receive faults  : {}", report.receive_fault);
    match &report.rnpf {
        Some(f) => println!(
            " Injected        : one receive in {} on never-mapped memory, {} faults",
            f.every,
            match f.kind {
                FaultKind::Minor => "minor (pages in memory)",
                FaultKind::Major => "major (pages of a file on disk, not cached)",
            }
        ),
        None => println!(" Injected        : none"),
    }
    println!(
        " {:<10} {:<12} {:>8} {:>16} {:>14} {:>20}",
        "#bytes", "#messages", "#faults", "seconds", "MB/sec", "ring filled[ms]"
    );
    for s in &report.streams {
        println!(
            " {:<10} {:<12} {:>8} {:>16.6} {:>14.2} {:>20}",
            s.bytes,
            s.messages,
            s.faults,
            s.seconds,
            (s.bytes * s.messages) as f64 / s.seconds.max(1e-9) / 1e6,
            s.ring_filled_ms
                .map_or("-".to_string(), |t| format!("{t:.2}"))
        );
        if s.cached_at_start > 0 {
            println!(
                " note: {} pages of the major-fault file were in the page cache at the start",
                s.cached_at_start
            );
        }
    }
    if let Some(s) = report.streams.iter().find(|s| s.timeline.len() > 1) {
        println!(" #timeline (receiver, {} B): t_end[ms] MB/sec", s.bytes);
        for (t, mbs) in &s.timeline {
            println!(" #t {t:.3} {mbs:.2}");
        }
    }
    println!("{dash}");
}
