//! Intercommunicators (rsmpi's `InterCommunicator`): what `spawn` and `parent` give. pagewire
//! starts no process into a running job (neither launcher can), so no intercommunicator
//! ever exists: [`crate::topology::Communicator::parent`] is `None` and `spawn` returns an
//! error that says so. The type keeps rsmpi programs compiling.

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

/// A communicator between two groups of processes (rsmpi's `InterCommunicator`). No value
/// of it can be made in pagewire (see the module documentation).
#[derive(Debug)]
pub struct InterCommunicator {
    never: std::convert::Infallible,
}

impl InterCommunicator {
    /// Processes in the other group.
    pub fn remote_size(&self) -> Rank {
        match self.never {}
    }
    /// Both groups as one communicator (`MPI_Intercomm_merge`).
    pub fn merge(&self, _order: MergeOrder) -> SimpleCommunicator {
        match self.never {}
    }
}

impl Communicator for InterCommunicator {
    fn as_simple(&self) -> &SimpleCommunicator {
        match self.never {}
    }
    fn attributes_mut(&mut self) -> &mut Attributes {
        match self.never {}
    }
}
