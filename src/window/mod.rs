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
//!   other accumulate, fetching accumulate and compare-and-swap runs under the target's
//!   update mutex, a word of its control page taken with `CMP_SWAP`: a get, the combination
//!   at the origin, a put, the mutex given back (four round trips whatever the count, as
//!   foMPI-style RDMA implementations emulate accumulates). With MPI's default
//!   `accumulate_ops = same_op_no_op`, concurrent updates of one location use one operation,
//!   so they take one of the two ways and each element update is atomic.
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
//! Not here yet: shared-memory windows (`allocate_shared`), element types with gaps, and
//! dynamic windows and request-based operations under `PAGEWIRE_TRANSPORT=mpi`; each is
//! refused with an error that says so.

mod dynamic;
mod memory;
mod requests;

pub use dynamic::Attachment;

use std::cell::{Cell, RefCell};

use pagewire_collectives::Op;
use pagewire_transport::msg::{PointToPoint, RemoteAtomic, RemoteMemory};
use pagewire_transport::sys::AnonMapping;

use crate::backend::CommunicatorBackend;
use crate::collective::operation::{combine_bytes, Reduction};
use crate::collective::{CommunicatorCollectives, SystemOperation};
use crate::datatype::{Equivalence, Primitive, TypeMap};
use crate::error::{fatal, Error, Result};
use crate::point_to_point::{Destination, Source};
use crate::topology::{Communicator, Group, Rank, SimpleCommunicator};

use dynamic::{
    capacity, detach_increment, detaches, entries, header, publish, table_bytes, Attached,
    AttachedRegion, RegionView, DETACH_BITS, DYNAMIC_CONTROL_BYTES, FIRST_READ_ENTRIES, TABLE_AT,
};
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
        control: AnonMapping,
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
    bytes: ElementBytes<T>,
    map: TypeMap,
    rank: usize,
    parts: Vec<Part>,
    /// What carries the operations.
    carrier: Carrier,
    /// The locks this rank holds, by target.
    held: RefCell<Vec<Held>>,
    /// A local access is running (they do not nest).
    local_open: Cell<bool>,
    /// Origins of the open exposure epoch (`post`), and targets of the open access epoch
    /// (`start`).
    exposure: RefCell<Option<Vec<usize>>>,
    access: RefCell<Option<Vec<usize>>>,
    /// A dynamic window's regions and views (`None` for the others).
    dynamic: Option<DynamicState<T>>,
    counters: Cell<WindowCounters>,
    freed: bool,
}

impl<T: Equivalence + Send + Sync> Window<T> {
    /// A window of `count` elements per rank, each `T::default()` (`MPI_Win_allocate`).
    /// Collective over `comm`. Panics on error.
    pub fn allocate<C: Communicator + ?Sized>(count: usize, comm: &C) -> Window<T>
    where
        T: Default + Clone,
    {
        fatal(Self::try_allocate(count, comm))
    }

    /// [`Window::allocate`], returning errors.
    pub fn try_allocate<C: Communicator + ?Sized>(count: usize, comm: &C) -> Result<Window<T>>
    where
        T: Default + Clone,
    {
        Self::try_from_vec(vec![T::default(); count], comm)
    }

    /// A window over `data`, which it owns until it is dropped (`MPI_Win_create` over
    /// memory the window keeps). Collective over `comm`. Panics on error.
    pub fn from_vec<C: Communicator + ?Sized>(data: Vec<T>, comm: &C) -> Window<T> {
        fatal(Self::try_from_vec(data, comm))
    }

    /// [`Window::from_vec`], returning errors.
    pub fn try_from_vec<C: Communicator + ?Sized>(data: Vec<T>, comm: &C) -> Result<Window<T>> {
        Self::build(comm, WindowMemory::new(data), false)
    }

    /// A window over `data`, which stays the caller's (`MPI_Win_create`): runs `f` on the
    /// window and frees it (collectively) before `data` is the caller's again, and returns
    /// what `f` returned. Collective over `comm`. Panics on error.
    ///
    /// The window lives inside the call, as `std::thread::scope`'s threads do, because a
    /// window that could outlive the borrow (leaked with `mem::forget`, say) would let
    /// peers' NICs write memory the caller uses again. If `f` panics, the window's
    /// registrations go at once (peers' accesses then fail), and the free is left undone.
    pub fn create<C: Communicator + ?Sized, R>(
        data: &mut [T],
        comm: &C,
        f: impl FnOnce(&Window<T>) -> R,
    ) -> R {
        fatal(Self::try_create(data, comm, f))
    }

    /// [`Window::create`], returning errors (of the creation or of the free).
    pub fn try_create<C: Communicator + ?Sized, R>(
        data: &mut [T],
        comm: &C,
        f: impl FnOnce(&Window<T>) -> R,
    ) -> Result<R> {
        let window = Self::build(comm, WindowMemory::borrowed(data), false)?;
        let r = f(&window);
        window.try_free()?;
        Ok(r)
    }

    /// A window with no memory yet (`MPI_Win_create_dynamic`): each rank attaches regions
    /// to it ([`Window::attach`]) and detaches them ([`Window::detach`]) when it likes, with
    /// no collective call. A displacement in it is an address in the target's memory
    /// ([`Attachment::disp`] on the target); [`Window::disp_unit`] is 1. Collective over
    /// `comm`. Panics on error.
    pub fn create_dynamic<C: Communicator + ?Sized>(comm: &C) -> Window<T> {
        fatal(Self::try_create_dynamic(comm))
    }

    /// [`Window::create_dynamic`], returning errors.
    pub fn try_create_dynamic<C: Communicator + ?Sized>(comm: &C) -> Result<Window<T>> {
        Self::build(comm, WindowMemory::new(Vec::new()), true)
    }

    /// The window over `memory` (none, for a dynamic one) on every rank of `comm`.
    fn build<C: Communicator + ?Sized>(
        comm: &C,
        memory: WindowMemory<T>,
        dynamic: bool,
    ) -> Result<Window<T>> {
        let (bytes, map) = ElementBytes::<T>::check()?;
        let comm = comm.try_duplicate()?;
        let part_bytes = (memory.len() * std::mem::size_of::<T>()) as u64;
        let world = comm.as_simple().backend().world_ranks()?;
        let rank = comm.rank() as usize;
        #[cfg(feature = "mpi")]
        if let Some(host) = comm.as_simple().backend().host_mpi() {
            if dynamic {
                return Err(Error::InvalidArgument(
                    "dynamic windows run on pagewire's own transport; under \
                     PAGEWIRE_TRANSPORT=mpi the host MPI's MPI_Win_create_dynamic is not wired \
                     up yet"
                        .into(),
                ));
            }
            // The window's memory stays where `memory` keeps it until the free.
            let window = host.create_window(memory.addr() as *mut u8, part_bytes as usize)?;
            let mut sizes = vec![0u64; world.len()];
            comm.try_all_gather_into(&[part_bytes][..], &mut sizes[..])?;
            let parts = sizes
                .iter()
                .zip(&world)
                .map(|(&bytes, &world)| Part {
                    world,
                    bytes,
                    ..Part::default()
                })
                .collect();
            return Ok(Self::assemble(
                comm,
                memory,
                (bytes, map),
                (rank, parts),
                Carrier::HostMpi(window),
                None,
                WindowCounters::default(),
            ));
        }
        let control_bytes = if dynamic {
            DYNAMIC_CONTROL_BYTES
        } else {
            CONTROL_BYTES
        };
        let control = AnonMapping::new(control_bytes)
            .map_err(|e| Error::os("mmap of a window's control page", e))?;
        let (reg_addr, reg_len) = word_span(memory.addr(), part_bytes);
        let mut counters = WindowCounters::default();
        let (own, ctrl) = with_layer(&comm, |p2p| {
            let on_demand = p2p.exposes_on_demand();
            let pins = |bytes: u64| if on_demand { 0 } else { bytes };
            let own = if dynamic && on_demand {
                counters.registered(0, 0);
                Some(p2p.expose_address_space()?)
            } else if reg_len > 0 {
                counters.registered(reg_len, pins(reg_len));
                Some(p2p.expose(reg_addr, reg_len)?)
            } else {
                None
            };
            let ctrl = match p2p.expose(control.addr(), control_bytes as u64) {
                Ok(c) => c,
                Err(e) => {
                    if let Some(o) = own {
                        let _ = p2p.unexpose(o.lkey);
                    }
                    return Err(e);
                }
            };
            counters.registered(control_bytes as u64, pins(control_bytes as u64));
            Ok((own, ctrl))
        })?;
        let mine = [
            memory.addr(),
            part_bytes,
            reg_addr,
            reg_len,
            own.map_or(0, |o| o.rkey as u64),
            control.addr(),
            ctrl.rkey as u64,
        ];
        let mut all = vec![0u64; mine.len() * world.len()];
        comm.try_all_gather_into(&mine[..], &mut all[..])?;
        let parts = all
            .chunks_exact(mine.len())
            .zip(&world)
            .map(|(w, &world)| Part {
                world,
                base: w[0],
                bytes: w[1],
                memory: RemoteMemory {
                    addr: w[2],
                    len: w[3],
                    rkey: w[4] as u32,
                },
                control: RemoteMemory {
                    addr: w[5],
                    len: control_bytes as u64,
                    rkey: w[6] as u32,
                },
            })
            .collect::<Vec<_>>();
        let dynamic = dynamic.then(|| DynamicState {
            space: own.map(|o| (o.lkey, o.rkey)),
            attached: RefCell::new(Vec::new()),
            views: RefCell::new(vec![None; parts.len()]),
            seen_detaches: RefCell::new(vec![0; parts.len()]),
            next_id: Cell::new(0),
        });
        let carrier = Carrier::Nic {
            own_key: own.map(|o| o.lkey),
            control,
            control_key: ctrl.lkey,
        };
        Ok(Self::assemble(
            comm,
            memory,
            (bytes, map),
            (rank, parts),
            carrier,
            dynamic,
            counters,
        ))
    }

    fn assemble(
        comm: SimpleCommunicator,
        memory: WindowMemory<T>,
        (bytes, map): (ElementBytes<T>, TypeMap),
        (rank, parts): (usize, Vec<Part>),
        carrier: Carrier,
        dynamic: Option<DynamicState<T>>,
        counters: WindowCounters,
    ) -> Window<T> {
        Window {
            held: RefCell::new(vec![Held::None; parts.len()]),
            comm,
            memory,
            bytes,
            map,
            rank,
            parts,
            carrier,
            local_open: Cell::new(false),
            exposure: RefCell::new(None),
            access: RefCell::new(None),
            dynamic,
            counters: Cell::new(counters),
            freed: false,
        }
    }

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

    /// Attaches `data` to this rank's part of a dynamic window (`MPI_Win_attach`), which
    /// keeps it until [`Window::detach`] gives it back (or the window is freed). Local: peers
    /// may access it once they know its address ([`Attachment::disp`]). In `copy` and
    /// `pindown` the region is registered and pinned now; in `odp` it is covered by the
    /// window's on-demand registration of the whole address space, and its pages are
    /// prefetched for the NIC. Panics on error.
    pub fn attach(&self, data: Vec<T>) -> Attachment {
        fatal(self.try_attach(data))
    }

    /// [`Window::attach`], returning errors: not a dynamic window, an empty region, the
    /// window's table full (2,729 regions per rank), or the registration refused (the
    /// locked-memory limit); `data` is dropped then.
    pub fn try_attach(&self, data: Vec<T>) -> Result<Attachment> {
        let (dynamic, control) = self.dynamic_parts("attach")?;
        if self.local_open.get() {
            return Err(Error::WindowSync(
                "attach inside a local access to the window".into(),
            ));
        }
        if data.is_empty() {
            return Err(Error::InvalidArgument(
                "attach of an empty region: a dynamic window holds regions of one element or \
                 more"
                    .into(),
            ));
        }
        let mut attached = dynamic.attached.borrow_mut();
        if attached.len() == capacity(control.len()) {
            return Err(Error::InvalidArgument(format!(
                "rank {} has {} regions attached to the window, the most its table holds:                  detach one first",
                self.rank,
                attached.len()
            )));
        }
        let memory = WindowMemory::new(data);
        let len = memory.len();
        let bytes = (len * std::mem::size_of::<T>()) as u64;
        let (lkey, rkey, pinned) = with_layer(&self.comm, |p2p| match dynamic.space {
            Some((lkey, rkey)) => {
                p2p.prefetch_exposed(lkey, memory.addr(), bytes)?;
                Ok((None, rkey, 0))
            }
            None => {
                let (addr, len) = word_span(memory.addr(), bytes);
                let region = p2p.expose(addr, len)?;
                let pinned = if p2p.exposes_on_demand() { 0 } else { len };
                Ok((Some(region.lkey), region.rkey, pinned))
            }
        })?;
        let mut c = self.counters.get();
        if lkey.is_some() {
            c.registered(word_span(memory.addr(), bytes).1, pinned);
        }
        c.attaches += 1;
        self.counters.set(c);
        let id = dynamic.next_id.get();
        dynamic.next_id.set(id + 1);
        let handle = Attachment {
            id,
            address: memory.addr() as usize,
            len,
            element: std::mem::size_of::<T>(),
        };
        attached.push(Attached {
            id,
            region: AttachedRegion {
                addr: memory.addr(),
                len: bytes,
                rkey,
            },
            memory,
            lkey,
            pinned,
        });
        let regions: Vec<AttachedRegion> = attached.iter().map(|a| a.region).collect();
        publish(control, &regions);
        Ok(handle)
    }

    /// Detaches the region `attachment` names (`MPI_Win_detach`) and gives its memory back.
    /// Local; waits while peers hold this rank's lock (every access to a dynamic window
    /// holds its target's lock), so no access is under way when it goes, and peers' later
    /// accesses to it fail at the origin ([`Error::NotAttached`]). Panics on error.
    pub fn detach(&self, attachment: Attachment) -> Vec<T> {
        fatal(self.try_detach(attachment))
    }

    /// [`Window::detach`], returning errors: not a dynamic window, a region of another
    /// window, this rank holding its own lock shared, or inside a local access.
    pub fn try_detach(&self, attachment: Attachment) -> Result<Vec<T>> {
        let (dynamic, control) = self.dynamic_parts("detach")?;
        if self.local_open.get() {
            return Err(Error::WindowSync(
                "detach inside a local access to the window".into(),
            ));
        }
        let Some(i) = dynamic
            .attached
            .borrow()
            .iter()
            .position(|a| a.id == attachment.id && a.region.addr == attachment.address as u64)
        else {
            return Err(Error::InvalidArgument(
                "detach of a region that is not attached to this window".into(),
            ));
        };
        let me = self.rank;
        let take = match self.held.borrow()[me] {
            Held::None => true,
            Held::Exclusive => false,
            Held::Shared | Held::Implicit(_) => {
                return Err(Error::WindowSync(format!(
                    "rank {me} detaches a region while it holds its own lock shared (lock_all \
                     or lock_shared, or for its own request-based operations in flight): \
                     unlock or wait first"
                )))
            }
        };
        if take {
            self.acquire(me, Held::Exclusive)?;
        }
        // No peer accesses this rank's part now: the region leaves the table, the lock word
        // counts the detach (peers' views with it go stale at their next lock), the key goes.
        let gone = {
            let mut attached = dynamic.attached.borrow_mut();
            let gone = attached.remove(i);
            let regions: Vec<AttachedRegion> = attached.iter().map(|a| a.region).collect();
            publish(control, &regions);
            gone
        };
        let word = control
            .atomic_u64(LOCK_WORD as usize)
            .load(std::sync::atomic::Ordering::Acquire);
        let counted = self.control_add(me, LOCK_WORD, detach_increment(word));
        let unexposed = gone
            .lkey
            .map_or(Ok(()), |k| with_layer(&self.comm, |p2p| p2p.unexpose(k)));
        let mut c = self.counters.get();
        c.bytes_pinned -= gone.pinned;
        c.detaches += 1;
        self.counters.set(c);
        let released = if take { self.release(me) } else { Ok(()) };
        counted?;
        unexposed?;
        released?;
        Ok(gone.memory.into_vec())
    }

    /// Runs `f` on the elements of the region `attachment` names, attached here. Holds this
    /// rank's shared lock meanwhile, as [`Window::with_local`] does. Panics on error.
    pub fn with_attached<R>(&self, attachment: &Attachment, f: impl FnOnce(&[T]) -> R) -> R {
        fatal(self.try_with_attached(attachment, f))
    }

    /// [`Window::with_attached`], returning errors.
    pub fn try_with_attached<R>(
        &self,
        attachment: &Attachment,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        self.attached_access(attachment, Held::Shared, |m| m.with_local(f))
    }

    /// Runs `f` on the elements of the region `attachment` names, to change them. Holds
    /// this rank's exclusive lock meanwhile, as [`Window::with_local_mut`] does. Panics on
    /// error.
    pub fn with_attached_mut<R>(
        &self,
        attachment: &Attachment,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> R {
        fatal(self.try_with_attached_mut(attachment, f))
    }

    /// [`Window::with_attached_mut`], returning errors.
    pub fn try_with_attached_mut<R>(
        &self,
        attachment: &Attachment,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        self.attached_access(attachment, Held::Exclusive, |m| m.with_local_mut(f))
    }

    fn attached_access<R>(
        &self,
        attachment: &Attachment,
        lock: Held,
        f: impl FnOnce(&WindowMemory<T>) -> R,
    ) -> Result<R> {
        let (dynamic, _) = self.dynamic_parts("a local access to an attached region")?;
        let attached = dynamic.attached.borrow();
        let a = attached
            .iter()
            .find(|a| a.id == attachment.id && a.region.addr == attachment.address as u64)
            .ok_or_else(|| {
                Error::InvalidArgument(
                    "local access to a region that is not attached to this window".into(),
                )
            })?;
        self.local_access(lock, || f(&a.memory))
    }

    /// A dynamic window's state and this rank's control page, or why `what` needs them.
    fn dynamic_parts(&self, what: &str) -> Result<(&DynamicState<T>, &AnonMapping)> {
        match (&self.dynamic, &self.carrier) {
            (Some(d), Carrier::Nic { control, .. }) => Ok((d, control)),
            _ => Err(Error::InvalidArgument(format!(
                "{what} needs a dynamic window (Window::create_dynamic)"
            ))),
        }
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
        if self.local_open.get() {
            return Err(Error::WindowSync(
                "a local access to the window inside another one (with_local/with_local_mut do \
                 not nest)"
                    .into(),
            ));
        }
        let me = self.rank;
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
        self.local_open.set(true);
        let r = f();
        self.local_open.set(false);
        if take {
            self.release(me)?;
        }
        Ok(r)
    }

    /// Writes `data` into rank `target`'s part from element `target_disp` (`MPI_Put`).
    /// Panics on error.
    pub fn put(&self, target: Rank, target_disp: usize, data: &[T]) {
        fatal(self.try_put(target, target_disp, data))
    }

    /// [`Window::put`], returning errors.
    pub fn try_put(&self, target: Rank, target_disp: usize, data: &[T]) -> Result<()> {
        let src = self.bytes.of(data);
        self.access(target, target_disp, data.len(), |s| match &self.carrier {
            Carrier::Nic { .. } => {
                with_layer(&self.comm, |p2p| p2p.put(s.world, s.at, s.rkey, src))
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => w.put(target, s.at - self.parts[s.target].base, src),
        })
    }

    /// Reads `buf.len()` elements of rank `target`'s part from element `target_disp` into
    /// `buf` (`MPI_Get`). Panics on error.
    pub fn get(&self, target: Rank, target_disp: usize, buf: &mut [T]) {
        fatal(self.try_get(target, target_disp, buf))
    }

    /// [`Window::get`], returning errors.
    pub fn try_get(&self, target: Rank, target_disp: usize, buf: &mut [T]) -> Result<()> {
        let count = buf.len();
        let dst = self.bytes.of_mut(buf);
        self.access(target, target_disp, count, |s| match &self.carrier {
            Carrier::Nic { .. } => {
                with_layer(&self.comm, |p2p| p2p.get(s.world, s.at, s.rkey, dst))
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => w.get(target, s.at - self.parts[s.target].base, dst),
        })
    }

    /// Combines `data` into rank `target`'s part from element `target_disp` with `op`,
    /// element by element, each element atomically (`MPI_Accumulate`). Panics on error.
    pub fn accumulate(&self, target: Rank, target_disp: usize, data: &[T], op: SystemOperation) {
        fatal(self.try_accumulate(target, target_disp, data, op))
    }

    /// [`Window::accumulate`], returning errors.
    pub fn try_accumulate(
        &self,
        target: Rank,
        target_disp: usize,
        data: &[T],
        op: SystemOperation,
    ) -> Result<()> {
        self.update(target, target_disp, op.op(), self.bytes.of(data), None)
    }

    /// [`Window::accumulate`] that also returns the elements' values before it into
    /// `result` (`MPI_Get_accumulate`; with `SystemOperation::no_op()`, an atomic get).
    /// Panics on error.
    pub fn get_accumulate(
        &self,
        target: Rank,
        target_disp: usize,
        data: &[T],
        result: &mut [T],
        op: SystemOperation,
    ) {
        fatal(self.try_get_accumulate(target, target_disp, data, result, op))
    }

    /// [`Window::get_accumulate`], returning errors.
    pub fn try_get_accumulate(
        &self,
        target: Rank,
        target_disp: usize,
        data: &[T],
        result: &mut [T],
        op: SystemOperation,
    ) -> Result<()> {
        if result.len() != data.len() {
            return Err(Error::InvalidArgument(format!(
                "get_accumulate of {} elements into a result of {}",
                data.len(),
                result.len()
            )));
        }
        let result = self.bytes.of_mut(result);
        self.update(
            target,
            target_disp,
            op.op(),
            self.bytes.of(data),
            Some(result),
        )
    }

    /// Combines `value` into element `target_disp` of rank `target`'s part with `op`,
    /// atomically, and returns the element's value before (`MPI_Fetch_and_op`). Panics on
    /// error.
    pub fn fetch_and_op(
        &self,
        target: Rank,
        target_disp: usize,
        value: &T,
        op: SystemOperation,
    ) -> T
    where
        T: Copy,
    {
        fatal(self.try_fetch_and_op(target, target_disp, value, op))
    }

    /// [`Window::fetch_and_op`], returning errors.
    pub fn try_fetch_and_op(
        &self,
        target: Rank,
        target_disp: usize,
        value: &T,
        op: SystemOperation,
    ) -> Result<T>
    where
        T: Copy,
    {
        let mut out = [*value];
        self.try_get_accumulate(
            target,
            target_disp,
            std::slice::from_ref(value),
            &mut out,
            op,
        )?;
        Ok(out[0])
    }

    /// Writes `swap` into element `target_disp` of rank `target`'s part if it equals
    /// `compare` (bit for bit), atomically, and returns its value before
    /// (`MPI_Compare_and_swap`). Panics on error.
    pub fn compare_and_swap(&self, target: Rank, target_disp: usize, compare: T, swap: T) -> T
    where
        T: Copy,
    {
        fatal(self.try_compare_and_swap(target, target_disp, compare, swap))
    }

    /// [`Window::compare_and_swap`], returning errors.
    pub fn try_compare_and_swap(
        &self,
        target: Rank,
        target_disp: usize,
        compare: T,
        swap: T,
    ) -> Result<T>
    where
        T: Copy,
    {
        let compare = self.bytes.of(std::slice::from_ref(&compare)).to_vec();
        let swap_bytes = self.bytes.of(std::slice::from_ref(&swap)).to_vec();
        let mut out = [swap];
        self.access(target, target_disp, 1, |s| {
            #[cfg(feature = "mpi")]
            if let Carrier::HostMpi(w) = &self.carrier {
                let unit = self.primitive(Op::Replace)?;
                return w.compare_and_swap(
                    target,
                    s.at - self.parts[s.target].base,
                    unit,
                    &compare,
                    &swap_bytes,
                    self.bytes.of_mut(&mut out),
                );
            }
            let old = if compare.len() == 8 && s.at % 8 == 0 {
                // One aligned word: the NIC's compare-and-swap.
                let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
                let op = RemoteAtomic::CmpSwap {
                    compare: word(&compare),
                    swap: word(&swap_bytes),
                };
                let old = self.atomics(s.world, s.rkey, &[(s.at, op)])?[0];
                old.to_ne_bytes().to_vec()
            } else {
                self.update_under_mutex(s, compare.len(), &mut |current| {
                    Ok(if current == compare {
                        swap_bytes.clone()
                    } else {
                        current.to_vec()
                    })
                })?
            };
            self.bytes.of_mut(&mut out).copy_from_slice(&old);
            Ok(())
        })?;
        Ok(out[0])
    }

    /// Ends an epoch and starts the next (`MPI_Win_fence`): every rank's operations of the
    /// epoch are complete at their targets when it returns. Collective. Panics on error.
    pub fn fence(&self) {
        fatal(self.try_fence())
    }

    /// [`Window::fence`], returning errors.
    pub fn try_fence(&self) -> Result<()> {
        // Every other operation completed at its target before it returned: the inline puts
        // in flight, then the barrier, are the whole fence.
        self.flush_puts(None)?;
        self.comm.try_barrier()
    }

    /// Takes rank `target`'s lock exclusively (`MPI_Win_lock(MPI_LOCK_EXCLUSIVE)`): waits
    /// until no other rank holds it. Panics on error.
    pub fn lock(&self, target: Rank) {
        fatal(self.try_lock(target))
    }

    /// [`Window::lock`], returning errors.
    pub fn try_lock(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.acquire(t, Held::Exclusive)
    }

    /// Takes rank `target`'s lock shared (`MPI_Win_lock(MPI_LOCK_SHARED)`): waits while
    /// a rank holds it exclusively. Panics on error.
    pub fn lock_shared(&self, target: Rank) {
        fatal(self.try_lock_shared(target))
    }

    /// [`Window::lock_shared`], returning errors.
    pub fn try_lock_shared(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.acquire(t, Held::Shared)
    }

    /// Gives back rank `target`'s lock (`MPI_Win_unlock`); this rank's operations on it are
    /// complete. Panics on error.
    pub fn unlock(&self, target: Rank) {
        fatal(self.try_unlock(target))
    }

    /// [`Window::unlock`], returning errors.
    pub fn try_unlock(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.release(t)
    }

    /// Takes every rank's lock shared (`MPI_Win_lock_all`). Panics on error.
    pub fn lock_all(&self) {
        fatal(self.try_lock_all())
    }

    /// [`Window::lock_all`], returning errors; on an error, the locks taken are given back.
    pub fn try_lock_all(&self) -> Result<()> {
        for t in 0..self.parts.len() {
            if let Err(e) = self.acquire(t, Held::Shared) {
                for u in 0..t {
                    let _ = self.release(u);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Gives back every rank's lock taken by [`Window::lock_all`] (`MPI_Win_unlock_all`).
    /// Panics on error.
    pub fn unlock_all(&self) {
        fatal(self.try_unlock_all())
    }

    /// [`Window::unlock_all`], returning errors (the first; every lock is given back).
    pub fn try_unlock_all(&self) -> Result<()> {
        let mut first = None;
        for t in 0..self.parts.len() {
            if let Err(e) = self.release(t) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Completes this rank's operations on `target` at the target (`MPI_Win_flush`): waits
    /// for its inline puts (every other operation completed when it returned). Panics on
    /// error.
    pub fn flush(&self, target: Rank) {
        fatal(self.try_flush(target))
    }

    /// [`Window::flush`], returning errors (of a put that failed since the last flush).
    pub fn try_flush(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.flush_puts(Some(t))
    }

    /// Completes this rank's operations on `target` locally (`MPI_Win_flush_local`): the
    /// origin buffers are free as soon as each call returns, so this checks the rank only.
    /// Panics on error.
    pub fn flush_local(&self, target: Rank) {
        fatal(self.target(target).map(drop))
    }

    /// Completes this rank's operations on every target (`MPI_Win_flush_all`). Panics on
    /// error.
    pub fn flush_all(&self) {
        fatal(self.flush_puts(None))
    }

    /// Completes this rank's operations locally on every target
    /// (`MPI_Win_flush_local_all`): nothing to wait for (see [`Window::flush_local`]).
    pub fn flush_local_all(&self) {}

    /// Orders this rank's loads and stores of its part with the NIC's accesses
    /// (`MPI_Win_sync`): a full memory fence.
    pub fn sync(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// Opens an exposure epoch to the ranks of `group` (`MPI_Win_post`): they may access
    /// this rank's part once they have called [`Window::start`]. Panics on error.
    pub fn post(&self, group: &dyn Group) {
        fatal(self.try_post(group))
    }

    /// [`Window::post`], returning errors.
    pub fn try_post(&self, group: &dyn Group) -> Result<()> {
        if self.exposure.borrow().is_some() {
            return Err(Error::WindowSync(
                "post while an exposure epoch is open (call wait first)".into(),
            ));
        }
        let origins = self.ranks_of(group)?;
        self.notify(&origins, POST_TAG)?;
        *self.exposure.borrow_mut() = Some(origins);
        Ok(())
    }

    /// Opens an access epoch to the ranks of `group` (`MPI_Win_start`): waits until each
    /// has posted an exposure epoch that includes this rank. Panics on error.
    pub fn start(&self, group: &dyn Group) {
        fatal(self.try_start(group))
    }

    /// [`Window::start`], returning errors.
    pub fn try_start(&self, group: &dyn Group) -> Result<()> {
        if self.access.borrow().is_some() {
            return Err(Error::WindowSync(
                "start while an access epoch is open (call complete first)".into(),
            ));
        }
        let targets = self.ranks_of(group)?;
        self.await_notices(&targets, POST_TAG)?;
        *self.access.borrow_mut() = Some(targets);
        Ok(())
    }

    /// Closes the access epoch (`MPI_Win_complete`): its operations are complete at their
    /// targets, which learn so. Panics on error.
    pub fn complete(&self) {
        fatal(self.try_complete())
    }

    /// [`Window::complete`], returning errors.
    pub fn try_complete(&self) -> Result<()> {
        let Some(targets) = self.access.borrow_mut().take() else {
            return Err(Error::WindowSync("complete without start".into()));
        };
        for &t in &targets {
            self.flush_puts(Some(t))?;
        }
        self.notify(&targets, COMPLETE_TAG)?;
        Ok(())
    }

    /// Closes the exposure epoch (`MPI_Win_wait`): waits until every origin of the group
    /// has completed its access epoch. Panics on error.
    pub fn wait(&self) {
        fatal(self.try_wait())
    }

    /// [`Window::wait`], returning errors.
    pub fn try_wait(&self) -> Result<()> {
        let Some(origins) = self.exposure.borrow_mut().take() else {
            return Err(Error::WindowSync("wait without post".into()));
        };
        self.await_notices(&origins, COMPLETE_TAG)?;
        Ok(())
    }

    /// Frees the window (`MPI_Win_free`; also what dropping it does): collective; an
    /// error if a lock or an epoch is still open on this rank's part or by this rank.
    pub fn try_free(mut self) -> Result<()> {
        self.free()
    }

    fn free(&mut self) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        self.freed = true;
        let open = self.open_state();
        let flushed = self.flush_puts(None);
        // Every rank reaches the free (or a dead one is reported) before anything goes.
        let barrier = self.comm.try_barrier();
        // No rank accesses the window any more: the lock word is read as it is.
        let keys = self.registrations();
        let (word, unexposed) = match &mut self.carrier {
            Carrier::Nic { control, .. } => {
                let word = control
                    .atomic_u64(LOCK_WORD as usize)
                    .load(std::sync::atomic::Ordering::Acquire)
                    & !DETACH_BITS;
                let unexposed = with_layer(&self.comm, |p2p| {
                    keys.into_iter()
                        .map(|k| p2p.unexpose(k))
                        .fold(Ok(()), Result::and)
                });
                (word, unexposed)
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => (w.own_control(0), w.free()),
        };
        barrier?;
        flushed?;
        if let Some(why) = open {
            return Err(Error::WindowSync(why));
        }
        if word != 0 {
            return Err(Error::WindowSync(format!(
                "the window was freed while rank {}'s part was still locked ({}): every lock \
                 must be unlocked before the free",
                self.rank,
                if word & EXCLUSIVE != 0 {
                    "exclusively".to_string()
                } else {
                    format!("shared by {word}")
                }
            )));
        }
        unexposed
    }

    /// Takes this rank's registrations for the window (its part's or the address space's,
    /// each attached region's, its control page's), to deregister them.
    // Irrefutable without the `mpi` feature's host-MPI carrier.
    #[allow(irrefutable_let_patterns)]
    fn registrations(&mut self) -> Vec<u32> {
        let mut keys = Vec::new();
        if let Carrier::Nic {
            own_key,
            control_key,
            ..
        } = &mut self.carrier
        {
            keys.extend(own_key.take());
            keys.push(*control_key);
        }
        if let Some(d) = &self.dynamic {
            keys.extend(
                d.attached
                    .borrow_mut()
                    .iter_mut()
                    .filter_map(|a| a.lkey.take()),
            );
        }
        keys
    }

    /// What this rank left open, if anything.
    fn open_state(&self) -> Option<String> {
        let held = self.held.borrow();
        if let Some(t) = held.iter().position(|h| *h != Held::None) {
            return Some(format!(
                "the window was freed while rank {} still held its lock on rank {t}",
                self.rank
            ));
        }
        if self.access.borrow().is_some() || self.exposure.borrow().is_some() {
            return Some(format!(
                "the window was freed while rank {} had an epoch open (start without \
                 complete, or post without wait)",
                self.rank
            ));
        }
        None
    }

    // ---- internals ---------------------------------------------------------------------

    /// The rank index of `target`, or an error.
    fn target(&self, target: Rank) -> Result<usize> {
        usize::try_from(target)
            .ok()
            .filter(|&t| t < self.parts.len())
            .ok_or(Error::NoSuchRank {
                rank: target.max(0) as usize,
                size: self.parts.len(),
            })
    }

    /// Runs `f` on where `count` elements from displacement `disp` of `target` lie, once
    /// they are checked to lie in its part (in a region attached there, for a dynamic
    /// window, whose lock is held meanwhile: one taken for this access alone if this rank
    /// holds none on it).
    fn access<R>(
        &self,
        target: Rank,
        disp: usize,
        count: usize,
        f: impl FnOnce(Span) -> Result<R>,
    ) -> Result<R> {
        let span = self.span(target, disp, count)?;
        let r = f(span);
        let released = self.end_access(span);
        let r = r?;
        released?;
        Ok(r)
    }

    /// Where `count` elements from displacement `disp` of `target` lie, checked; for a
    /// dynamic window with the target's lock held, taken for the access if this rank holds
    /// none ([`Held::Implicit`]; [`Window::end_access`] gives it back).
    fn span(&self, target: Rank, disp: usize, count: usize) -> Result<Span> {
        let t = self.target(target)?;
        if t == self.rank && self.local_open.get() {
            return Err(Error::WindowSync(
                "a one-sided operation on this rank's own part inside a local access to it \
                 (with_local/with_local_mut hold references to it)"
                    .into(),
            ));
        }
        let Some(dynamic) = &self.dynamic else {
            return self.static_span(t, disp, count);
        };
        let held = self.held.borrow()[t];
        match held {
            Held::None => {
                self.acquire(t, Held::Shared)?;
                self.held.borrow_mut()[t] = Held::Implicit(1);
            }
            Held::Implicit(n) => self.held.borrow_mut()[t] = Held::Implicit(n + 1),
            Held::Shared | Held::Exclusive => {}
        }
        let span = self.dynamic_span(dynamic, t, disp, count);
        if span.is_err() {
            let _ = self.end_access_to(t);
        }
        span
    }

    /// Ends an access [`Window::span`] began: gives back a lock taken for it alone.
    fn end_access(&self, span: Span) -> Result<()> {
        if self.dynamic.is_some() {
            self.end_access_to(span.target)
        } else {
            Ok(())
        }
    }

    fn end_access_to(&self, t: usize) -> Result<()> {
        let held = self.held.borrow()[t];
        match held {
            Held::Implicit(1) => {
                self.held.borrow_mut()[t] = Held::Shared;
                self.release(t)
            }
            Held::Implicit(n) => {
                self.held.borrow_mut()[t] = Held::Implicit(n - 1);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Where `count` elements from address `disp` of dynamic-window target `t` lie: in a
    /// region of this rank's view of its table (read again once if none holds them).
    fn dynamic_span(
        &self,
        dynamic: &DynamicState<T>,
        t: usize,
        disp: usize,
        count: usize,
    ) -> Result<Span> {
        let world = self.parts[t].world;
        let at = disp as u64;
        let len = (count as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        if len == 0 {
            return Ok(Span {
                target: t,
                world,
                at,
                rkey: 0,
            });
        }
        for read in [false, true] {
            if read {
                self.read_table(dynamic, t)?;
            }
            let found = dynamic.views.borrow()[t]
                .as_ref()
                .and_then(|v| v.find(at, len));
            if let Some(region) = found {
                return Ok(Span {
                    target: t,
                    world,
                    at,
                    rkey: region.rkey,
                });
            }
        }
        Err(Error::NotAttached {
            target: t,
            addr: at,
            end: at.saturating_add(len),
        })
    }

    /// Reads target `t`'s table of attached regions into this rank's view of it (this rank
    /// holds `t`'s lock, so no region is detached meanwhile; one attached meanwhile makes
    /// the copy retry).
    fn read_table(&self, dynamic: &DynamicState<T>, t: usize) -> Result<()> {
        let part = self.parts[t];
        let table = part.control.addr + TABLE_AT as u64;
        let most = capacity(part.control.len as usize);
        let read = |copy: &mut [u8]| {
            with_layer(&self.comm, |p2p| {
                p2p.get(part.world, table, part.control.rkey, copy)
            })
        };
        loop {
            let mut copy = vec![0u8; table_bytes(FIRST_READ_ENTRIES)];
            read(&mut copy)?;
            let Some((generation, count)) = header(&copy) else {
                std::thread::yield_now();
                continue;
            };
            let count = count.min(most);
            if count > FIRST_READ_ENTRIES {
                copy.resize(table_bytes(count), 0);
                read(&mut copy)?;
                if header(&copy) != Some((generation, count)) {
                    continue;
                }
            }
            if self.control_add(t, TABLE_AT as u64, 0)? != generation {
                continue;
            }
            dynamic.views.borrow_mut()[t] = Some(RegionView {
                regions: entries(&copy, count),
            });
            return Ok(());
        }
    }

    /// Notes the lock word of target `t` read while taking its lock: a dynamic window's
    /// view of `t`'s table goes if `t` has detached a region since it was read.
    fn saw_lock_word(&self, t: usize, word: u64) {
        if let Some(dynamic) = &self.dynamic {
            let now = detaches(word);
            let mut seen = dynamic.seen_detaches.borrow_mut();
            if seen[t] != now {
                seen[t] = now;
                dynamic.views.borrow_mut()[t] = None;
            }
        }
    }

    /// Where `count` elements from element `disp` of target `t`'s part lie, once checked to
    /// lie in the part.
    fn static_span(&self, t: usize, disp: usize, count: usize) -> Result<Span> {
        let part = self.parts[t];
        let unit = std::mem::size_of::<T>() as u64;
        let offset = (disp as u64).saturating_mul(unit);
        let end = offset.saturating_add((count as u64).saturating_mul(unit));
        if end > part.bytes || (count > 0 && offset >= part.bytes) {
            return Err(Error::OutOfWindow {
                target: t,
                offset,
                end,
                window_bytes: part.bytes,
            });
        }
        Ok(Span {
            target: t,
            world: part.world,
            at: part.base + offset,
            rkey: part.memory.rkey,
        })
    }

    /// Sends a zero-byte notice with `tag` to each of `ranks` (post/start/complete/wait).
    fn notify(&self, ranks: &[usize], tag: i32) -> Result<()> {
        for &r in ranks {
            self.comm
                .process_at_rank(r as Rank)
                .try_send_with_tag(&0u8, tag)?;
        }
        Ok(())
    }

    /// Waits for a zero-byte notice with `tag` from each of `ranks`.
    fn await_notices(&self, ranks: &[usize], tag: i32) -> Result<()> {
        for &r in ranks {
            let mut notice = 0u8;
            self.comm
                .process_at_rank(r as Rank)
                .try_receive_into_with_tag(&mut notice, Some(tag))?;
        }
        Ok(())
    }

    /// The window ranks of `group`'s members.
    fn ranks_of(&self, group: &dyn Group) -> Result<Vec<usize>> {
        group
            .world_ranks()
            .iter()
            .map(|w| {
                self.parts
                    .iter()
                    .position(|p| p.world == *w)
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "world rank {w} of the group is not in the window"
                        ))
                    })
            })
            .collect()
    }

    /// Waits for this rank's inline puts to `target` (all: `None`) to complete.
    fn flush_puts(&self, target: Option<usize>) -> Result<()> {
        match &self.carrier {
            Carrier::Nic { .. } => {
                let world = target.map(|t| self.parts[t].world);
                with_layer(&self.comm, |p2p| p2p.rma_flush(world))
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => match target {
                Some(t) => w.flush(t as Rank),
                None => w.flush_all(),
            },
        }
    }

    /// Compare-and-swap of `target`'s control word at byte `word`: its old value.
    fn control_cas(&self, target: usize, word: u64, compare: u64, swap: u64) -> Result<u64> {
        match &self.carrier {
            Carrier::Nic { .. } => {
                let part = self.parts[target];
                let op = RemoteAtomic::CmpSwap { compare, swap };
                let at = part.control.addr + word;
                Ok(self.atomics(part.world, part.control.rkey, &[(at, op)])?[0])
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => w.control_cas(target as Rank, word / 8, compare, swap),
        }
    }

    /// Fetch-and-add of `target`'s control word at byte `word`: its old value.
    fn control_add(&self, target: usize, word: u64, add: u64) -> Result<u64> {
        match &self.carrier {
            Carrier::Nic { .. } => {
                let part = self.parts[target];
                let op = RemoteAtomic::FetchAdd { add };
                let at = part.control.addr + word;
                Ok(self.atomics(part.world, part.control.rkey, &[(at, op)])?[0])
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => w.control_add(target as Rank, word / 8, add),
        }
    }

    /// Runs atomics on the words of world rank `world` under `rkey`.
    fn atomics(&self, world: usize, rkey: u32, ops: &[(u64, RemoteAtomic)]) -> Result<Vec<u64>> {
        with_layer(&self.comm, |p2p| p2p.rma_atomics(world, rkey, ops))
    }

    /// Takes `target`'s lock as `how`.
    fn acquire(&self, target: usize, how: Held) -> Result<()> {
        match self.held.borrow()[target] {
            Held::None => {}
            Held::Implicit(_) => {
                return Err(Error::WindowSync(format!(
                    "rank {} locks rank {target} while its request-based operations on it are \
                     in flight (wait for them first)",
                    self.rank
                )))
            }
            _ => {
                return Err(Error::WindowSync(format!(
                    "rank {} locks rank {target} a second time (unlock first)",
                    self.rank
                )))
            }
        }
        // The lock word's middle bits count a dynamic window's detaches; free is every other
        // bit clear. An exclusive taker guesses the count (the last it saw) and learns it
        // from a failed compare-and-swap.
        let mut free = self
            .dynamic
            .as_ref()
            .map_or(0, |d| d.seen_detaches.borrow()[target] << 32);
        let mut spins = 0u32;
        loop {
            let got = match how {
                Held::Exclusive => {
                    let old = self.control_cas(target, LOCK_WORD, free, free | EXCLUSIVE)?;
                    if old != free && old & !DETACH_BITS == 0 {
                        free = old; // free, at another count of detaches: again at once
                        continue;
                    }
                    (old == free).then_some(old)
                }
                _ => {
                    let old = self.control_add(target, LOCK_WORD, 1)?;
                    if old & EXCLUSIVE != 0 {
                        self.control_add(target, LOCK_WORD, u64::MAX)?;
                        None
                    } else {
                        Some(old)
                    }
                }
            };
            if let Some(word) = got {
                self.held.borrow_mut()[target] = how;
                self.saw_lock_word(target, word);
                return Ok(());
            }
            spins += 1;
            if spins > 16 {
                std::thread::yield_now();
            }
        }
    }

    /// Gives back the lock this rank holds on `target`.
    fn release(&self, target: usize) -> Result<()> {
        let how = self.held.borrow()[target];
        let add = match how {
            Held::None | Held::Implicit(_) => {
                return Err(Error::WindowSync(format!(
                    "rank {} unlocks rank {target}, which it has not locked",
                    self.rank
                )))
            }
            Held::Shared => u64::MAX, // minus one
            Held::Exclusive => EXCLUSIVE.wrapping_neg(),
        };
        // The epoch's puts are complete at the target before the lock goes.
        self.flush_puts(Some(target))?;
        self.control_add(target, LOCK_WORD, add)?;
        self.held.borrow_mut()[target] = Held::None;
        Ok(())
    }

    /// Combines `origin` (the bytes of `count` elements) into `target`'s part from
    /// element `disp` with `op`; the elements' bytes before.
    fn update(
        &self,
        target: Rank,
        disp: usize,
        op: Op,
        origin: &[u8],
        result: Option<&mut [u8]>,
    ) -> Result<()> {
        let count = origin.len() / std::mem::size_of::<T>().max(1);
        let unit = self.primitive(op)?;
        if !op.is_one_sided_only() {
            // An operation not defined for the type (bitwise on floats) is refused before
            // anything moves, on either carrier.
            combine_bytes(&self.map, Reduction::System(op), &[])?;
        }
        self.access(target, disp, count, |s| {
            #[cfg(feature = "mpi")]
            if let Carrier::HostMpi(w) = &self.carrier {
                let unit_bytes = unit_size(unit);
                return w.accumulate(
                    (target, s.at - self.parts[s.target].base),
                    (unit, unit_bytes),
                    op,
                    origin,
                    result,
                );
            }
            let old = self.update_nic(s, unit, op, origin)?;
            if let Some(result) = result {
                result.copy_from_slice(&old);
            }
            Ok(())
        })
    }

    /// The one primitive the elements are made of, for `op`.
    fn primitive(&self, op: Op) -> Result<Primitive> {
        self.map.primitive().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{} needs a datatype made of one primitive type (a number or bool)",
                op.mpi_name()
            ))
        })
    }

    /// [`Window::update`] on the NIC: the elements' bytes before.
    fn update_nic(&self, s: Span, unit: Primitive, op: Op, origin: &[u8]) -> Result<Vec<u8>> {
        let at = s.at;
        // Sums and reads of 64-bit integers are the NIC's fetch-and-add, word by word.
        if matches!(unit, Primitive::I64 | Primitive::U64)
            && matches!(op, Op::Sum | Op::NoOp)
            && at % 8 == 0
        {
            let ops: Vec<(u64, RemoteAtomic)> = origin
                .chunks_exact(8)
                .enumerate()
                .map(|(i, v)| {
                    let add = match op {
                        Op::Sum => u64::from_ne_bytes(v.try_into().expect("8 bytes")),
                        _ => 0,
                    };
                    (at + 8 * i as u64, RemoteAtomic::FetchAdd { add })
                })
                .collect();
            let old = self.atomics(s.world, s.rkey, &ops)?;
            return Ok(old.iter().flat_map(|w| w.to_ne_bytes()).collect());
        }
        let map = &self.map;
        let mut combine = |current: &[u8]| -> Result<Vec<u8>> {
            match op {
                Op::Replace => Ok(origin.to_vec()),
                Op::NoOp => Ok(current.to_vec()),
                _ => combine_bytes(map, Reduction::System(op), &[origin, current]),
            }
        };
        self.update_under_mutex(s, origin.len(), &mut combine)
    }

    /// Updates `len` bytes where `s` lies to `combine(current)` under the target's update
    /// mutex (a word of its control page taken with `CMP_SWAP`): a get, the combination
    /// here, a put, the mutex given back; the bytes before.
    fn update_under_mutex(
        &self,
        s: Span,
        len: usize,
        combine: &mut dyn FnMut(&[u8]) -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        while self.control_cas(s.target, UPDATE_MUTEX, 0, 1)? != 0 {
            std::thread::yield_now();
        }
        let result = (|| {
            let mut current = vec![0u8; len];
            with_layer(&self.comm, |p2p| {
                p2p.get(s.world, s.at, s.rkey, &mut current)
            })?;
            let new = combine(&current)?;
            with_layer(&self.comm, |p2p| p2p.put(s.world, s.at, s.rkey, &new))?;
            Ok(current)
        })();
        self.control_add(s.target, UPDATE_MUTEX, u64::MAX)?;
        result
    }
}

impl<T: Equivalence + Send + Sync> Drop for Window<T> {
    fn drop(&mut self) {
        if self.freed {
            return;
        }
        if std::thread::panicking() {
            // The other ranks may never reach the free: give back the registrations only.
            self.freed = true;
            let keys = self.registrations();
            match &mut self.carrier {
                Carrier::Nic { .. } => {
                    let _ = with_layer(&self.comm, |p2p| {
                        keys.into_iter().try_for_each(|k| p2p.unexpose(k))
                    });
                }
                // Freeing an MPI window is collective: it is left to MPI_Finalize.
                #[cfg(feature = "mpi")]
                Carrier::HostMpi(w) => w.leave_to_finalize(),
            }
            return;
        }
        if let Err(e) = self.free() {
            eprintln!("pagewire: rank {}: {e}", self.rank);
        }
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
    f: impl FnOnce(&mut PointToPoint) -> Result<R>,
) -> Result<R> {
    comm.as_simple()
        .backend()
        .with_message_layer(f)
        .map_err(|e| match e {
            Error::InvalidArgument(why) if why.starts_with("PAGEWIRE_TRANSPORT=mpi") => {
                Error::InvalidArgument(
                    "windows run on pagewire's own transport; under PAGEWIRE_TRANSPORT=mpi the \
                     host MPI's windows are not wired up yet"
                        .into(),
                )
            }
            e => e,
        })?
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
fn unit_size(unit: Primitive) -> usize {
    use Primitive::*;
    match unit {
        Bool | I8 | U8 => 1,
        I16 | U16 => 2,
        I32 | U32 | F32 => 4,
        I64 | U64 | F64 | Complex32 => 8,
        Complex64 => 16,
    }
}
