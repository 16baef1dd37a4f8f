//! The verbs provider: the [`Nic`] trait over rdma-core's libibverbs (cargo feature `verbs`,
//! DESIGN.md "The verbs provider"), bound to the system rdma-core through `rdma-sys`.
//!
//! **Status: built, clippy-checked and unit-tested on a machine without RDMA hardware.
//! Nothing in this module has run against a device.** What does run here is the no-device
//! path (libibverbs finds no device) and the pure parts: attribute and state-transition
//! builders, status and opcode mapping, capability parsing, endpoint encoding, device, port
//! and GID choice, the send gate, the ODP and completion-queue depth checks, RNR settings,
//! prefetch batching, fork-safety decisions and asynchronous-event handling. The hardware
//! test plan is in `docs/verbs.md`.
//!
//! A thin mapping, each method one or a few verbs calls (see `ffi` for the calls):
//!
//! | trait method | libibverbs |
//! |---|---|
//! | [`VerbsNic::open`] | `ibv_is_fork_initialized`, `ibv_fork_init` (if `PAGEWIRE_FORK_SAFE=1`), `ibv_get_device_list`, `ibv_open_device`, `ibv_query_device_ex`, `ibv_query_port`, `ibv_query_gid_ex`, `ibv_alloc_pd`, probe `ibv_create_cq`/`ibv_create_qp` for the inline size |
//! | `register` | `ibv_reg_mr(pd, addr, len, access)`, `IBV_ACCESS_ON_DEMAND` for ODP (with the RC ODP bit of every operation the rights allow, `caps::missing_odp_operations`) |
//! | `register_implicit_odp` | `ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND \| ...)` |
//! | `deregister` | `ibv_dereg_mr` |
//! | `advise` | `ibv_advise_mr(pd, PREFETCH[_WRITE], IBV_ADVISE_MR_FLAG_FLUSH, sges)`, at most 4095 SGEs a call |
//! | `create_cq` | `ibv_create_cq(ctx, depth, NULL, NULL, 0)` |
//! | `create_qp` | `ibv_create_qp` (RC, no SRQ), `ibv_modify_qp` RESET -> INIT, once its depths fit its completion queues (`cq`) |
//! | `endpoint` | (QPN, PSN, LID, GID, MTU encoded; see `endpoint`) |
//! | `connect` | `ibv_modify_qp` INIT -> RTR -> RTS (RNR settings: `qp_state::rnr_retry_for`, `qp_state::rnr_timer_us_for`) |
//! | `post_send` / `post_recv` | `ibv_post_send` (in RTS, or ERROR after RTS) / `ibv_post_recv`, one work request |
//! | `poll_cq` | `ibv_poll_cq`; when a poll comes back short, at most every 10 ms, `ibv_get_async_event` + `ibv_ack_async_event` (`events`) |
//!
//! **Ownership.** Handles own their parents through `Arc` (`ffi`): a queue pair keeps its
//! CQs and PD, a region its PD, and those the device context; dropping the [`VerbsNic`]
//! destroys queue pairs, then CQs, regions, the PD and the context, in that order whatever
//! the field order, and a half-made object (a QP whose INIT transition failed) is destroyed
//! where the error returns. `unsafe` lives in `ffi`; the only `unsafe` outside it is the
//! trait's own `post_send`/`post_recv`, which forward their contract to `ffi`.
//!
//! **Counters.** Filled: registrations and deregistrations; pinned bytes now and peak for
//! non-ODP regions (page-rounded per region, as the kernel charges each registration to
//! `RLIMIT_MEMLOCK`, overlapping regions counted twice like the kernel does); prefetched
//! pages (pages *asked for*: `ibv_advise_mr` does not say how many were absent); inline
//! bytes; error completions. Left at 0: the NPF counters (`npf_*`), RNR retries and
//! invalidated pages: on hardware those events happen in the NIC and the kernel driver, whose
//! counters live in the driver's sysfs/debugfs (for mlx5, ODP page-fault and invalidation
//! counts) and are **not read yet**; and the soft provider's data-path byte counters
//! (CMA/staged), which do not apply.
//!
//! **Environment.** `PAGEWIRE_DEVICE`, `PAGEWIRE_PORT`, `PAGEWIRE_GID_INDEX`,
//! `PAGEWIRE_FORK_SAFE` ([`VerbsConfig`]). The locked-memory limit is the kernel's
//! `RLIMIT_MEMLOCK` (`ulimit -l`); `PAGEWIRE_MEMLOCK_LIMIT` is the soft provider's and has no
//! effect here.
#![deny(unsafe_code)]

mod caps;
mod config;
mod cq;
mod endpoint;
mod events;
mod ffi;
mod fork;
mod qp_state;
mod rdma_core_version;
mod wr;

pub use config::{LinkLayer, VerbsConfig};

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use rdma_sys::{ibv_qp_cap, ibv_wc};

use crate::boot::Bootstrap;
use crate::error::{Error, Result};
use crate::nic::{
    Access, Advice, Capabilities, Completion, Counters, CountersSnapshot, Endpoint, Nic, QpCaps,
    RecvWr, RegionInfo, SendWr, WcOpcode, WcStatus, PAGE_SIZE,
};

use caps::DeviceLimits;
use config::{GidKind, GidProbe, PortProbe};
use endpoint::QpAddress;
use qp_state::{QpState, QpStatus, RtrParams, SendGate};
use wr::{QueueLimits, WrRing, EMPTY_SGE, MAX_SGE, RECV_BIT};

/// `IBV_QPF_GRH_REQUIRED` in `ibv_port_attr::flags`.
const PORT_FLAG_GRH_REQUIRED: u8 = 1;
/// Completions fetched per `ibv_poll_cq` call.
const POLL_BATCH: usize = 16;
/// Error completions kept for [`VerbsNic::recent_errors`].
const RECENT_ERRORS: usize = 32;

/// The port the provider uses, as the device reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Device name (`ibv_get_device_name`), e.g. `mlx5_0`.
    pub device: String,
    /// Port number, from 1.
    pub port: u8,
    /// InfiniBand or Ethernet (RoCE).
    pub link: LinkLayer,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID index used for the GRH, if any (always on RoCE).
    pub gid_index: Option<u32>,
    /// That GID.
    pub gid: Option<[u8; 16]>,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    active_mtu_code: u32,
}

/// The raw facts of an error completion, which [`WcStatus`] may summarise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawCompletionError {
    /// The caller's work request id (`u64::MAX` if the provider could not map it back).
    pub wr_id: u64,
    /// Local queue pair number.
    pub qp_num: u32,
    /// The `ibv_wc_status` value.
    pub status: u32,
    /// `ibv_wc_status_str` of it.
    pub status_str: String,
    /// The vendor's error syndrome (`ibv_wc::vendor_err`).
    pub vendor_err: u32,
}

/// An asynchronous event the device reported (`ibv_get_async_event(3)`), as
/// [`VerbsNic::recent_async_events`] keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncEventRecord {
    /// The event's name in verbs.h, e.g. `IBV_EVENT_QP_FATAL`.
    pub event: &'static str,
    /// What it was about: `queue pair 0x1a2b`, `completion queue 0`, `port 1`, `the device`.
    pub subject: String,
}

/// One completion queue, how much of it the queue pairs on it may fill, and whether it
/// failed.
struct CqEntry {
    cq: Arc<ffi::CompletionQueue>,
    budget: Mutex<cq::CqBudget>,
    /// Set by `IBV_EVENT_CQ_ERR`: the queue overran and is unusable.
    failed: AtomicBool,
}

/// One registered region.
struct Region {
    mr: ffi::MemoryRegion,
    info: RegionInfo,
    /// Bytes this registration pinned (0 for ODP).
    pinned: u64,
}

/// One queue pair and its bookkeeping.
struct QueuePairEntry {
    qp: ffi::QueuePair,
    peer: usize,
    psn: u32,
    caps: QpCaps,
    limits: QueueLimits,
    status: Mutex<QpStatus>,
    sq: Mutex<WrRing>,
    rq: Mutex<WrRing>,
}

/// A device context with its protection domain, over libibverbs. See the module docs.
pub struct VerbsNic {
    rank: usize,
    caps: Capabilities,
    limits: DeviceLimits,
    port: PortInfo,
    /// This device may page-fault as an RC responder (ODP receive, write or read): its queue
    /// pairs ask for longer RNR waits and tell peers to retry forever (`qp_state`).
    responder_may_fault: bool,
    counters: Counters,
    qps: RwLock<HashMap<u32, Arc<QueuePairEntry>>>,
    cqs: RwLock<Vec<Arc<CqEntry>>>,
    regions: Mutex<HashMap<u32, Region>>,
    recent_errors: Mutex<VecDeque<RawCompletionError>>,
    recent_events: Mutex<VecDeque<AsyncEventRecord>>,
    /// Set by `IBV_EVENT_DEVICE_FATAL`: every poll and post fails from then on.
    device_failed: AtomicBool,
    /// When the asynchronous events were last read (`events::CheckGate`), on `opened`'s clock.
    async_check: events::CheckGate,
    opened: Instant,
    pd: Arc<ffi::ProtectionDomain>,
    ctx: Arc<ffi::Context>,
}

impl std::fmt::Debug for VerbsNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsNic")
            .field("rank", &self.rank)
            .field("port", &self.port)
            .finish()
    }
}

/// What probing one device found usable.
struct Chosen {
    ctx: Arc<ffi::Context>,
    pd: Arc<ffi::ProtectionDomain>,
    attr: rdma_sys::ibv_device_attr_ex,
    port: PortInfo,
    max_inline: u32,
}

fn os(call: String, e: io::Error) -> Error {
    Error::Os { call, source: e }
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
        Ok(VerbsNic {
            rank: boot.rank(),
            responder_may_fault: caps.odp_rc_recv || caps.odp_rc_write || caps.odp_rc_read,
            caps,
            limits: caps::limits(&c.attr),
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

    /// The port in use.
    pub fn port(&self) -> &PortInfo {
        &self.port
    }

    /// The raw status and vendor syndrome of the most recent error completions (at most
    /// 32, oldest first), for diagnosing what a [`WcStatus`] summarises.
    pub fn recent_errors(&self) -> Vec<RawCompletionError> {
        self.recent_errors.lock().iter().cloned().collect()
    }

    fn qp(&self, qpn: u32) -> Result<Arc<QueuePairEntry>> {
        self.qps
            .read()
            .get(&qpn)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("no queue pair {qpn} on this NIC")))
    }

    /// The asynchronous events the device reported (at most 32, oldest first), as read so
    /// far: `poll_cq` reads them when a poll comes back short, at most every 10 ms. Fatal ones
    /// also turn into errors (see `events`).
    pub fn recent_async_events(&self) -> Vec<AsyncEventRecord> {
        self.recent_events.lock().iter().cloned().collect()
    }

    fn cq(&self, id: u32) -> Result<Arc<CqEntry>> {
        self.cqs
            .read()
            .get(id as usize)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("no completion queue {id} on this NIC")))
    }

    fn register_raw(
        &self,
        addr: u64,
        len: u64,
        access: Access,
        implicit: bool,
    ) -> Result<RegionInfo> {
        let odp = access.contains(Access::ON_DEMAND);
        let what = if implicit {
            "implicit ODP registration".to_string()
        } else {
            format!("ibv_reg_mr(addr={addr:#x}, len={len}, access={access:?})")
        };
        let pd_len = if implicit {
            usize::MAX
        } else {
            usize::try_from(len).map_err(|_| Error::InvalidArgument(format!("{what}: too long")))?
        };
        let t0 = crate::sys::monotonic_ns();
        let mut mr = match self.pd.reg_mr(addr, pd_len, wr::access_bits(access)) {
            Ok(mr) => mr,
            Err(e) => return Err(self.registration_error(what, addr, len, odp, e)),
        };
        let pinned = if odp {
            0
        } else {
            crate::sys::page_span(addr, len).1
        };
        let info = RegionInfo {
            addr,
            len,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            access,
        };
        let mut regions = self.regions.lock();
        if regions.contains_key(&info.lkey) {
            // Cannot happen (the kernel hands out unique keys); refuse rather than lose a handle.
            let _ = mr.dereg();
            return Err(Error::InvalidArgument(format!(
                "the device returned key {:#010x}, which is already registered",
                info.lkey
            )));
        }
        regions.insert(info.lkey, Region { mr, info, pinned });
        self.counters
            .record_registration(true, crate::sys::monotonic_ns().saturating_sub(t0));
        self.counters.add_pinned(pinned);
        Ok(info)
    }

    fn registration_error(
        &self,
        call: String,
        addr: u64,
        len: u64,
        odp: bool,
        e: io::Error,
    ) -> Error {
        match e.raw_os_error() {
            Some(libc::EFAULT) => Error::UnmappedRange { addr, len },
            Some(libc::ENOMEM) if !odp => {
                let requested = crate::sys::page_span(addr, len).1;
                let pinned = self.counters.pinned_now.load(Relaxed);
                match crate::sys::memlock_rlimit() {
                    Some(limit) if pinned.saturating_add(requested) > limit => {
                        Error::MemlockLimit {
                            requested,
                            pinned,
                            limit,
                            source_of_limit: "RLIMIT_MEMLOCK",
                        }
                    }
                    _ => os(call, e),
                }
            }
            Some(libc::EOPNOTSUPP) if odp => Error::Unsupported {
                device: self.caps.device.clone(),
                what: format!("this on-demand-paging registration ({call}: {e})"),
                hint:
                    "check the device's ODP capabilities (ibv_devinfo -v), or use a pinned region",
            },
            _ => os(call, e),
        }
    }

    /// `Ok` when the device pages on demand for every RC operation a region with `access`
    /// may take part in ([`caps::missing_odp_operations`]).
    fn require_odp_for(&self, access: Access) -> Result<()> {
        let missing = caps::missing_odp_operations(&self.caps, access);
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::Unsupported {
            device: self.caps.device.clone(),
            what: format!(
                "on-demand paging on RC queue pairs for {}, which an ODP region with {} may be \
                 used for",
                missing.join(", "),
                caps::access_names(access)
            ),
            hint: "register without ON_DEMAND (or with fewer rights), or use the soft provider \
                   (PAGEWIRE_TRANSPORT=soft)",
        })
    }

    /// `Err` once the device or completion queue `id` failed (an asynchronous event said so).
    fn usable(&self, id: u32, entry: &CqEntry) -> Result<()> {
        self.device_usable()?;
        if entry.failed.load(Relaxed) {
            return Err(os(
                format!("completion queue {id}"),
                io::Error::other(format!(
                    "the device reported IBV_EVENT_CQ_ERR: the queue overran its {} entries and \
                     is unusable, its completions lost; size a completion queue for the send \
                     and receive depths of every queue pair it serves",
                    entry.budget.lock().capacity()
                )),
            ));
        }
        Ok(())
    }

    /// `Err` once the device reported `IBV_EVENT_DEVICE_FATAL`.
    fn device_usable(&self) -> Result<()> {
        if self.device_failed.load(Relaxed) {
            return Err(os(
                self.caps.device.clone(),
                io::Error::other(
                    "the device reported IBV_EVENT_DEVICE_FATAL: every queue pair and completion \
                     queue on it is lost",
                ),
            ));
        }
        Ok(())
    }

    /// Promises the completion queues of a new queue pair the entries it could fill
    /// (`cq::CqBudget`); `Err` names the numbers when they are not there. Returns what to
    /// give back should the queue pair not be made.
    fn reserve_cq_entries(
        &self,
        peer: usize,
        (send_cq, scq): (u32, &Arc<CqEntry>),
        (recv_cq, rcq): (u32, &Arc<CqEntry>),
        caps: &QpCaps,
    ) -> Result<Vec<(Arc<CqEntry>, u64)>> {
        let (sends, recvs) = (caps.max_send_wr, caps.max_recv_wr);
        let wanted: Vec<(u32, &Arc<CqEntry>, u64)> = if send_cq == recv_cq {
            vec![(send_cq, scq, cq::demand(sends, recvs, true, true))]
        } else {
            vec![
                (send_cq, scq, cq::demand(sends, recvs, true, false)),
                (recv_cq, rcq, cq::demand(sends, recvs, false, true)),
            ]
        };
        let mut reserved: Vec<(Arc<CqEntry>, u64)> = Vec::new();
        for (id, entry, demand) in wanted {
            if let Err(over) = entry.budget.lock().reserve(demand) {
                release_cq_entries(reserved);
                return Err(Error::InvalidArgument(over.message(id, peer, sends, recvs)));
            }
            reserved.push((entry.clone(), demand));
        }
        Ok(reserved)
    }

    /// `ibv_create_qp` and RESET -> INIT for [`Nic::create_qp`], after its checks.
    fn make_qp(
        &self,
        peer: usize,
        scq: &Arc<CqEntry>,
        rcq: &Arc<CqEntry>,
        caps: QpCaps,
    ) -> Result<u32> {
        let want = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_sge,
            max_recv_sge: caps.max_sge,
            max_inline_data: caps.max_inline,
        };
        let (qp, got) = self
            .pd
            .create_rc_qp(&scq.cq, &rcq.cq, want)
            .map_err(|e| os(format!("ibv_create_qp(RC, {caps:?})"), e))?;
        let (mut attr, mask) = qp_state::init_attr(
            self.port.port,
            wr::access_bits(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ),
        );
        // On failure `qp` drops here and is destroyed.
        qp.modify(&mut attr, mask)
            .map_err(|e| os(format!("ibv_modify_qp(qp {}, RESET->INIT)", qp.qp_num()), e))?;
        let qpn = qp.qp_num();
        let entry = QueuePairEntry {
            psn: rand::random::<u32>() & 0xff_ffff,
            peer,
            caps,
            limits: QueueLimits {
                max_send_sge: got.max_send_sge,
                max_recv_sge: got.max_recv_sge,
                max_inline: got.max_inline_data,
            },
            status: Mutex::new(QpStatus::new()),
            // As deep as asked (the device may grant more, `ibv_create_qp(3)`), so that the
            // completion queues' reservation (`reserve_cq_entries`) bounds what can be
            // outstanding.
            sq: Mutex::new(WrRing::new(caps.max_send_wr.min(got.max_send_wr))),
            rq: Mutex::new(WrRing::new(caps.max_recv_wr.min(got.max_recv_wr))),
            qp,
        };
        self.qps.write().insert(qpn, Arc::new(entry));
        Ok(qpn)
    }

    /// Reads every waiting asynchronous event and applies it (`events::effect`).
    fn read_async_events(&self) {
        loop {
            match self.ctx.next_async_event() {
                Ok(Some(ev)) => self.apply_async_event(ev),
                Ok(None) => break,
                Err(e) => {
                    self.keep_event(AsyncEventRecord {
                        event: "ibv_get_async_event failed",
                        subject: e.to_string(),
                    });
                    break;
                }
            }
        }
    }

    fn apply_async_event(&self, ev: ffi::AsyncEvent) {
        let event = events::name(ev.event_type);
        let cq_id = |addr: usize| self.cqs.read().iter().position(|e| e.cq.address() == addr);
        let subject = match ev.element {
            ffi::AsyncElement::QueuePair(n) => format!("queue pair {n:#x}"),
            ffi::AsyncElement::CompletionQueue(addr) => match cq_id(addr) {
                Some(id) => format!("completion queue {id}"),
                None => "a completion queue not made by this NIC".into(),
            },
            ffi::AsyncElement::Port(p) => format!("port {p}"),
            ffi::AsyncElement::Other => "the device".into(),
        };
        match (events::effect(ev.event_type), ev.element) {
            (events::Effect::QueuePairFailed, ffi::AsyncElement::QueuePair(n)) => {
                if let Some(q) = self.qps.read().get(&n) {
                    q.status
                        .lock()
                        .failed(|| format!("{event} (asynchronous event)"));
                }
            }
            (events::Effect::CompletionQueueFailed, ffi::AsyncElement::CompletionQueue(addr)) => {
                if let Some(id) = cq_id(addr) {
                    if let Some(e) = self.cqs.read().get(id) {
                        e.failed.store(true, Relaxed);
                    }
                }
            }
            (events::Effect::DeviceFailed, _) => self.device_failed.store(true, Relaxed),
            _ => {}
        }
        self.keep_event(AsyncEventRecord { event, subject });
    }

    fn keep_event(&self, record: AsyncEventRecord) {
        let mut recent = self.recent_events.lock();
        if recent.len() == RECENT_ERRORS {
            recent.pop_front();
        }
        recent.push_back(record);
    }

    fn record_error(&self, wc: &ibv_wc, wr_id: u64) {
        self.counters.error_completions.fetch_add(1, Relaxed);
        let mut recent = self.recent_errors.lock();
        if recent.len() == RECENT_ERRORS {
            recent.pop_front();
        }
        recent.push_back(RawCompletionError {
            wr_id,
            qp_num: wc.qp_num,
            status: wc.status,
            status_str: ffi::wc_status_str(wc.status),
            vendor_err: wc.vendor_err,
        });
    }

    /// One `ibv_wc` as the trait's completion.
    fn completion(&self, wc: &ibv_wc, qps: &HashMap<u32, Arc<QueuePairEntry>>) -> Completion {
        let status = wr::status(wc.status);
        let recv = wc.wr_id & RECV_BIT != 0;
        let seq = wc.wr_id & !RECV_BIT;
        let looked_up = qps.get(&wc.qp_num).and_then(|q| {
            if recv {
                q.rq.lock().complete(seq)
            } else {
                q.sq.lock().complete(seq)
            }
        });
        let (wr_id, posted_as) =
            looked_up.unwrap_or((u64::MAX, if recv { WcOpcode::Recv } else { WcOpcode::Send }));
        if status != WcStatus::Success {
            self.record_error(wc, wr_id);
            if let Some(q) = qps.get(&wc.qp_num) {
                q.status.lock().failed(|| {
                    format!(
                        "work request {wr_id} ended with {} (ibv_wc_status {}, vendor syndrome {:#x})",
                        ffi::wc_status_str(wc.status),
                        wc.status,
                        wc.vendor_err
                    )
                });
            }
            return Completion {
                wr_id,
                status,
                opcode: posted_as,
                byte_len: 0,
                imm: None,
                qp_num: wc.qp_num,
            };
        }
        // Only the fields the verbs contract defines for this opcode: `wcs` is reused across
        // polls, and a provider leaves the others as an earlier completion wrote them.
        let fields = wr::success_fields(wc, posted_as);
        Completion {
            wr_id,
            status,
            opcode: fields.opcode,
            byte_len: fields.byte_len,
            imm: fields.imm,
            qp_num: wc.qp_num,
        }
    }
}

/// Gives back what [`VerbsNic::reserve_cq_entries`] promised.
fn release_cq_entries(reserved: Vec<(Arc<CqEntry>, u64)>) {
    for (entry, demand) in reserved {
        entry.budget.lock().release(demand);
    }
}

/// `PAGEWIRE_FORK_SAFE=1`: fork support in libibverbs, unless it is on already or the kernel
/// makes it unnecessary (see `fork`).
fn enable_fork_safety() -> Result<()> {
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
fn probe(
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
fn probe_inline(
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

impl Nic for VerbsNic {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn register(&self, addr: u64, len: u64, access: Access) -> Result<RegionInfo> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a zero-length region".into(),
            ));
        }
        if addr.checked_add(len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "region {addr:#x}+{len} wraps around the address space"
            )));
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "REMOTE_WRITE requires LOCAL_WRITE (ibv_reg_mr(3))".into(),
            ));
        }
        if access.contains(Access::ON_DEMAND) {
            self.require_odp_for(access)?;
        }
        self.register_raw(addr, len, access, false)
    }

    fn register_implicit_odp(&self, access: Access) -> Result<RegionInfo> {
        let access = access | Access::ON_DEMAND;
        self.require_odp_for(access)?;
        if !self.caps.implicit_odp {
            return Err(Error::Unsupported {
                device: self.caps.device.clone(),
                what: "implicit on-demand paging (one region for the whole address space)".into(),
                hint: "use explicit ODP regions, the copy or pindown buffer mode, or the soft \
                       provider (PAGEWIRE_TRANSPORT=soft)",
            });
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "REMOTE_WRITE requires LOCAL_WRITE (ibv_reg_mr(3))".into(),
            ));
        }
        // ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | ...): the region's length
        // is SIZE_MAX, so RegionInfo says u64::MAX.
        self.register_raw(0, u64::MAX, access, true)
    }

    fn deregister(&self, lkey: u32) -> Result<()> {
        let t0 = crate::sys::monotonic_ns();
        let mut regions = self.regions.lock();
        let mut r = regions
            .remove(&lkey)
            .ok_or(Error::UnknownKey { key: lkey })?;
        if let Err(e) = r.mr.dereg() {
            let call = format!("ibv_dereg_mr(lkey={lkey:#010x})");
            regions.insert(lkey, r);
            return Err(os(call, e));
        }
        self.counters.sub_pinned(r.pinned);
        self.counters
            .record_registration(false, crate::sys::monotonic_ns().saturating_sub(t0));
        Ok(())
    }

    fn advise(&self, lkey: u32, addr: u64, len: u64, advice: Advice) -> Result<()> {
        let info = self
            .regions
            .lock()
            .get(&lkey)
            .map(|r| r.info)
            .ok_or(Error::UnknownKey { key: lkey })?;
        if !info.access.contains(Access::ON_DEMAND) {
            return Err(Error::InvalidArgument(format!(
                "advise needs an ODP region; key {lkey:#010x} is pinned"
            )));
        }
        let end = addr.checked_add(len);
        if addr < info.addr || end.is_none_or(|e| e - info.addr > info.len) {
            return Err(Error::InvalidArgument(format!(
                "advise range {addr:#x}+{len} is outside region {:#x}+{}",
                info.addr, info.len
            )));
        }
        if len == 0 {
            return Ok(());
        }
        if advice == Advice::PrefetchWrite && !info.access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(format!(
                "PrefetchWrite needs a writable region; key {lkey:#010x} lacks LOCAL_WRITE"
            )));
        }
        let code = match advice {
            Advice::Prefetch => {
                rdma_sys::ib_uverbs_advise_mr_advice::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH
            }
            Advice::PrefetchWrite => {
                rdma_sys::ib_uverbs_advise_mr_advice::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE
            }
        };
        // In batches: one call takes at most `wr::ADVISE_MAX_SGES` entries of 1 GiB, about
        // 4 TiB (the ioctl attribute carrying the list has a 16-bit length).
        let batches = wr::advise_batch_count(len);
        let mut advised = 0u64;
        let mut result = Ok(());
        for (i, mut sges) in wr::advise_batches(lkey, addr, len).enumerate() {
            let batch_len: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
            if let Err(e) = self
                .pd
                .advise_mr(code, ffi::ADVISE_MR_FLAG_FLUSH, &mut sges)
            {
                result = Err(match e.raw_os_error() {
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Error::Unsupported {
                        device: self.caps.device.clone(),
                        what: "prefetch (ibv_advise_mr)".into(),
                        hint: "run without prefetch",
                    },
                    Some(libc::EFAULT) => Error::UnmappedRange { addr, len },
                    _ => os(
                        format!(
                            "ibv_advise_mr(lkey={lkey:#010x}, {addr:#x}+{len}, {advice:?}, \
                             batch {} of {batches})",
                            i + 1
                        ),
                        e,
                    ),
                });
                break;
            }
            advised += batch_len;
        }
        // Pages asked for by the calls that succeeded (the earlier batches of a failed advice
        // did prefetch).
        if advised > 0 {
            let pages = crate::sys::page_span(addr, advised).1 / PAGE_SIZE;
            self.counters.prefetch_pages.fetch_add(pages, Relaxed);
        }
        result
    }

    fn create_cq(&self, depth: u32) -> Result<u32> {
        if depth == 0 || depth > self.limits.max_cqe {
            return Err(Error::InvalidArgument(format!(
                "completion queue depth {depth}: the device allows 1..={}",
                self.limits.max_cqe
            )));
        }
        let cqe = i32::try_from(depth).unwrap_or(i32::MAX);
        let cq = self
            .ctx
            .create_cq(cqe)
            .map_err(|e| os(format!("ibv_create_cq(cqe={depth})"), e))?;
        let entry = CqEntry {
            budget: Mutex::new(cq::CqBudget::new(cq.entries())),
            cq,
            failed: AtomicBool::new(false),
        };
        let mut cqs = self.cqs.write();
        cqs.push(Arc::new(entry));
        Ok((cqs.len() - 1) as u32)
    }

    fn create_qp(&self, peer: usize, send_cq: u32, recv_cq: u32, caps: QpCaps) -> Result<u32> {
        let (scq, rcq) = (self.cq(send_cq)?, self.cq(recv_cq)?);
        self.usable(send_cq, &scq)?;
        self.usable(recv_cq, &rcq)?;
        let c = &self.caps;
        if caps.max_sge > c.max_sge.min(MAX_SGE as u32)
            || caps.max_inline > c.max_inline
            || caps.max_send_wr > c.max_qp_wr
            || caps.max_recv_wr > c.max_qp_wr
        {
            return Err(Error::InvalidArgument(format!(
                "queue pair asks for {} SGEs, {} inline bytes, {}/{} send/receive requests; \
                 the device allows {}, {}, {}",
                caps.max_sge,
                caps.max_inline,
                caps.max_send_wr,
                caps.max_recv_wr,
                c.max_sge.min(MAX_SGE as u32),
                c.max_inline,
                c.max_qp_wr
            )));
        }
        // A request: `connect` raises it to 7 (forever) when the peer's device may page-fault
        // as a responder, whose RNR NAKs would use it up (`qp_state::rnr_retry_for`).
        if caps.rnr_retry > 7 {
            return Err(Error::InvalidArgument(format!(
                "rnr_retry {} does not fit its 3 bits (7 means retry forever)",
                caps.rnr_retry
            )));
        }
        // The completion queues must hold whatever this queue pair can have outstanding.
        let reserved = self.reserve_cq_entries(peer, (send_cq, &scq), (recv_cq, &rcq), &caps)?;
        match self.make_qp(peer, &scq, &rcq, caps) {
            Ok(qpn) => Ok(qpn),
            Err(e) => {
                release_cq_entries(reserved);
                Err(e)
            }
        }
    }

    fn endpoint(&self, qpn: u32) -> Result<Endpoint> {
        let q = self.qp(qpn)?;
        Ok(QpAddress {
            rank: self.rank as u32,
            qpn,
            psn: q.psn,
            lid: self.port.lid,
            gid: self.port.gid,
            mtu: self.port.active_mtu_code,
            link: self.port.link,
            responder_may_fault: self.responder_may_fault,
        }
        .encode())
    }

    fn connect(&self, qpn: u32, remote: &Endpoint) -> Result<()> {
        let q = self.qp(qpn)?;
        let r = QpAddress::decode(remote)?;
        if r.rank as usize != q.peer {
            return Err(Error::InvalidArgument(format!(
                "queue pair {qpn} was created towards rank {}, but the endpoint is rank {}'s",
                q.peer, r.rank
            )));
        }
        if r.link != self.port.link {
            return Err(Error::InvalidArgument(format!(
                "rank {}'s port is {:?}, this one is {:?}: they cannot be connected",
                r.rank, r.link, self.port.link
            )));
        }
        let mut status = q.status.lock();
        if !status.state.may_go_to(QpState::Rtr) {
            return Err(Error::InvalidArgument(format!(
                "queue pair {qpn} is {:?}; only a new queue pair can be connected",
                status.state
            )));
        }
        let fail = |why: String| Error::QueuePairError {
            qpn,
            peer: q.peer,
            why,
        };
        let params = RtrParams {
            port: self.port.port,
            local_mtu: self.port.active_mtu_code,
            local_gid_index: self.port.gid_index,
            max_dest_rd_atomic: self.limits.max_qp_rd_atom.min(qp_state::MAX_RD_ATOMIC),
            rnr_timer_us: qp_state::rnr_timer_us_for(q.caps.rnr_timer_us, self.responder_may_fault),
        };
        let (mut rtr, mask) = qp_state::rtr_attr(&params, &r).map_err(fail)?;
        q.qp.modify(&mut rtr, mask)
            .map_err(|e| fail(format!("ibv_modify_qp INIT->RTR: {e}")))?;
        status.moved_to(QpState::Rtr);
        let (mut rts, mask) = qp_state::rts_attr(
            q.psn,
            qp_state::rnr_retry_for(q.caps.rnr_retry, r.responder_may_fault),
            self.limits.max_qp_init_rd_atom.min(qp_state::MAX_RD_ATOMIC),
        );
        q.qp.modify(&mut rts, mask)
            .map_err(|e| fail(format!("ibv_modify_qp RTR->RTS: {e}")))?;
        status.moved_to(QpState::Rts);
        Ok(())
    }

    #[allow(unsafe_code)]
    unsafe fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<()> {
        self.device_usable()?;
        let q = self.qp(qpn)?;
        {
            let status = q.status.lock();
            match status.send_gate() {
                SendGate::Post => {}
                SendGate::NotConnected => {
                    return Err(Error::InvalidArgument(format!(
                        "queue pair {qpn} is not connected (it is in {:?}; call connect with the \
                         peer's endpoint first)",
                        status.state
                    )))
                }
                SendGate::FailedBeforeRts => {
                    return Err(Error::QueuePairError {
                        qpn,
                        peer: q.peer,
                        why: status
                            .error
                            .clone()
                            .unwrap_or_else(|| "it failed before it was connected".into()),
                    })
                }
            }
        }
        let mut ring = q.sq.lock();
        let seq = ring
            .push(wr.wr_id, wr::completes_as(&wr.opcode))
            .ok_or(Error::Exhausted {
                what: "send queue",
                limit: ring.outstanding(),
                hint: "poll completions (unsignaled sends are retired by a later signaled one)",
            })?;
        let mut sges = [EMPTY_SGE; MAX_SGE];
        let mut w = match wr::send_wr(wr, seq, &mut sges, q.limits) {
            Ok(w) => w,
            Err(e) => {
                ring.unpush(seq);
                return Err(e);
            }
        };
        // SAFETY: `w` and `sges` live across the call; the memory `wr.sgl` names is covered
        // by this trait method's own contract (valid and not accessed in conflict with the
        // NIC until the completion is polled), which is what `ffi::QueuePair::post_send`
        // requires.
        let posted = unsafe { q.qp.post_send(&mut w) };
        if let Err(e) = posted {
            ring.unpush(seq);
            return Err(match e.raw_os_error() {
                // The send gate above let only RTS (or ERROR after RTS) through, where mlx5's
                // ENOMEM means a full queue (or too many SGEs, which `send_wr` refused).
                Some(libc::ENOMEM) => Error::Exhausted {
                    what: "send queue",
                    limit: u64::from(q.caps.max_send_wr),
                    hint: "poll completions before posting more",
                },
                _ => os(format!("ibv_post_send(qp {qpn}, {:?})", wr.opcode), e),
            });
        }
        if wr.inline {
            let bytes: u64 = wr.sgl.iter().map(|s| u64::from(s.len)).sum();
            self.counters.bytes_inline.fetch_add(bytes, Relaxed);
        }
        Ok(())
    }

    #[allow(unsafe_code)]
    unsafe fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<()> {
        self.device_usable()?;
        let q = self.qp(qpn)?;
        let mut ring = q.rq.lock();
        let seq = ring
            .push(wr.wr_id, WcOpcode::Recv)
            .ok_or(Error::Exhausted {
                what: "receive queue",
                limit: ring.outstanding(),
                hint: "poll completions before posting more receives",
            })?;
        let mut sges = [EMPTY_SGE; MAX_SGE];
        let mut w = match wr::recv_wr(wr, seq, &mut sges, q.limits) {
            Ok(w) => w,
            Err(e) => {
                ring.unpush(seq);
                return Err(e);
            }
        };
        // SAFETY: `w` and `sges` live across the call; the receive buffers are covered by
        // this trait method's own contract (not accessed until the receive completes), which
        // is what `ffi::QueuePair::post_recv` requires.
        let posted = unsafe { q.qp.post_recv(&mut w) };
        if let Err(e) = posted {
            ring.unpush(seq);
            return Err(match e.raw_os_error() {
                Some(libc::ENOMEM) => Error::Exhausted {
                    what: "receive queue",
                    limit: u64::from(q.caps.max_recv_wr),
                    hint: "poll completions before posting more receives",
                },
                _ => os(format!("ibv_post_recv(qp {qpn})"), e),
            });
        }
        Ok(())
    }

    fn poll_cq(&self, cq_id: u32, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let entry = self.cq(cq_id)?;
        self.usable(cq_id, &entry)?;
        let cq = &entry.cq;
        let mut wcs: [ibv_wc; POLL_BATCH] = std::array::from_fn(|_| ffi::zeroed());
        let mut got = 0;
        while got < max {
            let want = (max - got).min(POLL_BATCH);
            let n = cq
                .poll(&mut wcs[..want])
                .map_err(|e| os("ibv_poll_cq".into(), e))?;
            if n > 0 {
                let qps = self.qps.read();
                out.extend(wcs[..n].iter().map(|wc| self.completion(wc, &qps)));
            }
            got += n;
            if n < want {
                break;
            }
        }
        // A short poll may be a queue that will never complete anything again (overrun, or a
        // device in a fatal state): look at the asynchronous events now and then.
        if got < max
            && self
                .async_check
                .claim(self.opened.elapsed().as_nanos() as u64)
        {
            self.read_async_events();
            if got == 0 {
                self.usable(cq_id, &entry)?;
            }
        }
        Ok(got)
    }

    /// The counters the provider can know (see the module docs): NPF, RNR-retry and
    /// invalidation counters stay 0 because on hardware they live in the driver's
    /// sysfs/debugfs, which is not read yet.
    fn counters(&self) -> CountersSnapshot {
        self.counters.snapshot()
    }
}
