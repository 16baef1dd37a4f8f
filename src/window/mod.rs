//! One-sided communication (MPI 3.1 chapter 11): windows of memory that other ranks put
//! into, get from and update atomically, without the owner's CPU.
//!
//! [`Window`] has the API of mpi-rs 0.1's `mpi::window::Window` (`allocate`, `from_vec`,
//! `put`, `get`, `accumulate`, `fence`, `lock`, `unlock`, `with_local`,
//! `with_local_mut`, `rank`, `size`, `local_len`), so code written for it compiles
//! unchanged, with real semantics (`lock` is a lock), and more of MPI's: fetching
//! accumulates, fetch-and-op, compare-and-swap, shared locks, lock-all, flushes and
//! post/start/complete/wait. Each operation has a `try_` twin that returns the error
//! instead of panicking.
//!
//! How it runs over the NIC, as RDMA MPI libraries do it:
//!
//! - Creation registers each rank's part once, for the window's life, and a page of
//!   control words (its lock, and the mutex of updates the NIC's atomics cannot make):
//!   pinned, or on demand in the `odp` buffer mode. The parts' addresses and keys are
//!   exchanged with an allgather.
//! - `put` and `get` are RDMA WRITEs and READs straight into and out of the target's part,
//!   the origin's buffer going through the buffer mode (bounce slots in `copy`, the
//!   registration cache in `pindown`, the on-demand key in `odp`). The target's CPU does
//!   nothing: its soft NIC's engine checks and moves, or its driver thread when the
//!   application computes.
//! - Sums (and no-op reads) of 64-bit integers are the NIC's `FETCH_ADD`, element by
//!   element, and a compare-and-swap of an aligned 8-byte element is its `CMP_SWAP`. Every
//!   other accumulate, fetching accumulate and compare-and-swap is one message to the
//!   target, whose progress engine applies it (`active.rs`, as MPICH does), or, with
//!   `PAGEWIRE_RMA_ACCUMULATE=mutex`, past the eager limit and on dynamic windows, runs
//!   under the target's update mutex, a word of its control page taken with `CMP_SWAP`: a
//!   get, the combination at the origin, a put, the mutex given back (four round trips
//!   whatever the count, as foMPI-style RDMA implementations emulate accumulates). With
//!   MPI's default `accumulate_ops = same_op_no_op`, concurrent updates of one location use
//!   one operation, so they take one way and each element update is atomic.
//! - Locks are words in the target's control page: exclusive is a compare-and-swap from
//!   free, shared a fetch-and-add of one that backs off while the exclusive bit is set.
//!
//! A put that fits the NIC's inline data returns at once (the NIC copied it); `flush`,
//! `unlock` and `fence` wait for such puts to complete at their targets. Every other
//! operation returns once it is complete at the target (an RC completion); the queue pair
//! keeps each origin's operations to a target in order.
//!
//! What is checked: a displacement or length past the target's part is an error at the
//! origin ([`Error::OutOfWindow`]), before anything moves; an unlock without a lock, a
//! second lock on one target, a nested local access and a free while a lock is held are
//! [`Error::WindowSync`]. Local access (`with_local`, `with_local_mut`) takes this rank's own
//! lock, shared or exclusive, for the closure's time, unless this rank holds a lock on its
//! own part already, so that no peer that locks writes it meanwhile; a peer that writes
//! under `fence` alone relies on the epochs MPI defines (no local access to a location
//! that a peer updates in the same epoch), as in every MPI library.
//!
//! Three ways to make one: over memory the window allocates or takes over
//! ([`Window::allocate`], [`Window::from_vec`]), over a slice the caller lends for a scope
//! ([`Window::create`]), and over no memory at first ([`Window::create_dynamic`]), to which
//! each rank attaches regions and detaches them when it likes ([`Window::attach`],
//! [`Window::detach`]). How the buffer modes expose a dynamic window differs the most: in
//! `copy` and `pindown` each attach registers and pins its region, for as long as it stays
//! attached; in `odp` the window registers the whole address space once, on demand
//! (implicit ODP), and an attach only publishes the region (and prefetches its pages for
//! the NIC). [`Window::counters`] says what each did.
//!
//! Request-based `rput` and `rget` return requests in rsmpi's scopes and move while the
//! application computes (`requests.rs`).
//!
//! Shared-memory windows (`allocate_shared`, `shared_query`, `with_shared`) map every
//! rank's part into each rank of one host (`shared.rs`); `allocate` makes one where every
//! rank is on the local path. Other windows' puts and gets to a rank on the local path are
//! one kernel copy into or out of its memory (the message layer's `rma_local_copy`).
//!
//! Datatypes at origin and target: `put_typed`, `get_typed`, `accumulate_typed` (`typed.rs`).
//!
//! Not here yet: the fetching operations on element types with gaps (put, get and accumulate
//! move their blocks), and dynamic windows and request-based operations
//! under `PAGEWIRE_TRANSPORT=mpi`; each is refused with an error that says so.

mod access;
mod active;
mod attach;
mod create;
mod dynamic;
mod memory;
mod operations;
mod requests;
mod shared;
mod sync;
mod typed;

pub use dynamic::Attachment;
pub use shared::SharedPart;

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;

use pagewire_transport::msg::{PointToPoint, RemoteMemory};
use pagewire_transport::sys::AnonMapping;

use crate::backend::CommunicatorBackend;
use crate::datatype::{Equivalence, TypeMap};
use crate::error::{fatal, Error, Result};
use crate::topology::{Communicator, Rank, SimpleCommunicator};

use dynamic::{Attached, RegionView};
use memory::{ElementBytes, WindowMemory};

/// The lock word's exclusive bit; the bits below count shared holders.
const EXCLUSIVE: u64 = 1 << 62;
/// Control words: the lock, then the update mutex.
const LOCK_WORD: u64 = 0;
const UPDATE_MUTEX: u64 = 8;
/// Bytes of the control page.
const CONTROL_BYTES: usize = 4096;
/// Tags of post/start/complete/wait on the window's own communicator.
const POST_TAG: i32 = 1;
const COMPLETE_TAG: i32 = 2;

/// One rank's part of a window, as every rank knows it.
#[derive(Clone, Copy, Debug, Default)]
struct Part {
    /// Its world rank (what the message layer addresses).
    world: usize,
    /// Address of its element 0, and the bytes of its part.
    base: u64,
    bytes: u64,
    /// Its registration (rounded out to whole 64-bit words).
    memory: RemoteMemory,
    /// Its control page.
    control: RemoteMemory,
}

/// What carries a window's operations.
enum Carrier {
    /// pagewire's NIC: this rank's registrations, its part's (none for an empty part) and
    /// its control page's.
    Nic {
        own_key: Option<u32>,
        control: std::sync::Arc<AnonMapping>,
        control_key: u32,
    },
    /// The host MPI library's windows (`PAGEWIRE_TRANSPORT=mpi`).
    #[cfg(feature = "mpi")]
    HostMpi(crate::backend::host_mpi::window::HostWindow),
}

/// Where one access lands: the target, its address there and the key that covers it.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// The target's index in the window.
    target: usize,
    /// The target's world rank.
    world: usize,
    /// The first byte, in the target's address space.
    at: u64,
    rkey: u32,
}

/// A dynamic window's state on this rank.
struct DynamicState<T> {
    /// The whole address space's registration (lkey, rkey), where the buffer mode exposes on
    /// demand; otherwise each attached region has its own.
    space: Option<(u32, u32)>,
    /// The regions attached here.
    attached: RefCell<Vec<Attached<T>>>,
    /// By target: the copy of its table, and its count of detaches at this rank's latest
    /// lock on it.
    views: RefCell<Vec<Option<RegionView>>>,
    seen_detaches: RefCell<Vec<u64>>,
    next_id: Cell<u64>,
}

/// What one rank did for a window: registrations and pins (`Window::counters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCounters {
    /// Registrations made: its part (or each attached region, or the whole address space
    /// once for a dynamic window in `odp`) and its control page.
    pub registrations: u64,
    /// Bytes those registrations named (the whole address space counts none).
    pub bytes_registered: u64,
    /// Bytes pinned now (none in a mode that exposes on demand).
    pub bytes_pinned: u64,
    /// The most bytes pinned at once.
    pub peak_bytes_pinned: u64,
    /// Regions attached (dynamic windows).
    pub attaches: u64,
    /// Regions detached (dynamic windows).
    pub detaches: u64,
}

impl WindowCounters {
    fn registered(&mut self, bytes: u64, pinned: u64) {
        self.registrations += 1;
        self.bytes_registered += bytes;
        self.bytes_pinned += pinned;
        self.peak_bytes_pinned = self.peak_bytes_pinned.max(self.bytes_pinned);
    }
}

/// A lock this rank holds on a target's part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    None,
    Shared,
    Exclusive,
    /// Shared, taken for this many accesses to a dynamic window (blocking ones, and
    /// request-based ones in flight) while the user held none; the last gives it back.
    Implicit(u32),
}

/// A window of `T`s on every rank of a communicator (`MPI_Win`).
pub struct Window<T: Equivalence + Send + Sync> {
    comm: SimpleCommunicator,
    memory: WindowMemory<T>,
    /// The proof that elements are their bytes; `None` for an element type with gaps,
    /// whose put, get and accumulate move the datatype's blocks only (`typed.rs`).
    bytes: Option<ElementBytes<T>>,
    map: TypeMap,
    rank: usize,
    parts: Vec<Part>,
    /// What carries the operations.
    carrier: Carrier,
    /// The locks this rank holds, by target.
    held: RefCell<Vec<Held>>,
    /// The rank whose part a load/store access (`with_local`, `with_shared`, ...) holds
    /// references to now (they do not nest).
    local_open: Cell<Option<usize>>,
    /// Origins of the open exposure epoch (`post`), and targets of the open access epoch
    /// (`start`).
    exposure: RefCell<Option<Vec<usize>>>,
    access: RefCell<Option<Vec<usize>>>,
    /// A dynamic window's regions and views (`None` for the others).
    dynamic: Option<DynamicState<T>>,
    /// A shared-memory window's parts, every rank's mapped here (`None` for the others).
    shared: Option<memory::SharedParts<T>>,
    /// Where targets apply accumulates themselves (`active.rs`; `None`: under the mutex).
    active: Option<active::ActiveUpdates>,
    counters: Cell<WindowCounters>,
    freed: bool,
}

impl<T: Equivalence + Send + Sync> Window<T> {
    /// This rank in the window's communicator.
    pub fn rank(&self) -> Rank {
        self.rank as Rank
    }

    /// Ranks sharing the window.
    pub fn size(&self) -> Rank {
        self.parts.len() as Rank
    }

    /// Elements of this rank's part.
    pub fn local_len(&self) -> usize {
        self.memory.len()
    }

    /// Address of this rank's part (`MPI_WIN_BASE`).
    pub fn base(&self) -> u64 {
        self.memory.addr()
    }

    /// Bytes of this rank's part (`MPI_WIN_SIZE`).
    pub fn size_bytes(&self) -> u64 {
        self.parts[self.rank].bytes
    }

    /// Bytes one displacement stands for (`MPI_WIN_DISP_UNIT`): one element, or one byte
    /// in a dynamic window (whose displacements are addresses).
    pub fn disp_unit(&self) -> usize {
        if self.dynamic.is_some() {
            1
        } else {
            std::mem::size_of::<T>()
        }
    }

    /// Whether this is a dynamic window ([`Window::create_dynamic`]).
    pub fn is_dynamic(&self) -> bool {
        self.dynamic.is_some()
    }

    /// What this rank registered and pinned for the window so far.
    pub fn counters(&self) -> WindowCounters {
        self.counters.get()
    }

    /// Runs `f` on this rank's part. Holds this rank's shared lock meanwhile (unless it
    /// holds a lock on its own part already). Panics on error.
    pub fn with_local<R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        fatal(self.try_with_local(f))
    }

    /// [`Window::with_local`], returning errors.
    pub fn try_with_local<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.local_access(Held::Shared, || self.memory.with_local(f))
    }

    /// Runs `f` on this rank's part, to change it. Holds this rank's exclusive lock
    /// meanwhile (unless it holds a lock on its own part already: exclusive, or shared,
    /// which keeps other lockers' writes out too). Panics on error.
    pub fn with_local_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> R {
        fatal(self.try_with_local_mut(f))
    }

    /// [`Window::with_local_mut`], returning errors.
    pub fn try_with_local_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.local_access(Held::Exclusive, || self.memory.with_local_mut(f))
    }

    fn local_access<R>(&self, lock: Held, f: impl FnOnce() -> R) -> Result<R> {
        self.load_store_access(self.rank, lock, f)
    }

    /// Runs `f`, which holds references to rank `t`'s part (this rank's, or a peer's in a
    /// shared-memory window), under `t`'s lock taken as `lock` (unless this rank holds a
    /// lock on `t` already), so that no peer that locks writes it meanwhile.
    fn load_store_access<R>(&self, t: usize, lock: Held, f: impl FnOnce() -> R) -> Result<R> {
        if self.local_open.get().is_some() {
            return Err(Error::WindowSync(
                "a local access to the window inside another one (with_local/with_local_mut do \
                 not nest)"
                    .into(),
            ));
        }
        let me = t;
        let take =
            match self.held.borrow()[me] {
                Held::None => true,
                Held::Implicit(_) => return Err(Error::WindowSync(
                    "a local access while request-based operations on this rank's own part are \
                     in flight (wait for them first)"
                        .into(),
                )),
                _ => false,
            };
        if take {
            self.acquire(me, lock)?;
        }
        self.local_open.set(Some(t));
        let own = self.active.as_ref().filter(|_| t == self.rank);
        if let Some(a) = own {
            a.local_open.store(true, Ordering::Release);
        }
        let r = f();
        if let Some(a) = own {
            a.local_open.store(false, Ordering::Release);
        }
        self.local_open.set(None);
        if take {
            self.release(me)?;
        }
        Ok(r)
    }
}

impl<T: Equivalence + Send + Sync> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("rank", &self.rank)
            .field("size", &self.parts.len())
            .field("local_len", &self.memory.len())
            .finish()
    }
}

/// Runs `f` on the message layer under `comm`, flattening the errors: a window needs
/// pagewire's own transport.
fn with_layer<R>(
    comm: &SimpleCommunicator,
    f: impl FnOnce(&mut PointToPoint) -> pagewire_transport::Result<R>,
) -> Result<R> {
    comm.as_simple()
        .backend()
        .with_message_layer(f)
        .map_err(|e| match e {
            Error::NotSupported(why) if why.starts_with("PAGEWIRE_TRANSPORT=mpi") => {
                Error::NotSupported(
                    "windows run on pagewire's own transport; under PAGEWIRE_TRANSPORT=mpi the \
                     host MPI's windows are not wired up yet"
                        .into(),
                )
            }
            e => e,
        })?
        .map_err(Error::from)
}

/// `[addr, addr+bytes)` rounded out to whole 64-bit words (what a window registers, for
/// the NIC's atomics on its edge elements); empty for no bytes.
fn word_span(addr: u64, bytes: u64) -> (u64, u64) {
    if bytes == 0 {
        return (0, 0);
    }
    let first = addr & !7;
    (first, (addr + bytes).next_multiple_of(8) - first)
}

/// Bytes of one `unit`.
#[cfg(feature = "mpi")]
fn unit_size(unit: crate::datatype::Primitive) -> usize {
    use crate::datatype::Primitive::*;
    match unit {
        Bool | I8 | U8 => 1,
        I16 | U16 => 2,
        I32 | U32 | F32 => 4,
        I64 | U64 | F64 | Complex32 => 8,
        Complex64 => 16,
    }
}
