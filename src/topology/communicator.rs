//! Communicators ([`Communicator`], [`SimpleCommunicator`]), the processes in them
//! ([`Process`], [`AnyProcess`]: rsmpi keeps them in `topology` too) and the colors and keys
//! of a split.

use crate::backend::{CommBackend, CommunicatorBackend};
use crate::error::{fatal, Result};

/// A rank, as rsmpi types it.
pub type Rank = i32;
/// A message tag, as rsmpi types it.
pub type Tag = i32;
/// The key that orders the ranks of a split (`MPI_Comm_split`'s `key`), as rsmpi types it.
pub type Key = i32;

/// Which new communicator a rank joins in [`Communicator::split_by_color`] (rsmpi's
/// `Color`): ranks that pass the same color join the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Color(i32);

impl Color {
    /// The value standing for `MPI_UNDEFINED` (MPICH's).
    const UNDEFINED: i32 = -32766;

    /// `MPI_UNDEFINED`: the rank takes part in the split but joins no communicator, and
    /// gets `None`.
    pub fn undefined() -> Color {
        Color(Self::UNDEFINED)
    }

    /// A color; panics if `value` is negative (MPI requires colors to be non-negative;
    /// rsmpi panics the same way).
    pub fn with_value(value: i32) -> Color {
        assert!(value >= 0, "Value of color must be non-negative.");
        Color(value)
    }

    /// Whether this is [`Color::undefined`].
    pub fn is_undefined(&self) -> bool {
        self.0 < 0
    }
}

/// What every communicator offers (rsmpi's `Communicator`).
pub trait Communicator {
    /// This process's rank in the communicator.
    fn rank(&self) -> Rank;
    /// Number of ranks.
    fn size(&self) -> Rank;
    /// The process at `rank`, to send to or receive from.
    fn process_at_rank(&self, rank: Rank) -> Process<'_>;
    /// Any process, to receive from (`MPI_ANY_SOURCE`).
    fn any_process(&self) -> AnyProcess<'_>;

    /// A new communicator with the same ranks and a context of its own (`MPI_Comm_dup`):
    /// its messages never match this one's. Collective: every rank calls it. Panics on
    /// error.
    fn duplicate(&self) -> SimpleCommunicator {
        fatal(self.try_duplicate())
    }
    /// [`Communicator::split_by_color_with_key`] with key 0: the ranks keep their order.
    fn split_by_color(&self, color: Color) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_color_with_key(color, 0))
    }
    /// Splits the communicator (`MPI_Comm_split`): the ranks that pass the same `color`
    /// form a new communicator, ranked by `key`, then by their rank here. Collective:
    /// every rank calls it; a rank passing [`Color::undefined`] joins none and gets
    /// `None`. Panics on error.
    fn split_by_color_with_key(&self, color: Color, key: Key) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_color_with_key(color, key))
    }

    /// [`Communicator::duplicate`], returning errors.
    fn try_duplicate(&self) -> Result<SimpleCommunicator>;
    /// [`Communicator::split_by_color_with_key`], returning errors.
    fn try_split_by_color_with_key(
        &self,
        color: Color,
        key: Key,
    ) -> Result<Option<SimpleCommunicator>>;
}

/// A communicator (`MPI_Comm`): ranks and a context that separates its traffic.
pub struct SimpleCommunicator {
    backend: CommBackend,
}

impl std::fmt::Debug for SimpleCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleCommunicator")
            .field("rank", &self.backend.rank())
            .field("size", &self.backend.size())
            .field("backend", &self.backend)
            .finish()
    }
}

impl SimpleCommunicator {
    /// The communicator on `backend`.
    pub(crate) fn new(backend: CommBackend) -> SimpleCommunicator {
        SimpleCommunicator { backend }
    }

    /// What carries this communicator's calls.
    pub(crate) fn backend(&self) -> &CommBackend {
        &self.backend
    }

    /// Makes progress on every outstanding operation (for polling loops). On the mpi
    /// transport, MPI progresses inside its own calls, and this does nothing.
    pub fn progress(&self) -> Result<()> {
        self.backend.progress()
    }
}

impl Communicator for SimpleCommunicator {
    fn rank(&self) -> Rank {
        self.backend.rank() as Rank
    }

    fn size(&self) -> Rank {
        self.backend.size() as Rank
    }

    fn process_at_rank(&self, rank: Rank) -> Process<'_> {
        Process { comm: self, rank }
    }

    fn any_process(&self) -> AnyProcess<'_> {
        AnyProcess { comm: self }
    }

    fn try_duplicate(&self) -> Result<SimpleCommunicator> {
        self.backend.duplicate().map(SimpleCommunicator::new)
    }

    fn try_split_by_color_with_key(
        &self,
        color: Color,
        key: Key,
    ) -> Result<Option<SimpleCommunicator>> {
        let color = (!color.is_undefined()).then_some(color.0);
        let sub = self.backend.split(color, key)?;
        Ok(sub.map(SimpleCommunicator::new))
    }
}

/// A process of a communicator, to send to or receive from.
#[derive(Clone, Copy)]
pub struct Process<'c> {
    pub(crate) comm: &'c SimpleCommunicator,
    pub(crate) rank: Rank,
}

/// Any process of a communicator, to receive from.
#[derive(Clone, Copy)]
pub struct AnyProcess<'c> {
    pub(crate) comm: &'c SimpleCommunicator,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colors() {
        assert!(Color::undefined().is_undefined());
        assert!(!Color::with_value(0).is_undefined());
        assert!(std::panic::catch_unwind(|| Color::with_value(-1)).is_err());
    }
}
