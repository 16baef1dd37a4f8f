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

use crate::backend::{MatchedMessage, MessageBackend, PointToPointBackend};
use crate::datatype::{Buffer, BufferMut, Equivalence};
use crate::error::{fatal, Error, Result};
use crate::request::{self, LocalScope, Request};
use crate::topology::{Communicator, Rank, SimpleCommunicator, Tag};

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
    if rank < 0 || rank >= comm.size() {
        return Err(Error::NoSuchRank {
            rank: rank.max(0) as usize,
            size: comm.size() as usize,
        });
    }
    Ok(rank as usize)
}

/// Sending (rsmpi's `Destination`).
pub trait Destination {
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
    /// Starts sending `buf` (`MPI_Isend`); the request borrows it until it completes.
    fn immediate_send<'a, 's, B: Buffer + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a B,
    ) -> Request<'a, 's> {
        fatal(self.try_immediate_send_with_tag(scope, buf, 0))
    }
    /// [`Destination::immediate_send`] with a tag.
    fn immediate_send_with_tag<'a, 's, B: Buffer + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a B,
        tag: Tag,
    ) -> Request<'a, 's> {
        fatal(self.try_immediate_send_with_tag(scope, buf, tag))
    }
    /// Starts a synchronous send (`MPI_Issend`).
    fn immediate_synchronous_send<'a, 's, B: Buffer + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a B,
    ) -> Request<'a, 's> {
        fatal(self.try_immediate_send_impl(scope, buf.as_bytes(), 0, true))
    }

    /// `send_with_tag`, returning errors.
    fn try_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()>;
    /// `synchronous_send_with_tag`, returning errors.
    fn try_synchronous_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()>;
    /// `immediate_send_with_tag`, returning errors.
    fn try_immediate_send_with_tag<'a, 's, B: Buffer + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a B,
        tag: Tag,
    ) -> Result<Request<'a, 's>> {
        self.try_immediate_send_impl(scope, buf.as_bytes(), tag, false)
    }
    /// Starts a send of raw bytes.
    fn try_immediate_send_impl<'a, 's>(
        &self,
        scope: &'s LocalScope<'a>,
        bytes: &'a [u8],
        tag: Tag,
        sync: bool,
    ) -> Result<Request<'a, 's>>;
}

impl Destination for Process<'_> {
    fn try_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        let dest = rank_of(self.comm, self.rank)?;
        let backend = self.comm.backend();
        backend.send(dest, tag, buf.as_bytes(), false).map(|_| ())
    }

    fn try_synchronous_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        let dest = rank_of(self.comm, self.rank)?;
        let backend = self.comm.backend();
        backend.send(dest, tag, buf.as_bytes(), true).map(|_| ())
    }

    fn try_immediate_send_impl<'a, 's>(
        &self,
        scope: &'s LocalScope<'a>,
        bytes: &'a [u8],
        tag: Tag,
        sync: bool,
    ) -> Result<Request<'a, 's>> {
        let dest = rank_of(self.comm, self.rank)?;
        request::immediate_send(self.comm.backend(), scope, dest, tag, bytes, sync)
    }
}

/// Receiving (rsmpi's `Source`).
pub trait Source {
    /// The source's rank in the communicator (checked), or `None` for any.
    fn source(&self) -> Result<Option<usize>>;
    /// The communicator.
    fn comm(&self) -> &SimpleCommunicator;

    /// Receives into `buf` with any tag (`MPI_Recv`); panics on error, including truncation.
    fn receive_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Status {
        fatal(self.try_receive_into_with_tag(buf, None))
    }
    /// Receives into `buf` a message with `tag`; panics on error.
    fn receive_into_with_tag<B: BufferMut + ?Sized>(&self, buf: &mut B, tag: Tag) -> Status {
        fatal(self.try_receive_into_with_tag(buf, Some(tag)))
    }
    /// Receives one value; panics on error.
    fn receive<T: Equivalence>(&self) -> (T, Status) {
        let mut v = T::zeroed();
        let s = fatal(self.try_receive_into_with_tag(&mut v, None));
        (v, s)
    }
    /// Receives one value with `tag`; panics on error.
    fn receive_with_tag<T: Equivalence>(&self, tag: Tag) -> (T, Status) {
        let mut v = T::zeroed();
        let s = fatal(self.try_receive_into_with_tag(&mut v, Some(tag)));
        (v, s)
    }
    /// Receives a message of any length into a new vector (probe, then receive); panics on
    /// error.
    fn receive_vec<T: Equivalence>(&self) -> (Vec<T>, Status) {
        fatal(self.try_receive_vec_with_tag(None))
    }
    /// [`Source::receive_vec`] for messages with `tag`.
    fn receive_vec_with_tag<T: Equivalence>(&self, tag: Tag) -> (Vec<T>, Status) {
        fatal(self.try_receive_vec_with_tag(Some(tag)))
    }
    /// Starts receiving into `buf` (`MPI_Irecv`); the request borrows it until it completes.
    fn immediate_receive_into<'a, 's, B: BufferMut + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a mut B,
    ) -> Request<'a, 's> {
        fatal(self.try_immediate_receive_into_with_tag(scope, buf, None))
    }
    /// [`Source::immediate_receive_into`] for messages with `tag`.
    fn immediate_receive_into_with_tag<'a, 's, B: BufferMut + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a mut B,
        tag: Tag,
    ) -> Request<'a, 's> {
        fatal(self.try_immediate_receive_into_with_tag(scope, buf, Some(tag)))
    }
    /// Waits for a matching message and reports it without receiving it (`MPI_Probe`).
    fn probe(&self) -> Status {
        fatal(self.try_probe_with_tag(None))
    }
    /// [`Source::probe`] for messages with `tag`.
    fn probe_with_tag(&self, tag: Tag) -> Status {
        fatal(self.try_probe_with_tag(Some(tag)))
    }
    /// Reports a matching message if one has arrived (`MPI_Iprobe`).
    fn immediate_probe(&self) -> Option<Status> {
        fatal(self.try_immediate_probe_with_tag(None))
    }
    /// [`Source::immediate_probe`] for messages with `tag`.
    fn immediate_probe_with_tag(&self, tag: Tag) -> Option<Status> {
        fatal(self.try_immediate_probe_with_tag(Some(tag)))
    }
    /// Waits for a matching message and takes it out of matching (`MPI_Mprobe`): no other
    /// receive or probe can match it, and the returned [`Message`] receives exactly it.
    /// Panics on error.
    fn matched_probe(&self) -> (Message, Status) {
        fatal(self.try_matched_probe_with_tag(None))
    }
    /// [`Source::matched_probe`] for messages with `tag`.
    fn matched_probe_with_tag(&self, tag: Tag) -> (Message, Status) {
        fatal(self.try_matched_probe_with_tag(Some(tag)))
    }
    /// [`Source::matched_probe`] if a matching message has arrived, else `None`
    /// (`MPI_Improbe`).
    fn immediate_matched_probe(&self) -> Option<(Message, Status)> {
        fatal(self.try_immediate_matched_probe_with_tag(None))
    }
    /// [`Source::immediate_matched_probe`] for messages with `tag`.
    fn immediate_matched_probe_with_tag(&self, tag: Tag) -> Option<(Message, Status)> {
        fatal(self.try_immediate_matched_probe_with_tag(Some(tag)))
    }

    /// `receive_into_with_tag`, returning errors (`tag` `None`: any tag).
    fn try_receive_into_with_tag<B: BufferMut + ?Sized>(
        &self,
        buf: &mut B,
        tag: Option<Tag>,
    ) -> Result<Status> {
        let src = self.source()?;
        let backend = self.comm().backend();
        backend
            .receive(src, tag, buf.as_bytes_mut())
            .map(Status::new)
    }
    /// `receive_vec_with_tag`, returning errors.
    fn try_receive_vec_with_tag<T: Equivalence>(
        &self,
        tag: Option<Tag>,
    ) -> Result<(Vec<T>, Status)> {
        let (message, _) = self.try_matched_probe_with_tag(tag)?;
        message.try_matched_receive_vec()
    }
    /// `immediate_receive_into_with_tag`, returning errors.
    fn try_immediate_receive_into_with_tag<'a, 's, B: BufferMut + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a mut B,
        tag: Option<Tag>,
    ) -> Result<Request<'a, 's>> {
        let src = self.source()?;
        request::immediate_receive(self.comm().backend(), scope, src, tag, buf.as_bytes_mut())
    }
    /// `probe_with_tag`, returning errors.
    fn try_probe_with_tag(&self, tag: Option<Tag>) -> Result<Status> {
        let mut idle = SenderWatch::new();
        loop {
            if let Some(s) = self.try_immediate_probe_with_tag(tag)? {
                return Ok(s);
            }
            idle.check(self)?;
        }
    }
    /// `immediate_probe`, returning errors.
    fn try_immediate_probe_with_tag(&self, tag: Option<Tag>) -> Result<Option<Status>> {
        let found = self.comm().backend().immediate_probe(self.source()?, tag)?;
        Ok(found.map(Status::new))
    }
    /// `matched_probe_with_tag`, returning errors.
    fn try_matched_probe_with_tag(&self, tag: Option<Tag>) -> Result<(Message, Status)> {
        let mut idle = SenderWatch::new();
        loop {
            if let Some(m) = self.try_immediate_matched_probe_with_tag(tag)? {
                return Ok(m);
            }
            idle.check(self)?;
        }
    }
    /// `immediate_matched_probe_with_tag`, returning errors.
    fn try_immediate_matched_probe_with_tag(
        &self,
        tag: Option<Tag>,
    ) -> Result<Option<(Message, Status)>> {
        let backend = self.comm().backend();
        let found = backend.immediate_matched_probe(self.source()?, tag)?;
        Ok(found.map(|(matched, status)| {
            let status = Status::new(status);
            let message = Message {
                matched: Some(matched),
                status,
            };
            (message, status)
        }))
    }
}

impl Source for Process<'_> {
    fn source(&self) -> Result<Option<usize>> {
        rank_of(self.comm, self.rank).map(Some)
    }
    fn comm(&self) -> &SimpleCommunicator {
        self.comm
    }
}

impl Source for AnyProcess<'_> {
    fn source(&self) -> Result<Option<usize>> {
        Ok(None)
    }
    fn comm(&self) -> &SimpleCommunicator {
        self.comm
    }
}
/// A message that a matched probe took out of matching (rsmpi's `Message`, `MPI_Message`):
/// only this handle can receive it, with [`Message::matched_receive_into`] and friends
/// (`MPI_Mrecv`, `MPI_Imrecv`).
///
/// Dropping a `Message` without receiving it receives the message into a scratch buffer and
/// discards it, so its sender is never left waiting (MPI calls dropping an
/// `MPI_Message` erroneous; rsmpi panics).
#[must_use = "a matched message is received with matched_receive_into or matched_receive_vec"]
pub struct Message {
    /// Where the message waits, until received; it keeps the universe running.
    matched: Option<MatchedMessage>,
    status: Status,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("handle", &self.matched)
            .field("status", &self.status)
            .finish()
    }
}

impl Message {
    /// What the matched probe reported: source, tag and size of the message.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Receives the message into `buf` (`MPI_Mrecv`); panics on error, including
    /// truncation.
    pub fn matched_receive_into<B: BufferMut + ?Sized>(self, buf: &mut B) -> Status {
        fatal(self.try_matched_receive_into(buf))
    }

    /// Receives the message as one value; panics on error.
    pub fn matched_receive<T: Equivalence>(self) -> (T, Status) {
        let mut v = T::zeroed();
        let s = fatal(self.try_matched_receive_into(&mut v));
        (v, s)
    }

    /// Receives the message into a vector of its length; panics on error.
    pub fn matched_receive_vec<T: Equivalence>(self) -> (Vec<T>, Status) {
        fatal(self.try_matched_receive_vec())
    }

    /// Starts receiving the message into `buf` (`MPI_Imrecv`); the request borrows it
    /// until it completes.
    pub fn immediate_matched_receive_into<'a, 's, B: BufferMut + ?Sized>(
        self,
        scope: &'s LocalScope<'a>,
        buf: &'a mut B,
    ) -> Request<'a, 's> {
        fatal(self.try_immediate_matched_receive_into(scope, buf))
    }

    /// [`Message::matched_receive_into`], returning errors.
    pub fn try_matched_receive_into<B: BufferMut + ?Sized>(
        mut self,
        buf: &mut B,
    ) -> Result<Status> {
        let matched = self.matched.take().expect("an unreceived message");
        matched.receive(buf.as_bytes_mut()).map(Status::new)
    }

    /// [`Message::matched_receive_vec`], returning errors.
    pub fn try_matched_receive_vec<T: Equivalence>(self) -> Result<(Vec<T>, Status)> {
        let n = self
            .status
            .count_bytes()
            .div_ceil(std::mem::size_of::<T>().max(1));
        let mut v = vec![T::zeroed(); n];
        let s = self.try_matched_receive_into(&mut v[..])?;
        Ok((v, s))
    }

    /// [`Message::immediate_matched_receive_into`], returning errors.
    pub fn try_immediate_matched_receive_into<'a, 's, B: BufferMut + ?Sized>(
        mut self,
        scope: &'s LocalScope<'a>,
        buf: &'a mut B,
    ) -> Result<Request<'a, 's>> {
        let matched = self.matched.take().expect("an unreceived message");
        request::immediate_matched_receive(scope, matched, buf.as_bytes_mut())
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        // An unreceived message is received into a scratch buffer and discarded by its
        // backend when dropped (see the type's documentation).
        drop(self.matched.take());
    }
}

/// Receiving the message of a matched probe's `(Message, Status)` into a vector, as rsmpi
/// writes it: `process.matched_probe().matched_receive_vec()`.
pub trait MatchedReceiveVec {
    /// Receives the message into a vector of its length; panics on error.
    fn matched_receive_vec<T: Equivalence>(self) -> (Vec<T>, Status);
}

impl MatchedReceiveVec for (Message, Status) {
    fn matched_receive_vec<T: Equivalence>(self) -> (Vec<T>, Status) {
        self.0.matched_receive_vec()
    }
}
