//! Receiving: [`Source`] on processes of a communicator and the futures of
//! `immediate_receive`.

use super::message::Message;
use super::{rank_of, SenderWatch};
use crate::backend::{CommBackend, PointToPointBackend};
use crate::datatype::{vec_from_packed, BufferMut, Equivalence, Landing, UncommittedDatatype};
use crate::error::{fatal, Error, Result};
use crate::request::{self, persistent, OwnedReceive, Pending, PersistentRequest, Request, Scope};
use crate::status::Status;
use crate::topology::communicator::{AnyProcess, Process};
use crate::topology::{SimpleCommunicator, Tag};

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
    // Gaps: in place or through a scratch message, as the backend takes them.
    request::start_receive(backend, src, tag, landing)?.wait()
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
    /// A persistent receive into `buf` (`MPI_Recv_init`): started and completed any number
    /// of times; the buffer is read between them ([`PersistentRequest::buffer`]). Panics on
    /// error.
    fn receive_init<'a, S: Scope<'a> + Copy, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
    ) -> PersistentRequest<'a, B, S> {
        fatal(self.try_receive_init_with_tag(scope, buf, None))
    }
    /// [`Source::receive_init`] for messages with `tag`.
    fn receive_init_with_tag<'a, S: Scope<'a> + Copy, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
        tag: Tag,
    ) -> PersistentRequest<'a, B, S> {
        fatal(self.try_receive_init_with_tag(scope, buf, Some(tag)))
    }
    /// `receive_init_with_tag`, returning errors.
    fn try_receive_init_with_tag<'a, S: Scope<'a> + Copy, B: BufferMut + ?Sized + 'a>(
        &self,
        scope: S,
        buf: &'a mut B,
        tag: Option<Tag>,
    ) -> Result<PersistentRequest<'a, B, S>> {
        let src = self.source()?;
        persistent::receive(self.comm().backend(), (src, tag), scope, buf)
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
