//! The universe and communicators (rsmpi's `environment` and `topology`).
//!
//! **Communicators.** [`Universe::world`] is `MPI_COMM_WORLD`; [`Communicator::duplicate`]
//! (`MPI_Comm_dup`) and [`Communicator::split_by_color_with_key`] (`MPI_Comm_split`) make new
//! ones. Each has its own group (its ranks `0..size`, each naming a world rank; a split
//! orders them by key, then by rank in the parent) and its own context, so its messages
//! never match another communicator's, and every point-to-point call and collective on it
//! takes and reports ranks of its own group.
//!
//! **Backends.** A universe runs on pagewire's own message layer (a NIC provider in a buffer
//! mode), or, with `PAGEWIRE_TRANSPORT=mpi` (feature `mpi`, under `mpirun`), on the host MPI
//! library. The choice is made once, when the universe starts; every communicator made from
//! its world is on the same backend, and the calls of the facade go to it without asking
//! which one it is. On pagewire's, context ids are agreed collectively, as MPICH does: a
//! process's contexts only grow, ids are not reused after a communicator is dropped, and a
//! job can create 2^30 − 1 communicators (bit 31 marks the collective context, bit 30 the nonblocking one, see
//! [`crate::collective`]). On the host MPI library, each communicator is an MPI
//! communicator of its own (`MPI_Comm_dup`/`MPI_Comm_split` of its parent's).
//!
//! Files: `universe.rs` holds [`Universe`], `communicator.rs` [`Communicator`],
//! [`SimpleCommunicator`], attributes and the processes in them, `group.rs` groups; the
//! configuration is the crate's `config.rs`.

mod cartesian;
pub(crate) mod communicator;
mod group;
mod intercommunicator;
mod universe;

pub use crate::config::{ModeKind, TransportKind, UniverseConfig};
pub use cartesian::{CartesianCommunicator, CartesianLayout};
pub use communicator::{
    AnyCommunicator, AnyProcess, Attributes, Color, CommAttribute, Communicator,
    CommunicatorRelation, Key, Process, Rank, SimpleCommunicator, Tag,
};
pub use group::{Group, GroupRelation, SystemGroup, UserGroup};
pub use intercommunicator::{InterCommunicator, MergeOrder};
pub use universe::Universe;
