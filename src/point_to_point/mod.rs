//! Point-to-point communication (rsmpi's `point_to_point`): `Destination` and `Source`
//! on processes of a communicator, and the [`Message`]s of matched probes.
//!
//! Ranks are the communicator's own: `process_at_rank(r)` of a sub-communicator is its
//! rank `r`, and a [`Status`] names the sender by its rank in the communicator of the
//! receive.
//!
//! On the mpi transport every call here goes to the host MPI library (`MPI_Send`,
//! `MPI_Irecv`, `MPI_Iprobe`, `MPI_Improbe`/`MPI_Mrecv`, …); a truncated receive is then an
//! [`Error::Mpi`] (MPI does not report the message's length).

use pagewire_transport::msg;

use crate::backend::{CommBackend, CommunicatorBackend, PointToPointBackend};
use crate::datatype::{packed, Buffer, UncommittedDatatype};
use crate::error::{fatal, Error, Result};
use crate::request::{self, persistent, Pending, PersistentRequest, Request, Scope};
use crate::topology::{Rank, SimpleCommunicator, Tag};

mod buffered;
mod message;
mod send_receive;
mod source;

use buffered::buffered_send;
pub(crate) use buffered::{attach_buffer, attached_buffer_size, detach_buffer};
pub use message::{MatchedReceiveVec, Message};
pub use send_receive::*;
pub use source::{ReceiveFuture, Source};

pub use crate::status::Status;
pub use crate::topology::communicator::{AnyProcess, Process};

/// A blocking probe's watch on its senders: every [`msg::LIVENESS_CHECK_AFTER`] without a
/// message, the backend checks that a rank that could send it is alive, so a probe on a
/// dead sender ends in [`Error::Communication`] instead of spinning.
struct SenderWatch {
    since: std::time::Instant,
}

impl SenderWatch {
    fn new() -> SenderWatch {
        SenderWatch {
            since: std::time::Instant::now(),
        }
    }

    fn check<S: Source + ?Sized>(&mut self, src: &S) -> Result<()> {
        if self.since.elapsed() < msg::LIVENESS_CHECK_AFTER {
            return Ok(());
        }
        self.since = std::time::Instant::now();
        src.comm().backend().check_senders(src.source()?)
    }
}

/// The rank `rank` of `comm`, checked.
fn rank_of(comm: &SimpleCommunicator, rank: Rank) -> Result<usize> {
    // An intercommunicator's ranks here are the other group's.
    let size = comm.backend().target_size();
    if rank < 0 || rank as usize >= size {
        return Err(Error::NoSuchRank {
            rank: rank.max(0) as usize,
            size,
        });
    }
    Ok(rank as usize)
}

/// Sending (rsmpi's `Destination`).
pub trait Destination {
    /// The destination's rank in the communicator, checked.
    fn destination(&self) -> Result<usize>;
    /// The communicator.
    fn destination_comm(&self) -> &SimpleCommunicator;

    /// The destination's rank.
    fn destination_rank(&self) -> Rank {
        self.destination().map_or(-1, |r| r as Rank)
    }

    /// [`Destination::send_with_tag`] with tag 0; panics on error.
    fn send<B: Buffer + ?Sized>(&self, buf: &B) {
        fatal(self.try_send_with_tag(buf, 0))
    }
    /// Sends `buf` and returns once it may be reused (`MPI_Send`); panics on error.
    fn send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) {
        fatal(self.try_send_with_tag(buf, tag))
    }
    /// Sends and returns once the receiver has matched it (`MPI_Ssend`); panics on error.
    fn synchronous_send<B: Buffer + ?Sized>(&self, buf: &B) {
        fatal(self.try_synchronous_send_with_tag(buf, 0))
    }
    /// [`Destination::synchronous_send`] with a tag; panics on error.
    fn synchronous_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) {
        fatal(self.try_synchronous_send_with_tag(buf, tag))
    }
    /// Copies `buf` into the attached buffer and returns (`MPI_Bsend`); the copy leaves
    /// while later calls run. Panics on error, as when the attached buffer
    /// ([`crate::Universe::set_buffer_size`]) is too small.
    fn buffered_send<B: Buffer + ?Sized>(&self, buf: &B) {
        fatal(self.try_buffered_send_with_tag(buf, 0))
    }
    /// [`Destination::buffered_send`] with a tag.
    fn buffered_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) {
        fatal(self.try_buffered_send_with_tag(buf, tag))
    }
    /// Sends to a receive that must already be posted (`MPI_Rsend`). pagewire sends it as a
    /// standard send, which MPI allows.
    ///
    /// # Safety
    ///
    /// As rsmpi's: the matching receive must be posted (not checked here).
    #[allow(unsafe_code)]
    unsafe fn ready_send<B: Buffer + ?Sized>(&self, buf: &B) {
        fatal(self.try_send_with_tag(buf, 0))
    }
    /// [`Destination::ready_send`] with a tag.
    ///
    /// # Safety
    ///
    /// As [`Destination::ready_send`].
    #[allow(unsafe_code)]
    unsafe fn ready_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) {
        fatal(self.try_send_with_tag(buf, tag))
    }
    /// Starts sending `buf` (`MPI_Isend`); the request borrows it until it completes.
    fn immediate_send<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_send_with_tag(scope, buf, 0))
    }
    /// [`Destination::immediate_send`] with a tag.
    fn immediate_send_with_tag<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
        tag: Tag,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_send_with_tag(scope, buf, tag))
    }
    /// Starts a synchronous send (`MPI_Issend`).
    fn immediate_synchronous_send<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_synchronous_send_with_tag(scope, buf, 0))
    }
    /// [`Destination::immediate_synchronous_send`] with a tag.
    fn immediate_synchronous_send_with_tag<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
        tag: Tag,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_synchronous_send_with_tag(scope, buf, tag))
    }
    /// Starts a ready send (`MPI_Irsend`), sent as a standard one.
    ///
    /// # Safety
    ///
    /// As [`Destination::ready_send`].
    #[allow(unsafe_code)]
    unsafe fn immediate_ready_send<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_send_with_tag(scope, buf, 0))
    }
    /// [`Destination::immediate_ready_send`] with a tag.
    ///
    /// # Safety
    ///
    /// As [`Destination::ready_send`].
    #[allow(unsafe_code)]
    unsafe fn immediate_ready_send_with_tag<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
        tag: Tag,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_send_with_tag(scope, buf, tag))
    }

    /// A persistent send of `buf` (`MPI_Send_init`): started and completed any number of
    /// times ([`PersistentRequest::start`], [`PersistentRequest::wait`]); the buffer's data
    /// may change between starts ([`PersistentRequest::buffer_mut`]). Panics on error.
    fn send_init<'a, S: Scope<'a> + Copy, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
    ) -> PersistentRequest<'a, B, S> {
        fatal(self.try_send_init_with_tag(scope, buf, 0))
    }
    /// [`Destination::send_init`] with a tag.
    fn send_init_with_tag<'a, S: Scope<'a> + Copy, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
        tag: Tag,
    ) -> PersistentRequest<'a, B, S> {
        fatal(self.try_send_init_with_tag(scope, buf, tag))
    }
    /// A persistent synchronous send (`MPI_Ssend_init`).
    fn synchronous_send_init<'a, S: Scope<'a> + Copy, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
    ) -> PersistentRequest<'a, B, S> {
        fatal(self.try_synchronous_send_init_with_tag(scope, buf, 0))
    }
    /// `send_init_with_tag`, returning errors.
    fn try_send_init_with_tag<'a, S: Scope<'a> + Copy, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
        tag: Tag,
    ) -> Result<PersistentRequest<'a, B, S>> {
        let dest = self.destination()?;
        persistent::send(
            self.destination_comm().backend(),
            (dest, tag, false),
            scope,
            buf,
        )
    }
    /// `synchronous_send_init` with a tag, returning errors.
    fn try_synchronous_send_init_with_tag<'a, S: Scope<'a> + Copy, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
        tag: Tag,
    ) -> Result<PersistentRequest<'a, B, S>> {
        let dest = self.destination()?;
        persistent::send(
            self.destination_comm().backend(),
            (dest, tag, true),
            scope,
            buf,
        )
    }

    /// `send_with_tag`, returning errors.
    fn try_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        send_and_wait(
            self.destination_comm().backend(),
            self.destination()?,
            tag,
            buf,
            false,
        )
    }
    /// `synchronous_send_with_tag`, returning errors.
    fn try_synchronous_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        send_and_wait(
            self.destination_comm().backend(),
            self.destination()?,
            tag,
            buf,
            true,
        )
    }
    /// `buffered_send_with_tag`, returning errors.
    fn try_buffered_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        let dest = self.destination()?;
        let copy = packed(buf).into_owned();
        buffered_send(self.destination_comm().backend(), dest, tag, copy)
    }
    /// `immediate_send_with_tag`, returning errors.
    fn try_immediate_send_with_tag<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
        tag: Tag,
    ) -> Result<Request<'a, B, S>> {
        immediate_send(self, scope, buf, tag, false)
    }
    /// `immediate_synchronous_send_with_tag`, returning errors.
    fn try_immediate_synchronous_send_with_tag<'a, S: Scope<'a>, B: Buffer + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a B,
        tag: Tag,
    ) -> Result<Request<'a, B, S>> {
        immediate_send(self, scope, buf, tag, true)
    }
}

/// Sends `buf` to rank `dest` of the communicator on `backend` and waits (synchronous when
/// `sync`). A buffer with gaps goes as it is when the backend takes it in place, else packed.
fn send_and_wait<B: Buffer + ?Sized>(
    backend: &CommBackend,
    dest: usize,
    tag: Tag,
    buf: &B,
    sync: bool,
) -> Result<()> {
    if buf.as_datatype().type_map().is_contiguous() {
        return backend.send(dest, tag, &packed(buf), sync).map(|_| ());
    }
    request::start_buffer_send(backend, dest, tag, buf, sync)?
        .wait()
        .map(|_| ())
}

/// Starts a send of `buf` to `dest` (synchronous when `sync`).
fn immediate_send<'a, D, S, B>(
    dest: &D,
    scope: S,
    buf: &'a B,
    tag: Tag,
    sync: bool,
) -> Result<Request<'a, B, S>>
where
    D: Destination + ?Sized,
    S: Scope<'a>,
    B: Buffer + ?Sized + 'a,
{
    let rank = dest.destination()?;
    let backend = dest.destination_comm().backend();
    let op = request::start_buffer_send(backend, rank, tag, buf, sync)?;
    Ok(Request::new(op, scope, buf))
}

impl Destination for Process<'_> {
    fn destination(&self) -> Result<usize> {
        rank_of(self.comm, self.rank)
    }
    fn destination_comm(&self) -> &SimpleCommunicator {
        self.comm
    }
}
