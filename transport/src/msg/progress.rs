//! A pass of progress: the NIC's completions and the local path's rings polled, the peers
//! with queued work served, and every protocol in flight advanced (rendezvous, puts and
//! gets, active messages, failing requests), then the idle rank's spin or yield.

use super::state::wr_parts;
use super::{Arrival, PointToPoint, WrKind};
use crate::error::{Error, Result};
use crate::nic::{Completion, WcStatus};

/// Completions taken from the NIC per poll.
const POLL_BATCH: usize = 64;

/// Empty progress passes in a row before a rank that yields when idle starts yielding.
const SPIN_PASSES_BEFORE_YIELD: u32 = 64;

/// Progress passes per NIC poll when every rank is reached through the local path.
const NIC_POLL_EVERY_WHEN_LOCAL: u32 = 64;

impl PointToPoint {
    /// Makes progress: polls completions and advances every protocol. Returns whether
    /// anything happened.
    pub fn progress(&mut self) -> Result<bool> {
        let mut events = 0usize;
        let mut first_err = None;
        // With every rank on the local path the NIC carries only liveness probes (and the
        // one-sided operations of windows, while there are any): it is polled on one pass in
        // NIC_POLL_EVERY_WHEN_LOCAL, not on each.
        self.passes = self.passes.wrapping_add(1);
        let poll_nic =
            !self.all_local || self.rma.exposing() || self.passes % NIC_POLL_EVERY_WHEN_LOCAL == 0;
        if poll_nic {
            loop {
                self.scratch.clear();
                let n = self.nic.poll_cq(self.cq, &mut self.scratch, POLL_BATCH)?;
                events += n;
                let batch = std::mem::take(&mut self.scratch);
                for c in &batch {
                    // Every completion of the batch is handled, even after an error.
                    if let Err(e) = self.handle_completion(c) {
                        first_err.get_or_insert(e);
                    }
                }
                self.scratch = batch;
                if n < POLL_BATCH {
                    break;
                }
            }
        }
        if self.local.is_some() {
            events += self.poll_local(&mut first_err);
        }
        let mut i = 0;
        while i < self.service.len() {
            let peer = self.service[i];
            self.flush_control(peer)?;
            self.drain_queued(peer)?;
            self.return_credits(peer)?;
            let p = &mut self.peers[peer];
            let done = !p.has_queued() && (!p.credits.owes_half() || p.dead.is_some());
            if done {
                p.in_service = false;
                self.service.swap_remove(i);
            } else {
                i += 1;
            }
        }
        if !self.active.is_empty() {
            events += self.advance_rendezvous();
        }
        if !self.rma.active.is_empty() {
            events += self.advance_rma();
        }
        if self.active_messages.busy() {
            events += self.advance_active_messages();
        }
        if !self.failing.is_empty() {
            self.settle_all_failing();
        }
        self.last_progress_made = events > 0;
        if events > 0 {
            self.idle_passes = 0;
        } else {
            self.idle_passes = self.idle_passes.saturating_add(1);
            // A few passes spin first: an answer from a rank that has a CPU is that close.
            if self.yield_when_idle && self.idle_passes > SPIN_PASSES_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(events > 0),
        }
    }

    /// `peer` has queued sends, queued control messages or credits to return: progress
    /// visits it until it has none.
    pub(crate) fn needs_service(&mut self, peer: usize) {
        let p = &mut self.peers[peer];
        if !p.in_service {
            p.in_service = true;
            self.service.push(peer);
        }
    }

    fn handle_completion(&mut self, c: &Completion) -> Result<()> {
        let (kind, peer, index) = wr_parts(c.wr_id);
        if kind != WrKind::Recv as u64 {
            self.peers[peer].in_flight = self.peers[peer].in_flight.saturating_sub(1);
        }
        if kind == WrKind::SendSlot as u64 {
            self.send_free.push(index);
        }
        if kind == WrKind::Rma as u64 {
            // The window operation waiting for it sees the status; a failure also ends the
            // peer's traffic below, as its queue pair is now in the error state.
            self.rma_completed(index, c.status);
        }
        if c.status != WcStatus::Success {
            if kind == WrKind::Rdma as u64 {
                // The lease stays with its request, which `fail_peer` releases.
                self.take_rdma(index);
            }
            self.fail_peer(peer, c.status, "moving data");
            return Ok(());
        }
        match kind {
            // Nothing more is taken from a peer that failed (or broke the protocol).
            k if k == WrKind::Recv as u64 && self.peers[peer].dead.is_some() => Ok(()),
            k if k == WrKind::Recv as u64 => {
                self.handle_incoming(peer, Arrival::Slot(index), c.byte_len as usize)
            }
            k if k == WrKind::Rdma as u64 => self.rdma_done(index),
            _ => Ok(()),
        }
    }

    /// Handles the messages waiting in the local path's rings, at most a ring's worth per
    /// peer (so one busy sender cannot starve the others); the first error goes to
    /// `first_err`. Returns how many there were.
    fn poll_local(&mut self, first_err: &mut Option<Error>) -> usize {
        let Some(local) = self.local.as_ref() else {
            return 0;
        };
        let mut events = 0;
        for i in 0..local.local_ranks().len() {
            let local = self.local.as_ref().expect("a local path");
            let (peer, budget) = (local.local_ranks()[i], local.cells());
            for _ in 0..budget {
                let Some((offset, len, short)) = self.local.as_ref().and_then(|l| l.peek(peer))
                else {
                    break;
                };
                let at = if short {
                    Arrival::ShortCell(offset)
                } else {
                    Arrival::Cell(offset)
                };
                // Nothing more is taken from a peer that failed (or broke the protocol).
                if self.peers[peer].dead.is_none() {
                    if let Err(e) = self.handle_incoming(peer, at, len) {
                        first_err.get_or_insert(e);
                    }
                }
                self.local.as_mut().expect("a local path").release(peer);
                events += 1;
            }
        }
        events
    }
}
