//! The buffer-mode boundary (docs/architecture.md): how a user buffer reaches the NIC.
//!
//! The rendezvous protocols move a message as a pipeline of chunks. Each side of a transfer
//! starts with [`BufferMode::begin`], which returns a [`Transfer`]: how that side chunks the
//! buffer (its [`Pipeline`]) and whether it is zero-copy — a mode may decide per transfer,
//! as `pindown` does when a registration cannot be made and it falls back to copying. For
//! each chunk the protocol asks the mode for a [`Lease`]: a range the NIC can address, with
//! keys. Before the NIC reads a lease the protocol calls [`BufferMode::stage_out`]; after the
//! NIC wrote one, [`BufferMode::stage_in`]; when done, [`BufferMode::release`]; at the end of
//! the transfer, [`BufferMode::end`]. The two sides need not chunk alike: the side that posts
//! the RDMA operations splits the peer's chunks into its own. The protocols never ask which
//! mode they run on.
//!
//! - `copy` ([`copy::CopyMode`], this crate): leases are slots of a pinned bounce pool, and
//!   staging copies between the user buffer and the slot (MVAPICH's R3 pipelining; Lesokhin17
//!   "copying", NFS-RDMA "inline/bounce").
//! - `pindown` and `odp` (their own crates): leases are the user buffer itself, as one chunk
//!   (a registration from a pin-down cache, or an on-demand-paging key), and staging is a
//!   no-op.

pub mod copy;
#[allow(unsafe_code)]
pub mod user_buf;

use crate::error::Result;
use crate::nic::{Access, Advice, Nic};
use crate::sys::AnonMapping;
use crate::sys::Error as SystemError;

/// Registers a pool of NIC-owned memory (bounce or eager slots) pinned; if that exceeds the
/// locked-memory limit and the NIC has on-demand paging, registers it ODP and prefetches it
/// instead (so small `ulimit -l` settings still run), and says so through `on_demand`.
pub(crate) fn register_pool(
    nic: &dyn Nic,
    pool: &AnonMapping,
    access: Access,
    on_demand: &mut bool,
) -> Result<u32> {
    match nic.register(pool.addr(), pool.len() as u64, access) {
        Ok(r) => Ok(r.lkey),
        Err(SystemError::MemlockLimit { .. }) if nic.capabilities().odp_rc => {
            let key = register_prefetched(nic, pool, access)?;
            *on_demand = true;
            Ok(key)
        }
        Err(e) => Err(e.into()),
    }
}

/// Registers `pool` on demand and prefetches all of it: [`register_pool`]'s fallback, and
/// the copy mode's once its pool cannot shrink any further.
pub(crate) fn register_prefetched(
    nic: &dyn Nic,
    pool: &AnonMapping,
    access: Access,
) -> Result<u32> {
    let r = nic.register(pool.addr(), pool.len() as u64, access | Access::ON_DEMAND)?;
    nic.advise(
        r.lkey,
        pool.addr(),
        pool.len() as u64,
        Advice::PrefetchWrite,
    )?;
    Ok(r.lkey)
}
pub use user_buf::{Layout, Piece, UserBuf, UserBufMut, UserMemory};

/// Which way the NIC uses a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The NIC reads it (the sending side).
    Source,
    /// The NIC writes it (the receiving side).
    Sink,
}

/// A range the NIC can address for one chunk of a transfer.
///
/// Not `Copy` or `Clone`: a lease is given back exactly once, by moving it into
/// [`BufferMode::release`], so a lease released twice or kept after its release does not
/// compile. Read its fields before moving it into the request's state.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a lease must be given back with BufferMode::release"]
pub struct Lease {
    /// Start address the NIC uses.
    pub addr: u64,
    /// Bytes covered.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key (what the peer names in RDMA).
    pub rkey: u32,
    /// The mode's own handle (a bounce slot, a cache entry, ...).
    pub token: u64,
}

/// How the protocols chunk a large transfer in this mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipeline {
    /// Largest chunk one lease covers (`usize::MAX`: the whole message in one lease).
    pub chunk: usize,
    /// Leases one transfer may hold at once, per side.
    pub depth: usize,
}

/// One side of one transfer, as the mode planned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// How this side chunks the buffer.
    pub pipeline: Pipeline,
    /// Whether leases expose the user's own memory.
    pub zero_copy: bool,
    /// The mode's own handle (a held registration, ...).
    pub token: u64,
}

/// Counters a mode reports, each mode filling what applies to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModeCounters {
    /// Leases handed out.
    pub leases: u64,
    /// Bytes copied between user buffers and bounce memory.
    pub bytes_copied: u64,
    /// Times a lease was refused for lack of resources (the transfer waited).
    pub lease_waits: u64,
    /// Bytes this mode keeps pinned for itself (its fixed footprint).
    pub pinned_footprint: u64,
    /// Registration-cache hits (pin-down).
    pub hits: u64,
    /// Registration-cache misses (pin-down).
    pub misses: u64,
    /// Registrations evicted (pin-down).
    pub evictions: u64,
    /// Registrations or translations invalidated because memory changed.
    pub invalidations: u64,
    /// Transfers that fell back to copying (pin-down, when registration failed).
    pub fallbacks: u64,
    /// Bytes the mode's cached registrations pin now (pin-down).
    pub registered_bytes: u64,
    /// The most bytes the mode's cached registrations ever pinned at once (pin-down; never
    /// above its limit).
    pub registered_peak: u64,
}

/// What a mode must provide so the protocols can move a user buffer.
pub trait BufferMode: Send {
    /// The mode's name, for reports (`copy`, `pindown`, `odp`).
    fn name(&self) -> &'static str;

    /// The mode's effective settings in one line, for `PAGEWIRE_VERBOSE=1`. Default: the
    /// name.
    fn describe(&self) -> String {
        self.name().to_string()
    }

    /// Whether memory a window exposes for its whole life is registered on demand (nothing
    /// pinned; network page faults map it) rather than pinned. Default: pinned.
    fn exposes_on_demand(&self) -> bool {
        false
    }

    /// Whether this mode normally exposes user memory itself (it may still fall back per
    /// transfer; see [`Transfer::zero_copy`]).
    fn is_zero_copy(&self) -> bool;

    /// Start-up, once the NIC is up (e.g. register a bounce pool).
    fn start(&mut self, nic: &dyn Nic) -> Result<()>;

    /// Hands the mode a shared handle on the NIC before `start`, for modes that must reach it
    /// outside the protocol's calls (a registration cache invalidated from a monitor thread).
    /// Default: not needed.
    fn attach(&mut self, _nic: &std::sync::Arc<dyn Nic>) {}

    /// Starts one side of a transfer of the `len`-byte user buffer at `user_addr`: plans
    /// its chunking and takes what it holds for the whole transfer (a registration, a
    /// prefetch).
    fn begin(
        &mut self,
        nic: &dyn Nic,
        user_addr: u64,
        len: usize,
        dir: Direction,
    ) -> Result<Transfer>;

    /// The sending side is about to move `[offset, offset+len)` of the transfer's buffer at
    /// `user_addr`: the receiver will read it (the RTS of an RGET has gone out) or this side
    /// writes it now (a CTS arrived, RPUT). A mode may make it ready ahead of the NIC's
    /// access: the ODP mode prefetches it (ODP13's rendezvous optimisation). Default:
    /// nothing.
    fn about_to_move(
        &mut self,
        _nic: &dyn Nic,
        _t: &Transfer,
        _user_addr: u64,
        _offset: usize,
        _len: usize,
    ) {
    }

    /// A lease for `len` bytes (at most one chunk of the transfer's plan) at `offset` of the
    /// transfer's buffer at `user_addr`. `Ok(None)` means "no resources now": the protocol
    /// retries later.
    fn lease(
        &mut self,
        nic: &dyn Nic,
        t: &Transfer,
        user_addr: u64,
        offset: usize,
        len: usize,
        dir: Direction,
    ) -> Result<Option<Lease>>;

    /// The NIC is about to read `lease`, which stands for `lease.len` bytes of `user` at
    /// `offset`: make its contents right.
    fn stage_out(&mut self, lease: &Lease, user: &UserBuf, offset: usize);

    /// The NIC has written `lease`, which stands for `len` bytes of `user` at `offset`: move
    /// them where the user expects them.
    fn stage_in(&mut self, lease: &Lease, user: &UserBufMut, offset: usize, len: usize);

    /// The NIC is done with `lease`.
    fn release(&mut self, nic: &dyn Nic, lease: Lease);

    /// The transfer is over (or failed): give back what `begin` took.
    fn end(&mut self, nic: &dyn Nic, t: Transfer);

    /// The mode's counters.
    fn counters(&self) -> ModeCounters;

    /// Ends the mode's use of the NIC (deregisters what it registered).
    fn stop(&mut self, nic: &dyn Nic);
}
