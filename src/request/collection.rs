//! Requests completed together: [`RequestCollection`] (rsmpi's, made by
//! [`multiple_scope`](super::multiple_scope)) and the [`Boxed`] scope its requests live in.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::marker::PhantomData;

use super::{HasRegistry, Registry, Request, Scope, Slot};
use crate::error::fatal;
use crate::status::Status;

/// Requests completed together (rsmpi's `RequestCollection`, made by [`multiple_scope`](super::multiple_scope)):
/// each keeps the index [`RequestCollection::add`] gave it, and completing one gives its
/// index, status and buffer.
pub struct RequestCollection<'a, D: ?Sized> {
    /// Per index: the request, until it completes.
    entries: Vec<Option<Request<'a, D, Boxed>>>,
    incomplete: usize,
}

impl<D: ?Sized> std::fmt::Debug for RequestCollection<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestCollection")
            .field("len", &self.entries.len())
            .field("incomplete", &self.incomplete)
            .finish()
    }
}

/// The scope of a request taken into a collection: it owns its operation, and the
/// collection, which lives inside a local scope, finishes it.
#[derive(Clone, Copy, Debug)]
pub struct Boxed;

impl<'a> HasRegistry<'a> for Boxed {
    fn registry(&self) -> Option<&Registry<'a>> {
        None
    }
}
unsafe impl<'a> Scope<'a> for Boxed {}

impl<'a, D: ?Sized> RequestCollection<'a, D> {
    /// An empty collection with room for `reserve` requests.
    pub(super) fn with_capacity(reserve: usize) -> Self {
        RequestCollection {
            entries: Vec::with_capacity(reserve),
            incomplete: 0,
        }
    }

    /// Requests not completed yet.
    pub fn incomplete(&self) -> usize {
        self.incomplete
    }

    /// Adds `request`; returns its index.
    pub fn add<S: Scope<'a>>(&mut self, mut request: Request<'a, D, S>) -> usize {
        let op = request.take_operation().expect("a live request");
        let moved = Request {
            slot: Slot::Owned(RefCell::new(op)),
            scope: Boxed,
            data: request.data,
            _borrow: PhantomData,
        };
        self.entries.push(Some(moved));
        self.incomplete += 1;
        self.entries.len() - 1
    }

    /// Completes the request at `i` if it is done.
    fn poll_at(&mut self, i: usize) -> Option<(usize, Status, &'a D)> {
        let r = self.entries[i].as_mut()?;
        let status = fatal(r.poll())?;
        let data = r.data();
        self.entries[i] = None;
        self.incomplete -= 1;
        Some((i, status, data))
    }

    /// Completes one request, waiting if none is done (`MPI_Waitany`); `None` when none is
    /// left.
    pub fn wait_any(&mut self) -> Option<(usize, Status, &'a D)> {
        while self.incomplete > 0 {
            if let Some(done) = self.test_any() {
                return Some(done);
            }
        }
        None
    }

    /// Completes at least one request, waiting if none is done, and every other that is
    /// done (`MPI_Waitsome`); `result` is cleared first.
    pub fn wait_some(&mut self, result: &mut Vec<(usize, Status, &'a D)>) {
        result.clear();
        while self.incomplete > 0 && result.is_empty() {
            self.test_some(result);
        }
    }

    /// Completes every request (`MPI_Waitall`); `result` is cleared first.
    pub fn wait_all(&mut self, result: &mut Vec<(usize, Status, &'a D)>) {
        result.clear();
        while self.incomplete > 0 {
            let mut some = Vec::new();
            self.test_some(&mut some);
            result.extend(some);
        }
    }

    /// Completes one request that is done, if any (`MPI_Testany`).
    pub fn test_any(&mut self) -> Option<(usize, Status, &'a D)> {
        (0..self.entries.len()).find_map(|i| self.poll_at(i))
    }

    /// Completes every request that is done (`MPI_Testsome`); `result` is cleared first.
    pub fn test_some(&mut self, result: &mut Vec<(usize, Status, &'a D)>) {
        result.clear();
        for i in 0..self.entries.len() {
            if let Some(done) = self.poll_at(i) {
                result.push(done);
            }
        }
    }

    /// Completes every request if all are done (`MPI_Testall`): true then, with `result`
    /// holding them all; else false, and nothing is completed.
    pub fn test_all(&mut self, result: &mut Vec<(usize, Status, &'a D)>) -> bool {
        result.clear();
        let all_done = self
            .entries
            .iter_mut()
            .flatten()
            .all(|r| r.with_operation(|op| op.is_done()));
        if !all_done {
            return false;
        }
        for i in 0..self.entries.len() {
            if let Some(done) = self.poll_at(i) {
                result.push(done);
            }
        }
        true
    }
}
