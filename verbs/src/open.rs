//! Opening the device: probing each device and port for what the provider needs (RC,
//! the GID, inline size, ODP), choosing one, and the fork-safety setup.
#![forbid(unsafe_code)]

use super::*;

/// What probing one device found usable.
pub(super) struct Chosen {
    ctx: Arc<ffi::Context>,
    pd: Arc<ffi::ProtectionDomain>,
    attr: rdma_sys::ibv_device_attr_ex,
    port: PortInfo,
    max_inline: u32,
}

/// `PAGEWIRE_FORK_SAFE=1`: fork support in libibverbs, unless it is on already or the kernel
/// makes it unnecessary (see `fork`).
pub(super) fn enable_fork_safety() -> Result<()> {
    let status = ffi::fork_status().map(fork::ForkStatus::from_raw);
    match fork::plan(status) {
        fork::ForkPlan::AlreadySafe => Ok(()),
        fork::ForkPlan::CallForkInit => ffi::fork_init()
            .map_err(|e| Error::InvalidArgument(fork::failure(e.raw_os_error(), status))),
    }
}

/// Opens device `i` and checks it can serve: device and port queries, a port (active, or
/// `PAGEWIRE_PORT`), a GID where one is needed, a protection domain, an RC queue pair.
/// `Err` says why not, for the no-device message.
pub(super) fn probe(
    list: &ffi::DeviceList,
    i: usize,
    name: &str,
    config: &VerbsConfig,
) -> std::result::Result<Chosen, String> {
    let ctx = list
        .open(i)
        .map_err(|e| format!("cannot be opened (ibv_open_device: {e})"))?;
    let attr = ctx
        .query_device_ex()
        .map_err(|e| format!("cannot be queried (ibv_query_device_ex: {e})"))?;
    let mut ports = Vec::new();
    let mut attrs = HashMap::new();
    for p in 1..=attr.orig_attr.phys_port_cnt {
        let a = ctx
            .query_port(p)
            .map_err(|e| format!("port {p} cannot be queried (ibv_query_port: {e})"))?;
        ports.push(PortProbe {
            num: p,
            state: a.state,
        });
        attrs.insert(p, a);
    }
    let port = config::pick_port(&ports, config.port)?;
    let pa = attrs[&port];
    let link = LinkLayer::from_raw(pa.link_layer)
        .ok_or_else(|| format!("port {port} has an unknown link layer {}", pa.link_layer))?;
    let grh_required = pa.flags & PORT_FLAG_GRH_REQUIRED != 0;
    let mut table = Vec::new();
    if config::needs_gid(link, grh_required, config.gid_index) {
        let len = u32::try_from(pa.gid_tbl_len).unwrap_or(0);
        for index in 0..len {
            match ctx.query_gid_ex(port, index) {
                Ok(Some(e)) => table.push(GidProbe {
                    index,
                    kind: GidKind::from_raw(e.gid_type),
                    gid: ffi::gid_bytes(&e.gid),
                }),
                Ok(None) => {}
                Err(e) => return Err(format!("port {port}: ibv_query_gid_ex({index}): {e}")),
            }
        }
    }
    let gid_index = config::pick_gid(link, grh_required, config.gid_index, &table)
        .map_err(|why| format!("port {port} {why}"))?;
    let gid = gid_index.and_then(|i| table.iter().find(|g| g.index == i).map(|g| g.gid));
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("gives no protection domain (ibv_alloc_pd: {e})"))?;
    let max_inline = probe_inline(&ctx, &pd)?;
    Ok(Chosen {
        port: PortInfo {
            device: name.to_string(),
            port,
            link,
            lid: pa.lid,
            gid_index,
            gid,
            active_mtu: qp_state::mtu_bytes(pa.active_mtu),
            active_mtu_code: pa.active_mtu,
        },
        ctx,
        pd,
        attr,
        max_inline,
    })
}

/// The inline size the device grants an RC queue pair: the first size of
/// [`caps::INLINE_PROBES`] for which `ibv_create_qp` succeeds, as `cap.max_inline_data`
/// reads after the call. The probe's CQ and queue pairs are destroyed at once.
pub(super) fn probe_inline(
    ctx: &Arc<ffi::Context>,
    pd: &Arc<ffi::ProtectionDomain>,
) -> std::result::Result<u32, String> {
    let cq = ctx
        .create_cq(1)
        .map_err(|e| format!("gives no completion queue (ibv_create_cq: {e})"))?;
    let mut last = None;
    for want in caps::INLINE_PROBES {
        let cap = ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: want,
        };
        match pd.create_rc_qp(&cq, &cq, cap) {
            Ok((_qp, got)) => return Ok(got.max_inline_data),
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "cannot create an RC queue pair (ibv_create_qp: {})",
        last.map_or_else(|| "no attempt".into(), |e| e.to_string())
    ))
}

impl VerbsNic {
    /// Opens the device `config` names, or the first with an active port; chooses the port
    /// and GID; allocates the protection domain. Not collective: endpoints are exchanged
    /// later, per queue pair.
    ///
    /// With no usable device (none present, as on machines without RDMA hardware; the kernel
    /// without RDMA support; no active port; `PAGEWIRE_DEVICE` not found) it returns
    /// [`Error::NoRdmaDevice`], whose one-line message names the soft provider.
    pub fn open(boot: &dyn Bootstrap, config: VerbsConfig) -> Result<VerbsNic> {
        if config.fork_safe {
            enable_fork_safety()?;
        }
        if !ffi::has_query_gid_ex() {
            return Err(Error::Unsupported {
                device: "the libibverbs in this process".into(),
                what: format!(
                    "ibv_query_gid_ex (_ibv_query_gid_ex, IBVERBS_1.11), which the verbs provider \
                     needs: it is older than rdma-core {}",
                    rdma_core_version::MIN_RDMA_CORE
                ),
                hint: "install a newer rdma-core, or use the soft provider \
                       (PAGEWIRE_TRANSPORT=soft)",
            });
        }
        let list = ffi::DeviceList::get().map_err(|e| Error::NoRdmaDevice {
            detail: match e.raw_os_error() {
                Some(libc::ENOSYS) => "no RDMA device found: the kernel has no RDMA support \
                     (ibv_get_device_list: ENOSYS)"
                    .to_string(),
                _ => format!("no RDMA device found: ibv_get_device_list failed: {e}"),
            },
        })?;
        let names = list.names();
        let candidates = config::candidates(&names, config.device.as_deref())
            .map_err(|detail| Error::NoRdmaDevice { detail })?;
        let mut reasons = Vec::new();
        let mut chosen = None;
        for i in candidates {
            match probe(&list, i, &names[i], &config) {
                Ok(c) => {
                    chosen = Some(c);
                    break;
                }
                Err(why) => reasons.push(format!("{} {why}", names[i])),
            }
        }
        drop(list);
        let Some(c) = chosen else {
            return Err(Error::NoRdmaDevice {
                detail: format!("no usable RDMA device: {}", reasons.join("; ")),
            });
        };
        // Asynchronous events are read from the poll path, which must not block.
        c.ctx
            .set_async_nonblocking()
            .map_err(|e| os("fcntl(async_fd, F_SETFL, O_NONBLOCK)".into(), e))?;
        let device = format!("{} port {}", c.port.device, c.port.port);
        let caps = caps::capabilities(&c.attr, &device, c.max_inline);
        let limits = caps::limits(&c.attr);
        Ok(VerbsNic {
            rank: boot.rank(),
            responder_may_fault: caps.odp_rc_recv
                || caps.odp_rc_write
                || caps.odp_rc_read
                || limits.odp_rc_atomic,
            caps,
            limits,
            port: c.port,
            counters: Counters::default(),
            qps: RwLock::new(HashMap::new()),
            cqs: RwLock::new(Vec::new()),
            regions: Mutex::new(HashMap::new()),
            recent_errors: Mutex::new(VecDeque::new()),
            recent_events: Mutex::new(VecDeque::new()),
            device_failed: AtomicBool::new(false),
            async_check: events::CheckGate::default(),
            opened: Instant::now(),
            pd: c.pd,
            ctx: c.ctx,
        })
    }
}
