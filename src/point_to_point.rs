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

use std::borrow::Cow;
use std::cell::RefCell;

use pagewire_transport::msg;

use crate::backend::{
    CommBackend, CommunicatorBackend, MatchedMessage, MessageBackend, PointToPointBackend,
};
use crate::datatype::{
    packed, vec_from_packed, Buffer, BufferMut, Equivalence, Landing, UncommittedDatatype,
};
use crate::error::{fatal, Error, Result};
use crate::request::{self, OwnedReceive, Pending, Request, Scope};
use crate::topology::{Rank, SimpleCommunicator, Tag};

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

    /// `send_with_tag`, returning errors.
    fn try_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        let dest = self.destination()?;
        let backend = self.destination_comm().backend();
        backend.send(dest, tag, &packed(buf), false).map(|_| ())
    }
    /// `synchronous_send_with_tag`, returning errors.
    fn try_synchronous_send_with_tag<B: Buffer + ?Sized>(&self, buf: &B, tag: Tag) -> Result<()> {
        let dest = self.destination()?;
        let backend = self.destination_comm().backend();
        backend.send(dest, tag, &packed(buf), true).map(|_| ())
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
    let op = request::start_send(backend, rank, tag, packed(buf), sync)?;
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

/// Receives into `landing` from `src` (or any) with `tag` (or any) and waits.
fn receive_into_landing(
    backend: &CommBackend,
    src: Option<usize>,
    tag: Option<Tag>,
    mut landing: Landing<'_>,
) -> Result<Status> {
    if let Some(bytes) = landing.contiguous() {
        return backend.receive(src, tag, bytes).map(Status::new);
    }
    let mut scratch = vec![0u8; landing.packed_len()];
    let status = backend.receive(src, tag, &mut scratch).map(Status::new)?;
    landing.unpack(&scratch[..status.count_bytes().min(scratch.len())]);
    Ok(status)
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
        fatal(self.try_receive_with_tag(None))
    }
    /// Receives one value with `tag`; panics on error.
    fn receive_with_tag<T: Equivalence>(&self, tag: Tag) -> (T, Status) {
        fatal(self.try_receive_with_tag(Some(tag)))
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
    fn immediate_receive_into<'a, S: Scope<'a>, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_receive_into_with_tag(scope, buf, None))
    }
    /// [`Source::immediate_receive_into`] for messages with `tag`.
    fn immediate_receive_into_with_tag<'a, S: Scope<'a>, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
        tag: Tag,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_receive_into_with_tag(scope, buf, Some(tag)))
    }
    /// Starts receiving one value into memory of its own (rsmpi's `immediate_receive`):
    /// the [`ReceiveFuture`] gives it once it has arrived.
    fn immediate_receive<T: Equivalence>(&self) -> ReceiveFuture<T> {
        fatal(self.try_immediate_receive_with_tag(None))
    }
    /// [`Source::immediate_receive`] for messages with `tag`.
    fn immediate_receive_with_tag<T: Equivalence>(&self, tag: Tag) -> ReceiveFuture<T> {
        fatal(self.try_immediate_receive_with_tag(Some(tag)))
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
        receive_into_landing(self.comm().backend(), src, tag, Landing::new(buf))
    }
    /// `receive_with_tag`, returning errors.
    fn try_receive_with_tag<T: Equivalence>(&self, tag: Option<Tag>) -> Result<(T, Status)> {
        let (message, status) = self.try_matched_probe_with_tag(tag)?;
        let (mut v, status2) = message.try_matched_receive_vec::<T>()?;
        if v.len() != 1 {
            return Err(Error::InvalidArgument(format!(
                "receive of one value got a message of {} bytes",
                status.count_bytes()
            )));
        }
        Ok((v.remove(0), status2))
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
    fn try_immediate_receive_into_with_tag<'a, S: Scope<'a>, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
        tag: Option<Tag>,
    ) -> Result<Request<'a, B, S>> {
        let src = self.source()?;
        let data: *const B = &*buf;
        let op = request::start_receive(self.comm().backend(), src, tag, Landing::new(buf))?;
        Ok(Request::new(op, scope, data))
    }
    /// `immediate_receive_with_tag`, returning errors.
    fn try_immediate_receive_with_tag<T: Equivalence>(
        &self,
        tag: Option<Tag>,
    ) -> Result<ReceiveFuture<T>> {
        let size = T::equivalent_datatype().type_map().size();
        let src = self.source()?;
        let receive = OwnedReceive::start(self.comm().backend(), src, tag, size)?;
        Ok(ReceiveFuture {
            receive,
            _type: std::marker::PhantomData,
        })
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

/// One value being received into memory of its own (rsmpi's `ReceiveFuture`, made by
/// [`Source::immediate_receive`]).
#[must_use = "a receive future is completed with get or try"]
pub struct ReceiveFuture<T> {
    receive: OwnedReceive,
    _type: std::marker::PhantomData<T>,
}

impl<T: Equivalence> ReceiveFuture<T> {
    /// Waits for the value; panics on error.
    pub fn get(self) -> (T, Status) {
        let (bytes, status) = fatal(self.receive.wait());
        (one_value(&bytes), status)
    }

    /// The value if it has arrived, else the future back (rsmpi's `try`).
    pub fn r#try(self) -> std::result::Result<(T, Status), Self> {
        match fatal(self.receive.test()) {
            Ok((bytes, status)) => Ok((one_value(&bytes), status)),
            Err(receive) => Err(ReceiveFuture {
                receive,
                _type: std::marker::PhantomData,
            }),
        }
    }
}

/// The one value of type `T` in a packed message; panics if it holds another number.
fn one_value<T: Equivalence>(bytes: &[u8]) -> T {
    let mut v = vec_from_packed::<T>(bytes);
    assert_eq!(
        v.len(),
        1,
        "pagewire: a receive of one value got {} bytes",
        bytes.len()
    );
    v.remove(0)
}

/// Sends `msg` to `destination` and receives into `buf` from `source`, without deadlock
/// whatever the others do (`MPI_Sendrecv`); panics on error.
pub fn send_receive_into<M, D, B, S>(msg: &M, destination: &D, buf: &mut B, source: &S) -> Status
where
    M: Buffer + ?Sized,
    D: Destination,
    B: BufferMut + ?Sized,
    S: Source,
{
    send_receive_into_with_tags(msg, destination, 0, buf, source, None)
}

/// [`send_receive_into`] with a send tag and a receive tag (`None`: any).
pub fn send_receive_into_with_tags<M, D, B, S>(
    msg: &M,
    destination: &D,
    send_tag: Tag,
    buf: &mut B,
    source: &S,
    receive_tag: Option<Tag>,
) -> Status
where
    M: Buffer + ?Sized,
    D: Destination,
    B: BufferMut + ?Sized,
    S: Source,
{
    request::scope(|scope| {
        let send = destination.immediate_send_with_tag(scope, msg, send_tag);
        let status = fatal(source.try_receive_into_with_tag(buf, receive_tag));
        send.wait();
        status
    })
}

/// Sends `msg` to `destination` and receives one value from `source` (`MPI_Sendrecv`).
pub fn send_receive<R, M, D, S>(msg: &M, destination: &D, source: &S) -> (R, Status)
where
    R: Equivalence,
    M: Buffer + ?Sized,
    D: Destination,
    S: Source,
{
    request::scope(|scope| {
        let send = destination.immediate_send(scope, msg);
        let received = source.receive::<R>();
        send.wait();
        received
    })
}

/// Sends `buf` to `destination` and receives into it from `source`
/// (`MPI_Sendrecv_replace`).
pub fn send_receive_replace_into<B, D, S>(buf: &mut B, destination: &D, source: &S) -> Status
where
    B: Buffer + BufferMut + ?Sized,
    D: Destination,
    S: Source,
{
    let copy: Vec<u8> = packed(buf).into_owned();
    let dest = fatal(destination.destination());
    let backend = destination.destination_comm().backend();
    let mut op = fatal(request::start_send(
        backend,
        dest,
        0,
        Cow::Owned(copy),
        false,
    ));
    let status = fatal(source.try_receive_into_with_tag(buf, None));
    fatal(op.wait());
    status
}

/// The buffer attached for buffered sends (`MPI_Buffer_attach`) and the sends in it.
#[derive(Default)]
struct Attached {
    capacity: usize,
    /// Each send's operation and bytes (the operation owns its copy).
    sends: Vec<(Box<dyn Pending>, usize)>,
}

thread_local! {
    static ATTACHED: RefCell<Attached> = RefCell::new(Attached::default());
}

/// Forgets the sends of the attached buffer that have left.
fn reap_buffered(a: &mut Attached) -> Result<()> {
    let mut kept = Vec::with_capacity(a.sends.len());
    for (mut op, n) in a.sends.drain(..) {
        if op.test()?.is_none() {
            kept.push((op, n));
        }
    }
    a.sends = kept;
    Ok(())
}

/// Starts a buffered send of `copy`, counted against the attached buffer.
fn buffered_send(backend: &CommBackend, dest: usize, tag: Tag, copy: Vec<u8>) -> Result<()> {
    ATTACHED.with(|a| {
        let mut a = a.borrow_mut();
        reap_buffered(&mut a)?;
        let used: usize = a.sends.iter().map(|(_, n)| n).sum();
        if used + copy.len() > a.capacity {
            return Err(Error::InvalidArgument(format!(
                "buffered send of {} bytes: the attached buffer has {} of {} bytes free \
                 (Universe::set_buffer_size)",
                copy.len(),
                a.capacity - used.min(a.capacity),
                a.capacity
            )));
        }
        let n = copy.len();
        let op = request::start_send(backend, dest, tag, Cow::Owned(copy), false)?;
        a.sends.push((op, n));
        Ok(())
    })
}

/// Attaches a buffer of `size` bytes for buffered sends, after detaching the one before.
pub(crate) fn attach_buffer(size: usize) {
    fatal(detach_buffer());
    ATTACHED.with(|a| a.borrow_mut().capacity = size);
}

/// The attached buffer's size.
pub(crate) fn attached_buffer_size() -> usize {
    ATTACHED.with(|a| a.borrow().capacity)
}

/// Waits for every buffered send, then detaches the buffer.
pub(crate) fn detach_buffer() -> Result<()> {
    let sends = ATTACHED.with(|a| {
        let mut a = a.borrow_mut();
        a.capacity = 0;
        std::mem::take(&mut a.sends)
    });
    for (mut op, _) in sends {
        op.wait()?;
    }
    Ok(())
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
        let (mut v, s) = fatal(self.try_matched_receive_vec::<T>());
        assert_eq!(
            v.len(),
            1,
            "pagewire: a receive of one value got {} values",
            v.len()
        );
        (v.remove(0), s)
    }

    /// Receives the message into a vector of its length; panics on error.
    pub fn matched_receive_vec<T: Equivalence>(self) -> (Vec<T>, Status) {
        fatal(self.try_matched_receive_vec())
    }

    /// Starts receiving the message into `buf` (`MPI_Imrecv`); the request borrows it
    /// until it completes.
    pub fn immediate_matched_receive_into<'a, S: Scope<'a>, B: BufferMut + ?Sized + 'a>(
        self,
        scope: S,
        buf: &'a mut B,
    ) -> Request<'a, B, S> {
        fatal(self.try_immediate_matched_receive_into(scope, buf))
    }

    /// [`Message::matched_receive_into`], returning errors.
    pub fn try_matched_receive_into<B: BufferMut + ?Sized>(
        mut self,
        buf: &mut B,
    ) -> Result<Status> {
        let matched = self.matched.take().expect("an unreceived message");
        let mut landing = Landing::new(buf);
        if let Some(bytes) = landing.contiguous() {
            return matched.receive(bytes).map(Status::new);
        }
        let mut scratch = vec![0u8; landing.packed_len()];
        let status = matched.receive(&mut scratch).map(Status::new)?;
        landing.unpack(&scratch[..status.count_bytes().min(scratch.len())]);
        Ok(status)
    }

    /// [`Message::matched_receive_vec`], returning errors.
    pub fn try_matched_receive_vec<T: Equivalence>(mut self) -> Result<(Vec<T>, Status)> {
        let matched = self.matched.take().expect("an unreceived message");
        let mut bytes = vec![0u8; self.status.count_bytes()];
        let status = matched.receive(&mut bytes).map(Status::new)?;
        Ok((vec_from_packed(&bytes[..status.count_bytes()]), status))
    }

    /// [`Message::immediate_matched_receive_into`], returning errors.
    pub fn try_immediate_matched_receive_into<'a, S: Scope<'a>, B: BufferMut + ?Sized + 'a>(
        mut self,
        scope: S,
        buf: &'a mut B,
    ) -> Result<Request<'a, B, S>> {
        let matched = self.matched.take().expect("an unreceived message");
        let data: *const B = &*buf;
        let op = request::start_matched_receive(matched, Landing::new(buf))?;
        Ok(Request::new(op, scope, data))
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
