//! [`Root`] on a [`Process`]: the checks of the root's rank, and each rooted collective
//! handed to the communicator's backend, blocking, or started as a request.

use super::Root;
use crate::backend::{CollectiveBackend, CommunicatorBackend};
use crate::collective::immediate::{self, Combine};
use crate::collective::operation::Operation;
use crate::collective::{
    counts_of, elements, elements_mut, into_landing, reduce_into_buffer, with_unit, ReduceCall,
};
use crate::datatype::{
    packed, packed_partition, Buffer, BufferMut, Landing, PartitionedBuffer, PartitionedBufferMut,
    Primitive, UncommittedDatatype,
};
use crate::error::{fatal, Error, Result};
use crate::request::{persistent, PersistentRequest, Request, Scope};
use crate::topology::communicator::Process;
use crate::topology::{Communicator, InterCommunicator, Rank};
use crate::ErrorClass;
use std::process::Command;

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
            return Err(Error::invalid(
                ErrorClass::Root,
                format!(
                    "rank {me} called {what} but the root is rank {}; non-roots call the variant \
                 without `_root`",
                    self.rank
                ),
            ));
        }
        Ok(())
    }
}

impl Root for Process<'_> {
    fn root_rank(&self) -> Rank {
        self.rank
    }

    fn spawn(&self, command: &Command, maxprocs: Rank) -> Result<InterCommunicator> {
        self.spawn_multiple(std::slice::from_ref(command), &[maxprocs])
    }

    fn spawn_multiple(&self, commands: &[Command], maxprocs: &[Rank]) -> Result<InterCommunicator> {
        if commands.len() != maxprocs.len() || maxprocs.iter().any(|&n| n < 1) {
            return Err(Error::InvalidArgument(format!(
                "spawn: {} commands with process counts {maxprocs:?}: one count of at least 1 \
                 per command",
                commands.len()
            )));
        }
        let root = self.root()?;
        let backend = self.comm.backend().spawn(root, commands, maxprocs)?;
        Ok(InterCommunicator::new(backend))
    }

    fn broadcast_init<'a, Sc: Scope<'a> + Copy, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: Sc,
        buf: &'a mut B,
    ) -> PersistentRequest<'a, B, Sc> {
        let root = fatal(self.root());
        let backend = self.comm.backend().clone();
        persistent::collective(scope, buf, move |buf| {
            immediate::broadcast(&backend, root, Landing::new(buf))
        })
    }

    fn immediate_broadcast_into<'a, Sc: Scope<'a>, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: Sc,
        buf: &'a mut B,
    ) -> Request<'a, B, Sc> {
        let data: *const B = &*buf;
        let root = fatal(self.root());
        let op = immediate::broadcast(self.comm.backend(), root, Landing::new(buf));
        Request::new(fatal(op), scope, data)
    }

    fn immediate_reduce_into<'a, Sc, S, O>(
        &self,
        scope: Sc,
        send: &'a S,
        op: O,
    ) -> Request<'a, S, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        O: Operation + 'a,
    {
        let root = fatal(self.root());
        let started =
            immediate::reduction(self.comm.backend(), Combine::Root(root), send, None, op);
        Request::new(fatal(started), scope, send)
    }

    fn immediate_reduce_into_root<'a, Sc, S, R, O>(
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
        let root = fatal(self.root());
        let landing = Some(Landing::new(recv));
        let started =
            immediate::reduction(self.comm.backend(), Combine::Root(root), send, landing, op);
        let request = Request::new(fatal(started), scope, data);
        fatal(self.must_be_root("immediate_reduce_into_root"));
        request
    }

    fn immediate_gather_into<'a, Sc: Scope<'a>, S: Buffer + ?Sized + 'a>(
        &self,
        scope: Sc,
        send: &'a S,
    ) -> Request<'a, S, Sc> {
        let root = fatal(self.root());
        let op = immediate::gather(self.comm.backend(), root, &packed(send), None);
        Request::new(fatal(op), scope, send)
    }

    fn immediate_gather_into_root<'a, Sc, S, R>(
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
        let root = fatal(self.root());
        fatal(self.must_be_root("immediate_gather_into_root"));
        let op = immediate::gather(
            self.comm.backend(),
            root,
            &packed(send),
            Some(Landing::new(recv)),
        );
        Request::new(fatal(op), scope, data)
    }

    fn immediate_gather_varcount_into_root<'a, Sc, S, R>(
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
        let root = fatal(self.root());
        fatal(self.must_be_root("immediate_gather_varcount_into_root"));
        let landing = Some(Landing::partitioned(recv));
        let op = immediate::gather(self.comm.backend(), root, &packed(send), landing);
        Request::new(fatal(op), scope, data)
    }

    fn immediate_scatter_into<'a, Sc: Scope<'a>, R: BufferMut + ?Sized + 'a>(
        &self,
        scope: Sc,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc> {
        let data: *const R = &*recv;
        let root = fatal(self.root());
        let op = immediate::scatter(self.comm.backend(), root, None, Landing::new(recv));
        Request::new(fatal(op), scope, data)
    }

    fn immediate_scatter_into_root<'a, Sc, S, R>(
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
        let root = fatal(self.root());
        fatal(self.must_be_root("immediate_scatter_into_root"));
        let bytes = packed(send).into_owned();
        let n = self.comm.size().max(1) as usize;
        let lens = vec![bytes.len() / n; n];
        let op = immediate::scatter(
            self.comm.backend(),
            root,
            Some((bytes, lens)),
            Landing::new(recv),
        );
        Request::new(fatal(op), scope, data)
    }

    fn immediate_scatter_varcount_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: PartitionedBuffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a,
    {
        let data: *const R = &*recv;
        let root = fatal(self.root());
        fatal(self.must_be_root("immediate_scatter_varcount_into_root"));
        let (bytes, lens) = packed_partition(send);
        let blocks = Some((bytes.into_owned(), lens));
        let op = immediate::scatter(self.comm.backend(), root, blocks, Landing::new(recv));
        Request::new(fatal(op), scope, data)
    }

    fn try_broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        let root = self.root()?;
        let backend = self.comm.backend();
        let map = buf.as_datatype().type_map().clone();
        let mut landing = Landing::new(buf);
        if let Some(bytes) = landing.contiguous() {
            return with_unit!(&map, T => backend.broadcast::<T>(root, elements_mut(bytes)?));
        }
        let mut scratch = vec![0u8; landing.packed_len()];
        landing.read_into(&mut scratch);
        backend.broadcast(root, &mut scratch)?;
        landing.unpack(&scratch);
        Ok(())
    }

    fn try_reduce_into<S: Buffer + ?Sized, O: Operation>(&self, send: &S, op: O) -> Result<()> {
        let call = ReduceCall::Reduce {
            root: self.root()?,
            at_root: false,
        };
        reduce_into_buffer::<S, [u8], O>(self.comm.backend(), call, send, None, &op)
    }

    fn try_reduce_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()> {
        let call = ReduceCall::Reduce {
            root: self.root()?,
            at_root: true,
        };
        reduce_into_buffer(self.comm.backend(), call, send, Some(recv), &op)?;
        self.must_be_root("reduce_into_root")
    }

    fn try_gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        with_unit!(&map, T => self.comm.backend().gather::<T>(root, elements(&send)?, None))
    }

    fn try_gather_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let root = self.root()?;
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        let backend = self.comm.backend();
        with_unit!(&map, T => into_landing(&mut Landing::new(recv), |r| {
            backend.gather::<T>(root, elements(&send)?, Some(elements_mut(r)?))
        }))?;
        self.must_be_root("gather_into_root")
    }

    fn try_gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        let backend = self.comm.backend();
        with_unit!(&map, T => backend.gather_varcount::<T>(root, elements(&send)?, None))
    }

    fn try_gather_varcount_into_root<S: Buffer + ?Sized, R: PartitionedBufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let root = self.root()?;
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        let backend = self.comm.backend();
        let mut landing = Landing::partitioned(recv);
        let lens = landing.block_lens().unwrap_or_default();
        with_unit!(&map, T => {
            let counts = counts_of::<T>(&lens)?;
            into_landing(&mut landing, |r| {
                let r = elements_mut::<T>(r)?;
                backend.gather_varcount::<T>(root, elements(&send)?, Some((r, &counts)))
            })
        })?;
        self.must_be_root("gather_varcount_into_root")
    }

    fn try_scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        let backend = self.comm.backend();
        let map = recv.as_datatype().type_map().clone();
        with_unit!(&map, T => into_landing(&mut Landing::new(recv), |r| {
            backend.scatter::<T>(root, None, elements_mut(r)?)
        }))
    }

    fn try_scatter_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let root = self.root()?;
        let map = send.as_datatype().type_map().clone();
        let send = packed(send);
        let backend = self.comm.backend();
        with_unit!(&map, T => into_landing(&mut Landing::new(recv), |r| {
            backend.scatter::<T>(root, Some(elements(&send)?), elements_mut(r)?)
        }))?;
        self.must_be_root("scatter_into_root")
    }

    fn try_scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        let backend = self.comm.backend();
        let map = recv.as_datatype().type_map().clone();
        with_unit!(&map, T => into_landing(&mut Landing::new(recv), |r| {
            backend.scatter_varcount::<T>(root, None, elements_mut(r)?)
        }))
    }

    fn try_scatter_varcount_into_root<S: PartitionedBuffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let root = self.root()?;
        let map = send.as_datatype().type_map().clone();
        let (send, lens) = packed_partition(send);
        let backend = self.comm.backend();
        with_unit!(&map, T => {
            let counts = counts_of::<T>(&lens)?;
            into_landing(&mut Landing::new(recv), |r| {
                let s = Some((elements::<T>(&send)?, &counts[..]));
                backend.scatter_varcount::<T>(root, s, elements_mut(r)?)
            })
        })?;
        self.must_be_root("scatter_varcount_into_root")
    }
}
