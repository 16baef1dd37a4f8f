//! Collective communication (rsmpi's `collective` module): [`CommunicatorCollectives`] on
//! communicators, [`Root`] on the process that roots a rooted collective, and the
//! reduction operations [`SystemOperation`] and [`UserOperation`].
//!
//! ```no_run
//! use pagewire::traits::*;
//! use pagewire::SystemOperation;
//!
//! let universe = pagewire::initialize().unwrap();
//! let world = universe.world();
//! let mut sum = 0i64;
//! world.all_reduce_into(&(world.rank() as i64), &mut sum, SystemOperation::sum());
//! let mut data = [0u8; 4];
//! let root = world.process_at_rank(0);
//! if world.rank() == 0 {
//!     data = [1, 2, 3, 4];
//! }
//! root.broadcast_into(&mut data[..]);
//! ```
//!
//! On pagewire's own transport the algorithms live in the `pagewire-collectives` crate
//! (chosen per call by size and rank count; `PAGEWIRE_ALLREDUCE_ALGO`,
//! `PAGEWIRE_BCAST_ALGO`, `PAGEWIRE_ALLGATHER_ALGO` and `PAGEWIRE_REDUCE_SCATTER_ALGO` force
//! one, see `pagewire_collectives::tuning`; the settings are read once, at the first
//! collective).
//!
//! **Context.** Collective messages use the communicator's context with bit 31 set
//! ([`COLLECTIVE_CONTEXT_BIT`]: `context | 0x8000_0000`; the world communicator's
//! point-to-point context is 0, its collective context `0x8000_0000`), so they never match
//! point-to-point messages of the same communicator, whatever their tags. Point-to-point
//! contexts stay below 2^31.
//!
//! **Errors** are fatal by default (a panic with the message), as everywhere in the facade;
//! each method has a `try_` twin that returns them. Arguments that do not match across
//! ranks (counts, buffer lengths) are reported as [`Error::InvalidArgument`] naming the
//! ranks and counts, by every rank whose result they spoil, instead of hanging or
//! returning wrong data (see the `pagewire_collectives` documentation for the precise
//! guarantee).
//!
//! **The mpi transport** (`PAGEWIRE_TRANSPORT=mpi`): every collective goes to the host MPI
//! library on the communicator's own MPI communicator (`MPI_Allreduce`, `MPI_Bcast`, …). A
//! reduction MPI does not define (a user operation, a logical operation on floats, 128-bit
//! integers) moves the contributions with MPI (allgather, gather or alltoall(v)) and
//! combines them in rank order, so every call the facade offers works on both transports. Arguments are checked on each rank before MPI is called; counts that differ
//! across ranks are not detected there (MPI aborts the job or hangs, as for any MPI
//! program). A non-root that calls a `_root` variant takes part and then gets an error, as
//! on pagewire's transport.
//!
//! **Differences from rsmpi.**
//! - Varcount (v-) collectives take a counts slice (`&[Count]`, one entry per rank, in
//!   elements) next to a plain buffer instead of rsmpi's `Partition`/`PartitionMut`;
//!   blocks are packed in rank order (the displacements are the prefix sums of the
//!   counts): `all_gather_varcount_into(&send, &mut recv, &counts)`.
//! - Reductions are typed: the send and receive buffers hold the same [`Element`] type,
//!   [`UserOperation`] closures take `(&[T], &mut [T])` instead of `DynBuffer`s, and the
//!   bitwise [`SystemOperation`]s do not compile with floats (they have their own type,
//!   `SystemOperation<Bitwise>`):
//!
//!   ```compile_fail,E0277
//!   use pagewire::traits::*;
//!   use pagewire::SystemOperation;
//!   let universe = pagewire::initialize().unwrap();
//!   let (x, mut y) = (1.5f64, 0.0f64);
//!   universe.world().all_reduce_into(&x, &mut y, SystemOperation::bitwise_or());
//!   ```
//!
//!   nor does a reduction of a type that is not a primitive number (`Element`).
//! - `reduce_scatter_varcount_into` (`MPI_Reduce_scatter`) is an addition; in-place
//!   variants, exclusive scan and the nonblocking (`immediate_*`) collectives are not
//!   provided yet.
//!
//! Files: this one holds [`CommunicatorCollectives`], `root.rs` [`Root`], `operation.rs`
//! [`SystemOperation`] and [`UserOperation`]. Each backend's collectives live below the
//! seam (`backend/`).
//!
//! [`Error::InvalidArgument`]: crate::Error::InvalidArgument

mod operation;
mod root;

use crate::backend::CollectiveBackend;
use crate::datatype::{Buffer, BufferMut};
use crate::error::{fatal, Result};
use crate::topology::{Communicator, SimpleCommunicator};

pub use crate::backend::pagewire::COLLECTIVE_CONTEXT_BIT;
pub use crate::datatype::Count;
pub use operation::{Arithmetic, Bitwise, SystemOperation, UserOperation};
pub use pagewire_collectives::{Element, Integer, Operation};
pub use root::Root;

/// Collectives over all ranks of a communicator (rsmpi's `CommunicatorCollectives`).
/// Every rank calls the same collectives in the same order.
pub trait CommunicatorCollectives: Communicator {
    /// Waits until every rank has called it (`MPI_Barrier`); panics on error.
    fn barrier(&self) {
        fatal(self.try_barrier())
    }
    /// Combines `send` of every rank with `op` into `recv` of every rank
    /// (`MPI_Allreduce`); panics on error.
    fn all_reduce_into<S, R, O>(&self, send: &S, recv: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        fatal(self.try_all_reduce_into(send, recv, op))
    }
    /// Every rank's `send` into `recv` (`size` times as long), in rank order
    /// (`MPI_Allgather`); panics on error.
    fn all_gather_into<S, R>(&self, send: &S, recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_all_gather_into(send, recv))
    }
    /// Rank `j`'s `send` (`counts[j]` elements) into `recv`, packed in rank order
    /// (`MPI_Allgatherv`); every rank passes the same `counts`. Panics on error.
    fn all_gather_varcount_into<S, R>(&self, send: &S, recv: &mut R, counts: &[Count])
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_all_gather_varcount_into(send, recv, counts))
    }
    /// Block `j` of `send` to rank `j`; block `j` of `recv` from rank `j` (`MPI_Alltoall`);
    /// panics on error.
    fn all_to_all_into<S, R>(&self, send: &S, recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_all_to_all_into(send, recv))
    }
    /// `send_counts[j]` elements to rank `j`, `recv_counts[j]` from it, packed in rank
    /// order (`MPI_Alltoallv`); panics on error.
    fn all_to_all_varcount_into<S, R>(
        &self,
        send: &S,
        send_counts: &[Count],
        recv: &mut R,
        recv_counts: &[Count],
    ) where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_all_to_all_varcount_into(send, send_counts, recv, recv_counts))
    }
    /// Combines `send` (`size · recv.len()` elements) of every rank and leaves block `j`
    /// in `recv` of rank `j` (`MPI_Reduce_scatter_block`); panics on error.
    fn reduce_scatter_block_into<S, R, O>(&self, send: &S, recv: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        fatal(self.try_reduce_scatter_block_into(send, recv, op))
    }
    /// Combines `send` (`Σ counts` elements) of every rank and leaves block `j`
    /// (`counts[j]` elements, packed in rank order) in `recv` of rank `j`
    /// (`MPI_Reduce_scatter`; not in rsmpi); panics on error.
    fn reduce_scatter_varcount_into<S, R, O>(&self, send: &S, recv: &mut R, counts: &[Count], op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        fatal(self.try_reduce_scatter_varcount_into(send, recv, counts, op))
    }
    /// Inclusive prefix reduction in rank order (`MPI_Scan`); panics on error.
    fn scan_into<S, R, O>(&self, send: &S, recv: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        fatal(self.try_scan_into(send, recv, op))
    }

    /// [`CommunicatorCollectives::barrier`], returning errors.
    fn try_barrier(&self) -> Result<()>;
    /// [`CommunicatorCollectives::all_reduce_into`], returning errors.
    fn try_all_reduce_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>;
    /// [`CommunicatorCollectives::all_gather_into`], returning errors.
    fn try_all_gather_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`CommunicatorCollectives::all_gather_varcount_into`], returning errors.
    fn try_all_gather_varcount_into<S, R>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`CommunicatorCollectives::all_to_all_into`], returning errors.
    fn try_all_to_all_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`CommunicatorCollectives::all_to_all_varcount_into`], returning errors.
    fn try_all_to_all_varcount_into<S, R>(
        &self,
        send: &S,
        send_counts: &[Count],
        recv: &mut R,
        recv_counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`CommunicatorCollectives::reduce_scatter_block_into`], returning errors.
    fn try_reduce_scatter_block_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>;
    /// [`CommunicatorCollectives::reduce_scatter_varcount_into`], returning errors.
    fn try_reduce_scatter_varcount_into<S, R, O>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>;
    /// [`CommunicatorCollectives::scan_into`], returning errors.
    fn try_scan_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>;
}

impl CommunicatorCollectives for SimpleCommunicator {
    fn try_barrier(&self) -> Result<()> {
        self.backend().barrier()
    }

    fn try_all_reduce_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        self.backend()
            .all_reduce(send.as_items(), recv.as_items_mut(), &op)
    }

    fn try_all_gather_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        self.backend()
            .all_gather(send.as_items(), recv.as_items_mut())
    }

    fn try_all_gather_varcount_into<S, R>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        self.backend()
            .all_gather_varcount(send.as_items(), recv.as_items_mut(), counts)
    }

    fn try_all_to_all_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        self.backend()
            .all_to_all(send.as_items(), recv.as_items_mut())
    }

    fn try_all_to_all_varcount_into<S, R>(
        &self,
        send: &S,
        send_counts: &[Count],
        recv: &mut R,
        recv_counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        self.backend().all_to_all_varcount(
            send.as_items(),
            send_counts,
            recv.as_items_mut(),
            recv_counts,
        )
    }

    fn try_reduce_scatter_block_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        self.backend()
            .reduce_scatter_block(send.as_items(), recv.as_items_mut(), &op)
    }

    fn try_reduce_scatter_varcount_into<S, R, O>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        self.backend()
            .reduce_scatter(send.as_items(), recv.as_items_mut(), counts, &op)
    }

    fn try_scan_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        self.backend()
            .scan(send.as_items(), recv.as_items_mut(), &op)
    }
}
