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
//! [`Error::InvalidArgument`]: crate::Error::InvalidArgument

use std::marker::PhantomData;

use pagewire_collectives::{self as coll, Op};

use crate::backend::CollectiveBackend;
use crate::datatype::{Buffer, BufferMut};
use crate::error::{fatal, Error, Result};
use crate::topology::communicator::Process;
use crate::topology::{Communicator, Rank, SimpleCommunicator};

pub use crate::backend::pagewire::COLLECTIVE_CONTEXT_BIT;
pub use crate::datatype::Count;
pub use pagewire_collectives::{Element, Integer, Operation};

/// A user-defined reduction (rsmpi's `UserOperation`): `UserOperation::commutative(f)` or
/// `UserOperation::associative(f)` (not commutative: combined in rank order), where
/// `f(invec, inoutvec)` sets `inoutvec[i] = invec[i] ∘ inoutvec[i]`, `invec` holding the
/// lower ranks' contribution (`MPI_User_function`).
pub type UserOperation<'f, T> = coll::UserOp<'f, T>;

/// Marks the arithmetic, comparison and logical [`SystemOperation`]s (any [`Element`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arithmetic {}

/// Marks the bitwise [`SystemOperation`]s (integers only, checked at compile time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bitwise {}

/// A predefined reduction (rsmpi's `SystemOperation`: `MPI_SUM` …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemOperation<K = Arithmetic> {
    op: Op,
    _kind: PhantomData<K>,
}

impl<K> SystemOperation<K> {
    const fn of(op: Op) -> Self {
        SystemOperation {
            op,
            _kind: PhantomData,
        }
    }

    /// The operation as `pagewire_collectives` names it.
    pub fn op(&self) -> Op {
        self.op
    }
}

impl SystemOperation<Arithmetic> {
    /// `MPI_MAX`.
    pub const fn max() -> Self {
        Self::of(Op::Max)
    }
    /// `MPI_MIN`.
    pub const fn min() -> Self {
        Self::of(Op::Min)
    }
    /// `MPI_SUM`.
    pub const fn sum() -> Self {
        Self::of(Op::Sum)
    }
    /// `MPI_PROD`.
    pub const fn product() -> Self {
        Self::of(Op::Product)
    }
    /// `MPI_LAND`.
    pub const fn logical_and() -> Self {
        Self::of(Op::LogicalAnd)
    }
    /// `MPI_LOR`.
    pub const fn logical_or() -> Self {
        Self::of(Op::LogicalOr)
    }
    /// `MPI_LXOR`.
    pub const fn logical_xor() -> Self {
        Self::of(Op::LogicalXor)
    }
}

impl SystemOperation<Bitwise> {
    /// `MPI_BAND`.
    pub const fn bitwise_and() -> Self {
        Self::of(Op::BitAnd)
    }
    /// `MPI_BOR`.
    pub const fn bitwise_or() -> Self {
        Self::of(Op::BitOr)
    }
    /// `MPI_BXOR`.
    pub const fn bitwise_xor() -> Self {
        Self::of(Op::BitXor)
    }
}

impl<T: Element> Operation<T> for SystemOperation<Arithmetic> {
    fn apply(&self, left: &[T], right: &mut [T]) {
        Operation::<T>::apply(&self.op, left, right)
    }
    fn is_commutative(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.op.mpi_name().into()
    }
    fn predefined(&self) -> Option<Op> {
        Some(self.op)
    }
}

impl<T: Integer> Operation<T> for SystemOperation<Bitwise> {
    fn apply(&self, left: &[T], right: &mut [T]) {
        Operation::<T>::apply(&self.op, left, right)
    }
    fn is_commutative(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.op.mpi_name().into()
    }
    fn predefined(&self) -> Option<Op> {
        Some(self.op)
    }
}

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

/// Rooted collectives, called on the root process of the communicator by every rank
/// (rsmpi's `Root`): `world.process_at_rank(root).broadcast_into(&mut buf)`. The root calls
/// the `_root` variants, the others the plain ones; a non-root that calls a `_root`
/// variant takes part normally and then gets an error.
pub trait Root {
    /// The root's rank.
    fn root_rank(&self) -> Rank;

    /// Copies the root's `buf` into every rank's `buf` (`MPI_Bcast`); panics on error.
    fn broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) {
        fatal(self.try_broadcast_into(buf))
    }
    /// Contributes `send` to a reduction at the root (`MPI_Reduce`, non-root side);
    /// panics on error.
    fn reduce_into<S, O>(&self, send: &S, op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        O: Operation<S::Item>,
    {
        fatal(self.try_reduce_into(send, op))
    }
    /// Combines every rank's `send` into `recv` (`MPI_Reduce`, root side); panics on error.
    fn reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        fatal(self.try_reduce_into_root(send, recv, op))
    }
    /// Sends `send` to the root's gather (`MPI_Gather`, non-root side); panics on error.
    fn gather_into<S: Buffer + ?Sized>(&self, send: &S) {
        fatal(self.try_gather_into(send))
    }
    /// Gathers every rank's `send` into `recv` in rank order (`MPI_Gather`, root side);
    /// panics on error.
    fn gather_into_root<S, R>(&self, send: &S, recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_gather_into_root(send, recv))
    }
    /// Sends `send` to the root's gatherv (`MPI_Gatherv`, non-root side); panics on error.
    fn gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) {
        fatal(self.try_gather_varcount_into(send))
    }
    /// Gathers rank `j`'s `counts[j]` elements into `recv`, packed in rank order
    /// (`MPI_Gatherv`, root side); panics on error.
    fn gather_varcount_into_root<S, R>(&self, send: &S, recv: &mut R, counts: &[Count])
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_gather_varcount_into_root(send, recv, counts))
    }
    /// Receives this rank's block of the root's scatter (`MPI_Scatter`, non-root side);
    /// panics on error.
    fn scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) {
        fatal(self.try_scatter_into(recv))
    }
    /// Scatters `send` (`size · recv.len()` elements) in rank order (`MPI_Scatter`, root
    /// side); panics on error.
    fn scatter_into_root<S, R>(&self, send: &S, recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_scatter_into_root(send, recv))
    }
    /// Receives this rank's block of the root's scatterv (`MPI_Scatterv`, non-root side);
    /// panics on error.
    fn scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) {
        fatal(self.try_scatter_varcount_into(recv))
    }
    /// Scatters `counts[j]` elements of `send` (packed in rank order) to rank `j`
    /// (`MPI_Scatterv`, root side); panics on error.
    fn scatter_varcount_into_root<S, R>(&self, send: &S, counts: &[Count], recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_scatter_varcount_into_root(send, counts, recv))
    }

    /// [`Root::broadcast_into`], returning errors.
    fn try_broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()>;
    /// [`Root::reduce_into`], returning errors.
    fn try_reduce_into<S, O>(&self, send: &S, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        O: Operation<S::Item>;
    /// [`Root::reduce_into_root`], returning errors.
    fn try_reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>;
    /// [`Root::gather_into`], returning errors.
    fn try_gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()>;
    /// [`Root::gather_into_root`], returning errors.
    fn try_gather_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`Root::gather_varcount_into`], returning errors.
    fn try_gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()>;
    /// [`Root::gather_varcount_into_root`], returning errors.
    fn try_gather_varcount_into_root<S, R>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`Root::scatter_into`], returning errors.
    fn try_scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()>;
    /// [`Root::scatter_into_root`], returning errors.
    fn try_scatter_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`Root::scatter_varcount_into`], returning errors.
    fn try_scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()>;
    /// [`Root::scatter_varcount_into_root`], returning errors.
    fn try_scatter_varcount_into_root<S, R>(
        &self,
        send: &S,
        counts: &[Count],
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
}

impl Process<'_> {
    /// The root as a group rank, or `NoSuchRank`.
    fn root(&self) -> Result<usize> {
        if self.rank < 0 || self.rank >= self.comm.size() {
            return Err(Error::NoSuchRank {
                rank: self.rank.max(0) as usize,
                size: self.comm.size() as usize,
            });
        }
        Ok(self.rank as usize)
    }

    /// After a `_root` variant on a rank that is not the root: the call took part, but
    /// the caller mixed the variants up.
    fn must_be_root(&self, what: &str) -> Result<()> {
        let me = self.comm.rank();
        if me != self.rank {
            return Err(Error::InvalidArgument(format!(
                "rank {me} called {what} but the root is rank {}; non-roots call the variant \
                 without `_root`",
                self.rank
            )));
        }
        Ok(())
    }
}

impl Root for Process<'_> {
    fn root_rank(&self) -> Rank {
        self.rank
    }

    fn try_broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        let root = self.root()?;
        self.comm.backend().broadcast(root, buf.as_items_mut())
    }

    fn try_reduce_into<S, O>(&self, send: &S, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        O: Operation<S::Item>,
    {
        let root = self.root()?;
        self.comm.backend().reduce(root, send.as_items(), None, &op)
    }

    fn try_reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        let root = self.root()?;
        let recv = Some(recv.as_items_mut());
        self.comm
            .backend()
            .reduce(root, send.as_items(), recv, &op)?;
        self.must_be_root("reduce_into_root")
    }

    fn try_gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        self.comm.backend().gather(root, send.as_items(), None)
    }

    fn try_gather_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let recv = Some(recv.as_items_mut());
        self.comm.backend().gather(root, send.as_items(), recv)?;
        self.must_be_root("gather_into_root")
    }

    fn try_gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        self.comm
            .backend()
            .gather_varcount(root, send.as_items(), None)
    }

    fn try_gather_varcount_into_root<S, R>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let recv = Some((recv.as_items_mut(), counts));
        self.comm
            .backend()
            .gather_varcount(root, send.as_items(), recv)?;
        self.must_be_root("gather_varcount_into_root")
    }

    fn try_scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        self.comm.backend().scatter(root, None, recv.as_items_mut())
    }

    fn try_scatter_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let send = Some(send.as_items());
        self.comm
            .backend()
            .scatter(root, send, recv.as_items_mut())?;
        self.must_be_root("scatter_into_root")
    }

    fn try_scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        self.comm
            .backend()
            .scatter_varcount(root, None, recv.as_items_mut())
    }

    fn try_scatter_varcount_into_root<S, R>(
        &self,
        send: &S,
        counts: &[Count],
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let send = Some((send.as_items(), counts));
        self.comm
            .backend()
            .scatter_varcount(root, send, recv.as_items_mut())?;
        self.must_be_root("scatter_varcount_into_root")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_operations_map_to_the_predefined_ones() {
        assert_eq!(SystemOperation::sum().op(), Op::Sum);
        assert_eq!(SystemOperation::logical_xor().op(), Op::LogicalXor);
        assert_eq!(SystemOperation::bitwise_or().op(), Op::BitOr);
        let mut r = [1.5f64, 2.0];
        Operation::<f64>::apply(&SystemOperation::max(), &[3.0, -1.0], &mut r);
        assert_eq!(r, [3.0, 2.0]);
        let mut r = [0b0110u8];
        Operation::<u8>::apply(&SystemOperation::bitwise_and(), &[0b0011], &mut r);
        assert_eq!(r, [0b0010]);
    }
}
