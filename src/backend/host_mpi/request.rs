//! The host MPI library's nonblocking requests ([`HostRequest`], `MPI_Request`) and the
//! messages its matched probes take out of matching ([`HostMessage`], `MPI_Message`).

use pagewire_transport::msg::raw::UserBufMut;
use pagewire_transport::msg::Status;

use super::ffi;
use crate::error::Result;

/// A message that [`HostMpi::improbe`](super::HostMpi::improbe) took out of matching
/// (`MPI_Message`).
///
/// Dropping one that was not received receives it into a scratch buffer and discards it
/// (unless MPI is already finalised), so its sender is never left waiting.
#[derive(Debug)]
pub struct HostMessage {
    raw: ffi::Message,
    len: usize,
}

impl HostMessage {
    /// The message `raw`, `len` bytes long.
    pub(super) fn new(raw: ffi::Message, len: usize) -> HostMessage {
        HostMessage { raw, len }
    }

    /// Receives the message into `buf` (`MPI_Mrecv`). A longer message is an
    /// [`Error::Mpi`](crate::Error::Mpi) of class `MPI_ERR_TRUNCATE`, as for
    /// [`HostMpi::recv`](super::HostMpi::recv).
    pub fn receive(mut self, buf: &mut [u8]) -> Result<Status> {
        ffi::mrecv(&mut self.raw, buf)
    }

    /// Starts receiving the message into `buf` (`MPI_Imrecv`). The caller keeps the buffer
    /// alive and untouched until the request completes, as `UserBufMut::new` requires.
    pub fn immediate_receive(mut self, buf: UserBufMut) -> Result<HostRequest> {
        let len = buf.len();
        let raw = ffi::imrecv(&mut self.raw, buf)?;
        Ok(HostRequest::receive(raw, len))
    }
}

impl Drop for HostMessage {
    fn drop(&mut self) {
        if ffi::is_null_message(&self.raw) || ffi::is_finalized() {
            return;
        }
        let mut scratch = vec![0u8; self.len];
        // Nobody wants the message; a failure leaves nothing more to do with it.
        let _ = ffi::mrecv(&mut self.raw, &mut scratch);
    }
}

/// What a [`HostRequest`] does.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Send { dest: i32, tag: i32, len: usize },
    Recv { cap: usize },
}

/// A nonblocking send or receive in the host MPI library (`MPI_Request`).
///
/// Dropping one that has not completed cancels a receive (`MPI_Cancel`, then waits for the
/// cancellation) and waits for a send, as the facade's requests do, so MPI never touches
/// the buffer after the request is gone.
#[derive(Debug)]
pub struct HostRequest {
    raw: ffi::Request,
    kind: Kind,
}

impl HostRequest {
    /// The request `raw` of a send of `len` bytes to `dest` with `tag`.
    pub(super) fn send(raw: ffi::Request, dest: i32, tag: i32, len: usize) -> HostRequest {
        HostRequest {
            raw,
            kind: Kind::Send { dest, tag, len },
        }
    }

    /// The request `raw` of a receive into `cap` bytes.
    pub(super) fn receive(raw: ffi::Request, cap: usize) -> HostRequest {
        HostRequest {
            raw,
            kind: Kind::Recv { cap },
        }
    }

    /// Waits for completion (`MPI_Wait`). A send's status names its destination, tag and
    /// size.
    pub fn wait(&mut self) -> Result<Status> {
        let cap = self.cap();
        let r = ffi::wait(&mut self.raw, cap);
        self.finish(r)
    }

    /// `Some` once complete (`MPI_Test`).
    pub fn test(&mut self) -> Result<Option<Status>> {
        let cap = self.cap();
        match ffi::test(&mut self.raw, cap) {
            Ok(None) => Ok(None),
            Ok(Some(s)) => self.finish(Ok(s)).map(Some),
            Err(e) => Err(e),
        }
    }

    /// Whether the operation has finished, without completing the request
    /// (`MPI_Request_get_status`): a later [`HostRequest::wait`] or [`HostRequest::test`]
    /// returns at once. An error counts as finished; completing reports it.
    pub fn is_done(&self) -> bool {
        self.is_complete() || ffi::is_done(&self.raw)
    }

    /// True once the request has completed (or failed) and freed its `MPI_Request`.
    pub fn is_complete(&self) -> bool {
        ffi::is_null(&self.raw)
    }

    /// Asks MPI to cancel a receive (`MPI_Cancel`); true if it was asked. Its wait then
    /// completes it, cancelled or (if a message matched first) received.
    pub fn cancel(&mut self) -> bool {
        if ffi::is_null(&self.raw) || !matches!(self.kind, Kind::Recv { .. }) {
            return false;
        }
        ffi::cancel(&mut self.raw);
        true
    }

    fn cap(&self) -> usize {
        match self.kind {
            Kind::Send { .. } => 0,
            Kind::Recv { cap } => cap,
        }
    }

    fn finish(&self, r: Result<Status>) -> Result<Status> {
        match (self.kind, r) {
            (Kind::Send { dest, tag, len }, Ok(_)) => Ok(Status {
                source: dest as usize,
                tag,
                count: len,
            }),
            (_, r) => r,
        }
    }
}

impl Drop for HostRequest {
    fn drop(&mut self) {
        if ffi::is_null(&self.raw) || ffi::is_finalized() {
            return;
        }
        if matches!(self.kind, Kind::Recv { .. }) {
            ffi::cancel(&mut self.raw);
        }
        let cap = self.cap();
        let _ = ffi::wait(&mut self.raw, cap);
    }
}
