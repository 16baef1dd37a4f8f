//! Rooted collectives ([`Root`], rsmpi's `Root`): broadcast, reduce, gather(v) and
//! scatter(v), blocking and nonblocking, called on the root process of a communicator by
//! every rank.
//!
//! The trait is here; `process.rs` carries it out on a [`Process`](crate::Process).

mod process;

use crate::collective::operation::Operation;
use crate::datatype::{Buffer, BufferMut, PartitionedBuffer, PartitionedBufferMut};
use crate::error::{fatal, Result};
use crate::request::{PersistentRequest, Request, Scope};
use crate::topology::{InterCommunicator, Rank};
use std::process::Command;

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
    /// Contributes `send` to a reduction at the root (`MPI_Reduce`, non-root side).
    fn reduce_into<S: Buffer + ?Sized, O: Operation>(&self, send: &S, op: O) {
        fatal(self.try_reduce_into(send, op))
    }
    /// Combines every rank's `send` into `recv` (`MPI_Reduce`, root side).
    fn reduce_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) {
        fatal(self.try_reduce_into_root(send, recv, op))
    }
    /// Sends `send` to the root's gather (`MPI_Gather`, non-root side).
    fn gather_into<S: Buffer + ?Sized>(&self, send: &S) {
        fatal(self.try_gather_into(send))
    }
    /// Gathers every rank's `send` into `recv` in rank order (`MPI_Gather`, root side).
    fn gather_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(&self, send: &S, recv: &mut R) {
        fatal(self.try_gather_into_root(send, recv))
    }
    /// Sends `send` to the root's gatherv (`MPI_Gatherv`, non-root side).
    fn gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) {
        fatal(self.try_gather_varcount_into(send))
    }
    /// Gathers rank `j`'s `send` into block `j` of `recv` (`MPI_Gatherv`, root side).
    fn gather_varcount_into_root<S: Buffer + ?Sized, R: PartitionedBufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) {
        fatal(self.try_gather_varcount_into_root(send, recv))
    }
    /// Receives this rank's block of the root's scatter (`MPI_Scatter`, non-root side).
    fn scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) {
        fatal(self.try_scatter_into(recv))
    }
    /// Scatters `send` (`size` equal blocks) in rank order (`MPI_Scatter`, root side).
    fn scatter_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(&self, send: &S, recv: &mut R) {
        fatal(self.try_scatter_into_root(send, recv))
    }
    /// Receives this rank's block of the root's scatterv (`MPI_Scatterv`, non-root side).
    fn scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) {
        fatal(self.try_scatter_varcount_into(recv))
    }
    /// Scatters block `j` of `send` to rank `j` (`MPI_Scatterv`, root side).
    fn scatter_varcount_into_root<S: PartitionedBuffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) {
        fatal(self.try_scatter_varcount_into_root(send, recv))
    }

    /// Starts [`Root::broadcast_into`] (`MPI_Ibcast`).
    fn immediate_broadcast_into<'a, Sc: Scope<'a>, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: Sc,
        buf: &'a mut B,
    ) -> Request<'a, B, Sc>;
    /// A persistent broadcast of the root's `buf` (`MPI_Bcast_init`, MPI-4): each start
    /// copies what the root's buffer holds then into every rank's; between starts the root
    /// changes it and the others read it ([`PersistentRequest::buffer_mut`]). Collective.
    /// Panics on error.
    fn broadcast_init<'a, Sc: Scope<'a> + Copy, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: Sc,
        buf: &'a mut B,
    ) -> PersistentRequest<'a, B, Sc>;
    /// Starts [`Root::reduce_into`] (`MPI_Ireduce`, non-root side).
    fn immediate_reduce_into<'a, Sc, S, O>(
        &self,
        scope: Sc,
        send: &'a S,
        op: O,
    ) -> Request<'a, S, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        O: Operation + 'a;
    /// Starts [`Root::reduce_into_root`] (`MPI_Ireduce`, root side).
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
        O: Operation + 'a;
    /// Starts [`Root::gather_into`] (`MPI_Igather`, non-root side).
    fn immediate_gather_into<'a, Sc: Scope<'a>, S: Buffer + ?Sized + 'a>(
        &self,
        scope: Sc,
        send: &'a S,
    ) -> Request<'a, S, Sc>;
    /// Starts [`Root::gather_into_root`] (`MPI_Igather`, root side).
    fn immediate_gather_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a;
    /// Starts [`Root::gather_varcount_into`] (`MPI_Igatherv`, non-root side).
    fn immediate_gather_varcount_into<'a, Sc: Scope<'a>, S: Buffer + ?Sized + 'a>(
        &self,
        scope: Sc,
        send: &'a S,
    ) -> Request<'a, S, Sc> {
        self.immediate_gather_into(scope, send)
    }
    /// Starts [`Root::gather_varcount_into_root`] (`MPI_Igatherv`, root side).
    fn immediate_gather_varcount_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: PartitionedBufferMut + ?Sized + 'a;
    /// Starts [`Root::scatter_into`] (`MPI_Iscatter`, non-root side).
    fn immediate_scatter_into<'a, Sc: Scope<'a>, R: BufferMut + ?Sized + 'a>(
        &self,
        scope: Sc,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>;
    /// Starts [`Root::scatter_into_root`] (`MPI_Iscatter`, root side).
    fn immediate_scatter_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: Buffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a;
    /// Starts [`Root::scatter_varcount_into`] (`MPI_Iscatterv`, non-root side).
    fn immediate_scatter_varcount_into<'a, Sc: Scope<'a>, R: BufferMut + ?Sized + 'a>(
        &self,
        scope: Sc,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc> {
        self.immediate_scatter_into(scope, recv)
    }
    /// Starts [`Root::scatter_varcount_into_root`] (`MPI_Iscatterv`, root side).
    fn immediate_scatter_varcount_into_root<'a, Sc, S, R>(
        &self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut R,
    ) -> Request<'a, R, Sc>
    where
        Sc: Scope<'a>,
        S: PartitionedBuffer + ?Sized + 'a,
        R: BufferMut + ?Sized + 'a;

    /// Starts `maxprocs` processes of `command` connected to this communicator
    /// (`MPI_Comm_spawn`, collective, the command taken from the root) and returns the
    /// intercommunicator to them. Under `pwrun -n` the launcher starts them as a job of their
    /// own connected to this group (`boot::spawn`); under mpirun with the mpi transport
    /// `MPI_Comm_spawn` does. Where neither can (`pwrun --hosts`, pagewire's transport under
    /// mpirun) every rank gets an error of one line that says so. A command's arguments,
    /// environment changes and working directory are the spawned processes'.
    fn spawn(&self, command: &Command, maxprocs: Rank) -> Result<InterCommunicator>;
    /// [`Root::spawn`] of several commands (`MPI_Comm_spawn_multiple`): `maxprocs[i]`
    /// processes of `commands[i]`, in one group.
    fn spawn_multiple(&self, commands: &[Command], maxprocs: &[Rank]) -> Result<InterCommunicator>;

    /// [`Root::broadcast_into`], returning errors.
    fn try_broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()>;
    /// [`Root::reduce_into`], returning errors.
    fn try_reduce_into<S: Buffer + ?Sized, O: Operation>(&self, send: &S, op: O) -> Result<()>;
    /// [`Root::reduce_into_root`], returning errors.
    fn try_reduce_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized, O: Operation>(
        &self,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()>;
    /// [`Root::gather_into`], returning errors.
    fn try_gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()>;
    /// [`Root::gather_into_root`], returning errors.
    fn try_gather_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()>;
    /// [`Root::gather_varcount_into`], returning errors.
    fn try_gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()>;
    /// [`Root::gather_varcount_into_root`], returning errors.
    fn try_gather_varcount_into_root<S: Buffer + ?Sized, R: PartitionedBufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()>;
    /// [`Root::scatter_into`], returning errors.
    fn try_scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()>;
    /// [`Root::scatter_into_root`], returning errors.
    fn try_scatter_into_root<S: Buffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()>;
    /// [`Root::scatter_varcount_into`], returning errors.
    fn try_scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()>;
    /// [`Root::scatter_varcount_into_root`], returning errors.
    fn try_scatter_varcount_into_root<S: PartitionedBuffer + ?Sized, R: BufferMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()>;
}
