//! The facade's backends: what carries its calls besides pagewire's own message layer.
//! `host_mpi` (feature `mpi`, `PAGEWIRE_TRANSPORT=mpi`) forwards them to the host MPI library
//! through rsmpi.

#[cfg(feature = "mpi")]
pub mod host_mpi;
