//! What a completed receive reports ([`Status`], rsmpi's `Status`, `MPI_Status`): returned by
//! point-to-point calls, probes and requests alike.

use pagewire_transport::msg;

use crate::datatype::{Count, Datatype};
use crate::topology::communicator::{Rank, Tag};

/// What a completed receive reports (`MPI_Status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    inner: msg::Status,
    cancelled: bool,
}

impl Status {
    /// The status a backend reported, its source already a rank of the communicator.
    pub(crate) fn new(inner: msg::Status) -> Status {
        Status {
            inner,
            cancelled: false,
        }
    }

    /// The status of a collective operation: no source, no data of its own.
    pub(crate) fn empty() -> Status {
        Status {
            inner: msg::Status {
                source: usize::MAX,
                tag: -1,
                count: 0,
            },
            cancelled: false,
        }
    }

    /// The status of an operation that was cancelled: no source, no data.
    pub(crate) fn cancelled() -> Status {
        Status {
            inner: msg::Status {
                source: usize::MAX,
                tag: -1,
                count: 0,
            },
            cancelled: true,
        }
    }

    /// Whether the operation was cancelled (`MPI_Test_cancelled`).
    pub fn is_cancelled(&self) -> bool {
        self.cancelled
    }

    /// The sender's rank (-1 for a cancelled operation).
    pub fn source_rank(&self) -> Rank {
        if self.cancelled {
            return -1;
        }
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
    /// Elements of `datatype` received (`MPI_Get_count`).
    pub fn count<D: Datatype>(&self, datatype: D) -> Count {
        let size = datatype.type_map().size().max(1);
        Count::try_from(self.inner.count / size).unwrap_or(Count::MAX)
    }
}
