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
//! span before the loop (a receiver that knows where data will land, seed 003); with
//! `pinned` the target's buffer is registered once (pinning it per iteration would need a
//! key exchange per message). The `memcpy` reference copies the same sizes in the same run,
//! into a fresh destination per iteration under `--cold`.

use std::time::{Duration, Instant};

use pagewire_transport::boot::Bootstrap;
use pagewire_transport::nic::soft::SoftNic;
use pagewire_transport::nic::{
    Access, Advice, Completion, CountersSnapshot, Endpoint, Nic, Opcode, QpCaps, RecvWr, SendWr,
    Sge, WcStatus,
};
use pagewire_transport::sys::AnonMapping;
use serde::Serialize;

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
}

impl TestKind {
    fn is_bw(self) -> bool {
        matches!(self, TestKind::WriteBw | TestKind::ReadBw)
    }

    fn title(self) -> &'static str {
        match self {
            TestKind::WriteBw => "RDMA_Write BW Test",
            TestKind::WriteLat => "RDMA_Write Latency Test",
            TestKind::ReadBw => "RDMA_Read BW Test",
            TestKind::ReadLat => "RDMA_Read Latency Test",
            TestKind::SendLat => "Send Latency Test",
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
    /// Outstanding work requests in bandwidth tests (perftest's `tx_depth`).
    pub tx_depth: usize,
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

/// Everything a rank needs for the run.
struct Ctx<'a> {
    boot: &'a dyn Bootstrap,
    nic: &'a SoftNic,
    qp: u32,
    cq: u32,
    implicit: Option<u32>,
}

impl Ctx<'_> {
    fn wait(&self) -> anyhow::Result<Completion> {
        let mut out = Vec::with_capacity(1);
        let start = Instant::now();
        loop {
            if self.nic.poll_cq(self.cq, &mut out, 1)? == 1 {
                let c = out[0];
                if c.status != WcStatus::Success {
                    anyhow::bail!("work request {} failed: {}", c.wr_id, c.status);
                }
                return Ok(c);
            }
            if start.elapsed() > Duration::from_secs(120) {
                anyhow::bail!("no completion within 120 s");
            }
        }
    }

    fn exchange(&self, addr: u64, key: u32) -> anyhow::Result<(u64, u32)> {
        let mut b = addr.to_le_bytes().to_vec();
        b.extend_from_slice(&key.to_le_bytes());
        let all = self.boot.allgather(&b)?;
        let peer = &all[1 - self.boot.rank()];
        Ok((
            u64::from_le_bytes(peer[0..8].try_into()?),
            u32::from_le_bytes(peer[8..12].try_into()?),
        ))
    }
}

/// A buffer with its registration (or the implicit key), deregistered on drop.
struct Registered<'a> {
    nic: &'a SoftNic,
    map: AnonMapping,
    lkey: u32,
    own_mr: bool,
}

impl<'a> Registered<'a> {
    fn new(ctx: &Ctx<'a>, len: usize, mr: MrMode, touch: bool) -> anyhow::Result<Registered<'a>> {
        let mut map = AnonMapping::new(len)?;
        if touch {
            map.as_mut_slice().fill(0x5a);
        }
        let (lkey, own_mr) = match (mr, ctx.implicit) {
            (MrMode::ImplicitOdp, Some(k)) => (k, false),
            _ => (
                ctx.nic
                    .register(map.addr(), map.len() as u64, mr.access())?
                    .lkey,
                true,
            ),
        };
        Ok(Registered {
            nic: ctx.nic,
            map,
            lkey,
            own_mr,
        })
    }

    fn addr(&self) -> u64 {
        self.map.addr()
    }

    fn prefetch(&self, offset: usize, len: usize, write: bool) -> anyhow::Result<()> {
        let advice = if write {
            Advice::PrefetchWrite
        } else {
            Advice::Prefetch
        };
        self.nic
            .advise(self.lkey, self.addr() + offset as u64, len as u64, advice)?;
        Ok(())
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if self.own_mr {
            let _ = self.nic.deregister(self.lkey);
        }
    }
}

fn sge(addr: u64, len: usize, lkey: u32) -> Sge {
    Sge {
        addr,
        len: len as u32,
        lkey,
    }
}

fn post(
    ctx: &Ctx<'_>,
    wr_id: u64,
    opcode: Opcode,
    sgl: &[Sge],
    inline: bool,
) -> anyhow::Result<()> {
    let wr = SendWr {
        wr_id,
        opcode,
        sgl,
        inline,
        signaled: true,
    };
    // SAFETY: every buffer named here is a `Registered` mapping owned by the caller that
    // outlives the work request (dropped only after its completion is polled), and no Rust
    // reference reads or writes it meanwhile.
    #[allow(unsafe_code)]
    unsafe {
        ctx.nic.post_send(ctx.qp, &wr)?
    };
    Ok(())
}

fn post_recv(ctx: &Ctx<'_>, wr_id: u64, sgl: &[Sge]) -> anyhow::Result<()> {
    // SAFETY: as for `post`.
    #[allow(unsafe_code)]
    unsafe {
        ctx.nic.post_recv(ctx.qp, &RecvWr { wr_id, sgl })?
    };
    Ok(())
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
    let implicit = match cfg.mr {
        MrMode::ImplicitOdp => Some(
            nic.register_implicit_odp(MrMode::ImplicitOdp.access())?
                .lkey,
        ),
        _ => None,
    };
    let ctx = Ctx {
        boot,
        nic,
        qp,
        cq,
        implicit,
    };
    boot.barrier()?;
    let start_counters = nic.counters();
    let mut results = Vec::new();
    for &size in &cfg.sizes {
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
        };
        boot.barrier()?;
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

/// The target memory of the run: one warm buffer, or a span of never-touched slices.
struct Target<'a> {
    buf: Registered<'a>,
    layout: TargetLayout,
}

/// Where iteration `i` lands in a target: the same warm buffer, or slice `i` of a span.
#[derive(Clone, Copy)]
struct TargetLayout {
    slices: usize,
    size: usize,
    cold: bool,
}

impl TargetLayout {
    fn of(cfg: &PerftestConfig, size: usize, iters: usize) -> TargetLayout {
        let cold = cfg.cold && cfg.mr != MrMode::Pinned;
        let slices = if cold {
            iters.clamp(1, ((1usize << 30) / size.max(1)).max(1))
        } else {
            1
        };
        TargetLayout { slices, size, cold }
    }

    fn offset(&self, i: usize) -> usize {
        if self.cold {
            (i % self.slices) * self.size
        } else {
            0
        }
    }
}

impl<'a> Target<'a> {
    fn new(
        ctx: &Ctx<'a>,
        cfg: &PerftestConfig,
        size: usize,
        iters: usize,
        write: bool,
    ) -> anyhow::Result<Target<'a>> {
        let layout = TargetLayout::of(cfg, size, iters);
        let len = size.max(1) * layout.slices;
        let buf = Registered::new(ctx, len, cfg.mr, !layout.cold)?;
        if cfg.mr == MrMode::OdpPrefetch {
            buf.prefetch(0, len, write)?;
        }
        Ok(Target { buf, layout })
    }

    fn offset(&self, i: usize) -> usize {
        self.layout.offset(i)
    }
}

/// The buffer reused by every iteration when not `--cold`: touched, registered, and
/// prefetched in `odp-prefetch` mode (`write`: the NIC will write it).
fn warm_buffer<'a>(
    ctx: &Ctx<'a>,
    cfg: &PerftestConfig,
    size: usize,
    write: bool,
) -> anyhow::Result<Registered<'a>> {
    let warm = Registered::new(ctx, size.max(1), cfg.mr, true)?;
    if cfg.mr == MrMode::OdpPrefetch && !cfg.cold {
        warm.prefetch(0, size.max(1), write)?;
    }
    Ok(warm)
}

/// The initiator's local buffer for iteration `i`: the warm one, or a fresh one.
fn local_buffer<'a>(
    ctx: &Ctx<'a>,
    cfg: &PerftestConfig,
    warm: &Registered<'a>,
    size: usize,
    write: bool,
) -> anyhow::Result<Option<Registered<'a>>> {
    if !cfg.cold {
        let _ = warm;
        return Ok(None);
    }
    let fresh = Registered::new(ctx, size.max(1), cfg.mr, false)?;
    if cfg.mr == MrMode::OdpPrefetch && size > 0 {
        fresh.prefetch(0, size, write)?;
    }
    Ok(Some(fresh))
}

fn warm_up(
    ctx: &Ctx<'_>,
    cfg: &PerftestConfig,
    local: &Registered<'_>,
    raddr: u64,
    rkey: u32,
    size: usize,
) -> anyhow::Result<()> {
    // Untimed passes that fault every page of the warm buffers in (ODP) and set up the path.
    if cfg.cold {
        return Ok(());
    }
    let op = match cfg.test {
        TestKind::ReadBw | TestKind::ReadLat => Opcode::RdmaRead {
            remote_addr: raddr,
            rkey,
        },
        _ => Opcode::RdmaWrite {
            remote_addr: raddr,
            rkey,
        },
    };
    for i in 0..2 {
        post(
            ctx,
            u64::MAX - i,
            op,
            &[sge(local.addr(), size, local.lkey)],
            false,
        )?;
        ctx.wait()?;
    }
    Ok(())
}

fn bandwidth(
    ctx: &Ctx<'_>,
    cfg: &PerftestConfig,
    size: usize,
    iters: usize,
) -> anyhow::Result<Option<SizeResult>> {
    let read = cfg.test == TestKind::ReadBw;
    if ctx.boot.rank() == 1 {
        let target = Target::new(ctx, cfg, size, iters, !read)?;
        ctx.exchange(target.buf.addr(), target.buf.lkey)?;
        ctx.boot.barrier()?; // the server's NIC works without its CPU: one-sided
        return Ok(None);
    }
    let (raddr, rkey) = ctx.exchange(0, 0)?;
    let target = TargetLayout::of(cfg, size, iters);
    let warm = warm_buffer(ctx, cfg, size.max(1), read)?;
    warm_up(ctx, cfg, &warm, raddr, rkey, size)?;
    // Outstanding requests; cold buffers also bounded by memory (and memlock when pinned).
    let mut depth = cfg.tx_depth.max(1);
    if cfg.cold {
        depth = depth.min(((64usize << 20) / size.max(1)).max(1));
        if cfg.mr == MrMode::Pinned {
            if let (pagewire_transport::nic::soft::MemlockLimit { bytes: Some(l), .. }, pinned) =
                ctx.nic.memlock()
            {
                depth = depth.min((l.saturating_sub(pinned) as usize / size.max(4096)).max(1));
            }
        }
    }
    let slots = (iters / 16).max(1);
    let mut stamps = Vec::with_capacity(iters);
    let mut posted_at = Vec::with_capacity(iters);
    let mut inflight: std::collections::VecDeque<Option<Registered<'_>>> = Default::default();
    let mut posted = 0usize;
    let start = Instant::now();
    while stamps.len() < iters {
        while posted < iters && inflight.len() < depth {
            let fresh = local_buffer(ctx, cfg, &warm, size, read)?;
            let (laddr, lkey) = fresh
                .as_ref()
                .map_or((warm.addr(), warm.lkey), |f| (f.addr(), f.lkey));
            let remote_addr = raddr + target.offset(posted) as u64;
            let op = if read {
                Opcode::RdmaRead { remote_addr, rkey }
            } else {
                Opcode::RdmaWrite { remote_addr, rkey }
            };
            post(ctx, posted as u64, op, &[sge(laddr, size, lkey)], false)?;
            inflight.push_back(fresh);
            posted_at.push(start.elapsed());
            posted += 1;
        }
        ctx.wait()?;
        inflight.pop_front();
        stamps.push(start.elapsed());
    }
    let total = start.elapsed().as_secs_f64();
    ctx.boot.barrier()?;
    let avg = (size * iters) as f64 / total / 1e6;
    // Peak: the best window of `slots` consecutive requests, from the first one's post to
    // the last one's completion (perftest's per-iteration post/completion stamps).
    let mut peak = avg;
    for (first, last) in (0..iters).step_by(slots).map(|f| (f, f + slots - 1)) {
        if last < iters {
            let dt = (stamps[last] - posted_at[first]).as_secs_f64();
            if dt > 0.0 {
                peak = peak.max((size * slots) as f64 / dt / 1e6);
            }
        }
    }
    Ok(Some(SizeResult {
        bytes: size,
        iterations: iters,
        bw_peak_mbs: Some(peak),
        bw_avg_mbs: Some(avg),
        msg_rate_mpps: Some(iters as f64 / total / 1e6),
        lat_us: None,
        memcpy: 0.0,
        ratio_to_memcpy: 0.0,
    }))
}

fn stats(mut samples: Vec<f64>) -> LatencyStats {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let avg = samples.iter().sum::<f64>() / n as f64;
    let var = samples.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    let pct = |p: f64| samples[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
    LatencyStats {
        min: samples[0],
        typical: samples[n / 2],
        max: samples[n - 1],
        avg,
        stdev: var.sqrt(),
        p99: pct(0.99),
        p999: pct(0.999),
    }
}

fn latency_result(size: usize, iters: usize, samples: Vec<f64>) -> SizeResult {
    SizeResult {
        bytes: size,
        iterations: iters,
        bw_peak_mbs: None,
        bw_avg_mbs: None,
        msg_rate_mpps: None,
        lat_us: Some(stats(samples)),
        memcpy: 0.0,
        ratio_to_memcpy: 0.0,
    }
}

/// Waits until the last byte of the landing slice holds `v` (the peer's write arrived).
fn await_byte(map: &AnonMapping, offset: usize, v: u8) -> anyhow::Result<()> {
    let b = map.atomic_u8(offset);
    let start = Instant::now();
    while b.load(std::sync::atomic::Ordering::Acquire) != v {
        if start.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("the peer's write did not arrive within 120 s");
        }
        std::hint::spin_loop();
    }
    Ok(())
}

fn write_latency(
    ctx: &Ctx<'_>,
    cfg: &PerftestConfig,
    size: usize,
    iters: usize,
) -> anyhow::Result<Option<SizeResult>> {
    let me = ctx.boot.rank();
    let landing = Target::new(ctx, cfg, size, iters + 1, true)?;
    let (raddr, rkey) = ctx.exchange(landing.buf.addr(), landing.buf.lkey)?;
    let mut warm = warm_buffer(ctx, cfg, size, false)?;
    ctx.boot.barrier()?;
    let mut samples = Vec::with_capacity(iters);
    for i in 0..=iters {
        // Iteration 0 is an untimed warm-up.
        let v = (i % 251) as u8 + 1;
        let off = landing.offset(i);
        let t0 = Instant::now();
        if me == 1 {
            await_byte(&landing.buf.map, off + size - 1, v)?;
        }
        let mut fresh = local_buffer(ctx, cfg, &warm, size, false)?;
        let src = match fresh.as_mut() {
            Some(f) => f,
            None => &mut warm,
        };
        src.map.as_mut_slice()[size - 1] = v;
        post(
            ctx,
            i as u64,
            Opcode::RdmaWrite {
                remote_addr: raddr + off as u64,
                rkey,
            },
            &[sge(src.addr(), size, src.lkey)],
            false,
        )?;
        ctx.wait()?;
        if me == 0 {
            await_byte(&landing.buf.map, off + size - 1, v)?;
            if i > 0 {
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
    }
    Ok((me == 0).then(|| latency_result(size, iters, samples)))
}

fn read_latency(
    ctx: &Ctx<'_>,
    cfg: &PerftestConfig,
    size: usize,
    iters: usize,
) -> anyhow::Result<Option<SizeResult>> {
    if ctx.boot.rank() == 1 {
        let source = Target::new(ctx, cfg, size, iters, false)?;
        ctx.exchange(source.buf.addr(), source.buf.lkey)?;
        ctx.boot.barrier()?;
        return Ok(None);
    }
    let (raddr, rkey) = ctx.exchange(0, 0)?;
    let source = TargetLayout::of(cfg, size, iters);
    let warm = warm_buffer(ctx, cfg, size, true)?;
    warm_up(ctx, cfg, &warm, raddr, rkey, size)?;
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters {
        let t0 = Instant::now();
        let fresh = local_buffer(ctx, cfg, &warm, size, true)?;
        let (laddr, lkey) = fresh
            .as_ref()
            .map_or((warm.addr(), warm.lkey), |f| (f.addr(), f.lkey));
        let remote_addr = raddr + source.offset(i) as u64;
        post(
            ctx,
            i as u64,
            Opcode::RdmaRead { remote_addr, rkey },
            &[sge(laddr, size, lkey)],
            false,
        )?;
        ctx.wait()?;
        drop(fresh);
        samples.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    ctx.boot.barrier()?;
    Ok(Some(latency_result(size, iters, samples)))
}

fn send_latency(
    ctx: &Ctx<'_>,
    cfg: &PerftestConfig,
    size: usize,
    iters: usize,
) -> anyhow::Result<Option<SizeResult>> {
    let me = ctx.boot.rank();
    let landing = Target::new(ctx, cfg, size, iters + 1, true)?;
    let warm = warm_buffer(ctx, cfg, size, false)?;
    let inline = size <= QpCaps::default().max_inline as usize;
    let recv = |i: usize| -> anyhow::Result<()> {
        let off = landing.offset(i);
        post_recv(
            ctx,
            1 << 32 | i as u64,
            &[sge(landing.buf.addr() + off as u64, size, landing.buf.lkey)],
        )
    };
    recv(0)?;
    ctx.boot.barrier()?;
    let mut samples = Vec::with_capacity(iters);
    for i in 0..=iters {
        let t0 = Instant::now();
        if me == 1 {
            ctx.wait()?; // the ping
            if i < iters {
                recv(i + 1)?; // for the next ping
            }
        }
        let fresh = local_buffer(ctx, cfg, &warm, size, false)?;
        let (laddr, lkey) = fresh
            .as_ref()
            .map_or((warm.addr(), warm.lkey), |f| (f.addr(), f.lkey));
        if me == 0 && i < iters {
            recv(i + 1)?; // for the next pong
        }
        post(
            ctx,
            i as u64,
            Opcode::Send,
            &[sge(laddr, size, lkey)],
            inline && !cfg.cold,
        )?;
        // Two completions on the client: its send and the pong; one on the server.
        let mut left = if me == 0 { 2 } else { 1 };
        while left > 0 {
            ctx.wait()?;
            left -= 1;
        }
        if me == 0 && i > 0 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    ctx.boot.barrier()?;
    Ok((me == 0).then(|| latency_result(size, iters, samples)))
}

/// The single-copy reference of the same size in the same run: MB/s for bandwidth tests,
/// microseconds per copy for latency tests; and the test's ratio to it.
fn memcpy_reference(cfg: &PerftestConfig, size: usize, iters: usize, r: &SizeResult) -> (f64, f64) {
    // Page-aligned mappings like the NIC's buffers: on some machines memcpy's speed depends
    // on where small heap buffers land, and the reference should not.
    let size_b = size.max(1);
    let mut src_map = AnonMapping::new(size_b).expect("mmap for the memcpy reference");
    src_map.as_mut_slice().fill(0x3c);
    let src = &src_map.as_slice()[..size_b];
    let mut warm_map = AnonMapping::new(size_b).expect("mmap for the memcpy reference");
    let warm = &mut warm_map.as_mut_slice()[..size_b];
    warm.fill(1);
    let mut per_copy = Vec::with_capacity(iters);
    let start = Instant::now();
    for _ in 0..iters {
        let t0 = Instant::now();
        if cfg.cold {
            let mut fresh = AnonMapping::new(size_b).expect("mmap for the memcpy reference");
            fresh.as_mut_slice()[..size_b].copy_from_slice(src);
            std::hint::black_box(&fresh);
        } else {
            warm.copy_from_slice(src);
            std::hint::black_box(&mut *warm);
        }
        per_copy.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let total = start.elapsed().as_secs_f64();
    if cfg.test.is_bw() {
        let mbs = (size * iters) as f64 / total / 1e6;
        (mbs, r.bw_avg_mbs.unwrap_or(0.0) / mbs)
    } else {
        per_copy.sort_by(|a, b| a.total_cmp(b));
        let typical = per_copy[per_copy.len() / 2];
        (typical, r.lat_us.map_or(0.0, |l| l.typical) / typical)
    }
}

/// Prints the report as perftest-style tables followed by the counters.
pub fn print(report: &PerftestReport, iters_note: bool) {
    let dash = "-".repeat(87);
    println!("{dash}");
    println!("                    {}", report.test.title());
    println!(" Provider        : {}", report.provider);
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
