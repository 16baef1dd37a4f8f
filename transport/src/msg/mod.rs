//! The message layer (DESIGN.md "Message layer"): MPI point-to-point semantics over the NIC
//! trait, with an eager protocol for small messages and rendezvous protocols for large ones,
//! moving user buffers through whichever [`BufferMode`] the job runs.
//!
//! - Matching on (source, tag, context) with wildcards, non-overtaking per sender, posted and
//!   unexpected queues, probe ([`matching`]).
//! - Eager (<= eager limit, [`eager`]): header and payload copied into pre-registered slots;
//!   per-peer credits bound the memory unexpected messages can take (the sender waits for
//!   credits; nothing is dropped).
//! - Rendezvous (> eager limit): RTS, then RGET ([`rndv_get`]: the receiver RDMA-READs) or
//!   RPUT ([`rndv_put`]: the receiver returns CTS, the sender RDMA-WRITEs), as a pipeline of
//!   chunks whose size and depth the buffer mode decides (one chunk for zero-copy modes,
//!   bounce-pool chunks for `copy`). Seed 001 sections 3-4 discuss the same inline/bulk and
//!   RDMA Read/Write choices for NFS.
//! - Progress runs inside every call that waits or tests; there is no progress thread.
//!
//! The user-facing, rsmpi-shaped API lives in the `pagewire` facade; this layer works on
//! bytes and request ids.

mod eager;
mod failure;
pub mod matching;
#[allow(unsafe_code)]
pub mod raw;
mod request;
mod rndv;
mod rndv_get;
mod rndv_put;
mod rndv_split;
pub mod wire;

pub use matching::{Envelope, MessageHandle, Selector, ANY_SOURCE, ANY_TAG};
pub use request::{RequestId, Status};

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::boot::Bootstrap;
use crate::buffer_mode::{BufferMode, Lease, ModeCounters};
use crate::error::{Error, Result};
use crate::nic::{
    Access, Completion, CountersSnapshot, Endpoint, Nic, Opcode, QpCaps, SendWr, Sge, WcStatus,
};
use crate::sys::AnonMapping;

use failure::Failing;
use matching::Matcher;
use raw::{UserBuf, UserBufMut};
use request::Slab;
use wire::{Header, HEADER_BYTES};

/// The largest valid tag (`MPI_TAG_UB`).
pub const TAG_UB: i32 = i32::MAX;

/// Default eager limit in bytes. Chosen by measurement (README, "Choosing the defaults"):
/// at 16 KiB an eager message (two copies through slots) beats a rendezvous in copy mode;
/// 32 KiB was faster still for 32 KiB messages but doubles the pinned slots per peer.
pub const DEFAULT_EAGER_LIMIT: usize = 16 << 10;

/// Default of [`MsgConfig::split_min`]: measured (README, "Choosing the defaults").
pub const DEFAULT_SPLIT_MIN: usize = 64 << 10;

/// Which rendezvous protocol large messages use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RndvProtocol {
    /// The receiver RDMA-READs from the sender (RGET).
    Get,
    /// The receiver returns CTS and the sender RDMA-WRITEs (RPUT).
    Put,
    /// RGET for zero-copy modes, RPUT for copying ones (measured faster there).
    Auto,
}

/// Settings of the message layer.
#[derive(Clone, Debug)]
pub struct MsgConfig {
    /// Largest message sent eagerly (`PAGEWIRE_EAGER_LIMIT`).
    pub eager_limit: usize,
    /// Rendezvous protocol (`PAGEWIRE_RNDV=get|put|auto`).
    pub rndv: RndvProtocol,
    /// Zero-copy messages of at least this many bytes are moved by both sides at once
    /// (`auto` only; [`rndv_split`]); `PAGEWIRE_RNDV_SPLIT_MIN`, `off` = never.
    pub split_min: usize,
    /// Data messages in flight per peer before the sender waits (`PAGEWIRE_EAGER_CREDITS`).
    pub credits: u32,
    /// Extra receive slots per peer for control messages.
    pub control_slots: u32,
    /// Eager send slots (shared by all peers).
    pub send_slots: u32,
    /// Bytes of unexpected eager data kept per peer before its slots are held
    /// (`PAGEWIRE_UNEXPECTED_BUDGET`).
    pub unexpected_budget: usize,
    /// What a rank does while it waits with nothing to do (`PAGEWIRE_WAIT=auto|spin|yield`).
    pub wait: WaitPolicy,
}

/// How long a blocking call (a wait, a probe) finds nothing before it checks with liveness
/// probes that the ranks it waits for are alive.
pub const LIVENESS_CHECK_AFTER: Duration = Duration::from_millis(500);

/// Empty polls in a row between two readings of the clock in a blocking wait: waiting costs
/// no clock reading per poll (issue 12).
const IDLE_POLLS_PER_CLOCK_READ: u32 = 256;

/// Completions taken from the NIC per poll.
const POLL_BATCH: usize = 64;

/// What a blocked rank does between polls that found nothing (`PAGEWIRE_WAIT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaitPolicy {
    /// `yield` when the soft NIC's ranks outnumber this host's online CPUs, else `spin`.
    #[default]
    Auto,
    /// Poll without pause: the lowest latency when every rank has a CPU of its own.
    Spin,
    /// `sched_yield` after every empty poll, so that with more ranks than CPUs the rank a
    /// waiter waits for gets the CPU (as MPICH does when oversubscribed).
    Yield,
}

impl Default for MsgConfig {
    fn default() -> Self {
        MsgConfig {
            eager_limit: DEFAULT_EAGER_LIMIT,
            rndv: RndvProtocol::Auto,
            split_min: DEFAULT_SPLIT_MIN,
            credits: 16,
            control_slots: 8,
            send_slots: 32,
            unexpected_budget: 4 << 20,
            wait: WaitPolicy::Auto,
        }
    }
}

impl MsgConfig {
    /// Defaults overridden by `PAGEWIRE_EAGER_LIMIT`, `PAGEWIRE_RNDV`,
    /// `PAGEWIRE_EAGER_CREDITS` and `PAGEWIRE_UNEXPECTED_BUDGET`.
    pub fn from_env() -> Result<MsgConfig> {
        use crate::env::bytes as env_usize;
        let mut c = MsgConfig::default();
        if let Some(v) = env_usize("PAGEWIRE_EAGER_LIMIT")? {
            c.eager_limit = v;
        }
        if let Some(v) = env_usize("PAGEWIRE_EAGER_CREDITS")? {
            c.credits = v as u32;
        }
        if let Some(v) = env_usize("PAGEWIRE_UNEXPECTED_BUDGET")? {
            c.unexpected_budget = v;
        }
        match std::env::var("PAGEWIRE_RNDV_SPLIT_MIN").as_deref() {
            Ok("off") => c.split_min = usize::MAX,
            Ok(_) => {
                if let Some(v) = env_usize("PAGEWIRE_RNDV_SPLIT_MIN")? {
                    c.split_min = v.max(8192);
                }
            }
            Err(_) => {}
        }
        c.wait = match std::env::var("PAGEWIRE_WAIT").as_deref() {
            Err(_) | Ok("") | Ok("auto") => WaitPolicy::Auto,
            Ok("spin") => WaitPolicy::Spin,
            Ok("yield") => WaitPolicy::Yield,
            Ok(other) => {
                return Err(Error::InvalidArgument(format!(
                    "PAGEWIRE_WAIT={other}: expected auto, spin or yield"
                )))
            }
        };
        c.rndv = match std::env::var("PAGEWIRE_RNDV").as_deref() {
            Err(_) | Ok("") | Ok("auto") => RndvProtocol::Auto,
            Ok("get") => RndvProtocol::Get,
            Ok("put") => RndvProtocol::Put,
            Ok(other) => {
                return Err(Error::InvalidArgument(format!(
                    "PAGEWIRE_RNDV={other}: expected get, put or auto"
                )))
            }
        };
        if c.credits < 2 || c.credits > 4096 {
            return Err(Error::InvalidArgument(format!(
                "PAGEWIRE_EAGER_CREDITS={}: expected 2..=4096",
                c.credits
            )));
        }
        if c.eager_limit > 1 << 20 {
            return Err(Error::InvalidArgument(format!(
                "PAGEWIRE_EAGER_LIMIT={}: at most 1 MiB (larger messages go by rendezvous)",
                c.eager_limit
            )));
        }
        Ok(c)
    }
}

/// This host's online CPUs (all of them, whatever this process's affinity).
fn online_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| crate::boot::binding::parse_cpulist(s.trim()))
        .map(|cpus| cpus.len())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}

/// Registers a slot pool pinned; if that exceeds the locked-memory limit and the NIC has
/// on-demand paging, registers it ODP and prefetches it instead (so small `ulimit -l`
/// settings still run), and says so through `on_demand`.
pub(crate) fn register_slots(
    nic: &dyn Nic,
    pool: &AnonMapping,
    access: Access,
    on_demand: &mut bool,
) -> Result<u32> {
    match nic.register(pool.addr(), pool.len() as u64, access) {
        Ok(r) => Ok(r.lkey),
        Err(Error::MemlockLimit { .. }) if nic.capabilities().odp_rc => {
            let r = nic.register(pool.addr(), pool.len() as u64, access | Access::ON_DEMAND)?;
            nic.advise(
                r.lkey,
                pool.addr(),
                pool.len() as u64,
                crate::nic::Advice::PrefetchWrite,
            )?;
            *on_demand = true;
            Ok(r.lkey)
        }
        Err(e) => Err(e),
    }
}

fn fill_payload(src: &Payload<'_>, dst: &mut [u8]) {
    match src {
        Payload::None => {}
        Payload::User(ub, off, len) => ub.read(*off, &mut dst[..*len]),
        Payload::Bytes(b) => dst[..b.len()].copy_from_slice(b),
    }
}

/// What a probe reports about an unexpected message.
fn unexpected_status(env: &Envelope, u: &Unexpected) -> Status {
    Status {
        source: env.source,
        tag: env.tag,
        count: match u {
            Unexpected::Eager { size, .. } => *size,
            Unexpected::Rts { header, .. } => header.size as usize,
        },
    }
}

/// Work-request id layout: kind (8 bits) | peer (24 bits) | index (32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WrKind {
    Recv = 1,
    SendSlot = 2,
    SendInline = 3,
    Rdma = 4,
    Probe = 5,
}

pub(crate) fn wr_id(kind: WrKind, peer: usize, index: usize) -> u64 {
    (kind as u64) << 56 | (peer as u64 & 0xff_ffff) << 32 | index as u64 & 0xffff_ffff
}

fn wr_parts(id: u64) -> (u64, usize, usize) {
    (
        id >> 56,
        ((id >> 32) & 0xff_ffff) as usize,
        (id & 0xffff_ffff) as usize,
    )
}

/// A message that arrived before its receive was posted.
pub(crate) enum Unexpected {
    Eager {
        data: EagerData,
        size: usize,
        sync: bool,
        sreq: u64,
    },
    Rts {
        header: Header,
        chunks: Vec<ChunkDesc>,
    },
}

/// Where a chunk of a rendezvous send can be read (RGET).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkDesc {
    pub chunk: u32,
    /// Where the chunk starts in the message.
    pub offset: u64,
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

/// What follows a header in a message.
pub(crate) enum Payload<'a> {
    None,
    /// `len` bytes of a user buffer from `offset`.
    User(&'a UserBuf, usize, usize),
    /// Bytes the layer made.
    Bytes(&'a [u8]),
}

/// Where an unexpected eager payload is.
pub(crate) enum EagerData {
    /// Copied out of its slot (the slot went back to the peer).
    Owned(Vec<u8>),
    /// Still in receive slot `slot` of the sender's region (over the unexpected budget).
    Held { slot: usize },
}

pub(crate) enum Req {
    Send(SendReq),
    Recv(RecvReq),
    Done(Result<Status>),
}

pub(crate) struct SendReq {
    pub peer: usize,
    pub tag: i32,
    pub context: u32,
    pub buf: UserBuf,
    pub sync: bool,
    pub state: SendState,
}

pub(crate) enum SendState {
    /// Waiting for a credit or a send slot.
    Queued,
    /// Eager synchronous send: waiting to hear it matched.
    AwaitSyncAck,
    /// Rendezvous in progress.
    Rndv(rndv::RndvSend),
}

pub(crate) struct RecvReq {
    pub sel: Selector,
    pub buf: UserBufMut,
    pub state: RecvState,
}

pub(crate) enum RecvState {
    Posted,
    Rndv(Box<rndv::RndvRecv>),
}

/// An RDMA operation in flight for a rendezvous chunk.
pub(crate) struct RdmaOp {
    pub req: RequestId,
    /// The lease's key in the request's state.
    pub key: u64,
    /// The announced chunk (RGET) or CTS region (RPUT) the piece belongs to.
    pub chunk: u32,
    /// The piece's offset in the message and length.
    pub offset: usize,
    pub len: usize,
}

pub(crate) struct Peer {
    pub qpn: u32,
    /// Data messages we may still send to this peer.
    pub credits: u32,
    /// Credits we owe this peer (slots reposted since we last told it).
    pub to_return: u32,
    /// Data sends waiting for a credit or a slot, in order.
    pub queued: VecDeque<RequestId>,
    /// Control messages waiting for send-queue room.
    pub control: VecDeque<Header>,
    /// Send work requests outstanding on the queue pair.
    pub in_flight: u32,
    /// Bytes of unexpected eager data copied out for this peer.
    pub unexpected_bytes: usize,
    /// Set once the NIC reported the peer unreachable.
    pub dead: Option<WcStatus>,
    /// In `PointToPoint::service` (it has queued sends, queued control messages or credits
    /// to return).
    pub in_service: bool,
}

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
    /// buffers; each completes with its error once nothing can (issue 15, item 1).
    pub(crate) failing: Vec<Failing>,
    max_inline: usize,
    max_send_wr: u32,
    scratch: Vec<Completion>,
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
        // outstanding (verbs refuses an overrunning CQ, issue 17).
        let per_qp = max_send_wr as usize + per_peer;
        let depth = per_qp
            .checked_mul(size)
            .and_then(|d| u32::try_from(d).ok())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
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
        let recv_key = register_slots(&*nic, &recv_pool, access, &mut slots_on_demand)?;
        let send_pool =
            eager::map_slot_pool(cfg.send_slots as usize * slot_bytes, "eager send slots")?;
        let send_key = register_slots(&*nic, &send_pool, access, &mut slots_on_demand)?;
        if slots_on_demand && rank == 0 {
            eprintln!(
                "pagewire: the eager slots do not fit the locked-memory limit; they are registered \
                 on demand (ODP) and prefetched instead of pinned"
            );
        }
        let nic: std::sync::Arc<dyn Nic> = std::sync::Arc::from(nic);
        mode.attach(&nic);
        mode.start(&*nic)?;
        let max_inline = nic.capabilities().max_inline.min(caps.max_inline) as usize;
        let peers = qps
            .iter()
            .map(|&qpn| Peer {
                qpn,
                credits: cfg.credits,
                to_return: 0,
                queued: VecDeque::new(),
                control: VecDeque::new(),
                in_flight: 0,
                unexpected_bytes: 0,
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
        };
        p2p.yield_when_idle = match p2p.cfg.wait {
            WaitPolicy::Spin => false,
            WaitPolicy::Yield => true,
            // Every rank of the soft NIC runs on this host.
            WaitPolicy::Auto => p2p.nic.capabilities().provider == "soft" && size > online_cpus(),
        };
        for peer in 0..size {
            for slot in 0..per_peer {
                p2p.post_slot(peer, slot)?;
            }
        }
        boot.barrier()?;
        Ok(p2p)
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

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.size {
            return Err(Error::NoSuchRank {
                rank,
                size: self.size,
            });
        }
        Ok(())
    }

    fn check_tag(tag: i32) -> Result<()> {
        if !(0..=TAG_UB).contains(&tag) {
            return Err(Error::InvalidTag { tag, max: TAG_UB });
        }
        Ok(())
    }

    /// Starts sending `buf` to `dest` (`MPI_Isend`, or `MPI_Issend` when `sync`).
    pub fn isend(
        &mut self,
        dest: usize,
        tag: i32,
        context: u32,
        buf: UserBuf,
        sync: bool,
    ) -> Result<RequestId> {
        self.check_rank(dest)?;
        Self::check_tag(tag)?;
        if let Some(status) = self.peers[dest].dead {
            return Err(Error::Communication {
                peer: dest,
                status,
                what: "starting a send",
            });
        }
        let id = self.reqs.insert(Req::Send(SendReq {
            peer: dest,
            tag,
            context,
            buf,
            sync,
            state: SendState::Queued,
        }));
        self.peers[dest].queued.push_back(id);
        if let Err(e) = self.drain_queued(dest) {
            // The request has an id now: its wait reports the error, once it is safe to.
            self.fail_request(id, e, false);
        }
        if !self.peers[dest].queued.is_empty() {
            self.needs_service(dest);
        }
        Ok(id)
    }

    /// Starts receiving into `buf` (`MPI_Irecv`); `source`/`tag` `None` are wildcards.
    pub fn irecv(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
        buf: UserBufMut,
    ) -> Result<RequestId> {
        if let Some(s) = source {
            self.check_rank(s)?;
            if let Some(status) = self.peers[s].dead {
                return Err(Error::Communication {
                    peer: s,
                    status,
                    what: "posting a receive",
                });
            }
        }
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        let sel = Selector {
            source,
            tag,
            context,
        };
        let id = self.reqs.insert(Req::Recv(RecvReq {
            sel,
            buf,
            state: RecvState::Posted,
        }));
        if let Some((env, u)) = self.matcher.post(sel, id) {
            if let Err(e) = self.deliver_unexpected(id, env, u) {
                self.fail_request(id, e, false);
            }
        }
        Ok(id)
    }

    /// Whether a matching message has arrived, without receiving it (`MPI_Iprobe`).
    pub fn iprobe(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
    ) -> Result<Option<Status>> {
        self.progress()?;
        let sel = Selector {
            source,
            tag,
            context,
        };
        Ok(self
            .matcher
            .probe(&sel)
            .map(|(env, u)| unexpected_status(env, u)))
    }

    /// Like [`PointToPoint::iprobe`], but the message found is taken out of matching
    /// (`MPI_Improbe`): no other receive or probe can match it, and [`PointToPoint::imrecv`]
    /// with the handle receives it.
    pub fn improbe(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
    ) -> Result<Option<(MessageHandle, Status)>> {
        if let Some(s) = source {
            self.check_rank(s)?;
        }
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        self.progress()?;
        let sel = Selector {
            source,
            tag,
            context,
        };
        Ok(self
            .matcher
            .take_matched(&sel)
            .map(|(h, env, u)| (h, unexpected_status(&env, u))))
    }

    /// Starts receiving the message a matched probe returned into `buf` (`MPI_Imrecv`).
    pub fn imrecv(&mut self, msg: MessageHandle, buf: UserBufMut) -> Result<RequestId> {
        let (env, u) = self.matcher.claim(msg).ok_or_else(|| {
            Error::InvalidArgument("unknown or already received matched message".into())
        })?;
        if let (Some(status), Unexpected::Rts { .. }) = (self.peers[env.source].dead, &u) {
            // The payload is still at the sender, which is gone.
            return Err(Error::Communication {
                peer: env.source,
                status,
                what: "receiving a matched message",
            });
        }
        let id = self.reqs.insert(Req::Recv(RecvReq {
            sel: Selector {
                source: Some(env.source),
                tag: Some(env.tag),
                context: env.context,
            },
            buf,
            state: RecvState::Posted,
        }));
        if let Err(e) = self.deliver_unexpected(id, env, u) {
            self.fail_request(id, e, false);
        }
        Ok(id)
    }

    /// Completes `id` if it is done: `Some(result)` (the request is then gone), else `None`.
    ///
    /// An error met while making progress that belongs to no other request fails `id`
    /// itself; either way, an error is returned only once `id` has finished, so its buffer
    /// is never touched after this reports (issue 15, item 1).
    pub fn test(&mut self, id: RequestId) -> Result<Option<Result<Status>>> {
        if let Err(e) = self.progress() {
            if self.reqs.get(id).is_none() {
                return Err(e);
            }
            self.fail_request(id, e, false);
        }
        match self.reqs.get(id) {
            None => Err(Error::InvalidArgument(
                "unknown or already completed request".into(),
            )),
            Some(Req::Done(_)) => match self.reqs.remove(id) {
                Some(Req::Done(r)) => Ok(Some(r)),
                _ => unreachable!(),
            },
            Some(_) => Ok(None),
        }
    }

    /// Waits for `id` and returns its outcome (`MPI_Wait`). If the peer stops answering,
    /// the NIC's error completion ends the wait with [`Error::Communication`].
    pub fn wait(&mut self, id: RequestId) -> Result<Status> {
        // A request that completed when it started (an eager send, a receive matched by an
        // unexpected message) needs no pass of the engine.
        if let Some(Req::Done(_)) = self.reqs.get(id) {
            if let Some(Req::Done(r)) = self.reqs.remove(id) {
                return r;
            }
        }
        // The clock is read only after IDLE_POLLS_PER_CLOCK_READ empty polls in a row.
        let mut idle_polls = 0u32;
        let mut idle_since: Option<Instant> = None;
        loop {
            if let Some(r) = self.test(id)? {
                return r;
            }
            if self.last_progress_made {
                idle_polls = 0;
                idle_since = None;
                continue;
            }
            idle_polls += 1;
            if idle_polls % IDLE_POLLS_PER_CLOCK_READ == 0 {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > LIVENESS_CHECK_AFTER {
                    self.probe_peers_of(id)?;
                    idle_since = Some(Instant::now());
                }
            }
        }
    }

    /// Whether `id` has completed, without completing it.
    pub fn is_done(&self, id: RequestId) -> bool {
        matches!(self.reqs.get(id), Some(Req::Done(_)))
    }

    /// Cancels a receive that has not matched (`MPI_Cancel`); true if it was cancelled.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if self.matcher.cancel(|r| *r == id).is_some() {
            if let Some(r) = self.reqs.get_mut(id) {
                *r = Req::Done(Err(Error::Cancelled));
            }
            return true;
        }
        false
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

    /// Makes progress: polls completions and advances every protocol. Returns whether
    /// anything happened.
    pub fn progress(&mut self) -> Result<bool> {
        let mut events = 0usize;
        let mut first_err = None;
        loop {
            self.scratch.clear();
            let n = self.nic.poll_cq(self.cq, &mut self.scratch, POLL_BATCH)?;
            events += n;
            let batch = std::mem::take(&mut self.scratch);
            for c in &batch {
                // Every completion of the batch is handled, even after an error.
                if let Err(e) = self.handle_completion(c) {
                    first_err.get_or_insert(e);
                }
            }
            self.scratch = batch;
            if n < POLL_BATCH {
                break;
            }
        }
        let mut i = 0;
        while i < self.service.len() {
            let peer = self.service[i];
            self.flush_control(peer)?;
            self.drain_queued(peer)?;
            self.return_credits(peer)?;
            let p = &mut self.peers[peer];
            let done = p.queued.is_empty()
                && p.control.is_empty()
                && (p.to_return < self.cfg.credits / 2 || p.dead.is_some());
            if done {
                p.in_service = false;
                self.service.swap_remove(i);
            } else {
                i += 1;
            }
        }
        if !self.active.is_empty() {
            events += self.advance_rendezvous();
        }
        if !self.failing.is_empty() {
            self.settle_all_failing();
        }
        self.last_progress_made = events > 0;
        if events == 0 && self.yield_when_idle {
            std::thread::yield_now();
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(events > 0),
        }
    }

    /// `peer` has queued sends, queued control messages or credits to return: progress
    /// visits it until it has none.
    pub(crate) fn needs_service(&mut self, peer: usize) {
        let p = &mut self.peers[peer];
        if !p.in_service {
            p.in_service = true;
            self.service.push(peer);
        }
    }

    fn handle_completion(&mut self, c: &Completion) -> Result<()> {
        let (kind, peer, index) = wr_parts(c.wr_id);
        if kind != WrKind::Recv as u64 {
            self.peers[peer].in_flight = self.peers[peer].in_flight.saturating_sub(1);
        }
        if kind == WrKind::SendSlot as u64 {
            self.send_free.push(index);
        }
        if c.status != WcStatus::Success {
            if kind == WrKind::Rdma as u64 {
                // The lease stays with its request, which `fail_peer` releases.
                self.take_rdma(index);
            }
            self.fail_peer(peer, c.status, "moving data");
            return Ok(());
        }
        match kind {
            // Nothing more is taken from a peer that failed (or broke the protocol).
            k if k == WrKind::Recv as u64 && self.peers[peer].dead.is_some() => Ok(()),
            k if k == WrKind::Recv as u64 => self.handle_incoming(peer, index, c.byte_len as usize),
            k if k == WrKind::Rdma as u64 => self.rdma_done(index),
            _ => Ok(()),
        }
    }

    /// If a wait makes no progress for a while, sends a zero-length RDMA WRITE to the peers
    /// it depends on: a dead peer turns into an error completion instead of a hang.
    fn probe_peers_of(&mut self, id: RequestId) -> Result<()> {
        let peers: Vec<usize> = match self.reqs.get(id) {
            Some(Req::Send(s)) => vec![s.peer],
            Some(Req::Recv(r)) => match (&r.state, r.sel.source) {
                (RecvState::Rndv(rv), _) => vec![rv.peer],
                (RecvState::Posted, Some(s)) => vec![s],
                (RecvState::Posted, None) => (0..self.size).collect(),
            },
            _ => vec![],
        };
        for p in peers {
            self.send_liveness_probe(p);
        }
        Ok(())
    }

    /// Posts a zero-length RDMA WRITE to `peer`: its completion fails (and the peer is
    /// marked dead) if the peer has gone. Nothing for oneself or a peer already dead.
    fn send_liveness_probe(&mut self, p: usize) {
        if self.peers[p].dead.is_none() && p != self.rank {
            let wr = SendWr {
                wr_id: wr_id(WrKind::Probe, p, 0),
                opcode: Opcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
                sgl: &[],
                inline: false,
                signaled: true,
            };
            if raw::post_send(&*self.nic, self.peers[p].qpn, &wr).is_ok() {
                self.peers[p].in_flight += 1;
            }
        }
    }

    /// For a blocking probe that has found nothing for a while (`MPI_Probe` must not spin
    /// forever on a dead sender): fails once none of `senders` (the ranks that could send
    /// the message; this rank, blocked here, is skipped) is alive, and otherwise sends them
    /// liveness probes, whose failures the next progress records.
    pub fn check_probe_senders(&mut self, senders: &[usize]) -> Result<()> {
        for &s in senders {
            self.check_rank(s)?;
        }
        let others: Vec<usize> = senders
            .iter()
            .copied()
            .filter(|&p| p != self.rank)
            .collect();
        if let Some(&first) = others.first() {
            if let (Some(status), true) = (
                self.peers[first].dead,
                others.iter().all(|&p| self.peers[p].dead.is_some()),
            ) {
                return Err(Error::Communication {
                    peer: first,
                    status,
                    what: "probe (no rank that could send the message is alive)",
                });
            }
        }
        for p in others {
            self.send_liveness_probe(p);
        }
        Ok(())
    }

    /// Posts receive slot `slot` of `peer`'s region again.
    pub(crate) fn post_slot(&mut self, peer: usize, slot: usize) -> Result<()> {
        let per_peer = (self.cfg.credits + self.cfg.control_slots) as usize;
        let addr = self.recv_pool.addr() + ((peer * per_peer + slot) * self.slot_bytes) as u64;
        let sge = [Sge {
            addr,
            len: self.slot_bytes as u32,
            lkey: self.recv_key,
        }];
        let wr = crate::nic::RecvWr {
            wr_id: wr_id(WrKind::Recv, peer, slot),
            sgl: &sge,
        };
        raw::post_recv(&*self.nic, self.peers[peer].qpn, &wr)
    }

    /// The bytes of receive slot `slot` of `peer`.
    pub(crate) fn slot_bytes_of(&self, peer: usize, slot: usize) -> &[u8] {
        let per_peer = (self.cfg.credits + self.cfg.control_slots) as usize;
        let start = (peer * per_peer + slot) * self.slot_bytes;
        &self.recv_pool.as_slice()[start..start + self.slot_bytes]
    }

    /// Sends a message: header plus `payload` bytes of `src` (from `offset`). Inline when it
    /// fits, else through an eager send slot. False if the queue pair or the slots are full.
    pub(crate) fn send_message(
        &mut self,
        peer: usize,
        mut h: Header,
        src: Payload<'_>,
    ) -> Result<bool> {
        let p = &mut self.peers[peer];
        if p.in_flight + 2 >= self.max_send_wr {
            return Ok(false);
        }
        let payload = match src {
            Payload::None => 0,
            Payload::User(_, _, len) => len,
            Payload::Bytes(b) => b.len(),
        };
        let credits = p.to_return.min(u16::MAX as u32);
        h.credits = credits as u16;
        let total = HEADER_BYTES + payload;
        if total <= self.max_inline {
            // Inline: the NIC copies the header and the payload at post time.
            let header = h.encode();
            let (addr, len) = match src {
                Payload::None => (0, 0),
                Payload::User(ub, off, len) => (ub.addr() + off as u64, len),
                Payload::Bytes(b) => (b.as_ptr() as u64, b.len()),
            };
            let sge = [
                Sge {
                    addr: header.as_ptr() as u64,
                    len: HEADER_BYTES as u32,
                    lkey: 0,
                },
                Sge {
                    addr,
                    len: len as u32,
                    lkey: 0,
                },
            ];
            let wr = SendWr {
                wr_id: wr_id(WrKind::SendInline, peer, 0),
                opcode: Opcode::Send,
                sgl: if len == 0 { &sge[..1] } else { &sge },
                inline: true,
                signaled: true,
            };
            raw::post_send(&*self.nic, p.qpn, &wr)?;
        } else {
            let Some(slot) = self.send_free.pop() else {
                return Ok(false);
            };
            let start = slot * self.slot_bytes;
            let mem = &mut self.send_pool.as_mut_slice()[start..start + total];
            mem[..HEADER_BYTES].copy_from_slice(&h.encode());
            fill_payload(&src, &mut mem[HEADER_BYTES..]);
            let sge = [Sge {
                addr: self.send_pool.addr() + start as u64,
                len: total as u32,
                lkey: self.send_key,
            }];
            let wr = SendWr {
                wr_id: wr_id(WrKind::SendSlot, peer, slot),
                opcode: Opcode::Send,
                sgl: &sge,
                inline: false,
                signaled: true,
            };
            raw::post_send(&*self.nic, p.qpn, &wr)?;
        }
        let p = &mut self.peers[peer];
        p.to_return -= credits;
        p.in_flight += 1;
        Ok(true)
    }

    /// Sends a control message now, or queues it (in order) behind earlier ones.
    pub(crate) fn send_control(&mut self, peer: usize, h: Header) -> Result<()> {
        if self.peers[peer].dead.is_some() {
            return Ok(());
        }
        if self.peers[peer].control.is_empty() && self.send_message(peer, h, Payload::None)? {
            return Ok(());
        }
        self.peers[peer].control.push_back(h);
        self.needs_service(peer);
        Ok(())
    }

    fn flush_control(&mut self, peer: usize) -> Result<()> {
        while let Some(h) = self.peers[peer].control.front().copied() {
            if !self.send_message(peer, h, Payload::None)? {
                break;
            }
            self.peers[peer].control.pop_front();
        }
        Ok(())
    }

    /// Posts an RDMA operation for a rendezvous chunk.
    pub(crate) fn post_rdma(
        &mut self,
        peer: usize,
        op: RdmaOp,
        lease: Lease,
        opcode: Opcode,
    ) -> Result<bool> {
        if self.peers[peer].in_flight + 2 >= self.max_send_wr {
            return Ok(false);
        }
        let index = match self.rdma_free.pop() {
            Some(i) => {
                self.rdma[i] = Some(op);
                i
            }
            None => {
                self.rdma.push(Some(op));
                self.rdma.len() - 1
            }
        };
        let sge = [Sge {
            addr: lease.addr,
            len: lease.len as u32,
            lkey: lease.lkey,
        }];
        let wr = SendWr {
            wr_id: wr_id(WrKind::Rdma, peer, index),
            opcode,
            sgl: if lease.len == 0 { &[] } else { &sge },
            inline: false,
            signaled: true,
        };
        raw::post_send(&*self.nic, self.peers[peer].qpn, &wr)?;
        self.peers[peer].in_flight += 1;
        Ok(true)
    }

    fn take_rdma(&mut self, index: usize) -> Option<RdmaOp> {
        let op = self.rdma.get_mut(index)?.take()?;
        self.rdma_free.push(index);
        Some(op)
    }

    fn rdma_done(&mut self, index: usize) -> Result<()> {
        let Some(op) = self.take_rdma(index) else {
            return Ok(());
        };
        self.rndv_rdma_done(op)
    }

    /// Shuts the layer down: stops the buffer mode and deregisters the slots.
    pub fn shutdown(mut self) {
        self.mode.stop(&*self.nic);
        let _ = self.nic.deregister(self.recv_key);
        let _ = self.nic.deregister(self.send_key);
    }
}
