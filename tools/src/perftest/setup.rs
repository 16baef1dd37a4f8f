//! What a perftest run sets up: the NIC context, registrations released on drop, work
//! requests, the target's landing or source memory, and warm-up.

use super::*;

/// Everything a rank needs for the run.
pub(super) struct Ctx<'a> {
    pub(super) boot: &'a dyn Bootstrap,
    pub(super) nic: &'a SoftNic,
    pub(super) qp: u32,
    pub(super) cq: u32,
    pub(super) implicit: Option<u32>,
}

impl Ctx<'_> {
    pub(super) fn wait(&self) -> anyhow::Result<Completion> {
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

    pub(super) fn exchange(&self, addr: u64, key: u32) -> anyhow::Result<(u64, u32)> {
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

/// A buffer with its registration (or the implicit key), deregistered on drop (before the
/// mapping goes: fields drop in order).
pub(super) struct Registered<'a> {
    /// Held for its `Drop` (none with the implicit key, which the run owns).
    _region: Option<Region<&'a SoftNic>>,
    nic: &'a SoftNic,
    pub(super) map: AnonMapping,
    pub(super) lkey: u32,
}

impl<'a> Registered<'a> {
    pub(super) fn new(
        ctx: &Ctx<'a>,
        len: usize,
        mr: MrMode,
        touch: bool,
    ) -> anyhow::Result<Registered<'a>> {
        let mut map = AnonMapping::new(len)?;
        if touch {
            map.as_mut_slice().fill(0x5a);
        }
        let region = match (mr, ctx.implicit) {
            (MrMode::ImplicitOdp, Some(_)) => None,
            _ => Some(Region::register(
                ctx.nic,
                map.addr(),
                map.len() as u64,
                mr.access(),
            )?),
        };
        let lkey = region
            .as_ref()
            .map_or(ctx.implicit.unwrap_or_default(), Region::lkey);
        Ok(Registered {
            _region: region,
            nic: ctx.nic,
            map,
            lkey,
        })
    }

    pub(super) fn addr(&self) -> u64 {
        self.map.addr()
    }

    pub(super) fn prefetch(&self, offset: usize, len: usize, write: bool) -> anyhow::Result<()> {
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

pub(super) fn sge(addr: u64, len: usize, lkey: u32) -> Sge {
    Sge {
        addr,
        len: len as u32,
        lkey,
    }
}

pub(super) fn post(
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

pub(super) fn post_recv(ctx: &Ctx<'_>, wr_id: u64, sgl: &[Sge]) -> anyhow::Result<()> {
    // SAFETY: as for `post`.
    #[allow(unsafe_code)]
    unsafe {
        ctx.nic.post_recv(ctx.qp, &RecvWr { wr_id, sgl })?
    };
    Ok(())
}

/// The target memory of the run: one warm buffer, or a span of never-touched slices.
pub(super) struct Target<'a> {
    pub(super) buf: Registered<'a>,
    pub(super) layout: TargetLayout,
}

/// Where iteration `i` lands in a target: the same warm buffer, or slice `i` of a span.
#[derive(Clone, Copy)]
pub(super) struct TargetLayout {
    pub(super) slices: usize,
    pub(super) size: usize,
    pub(super) cold: bool,
}

impl TargetLayout {
    pub(super) fn of(cfg: &PerftestConfig, size: usize, iters: usize) -> TargetLayout {
        let cold = cfg.cold && cfg.mr != MrMode::Pinned;
        let slices = if cold {
            iters.clamp(1, ((1usize << 30) / size.max(1)).max(1))
        } else {
            1
        };
        TargetLayout { slices, size, cold }
    }

    pub(super) fn offset(&self, i: usize) -> usize {
        if self.cold {
            (i % self.slices) * self.size
        } else {
            0
        }
    }
}

impl<'a> Target<'a> {
    pub(super) fn new(
        ctx: &Ctx<'a>,
        cfg: &PerftestConfig,
        size: usize,
        iters: usize,
        write: bool,
    ) -> anyhow::Result<Target<'a>> {
        let layout = TargetLayout::of(cfg, size, iters);
        let len = size.max(1) * layout.slices;
        let buf = Registered::new(ctx, len, cfg.mr, !layout.cold || cfg.resident)?;
        if cfg.mr == MrMode::OdpPrefetch {
            buf.prefetch(0, len, write)?;
        }
        Ok(Target { buf, layout })
    }

    pub(super) fn offset(&self, i: usize) -> usize {
        self.layout.offset(i)
    }
}

/// The buffer reused by every iteration when not `--cold`: touched, registered, and
/// prefetched in `odp-prefetch` mode (`write`: the NIC will write it).
pub(super) fn warm_buffer<'a>(
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
pub(super) fn local_buffer<'a>(
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
    let fresh = Registered::new(ctx, size.max(1), cfg.mr, cfg.resident)?;
    if cfg.mr == MrMode::OdpPrefetch && size > 0 {
        fresh.prefetch(0, size, write)?;
    }
    Ok(Some(fresh))
}

pub(super) fn warm_up(
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
