//! How the facade starts the operations requests stand for: sends and receives of borrowed
//! buffers (packed when their datatype has gaps, or lent in place), and the owned buffers
//! a receive or send keeps while its operation runs.
#![allow(unsafe_code)]

use super::{Operation, Pending, PointToPoint, Request, Scope};
use pagewire_transport::msg::raw::{Layout, UserBuf, UserBufMut};
use pagewire_transport::msg::RmaBuf;

use crate::backend::{
    CommBackend, MatchedMessage, MessageBackend, PendingRequest, PointToPointBackend,
};
use crate::datatype::{lend_gapped, packed, Landing};
use crate::error::Result;
use crate::status::Status;
use crate::topology::Tag;

/// Starts sending `bytes` (borrowed from the caller's buffer, or a packed copy of it) to
/// rank `dest` of the communicator on `backend`.
pub(crate) fn start_send<'a>(
    backend: &CommBackend,
    dest: usize,
    tag: Tag,
    bytes: std::borrow::Cow<'a, [u8]>,
    sync: bool,
) -> Result<Operation<'a>> {
    // SAFETY: the bytes are borrowed for `'a` or owned by the operation, which finishes
    // before either ends (see the module documentation).
    let buf = unsafe { UserBuf::new(bytes.as_ptr(), bytes.len()) };
    let request = backend.immediate_send(dest, tag, buf, sync)?;
    Ok(match bytes {
        std::borrow::Cow::Owned(v) => Operation::Boxed(Box::new(PointToPoint {
            request,
            _packed_send: Some(v),
            receive: None,
        })),
        std::borrow::Cow::Borrowed(_) => Operation::Direct(request),
    })
}

/// Starts sending `buf` to `dest`: the buffer itself when it has no gaps, or has gaps the
/// backend takes in place ([`PointToPointBackend::moves_in_place`]), else a packed copy.
pub(crate) fn start_buffer_send<'a, B: crate::datatype::Buffer + ?Sized>(
    backend: &CommBackend,
    dest: usize,
    tag: Tag,
    buf: &'a B,
    sync: bool,
) -> Result<Operation<'a>> {
    // SAFETY: `buf` is borrowed for `'a`, and the operation finishes before `'a` ends (see
    // the module documentation).
    if let Some(gapped) = unsafe { lend_gapped(buf, |l| backend.moves_in_place(l)) } {
        let request = backend.immediate_send(dest, tag, gapped, sync)?;
        return Ok(Operation::Direct(request));
    }
    start_send(backend, dest, tag, packed(buf), sync)
}

/// A caller's buffer a one-sided request moves: read by a put, written by a get.
pub(crate) enum OneSidedBuf<'a> {
    Put(&'a [u8]),
    Get(&'a mut [u8]),
}

/// Starts a one-sided operation (a window's `rput` or `rget`) on `buf`, borrowed for `'a`,
/// as a request of `scope` over `data` (what `wait_for_data` hands back): `start` gets the
/// buffer lent to the message layer and returns the operation, which must finish it before
/// its own drop returns, as every operation of a request does.
pub(crate) fn start_one_sided<'a, D: ?Sized, S: Scope<'a>>(
    scope: S,
    data: *const D,
    buf: OneSidedBuf<'a>,
    start: impl FnOnce(RmaBuf) -> Result<Box<dyn Pending + 'a>>,
) -> Result<Request<'a, D, S>> {
    // SAFETY: the bytes are borrowed for `'a`, and the operation becomes a request of
    // `scope`, which finishes it before `'a` ends (see the module documentation).
    let lent = unsafe {
        match buf {
            OneSidedBuf::Put(b) => RmaBuf::Put(UserBuf::new(b.as_ptr(), b.len())),
            OneSidedBuf::Get(b) => RmaBuf::Get(UserBufMut::new(b.as_mut_ptr(), b.len())),
        }
    };
    Ok(Request::new(start(lent)?, scope, data))
}

/// How a receive lands: the caller's memory itself (without gaps, or with gaps the backend
/// takes in place: `takes`), or a scratch message unpacked into it.
fn receive_target<'a>(
    mut landing: Landing<'a>,
    takes: impl FnOnce(&Layout) -> bool,
) -> (UserBufMut, Option<(Vec<u8>, Landing<'a>)>) {
    if let Some(bytes) = landing.contiguous() {
        // SAFETY: the landing's memory is exclusively borrowed for `'a`, and the operation
        // finishes before `'a` ends.
        let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
        return (buf, None);
    }
    // SAFETY: as above.
    if let Some(buf) = unsafe { landing.lend_gapped(takes) } {
        return (buf, None);
    }
    let mut scratch = vec![0u8; landing.packed_len()];
    // SAFETY: the scratch message is owned by the operation, declared after its request.
    let buf = unsafe { UserBufMut::new(scratch.as_mut_ptr(), scratch.len()) };
    (buf, Some((scratch, landing)))
}

/// Starts receiving into `landing` from rank `src` (or any) of the communicator on
/// `backend`.
pub(crate) fn start_receive<'a>(
    backend: &CommBackend,
    src: Option<usize>,
    tag: Option<Tag>,
    landing: Landing<'a>,
) -> Result<Operation<'a>> {
    let (buf, receive) = receive_target(landing, |l| backend.moves_in_place(l));
    let request = backend.immediate_receive(src, tag, buf)?;
    Ok(match receive {
        None => Operation::Direct(request),
        receive => Operation::Boxed(Box::new(PointToPoint {
            request,
            _packed_send: None,
            receive,
        })),
    })
}

/// Starts receiving the message a matched probe took out of matching into `landing`
/// (`MPI_Imrecv`).
pub(crate) fn start_matched_receive<'a>(
    message: MatchedMessage,
    landing: Landing<'a>,
) -> Result<Box<dyn Pending + 'a>> {
    let (buf, receive) = receive_target(landing, |l| message.moves_in_place(l));
    let request = message.immediate_receive(buf)?;
    Ok(Box::new(PointToPoint {
        request,
        _packed_send: None,
        receive,
    }))
}

/// A receive into memory of its own: what [`crate::point_to_point::ReceiveFuture`] waits
/// on. The request is declared first, so it finishes before the memory goes.
pub(crate) struct OwnedReceive {
    request: PendingRequest,
    bytes: Vec<u8>,
}

impl OwnedReceive {
    /// Starts receiving up to `len` bytes from rank `src` (or any) with `tag` (or any).
    pub(crate) fn start(
        backend: &CommBackend,
        src: Option<usize>,
        tag: Option<Tag>,
        len: usize,
    ) -> Result<OwnedReceive> {
        let mut bytes = vec![0u8; len];
        // SAFETY: the memory is owned by the operation, which finishes before it goes.
        let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
        let request = backend.immediate_receive(src, tag, buf)?;
        Ok(OwnedReceive { request, bytes })
    }

    /// Whether the message has arrived, without completing the receive.
    pub(crate) fn is_done(&mut self) -> bool {
        Pending::is_done(&mut self.request)
    }

    /// Waits for the message.
    pub(crate) fn wait(mut self) -> Result<(Vec<u8>, Status)> {
        let status = Pending::wait(&mut self.request)?;
        Ok((self.take_bytes(&status), status))
    }

    /// The message if it has arrived, else the receive back.
    pub(crate) fn test(mut self) -> Result<std::result::Result<(Vec<u8>, Status), Self>> {
        match Pending::test(&mut self.request)? {
            Some(status) => Ok(Ok((self.take_bytes(&status), status))),
            None => Ok(Err(self)),
        }
    }

    fn take_bytes(&mut self, status: &Status) -> Vec<u8> {
        let mut bytes = std::mem::take(&mut self.bytes);
        bytes.truncate(status.count_bytes());
        bytes
    }
}

/// A send of memory of its own: the messages of nonblocking collectives. The request is
/// declared first, so it finishes before the memory goes.
pub(crate) struct OwnedSend {
    request: Option<PendingRequest>,
    _bytes: Vec<u8>,
}

impl OwnedSend {
    /// Starts sending `bytes` to rank `dest` with `tag`.
    pub(crate) fn start(
        backend: &CommBackend,
        dest: usize,
        tag: Tag,
        bytes: Vec<u8>,
    ) -> Result<Self> {
        // SAFETY: the memory is owned by the operation, which finishes before it goes.
        let buf = unsafe { UserBuf::new(bytes.as_ptr(), bytes.len()) };
        let request = backend.immediate_send(dest, tag, buf, false)?;
        Ok(OwnedSend {
            request: Some(request),
            _bytes: bytes,
        })
    }

    /// Completes the send if it is done: true once it is (or was).
    pub(crate) fn test(&mut self) -> Result<bool> {
        let Some(request) = self.request.as_mut() else {
            return Ok(true);
        };
        match Pending::test(request)? {
            Some(_) => {
                self.request = None;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
