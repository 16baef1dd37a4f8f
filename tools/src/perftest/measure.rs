//! The measured loops: bandwidth (a window of posted requests), WRITE/READ/SEND latency
//! (half a round trip), their statistics, and the `memcpy` reference.

use super::*;

pub(super) fn bandwidth(
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

pub(super) fn stats(mut samples: Vec<f64>) -> LatencyStats {
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

pub(super) fn latency_result(size: usize, iters: usize, samples: Vec<f64>) -> SizeResult {
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
pub(super) fn await_byte(map: &AnonMapping, offset: usize, v: u8) -> anyhow::Result<()> {
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

pub(super) fn write_latency(
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

pub(super) fn read_latency(
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

pub(super) fn send_latency(
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
pub(super) fn memcpy_reference(
    cfg: &PerftestConfig,
    size: usize,
    iters: usize,
    r: &SizeResult,
) -> (f64, f64) {
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
