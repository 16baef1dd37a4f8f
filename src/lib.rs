//! pagewire: MPI-style communication middleware for RDMA networks, with three ways of
//! getting user buffers to the NIC behind one API (docs/architecture.md): copying through pinned
//! bounce buffers, a pin-down registration cache, and on-demand paging.
//!
//! The API is shaped like rsmpi's (the `mpi` crate) so that a code moves with
//! `use pagewire as mpi;`:
//!
//! ```no_run
//! use pagewire::traits::*;
//!
//! let universe = pagewire::initialize().unwrap();
//! let world = universe.world();
//! if world.rank() == 0 {
//!     world.process_at_rank(1).send(&[1.0f64, 2.0, 3.0][..]);
//! } else if world.rank() == 1 {
//!     let (data, status) = world.process_at_rank(0).receive_vec::<f64>();
//!     assert_eq!(data, vec![1.0, 2.0, 3.0]);
//!     assert_eq!(status.source_rank(), 0);
//! }
//! ```
//!
//! Errors are fatal by default, as with `MPI_ERRORS_ARE_FATAL`: a failing call panics with
//! a message that says what went wrong. Every call has a `try_` twin that returns the error
//! instead ([`Error`]).
//!
//! Run a program on N ranks with `pwrun -n N ./program` (pagewire's launcher), or under
//! `mpirun` when built with the `mpi` feature; started alone it is one rank.
//!
//! # Where things are
//!
//! - [`initialize`], [`Universe`], [`environment`]: start-up, the world
//!   communicator, threading, the clock.
//! - [`topology`]: communicators, processes, groups, Cartesian topologies.
//! - [`point_to_point`]: sends and receives, probes, `send_receive_into`.
//! - [`request`]: immediate operations' requests, scopes, collections, guards.
//! - [`collective`]: blocking and immediate collectives, reduction operations.
//! - [`datatype`]: `Equivalence`, derived datatypes, views and partitions.
//! - [`window`]: one-sided communication (MPI windows: put, get, accumulate, atomics,
//!   fences, locks, dynamic and shared-memory windows).
//! - [`traits`]: the traits a program imports (`use pagewire::traits::*`).
//! - [`UniverseConfig`]: the settings read from `PAGEWIRE_*` variables (all of them:
//!   `docs/configuration.md`).
//!
//! Lower layers are re-exported: [`nic`] (the NIC boundary and the soft provider; its
//! [`Nic`](nic::Nic) trait is the contract a provider keeps), [`msg`] (the message layer),
//! [`buffer_mode`] (the [`BufferMode`](buffer_mode::BufferMode) trait: how a user buffer
//! reaches the NIC), [`boot`] (bootstrap and the `pwrun` launcher) and [`sys`].
#![deny(missing_docs)]
// `unsafe` only where a buffer is lent to a backend or read through its address:
// `request.rs` (requests, whose scope keeps the buffer borrowed), `datatype/buffer.rs` (the
// buffer traits and packing), pagewire's backend's `blocking.rs`, the host-MPI backend's
// `ffi.rs` (every call into MPI), and one call of a C reduction function
// (`collective/operation.rs`). rsmpi's `unsafe` API (`Equivalence`, `ready_send`,
// `unpack_into`, `UnsafeUserOperation`) is declared `unsafe` item by item.
#![deny(unsafe_code)]
//
// The facade's files depend one way, each on files below it only:
//
//   lib.rs             the crate root: re-exports, `initialize`
//   collective/        CommunicatorCollectives, Root, the reduction operations, the
//                      immediate collectives
//   point_to_point.rs  Destination, Source, Message
//   request.rs         scopes, requests, guards, collections
//   status.rs          Status
//   topology/          Universe, communicators, processes, groups, Cartesian topologies
//   backend/           the seam: pagewire's backend, the host MPI library's (feature `mpi`)
//   datatype/          type maps, datatypes, buffers and packing
//   config.rs, environment.rs (initialisation state, threading, clock), error.rs, ffi.rs

mod backend;
pub mod collective;
mod config;
pub mod datatype;
pub mod environment;
mod error;
pub mod ffi;
pub mod point_to_point;
pub mod request;
mod status;
pub mod topology;
pub mod window;

#[cfg(feature = "mpi")]
pub use backend::host_mpi;
pub use collective::{CommunicatorCollectives, Root, SystemOperation, UserOperation};
pub use datatype::{Address, Buffer, BufferMut, Count, Equivalence};
pub use environment::{threading_support, time, time_resolution, Threading};
/// The one error type of pagewire, under rsmpi's name for it.
pub type MpiError = Error;
pub use error::{Error, ErrorClass, Result};
/// `#[derive(Equivalence)]` (feature `derive`, as rsmpi's): the datatype of a struct from
/// its fields' (see `pagewire-derive`).
#[cfg(feature = "derive")]
pub use pagewire_derive::Equivalence;
pub use pagewire_transport::{boot, buffer_mode, msg, nic, sys};
pub use point_to_point::{
    AnyProcess, Destination, MatchedReceiveVec, Message, Process, Source, Status,
};
pub use topology::{
    Color, Communicator, Key, Rank, SimpleCommunicator, Tag, TransportKind, Universe,
    UniverseConfig,
};

/// The traits a program imports with `use pagewire::traits::*` (as `mpi::traits::*`).
pub mod traits {
    pub use crate::collective::{CommunicatorCollectives, Operation, Root};
    pub use crate::datatype::{
        AsDatatype, Buffer, BufferMut, Collection, Datatype, Equivalence, Partitioned,
        PartitionedBuffer, PartitionedBufferMut, Pointer, PointerMut, UncommittedDatatype,
    };
    pub use crate::point_to_point::{Destination, MatchedReceiveVec, Source};
    pub use crate::topology::{AnyCommunicator, CommAttribute, Communicator, Group};
    #[cfg(feature = "derive")]
    pub use pagewire_derive::Equivalence;
}

/// Starts pagewire with settings from the environment (`PAGEWIRE_*`): the bootstrap
/// (`pwrun`'s, MPI's under `mpirun` with the feature `mpi`, or a single rank without a
/// launcher), the NIC (`PAGEWIRE_TRANSPORT`), the buffer mode (`PAGEWIRE_MODE`) and the
/// message layer. `PAGEWIRE_TRANSPORT=mpi` (feature `mpi`, under `mpirun`) forwards every
/// call to the host MPI library instead. `None` if pagewire is already
/// initialised in this process, as rsmpi's `initialize`.
///
/// Panics with the reason if start-up fails; [`try_initialize`] returns it instead.
pub fn initialize() -> Option<Universe> {
    match try_initialize() {
        Ok(u) => u,
        Err(e) => panic!("pagewire: initialisation failed: {e}"),
    }
}

/// [`initialize`], returning start-up errors.
pub fn try_initialize() -> Result<Option<Universe>> {
    Universe::from_config(UniverseConfig::from_env()?)
}

/// [`initialize`] asking for a threading level; returns the universe and the level
/// provided (at most [`Threading::Funneled`]: see [`environment`]). Panics if start-up
/// fails.
pub fn initialize_with_threading(threading: Threading) -> Option<(Universe, Threading)> {
    let cfg = error::fatal(UniverseConfig::from_env());
    let universe = error::fatal(Universe::with_threading(cfg, threading))?;
    Some((universe, environment::threading_support()))
}
