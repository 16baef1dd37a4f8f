//! One process's runner: the timed loop of a transfer method and one loop of each
//! method (Sendrecv, Alltoallv, non-blocking) over the process's exchanges; its counters.

use pagewire::datatype::{Partition, PartitionMut};
use pagewire::request;
use pagewire::traits::*;
use pagewire::{SimpleCommunicator, TransportKind, Universe};
use pagewire_tools::msgperf::RowCounters;

use super::buffers::{disjoint_mut, Buffers, Stamp};
use super::Method;
use crate::patterns::Exchange;
use crate::Result;

/// One process's view of a run.
pub(super) struct Runner<'u> {
    pub(super) universe: &'u Universe,
    pub(super) world: SimpleCommunicator,
    pub(super) me: usize,
    pub(super) buffers: Buffers,
}

impl Runner<'_> {
    /// Runs `loops` timed loops (after `pre` untimed ones) of `method` over this process's
    /// `exchanges` at length `len`; returns the seconds of the timed loops.
    pub(super) fn run(
        &mut self,
        method: Method,
        exchanges: &[Exchange],
        len: usize,
        msg: usize,
        pre: usize,
        loops: usize,
    ) -> Result<f64> {
        let mut start = pagewire::time();
        for iteration in 0..pre + loops {
            if iteration == pre {
                start = pagewire::time();
            }
            match method {
                Method::Sendrecv => self.sendrecv(exchanges, len, msg, iteration)?,
                Method::Alltoallv => self.alltoallv(exchanges, len, msg, iteration)?,
                Method::Nonblocking => self.nonblocking(exchanges, len, msg, iteration)?,
            }
        }
        Ok(pagewire::time() - start)
    }

    fn sendrecv(
        &mut self,
        ex: &[Exchange],
        len: usize,
        msg: usize,
        iteration: usize,
    ) -> Result<()> {
        for (i, e) in ex.iter().enumerate() {
            let s = Stamp::new(i, msg, iteration);
            let tag = i as i32;
            let at = self.buffers.take(len);
            self.buffers.fill(at, len, self.me, s);
            if let Some(src) = e.recv_from {
                self.buffers.prepare(at, len, src, s);
            }
            let send = &self.buffers.send[at..at + len];
            let recv = &mut self.buffers.recv[at..at + len];
            match (e.send_to, e.recv_from) {
                (Some(d), None) => self
                    .world
                    .process_at_rank(d as i32)
                    .try_send_with_tag(send, tag)?,
                (None, Some(src)) => {
                    self.world
                        .process_at_rank(src as i32)
                        .try_receive_into_with_tag(recv, Some(tag))?;
                }
                (Some(d), Some(src)) => request::scope(|scope| -> Result<()> {
                    let r = self
                        .world
                        .process_at_rank(src as i32)
                        .try_immediate_receive_into_with_tag(scope, recv, Some(tag))?;
                    self.world
                        .process_at_rank(d as i32)
                        .try_send_with_tag(send, tag)?;
                    r.try_wait()?;
                    Ok(())
                })?,
                (None, None) => {}
            }
            if let Some(src) = e.recv_from {
                self.buffers.check(at, len, src, self.me, s)?;
            }
        }
        Ok(())
    }

    fn alltoallv(
        &mut self,
        ex: &[Exchange],
        len: usize,
        msg: usize,
        iteration: usize,
    ) -> Result<()> {
        let n = self.world.size() as usize;
        // (peer, exchange index), in rank order: the order of the packed blocks.
        let mut sends: Vec<(usize, usize)> = ex
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.send_to.map(|d| (d, i)))
            .collect();
        let mut recvs: Vec<(usize, usize)> = ex
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.recv_from.map(|s| (s, i)))
            .collect();
        sends.sort();
        recvs.sort();
        // One window for the loop's messages: as many slots as b_eff would take.
        let slot = len.div_ceil(8) * 8;
        let window = self.buffers.take(slot * ex.len().max(1));
        let mut send_counts = vec![0i32; n];
        let mut recv_counts = vec![0i32; n];
        for (k, &(d, i)) in sends.iter().enumerate() {
            send_counts[d] = len as i32;
            let s = Stamp::new(i, msg, iteration);
            self.buffers.fill(window + k * len, len, self.me, s);
        }
        for (k, &(src, i)) in recvs.iter().enumerate() {
            recv_counts[src] = len as i32;
            let s = Stamp::new(i, msg, iteration);
            self.buffers.prepare(window + k * len, len, src, s);
        }
        let send = &self.buffers.send[window..window + sends.len() * len];
        let recv = &mut self.buffers.recv[window..window + recvs.len() * len];
        let send = Partition::new(
            send,
            send_counts.clone(),
            packed_in_rank_order(&send_counts),
        );
        let displs = packed_in_rank_order(&recv_counts);
        let mut recv = PartitionMut::new(recv, recv_counts, displs);
        self.world.try_all_to_all_varcount_into(&send, &mut recv)?;
        for (k, &(src, i)) in recvs.iter().enumerate() {
            let s = Stamp::new(i, msg, iteration);
            self.buffers.check(window + k * len, len, src, self.me, s)?;
        }
        Ok(())
    }

    fn nonblocking(
        &mut self,
        ex: &[Exchange],
        len: usize,
        msg: usize,
        iteration: usize,
    ) -> Result<()> {
        let stamp = |i| Stamp::new(i, msg, iteration);
        let mut slots = Vec::with_capacity(ex.len());
        for (i, e) in ex.iter().enumerate() {
            let at = self.buffers.take(len);
            self.buffers.fill(at, len, self.me, stamp(i));
            if let Some(src) = e.recv_from {
                self.buffers.prepare(at, len, src, stamp(i));
            }
            slots.push((at, len));
        }
        let world = &self.world;
        let send = &self.buffers.send;
        let recv_slices = disjoint_mut(&mut self.buffers.recv, &slots);
        request::scope(|scope| -> Result<()> {
            let mut requests = Vec::with_capacity(2 * ex.len());
            for ((i, e), recv) in ex.iter().enumerate().zip(recv_slices) {
                let tag = i as i32;
                if let Some(src) = e.recv_from {
                    requests.push(
                        world
                            .process_at_rank(src as i32)
                            .try_immediate_receive_into_with_tag(scope, recv, Some(tag))?,
                    );
                }
                if let Some(d) = e.send_to {
                    let (at, len) = slots[i];
                    requests.push(
                        world
                            .process_at_rank(d as i32)
                            .try_immediate_send_with_tag(scope, &send[at..at + len], tag)?,
                    );
                }
            }
            for r in requests {
                r.try_wait()?;
            }
            Ok(())
        })?;
        for (i, e) in ex.iter().enumerate() {
            if let Some(src) = e.recv_from {
                self.buffers
                    .check(slots[i].0, len, src, self.me, stamp(i))?;
            }
        }
        Ok(())
    }

    pub(super) fn counters(&self) -> Option<RowCounters> {
        (self.universe.transport() == TransportKind::Pagewire)
            .then(|| RowCounters::now(self.universe))
    }
}

/// The displacements of blocks of `counts` elements packed one after another in rank order.
fn packed_in_rank_order(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}
