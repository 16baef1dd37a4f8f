//! How a request fails: it reports its error only once nothing can touch its buffer any
//! more.
//!
//! A request whose operation fails mid-way may still have its buffer in use: by an RDMA
//! operation of this NIC in flight, or by the peer, through a region this side announced
//! (RGET) or offered in a CTS (RPUT). The caller frees the buffer once the request reports,
//! so reporting at once would let those bytes land in freed memory. A failing rendezvous
//! therefore stops starting work, lets what is in flight finish (the peer's FIN or
//! ChunkDone gives each region back), and then completes with its error. A receiver also
//! tells the sender it wants nothing more (ALL_DONE), so the sender's request ends too.
//! When the connection itself failed, the peer no longer counts and only this NIC's
//! operations in flight are waited for: the queue pair's error state flushes them.
//!
//! An error met while progressing one request belongs to that request; the layer returns
//! an error from [`PointToPoint::wait`] or [`PointToPoint::test`] only for the request
//! asked about, and only once it has finished.

use super::rndv::takes_nothing_more;
use super::{PointToPoint, RecvState, Req, RequestId, SendState};
use crate::error::Error;
use crate::nic::WcStatus;

/// A rendezvous request that failed while its buffer may still be in use; it completes with
/// `error` once nothing can use the buffer.
pub(crate) struct Failing {
    pub id: RequestId,
    pub error: Error,
    /// The connection to the peer failed: the peer can no longer use the buffer, so only
    /// this NIC's operations in flight are waited for.
    pub connection_lost: bool,
}

impl PointToPoint {
    /// Request `id` failed with `error`. A posted receive leaves the matcher and a send that
    /// has not started is dropped from its queue: both complete at once. A rendezvous
    /// completes once nothing can touch its buffer ([`Failing`]).
    pub(crate) fn fail_request(&mut self, id: RequestId, error: Error, connection_lost: bool) {
        let rendezvous = match self.reqs.get(id) {
            None | Some(Req::Done(_)) => return,
            Some(Req::Send(s)) => matches!(s.state, SendState::Rndv(_)),
            Some(Req::Recv(r)) => {
                if matches!(r.state, RecvState::Posted) {
                    self.matcher.cancel(|x| *x == id);
                }
                matches!(r.state, RecvState::Rndv(_))
            }
        };
        if !rendezvous {
            self.complete(id, Err(error));
            return;
        }
        match self.failing.iter_mut().find(|f| f.id == id) {
            // The first error is the one reported.
            Some(f) => f.connection_lost |= connection_lost,
            None => self.failing.push(Failing {
                id,
                error,
                connection_lost,
            }),
        }
        self.settle_failing(id);
    }

    /// Whether request `id` has failed and only waits for its buffer to be free: it starts
    /// no more work.
    pub(crate) fn is_failing(&self, id: RequestId) -> bool {
        self.failing.iter().any(|f| f.id == id)
    }

    /// Completes failing request `id` if nothing can use its buffer any more.
    pub(crate) fn settle_failing(&mut self, id: RequestId) {
        let Some(i) = self.failing.iter().position(|f| f.id == id) else {
            return;
        };
        let lost = self.failing[i].connection_lost;
        if self.rdma.iter().flatten().any(|op| op.req == id) {
            return;
        }
        let mut all_done = None;
        match self.reqs.get(id) {
            Some(Req::Send(s)) => {
                if let SendState::Rndv(rs) = &s.state {
                    if !lost && (!rs.leases.is_empty() || rs.writes_out > 0) {
                        return;
                    }
                }
            }
            Some(Req::Recv(r)) => {
                if let RecvState::Rndv(rv) = &r.state {
                    if !lost && (!rv.leases.is_empty() || rv.tail_lease.is_some()) {
                        return;
                    }
                    if !lost {
                        // The sender may stop: this side takes nothing more.
                        let h = takes_nothing_more(rv.get, rv.next, rv.sreq, id.0);
                        all_done = Some((rv.peer, h));
                    }
                }
            }
            None | Some(Req::Done(_)) => {}
        }
        let failing = self.failing.swap_remove(i);
        if let Some((peer, h)) = all_done {
            // If this fails the connection fails too, which ends the sender's request.
            let _ = self.send_control(peer, h);
        }
        self.complete(id, Err(failing.error));
    }

    /// Completes the failing requests whose buffers have become free (after a progress
    /// pass).
    pub(crate) fn settle_all_failing(&mut self) {
        let ids: smallvec::SmallVec<[RequestId; 4]> = self.failing.iter().map(|f| f.id).collect();
        for id in ids {
            self.settle_failing(id);
        }
    }

    /// Every request involving `peer` fails; further operations with it fail at once.
    pub(crate) fn fail_peer(&mut self, peer: usize, status: WcStatus, what: &'static str) {
        self.fail_peer_with(peer, status, || Error::Communication { peer, status, what });
    }

    /// `peer` sent what no correct peer sends (`why`): every request involving it fails
    /// with [`Error::ProtocolViolation`], and nothing more it sends is taken (the NIC reports
    /// later operations with it as a remote invalid request).
    pub(crate) fn protocol_violation(&mut self, peer: usize, why: &'static str) {
        if self.peers[peer].dead.is_none() {
            eprintln!(
                "pagewire: rank {}: rank {peer} broke the protocol ({why}); communication with it has stopped",
                self.rank()
            );
        }
        self.fail_peer_with(peer, WcStatus::RemoteInvalidRequest, || {
            Error::ProtocolViolation { peer, why }
        });
    }

    /// Every request involving `peer` fails with `err()` (once this NIC's operations in
    /// flight for it are over); the peer is marked dead with `status`, which later
    /// operations with it report.
    fn fail_peer_with(&mut self, peer: usize, status: WcStatus, err: impl Fn() -> Error) {
        if self.peers[peer].dead.is_some() {
            return;
        }
        self.peers[peer].dead = Some(status);
        for id in self.reqs.ids() {
            let involved = match self.reqs.get(id) {
                Some(Req::Send(s)) => s.peer == peer,
                Some(Req::Recv(r)) => match &r.state {
                    RecvState::Rndv(rv) => rv.peer == peer,
                    RecvState::LocalSplit(ls) => ls.peer == peer,
                    RecvState::Posted => r.sel.source == Some(peer),
                },
                _ => false,
            };
            if involved {
                self.fail_request(id, err(), true);
            }
        }
        self.peers[peer].queued.clear();
        self.peers[peer].control.clear();
    }
}
