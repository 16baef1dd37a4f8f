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
//! contexts stay below 2^30 (bit 30 marks the context of nonblocking collectives).
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
//! **Datatypes.** Buffers of any datatype move: a buffer with gaps is packed before and
//! unpacked after (the bytes between its blocks are not touched). Varcount (v-) collectives
//! take rsmpi's [`Partition`](crate::datatype::Partition) and
//! [`PartitionMut`](crate::datatype::PartitionMut) (counts and displacements per rank).
//! Reductions need a datatype made of one primitive (a number or `bool`): the element type
//! is found from it at run time, as MPI does; a bitwise operation on floats is an error.
//!
//! **Nonblocking collectives** (`immediate_*`, `MPI_I*`) run on point-to-point messages in
//! a context of their own (`immediate.rs`): every message is posted when the call starts,
//! and the message layer moves them while the caller computes or communicates; completing
//! the request (wait, test) combines and unpacks the results.
//!
//! **Differences from rsmpi.** `reduce_scatter_varcount_into` (`MPI_Reduce_scatter`, with
//! a counts slice) is an addition; in-place variants are not provided.
//!
//! Files: this one holds [`CommunicatorCollectives`], `root.rs` [`Root`], `operation.rs`
//! the operations, `elements.rs` the element types collectives run on (casts, landing
//! buffers, reductions over packed bytes), `immediate.rs` the nonblocking collectives. Each backend's blocking
//! collectives live below the seam (`backend/`).
//!
//! [`Error::InvalidArgument`]: crate::Error::InvalidArgument

mod elements;
pub(crate) mod immediate;
pub(crate) mod operation;
mod root;

use crate::backend::CollectiveBackend;
use crate::datatype::{
    packed, packed_partition, Buffer, BufferMut, Landing, PartitionedBuffer, PartitionedBufferMut,
    Primitive, UncommittedDatatype,
};
use crate::error::{fatal, Result};
use crate::request::{persistent, PersistentRequest, Request, Scope, StaticScope};
use crate::topology::Communicator;

pub use crate::backend::pagewire::COLLECTIVE_CONTEXT_BIT;
pub use crate::datatype::Count;
pub use operation::{
    reduce_local_into, try_reduce_local_into, Operation, Reduction, SystemOperation,
    UnsafeUserOperation, UserOperation,
};
pub use pagewire_collectives::{Element, Integer};
pub use root::Root;

pub(crate) use elements::{
    counts_of, elements, elements_mut, into_landing, reduce_into_buffer, with_unit, ReduceCall,
};
/// Collectives over all ranks of a communicator (rsmpi's `CommunicatorCollectives`).
/// Every rank calls the same collectives in the same order. Implemented for every
/// [`Communicator`], `dyn Communicator` included.
pub trait CommunicatorCollectives: Communicator {
    /// Waits until every rank has called it (`MPI_Barrier`); panics on error.
    fn barrier(&self) {
        fatal(self.try_barrier())
    }
    /// Every rank's `send` into `recv` (`size` times as long), in rank order
    /// (`MPI_Allgather`); panics on error.
    fn all_gather_into<S: Buffer + ?Sized, R: BufferMut + ?Sized>(&self, send: &S, recv: &mut R) {
        fatal(self.try_all_gather_into(send, recv))
    }
    /// Rank `j`'s `send` into block `j` of `recv` (`MPI_Allgatherv`); panics on error.
    fn all_gather_varcount_into<S: Buffer + ?Sized, R: PartitionedBufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) {
        fatal(self.try_all_gather_varcount_into(send, recv))
    }
    /// Block `j` of `send` to rank `j`; block `j` of `recv` from rank `j` (`MPI_Alltoall`);
    /// panics on error.
    fn all_to_all_into<S: Buffer + ?Sized, R: BufferMut + ?Sized>(&self, send: &S, recv: &mut R) {
        fatal(self.try_all_to_all_into(send, recv))
    }
    /// Block `j` of `send` to rank `j`, block `j` of `recv` from it, blocks by partition
    /// (`MPI_Alltoallv`); panics on error.
    fn all_to_all_varcount_into<S: PartitionedBuffer + ?Sized, R: PartitionedBufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) {
        fatal(self.try_all_to_all_varcount_into(send, recv))
    }
    /// Combines `send` of every rank with `op` into `recv` of every rank
    /// (`MPI_Allreduce`); panics on error.
    fn all_reduce_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) {
        fatal(self.try_all_reduce_into(send, recv, op))
    }
    /// Combines `send` (`size` blocks) of every rank and leaves block `j` in `recv` of rank
    /// `j` (`MPI_Reduce_scatter_block`); panics on error.
    fn reduce_scatter_block_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) {
        fatal(self.try_reduce_scatter_block_into(send, recv, op))
    }
    /// Combines `send` (`Σ counts` elements) of every rank and leaves block `j`
    /// (`counts[j]` elements, packed in rank order) in `recv` of rank `j`
    /// (`MPI_Reduce_scatter`; not in rsmpi); panics on error.
    fn reduce_scatter_varcount_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
        op: O,
    ) {
        fatal(self.try_reduce_scatter_varcount_into(send, recv, counts, op))
    }
    /// Inclusive prefix reduction in rank order (`MPI_Scan`); panics on error.
    fn scan_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) {
        fatal(self.try_scan_into(send, recv, op))
    }
    /// Exclusive prefix reduction in rank order (`MPI_Exscan`): rank `r` gets the
    /// reduction of ranks `0..r`; rank 0's `recv` is left as it was. Panics on error.
    fn exclusive_scan_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) {
        fatal(self.try_exclusive_scan_into(send, recv, op))
    }

    /// A persistent barrier (`MPI_Barrier_init`, MPI-4): started and completed any number
    /// of times. Collective. Panics on error.
    fn barrier_init(&self) -> PersistentRequest<'static, (), StaticScope> {
        let backend = self.as_simple().backend().clone();
        // A zero-sized buffer: leaking it allocates nothing.
        let nothing: &'static mut () = Box::leak(Box::new(()));
        persistent::collective(StaticScope, nothing, move |_| immediate::barrier(&backend))
    }
    /// A persistent reduction of `send` with `op` into every rank's `recv`
    /// (`MPI_Allreduce_init`, MPI-4): each start reduces what `send` holds then; the result
    /// is read between starts ([`PersistentRequest::buffer`]). `send` stays borrowed for the
    /// request's life, so its data changes between starts only through interior mutability
    /// (make a new request otherwise). Collective. Panics on error.
    fn all_reduce_init<'a, Sc, S, R, O>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> PersistentRequest<'a, R, Sc>
    where
        Sc: Scope<'a> + Copy,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
        O: Operation + Clone + 'a,
    {
        let backend = self.as_simple().backend().clone();
        persistent::collective(scope, recv, move |recv| {
            immediate::reduction(
                &backend,
                immediate::Combine::All,
                send,
                Some(Landing::new(recv)),
                op.clone(),
            )
        })
    }
    /// A persistent all-gather of `send` into `recv` (`MPI_Allgather_init`, MPI-4).
    /// Collective. Panics on error.
    fn all_gather_init<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> PersistentRequest<'a, R, Sc>
    where
        Sc: Scope<'a> + Copy,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
    {
        let backend = self.as_simple().backend().clone();
        persistent::collective(scope, recv, move |recv| {
            immediate::all_gather(&backend, &packed(send), Landing::new(recv))
        })
    }
    /// Starts a barrier (`MPI_Ibarrier`).
    fn immediate_barrier(&self) -> Request<'static, (), StaticScope> {
        let op = fatal(immediate::barrier(self.as_simple().backend()));
        Request::new(op, StaticScope, &())
    }
    /// Starts [`CommunicatorCollectives::all_gather_into`] (`MPI_Iallgather`).
    fn immediate_all_gather_into<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
    {
        let data: *const R = &*recv;
        let op = immediate::all_gather(
            self.as_simple().backend(),
            &packed(send),
            Landing::new(recv),
        );
        Request::new(fatal(op), scope, data)
    }
    /// Starts [`CommunicatorCollectives::all_gather_varcount_into`] (`MPI_Iallgatherv`).
    fn immediate_all_gather_varcount_into<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: PartitionedBufferMut + ?Sized + 'a,
    {
        let data: *const R = &*recv;
        let landing = Landing::partitioned(recv);
        let op = immediate::all_gather(self.as_simple().backend(), &packed(send), landing);
        Request::new(fatal(op), scope, data)
    }
    /// Starts [`CommunicatorCollectives::all_to_all_into`] (`MPI_Ialltoall`).
    fn immediate_all_to_all_into<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
    {
        let data: *const R = &*recv;
        let bytes = packed(send);
        let n = self.size().max(1) as usize;
        let lens = vec![bytes.len() / n; n];
        let op = immediate::all_to_all(
            self.as_simple().backend(),
            &bytes,
            &lens,
            Landing::new(recv),
        );
        Request::new(fatal(op), scope, data)
    }
    /// Starts [`CommunicatorCollectives::all_to_all_varcount_into`] (`MPI_Ialltoallv`).
    fn immediate_all_to_all_varcount_into<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: PartitionedBuffer + ?Sized + 'a,
        R: PartitionedBufferMut + ?Sized + 'a,
    {
        let data: *const R = &*recv;
        let (bytes, lens) = packed_partition(send);
        let landing = Landing::partitioned(recv);
        let op = immediate::all_to_all(self.as_simple().backend(), &bytes, &lens, landing);
        Request::new(fatal(op), scope, data)
    }
    /// Starts [`CommunicatorCollectives::all_reduce_into`] (`MPI_Iallreduce`).
    fn immediate_all_reduce_into<'a, Sc, S, R, O>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
        O: Operation + 'a,
    {
        let data: *const R = &*recv;
        let started = immediate::reduction(
            self.as_simple().backend(),
            immediate::Combine::All,
            send,
            Some(Landing::new(recv)),
            op,
        );
        Request::new(fatal(started), scope, data)
    }
    /// Starts [`CommunicatorCollectives::reduce_scatter_block_into`]
    /// (`MPI_Ireduce_scatter_block`).
    fn immediate_reduce_scatter_block_into<'a, Sc, S, R, O>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
        O: Operation + 'a,
    {
        let data: *const R = &*recv;
        let started = immediate::reduction(
            self.as_simple().backend(),
            immediate::Combine::ScatterBlock,
            send,
            Some(Landing::new(recv)),
            op,
        );
        Request::new(fatal(started), scope, data)
    }
    /// Starts [`CommunicatorCollectives::scan_into`] (`MPI_Iscan`).
    fn immediate_scan_into<'a, Sc, S, R, O>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
        O: Operation + 'a,
    {
        let data: *const R = &*recv;
        let started = immediate::reduction(
            self.as_simple().backend(),
            immediate::Combine::Prefix { inclusive: true },
            send,
            Some(Landing::new(recv)),
            op,
        );
        Request::new(fatal(started), scope, data)
    }
    /// Starts [`CommunicatorCollectives::exclusive_scan_into`] (`MPI_Iexscan`).
    fn immediate_exclusive_scan_into<'a, Sc, S, R, O>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
        O: Operation + 'a,
    {
        let data: *const R = &*recv;
        let started = immediate::reduction(
            self.as_simple().backend(),
            immediate::Combine::Prefix { inclusive: false },
            send,
            Some(Landing::new(recv)),
            op,
        );
        Request::new(fatal(started), scope, data)
    }

    /// [`CommunicatorCollectives::barrier`], returning errors.
    fn try_barrier(&self) -> Result<()> {
        self.as_simple().backend().barrier()
    }
    /// [`CommunicatorCollectives::all_gather_into`], returning errors.
    fn try_all_gather_into<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        let backend = self.as_simple().backend();
        with_unit!(&map, T => into_landing(&mut Landing::new(recv), |r| {
            backend.all_gather::<T>(elements(&send)?, elements_mut(r)?)
        }))
    }
    /// [`CommunicatorCollectives::all_gather_varcount_into`], returning errors.
    fn try_all_gather_varcount_into<S: Buffer + ?Sized, R: PartitionedBufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        let backend = self.as_simple().backend();
        let mut landing = Landing::partitioned(recv);
        let lens = landing.block_lens().unwrap_or_default();
        with_unit!(&map, T => {
            let counts = counts_of::<T>(&lens)?;
            into_landing(&mut landing, |r| {
                backend.all_gather_varcount::<T>(elements(&send)?, elements_mut(r)?, &counts)
            })
        })
    }
    /// [`CommunicatorCollectives::all_to_all_into`], returning errors.
    fn try_all_to_all_into<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        let backend = self.as_simple().backend();
        with_unit!(&map, T => into_landing(&mut Landing::new(recv), |r| {
            backend.all_to_all::<T>(elements(&send)?, elements_mut(r)?)
        }))
    }
    /// [`CommunicatorCollectives::all_to_all_varcount_into`], returning errors.
    fn try_all_to_all_varcount_into<
        S: PartitionedBuffer + ?Sized,
        R: PartitionedBufferMut + ?Sized,
    >(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let map = send.as_datatype().type_map().clone();
        let (send, send_lens) = packed_partition(send);
        let backend = self.as_simple().backend();
        let mut landing = Landing::partitioned(recv);
        let recv_lens = landing.block_lens().unwrap_or_default();
        with_unit!(&map, T => {
            let (sc, rc) = (counts_of::<T>(&send_lens)?, counts_of::<T>(&recv_lens)?);
            into_landing(&mut landing, |r| {
                backend.all_to_all_varcount::<T>(elements(&send)?, &sc, elements_mut(r)?, &rc)
            })
        })
    }
    /// [`CommunicatorCollectives::all_reduce_into`], returning errors.
    fn try_all_reduce_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()> {
        let backend = self.as_simple().backend();
        reduce_into_buffer(backend, ReduceCall::AllReduce, send, Some(recv), &op)
    }
    /// [`CommunicatorCollectives::reduce_scatter_block_into`], returning errors.
    fn try_reduce_scatter_block_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()> {
        let backend = self.as_simple().backend();
        reduce_into_buffer(
            backend,
            ReduceCall::ReduceScatterBlock,
            send,
            Some(recv),
            &op,
        )
    }
    /// [`CommunicatorCollectives::reduce_scatter_varcount_into`], returning errors.
    fn try_reduce_scatter_varcount_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
        op: O,
    ) -> Result<()> {
        let backend = self.as_simple().backend();
        let call = ReduceCall::ReduceScatter { counts };
        reduce_into_buffer(backend, call, send, Some(recv), &op)
    }
    /// [`CommunicatorCollectives::scan_into`], returning errors.
    fn try_scan_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()> {
        let backend = self.as_simple().backend();
        reduce_into_buffer(backend, ReduceCall::Scan, send, Some(recv), &op)
    }
    /// [`CommunicatorCollectives::exclusive_scan_into`], returning errors.
    fn try_exclusive_scan_into<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()> {
        let backend = self.as_simple().backend();
        let mut started = immediate::reduction(
            backend,
            immediate::Combine::Prefix { inclusive: false },
            send,
            Some(Landing::new(recv)),
            op,
        )?;
        started.wait().map(|_| ())
    }
}

impl<C: Communicator + ?Sized> CommunicatorCollectives for C {}
