//! The message layer (docs/architecture.md): MPI point-to-point semantics over the NIC
//! trait, with an eager protocol for small messages and rendezvous protocols for large ones,
//! moving user buffers through whichever [`BufferMode`] the job runs.
//!
//! - Matching on (source, tag, context) with wildcards, non-overtaking per sender, posted and
//!   unexpected queues, probe ([`matching`]).
//! - Eager (<= eager limit, `eager.rs`): header and payload copied into pre-registered slots;
//!   per-peer credits bound the memory unexpected messages can take (the sender waits for
//!   credits; nothing is dropped).
//! - Rendezvous (> eager limit): RTS, then RGET (`rndv_get.rs`: the receiver RDMA-READs) or
//!   RPUT (`rndv_put.rs`: the receiver returns CTS, the sender RDMA-WRITEs), as a pipeline of
//!   chunks whose size and depth the buffer mode decides (one chunk for zero-copy modes,
//!   bounce-pool chunks for `copy`). NFS-RDMA sections 3-4 discuss the same inline/bulk and
//!   RDMA Read/Write choices for NFS.
//! - Progress runs inside every call that waits or tests (`progress.rs`); there is no
//!   progress thread.
//!
//! The user-facing, rsmpi-shaped API lives in the `pagewire` facade; this layer works on
//! bytes and request ids.
//!
//! Files: this one holds [`PointToPoint`], its start-up and its queries; `progress` a pass
//! of progress; `config` the settings,
//! `state` what is kept per request and peer, `api` the nonblocking calls, `posting` what
//! goes to the NIC, `liveness` the probes of silent peers, `failure` how a request fails;
//! then one file per protocol.

mod active_message;
mod api;
mod config;
mod credits;
mod eager;
mod eager_recv;
mod failure;
mod liveness;
mod local_barrier;
mod local_copy;
pub mod matching;
mod persistent;
mod posting;
mod progress;
#[allow(unsafe_code)]
pub mod raw;
mod request;
pub mod rma;
mod rma_transfer;
mod rndv;
mod rndv_get;
mod rndv_io;
mod rndv_local;
mod rndv_put;
mod rndv_rts;
mod rndv_split;
mod state;
pub mod wire;

pub use active_message::{ActiveMessageHandler, Handled};
pub use config::{
    MsgConfig, RndvProtocol, WaitPolicy, DEFAULT_EAGER_LIMIT, DEFAULT_LOCAL_EAGER_LIMIT,
    DEFAULT_SPLIT_MIN,
};
pub use matching::{Envelope, MessageHandle, Selector, ANY_SOURCE, ANY_TAG};
pub use persistent::PreparedBuffer;
pub use request::{RequestId, Status};
pub use rma::{RemoteAtomic, RemoteMemory};
pub use rma_transfer::{RmaBuf, RmaRequest};

use config::online_cpus;
pub(crate) use state::{
    wr_id, Arrival, ChunkDesc, EagerData, Payload, Peer, RdmaOp, RecvReq, RecvState, Req, SendReq,
    SendState, Unexpected, WrKind,
};

use std::collections::VecDeque;
use std::time::Duration;

use crate::boot::Bootstrap;
use crate::buffer_mode::{BufferMode, ModeCounters};
use crate::error::{Error, Result};
use crate::local::LocalPath;
use crate::nic::{Access, Completion, CountersSnapshot, Endpoint, Nic, QpCaps};
use crate::sys::AnonMapping;

use credits::Credits;
use failure::Failing;
use matching::Matcher;
use request::Slab;
use wire::HEADER_BYTES;

/// The largest valid tag (`MPI_TAG_UB`).
pub const TAG_UB: i32 = i32::MAX;

/// How long a blocking call (a wait, a probe) finds nothing before it checks with liveness
/// probes that the ranks it waits for are alive.
pub const LIVENESS_CHECK_AFTER: Duration = Duration::from_millis(500);

/// Empty polls in a row between two readings of the clock in a blocking wait: waiting costs
/// no clock reading per poll.
const IDLE_POLLS_PER_CLOCK_READ: u32 = 256;

/// Empty polls in a row (yielding) after which a waiting rank sleeps, when ranks outnumber
/// CPUs and every rank is on the local path (`LocalPath::sleep`).
pub(crate) const SLEEP_AFTER_IDLE_POLLS: u32 = 512;
/// The longest such sleep: the wait then looks round (liveness, the NIC) and sleeps again.
pub(crate) const SLEEP_TIMEOUT: Duration = Duration::from_millis(1);

/// Per-layer counters (eager/rendezvous traffic, flow control).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MsgCounters {
    /// Eager messages sent.
    pub eager_sent: u64,
    /// Rendezvous messages sent.
    pub rndv_sent: u64,
    /// Messages that arrived before their receive.
    pub unexpected: u64,
    /// Times a data send waited for credits.
    pub credit_waits: u64,
    /// Unexpected payloads kept in their slot because the budget was used up.
    pub held_slots: u64,
    /// Rendezvous receives moved by both sides at once (split rendezvous).
    pub rndv_split: u64,
    /// Local rendezvous sends whose receiver asked to share the copy, declined because this
    /// rank expected a message from it (`msg/rndv_local.rs`).
    pub local_shares_declined: u64,
    /// Rendezvous sends and receives whose gapped buffer moved in place, run by run
    /// (scatter-gather rendezvous, `msg/rndv.rs`).
    pub rndv_scatter_gather: u64,
}

/// The message layer of one rank.
pub struct PointToPoint {
    pub(crate) nic: std::sync::Arc<dyn Nic>,
    pub(crate) mode: Box<dyn BufferMode>,
    pub(crate) cfg: MsgConfig,
    rank: usize,
    size: usize,
    pub(crate) cq: u32,
    pub(crate) peers: Vec<Peer>,
    slot_bytes: usize,
    recv_pool: AnonMapping,
    recv_key: u32,
    send_pool: AnonMapping,
    send_key: u32,
    pub(crate) send_free: Vec<usize>,
    pub(crate) reqs: Slab<Req>,
    pub(crate) matcher: Matcher<RequestId, Unexpected>,
    /// RDMA operations in flight, by the index carried in their work-request id.
    pub(crate) rdma: Vec<Option<RdmaOp>>,
    rdma_free: Vec<usize>,
    last_progress_made: bool,
    /// Yield the CPU after a poll that found nothing (see [`WaitPolicy`]).
    yield_when_idle: bool,
    /// Rendezvous requests with work that may wait for leases.
    pub(crate) active: Vec<RequestId>,
    /// Peers with queued sends, queued control messages or credits to return: what a
    /// progress pass visits besides completions (O(active peers), not O(ranks)).
    service: Vec<usize>,
    pub(crate) counters: MsgCounters,
    /// Rendezvous requests that failed while the NIC or the peer may still use their
    /// buffers; each completes with its error once nothing can.
    pub(crate) failing: Vec<Failing>,
    max_inline: usize,
    max_send_wr: u32,
    scratch: Vec<Completion>,
    /// Rings in shared memory and CMA for the peers of this host (`crate::local`), unless
    /// `PAGEWIRE_LOCAL=nic` or no peer is local.
    pub(crate) local: Option<LocalPath>,
    /// Every rank of the job is reached through the local path.
    all_local: bool,
    /// Progress passes so far (wrapping).
    passes: u32,
    /// Progress passes in a row that found nothing (the yield waits for a few).
    idle_passes: u32,
    /// Windows' one-sided operations in flight (`rma.rs`).
    pub(crate) rma: rma::RmaState,
    /// Contexts this rank answers itself, and their messages (`active_message.rs`).
    pub(crate) active_messages: active_message::ActiveMessages,
}

impl std::fmt::Debug for PointToPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PointToPoint")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("mode", &self.mode.name())
            .finish()
    }
}

impl PointToPoint {
    /// Brings the layer up over `nic` (collective: every rank calls it): one queue pair per
    /// rank including itself, receive slots posted, the buffer mode started.
    pub fn new(
        nic: Box<dyn Nic>,
        boot: &dyn Bootstrap,
        mut mode: Box<dyn BufferMode>,
        cfg: MsgConfig,
    ) -> Result<PointToPoint> {
        let (rank, size) = (boot.rank(), boot.size());
        let slot_bytes = (HEADER_BYTES + cfg.eager_limit).div_ceil(64) * 64;
        let per_peer = (cfg.credits + cfg.control_slots) as usize;
        let max_send_wr = 4096;
        // One completion queue serves every queue pair: room for all each can have
        // outstanding (verbs refuses an overrunning CQ).
        let per_qp = max_send_wr as usize + per_peer;
        let depth = per_qp
            .checked_mul(size)
            .and_then(|d| u32::try_from(d).ok())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{size} ranks need a completion queue of {per_qp} entries each; too many"
                ))
            })?;
        let cq = nic.create_cq(depth)?;
        let caps = QpCaps {
            max_send_wr,
            max_recv_wr: per_peer as u32,
            max_sge: 2,
            // A device may grant less inline data than the default asks for.
            max_inline: QpCaps::default()
                .max_inline
                .min(nic.capabilities().max_inline),
            ..QpCaps::default()
        };
        let mut qps = Vec::with_capacity(size);
        let mut mine = Vec::new();
        for peer in 0..size {
            let q = nic.create_qp(peer, cq, cq, caps)?;
            let ep = nic.endpoint(q)?;
            mine.extend_from_slice(&(ep.0.len() as u32).to_le_bytes());
            mine.extend_from_slice(&ep.0);
            qps.push(q);
        }
        let all = boot.allgather(&mine)?;
        for (peer, blob) in all.iter().enumerate() {
            // Rank `peer` listed its endpoints for ranks 0..size; ours is entry `rank`.
            let mut at = 0;
            for target in 0..size {
                let n = u32::from_le_bytes(blob[at..at + 4].try_into().expect("4 bytes")) as usize;
                if target == rank {
                    nic.connect(qps[peer], &Endpoint(blob[at + 4..at + 4 + n].to_vec()))?;
                }
                at += 4 + n;
            }
        }
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let recv_pool = eager::map_slot_pool(size * per_peer * slot_bytes, "eager receive slots")?;
        let mut slots_on_demand = false;
        let recv_key =
            crate::buffer_mode::register_pool(&*nic, &recv_pool, access, &mut slots_on_demand)?;
        let send_pool =
            eager::map_slot_pool(cfg.send_slots as usize * slot_bytes, "eager send slots")?;
        let send_key =
            crate::buffer_mode::register_pool(&*nic, &send_pool, access, &mut slots_on_demand)?;
        if slots_on_demand && rank == 0 {
            eprintln!(
                "pagewire: the eager slots do not fit the locked-memory limit; they are registered \
                 on demand (ODP) and prefetched instead of pinned"
            );
        }
        // A local cell holds what a receive slot holds, and an RTS naming the runs of a
        // buffer with gaps (at least 2 KiB of them).
        let local = LocalPath::new(
            boot,
            cfg.local,
            HEADER_BYTES + cfg.eager_limit.max(cfg.local_eager_limit).max(2048),
        )?;
        let nic: std::sync::Arc<dyn Nic> = std::sync::Arc::from(nic);
        mode.attach(&nic);
        mode.start(&*nic)?;
        let max_inline = nic.capabilities().max_inline.min(caps.max_inline) as usize;
        let peers = qps
            .iter()
            .map(|&qpn| Peer {
                qpn,
                credits: Credits::new(cfg.credits),
                queued: VecDeque::new(),
                control: VecDeque::new(),
                in_flight: 0,
                local_copies_out: 0,
                dead: None,
                in_service: false,
            })
            .collect();
        let mut p2p = PointToPoint {
            send_free: (0..cfg.send_slots as usize).rev().collect(),
            nic,
            mode,
            cfg,
            rank,
            size,
            cq,
            peers,
            slot_bytes,
            recv_pool,
            recv_key,
            send_pool,
            send_key,
            reqs: Slab::default(),
            matcher: Matcher::default(),
            rdma: Vec::new(),
            rdma_free: Vec::new(),
            last_progress_made: false,
            yield_when_idle: false,
            active: Vec::new(),
            service: Vec::new(),
            failing: Vec::new(),
            counters: MsgCounters::default(),
            max_inline,
            max_send_wr,
            scratch: Vec::with_capacity(64),
            all_local: local
                .as_ref()
                .is_some_and(|l| l.local_ranks().len() == size),
            local,
            passes: 0,
            idle_passes: 0,
            rma: rma::RmaState::default(),
            active_messages: active_message::ActiveMessages::default(),
        };
        p2p.yield_when_idle = match p2p.cfg.wait {
            WaitPolicy::Spin => false,
            WaitPolicy::Yield => true,
            // Every rank of the soft NIC runs on this host.
            WaitPolicy::Auto => p2p.nic.capabilities().provider == "soft" && size > online_cpus(),
        };
        if let Some(local) = p2p.local.as_mut() {
            local.allow_sleep(p2p.yield_when_idle);
        }
        for peer in 0..size {
            for slot in 0..per_peer {
                p2p.post_slot(peer, slot)?;
            }
        }
        boot.barrier()?;
        // Every local peer has mapped this rank's rings: their name can go.
        if let Some(local) = &p2p.local {
            local.unlink();
        }
        Ok(p2p)
    }

    /// Whether `peer` is reached through the local path rather than the NIC (where the
    /// buffer modes apply).
    pub fn is_local(&self, peer: usize) -> bool {
        self.local.as_ref().is_some_and(|l| l.is_local(peer))
    }

    /// How this rank reaches the ranks of its host: `"shm"` (the local path, shared memory
    /// and CMA) or `"nic"` (`PAGEWIRE_LOCAL=nic`, or no local peer could be reached so).
    pub fn local_path(&self) -> &'static str {
        match &self.local {
            Some(l) if l.local_ranks().len() > 1 || self.size == 1 => "shm",
            _ => "nic",
        }
    }

    /// Whether every rank of `ranks` is reached through the local path (or is this one).
    pub fn all_local_among(&self, mut ranks: impl Iterator<Item = usize>) -> bool {
        match &self.local {
            None => false,
            Some(_) if self.all_local => true,
            Some(l) => ranks.all(|r| r == self.rank || l.is_local(r)),
        }
    }

    /// Which path reaches `peer`: `"shm"` (the local path) or `"nic"`.
    pub fn path_to(&self, peer: usize) -> &'static str {
        if self.is_local(peer) {
            "shm"
        } else {
            "nic"
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The buffer mode's name.
    pub fn mode_name(&self) -> &'static str {
        self.mode.name()
    }

    /// The buffer mode's effective settings in one line.
    pub fn mode_description(&self) -> String {
        self.mode.describe()
    }

    /// How the NIC pins registered memory (one line).
    pub fn pinning_description(&self) -> String {
        self.nic.pinning()
    }

    /// The eager limit in force.
    pub fn eager_limit(&self) -> usize {
        self.cfg.eager_limit
    }

    /// The largest message sent to `peer` eagerly: the local path's own limit for a rank
    /// of this host, the NIC's for the others.
    pub fn eager_limit_to(&self, peer: usize) -> usize {
        self.eager_limit_on(self.is_local(peer))
    }

    /// The eager limit of the local path (`local`) or of the NIC.
    pub(crate) fn eager_limit_on(&self, local: bool) -> usize {
        if local {
            self.cfg.local_eager_limit
        } else {
            self.cfg.eager_limit
        }
    }

    /// The NIC's counters.
    pub fn nic_counters(&self) -> CountersSnapshot {
        self.nic.counters()
    }

    /// The buffer mode's counters.
    pub fn mode_counters(&self) -> ModeCounters {
        self.mode.counters()
    }

    /// The layer's own counters.
    pub fn counters(&self) -> MsgCounters {
        self.counters.clone()
    }

    /// Requests not yet collected by `test`/`wait`.
    pub fn outstanding(&self) -> usize {
        self.reqs.len()
    }

    /// Ends request `id` with `result` (or with its error, if it was failing) and gives
    /// back what it holds.
    pub(crate) fn complete(&mut self, id: RequestId, mut result: Result<Status>) {
        if let Some(i) = self.failing.iter().position(|f| f.id == id) {
            result = Err(self.failing.swap_remove(i).error);
        }
        if let Some(r) = self.reqs.get_mut(id) {
            let mut old = std::mem::replace(r, Req::Done(result));
            self.end_rndv(&mut old);
        }
        self.active.retain(|a| *a != id);
    }

    /// Shuts the layer down: stops the buffer mode and deregisters the slots.
    pub fn shutdown(mut self) {
        self.mode.stop(&*self.nic);
        if let Some((_, lkey)) = self.rma.results.take() {
            let _ = self.nic.deregister(lkey);
        }
        let _ = self.nic.deregister(self.recv_key);
        let _ = self.nic.deregister(self.send_key);
    }
}
