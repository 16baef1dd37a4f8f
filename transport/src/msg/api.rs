//! The nonblocking point-to-point calls on byte buffers: isend, irecv, probe, matched
//! probe and receive, test, wait, cancel (MPI-3.1 sections 3.7-3.8).

#[cfg(doc)]
use super::config::MsgConfig;
use super::liveness;
use super::matching::{Envelope, MessageHandle, Selector};
use super::raw::{UserBuf, UserBufMut};
use super::{
    PointToPoint, RecvReq, RecvState, Req, RequestId, SendReq, SendState, Status, Unexpected,
    TAG_UB,
};
use crate::error::{Error, Result};
use crate::ErrorClass;

/// What a probe reports about an unexpected message.
pub(super) fn unexpected_status(env: &Envelope, u: &Unexpected) -> Status {
    Status {
        source: env.source,
        tag: env.tag,
        count: match u {
            Unexpected::Eager { size, .. } => *size,
            Unexpected::Rts { header, .. } | Unexpected::LocalRts { header, .. } => {
                header.size as usize
            }
        },
    }
}

impl PointToPoint {
    pub(super) fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.size {
            return Err(Error::NoSuchRank {
                rank,
                size: self.size,
            });
        }
        Ok(())
    }

    pub(super) fn check_tag(tag: i32) -> Result<()> {
        if !(0..=TAG_UB).contains(&tag) {
            return Err(Error::InvalidTag { tag, max: TAG_UB });
        }
        Ok(())
    }

    /// Whether a buffer with gaps laid out as `layout` should be handed to this layer as it
    /// is ([`UserBuf::gapped`], [`UserBufMut::gapped`]) rather than packed into a
    /// contiguous copy first. As it is whenever its bytes are copied anyway (an eager
    /// message, or a rendezvous in `copy`: the slots gather and scatter its runs, one copy
    /// fewer than packing); in a zero-copy mode when the NIC can move its runs in place
    /// (scatter-gather rendezvous, `msg/rndv.rs`) for less than packing costs: runs of
    /// [`MsgConfig::sg_min_run`] bytes on average at least in a buffer of
    /// [`MsgConfig::sg_min_bytes`] at least (measured: docs/results.md, "Choosing the defaults"), at
    /// most 2^24 of them (`SCATTER_GATHER_MAX_RUNS` in `msg/rndv.rs`), each under 1 GiB, and a
    /// span (what registering it pins) at most 4 times the bytes that travel.
    /// Each side decides for its own buffer; the protocol works with either choice on the
    /// other side.
    pub fn moves_in_place(&self, layout: &crate::buffer_mode::Layout) -> bool {
        let len = layout.len();
        if len <= self.cfg.eager_limit as u64 || !self.mode.is_zero_copy() {
            return true;
        }
        let runs = layout.run_count();
        runs <= super::rndv::SCATTER_GATHER_MAX_RUNS
            && len >= self.cfg.sg_min_bytes as u64
            && len / runs.max(1) >= self.cfg.sg_min_run as u64
            && layout.longest_run() < 1 << 30
            && layout.span() <= len.saturating_mul(4)
    }

    /// Starts sending `buf` to `dest` (`MPI_Isend`, or `MPI_Issend` when `sync`).
    pub fn isend(
        &mut self,
        dest: usize,
        tag: i32,
        context: u32,
        buf: UserBuf,
        sync: bool,
    ) -> Result<RequestId> {
        self.check_rank(dest)?;
        Self::check_tag(tag)?;
        if let Some(status) = self.peers[dest].dead {
            return Err(Error::Communication {
                peer: dest,
                status,
                what: "starting a send",
            });
        }
        let id = self.reqs.insert(Req::Send(SendReq {
            peer: dest,
            tag,
            context,
            buf,
            sync,
            state: SendState::Queued,
        }));
        self.peers[dest].queued.push_back(id);
        if let Err(e) = self.drain_queued(dest) {
            // The request has an id now: its wait reports the error, once it is safe to.
            self.fail_request(id, e, false);
        }
        if !self.peers[dest].queued.is_empty() {
            self.needs_service(dest);
        }
        Ok(id)
    }

    /// Sends `buf` to `dest` at once if it goes eagerly and nothing is queued before it (a
    /// send or a control message waiting for a credit, or for room in the local path's
    /// ring): what [`PointToPoint::isend`] followed by a wait does for such a message,
    /// without a request. `Ok(false)`: not sent, nothing happened (start it with `isend`).
    /// The blocking calls try it first.
    pub fn send_eager_now(
        &mut self,
        dest: usize,
        tag: i32,
        context: u32,
        buf: &UserBuf,
    ) -> Result<bool> {
        self.check_rank(dest)?;
        Self::check_tag(tag)?;
        let local = self.is_local(dest);
        let p = &self.peers[dest];
        if buf.len() > self.eager_limit_on(local)
            || p.has_queued()
            || (!local && !p.credits.can_send())
            || p.dead.is_some()
        {
            return Ok(false);
        }
        if !self.post_eager(dest, tag, context, buf, None)? {
            return Ok(false);
        }
        if !local {
            self.peers[dest].credits.spend();
        }
        Ok(true)
    }

    /// Starts receiving into `buf` (`MPI_Irecv`); `source`/`tag` `None` are wildcards.
    pub fn irecv(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
        buf: UserBufMut,
    ) -> Result<RequestId> {
        if let Some(s) = source {
            self.check_rank(s)?;
            if let Some(status) = self.peers[s].dead {
                return Err(Error::Communication {
                    peer: s,
                    status,
                    what: "posting a receive",
                });
            }
        }
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        let sel = Selector {
            source,
            tag,
            context,
        };
        let id = self.reqs.insert(Req::Recv(RecvReq {
            sel,
            buf,
            state: RecvState::Posted,
        }));
        if let Some((env, u)) = self.matcher.post(sel, id) {
            if let Err(e) = self.deliver_unexpected(id, env, u) {
                self.fail_request(id, e, false);
            }
        }
        Ok(id)
    }

    /// Whether a matching message has arrived, without receiving it (`MPI_Iprobe`).
    pub fn iprobe(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
    ) -> Result<Option<Status>> {
        self.progress()?;
        let sel = Selector {
            source,
            tag,
            context,
        };
        Ok(self
            .matcher
            .probe(&sel)
            .map(|(env, u)| unexpected_status(env, u)))
    }

    /// Like [`PointToPoint::iprobe`], but the message found is taken out of matching
    /// (`MPI_Improbe`): no other receive or probe can match it, and [`PointToPoint::imrecv`]
    /// with the handle receives it.
    pub fn improbe(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
    ) -> Result<Option<(MessageHandle, Status)>> {
        if let Some(s) = source {
            self.check_rank(s)?;
        }
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        self.progress()?;
        let sel = Selector {
            source,
            tag,
            context,
        };
        Ok(self
            .matcher
            .take_matched(&sel)
            .map(|(h, env, u)| (h, unexpected_status(&env, u))))
    }

    /// Starts receiving the message a matched probe returned into `buf` (`MPI_Imrecv`).
    pub fn imrecv(&mut self, msg: MessageHandle, buf: UserBufMut) -> Result<RequestId> {
        let (env, u) = self.matcher.claim(msg).ok_or_else(|| {
            Error::invalid(
                ErrorClass::Request,
                "unknown or already received matched message",
            )
        })?;
        let at_sender = matches!(u, Unexpected::Rts { .. } | Unexpected::LocalRts { .. });
        if let (Some(status), true) = (self.peers[env.source].dead, at_sender) {
            // The payload is still at the sender, which is gone.
            return Err(Error::Communication {
                peer: env.source,
                status,
                what: "receiving a matched message",
            });
        }
        let id = self.reqs.insert(Req::Recv(RecvReq {
            sel: Selector {
                source: Some(env.source),
                tag: Some(env.tag),
                context: env.context,
            },
            buf,
            state: RecvState::Posted,
        }));
        if let Err(e) = self.deliver_unexpected(id, env, u) {
            self.fail_request(id, e, false);
        }
        Ok(id)
    }

    /// Completes `id` if it is done: `Some(result)` (the request is then gone), else `None`.
    ///
    /// An error met while making progress that belongs to no other request fails `id`
    /// itself; either way, an error is returned only once `id` has finished, so its buffer
    /// is never touched after this reports.
    pub fn test(&mut self, id: RequestId) -> Result<Option<Result<Status>>> {
        if let Err(e) = self.progress() {
            if self.reqs.get(id).is_none() {
                return Err(e);
            }
            self.fail_request(id, e, false);
        }
        match self.reqs.get(id) {
            None => Err(Error::invalid(
                ErrorClass::Request,
                "unknown or already completed request",
            )),
            Some(Req::Done(_)) => match self.reqs.remove(id) {
                Some(Req::Done(r)) => Ok(Some(r)),
                _ => unreachable!(),
            },
            Some(_) => Ok(None),
        }
    }

    /// Waits for `id` and returns its outcome (`MPI_Wait`). If the peer stops answering,
    /// the NIC's error completion ends the wait with [`Error::Communication`].
    pub fn wait(&mut self, id: RequestId) -> Result<Status> {
        // A request that completed when it started (an eager send, a receive matched by an
        // unexpected message) needs no pass of the engine.
        if let Some(Req::Done(_)) = self.reqs.get(id) {
            if let Some(Req::Done(r)) = self.reqs.remove(id) {
                return r;
            }
        }
        let mut idle = liveness::IdleWait::default();
        loop {
            if let Some(r) = self.test(id)? {
                return r;
            }
            if idle.after_pass(self) {
                self.probe_peers_of(id)?;
            }
        }
    }

    /// Whether `id` has completed, without completing it.
    pub fn is_done(&self, id: RequestId) -> bool {
        matches!(self.reqs.get(id), Some(Req::Done(_)))
    }

    /// Cancels a receive that has not matched (`MPI_Cancel`); true if it was cancelled.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if self.matcher.cancel(|r| *r == id).is_some() {
            if let Some(r) = self.reqs.get_mut(id) {
                *r = Req::Done(Err(Error::Cancelled));
            }
            return true;
        }
        false
    }
}
