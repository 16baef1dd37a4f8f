//! Nonblocking requests and the scopes that keep their buffers borrowed (rsmpi's `request`
//! module).
//!
//! A [`Request`] borrows its buffer for `'a` and belongs to a [`Scope`]: a [`LocalScope`]
//! made by [`scope`] (or [`multiple_scope`], which adds a [`RequestCollection`]), or
//! [`StaticScope`] for buffers that live forever. Completing a request (`wait`, `test`,
//! [`wait_any`], a collection's `wait_*`/`test_*`) ends the operation. Dropping an
//! unfinished request is not undefined behaviour, and unlike rsmpi it does not panic: the
//! drop cancels a receive that has not matched, or waits for the operation to complete, so
//! its buffer is never used after the borrow ends. [`WaitGuard`] and [`CancelGuard`] make
//! that choice explicit.
//!
//! A local scope owns the operations of its requests; a request is the key of one. So one
//! leaked with `mem::forget` is still finished at the scope's end, and no backend touches a
//! buffer after its borrow ends. A request of the static scope owns its operation.
//!
//! This module has `unsafe`: it lends borrowed buffers to the backends, and hands the
//! buffer back (`wait_for_data`) once the operation is over; the rules above are why that
//! is sound.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

use smallvec::SmallVec;

use crate::backend::{PendingRequest, RequestBackend};
use crate::datatype::Landing;
use crate::error::{fatal, Error, Result};
use crate::status::Status;

/// An operation in flight, whatever started it (point-to-point, a collective).
pub(crate) trait Pending {
    /// Waits for it to finish.
    fn wait(&mut self) -> Result<Status>;
    /// `Some` once it has finished (then there is nothing left to do), else `None`.
    fn test(&mut self) -> Result<Option<Status>>;
    /// Cancels it if it has not started to match (a receive); true if it was cancelled.
    fn cancel(&mut self) -> bool {
        false
    }
    /// Whether it has finished, without completing it.
    fn is_done(&mut self) -> bool;
}

impl Pending for PendingRequest {
    fn wait(&mut self) -> Result<Status> {
        RequestBackend::wait(self).map(Status::new)
    }
    fn test(&mut self) -> Result<Option<Status>> {
        RequestBackend::test(self).map(|s| s.map(Status::new))
    }
    fn cancel(&mut self) -> bool {
        RequestBackend::cancel(self)
    }
    fn is_done(&mut self) -> bool {
        RequestBackend::is_done(self)
    }
}

/// What a request holds: a backend request on the caller's memory itself, kept inline (the
/// common case costs no allocation), or any other operation, boxed.
pub(crate) enum Operation<'a> {
    /// A send from, or a receive into, the caller's buffer as it is.
    Direct(PendingRequest),
    /// Anything else: a packed send, a receive through a scratch message, a collective.
    Boxed(Box<dyn Pending + 'a>),
}

impl<'a> From<Box<dyn Pending + 'a>> for Operation<'a> {
    fn from(b: Box<dyn Pending + 'a>) -> Self {
        Operation::Boxed(b)
    }
}

impl Pending for Operation<'_> {
    fn wait(&mut self) -> Result<Status> {
        match self {
            Operation::Direct(r) => Pending::wait(r),
            Operation::Boxed(b) => b.wait(),
        }
    }
    fn test(&mut self) -> Result<Option<Status>> {
        match self {
            Operation::Direct(r) => Pending::test(r),
            Operation::Boxed(b) => b.test(),
        }
    }
    fn cancel(&mut self) -> bool {
        match self {
            Operation::Direct(r) => Pending::cancel(r),
            Operation::Boxed(b) => b.cancel(),
        }
    }
    fn is_done(&mut self) -> bool {
        match self {
            Operation::Direct(r) => Pending::is_done(r),
            Operation::Boxed(b) => b.is_done(),
        }
    }
}

/// A backend operation with what it needs to finish: the packed copy of a send from a
/// buffer with gaps, or the scratch message of a receive into one (unpacked on completion).
/// The backend request is declared first, so it is finished before the memory goes.
struct PointToPoint<'a> {
    request: PendingRequest,
    _packed_send: Option<Vec<u8>>,
    receive: Option<(Vec<u8>, Landing<'a>)>,
}

impl PointToPoint<'_> {
    fn finish(&mut self, status: Status) -> Status {
        self.unpack(status.count_bytes());
        status
    }

    /// Unpacks the first `n` bytes of a scratch message into the landing.
    fn unpack(&mut self, n: usize) {
        if let Some((scratch, landing)) = &mut self.receive {
            let n = n.min(scratch.len());
            landing.unpack(&scratch[..n]);
        }
    }

    /// A truncated receive still delivers what fits (as into memory without gaps).
    fn failed(&mut self, e: Error) -> Error {
        if let Error::Truncated { buffer_bytes, .. } = e {
            self.unpack(buffer_bytes);
        }
        e
    }
}

impl Pending for PointToPoint<'_> {
    fn wait(&mut self) -> Result<Status> {
        match Pending::wait(&mut self.request) {
            Ok(s) => Ok(self.finish(s)),
            Err(e) => Err(self.failed(e)),
        }
    }
    fn test(&mut self) -> Result<Option<Status>> {
        match Pending::test(&mut self.request) {
            Ok(Some(s)) => Ok(Some(self.finish(s))),
            Ok(None) => Ok(None),
            Err(e) => Err(self.failed(e)),
        }
    }
    fn cancel(&mut self) -> bool {
        Pending::cancel(&mut self.request)
    }
    fn is_done(&mut self) -> bool {
        Pending::is_done(&mut self.request)
    }
}

mod collection;
pub mod persistent;
mod start;

pub use collection::{Boxed, RequestCollection};
pub use persistent::{start_all, try_start_all, PersistentRequest};
pub(crate) use start::{
    start_buffer_send, start_matched_receive, start_one_sided, start_receive, start_send,
    OneSidedBuf, OwnedReceive, OwnedSend,
};

/// Where a scope keeps the operations of its requests (not part of the API).
mod registry {
    use super::*;

    /// The operations of a scope's requests, by key; `None`: a free slot. The first few
    /// live in the scope itself (a sendrecv-like scope allocates nothing).
    pub struct Registry<'a> {
        pub(super) operations: RefCell<SmallVec<[Option<Operation<'a>>; 4]>>,
        pub(super) free: RefCell<SmallVec<[usize; 4]>>,
    }

    /// Gives a scope's registry, if it has one (the static scope has none: its requests own
    /// their operations).
    pub trait HasRegistry<'a> {
        /// The registry.
        fn registry(&self) -> Option<&Registry<'a>>;
    }
}
use registry::{HasRegistry, Registry};

impl<'a> Registry<'a> {
    fn new() -> Self {
        Registry {
            operations: RefCell::new(SmallVec::new()),
            free: RefCell::new(SmallVec::new()),
        }
    }

    fn adopt(&self, operation: Operation<'a>) -> usize {
        let mut operations = self.operations.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(key) => {
                operations[key] = Some(operation);
                key
            }
            None => {
                operations.push(Some(operation));
                operations.len() - 1
            }
        }
    }

    fn take(&self, key: usize) -> Option<Operation<'a>> {
        let operation = self.operations.borrow_mut().get_mut(key)?.take();
        if operation.is_some() {
            self.free.borrow_mut().push(key);
        }
        operation
    }

    fn with<R>(&self, key: usize, f: impl FnOnce(&mut dyn Pending) -> R) -> R {
        let mut operations = self.operations.borrow_mut();
        let op = operations[key]
            .as_mut()
            .expect("a live request of this scope");
        f(op)
    }
}

/// Where requests live (rsmpi's `Scope`): a [`LocalScope`] borrowed, or [`StaticScope`].
///
/// # Safety
///
/// Implemented by this crate only.
pub unsafe trait Scope<'a>: HasRegistry<'a> {}

/// The scope of requests whose buffers live forever (rsmpi's `StaticScope`).
#[derive(Clone, Copy, Debug)]
pub struct StaticScope;

impl HasRegistry<'static> for StaticScope {
    fn registry(&self) -> Option<&Registry<'static>> {
        None
    }
}
unsafe impl Scope<'static> for StaticScope {}

/// The scope of nonblocking operations whose buffers live for `'a` (rsmpi's
/// `LocalScope`); at its end, every operation started in it has finished.
pub struct LocalScope<'a> {
    registry: Registry<'a>,
    _invariant: PhantomData<Cell<&'a ()>>,
}

impl std::fmt::Debug for LocalScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pending = self.registry.operations.borrow().iter().flatten().count();
        f.debug_struct("LocalScope")
            .field("pending", &pending)
            .finish()
    }
}

impl<'a> HasRegistry<'a> for &LocalScope<'a> {
    fn registry(&self) -> Option<&Registry<'a>> {
        Some(&self.registry)
    }
}
unsafe impl<'a> Scope<'a> for &LocalScope<'a> {}

impl Drop for LocalScope<'_> {
    fn drop(&mut self) {
        // Each operation's drop cancels a receive that has not matched, else waits.
        drop(std::mem::take(self.registry.operations.get_mut()));
    }
}

/// Runs `f` with a scope for nonblocking operations; when `f` returns, every request of the
/// scope has completed (rsmpi's `request::scope`).
pub fn scope<'a, F, R>(f: F) -> R
where
    F: FnOnce(&LocalScope<'a>) -> R,
{
    let s = LocalScope {
        registry: Registry::new(),
        _invariant: PhantomData,
    };
    f(&s)
}

/// [`scope`] with a [`RequestCollection`] of room for `reserve` requests (rsmpi's
/// `request::multiple_scope`).
pub fn multiple_scope<'a, F, R, D: ?Sized + 'a>(reserve: usize, f: F) -> R
where
    F: FnOnce(&LocalScope<'a>, &mut RequestCollection<'a, D>) -> R,
{
    scope(|s| {
        let mut collection = RequestCollection::with_capacity(reserve);
        f(s, &mut collection)
    })
}

/// Where a request's operation is.
enum Slot<'a> {
    /// In its local scope, under this key.
    Scoped(usize),
    /// Owned by the request (static scope).
    Owned(RefCell<Operation<'a>>),
    /// Finished.
    Done,
}

/// A nonblocking operation on a buffer of type `D` borrowed for `'a`, in scope `S` (rsmpi's
/// `Request`).
#[must_use = "a request must be completed with wait or test"]
pub struct Request<'a, D: ?Sized, S: Scope<'a> = StaticScope> {
    slot: Slot<'a>,
    scope: S,
    /// The buffer, handed back by `wait_for_data` once the operation is over.
    data: *const D,
    _borrow: PhantomData<&'a D>,
}

impl<'a, D: ?Sized, S: Scope<'a>> std::fmt::Debug for Request<'a, D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slot = match &self.slot {
            Slot::Scoped(k) => format!("scoped {k}"),
            Slot::Owned(_) => "owned".into(),
            Slot::Done => "done".into(),
        };
        f.debug_struct("Request").field("slot", &slot).finish()
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> Request<'a, D, S> {
    /// A request for `operation` on `data`, kept by `scope`.
    pub(crate) fn new(operation: impl Into<Operation<'a>>, scope: S, data: *const D) -> Self {
        let operation = operation.into();
        let slot = match scope.registry() {
            Some(r) => Slot::Scoped(r.adopt(operation)),
            None => Slot::Owned(RefCell::new(operation)),
        };
        Request {
            slot,
            scope,
            data,
            _borrow: PhantomData,
        }
    }

    fn take_operation(&mut self) -> Option<Operation<'a>> {
        match std::mem::replace(&mut self.slot, Slot::Done) {
            Slot::Scoped(key) => self.scope.registry().and_then(|r| r.take(key)),
            Slot::Owned(op) => Some(op.into_inner()),
            Slot::Done => None,
        }
    }

    fn with_operation<R>(&mut self, f: impl FnOnce(&mut dyn Pending) -> R) -> R {
        match &mut self.slot {
            Slot::Scoped(key) => {
                let registry = self.scope.registry().expect("a scoped request's registry");
                registry.with(*key, f)
            }
            Slot::Owned(op) => f(op.get_mut()),
            Slot::Done => panic!("pagewire: a request used after it completed"),
        }
    }

    /// The buffer, once the operation is over.
    fn data(&self) -> &'a D {
        // SAFETY: the operation has finished, so nothing writes the buffer any more, and it
        // is borrowed for `'a`.
        unsafe { &*self.data }
    }

    /// Waits for completion (`MPI_Wait`); panics on error.
    pub fn wait(self) -> Status {
        fatal(self.try_wait())
    }

    /// Waits for completion, returning errors (truncation, a dead peer, …).
    pub fn try_wait(mut self) -> Result<Status> {
        let mut op = self.take_operation().expect("a live request");
        settle(op.wait())
    }

    /// Waits for completion and returns the buffer (rsmpi's `wait_for_data`).
    pub fn wait_for_data(self) -> &'a D {
        let data = self.data();
        self.wait();
        data
    }

    /// Waits for completion, without the status.
    pub fn wait_without_status(self) {
        self.wait();
    }

    /// Completes the request if it is done (`MPI_Test`): `Ok(status)`, or the request back.
    /// Panics on error.
    pub fn test(self) -> std::result::Result<Status, Self> {
        match self.try_test() {
            Ok(r) => r,
            Err(e) => panic!("pagewire: {e}"),
        }
    }

    /// [`Request::test`], and the buffer when done.
    pub fn test_with_data(self) -> std::result::Result<(Status, &'a D), Self> {
        let data = self.data();
        self.test().map(|s| (s, data))
    }

    /// [`Request::test`], returning errors.
    pub fn try_test(mut self) -> Result<std::result::Result<Status, Self>> {
        match self.poll()? {
            Some(status) => Ok(Ok(status)),
            None => Ok(Err(self)),
        }
    }

    /// Tests the operation; once it has finished (or failed) the request holds nothing.
    fn poll(&mut self) -> Result<Option<Status>> {
        let r = match self.with_operation(|op| op.test()) {
            Ok(None) => return Ok(None),
            Ok(Some(s)) => Ok(Some(s)),
            Err(e) => settle(Err(e)).map(Some),
        };
        drop(self.take_operation());
        r
    }

    /// Asks for the operation to be cancelled (`MPI_Cancel`): a receive that has not
    /// matched ends, and its wait reports a cancelled status; anything else completes as
    /// usual.
    pub fn cancel(&self) {
        match &self.slot {
            Slot::Scoped(key) => {
                let registry = self.scope.registry().expect("a scoped request's registry");
                registry.with(*key, |op| op.cancel());
            }
            Slot::Owned(op) => {
                op.borrow_mut().cancel();
            }
            Slot::Done => {}
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> Drop for Request<'a, D, S> {
    fn drop(&mut self) {
        // Dropping the operation cancels or waits.
        drop(self.take_operation());
    }
}

/// A cancelled operation reports a cancelled status, not an error.
fn settle(r: Result<Status>) -> Result<Status> {
    match r {
        Err(Error::Cancelled) => Ok(Status::cancelled()),
        r => r,
    }
}

/// Waits for its request when dropped (rsmpi's `WaitGuard`).
#[derive(Debug)]
pub struct WaitGuard<'a, D: ?Sized, S: Scope<'a> = StaticScope>(Option<Request<'a, D, S>>);

impl<'a, D: ?Sized, S: Scope<'a>> Drop for WaitGuard<'a, D, S> {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.wait();
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<Request<'a, D, S>> for WaitGuard<'a, D, S> {
    fn from(r: Request<'a, D, S>) -> Self {
        WaitGuard(Some(r))
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<WaitGuard<'a, D, S>> for Request<'a, D, S> {
    fn from(mut g: WaitGuard<'a, D, S>) -> Self {
        g.0.take().expect("a guarded request")
    }
}

/// Cancels its request, then waits for it, when dropped (rsmpi's `CancelGuard`).
#[derive(Debug)]
pub struct CancelGuard<'a, D: ?Sized, S: Scope<'a> = StaticScope>(WaitGuard<'a, D, S>);

impl<'a, D: ?Sized, S: Scope<'a>> Drop for CancelGuard<'a, D, S> {
    fn drop(&mut self) {
        if let Some(r) = &self.0 .0 {
            r.cancel();
        }
        // The inner guard waits.
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<Request<'a, D, S>> for CancelGuard<'a, D, S> {
    fn from(r: Request<'a, D, S>) -> Self {
        CancelGuard(WaitGuard::from(r))
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<WaitGuard<'a, D, S>> for CancelGuard<'a, D, S> {
    fn from(g: WaitGuard<'a, D, S>) -> Self {
        CancelGuard(g)
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<CancelGuard<'a, D, S>> for WaitGuard<'a, D, S> {
    fn from(mut g: CancelGuard<'a, D, S>) -> Self {
        WaitGuard(g.0 .0.take())
    }
}

/// Waits until one request completes (`MPI_Waitany`): its index in `requests` (from which it
/// is removed) and status; `None` if `requests` is empty. Panics on error.
pub fn wait_any<'a, D: ?Sized, S: Scope<'a>>(
    requests: &mut Vec<Request<'a, D, S>>,
) -> Option<(usize, Status)> {
    if requests.is_empty() {
        return None;
    }
    loop {
        for i in 0..requests.len() {
            if let Some(status) = fatal(requests[i].poll()) {
                drop(requests.remove(i));
                return Some((i, status));
            }
        }
    }
}

/// Waits for every request (`MPI_Waitall`); panics on the first error.
pub fn wait_all<'a, D: ?Sized, S: Scope<'a>>(requests: Vec<Request<'a, D, S>>) -> Vec<Status> {
    requests.into_iter().map(Request::wait).collect()
}
