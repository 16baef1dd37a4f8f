//! What a completed receive reports ([`Status`], rsmpi's `Status`, `MPI_Status`): returned by
//! point-to-point calls, probes and requests alike.

use pagewire_transport::msg;

use crate::datatype::Equivalence;
use crate::topology::communicator::{Rank, Tag};

/// What a completed receive reports (`MPI_Status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    inner: msg::Status,
}

impl Status {
    /// The status a backend reported, its source already a rank of the communicator.
    pub(crate) fn new(inner: msg::Status) -> Status {
        Status { inner }
    }

    /// The sender's rank.
    pub fn source_rank(&self) -> Rank {
        self.inner.source as Rank
    }
    /// The message's tag.
    pub fn tag(&self) -> Tag {
        self.inner.tag
    }
    /// Bytes received.
    pub fn count_bytes(&self) -> usize {
        self.inner.count
    }
    /// Elements of type `T` received.
    pub fn count<T: Equivalence>(&self) -> usize {
        self.inner.count / std::mem::size_of::<T>().max(1)
    }
}
