//! pagewire: MPI-style communication middleware for RDMA networks, with three ways of
//! getting user buffers to the NIC behind one API — copying through pinned bounce buffers,
//! a pin-down registration cache, and on-demand paging (DESIGN.md).
//!
//! This facade will carry the rsmpi-shaped `Universe`/`Communicator` API. What exists today
//! is the layer it stands on, re-exported here:
//!
//! - [`nic`]: the verbs-shaped NIC boundary ([`nic::Nic`]) and its default software
//!   provider ([`nic::soft::SoftNic`]);
//! - [`boot`]: rank discovery, address exchange and the built-in launcher (`pwrun`);
//! - [`sys`]: the small system-call wrappers the soft NIC stands on, including
//!   [`sys::AnonMapping`] for buffers handed to the NIC.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use pagewire_transport::{boot, nic, sys, Error, Result};
