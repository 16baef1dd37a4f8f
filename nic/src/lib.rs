//! The NIC boundary: a small verbs-shaped provider trait (docs/architecture.md).
//!
//! It mirrors the parts of libibverbs that pagewire uses: one protection domain per device
//! context, memory regions with access flags (including on-demand paging and implicit ODP,
//! ODP13), `advise` for prefetch, reliable-connected queue pairs, send and receive work
//! requests with scatter-gather lists, and completion queues whose entries carry a status
//! modelled on `ibv_wc_status`. A provider is one crate or module: the soft NIC
//! (`pagewire-soft`, the default) or, with the `verbs` feature, rdma-core
//! (`pagewire_transport::nic::verbs`); `pagewire_transport::nic::open` brings up the one
//! `PAGEWIRE_TRANSPORT` names.
//!
//! Work-request errors (bad key, out of bounds, missing access right, dead peer) are never
//! returned from `post_*`: they arrive in the completion, and the queue pair then enters the
//! error state and flushes what follows, as on hardware.
#![deny(missing_docs)]
// `unsafe` only in the trait's posting calls, which providers implement.
#![deny(unsafe_code)]

pub mod counters;
pub mod receive_fault_counters;
mod region;
pub mod tpt_cache_counters;

pub use counters::{Counters, CountersSnapshot, DataPath, Latencies, NPF_LATENCY_BUCKETS};
pub use region::Region;

use pagewire_sys::Result;

pub use pagewire_sys::PAGE_SIZE;

/// Access rights of a memory region (`ibv_access_flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// The NIC may write the region on behalf of local work requests (receives, READ results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA READ from the region.
    pub const REMOTE_READ: Access = Access(4);
    /// On-demand paging: the region is never pinned; pages are mapped by network page faults.
    pub const ON_DEMAND: Access = Access(8);
    /// Peers may run atomic operations (fetch-and-add, compare-and-swap) on the region.
    pub const REMOTE_ATOMIC: Access = Access(16);
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);

    /// The rights of both (`|`, usable in constants).
    #[inline]
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
    /// All bits of `other` are set in `self`.
    #[inline]
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// The raw bits.
    #[inline]
    pub fn bits(self) -> u32 {
        self.0
    }
    /// From raw bits (unknown bits dropped).
    #[inline]
    pub fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & 0x1f)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    #[inline]
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// What `advise` asks the NIC to do with a range (`ibv_advise_mr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// Map the pages for reading ahead of use (`IBV_ADVISE_MR_ADVICE_PREFETCH`).
    Prefetch,
    /// Map the pages for writing ahead of use (`IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`).
    PrefetchWrite,
}

/// A registered memory region as the user sees it: where it is and its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// First byte covered (0 for implicit ODP).
    pub addr: u64,
    /// Bytes covered.
    pub len: u64,
    /// Key for local scatter-gather entries.
    pub lkey: u32,
    /// Key peers name in RDMA operations.
    pub rkey: u32,
    /// The rights it was registered with.
    pub access: Access,
}

/// One scatter-gather entry (`ibv_sge`): `len` bytes at `addr` inside the region `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Start address in this process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of a region covering the range.
    pub lkey: u32,
}

/// The operation of a send work request (`ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// Two-sided send; consumes a receive at the peer.
    Send,
    /// Send carrying 32 bits of immediate data.
    SendWithImm(u32),
    /// Write into the peer's memory; no receive consumed.
    RdmaWrite {
        /// Target address in the peer.
        remote_addr: u64,
        /// Peer's key for that range.
        rkey: u32,
    },
    /// Write into the peer's memory and consume a receive there carrying `imm`.
    RdmaWriteWithImm {
        /// Target address in the peer.
        remote_addr: u64,
        /// Peer's key for that range.
        rkey: u32,
        /// Immediate data delivered in the peer's receive completion.
        imm: u32,
    },
    /// Read from the peer's memory into the local scatter-gather list.
    RdmaRead {
        /// Source address in the peer.
        remote_addr: u64,
        /// Peer's key for that range.
        rkey: u32,
    },
    /// Adds `add` to the 64-bit word at `remote_addr` in the peer, atomically, and writes
    /// the word's old value into the local scatter-gather list (one 8-byte entry)
    /// (`IBV_WR_ATOMIC_FETCH_AND_ADD`). `remote_addr` must be 8-byte aligned.
    AtomicFetchAdd {
        /// Target word in the peer (8-byte aligned).
        remote_addr: u64,
        /// Peer's key for that word; its region needs [`Access::REMOTE_ATOMIC`].
        rkey: u32,
        /// What is added (wrapping).
        add: u64,
    },
    /// Writes `swap` into the 64-bit word at `remote_addr` in the peer if it equals
    /// `compare`, atomically, and writes the word's old value into the local
    /// scatter-gather list (one 8-byte entry) (`IBV_WR_ATOMIC_CMP_AND_SWP`).
    AtomicCmpSwap {
        /// Target word in the peer (8-byte aligned).
        remote_addr: u64,
        /// Peer's key for that word; its region needs [`Access::REMOTE_ATOMIC`].
        rkey: u32,
        /// The value the word must hold for the swap to happen.
        compare: u64,
        /// The value written when it does.
        swap: u64,
    },
}

/// Bytes an atomic work request reads and writes: one 64-bit word.
pub const ATOMIC_BYTES: u32 = 8;

/// A send-queue work request (`ibv_send_wr`).
#[derive(Clone, Debug)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: Opcode,
    /// Local buffers (gathered for sends and writes, scattered into for reads).
    pub sgl: &'a [Sge],
    /// Copy the payload at post time (`IBV_SEND_INLINE`): the buffers may be reused as soon
    /// as `post_send` returns and need no key. Limited to `Capabilities::max_inline`.
    pub inline: bool,
    /// Generate a completion on success (`IBV_SEND_SIGNALED`); errors always complete.
    pub signaled: bool,
}

/// A receive-queue work request (`ibv_recv_wr`).
#[derive(Clone, Debug)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers an incoming send is scattered into.
    pub sgl: &'a [Sge],
}

pub use pagewire_sys::WcStatus;

/// What completed (`ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// A send (with or without immediate).
    Send,
    /// An RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// An atomic fetch-and-add.
    FetchAdd,
    /// An atomic compare-and-swap.
    CompSwap,
    /// A receive consumed by a send.
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// A completion queue entry (`ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred (READ; 8 for atomics).
    pub byte_len: u32,
    /// Immediate data, for receives of `SendWithImm` and `RdmaWriteWithImm`.
    pub imm: Option<u32>,
    /// Local queue pair number.
    pub qp_num: u32,
}

/// Sizes of a queue pair (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Scatter-gather entries per work request.
    pub max_sge: u32,
    /// Inline bytes per send.
    pub max_inline: u32,
    /// How often a receiver-not-ready answer is retried; 7 means forever (`rnr_retry`).
    pub rnr_retry: u8,
    /// Wait before retrying after receiver-not-ready, in microseconds (`min_rnr_timer`).
    pub rnr_timer_us: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_sge: 4,
            max_inline: 256,
            rnr_retry: 7,
            rnr_timer_us: 20,
        }
    }
}

/// What a device can do (the parts of `ibv_device_attr_ex` pagewire reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Provider name, for reports.
    pub provider: &'static str,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Memory regions per device context.
    pub max_mr: u32,
    /// Queue pairs per device context.
    pub max_qp: u32,
    /// Scatter-gather entries per work request.
    pub max_sge: u32,
    /// Inline bytes per send.
    pub max_inline: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// The device this context drives, for messages and reports (`soft`, or e.g.
    /// `mlx5_0 port 1`).
    pub device: String,
    /// RC supports ODP for send, receive, write and read.
    pub odp_rc: bool,
    /// RC supports ODP for SEND on the requester side (`IBV_ODP_SUPPORT_SEND`).
    pub odp_rc_send: bool,
    /// RC supports ODP for receive buffers (`IBV_ODP_SUPPORT_RECV`).
    pub odp_rc_recv: bool,
    /// RC supports ODP for RDMA WRITE (`IBV_ODP_SUPPORT_WRITE`).
    pub odp_rc_write: bool,
    /// RC supports ODP for RDMA READ (`IBV_ODP_SUPPORT_READ`).
    pub odp_rc_read: bool,
    /// One ODP region may cover the whole address space.
    pub implicit_odp: bool,
    /// `advise` (prefetch) is supported.
    pub prefetch: bool,
    /// 64-bit atomics (fetch-and-add, compare-and-swap) are supported, atomic with respect
    /// to other atomics through this device (`IBV_ATOMIC_HCA` or better).
    pub atomics: bool,
    /// The atomics are also atomic with respect to the target's own CPU loads and stores
    /// (`IBV_ATOMIC_GLOB`).
    pub atomics_global: bool,
}

impl Capabilities {
    /// `Ok` when on-demand paging works on RC queue pairs for send, receive, write and read
    /// (what the `odp` buffer mode needs); otherwise an [`pagewire_sys::Error::Unsupported`] that
    /// names the device and the missing operations.
    pub fn require_rc_odp(&self) -> Result<()> {
        let missing: Vec<&str> = [
            ("send", self.odp_rc_send),
            ("receive", self.odp_rc_recv),
            ("RDMA write", self.odp_rc_write),
            ("RDMA read", self.odp_rc_read),
        ]
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(op, _)| *op)
        .collect();
        if missing.is_empty() && self.odp_rc {
            return Ok(());
        }
        let what = if missing.is_empty() {
            "on-demand paging on RC queue pairs".to_string()
        } else {
            format!(
                "on-demand paging on RC queue pairs for {}",
                missing.join(", ")
            )
        };
        Err(pagewire_sys::Error::Unsupported {
            device: format!("{} ({} provider)", self.device, self.provider),
            what,
            hint: "use the copy or pindown buffer mode, or the soft provider (PAGEWIRE_TRANSPORT=soft)",
        })
    }

    /// `Ok` when one ODP region may cover the whole address space (implicit ODP) on top of
    /// [`Capabilities::require_rc_odp`].
    pub fn require_implicit_odp(&self) -> Result<()> {
        self.require_rc_odp()?;
        if self.implicit_odp {
            return Ok(());
        }
        Err(pagewire_sys::Error::Unsupported {
            device: format!("{} ({} provider)", self.device, self.provider),
            what: "implicit on-demand paging (one region for the whole address space)".into(),
            hint:
                "use explicit ODP regions, the copy or pindown buffer mode, or the soft provider \
                   (PAGEWIRE_TRANSPORT=soft)",
        })
    }
}

/// Opaque per-queue-pair connection data, exchanged through the bootstrap (what QPN, PSN and
/// GID are for verbs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint(pub Vec<u8>);

/// A device context with its one protection domain: the provider trait.
///
/// Handles are plain ids owned by the context; destroying the context releases everything
/// (deregisters every region, so nothing stays pinned). [`Region`] owns one registration
/// and deregisters it when dropped.
pub trait Nic: Send + Sync {
    /// What the device supports.
    fn capabilities(&self) -> &Capabilities;

    /// Registers `[addr, addr+len)`. Without [`Access::ON_DEMAND`] the pages are pinned
    /// (counted against the locked-memory limit) and must be mapped; with it nothing is
    /// pinned and pages are mapped into the NIC by network page faults.
    fn register(&self, addr: u64, len: u64, access: Access) -> Result<RegionInfo>;

    /// Registers the whole address space with on-demand paging (implicit ODP, ODP13):
    /// one key valid for any mapped address.
    fn register_implicit_odp(&self, access: Access) -> Result<RegionInfo>;

    /// Deregisters the region named by `lkey`: waits for in-flight DMA to it, unpins its
    /// pages, and makes its key invalid for good.
    fn deregister(&self, lkey: u32) -> Result<()>;

    /// Maps `[addr, addr+len)` of an ODP region into the NIC ahead of use (prefetch).
    fn advise(&self, lkey: u32, addr: u64, len: u64, advice: Advice) -> Result<()>;

    /// Creates a completion queue of `depth` entries; returns its id.
    fn create_cq(&self, depth: u32) -> Result<u32>;

    /// Creates a reliable-connected queue pair towards rank `peer`; returns its number.
    fn create_qp(&self, peer: usize, send_cq: u32, recv_cq: u32, caps: QpCaps) -> Result<u32>;

    /// The data the peer needs to connect to queue pair `qpn`.
    fn endpoint(&self, qpn: u32) -> Result<Endpoint>;

    /// Connects `qpn` to the peer's queue pair (INIT -> RTR -> RTS).
    fn connect(&self, qpn: u32, remote: &Endpoint) -> Result<()>;

    /// Posts a send work request.
    ///
    /// # Safety
    /// Unless `wr.inline`, the memory named by `wr.sgl` must not be accessed by Rust code in
    /// a way that conflicts with the NIC (written while the NIC reads it, or read or written
    /// while the NIC writes it, for RDMA READ) until the completion is polled, exactly as for
    /// `ibv_post_send`. The NIC itself never dereferences user addresses: it moves bytes with
    /// kernel copies, so an unmapped address ends in an error completion, not a crash.
    #[allow(unsafe_code)]
    unsafe fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<()>;

    /// Posts a receive work request.
    ///
    /// # Safety
    /// The memory named by `wr.sgl` must not be accessed by Rust code until the receive
    /// completes (the NIC writes it), as for `ibv_post_recv`.
    #[allow(unsafe_code)]
    unsafe fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<()>;

    /// Moves up to `max` completions of `cq` into `out`; returns how many. Also drives the
    /// provider's progress where it needs the caller's thread (the soft provider).
    fn poll_cq(&self, cq: u32, out: &mut Vec<Completion>, max: usize) -> Result<usize>;

    /// The device's counters now.
    fn counters(&self) -> CountersSnapshot;

    /// One line: how registrations pin memory (`PAGEWIRE_VERBOSE=1` prints it).
    fn pinning(&self) -> String {
        "ibv_reg_mr (the RDMA driver's long-term pins)".into()
    }
}

/// Which provider `open` brings up (`PAGEWIRE_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// The software NIC (default; no hardware needed).
    Soft,
    /// rdma-core's libibverbs (cargo feature `verbs`).
    Verbs,
}

impl ProviderKind {
    /// Reads `PAGEWIRE_TRANSPORT` (`soft`, the default, or `verbs`).
    pub fn from_env() -> Result<ProviderKind> {
        match std::env::var("PAGEWIRE_TRANSPORT").as_deref() {
            Err(_) | Ok("") | Ok("soft") => Ok(ProviderKind::Soft),
            Ok("verbs") => Ok(ProviderKind::Verbs),
            Ok(other) => Err(pagewire_sys::Error::invalid_setting(
                "PAGEWIRE_TRANSPORT",
                other,
                "expected soft or verbs",
            )),
        }
    }
}
