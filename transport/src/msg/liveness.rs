//! Telling a dead peer from a slow one: zero-length RDMA probes to the peers a waiting
//! request depends on, after [`super::LIVENESS_CHECK_AFTER`] without progress.

use std::time::Instant;

use super::raw;
use super::{
    wr_id, PointToPoint, RecvState, Req, RequestId, WrKind, IDLE_POLLS_PER_CLOCK_READ,
    LIVENESS_CHECK_AFTER, SLEEP_AFTER_IDLE_POLLS, SLEEP_TIMEOUT,
};
use crate::error::{Error, Result};
use crate::nic::{Opcode, SendWr};

/// How a blocking call waits between passes of the engine that made no progress: the
/// clock is read only every `IDLE_POLLS_PER_CLOCK_READ` empty passes in a row; when ranks
/// outnumber CPUs and all are local, it sleeps after `SLEEP_AFTER_IDLE_POLLS` until a
/// local peer writes; and after `LIVENESS_CHECK_AFTER` without progress it says that the
/// peers waited for should be probed.
#[derive(Default)]
pub(super) struct IdleWait {
    polls: u32,
    since: Option<Instant>,
}

impl IdleWait {
    /// Called after each pass of `p2p`'s engine; true when the waiter should probe its peers.
    pub(super) fn after_pass(&mut self, p2p: &PointToPoint) -> bool {
        if p2p.last_progress_made {
            *self = IdleWait::default();
            return false;
        }
        self.polls += 1;
        if self.polls >= SLEEP_AFTER_IDLE_POLLS && p2p.all_local && p2p.yield_when_idle {
            // Ranks outnumber CPUs: give the CPU up until a local peer sends something.
            if let Some(local) = &p2p.local {
                local.sleep(SLEEP_TIMEOUT);
            }
        }
        if self.polls % IDLE_POLLS_PER_CLOCK_READ != 0 {
            return false;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() <= LIVENESS_CHECK_AFTER {
            return false;
        }
        self.since = Some(Instant::now());
        true
    }
}

impl PointToPoint {
    /// If a wait makes no progress for a while, sends a zero-length RDMA WRITE to the peers
    /// it depends on: a dead peer turns into an error completion instead of a hang.
    pub(super) fn probe_peers_of(&mut self, id: RequestId) -> Result<()> {
        let peers: Vec<usize> = match self.reqs.get(id) {
            Some(Req::Send(s)) => vec![s.peer],
            Some(Req::Recv(r)) => match (&r.state, r.sel.source) {
                (RecvState::Rndv(rv), _) => vec![rv.peer],
                (RecvState::LocalSplit(ls), _) => vec![ls.peer],
                (RecvState::Posted, Some(s)) => vec![s],
                (RecvState::Posted, None) => (0..self.size).collect(),
            },
            _ => vec![],
        };
        for p in peers {
            self.send_liveness_probe(p);
        }
        Ok(())
    }

    /// Posts a zero-length RDMA WRITE to `peer`: its completion fails (and the peer is
    /// marked dead) if the peer has gone. Nothing for oneself or a peer already dead.
    pub(super) fn send_liveness_probe(&mut self, p: usize) {
        if self.peers[p].dead.is_none() && p != self.rank {
            let wr = SendWr {
                wr_id: wr_id(WrKind::Probe, p, 0),
                opcode: Opcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
                sgl: &[],
                inline: false,
                signaled: true,
            };
            if raw::post_send(&*self.nic, self.peers[p].qpn, &wr).is_ok() {
                self.peers[p].in_flight += 1;
            }
        }
    }

    /// For a blocking probe that has found nothing for a while (`MPI_Probe` must not spin
    /// forever on a dead sender): fails once none of `senders` (the ranks that could send
    /// the message; this rank, blocked here, is skipped) is alive, and otherwise sends them
    /// liveness probes, whose failures the next progress records.
    pub fn check_probe_senders(&mut self, senders: &[usize]) -> Result<()> {
        for &s in senders {
            self.check_rank(s)?;
        }
        let others: Vec<usize> = senders
            .iter()
            .copied()
            .filter(|&p| p != self.rank)
            .collect();
        if let Some(&first) = others.first() {
            if let (Some(status), true) = (
                self.peers[first].dead,
                others.iter().all(|&p| self.peers[p].dead.is_some()),
            ) {
                return Err(Error::Communication {
                    peer: first,
                    status,
                    what: "probe (no rank that could send the message is alive)",
                });
            }
        }
        for p in others {
            self.send_liveness_probe(p);
        }
        Ok(())
    }
}
