//! A put or a get as a pipeline of RDMA chunks: the state machine behind both the blocking
//! calls ([`PointToPoint::put`], [`PointToPoint::get`]) and the request-based ones
//! ([`PointToPoint::rma_start`], `MPI_Rput` and `MPI_Rget`).
//!
//! The origin's buffer goes through the buffer mode as a rendezvous's does: a lease per
//! chunk (a bounce slot in `copy`, the registration cache in `pindown`, the on-demand key in
//! `odp`), one RDMA WRITE or READ each, at most the mode's depth in flight. A blocking call
//! waits for its oldest chunk in turn; a request's chunks are reaped and new ones posted by
//! every pass of progress, so the request moves while the application computes between
//! tests, and its wait only finishes it. The first error ends the pipeline once nothing of
//! it is in flight, so the buffer is never used after the operation reports.

use std::collections::VecDeque;

use super::raw::{UserBuf, UserBufMut};
use super::rndv_io::{LayerIo, LeaseIo, SideBuf};
use super::{PointToPoint, RequestId};
use crate::buffer_mode::{Direction, Lease, Transfer};
use crate::error::{Error, Result};
use crate::nic::{Opcode, Sge, WcStatus};
use crate::sys::{self, CmaDirection, Extent};
use crate::ErrorClass;

#[cfg(test)]
mod tests;

/// The most bytes one RDMA WRITE or READ of a put or get moves (the NICs carry up to
/// 2 GiB per work request).
const MAX_RDMA_CHUNK: usize = 1 << 30;

/// The origin's buffer of a put or a get, lent for the operation's time.
#[derive(Debug)]
pub enum RmaBuf {
    /// Put: the NIC reads it.
    Put(UserBuf),
    /// Get: the NIC writes it.
    Get(UserBufMut),
}

/// A request-based put or get in flight ([`PointToPoint::rma_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmaRequest(RequestId);

/// A request-based operation: moving, being stepped (taken out by the pass that advances
/// it), or finished with its outcome.
pub(crate) enum RmaEntry {
    Moving(Box<RmaOp>),
    Stepping,
    Done(Result<()>),
}

/// One put or get on its way: the origin's buffer and the pipeline moving it.
pub(crate) struct RmaOp {
    buf: RmaBuf,
    pipe: RmaPipeline,
}

impl RmaOp {
    /// Whether nothing more will be posted and nothing is in flight.
    fn finished(&self) -> bool {
        self.pipe.finished()
    }

    /// A pass of the pipeline with the layer's I/O (see [`RmaPipeline::step`]).
    fn step(&mut self, p2p: &mut PointToPoint, block: bool) -> usize {
        let mut io = LayerIo {
            p2p,
            peer: self.pipe.target,
            buf: self.buf.side(),
        };
        self.pipe.step(block, &mut io)
    }
}

impl RmaBuf {
    /// The buffer as a side of a transfer sees it.
    fn side(&self) -> SideBuf<'_> {
        match self {
            RmaBuf::Put(b) => SideBuf::Source(b),
            RmaBuf::Get(b) => SideBuf::Sink(b),
        }
    }
}

/// What a put's or get's pipeline needs from the layer besides leases of its buffer: RDMA
/// posts to its one target, and their completions.
pub(crate) trait RmaIo: LeaseIo {
    /// Posts `opcode` (an RDMA WRITE or READ) on `sge` to the target, waiting for room on
    /// its queue pair; the slot its completion will fill.
    fn post(&mut self, opcode: Opcode, sge: Sge) -> Result<usize>;

    /// The status of the work request of `slot` once it has completed (the slot is free
    /// then): waiting for it if `block`, else `None` while it is in flight.
    fn completion(&mut self, slot: usize, block: bool) -> Option<Result<WcStatus>>;
}

/// The chunks of one put (RDMA WRITEs) or get (READs): how far it is posted, what is in
/// flight, and the first error, after which nothing more is posted.
pub(crate) struct RmaPipeline {
    target: usize,
    remote_addr: u64,
    rkey: u32,
    /// The buffer mode's transfer; ended when the pipeline is.
    t: Transfer,
    len: usize,
    /// `Source`: a put, which WRITEs; `Sink`: a get, which READs.
    dir: Direction,
    /// Bytes posted so far.
    next: usize,
    /// Chunks in flight, oldest first: (slot, lease, offset, bytes).
    out: VecDeque<(usize, Lease, usize, usize)>,
    first_err: Option<Error>,
}

impl RmaPipeline {
    /// The pipeline of `len` bytes to (`Source`) or from (`Sink`) `remote_addr` of `target`
    /// under `rkey`, the mode's transfer `t` begun.
    pub(crate) fn new(
        target: usize,
        remote_addr: u64,
        rkey: u32,
        t: Transfer,
        len: usize,
        dir: Direction,
    ) -> RmaPipeline {
        RmaPipeline {
            target,
            remote_addr,
            rkey,
            t,
            len,
            dir,
            next: 0,
            out: VecDeque::new(),
            first_err: None,
        }
    }

    /// Whether nothing more will be posted and nothing is in flight.
    pub(crate) fn finished(&self) -> bool {
        (self.next >= self.len || self.first_err.is_some()) && self.out.is_empty()
    }

    /// The operation failed with `e` (unless it had already): nothing more is posted.
    pub(crate) fn fail(&mut self, e: Error) {
        self.first_err.get_or_insert(e);
    }

    /// Posts chunks up to the mode's depth (a put stages each into its lease first), then
    /// reaps the completed chunks in order (a get stages each out of its lease): waiting for
    /// the oldest if `block`, else only those done. Returns the chunks posted and reaped.
    pub(crate) fn step(&mut self, block: bool, io: &mut impl RmaIo) -> usize {
        let chunk = self.t.pipeline.chunk.clamp(1, MAX_RDMA_CHUNK);
        let depth = self.t.pipeline.depth.max(1);
        let mut moved = 0;
        while self.first_err.is_none() && self.next < self.len && self.out.len() < depth {
            let n = chunk.min(self.len - self.next);
            let lease = match io.lease(&self.t, self.next, n) {
                Ok(Some(l)) => l,
                Ok(None) => break, // no resources now: later
                Err(e) => {
                    self.first_err = Some(e);
                    break;
                }
            };
            let remote_addr = self.remote_addr + self.next as u64;
            let rkey = self.rkey;
            let opcode = match self.dir {
                Direction::Source => {
                    io.stage(&lease, self.next, n);
                    Opcode::RdmaWrite { remote_addr, rkey }
                }
                Direction::Sink => Opcode::RdmaRead { remote_addr, rkey },
            };
            let sge = Sge {
                addr: lease.addr,
                len: n as u32,
                lkey: lease.lkey,
            };
            match io.post(opcode, sge) {
                Ok(slot) => self.out.push_back((slot, lease, self.next, n)),
                Err(e) => {
                    io.release(lease);
                    self.first_err = Some(e);
                }
            }
            self.next += n;
            moved += 1;
        }
        while let Some(&(slot, _, _, _)) = self.out.front() {
            let Some(status) = io.completion(slot, block) else {
                break;
            };
            let (_, lease, offset, n) = self.out.pop_front().expect("the front");
            match status {
                Ok(WcStatus::Success) => {
                    if self.dir == Direction::Sink {
                        io.stage(&lease, offset, n);
                    }
                }
                Ok(status) => self.fail(Error::Communication {
                    peer: self.target,
                    status,
                    what: "one-sided access",
                }),
                Err(e) => self.fail(e),
            }
            io.release(lease);
            moved += 1;
            if block {
                break; // post more before waiting again
            }
        }
        moved
    }

    /// The finished pipeline's transfer (for the mode to end), and its outcome.
    pub(crate) fn end(self) -> (Transfer, Result<()>) {
        debug_assert!(
            self.out.is_empty(),
            "a pipeline ended with chunks in flight"
        );
        (self.t, self.first_err.map_or(Ok(()), Err))
    }
}

impl RmaIo for LayerIo<'_> {
    fn post(&mut self, opcode: Opcode, sge: Sge) -> Result<usize> {
        self.p2p.post_rma(self.peer, opcode, &[sge])
    }

    fn completion(&mut self, slot: usize, block: bool) -> Option<Result<WcStatus>> {
        if block {
            Some(self.p2p.wait_rma(slot))
        } else {
            self.p2p.take_rma(slot).map(Ok)
        }
    }
}

impl PointToPoint {
    /// Writes `buf` (put) into, or reads into `buf` (get) from, `remote_addr` of `target`'s
    /// exposed memory under `rkey`; returns once all of it has moved.
    pub(crate) fn rma_transfer(
        &mut self,
        target: usize,
        remote_addr: u64,
        rkey: u32,
        buf: RmaBuf,
    ) -> Result<()> {
        let Some(mut op) = self.rma_begin(target, remote_addr, rkey, buf)? else {
            return Ok(());
        };
        while !op.finished() {
            if op.step(self, true) == 0 && !op.finished() {
                // No lease now: what is in flight elsewhere frees one.
                if let Err(e) = self.progress() {
                    op.pipe.fail(e);
                }
            }
        }
        self.rma_end(*op)
    }

    /// Starts writing `buf` (put) into, or reading into `buf` (get) from, `remote_addr` of
    /// `target`'s exposed memory under `rkey` (`MPI_Rput`, `MPI_Rget`), and returns at once.
    /// The caller keeps `buf`'s memory valid until [`Self::rma_test`] or [`Self::rma_wait`]
    /// reports the request finished; then the data is at the target (a put) or in the
    /// buffer (a get).
    pub fn rma_start(
        &mut self,
        target: usize,
        remote_addr: u64,
        rkey: u32,
        buf: RmaBuf,
    ) -> Result<RmaRequest> {
        let entry = match self.rma_begin(target, remote_addr, rkey, buf)? {
            None => RmaEntry::Done(Ok(())),
            Some(mut op) => {
                op.step(self, false);
                RmaEntry::Moving(op)
            }
        };
        let moving = matches!(entry, RmaEntry::Moving(_));
        let id = self.rma.ops.insert(entry);
        if moving {
            self.rma.active.push(id);
        }
        Ok(RmaRequest(id))
    }

    /// Finishes request `r` if it is done: `Some(outcome)` (the request is then gone), else
    /// `None`. Makes progress first.
    pub fn rma_test(&mut self, r: RmaRequest) -> Result<Option<Result<()>>> {
        if let Err(e) = self.progress() {
            // A peer's failure reaches the request through its chunks' completions.
            if !e.is_peer_failure() {
                return Err(e);
            }
        }
        match self.rma.ops.get(r.0) {
            None => Err(Error::invalid(
                ErrorClass::Request,
                "unknown or already completed one-sided request",
            )),
            Some(RmaEntry::Done(_)) => match self.rma.ops.remove(r.0) {
                Some(RmaEntry::Done(outcome)) => Ok(Some(outcome)),
                _ => unreachable!("checked above"),
            },
            Some(_) => Ok(None),
        }
    }

    /// Waits for request `r` and returns its outcome.
    pub fn rma_wait(&mut self, r: RmaRequest) -> Result<()> {
        loop {
            if let Some(outcome) = self.rma_test(r)? {
                return outcome;
            }
        }
    }

    /// Whether request `r` has finished, without finishing it.
    pub fn rma_is_done(&self, r: RmaRequest) -> bool {
        matches!(self.rma.ops.get(r.0), Some(RmaEntry::Done(_)))
    }

    /// Drives progress until no request-based operation to `target` (any: `None`) moves.
    pub(super) fn rma_settle(&mut self, target: Option<usize>) -> Result<()> {
        let moving_to = |this: &Self| {
            this.rma
                .active
                .iter()
                .any(|id| match this.rma.ops.get(*id) {
                    Some(RmaEntry::Moving(op)) => target.is_none_or(|t| t == op.pipe.target),
                    _ => false,
                })
        };
        while moving_to(self) {
            if let Err(e) = self.progress() {
                if !e.is_peer_failure() {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Advances every request-based operation (a pass of progress): reaps its completed
    /// chunks, posts more, and finishes it when nothing is left. Returns the chunks moved.
    pub(super) fn advance_rma(&mut self) -> usize {
        let mut events = 0;
        let mut i = 0;
        while i < self.rma.active.len() {
            let id = self.rma.active[i];
            let Some(entry) = self.rma.ops.get_mut(id) else {
                self.rma.active.swap_remove(i);
                continue;
            };
            let RmaEntry::Moving(mut op) = std::mem::replace(entry, RmaEntry::Stepping) else {
                i += 1;
                continue;
            };
            events += op.step(self, false);
            let entry = if op.finished() {
                self.rma.active.swap_remove(i);
                RmaEntry::Done(self.rma_end(*op))
            } else {
                i += 1;
                RmaEntry::Moving(op)
            };
            if let Some(slot) = self.rma.ops.get_mut(id) {
                *slot = entry;
            }
        }
        events
    }

    /// The pipeline of a put or get of `buf`, its transfer begun; `None` for no bytes.
    fn rma_begin(
        &mut self,
        target: usize,
        remote_addr: u64,
        rkey: u32,
        buf: RmaBuf,
    ) -> Result<Option<Box<RmaOp>>> {
        let (addr, len, dir) = match &buf {
            RmaBuf::Put(b) => (b.addr(), b.len(), Direction::Source),
            RmaBuf::Get(b) => (b.addr(), b.len(), Direction::Sink),
        };
        if len == 0 {
            return Ok(None);
        }
        self.check_alive(target)?;
        if self.rma_local_copy(target, remote_addr, &buf)? {
            return Ok(None);
        }
        let t = self.mode.begin(&*self.nic, addr, len, dir)?;
        Ok(Some(Box::new(RmaOp {
            buf,
            pipe: RmaPipeline::new(target, remote_addr, rkey, t, len, dir),
        })))
    }

    /// A put or a get with a peer on the local path: one kernel copy (CMA) straight into or
    /// out of its exposed memory, as MPICH and Open MPI move one-sided data between the
    /// processes of a node; neither the NIC nor the buffer mode takes part, and the target's
    /// CPU does nothing. `Ok(false)`: `target` is reached through the NIC. The window above
    /// has checked the range against the target's exposed memory; a range the target does
    /// not map fails with `EFAULT` and nothing past the fault is written.
    fn rma_local_copy(&mut self, target: usize, remote_addr: u64, buf: &RmaBuf) -> Result<bool> {
        let Some(pid) = self
            .local
            .as_ref()
            .filter(|l| l.is_local(target))
            .and_then(|l| l.pid_of(target))
        else {
            return Ok(false);
        };
        let (addr, len, dir) = match buf {
            RmaBuf::Put(b) => (b.addr(), b.len(), CmaDirection::Write),
            RmaBuf::Get(b) => (b.addr(), b.len(), CmaDirection::Read),
        };
        let local = [Extent {
            addr,
            len: len as u64,
        }];
        let remote = [Extent {
            addr: remote_addr,
            len: len as u64,
        }];
        match sys::cma_copy(pid, dir, &local, &remote) {
            Ok(_) => Ok(true),
            Err(e) if super::local_copy::process_gone(&e) => {
                let what = "a one-sided operation";
                self.fail_peer(target, WcStatus::RetryExceeded, what);
                Err(Error::Communication {
                    peer: target,
                    status: WcStatus::RetryExceeded,
                    what,
                })
            }
            Err(e) => Err(Error::os(
                format!(
                    "process_vm_{}v of {len} bytes at {remote_addr:#x} of rank {target} \
                     (pid {pid})",
                    if dir == CmaDirection::Write {
                        "write"
                    } else {
                        "read"
                    }
                ),
                e,
            )),
        }
    }

    /// Ends `op`'s transfer; its outcome.
    fn rma_end(&mut self, op: RmaOp) -> Result<()> {
        let (t, outcome) = op.pipe.end();
        self.mode.end(&*self.nic, t);
        outcome
    }
}
