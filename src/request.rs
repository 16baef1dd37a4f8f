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
//! On the mpi transport the same holds for the host MPI library's requests
//! (`host_mpi::HostRequest`): the scope owns them, so one leaked with `mem::forget` is still
//! cancelled or waited for at the scope's end, and MPI never touches a buffer after its
//! borrow ends.
//!
//! This is the one module of the facade with `unsafe` outside the host-MPI FFI: it hands
//! borrowed buffers to the message layer (or to MPI), and the rules above are why that is
//! sound.
#![allow(unsafe_code)]
// Without the `mpi` feature, `Pending` has one variant, and its matches are what clippy calls
// infallible destructuring; they keep one shape for both builds.
#![allow(clippy::infallible_destructuring_match)]

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::rc::Rc;

use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::msg::{MessageHandle, PointToPoint, RequestId};

use crate::error::{fatal, Error, Result};
#[cfg(feature = "mpi")]
use crate::host_mpi::{HostMessage, HostRequest};
use crate::point_to_point::Status;
use crate::topology::{Inner, RankMap, SimpleCommunicator, Tag};

/// The operation behind a [`Request`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    /// An operation of pagewire's message layer.
    Pagewire(RequestId),
    /// A host-MPI request, kept by the scope under this key.
    #[cfg(feature = "mpi")]
    Host(u64),
}

/// The scope of nonblocking operations whose buffers live for `'a`.
pub struct LocalScope<'a> {
    comm_inner: RefCell<Option<Rc<Inner>>>,
    pending: RefCell<Vec<RequestId>>,
    /// The mpi transport's requests, owned here (see the module documentation).
    #[cfg(feature = "mpi")]
    host: RefCell<Vec<(u64, HostRequest)>>,
    #[cfg(feature = "mpi")]
    next_host_key: Cell<u64>,
    _invariant: PhantomData<Cell<&'a ()>>,
}

impl std::fmt::Debug for LocalScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalScope")
            .field("pending", &self.pending.borrow().len())
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
        comm_inner: RefCell::new(None),
        pending: RefCell::new(Vec::new()),
        #[cfg(feature = "mpi")]
        host: RefCell::new(Vec::new()),
        #[cfg(feature = "mpi")]
        next_host_key: Cell::new(0),
        _invariant: PhantomData,
    };
    f(&s)
    // `s` drops here and finishes whatever is left.
}

impl Drop for LocalScope<'_> {
    fn drop(&mut self) {
        // A HostRequest's drop cancels an unmatched receive, else waits.
        #[cfg(feature = "mpi")]
        drop(std::mem::take(&mut *self.host.borrow_mut()));
        let left: Vec<RequestId> = self.pending.borrow_mut().drain(..).collect();
        if left.is_empty() {
            return;
        }
        if let Some(inner) = self.comm_inner.borrow().as_ref() {
            let mut p2p = inner.p2p().borrow_mut();
            for id in left {
                finish_abandoned(&mut p2p, id);
            }
        }
    }
}

#[cfg(feature = "mpi")]
impl LocalScope<'_> {
    fn add_host(&self, request: HostRequest) -> u64 {
        let key = self.next_host_key.get();
        self.next_host_key.set(key + 1);
        self.host.borrow_mut().push((key, request));
        key
    }

    /// Takes the request `key` out of the scope, if it is still there.
    fn take_host(&self, key: u64) -> Option<HostRequest> {
        let mut host = self.host.borrow_mut();
        let i = host.iter().position(|(k, _)| *k == key)?;
        Some(host.remove(i).1)
    }

    /// `MPI_Test` of request `key`; a completed (or failed) request leaves the scope.
    fn test_host(&self, key: u64) -> Result<Option<pagewire_transport::msg::Status>> {
        let finished = {
            let mut host = self.host.borrow_mut();
            let i = host
                .iter()
                .position(|(k, _)| *k == key)
                .expect("a live request of this scope");
            let r = host[i].1.test();
            if matches!(r, Ok(None)) {
                return r;
            }
            (host.remove(i).1, r)
        };
        finished.1
    }

    fn host_is_done(&self, key: u64) -> bool {
        self.host
            .borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .is_none_or(|(_, r)| r.is_done())
    }
}

/// Ends an operation nobody will complete: cancel if it has not matched, else wait.
fn finish_abandoned(p2p: &mut PointToPoint, id: RequestId) {
    if !p2p.cancel(id) {
        let _ = p2p.wait(id);
    } else {
        let _ = p2p.test(id);
    }
}

/// A nonblocking operation borrowing its buffer for `'a`, inside scope `'s`.
#[must_use = "a request must be completed with wait or test"]
pub struct Request<'a, 's> {
    scope: &'s LocalScope<'a>,
    id: Option<Pending>,
    /// The communicator's group, to report the source as its rank.
    ranks: Option<Rc<RankMap>>,
}

impl std::fmt::Debug for Request<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("id", &self.id).finish()
    }
}

impl<'a, 's> Request<'a, 's> {
    fn new(
        inner: &Rc<Inner>,
        ranks: Option<Rc<RankMap>>,
        scope: &'s LocalScope<'a>,
        id: RequestId,
    ) -> Request<'a, 's> {
        scope
            .comm_inner
            .borrow_mut()
            .get_or_insert_with(|| inner.clone());
        scope.pending.borrow_mut().push(id);
        Request {
            scope,
            id: Some(Pending::Pagewire(id)),
            ranks,
        }
    }

    /// A request of the mpi transport; the scope keeps `request` (and the universe alive,
    /// so MPI is not finalised under it).
    #[cfg(feature = "mpi")]
    fn new_host(
        inner: &Rc<Inner>,
        scope: &'s LocalScope<'a>,
        request: HostRequest,
    ) -> Request<'a, 's> {
        scope
            .comm_inner
            .borrow_mut()
            .get_or_insert_with(|| inner.clone());
        let key = scope.add_host(request);
        Request {
            scope,
            id: Some(Pending::Host(key)),
            ranks: None,
        }
    }

    fn status(&self, inner: pagewire_transport::msg::Status) -> Status {
        Status::in_group(self.ranks.as_deref(), inner)
    }

    fn forget_in_scope(&self, id: RequestId) {
        self.scope.pending.borrow_mut().retain(|x| *x != id);
    }

    /// Waits for completion (`MPI_Wait`); panics on error.
    pub fn wait(self) -> Status {
        fatal(self.try_wait())
    }

    /// Waits for completion, returning errors (truncation, a dead peer, ...).
    pub fn try_wait(mut self) -> Result<Status> {
        let id = match self.id.take().expect("live request") {
            Pending::Pagewire(id) => id,
            #[cfg(feature = "mpi")]
            Pending::Host(key) => {
                let mut r = self
                    .scope
                    .take_host(key)
                    .expect("a live request of this scope");
                return r.wait().map(|inner| self.status(inner));
            }
        };
        self.forget_in_scope(id);
        let inner = self
            .scope
            .comm_inner
            .borrow()
            .clone()
            .expect("scope has a communicator");
        let r = inner.p2p().borrow_mut().wait(id);
        r.map(|inner| self.status(inner))
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
        let id = match self.id.expect("live request") {
            Pending::Pagewire(id) => id,
            #[cfg(feature = "mpi")]
            Pending::Host(key) => {
                let r = self.scope.test_host(key);
                if !matches!(r, Ok(None)) {
                    self.id = None;
                }
                return match r? {
                    None => Ok(Err(self)),
                    Some(inner) => Ok(Ok(self.status(inner))),
                };
            }
        };
        let inner = self
            .scope
            .comm_inner
            .borrow()
            .clone()
            .expect("scope has a communicator");
        let r = inner.p2p().borrow_mut().test(id)?;
        match r {
            None => Ok(Err(self)),
            Some(result) => {
                self.id = None;
                self.forget_in_scope(id);
                result.map(|inner| Ok(self.status(inner)))
            }
        }
    }
}

impl Drop for Request<'_, '_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let id = match id {
                Pending::Pagewire(id) => id,
                #[cfg(feature = "mpi")]
                Pending::Host(key) => {
                    // Dropping the HostRequest cancels or waits.
                    drop(self.scope.take_host(key));
                    return;
                }
            };
            self.forget_in_scope(id);
            if let Some(inner) = self.scope.comm_inner.borrow().as_ref() {
                finish_abandoned(&mut inner.p2p().borrow_mut(), id);
            }
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
            let id = match requests[i].id.expect("live request") {
                Pending::Pagewire(id) => id,
                #[cfg(feature = "mpi")]
                Pending::Host(key) => {
                    let done = fatal(requests[i].scope.test_host(key));
                    if let Some(inner) = done {
                        let mut req = requests.remove(i);
                        req.id = None;
                        return Some((i, req.status(inner)));
                    }
                    continue;
                }
            };
            let inner = requests[i]
                .scope
                .comm_inner
                .borrow()
                .clone()
                .expect("scope has a communicator");
            let done = fatal(inner.p2p().borrow_mut().test(id));
            if let Some(result) = done {
                let mut req = requests.remove(i);
                req.id = None;
                req.forget_in_scope(id);
                let inner = fatal(result);
                return Some((i, req.status(inner)));
            }
        }
    }
}

/// Whether every request has completed (`MPI_Testall`), completing them if so.
pub fn test_all<'a, 's>(
    requests: Vec<Request<'a, 's>>,
) -> std::result::Result<Vec<Status>, Vec<Request<'a, 's>>> {
    let all_done = requests.iter().all(|r| {
        let id = match r.id.expect("live request") {
            Pending::Pagewire(id) => id,
            #[cfg(feature = "mpi")]
            Pending::Host(key) => return r.scope.host_is_done(key),
        };
        let inner = r
            .scope
            .comm_inner
            .borrow()
            .clone()
            .expect("scope has a communicator");
        let mut p2p = inner.p2p().borrow_mut();
        let _ = p2p.progress();
        p2p.is_done(id)
    });
    if all_done {
        Ok(wait_all(requests))
    } else {
        Err(requests)
    }
}

/// Sends `bytes` to rank `dest` of `comm` and waits.
pub(crate) fn blocking_send(
    comm: &SimpleCommunicator,
    dest: usize,
    tag: Tag,
    bytes: &[u8],
    sync: bool,
) -> Result<Status> {
    // SAFETY: the request is waited for before this function returns, so `bytes` is
    // borrowed for the whole operation.
    #[cfg(feature = "mpi")]
    if let Some(h) = comm.host() {
        h.send(dest, tag, bytes, sync)?;
        let inner = pagewire_transport::msg::Status {
            source: dest,
            tag,
            count: bytes.len(),
        };
        return Ok(Status::in_group(None, inner));
    }
    let buf = unsafe { UserBuf::new(bytes.as_ptr(), bytes.len()) };
    let mut p2p = comm.inner.p2p().borrow_mut();
    let id = p2p.isend(comm.world_rank(dest), tag, comm.context, buf, sync)?;
    p2p.wait(id)
        .map(|inner| Status::in_group(comm.ranks.as_deref(), inner))
}

/// Receives into `bytes` from rank `src` of `comm` (or any) and waits.
pub(crate) fn blocking_receive(
    comm: &SimpleCommunicator,
    src: Option<usize>,
    tag: Option<Tag>,
    bytes: &mut [u8],
) -> Result<Status> {
    #[cfg(feature = "mpi")]
    if let Some(h) = comm.host() {
        return h.recv(src, tag, bytes).map(|s| Status::in_group(None, s));
    }
    // SAFETY: as for `blocking_send`; `bytes` is exclusively borrowed for the call.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let mut p2p = comm.inner.p2p().borrow_mut();
    let id = p2p.irecv(src.map(|r| comm.world_rank(r)), tag, comm.context, buf)?;
    p2p.wait(id)
        .map(|inner| Status::in_group(comm.ranks.as_deref(), inner))
}

/// Starts sending `bytes` to rank `dest` of `comm`.
pub(crate) fn immediate_send<'a, 's>(
    comm: &SimpleCommunicator,
    scope: &'s LocalScope<'a>,
    dest: usize,
    tag: Tag,
    bytes: &'a [u8],
    sync: bool,
) -> Result<Request<'a, 's>> {
    // SAFETY: `bytes` is borrowed for `'a`; the request, or failing that its scope, completes
    // the operation before `'a` ends (see the module documentation).
    let buf = unsafe { UserBuf::new(bytes.as_ptr(), bytes.len()) };
    #[cfg(feature = "mpi")]
    if let Some(h) = comm.host() {
        let r = h.isend(dest, tag, buf, sync)?;
        return Ok(Request::new_host(&comm.inner, scope, r));
    }
    let id =
        comm.inner
            .p2p()
            .borrow_mut()
            .isend(comm.world_rank(dest), tag, comm.context, buf, sync)?;
    Ok(Request::new(&comm.inner, comm.ranks.clone(), scope, id))
}

/// Starts receiving into `bytes` from rank `src` of `comm` (or any).
pub(crate) fn immediate_receive<'a, 's>(
    comm: &SimpleCommunicator,
    scope: &'s LocalScope<'a>,
    src: Option<usize>,
    tag: Option<Tag>,
    bytes: &'a mut [u8],
) -> Result<Request<'a, 's>> {
    // SAFETY: `bytes` is mutably borrowed for `'a`; as for `immediate_send`.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    #[cfg(feature = "mpi")]
    if let Some(h) = comm.host() {
        let r = h.irecv(src, tag, buf)?;
        return Ok(Request::new_host(&comm.inner, scope, r));
    }
    let id = comm.inner.p2p().borrow_mut().irecv(
        src.map(|r| comm.world_rank(r)),
        tag,
        comm.context,
        buf,
    )?;
    Ok(Request::new(&comm.inner, comm.ranks.clone(), scope, id))
}

/// Receives the message a matched probe parked under `handle` into `bytes` and waits
/// (`MPI_Mrecv`).
pub(crate) fn matched_receive(
    inner: &Rc<Inner>,
    ranks: Option<Rc<RankMap>>,
    handle: MessageHandle,
    bytes: &mut [u8],
) -> Result<Status> {
    // A `Message` dropped while unwinding out of a call that holds the layer cannot
    // receive; say so instead of panicking again.
    let mut p2p = inner.p2p().try_borrow_mut().map_err(|_| {
        Error::InvalidArgument("a matched message was received during another call".into())
    })?;
    // SAFETY: as for `blocking_send`; `bytes` is exclusively borrowed for the call.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let id = p2p.imrecv(handle, buf)?;
    p2p.wait(id).map(|s| Status::in_group(ranks.as_deref(), s))
}

/// Starts receiving the message a matched probe parked under `handle` into `bytes`
/// (`MPI_Imrecv`).
pub(crate) fn immediate_matched_receive<'a, 's>(
    inner: &Rc<Inner>,
    ranks: Option<Rc<RankMap>>,
    scope: &'s LocalScope<'a>,
    handle: MessageHandle,
    bytes: &'a mut [u8],
) -> Result<Request<'a, 's>> {
    // SAFETY: `bytes` is mutably borrowed for `'a`; as for `immediate_send`.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let id = inner.p2p().borrow_mut().imrecv(handle, buf)?;
    Ok(Request::new(inner, ranks, scope, id))
}

/// Starts receiving the host-MPI message `message` into `bytes` (`MPI_Imrecv`).
#[cfg(feature = "mpi")]
pub(crate) fn immediate_host_matched_receive<'a, 's>(
    inner: &Rc<Inner>,
    scope: &'s LocalScope<'a>,
    message: HostMessage,
    bytes: &'a mut [u8],
) -> Result<Request<'a, 's>> {
    // SAFETY: `bytes` is mutably borrowed for `'a`; the scope owns the request and completes
    // it before `'a` ends, as for `immediate_send`.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let r = message.immediate_receive(buf)?;
    Ok(Request::new_host(inner, scope, r))
}
