//! Request-based one-sided operations (`MPI_Rput`, `MPI_Rget`, `MPI_Raccumulate`), as
//! requests of rsmpi's scopes: the buffer stays borrowed until the request completes, or
//! the scope ends.
//!
//! `rput` and `rget` post their RDMA WRITEs or READs and return; every pass of progress
//! (another operation's, a test) reaps their completed chunks and posts more, so they move
//! while the application computes, and `wait` finishes them. Their completion means the
//! data is at the target (an RC completion) or in the buffer. A window's `flush`, `unlock`,
//! `complete` and `fence` also wait for them. On a dynamic window a request holds the
//! target's lock until it completes (one taken for it if the origin holds none).

use pagewire_transport::msg::{RmaRequest, Status as MsgStatus};

use super::{with_layer, Carrier, Span, Window};
use crate::collective::SystemOperation;
use crate::datatype::Equivalence;
use crate::error::{fatal, Error, Result};
use crate::request::{start_one_sided, OneSidedBuf, Pending, Request, Scope};
use crate::status::Status;
use crate::topology::Rank;
use crate::ErrorClass;

/// A put or get in flight in the message layer, for the window it accesses.
struct OneSided<'a, T: Equivalence + Send + Sync> {
    window: &'a Window<T>,
    span: Span,
    bytes: usize,
    /// `None` once finished.
    request: Option<RmaRequest>,
}

impl<T: Equivalence + Send + Sync> OneSided<'_, T> {
    /// The status of a finished operation (the target as its source), once the access it
    /// began is ended.
    fn finish(&mut self, outcome: pagewire_transport::Result<()>) -> Result<Status> {
        self.request = None;
        let ended = self.window.end_access(self.span);
        outcome?;
        ended?;
        Ok(Status::new(MsgStatus {
            source: self.span.target,
            tag: 0,
            count: self.bytes,
        }))
    }
}

impl<T: Equivalence + Send + Sync> Pending for OneSided<'_, T> {
    fn wait(&mut self) -> Result<Status> {
        let r = self.request.expect("an operation not finished yet");
        let outcome = with_layer(&self.window.comm, |p2p| Ok(p2p.rma_wait(r)))?;
        self.finish(outcome)
    }

    fn test(&mut self) -> Result<Option<Status>> {
        let r = self.request.expect("an operation not finished yet");
        match with_layer(&self.window.comm, |p2p| p2p.rma_test(r))? {
            None => Ok(None),
            Some(outcome) => self.finish(outcome).map(Some),
        }
    }

    fn is_done(&mut self) -> bool {
        match self.request {
            None => true,
            Some(r) => with_layer(&self.window.comm, |p2p| {
                let _ = p2p.progress();
                Ok(p2p.rma_is_done(r))
            })
            .unwrap_or(true),
        }
    }
}

impl<T: Equivalence + Send + Sync> Drop for OneSided<'_, T> {
    fn drop(&mut self) {
        // The buffer's borrow may end with the drop: the operation finishes first.
        if self.request.is_some() {
            let _ = Pending::wait(self);
        }
    }
}

impl<T: Equivalence + Send + Sync> Window<T> {
    /// Starts writing `data` into rank `target`'s part from displacement `target_disp`
    /// (`MPI_Rput`) and returns its request in `scope`; the data is at the target when the
    /// request completes. Panics on error.
    pub fn rput<'a, S: Scope<'a>>(
        &'a self,
        scope: S,
        target: Rank,
        target_disp: usize,
        data: &'a [T],
    ) -> Request<'a, [T], S> {
        fatal(self.try_rput(scope, target, target_disp, data))
    }

    /// [`Window::rput`], returning errors (the checks of [`Window::try_put`], at the call;
    /// the transfer's, at the request's completion).
    pub fn try_rput<'a, S: Scope<'a>>(
        &'a self,
        scope: S,
        target: Rank,
        target_disp: usize,
        data: &'a [T],
    ) -> Result<Request<'a, [T], S>> {
        self.request_based("rput")?;
        let bytes = self.gapless("rput")?.of(data);
        let span = self.span(target, target_disp, data.len())?;
        let started = start_one_sided(scope, data, OneSidedBuf::Put(bytes), |buf| {
            self.start_transfer(span, bytes.len(), buf)
        });
        if started.is_err() {
            let _ = self.end_access(span);
        }
        started
    }

    /// Starts reading `buf.len()` elements of rank `target`'s part from displacement
    /// `target_disp` into `buf` (`MPI_Rget`) and returns its request in `scope`; the data is
    /// in `buf` when the request completes (`wait_for_data` hands it back). Panics on error.
    pub fn rget<'a, S: Scope<'a>>(
        &'a self,
        scope: S,
        target: Rank,
        target_disp: usize,
        buf: &'a mut [T],
    ) -> Request<'a, [T], S> {
        fatal(self.try_rget(scope, target, target_disp, buf))
    }

    /// [`Window::rget`], returning errors.
    pub fn try_rget<'a, S: Scope<'a>>(
        &'a self,
        scope: S,
        target: Rank,
        target_disp: usize,
        buf: &'a mut [T],
    ) -> Result<Request<'a, [T], S>> {
        self.request_based("rget")?;
        let gapless = self.gapless("rget")?;
        let span = self.span(target, target_disp, buf.len())?;
        let data: *const [T] = buf;
        let bytes = gapless.of_mut(buf);
        let len = bytes.len();
        let started = start_one_sided(scope, data, OneSidedBuf::Get(bytes), |b| {
            self.start_transfer(span, len, b)
        });
        if started.is_err() {
            let _ = self.end_access(span);
        }
        started
    }

    /// [`Window::accumulate`] with a request (`MPI_Raccumulate`). The update is applied
    /// before this returns (an accumulate is a sequence of round trips this rank drives:
    /// NIC atomics, or a get and a put under the target's mutex), so the request is
    /// complete at once; it exists so that code written for MPI's request-based calls
    /// keeps its shape. Panics on error.
    pub fn raccumulate<'a, S: Scope<'a>>(
        &'a self,
        scope: S,
        target: Rank,
        target_disp: usize,
        data: &'a [T],
        op: SystemOperation,
    ) -> Request<'a, [T], S> {
        fatal(self.try_raccumulate(scope, target, target_disp, data, op))
    }

    /// [`Window::raccumulate`], returning errors.
    pub fn try_raccumulate<'a, S: Scope<'a>>(
        &'a self,
        scope: S,
        target: Rank,
        target_disp: usize,
        data: &'a [T],
        op: SystemOperation,
    ) -> Result<Request<'a, [T], S>> {
        self.try_accumulate(target, target_disp, data, op)?;
        let status = Status::new(MsgStatus {
            source: target.max(0) as usize,
            tag: 0,
            count: std::mem::size_of_val(data),
        });
        let done: Box<dyn Pending + 'a> = Box::new(Applied(Some(status)));
        Ok(Request::new(done, scope, data as *const [T]))
    }

    /// An error unless request-based operations run on this window's carrier.
    #[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
    fn request_based(&self, what: &str) -> Result<()> {
        match &self.carrier {
            Carrier::Nic { .. } => Ok(()),
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(_) => Err(Error::NotSupported(format!(
                "{what} runs on pagewire's own transport; under PAGEWIRE_TRANSPORT=mpi the host \
                 MPI's request-based operations are not wired up yet"
            ))),
        }
    }

    /// Starts the message layer's put or get of `buf` where `span` lies.
    fn start_transfer<'a>(
        &'a self,
        span: Span,
        bytes: usize,
        buf: pagewire_transport::msg::RmaBuf,
    ) -> Result<Box<dyn Pending + 'a>> {
        let request = with_layer(&self.comm, |p2p| {
            p2p.rma_start(span.world, span.at, span.rkey, buf)
        })?;
        Ok(Box::new(OneSided {
            window: self,
            span,
            bytes,
            request: Some(request),
        }))
    }
}

/// An operation applied when it started: its request is complete.
struct Applied(Option<Status>);

impl Pending for Applied {
    fn wait(&mut self) -> Result<Status> {
        self.0.take().ok_or(Error::invalid(
            ErrorClass::Request,
            "a request waited for twice",
        ))
    }
    fn test(&mut self) -> Result<Option<Status>> {
        self.wait().map(Some)
    }
    fn is_done(&mut self) -> bool {
        true
    }
}
