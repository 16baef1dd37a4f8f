//! Nonblocking requests and the scope that keeps their buffers borrowed (rsmpi's
//! `request` module).
//!
//! A [`Request`] borrows its buffer for `'a` and lives inside a [`LocalScope`] created by
//! [`scope`]. Completing it (`wait`, `test`, [`wait_all`], [`wait_any`]) ends the
//! operation. Dropping an unfinished request is not undefined behaviour: the drop cancels a
//! receive that has not matched yet, or waits for the operation to complete, so its buffer
//! is never used after the borrow ends. The scope does the same at its end for requests
//! leaked with `mem::forget`.
//!
//! The scope owns the backend's operations (pagewire's message-layer requests, or the host
//! MPI library's `MPI_Request`s on the mpi transport); a [`Request`] is the key of one. So
//! one leaked with `mem::forget` is still cancelled or waited for at the scope's end, and no
//! backend touches a buffer after its borrow ends.
//!
//! This is the one module of the facade above the backends with `unsafe`: it hands borrowed
//! buffers to the backend, and the rules above are why that is sound.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

use pagewire_transport::msg::raw::{UserBuf, UserBufMut};

use crate::backend::{
    CommBackend, MatchedMessage, MessageBackend, PendingRequest, PointToPointBackend,
    RequestBackend,
};
use crate::error::{fatal, Result};
use crate::status::Status;
use crate::topology::Tag;

/// The scope of nonblocking operations whose buffers live for `'a`.
pub struct LocalScope<'a> {
    /// The operations of the scope's requests, by key; `None`: a free slot.
    operations: RefCell<Vec<Option<PendingRequest>>>,
    /// The free slots of `operations`.
    free: RefCell<Vec<usize>>,
    _invariant: PhantomData<Cell<&'a ()>>,
}

impl std::fmt::Debug for LocalScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pending = self.operations.borrow().iter().flatten().count();
        f.debug_struct("LocalScope")
            .field("pending", &pending)
            .finish()
    }
}

/// Runs `f` with a scope for nonblocking operations; when `f` returns, every request of the
/// scope has completed (rsmpi's `request::scope`).
pub fn scope<'a, F, R>(f: F) -> R
where
    F: FnOnce(&LocalScope<'a>) -> R,
{
    let s = LocalScope {
        operations: RefCell::new(Vec::new()),
        free: RefCell::new(Vec::new()),
        _invariant: PhantomData,
    };
    f(&s)
    // `s` drops here and finishes whatever is left.
}

impl Drop for LocalScope<'_> {
    fn drop(&mut self) {
        // Each operation's drop cancels a receive that has not matched, else waits.
        drop(std::mem::take(self.operations.get_mut()));
    }
}

impl<'a> LocalScope<'a> {
    /// Keeps `operation` until its request completes it, and returns the request.
    fn adopt<'s>(&'s self, operation: PendingRequest) -> Request<'a, 's> {
        let mut operations = self.operations.borrow_mut();
        let key = match self.free.borrow_mut().pop() {
            Some(key) => {
                operations[key] = Some(operation);
                key
            }
            None => {
                operations.push(Some(operation));
                operations.len() - 1
            }
        };
        Request {
            scope: self,
            key: Some(key),
        }
    }

    /// Takes the operation `key` out of the scope, if it is still there.
    fn take(&self, key: usize) -> Option<PendingRequest> {
        let operation = self.operations.borrow_mut().get_mut(key)?.take();
        if operation.is_some() {
            self.free.borrow_mut().push(key);
        }
        operation
    }

    /// `MPI_Test` of operation `key`; a completed (or failed) operation leaves the scope.
    fn test(&self, key: usize) -> Result<Option<Status>> {
        let r = self.operations.borrow_mut()[key]
            .as_mut()
            .expect("a live request of this scope")
            .test();
        if !matches!(r, Ok(None)) {
            drop(self.take(key));
        }
        r.map(|done| done.map(Status::new))
    }

    /// Whether operation `key` has finished, without completing it.
    fn is_done(&self, key: usize) -> bool {
        self.operations
            .borrow()
            .get(key)
            .and_then(Option::as_ref)
            .is_none_or(|operation| operation.is_done())
    }
}

/// A nonblocking operation borrowing its buffer for `'a`, inside scope `'s`.
#[must_use = "a request must be completed with wait or test"]
pub struct Request<'a, 's> {
    scope: &'s LocalScope<'a>,
    /// The operation's key in the scope; `None` once completed.
    key: Option<usize>,
}

impl std::fmt::Debug for Request<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("id", &self.key).finish()
    }
}

impl<'a, 's> Request<'a, 's> {
    /// Waits for completion (`MPI_Wait`); panics on error.
    pub fn wait(self) -> Status {
        fatal(self.try_wait())
    }

    /// Waits for completion, returning errors (truncation, a dead peer, ...).
    pub fn try_wait(mut self) -> Result<Status> {
        let key = self.key.take().expect("live request");
        let mut operation = self.scope.take(key).expect("a live request of this scope");
        operation.wait().map(Status::new)
    }

    /// Completes the request if it is done (`MPI_Test`): `Ok(status)`, or the request back.
    /// Panics on error.
    pub fn test(self) -> std::result::Result<Status, Self> {
        match self.try_test() {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(req)) => Err(req),
            Err(e) => panic!("pagewire: {e}"),
        }
    }

    /// [`Request::test`], returning errors.
    pub fn try_test(mut self) -> Result<std::result::Result<Status, Self>> {
        match self.test_in_scope()? {
            None => Ok(Err(self)),
            Some(status) => Ok(Ok(status)),
        }
    }

    /// Tests the operation; once it has completed or failed, the request holds nothing more.
    fn test_in_scope(&mut self) -> Result<Option<Status>> {
        let key = self.key.expect("live request");
        let r = self.scope.test(key);
        if !matches!(r, Ok(None)) {
            self.key = None;
        }
        r
    }
}

impl Drop for Request<'_, '_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            // Dropping the operation cancels or waits.
            drop(self.scope.take(key));
        }
    }
}

/// Waits for every request (`MPI_Waitall`); panics on the first error.
pub fn wait_all(requests: Vec<Request<'_, '_>>) -> Vec<Status> {
    requests.into_iter().map(Request::wait).collect()
}

/// Waits until one request completes (`MPI_Waitany`): its index in `requests` (from which it
/// is removed) and status; `None` if `requests` is empty. Panics on error.
pub fn wait_any(requests: &mut Vec<Request<'_, '_>>) -> Option<(usize, Status)> {
    if requests.is_empty() {
        return None;
    }
    loop {
        for i in 0..requests.len() {
            if let Some(status) = fatal(requests[i].test_in_scope()) {
                // Completed: dropping it leaves nothing to finish.
                drop(requests.remove(i));
                return Some((i, status));
            }
        }
    }
}

/// Whether every request has completed (`MPI_Testall`), completing them if so.
pub fn test_all<'a, 's>(
    requests: Vec<Request<'a, 's>>,
) -> std::result::Result<Vec<Status>, Vec<Request<'a, 's>>> {
    let all_done = requests
        .iter()
        .all(|r| r.scope.is_done(r.key.expect("live request")));
    if all_done {
        Ok(wait_all(requests))
    } else {
        Err(requests)
    }
}

/// Starts sending `bytes` to rank `dest` of the communicator on `backend`.
pub(crate) fn immediate_send<'a, 's>(
    backend: &CommBackend,
    scope: &'s LocalScope<'a>,
    dest: usize,
    tag: Tag,
    bytes: &'a [u8],
    sync: bool,
) -> Result<Request<'a, 's>> {
    // SAFETY: `bytes` is borrowed for `'a`; the request, or failing that its scope, completes
    // the operation before `'a` ends (see the module documentation).
    let buf = unsafe { UserBuf::new(bytes.as_ptr(), bytes.len()) };
    let operation = backend.immediate_send(dest, tag, buf, sync)?;
    Ok(scope.adopt(operation))
}

/// Starts receiving into `bytes` from rank `src` (or any) of the communicator on `backend`.
pub(crate) fn immediate_receive<'a, 's>(
    backend: &CommBackend,
    scope: &'s LocalScope<'a>,
    src: Option<usize>,
    tag: Option<Tag>,
    bytes: &'a mut [u8],
) -> Result<Request<'a, 's>> {
    // SAFETY: `bytes` is mutably borrowed for `'a`; as for `immediate_send`.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let operation = backend.immediate_receive(src, tag, buf)?;
    Ok(scope.adopt(operation))
}

/// Starts receiving the message a matched probe took out of matching into `bytes`
/// (`MPI_Imrecv`).
pub(crate) fn immediate_matched_receive<'a, 's>(
    scope: &'s LocalScope<'a>,
    message: MatchedMessage,
    bytes: &'a mut [u8],
) -> Result<Request<'a, 's>> {
    // SAFETY: `bytes` is mutably borrowed for `'a`; as for `immediate_send`.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let operation = message.immediate_receive(buf)?;
    Ok(scope.adopt(operation))
}
