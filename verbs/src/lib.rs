//! The verbs provider: the [`Nic`] trait over rdma-core's libibverbs, bound to the system
//! rdma-core through `rdma-sys` (docs/verbs.md). Everything here is behind the feature
//! `rdma-core` (pagewire-transport's `verbs`): without it the crate is empty, so
//! the workspace builds on machines without rdma-core's headers.
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
// Without the feature this text documents an empty crate: its links have nothing to name.
#![cfg_attr(not(feature = "rdma-core"), allow(rustdoc::broken_intra_doc_links))]
#![cfg(feature = "rdma-core")]
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod advise;
mod caps;
mod completions;
mod config;
mod connect;
mod cq;
mod endpoint;
mod events;
mod ffi;
mod fork;
mod open;
mod qp_state;
mod queues;
mod rdma_core_version;
mod regions;
mod wc;
mod wr;
mod wr_ring;

pub use config::{LinkLayer, VerbsConfig};

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use rdma_sys::{ibv_qp_cap, ibv_wc};

use pagewire_boot::Bootstrap;
use pagewire_nic::{
    Access, Advice, Capabilities, Completion, Counters, CountersSnapshot, Endpoint, Nic, QpCaps,
    RecvWr, RegionInfo, SendWr, WcOpcode, WcStatus, PAGE_SIZE,
};
use pagewire_sys::error::{Error, Result};

use caps::DeviceLimits;
use config::{GidKind, GidProbe, PortProbe};
use endpoint::QpAddress;
use qp_state::{QpState, QpStatus, RtrParams, SendGate};
use wr::{QueueLimits, EMPTY_SGE, MAX_SGE, RECV_BIT};
use wr_ring::WrRing;

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
    /// This device may page-fault as an RC responder (ODP receive, write, read or atomic):
    /// its queue pairs ask for longer RNR waits and tell peers to retry forever (`qp_state`).
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

fn os(call: String, e: io::Error) -> Error {
    Error::Os { call, source: e }
}

impl VerbsNic {
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
}

impl Nic for VerbsNic {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn register(&self, addr: u64, len: u64, access: Access) -> Result<RegionInfo> {
        self.register_region(addr, len, access)
    }

    fn register_implicit_odp(&self, access: Access) -> Result<RegionInfo> {
        self.register_implicit(access)
    }

    fn deregister(&self, lkey: u32) -> Result<()> {
        self.deregister_region(lkey)
    }

    fn advise(&self, lkey: u32, addr: u64, len: u64, advice: Advice) -> Result<()> {
        self.advise_region(lkey, addr, len, advice)
    }

    fn create_cq(&self, depth: u32) -> Result<u32> {
        self.new_cq(depth)
    }

    fn create_qp(&self, peer: usize, send_cq: u32, recv_cq: u32, caps: QpCaps) -> Result<u32> {
        self.new_qp(peer, send_cq, recv_cq, caps)
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
        self.connect_rc(qpn, remote)
    }

    #[allow(unsafe_code)]
    unsafe fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<()> {
        self.device_usable()?;
        wr::require_atomics(&self.caps, &wr.opcode)?;
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
            .push(wr.wr_id, wc::completes_as(&wr.opcode))
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
