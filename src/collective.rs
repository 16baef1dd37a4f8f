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
//! The algorithms live in the `pagewire-collectives` crate (chosen per call by size and
//! rank count; `PAGEWIRE_ALLREDUCE_ALGO`, `PAGEWIRE_BCAST_ALGO`, `PAGEWIRE_ALLGATHER_ALGO`
//! and `PAGEWIRE_REDUCE_SCATTER_ALGO` force one, see `pagewire_collectives::tuning`; the
//! settings are read once, at the first collective).
//!
//! **Context.** Collective messages use the communicator's context with bit 31 set
//! (`context | 0x8000_0000`; the world communicator's point-to-point context is 0, its
//! collective context `0x8000_0000`), so they never match point-to-point messages of the
//! same communicator, whatever their tags. Point-to-point contexts stay below 2^31.
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
//! combines them here in rank order, so every call the facade offers works on both
//! transports. Arguments are checked on each rank before MPI is called; counts that differ
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

use std::marker::PhantomData;
use std::sync::OnceLock;

use pagewire_collectives::{self as coll, Group, Op, Tuning};

use crate::datatype::{Buffer, BufferMut};
use crate::error::{fatal, Error, Result};
use crate::point_to_point::Process;
use crate::topology::{Communicator, Rank, SimpleCommunicator};

pub use crate::datatype::Count;
pub use pagewire_collectives::{Element, Integer, Operation};

/// The bit that turns a communicator's context into its collective context.
pub const COLLECTIVE_CONTEXT_BIT: u32 = 0x8000_0000;

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

/// The tuning from the environment, read once per process.
fn tuning() -> Result<Tuning> {
    static TUNING: OnceLock<std::result::Result<Tuning, String>> = OnceLock::new();
    TUNING
        .get_or_init(|| Tuning::from_env().map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::InvalidArgument)
}

/// Runs `f` on the group of `comm`'s ranks (group ranks mapped to world ranks for a
/// sub-communicator), in its collective context.
fn with_group<R>(comm: &SimpleCommunicator, f: impl FnOnce(&mut Group) -> Result<R>) -> Result<R> {
    let tuning = tuning()?;
    let mut p2p = comm.inner.p2p().borrow_mut();
    let mut g = Group {
        p2p: &mut p2p,
        context: comm.context | COLLECTIVE_CONTEXT_BIT,
        rank: comm.rank() as usize,
        size: comm.size() as usize,
        tuning,
        world_ranks: comm.world_ranks(),
    };
    f(&mut g)
}

fn counts(c: &[Count]) -> Result<Vec<usize>> {
    c.iter()
        .map(|&n| {
            usize::try_from(n)
                .map_err(|_| Error::InvalidArgument(format!("negative count {n} in {c:?}")))
        })
        .collect()
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
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return h.barrier();
        }
        with_group(self, |g| g.barrier())
    }

    fn try_all_reduce_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return on_host::all_reduce(h, send.as_items(), recv.as_items_mut(), &op);
        }
        with_group(self, |g| {
            g.allreduce(send.as_items(), recv.as_items_mut(), &op)
        })
    }

    fn try_all_gather_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return h.all_gather(send.as_items(), recv.as_items_mut());
        }
        with_group(self, |g| g.allgather(send.as_items(), recv.as_items_mut()))
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
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return h.all_gather_varcount(send.as_items(), recv.as_items_mut(), counts);
        }
        let k = self::counts(counts)?;
        with_group(self, |g| {
            g.allgatherv(send.as_items(), recv.as_items_mut(), &k)
        })
    }

    fn try_all_to_all_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return h.all_to_all(send.as_items(), recv.as_items_mut());
        }
        with_group(self, |g| g.alltoall(send.as_items(), recv.as_items_mut()))
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
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return h.all_to_all_varcount(
                send.as_items(),
                send_counts,
                recv.as_items_mut(),
                recv_counts,
            );
        }
        let (sc, rc) = (counts(send_counts)?, counts(recv_counts)?);
        with_group(self, |g| {
            g.alltoallv(send.as_items(), &sc, recv.as_items_mut(), &rc)
        })
    }

    fn try_reduce_scatter_block_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return on_host::reduce_scatter_block(h, send.as_items(), recv.as_items_mut(), &op);
        }
        with_group(self, |g| {
            g.reduce_scatter_block(send.as_items(), recv.as_items_mut(), &op)
        })
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
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return on_host::reduce_scatter(h, send.as_items(), recv.as_items_mut(), counts, &op);
        }
        let k = self::counts(counts)?;
        with_group(self, |g| {
            g.reduce_scatter(send.as_items(), recv.as_items_mut(), &k, &op)
        })
    }

    fn try_scan_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            return on_host::scan(h, send.as_items(), recv.as_items_mut(), &op);
        }
        with_group(self, |g| g.scan(send.as_items(), recv.as_items_mut(), &op))
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

    /// Whether the calling rank is the root.
    #[cfg(feature = "mpi")]
    fn is_root(&self) -> bool {
        self.comm.rank() == self.rank
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
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            return h.broadcast(root, buf.as_items_mut());
        }
        with_group(self.comm, |g| g.bcast(buf.as_items_mut(), root))
    }

    fn try_reduce_into<S, O>(&self, send: &S, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        O: Operation<S::Item>,
    {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            return on_host::reduce(h, root, send.as_items(), None, &op);
        }
        with_group(self.comm, |g| g.reduce(send.as_items(), None, &op, root))
    }

    fn try_reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            let recv = self.is_root().then_some(recv.as_items_mut());
            on_host::reduce(h, root, send.as_items(), recv, &op)?;
            return self.must_be_root("reduce_into_root");
        }
        with_group(self.comm, |g| {
            g.reduce(send.as_items(), Some(recv.as_items_mut()), &op, root)
        })?;
        self.must_be_root("reduce_into_root")
    }

    fn try_gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            return h.gather(root, send.as_items(), None);
        }
        with_group(self.comm, |g| g.gather(send.as_items(), None, root))
    }

    fn try_gather_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            h.gather(
                root,
                send.as_items(),
                self.is_root().then_some(recv.as_items_mut()),
            )?;
            return self.must_be_root("gather_into_root");
        }
        with_group(self.comm, |g| {
            g.gather(send.as_items(), Some(recv.as_items_mut()), root)
        })?;
        self.must_be_root("gather_into_root")
    }

    fn try_gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            return h.gather_varcount(root, send.as_items(), None);
        }
        with_group(self.comm, |g| g.gatherv(send.as_items(), None, root))
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
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            let recv = self.is_root().then_some((recv.as_items_mut(), counts));
            h.gather_varcount(root, send.as_items(), recv)?;
            return self.must_be_root("gather_varcount_into_root");
        }
        let k = self::counts(counts)?;
        with_group(self.comm, |g| {
            g.gatherv(send.as_items(), Some((recv.as_items_mut(), &k)), root)
        })?;
        self.must_be_root("gather_varcount_into_root")
    }

    fn try_scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            return h.scatter(root, None, recv.as_items_mut());
        }
        with_group(self.comm, |g| g.scatter(None, recv.as_items_mut(), root))
    }

    fn try_scatter_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            let send = self.is_root().then_some(send.as_items());
            h.scatter(root, send, recv.as_items_mut())?;
            return self.must_be_root("scatter_into_root");
        }
        with_group(self.comm, |g| {
            g.scatter(Some(send.as_items()), recv.as_items_mut(), root)
        })?;
        self.must_be_root("scatter_into_root")
    }

    fn try_scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            return h.scatter_varcount(root, None, recv.as_items_mut());
        }
        with_group(self.comm, |g| g.scatterv(None, recv.as_items_mut(), root))
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
        #[cfg(feature = "mpi")]
        if let Some(h) = self.comm.host() {
            let send = self.is_root().then_some((send.as_items(), counts));
            h.scatter_varcount(root, send, recv.as_items_mut())?;
            return self.must_be_root("scatter_varcount_into_root");
        }
        let k = self::counts(counts)?;
        with_group(self.comm, |g| {
            g.scatterv(Some((send.as_items(), &k)), recv.as_items_mut(), root)
        })?;
        self.must_be_root("scatter_varcount_into_root")
    }
}

/// The collectives of the mpi transport that are more than one call of [`HostMpi`]:
/// reductions MPI does not define are combined here, in rank order, from contributions that
/// MPI moved.
///
/// [`HostMpi`]: crate::host_mpi::HostMpi
#[cfg(feature = "mpi")]
mod on_host {
    use pagewire_collectives::{Element, Op, Operation};

    use super::Count;
    use crate::error::{Error, Result};
    use crate::host_mpi::{reduces_natively, HostMpi};

    /// The predefined operation to hand to MPI, if MPI defines `op` on `T`s.
    fn native<T: Element, O: Operation<T>>(op: &O) -> Option<Op> {
        op.predefined().filter(|&p| reduces_natively::<T>(p))
    }

    /// `out = b_0 ∘ b_1 ∘ … ∘ b_(k-1)` over the `n`-element blocks of `blocks`, in rank
    /// order (folded from the right: `op.apply(left, right)` sets `right = left ∘ right`).
    fn combine<T: Element, O: Operation<T>>(op: &O, blocks: &[T], n: usize, out: &mut [T]) {
        if n == 0 {
            return;
        }
        let k = blocks.len() / n;
        out.copy_from_slice(&blocks[(k - 1) * n..k * n]);
        for j in (0..k - 1).rev() {
            op.apply(&blocks[j * n..(j + 1) * n], out);
        }
    }

    fn expect_len(what: &str, got: usize, want: usize) -> Result<()> {
        if got == want {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what} has {got} elements, expected {want}"
            )))
        }
    }

    pub(super) fn all_reduce<T: Element, O: Operation<T>>(
        h: &HostMpi,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        if let Some(p) = native::<T, O>(op) {
            return h.all_reduce(send, recv, p);
        }
        expect_len("all_reduce: recv", recv.len(), send.len())?;
        let mut all = vec![T::zeroed(); send.len() * h.size()];
        h.all_gather(send, &mut all)?;
        combine(op, &all, send.len(), recv);
        Ok(())
    }

    pub(super) fn reduce<T: Element, O: Operation<T>>(
        h: &HostMpi,
        root: usize,
        send: &[T],
        recv: Option<&mut [T]>,
        op: &O,
    ) -> Result<()> {
        op.check()?;
        if let Some(p) = native::<T, O>(op) {
            return h.reduce(root, send, recv, p);
        }
        match recv {
            Some(recv) => {
                expect_len("reduce: recv", recv.len(), send.len())?;
                let mut all = vec![T::zeroed(); send.len() * h.size()];
                h.gather(root, send, Some(&mut all))?;
                combine(op, &all, send.len(), recv);
                Ok(())
            }
            None => h.gather(root, send, None),
        }
    }

    pub(super) fn scan<T: Element, O: Operation<T>>(
        h: &HostMpi,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        if let Some(p) = native::<T, O>(op) {
            return h.scan(send, recv, p);
        }
        expect_len("scan: recv", recv.len(), send.len())?;
        let n = send.len();
        let mut all = vec![T::zeroed(); n * h.size()];
        h.all_gather(send, &mut all)?;
        combine(op, &all[..n * (h.rank() + 1)], n, recv);
        Ok(())
    }

    pub(super) fn reduce_scatter_block<T: Element, O: Operation<T>>(
        h: &HostMpi,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        if let Some(p) = native::<T, O>(op) {
            return h.reduce_scatter_block(send, recv, p);
        }
        let m = recv.len();
        expect_len("reduce_scatter_block: send", send.len(), m * h.size())?;
        // Block j of every rank's send to rank j, then combined.
        let mut mine = vec![T::zeroed(); m * h.size()];
        h.all_to_all(send, &mut mine)?;
        combine(op, &mine, m, recv);
        Ok(())
    }

    pub(super) fn reduce_scatter<T: Element, O: Operation<T>>(
        h: &HostMpi,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        if let Some(p) = native::<T, O>(op) {
            return h.reduce_scatter(send, recv, counts, p);
        }
        let mine = *counts.get(h.rank()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "reduce_scatter: {} counts for {} ranks",
                counts.len(),
                h.size()
            ))
        })?;
        let m = usize::try_from(mine)
            .map_err(|_| Error::InvalidArgument(format!("negative count {mine} in {counts:?}")))?;
        expect_len("reduce_scatter: recv", recv.len(), m)?;
        // Block j (counts[j] elements) of every rank's send to rank j, then combined.
        let mut blocks = vec![T::zeroed(); m * h.size()];
        h.all_to_all_varcount(send, counts, &mut blocks, &vec![mine; h.size()])?;
        combine(op, &blocks, m, recv);
        Ok(())
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
        assert_eq!(COLLECTIVE_CONTEXT_BIT, 0x8000_0000);
        assert!(counts(&[1, -2]).is_err());
        assert_eq!(counts(&[3, 0]).unwrap(), vec![3, 0]);
    }
}
