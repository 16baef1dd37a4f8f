//! Persistent requests (MPI-4 §3.9 and §6.13): an operation made once
//! (`send_init`, `receive_init`, `barrier_init`, `all_reduce_init`, ...), then started and
//! completed any number of times with [`PersistentRequest::start`] and
//! [`PersistentRequest::wait`] (or [`start_all`], [`wait_all`]).
//!
//! The request borrows its buffer for `'a` and lives in a scope, as a nonblocking request
//! does: each start is a request of that scope, so an operation still running when the
//! persistent request is dropped (or leaked) is finished before the scope ends. Between a
//! completion and the next start the buffer is the caller's again
//! ([`PersistentRequest::buffer`], [`PersistentRequest::buffer_mut`]): a send's data can be
//! changed for the next start, a receive's read.
//!
//! What is done once: a point-to-point request to a peer reached through the NIC prepares
//! its buffer when it is made (`PointToPoint::prepare_buffer`: the registration, held so it
//! is never evicted, in `pindown`; the pages prefetched in `odp`) and gives it back when it
//! is dropped. A persistent collective starts the nonblocking collective on each start; its
//! messages go through the library's own buffers, so there is nothing of the user's to
//! prepare.

use std::marker::PhantomData;

use super::{start_buffer_send, start_receive, Operation, Pending, Request, Scope, StaticScope};
use crate::backend::{CommBackend, CommunicatorBackend};
use crate::datatype::{packed, Buffer, BufferMut, Landing};
use crate::error::{fatal, Error, Result};
use crate::status::Status;
use crate::topology::Tag;
use crate::ErrorClass;
use pagewire_transport::buffer_mode::Direction;
use pagewire_transport::msg::PreparedBuffer;

/// What a persistent request starts each time: the operation on its buffer.
type Starter<'a> = Box<dyn FnMut() -> Result<Operation<'a>> + 'a>;

/// A persistent operation on a buffer of type `D` borrowed for `'a`, in scope `S`.
#[must_use = "a persistent request does nothing until it is started"]
pub struct PersistentRequest<'a, D: ?Sized, S: Scope<'a> + Copy = StaticScope> {
    /// The buffer; handed out only while no start of the operation is running.
    data: *mut D,
    _borrow: PhantomData<&'a mut D>,
    scope: S,
    starter: Starter<'a>,
    /// The running start, if any.
    active: Option<Request<'a, D, S>>,
    /// The buffer prepared once, and the backend to give it back to.
    prepared: Option<(CommBackend, PreparedBuffer)>,
}

impl<'a, D: ?Sized, S: Scope<'a> + Copy> std::fmt::Debug for PersistentRequest<'a, D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentRequest")
            .field("active", &self.active.is_some())
            .field("prepared", &self.prepared.is_some())
            .finish()
    }
}

impl<'a, D: ?Sized, S: Scope<'a> + Copy> PersistentRequest<'a, D, S> {
    /// A persistent request over the buffer at `data` (borrowed for `'a` by the caller)
    /// whose starts `starter` makes.
    fn from_raw(data: *mut D, scope: S, starter: Starter<'a>) -> Self {
        PersistentRequest {
            data,
            _borrow: PhantomData,
            scope,
            starter,
            active: None,
            prepared: None,
        }
    }

    /// Prepares `bytes` of the buffer once for the message layer of `backend`, if messages
    /// to `peer` go through the NIC there (pagewire's transport; nothing on the host MPI's).
    fn prepare(
        &mut self,
        backend: &CommBackend,
        peer: Option<usize>,
        bytes: (u64, usize),
        dir: Direction,
    ) -> Result<()> {
        let prepared = backend.with_message_layer(|p2p| {
            let through_nic = peer.is_none_or(|p| !p2p.is_local(p));
            if through_nic {
                p2p.prepare_buffer(bytes.0, bytes.1, dir)
            } else {
                Ok(None)
            }
        });
        match prepared {
            Ok(Ok(Some(p))) => self.prepared = Some((backend.clone(), p)),
            Ok(Err(e)) => return Err(e.into()),
            // No bytes or a local peer; or the host MPI's transport, which has no message
            // layer of pagewire's: nothing to prepare.
            Ok(Ok(None)) | Err(_) => {}
        }
        Ok(())
    }

    /// Starts the operation (`MPI_Start`). Panics on error.
    pub fn start(&mut self) {
        fatal(self.try_start())
    }

    /// [`PersistentRequest::start`], returning errors: a start while the previous one is
    /// still running is an [`Error::Invalid`] of class `MPI_ERR_REQUEST`.
    pub fn try_start(&mut self) -> Result<()> {
        if self.active.is_some() {
            return Err(Error::invalid(
                ErrorClass::Request,
                "start of a persistent request that is active (wait for it first)",
            ));
        }
        let op = (self.starter)()?;
        self.active = Some(Request::new(op, self.scope, self.data as *const D));
        Ok(())
    }

    /// Waits for the running start to complete (`MPI_Wait`); the request stays, inactive,
    /// for the next start. Panics on error, or if it was not started.
    pub fn wait(&mut self) -> Status {
        fatal(self.try_wait())
    }

    /// [`PersistentRequest::wait`], returning errors (a wait without a start is an
    /// [`Error::Invalid`] of class `MPI_ERR_REQUEST`).
    pub fn try_wait(&mut self) -> Result<Status> {
        match self.active.take() {
            Some(r) => r.try_wait(),
            None => Err(Error::invalid(
                ErrorClass::Request,
                "wait on a persistent request that is not started",
            )),
        }
    }

    /// Completes the running start if it is done (`MPI_Test`): `Some(status)`, else `None`
    /// (and `None` for a request not started). Panics on error.
    pub fn test(&mut self) -> Option<Status> {
        fatal(self.try_test())
    }

    /// [`PersistentRequest::test`], returning errors.
    pub fn try_test(&mut self) -> Result<Option<Status>> {
        let Some(r) = self.active.take() else {
            return Ok(None);
        };
        match r.try_test()? {
            Ok(status) => Ok(Some(status)),
            Err(r) => {
                self.active = Some(r);
                Ok(None)
            }
        }
    }

    /// Whether a start is running.
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Whether the buffer was prepared once for the NIC (a peer reached through it, in a
    /// mode that registers or prefetches).
    pub fn is_prepared(&self) -> bool {
        self.prepared.is_some()
    }

    /// The buffer, while no start is running (`None` while one is).
    pub fn buffer(&self) -> Option<&D> {
        // SAFETY: borrowed for `'a` by this request; no operation uses it while none runs.
        self.active.is_none().then(|| unsafe { &*self.data })
    }

    /// The buffer, to change (a send's data for the next start), while no start is running.
    pub fn buffer_mut(&mut self) -> Option<&mut D> {
        // SAFETY: as for `buffer`; `&mut self` keeps a start from beginning meanwhile.
        self.active.is_none().then(|| unsafe { &mut *self.data })
    }
}

impl<'a, D: ?Sized, S: Scope<'a> + Copy> Drop for PersistentRequest<'a, D, S> {
    fn drop(&mut self) {
        // A running start is finished (waited for, or a receive not yet matched cancelled)
        // by its request's drop, before the hold on the buffer goes.
        drop(self.active.take());
        if let Some((backend, p)) = self.prepared.take() {
            let _ = backend.with_message_layer(|p2p| p2p.release_buffer(p));
        }
    }
}

/// Starts every request of `requests` (`MPI_Startall`). Panics on error.
pub fn start_all<'a, D: ?Sized, S: Scope<'a> + Copy>(requests: &mut [PersistentRequest<'a, D, S>]) {
    fatal(try_start_all(requests))
}

/// [`start_all`], returning the first error (the requests before it are started).
pub fn try_start_all<'a, D: ?Sized, S: Scope<'a> + Copy>(
    requests: &mut [PersistentRequest<'a, D, S>],
) -> Result<()> {
    requests
        .iter_mut()
        .try_for_each(PersistentRequest::try_start)
}

/// Waits for every started request of `requests` (`MPI_Waitall`); their statuses, in
/// order (`None` for one not started). Panics on error.
pub fn wait_all<'a, D: ?Sized, S: Scope<'a> + Copy>(
    requests: &mut [PersistentRequest<'a, D, S>],
) -> Vec<Option<Status>> {
    requests
        .iter_mut()
        .map(|r| r.is_active().then(|| r.wait()))
        .collect()
}

/// A persistent send of `buf` to rank `dest` of the communicator on `backend`
/// (`MPI_Send_init`, or `MPI_Ssend_init` when `sync`). The buffer is borrowed mutably so
/// that its data can change between starts ([`PersistentRequest::buffer_mut`]).
pub(crate) fn send<'a, B, S>(
    backend: &CommBackend,
    (dest, tag, sync): (usize, Tag, bool),
    scope: S,
    buf: &'a mut B,
) -> Result<PersistentRequest<'a, B, S>>
where
    B: Buffer + ?Sized + 'a,
    S: Scope<'a> + Copy,
{
    let bytes = match packed(&*buf) {
        std::borrow::Cow::Borrowed(b) => Some((b.as_ptr() as u64, b.len())),
        std::borrow::Cow::Owned(_) => None,
    };
    let ptr: *mut B = buf;
    let b = backend.clone();
    let starter: Starter<'a> = Box::new(move || {
        // SAFETY: the buffer is borrowed for `'a` by the persistent request, which hands it
        // out only while no start runs, and each start is a request of its scope (see the
        // module documentation).
        let buf: &'a B = unsafe { &*ptr };
        start_buffer_send(&b, dest, tag, buf, sync)
    });
    let mut r = PersistentRequest::from_raw(ptr, scope, starter);
    if let Some(bytes) = bytes {
        r.prepare(backend, Some(dest), bytes, Direction::Source)?;
    }
    Ok(r)
}

/// A persistent receive into `buf` from rank `src` (any: `None`) of the communicator on
/// `backend`, of messages with `tag` (any: `None`) (`MPI_Recv_init`).
pub(crate) fn receive<'a, B, S>(
    backend: &CommBackend,
    (src, tag): (Option<usize>, Option<Tag>),
    scope: S,
    buf: &'a mut B,
) -> Result<PersistentRequest<'a, B, S>>
where
    B: BufferMut + ?Sized + 'a,
    S: Scope<'a> + Copy,
{
    let bytes = Landing::new(&mut *buf)
        .contiguous()
        .map(|b| (b.as_ptr() as u64, b.len()));
    let ptr: *mut B = buf;
    let b = backend.clone();
    let starter: Starter<'a> = Box::new(move || {
        // SAFETY: as in `send`; the start writes the buffer, which nothing else references
        // while it runs.
        let buf: &'a mut B = unsafe { &mut *ptr };
        start_receive(&b, src, tag, Landing::new(buf))
    });
    let mut r = PersistentRequest::from_raw(ptr, scope, starter);
    if let Some(bytes) = bytes {
        r.prepare(backend, src, bytes, Direction::Sink)?;
    }
    Ok(r)
}

/// A persistent collective whose starts `start` makes on the buffer `buf` (the one that
/// [`PersistentRequest::buffer`] hands out between starts): `start` gets it each time.
pub(crate) fn collective<'a, D, S>(
    scope: S,
    buf: &'a mut D,
    mut start: impl FnMut(&'a mut D) -> Result<Box<dyn Pending + 'a>> + 'a,
) -> PersistentRequest<'a, D, S>
where
    D: ?Sized + 'a,
    S: Scope<'a> + Copy,
{
    let ptr: *mut D = buf;
    let starter: Starter<'a> = Box::new(move || {
        // SAFETY: as in `receive`.
        let buf: &'a mut D = unsafe { &mut *ptr };
        start(buf).map(Operation::from)
    });
    PersistentRequest::from_raw(ptr, scope, starter)
}
