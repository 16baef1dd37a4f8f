//! Intercommunicators (rsmpi's `InterCommunicator`): what `spawn` and `parent` give, a
//! communicator between two groups of processes. Point-to-point calls on it address the
//! other group's ranks; [`InterCommunicator::merge`] makes both groups one communicator.
//!
//! On pagewire's own transport under `pwrun -n`, the launcher starts spawned processes as a
//! job of their own and opens a connection job between them and the spawning group; both
//! sides bring up a second message layer on it, and the intercommunicator is a communicator
//! of that layer (`boot::spawn`). On the host-MPI backend (`PAGEWIRE_TRANSPORT=mpi` under
//! mpirun, feature `mpi`) `MPI_Comm_spawn` starts them. Collectives on an intercommunicator
//! (MPI's intercommunicator collectives) are not supported: they return or panic with an
//! error that says to merge first. The connection's message layer progresses in calls on its
//! communicators (the intercommunicator and what `merge` makes), not in calls on the world.

use crate::backend::{CommBackend, CommunicatorBackend};
use crate::error::fatal;
use crate::topology::communicator::{Attributes, Communicator, SimpleCommunicator};
use crate::topology::Rank;

/// Which group comes first in a merged communicator (rsmpi's `MergeOrder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeOrder {
    /// This side's ranks first.
    Low,
    /// This side's ranks last.
    High,
}

/// A communicator between two groups of processes (rsmpi's `InterCommunicator`): its rank
/// and size are this group's; `process_at_rank` addresses the other group.
#[derive(Debug)]
pub struct InterCommunicator {
    comm: SimpleCommunicator,
}

impl InterCommunicator {
    /// The intercommunicator on `backend`.
    pub(crate) fn new(backend: CommBackend) -> InterCommunicator {
        InterCommunicator {
            comm: SimpleCommunicator::new(backend),
        }
    }

    /// Processes in the other group (`MPI_Comm_remote_size`).
    pub fn remote_size(&self) -> Rank {
        self.comm.backend().target_size() as Rank
    }

    /// Both groups as one communicator (`MPI_Intercomm_merge`; collective over both): one
    /// group passes [`MergeOrder::Low`], the other [`MergeOrder::High`]. Panics on error, as
    /// rsmpi does.
    pub fn merge(&self, order: MergeOrder) -> SimpleCommunicator {
        let merged = fatal(self.comm.backend().merge(order == MergeOrder::High));
        SimpleCommunicator::new(merged)
    }
}

impl Communicator for InterCommunicator {
    fn as_simple(&self) -> &SimpleCommunicator {
        &self.comm
    }
    fn attributes_mut(&mut self) -> &mut Attributes {
        self.comm.attributes_mut()
    }
}
