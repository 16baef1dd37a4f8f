//! Point-to-point communication (rsmpi's `point_to_point`): `Destination` and `Source`
//! on processes of a communicator.

use pagewire_transport::msg;

use crate::datatype::{Buffer, BufferMut, Equivalence};
use crate::request::{self, LocalScope, Request};
use crate::topology::{Rank, SimpleCommunicator, Tag};
use crate::{Error, Result};

/// What a completed receive reports (`MPI_Status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub(crate) inner: msg::Status,
}

impl Status {
    /// The sender's rank.
    pub fn source_rank(&self) -> Rank {
        self.inner.source as Rank
    }
    /// The message's tag.
    pub fn tag(&self) -> Tag {
        self.inner.tag
    }
    /// Bytes received.
    pub fn count_bytes(&self) -> usize {
        self.inner.count
    }
    /// Elements of type `T` received.
    pub fn count<T: Equivalence>(&self) -> usize {
        self.inner.count / std::mem::size_of::<T>().max(1)
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

fn rank_of(comm: &SimpleCommunicator, rank: Rank) -> Result<usize> {
    use crate::topology::Communicator;
    if rank < 0 || rank >= comm.size() {
        return Err(Error::NoSuchRank {
            rank: rank.max(0) as usize,
            size: comm.size() as usize,
        });
    }
    Ok(rank as usize)
}

fn fatal<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("pagewire: {e}"))
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
        request::blocking_send(self.comm, dest, tag, buf.as_bytes(), false).map(|_| ())
    }

    fn try_synchronous_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        let dest = rank_of(self.comm, self.rank)?;
        request::blocking_send(self.comm, dest, tag, buf.as_bytes(), true).map(|_| ())
    }

    fn try_immediate_send_impl<'a, 's>(
        &self,
        scope: &'s LocalScope<'a>,
        bytes: &'a [u8],
        tag: Tag,
        sync: bool,
    ) -> Result<Request<'a, 's>> {
        let dest = rank_of(self.comm, self.rank)?;
        request::immediate_send(self.comm, scope, dest, tag, bytes, sync)
    }
}

/// Receiving (rsmpi's `Source`).
pub trait Source {
    /// The source rank, or `None` for any.
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

    /// `receive_into_with_tag`, returning errors (`tag` `None`: any tag).
    fn try_receive_into_with_tag<B: BufferMut + ?Sized>(
        &self,
        buf: &mut B,
        tag: Option<Tag>,
    ) -> Result<Status> {
        let src = self.source()?;
        request::blocking_receive(self.comm(), src, tag, buf.as_bytes_mut())
    }
    /// `receive_vec_with_tag`, returning errors.
    fn try_receive_vec_with_tag<T: Equivalence>(
        &self,
        tag: Option<Tag>,
    ) -> Result<(Vec<T>, Status)> {
        let probed = self.try_probe_with_tag(tag)?;
        let n = probed
            .count_bytes()
            .div_ceil(std::mem::size_of::<T>().max(1));
        let mut v = vec![T::zeroed(); n];
        // Receive exactly the probed message: same source and tag (non-overtaking keeps the
        // first match the same).
        let src = Some(probed.inner.source);
        let s = request::blocking_receive(self.comm(), src, Some(probed.tag()), v.as_bytes_mut())?;
        Ok((v, s))
    }
    /// `immediate_receive_into_with_tag`, returning errors.
    fn try_immediate_receive_into_with_tag<'a, 's, B: BufferMut + ?Sized>(
        &self,
        scope: &'s LocalScope<'a>,
        buf: &'a mut B,
        tag: Option<Tag>,
    ) -> Result<Request<'a, 's>> {
        let src = self.source()?;
        request::immediate_receive(self.comm(), scope, src, tag, buf.as_bytes_mut())
    }
    /// `probe_with_tag`, returning errors.
    fn try_probe_with_tag(&self, tag: Option<Tag>) -> Result<Status> {
        loop {
            if let Some(s) = self.try_immediate_probe_with_tag(tag)? {
                return Ok(s);
            }
        }
    }
    /// `immediate_probe`, returning errors.
    fn try_immediate_probe_with_tag(&self, tag: Option<Tag>) -> Result<Option<Status>> {
        let src = self.source()?;
        let c = self.comm();
        let r = c.inner.p2p.borrow_mut().iprobe(src, tag, c.context)?;
        Ok(r.map(|inner| Status { inner }))
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
