//! Making a window: over memory it allocates or takes over, over a slice the caller lends
//! for a scope, or over no memory (a dynamic window); each rank's part and control page
//! registered, and the parts' addresses and keys exchanged.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use pagewire_transport::msg::RemoteMemory;
use pagewire_transport::sys::AnonMapping;

use super::active::{AccumulateMethod, ActiveUpdates};
use super::dynamic::DYNAMIC_CONTROL_BYTES;
use super::memory::{ElementBytes, WindowMemory};
use super::{
    with_layer, word_span, Carrier, DynamicState, Held, Part, Window, WindowCounters, CONTROL_BYTES,
};
use crate::backend::CommunicatorBackend;
use crate::collective::CommunicatorCollectives;
use crate::datatype::{Equivalence, TypeMap};
use crate::error::{fatal, Error, Result};
use crate::topology::{Communicator, SimpleCommunicator};

/// What kind of window [`Window::build`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WindowKind {
    /// Over memory given or allocated at creation (`MPI_Win_create`, `MPI_Win_allocate`).
    Fixed,
    /// Over regions attached later (`MPI_Win_create_dynamic`).
    Dynamic,
    /// Over one shared segment whose parts every rank updates in place with the CPU's
    /// atomics (`MPI_Win_allocate_shared`): no target applies accumulates for the others.
    Shared,
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
    ///
    /// Where every rank of `comm` reaches every other through the local path (ranks of one
    /// host, `PAGEWIRE_LOCAL=shm`), the window is allocated in shared memory, as MPICH's
    /// `MPI_Win_allocate` does on one node ([`Window::allocate_shared`]): its puts and
    /// gets are loads and stores, its atomics the CPU's, not the NIC's. Through the NIC
    /// (another host, or `PAGEWIRE_LOCAL=nic`) it is registered memory as any window's.
    pub fn try_allocate<C: Communicator + ?Sized>(count: usize, comm: &C) -> Result<Window<T>>
    where
        T: Default + Clone,
    {
        if Self::all_on_the_local_path(comm)? {
            return Self::try_allocate_shared(count, comm);
        }
        Self::try_from_vec(vec![T::default(); count], comm)
    }

    /// Whether every rank of `comm` reaches every other through the local path, as all of
    /// them agree (collective); false on the host MPI's transport.
    fn all_on_the_local_path<C: Communicator + ?Sized>(comm: &C) -> Result<bool> {
        let backend = comm.as_simple().backend();
        let world = backend.world_ranks()?;
        let mine = backend
            .with_message_layer(|p2p| {
                let me = world[comm.rank() as usize];
                world.iter().all(|&w| w == me || p2p.is_local(w))
            })
            .unwrap_or(false);
        let mut all = 0u8;
        comm.try_all_reduce_into(
            &u8::from(mine),
            &mut all,
            crate::collective::SystemOperation::min(),
        )?;
        Ok(all == 1)
    }

    /// A window over `data`, which it owns until it is dropped (`MPI_Win_create` over
    /// memory the window keeps). Collective over `comm`. Panics on error.
    pub fn from_vec<C: Communicator + ?Sized>(data: Vec<T>, comm: &C) -> Window<T> {
        fatal(Self::try_from_vec(data, comm))
    }

    /// [`Window::from_vec`], returning errors.
    pub fn try_from_vec<C: Communicator + ?Sized>(data: Vec<T>, comm: &C) -> Result<Window<T>> {
        Self::build(comm, WindowMemory::new(data), WindowKind::Fixed)
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
        let window = Self::build(comm, WindowMemory::borrowed(data), WindowKind::Fixed)?;
        let r = f(&window);
        window.try_free()?;
        Ok(r)
    }

    /// A window with no memory yet (`MPI_Win_create_dynamic`): each rank attaches regions
    /// to it ([`Window::attach`]) and detaches them ([`Window::detach`]) when it likes, with
    /// no collective call. A displacement in it is an address in the target's memory
    /// ([`Attachment::disp`](super::Attachment::disp) on the target); [`Window::disp_unit`] is 1. Collective over
    /// `comm`. Panics on error.
    pub fn create_dynamic<C: Communicator + ?Sized>(comm: &C) -> Window<T> {
        fatal(Self::try_create_dynamic(comm))
    }

    /// [`Window::create_dynamic`], returning errors.
    pub fn try_create_dynamic<C: Communicator + ?Sized>(comm: &C) -> Result<Window<T>> {
        Self::build(comm, WindowMemory::new(Vec::new()), WindowKind::Dynamic)
    }

    /// The window of `kind` over `memory` (none, for a dynamic one) on every rank of
    /// `comm`.
    pub(super) fn build<C: Communicator + ?Sized>(
        comm: &C,
        memory: WindowMemory<T>,
        kind: WindowKind,
    ) -> Result<Window<T>> {
        let dynamic = kind == WindowKind::Dynamic;
        let (bytes, map) = ElementBytes::<T>::check()?;
        let comm = comm.try_duplicate()?;
        let part_bytes = (memory.len() * std::mem::size_of::<T>()) as u64;
        let world = comm.as_simple().backend().world_ranks()?;
        let rank = comm.rank() as usize;
        #[cfg(feature = "mpi")]
        if let Some(host) = comm.as_simple().backend().host_mpi() {
            if dynamic {
                return Err(Error::NotSupported(
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
        let control = Arc::new(control);
        // Targets apply accumulates once every rank hands its handler over, before the
        // allgather that lets any origin start.
        let active = match (kind, AccumulateMethod::from_env()?) {
            (WindowKind::Fixed, AccumulateMethod::ActiveMessage) => Some(ActiveUpdates::start(
                &comm,
                memory.part_writer(),
                map.clone(),
                Arc::clone(&control),
            )?),
            _ => None,
        };
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
        if let Err(e) = comm.try_all_gather_into(&mine[..], &mut all[..]) {
            if let Some(a) = &active {
                a.stop(&comm);
            }
            return Err(e);
        }
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
        let mut window = Self::assemble(
            comm,
            memory,
            (bytes, map),
            (rank, parts),
            carrier,
            dynamic,
            counters,
        );
        window.active = active;
        Ok(window)
    }

    pub(super) fn assemble(
        comm: SimpleCommunicator,
        memory: WindowMemory<T>,
        (bytes, map): (Option<ElementBytes<T>>, TypeMap),
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
            local_open: Cell::new(None),
            exposure: RefCell::new(None),
            access: RefCell::new(None),
            dynamic,
            shared: None,
            active: None,
            counters: Cell::new(counters),
            freed: false,
        }
    }
}
