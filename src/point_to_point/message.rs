//! Matched probes' messages (`MPI_Message`, `MPI_Mrecv`).

use crate::backend::{MatchedMessage, MessageBackend};
use crate::datatype::{vec_from_packed, BufferMut, Equivalence, Landing};
use crate::error::{fatal, Result};
use crate::request::{self, Request, Scope};
use crate::status::Status;

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
    pub(super) matched: Option<MatchedMessage>,
    pub(super) status: Status,
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
        // Gaps: in place or through a scratch message, as the backend takes them.
        request::start_matched_receive(matched, landing)?.wait()
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
