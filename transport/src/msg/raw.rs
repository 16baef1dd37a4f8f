//! The message layer's contract with the NIC's `unsafe` posting calls (one of the few
//! modules with `unsafe`), and its blocking conveniences.
//!
//! The user-buffer types the layer holds ([`UserBuf`], [`UserBufMut`]) are defined at the
//! buffer-mode layer and re-exported here, where the API has always named them.

pub use crate::buffer_mode::user_buf::{Layout, UserBuf, UserBufMut};
use crate::error::{Error, Result};
use crate::nic::{Nic, RecvWr, SendWr};

/// Posts a send work request whose buffers are message-layer slots or leases.
pub(crate) fn post_send(nic: &dyn Nic, qpn: u32, wr: &SendWr<'_>) -> Result<()> {
    // SAFETY: every SGE names either a slot of a pinned pool the message layer owns for its
    // whole life and does not touch until the completion, or a lease of a user buffer that
    // the request keeps alive (see `UserBuf::new`) until the completion is polled, or (an
    // inline request) bytes the NIC copies before `post_send` returns.
    unsafe { nic.post_send(qpn, wr) }.map_err(Error::from)
}

/// Posts a receive work request into a message-layer slot.
pub(crate) fn post_recv(nic: &dyn Nic, qpn: u32, wr: &RecvWr<'_>) -> Result<()> {
    // SAFETY: the slot belongs to a pinned pool the message layer owns and does not read
    // until the receive completes.
    unsafe { nic.post_recv(qpn, wr) }.map_err(Error::from)
}

impl super::PointToPoint {
    /// Sends `buf` to `dest` and returns once it may be reused (`MPI_Send`); safe because
    /// the operation completes before the borrow ends.
    pub fn send(
        &mut self,
        dest: usize,
        tag: i32,
        context: u32,
        buf: &[u8],
    ) -> Result<super::Status> {
        // SAFETY: sent before this returns (eagerly), or waited for below, while `buf` is
        // borrowed.
        let b = unsafe { UserBuf::new(buf.as_ptr(), buf.len()) };
        if self.send_eager_now(dest, tag, context, &b)? {
            return Ok(self.sent_status(tag, buf.len()));
        }
        let id = self.isend(dest, tag, context, b, false)?;
        self.wait(id)
    }

    /// Starts sending `bytes` to `dest` and keeps them until the send is complete (an active
    /// message's reply, which nobody waits for here): [`Self::reap_owned_sends`] lets them
    /// go.
    pub(crate) fn send_owned(
        &mut self,
        dest: usize,
        tag: i32,
        context: u32,
        bytes: Vec<u8>,
    ) -> Result<()> {
        // SAFETY: `bytes` moves into the list of sends in flight below, which keeps it (its
        // heap buffer does not move with the `Vec`) until `reap_owned_sends` sees the send
        // complete.
        let buf = unsafe { UserBuf::new(bytes.as_ptr(), bytes.len()) };
        let id = self.isend(dest, tag, context, buf, false)?;
        self.active_messages.sending.push((id, bytes));
        Ok(())
    }

    /// Forgets the sends of [`Self::send_owned`] that are complete, and their bytes; returns
    /// how many.
    pub(crate) fn reap_owned_sends(&mut self) -> usize {
        let mut reaped = 0;
        let mut i = 0;
        while i < self.active_messages.sending.len() {
            let id = self.active_messages.sending[i].0;
            if self.is_done(id) {
                self.reqs.remove(id);
                self.active_messages.sending.swap_remove(i);
                reaped += 1;
            } else {
                i += 1;
            }
        }
        reaped
    }

    /// The status of a completed send of `len` bytes.
    pub(crate) fn sent_status(&self, tag: i32, len: usize) -> super::Status {
        super::Status {
            source: self.rank(),
            tag,
            count: len,
        }
    }

    /// Receives into `buf` (`MPI_Recv`); `source`/`tag` `None` are wildcards.
    pub fn recv(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
        buf: &mut [u8],
    ) -> Result<super::Status> {
        // SAFETY: waited for below, while `buf` is exclusively borrowed.
        let b = unsafe { UserBufMut::new(buf.as_mut_ptr(), buf.len()) };
        let id = self.irecv(source, tag, context, b)?;
        self.wait(id)
    }

    /// Whether a send of `len` bytes to `dest`, made together with receives, goes out before
    /// they are posted: a local rendezvous does. A receive that matches the peer's RTS
    /// while this rank has an RTS of its own out to it copies the whole message alone
    /// (`rndv_local.rs`); posted first, a receive that matched an RTS already waiting would
    /// ask the peer to copy half, and the peer, copying this rank's message too, would do
    /// one and a half copies while this rank did a half.
    fn rendezvous_first(&self, dest: usize, len: usize) -> bool {
        self.is_local(dest) && len > self.cfg.local_eager_limit
    }

    /// Sends `send` to `dest` and receives into `recv` from `source` at the same time
    /// (`MPI_Sendrecv`); returns the receive's status.
    ///
    /// A send that goes eagerly at once is made before the receive is posted: nothing is
    /// progressed in between, so the partner's message still finds the receive posted, and
    /// this rank's message leaves sooner by the time a receive takes to post, which the
    /// partner, waiting for it, gains. Any other send is started after the receive.
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv(
        &mut self,
        dest: usize,
        send_tag: i32,
        send: &[u8],
        source: Option<usize>,
        recv_tag: Option<i32>,
        recv: &mut [u8],
        context: u32,
    ) -> Result<super::Status> {
        // SAFETY: both operations are waited for below, while the buffers are borrowed.
        let r = unsafe { UserBufMut::new(recv.as_mut_ptr(), recv.len()) };
        // SAFETY: as above.
        let s = unsafe { UserBuf::new(send.as_ptr(), send.len()) };
        if self.rendezvous_first(dest, send.len()) {
            let sid = self.isend(dest, send_tag, context, s, false)?;
            let rstatus = self
                .irecv(source, recv_tag, context, r)
                .and_then(|rid| self.wait(rid));
            self.wait(sid)?;
            return rstatus;
        }
        let sent_now = self.send_eager_now(dest, send_tag, context, &s);
        let rid = self.irecv(source, recv_tag, context, r)?;
        let sid = match sent_now {
            Ok(true) => None,
            Ok(false) => Some(self.isend(dest, send_tag, context, s, false)),
            Err(e) => Some(Err(e)),
        };
        let rstatus = self.wait(rid);
        match sid {
            Some(Ok(sid)) => {
                self.wait(sid)?;
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
        rstatus
    }

    /// Posts every receive and every send, then waits for all (the building block of
    /// alltoall-like exchanges). Returns the receives' statuses in order; the first error
    /// wins, after every operation has completed.
    pub fn exchange(
        &mut self,
        context: u32,
        tag: i32,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> Result<Vec<super::Status>> {
        let sends_first = sends
            .iter()
            .any(|(dest, buf)| self.rendezvous_first(*dest, buf.len()));
        let mut sids = Vec::new();
        if sends_first {
            // SAFETY: every send is waited for below, while `sends` is borrowed.
            sids = unsafe { self.isend_each(context, tag, sends) };
        }
        let mut rids = Vec::with_capacity(recvs.len());
        for (src, buf) in recvs.iter_mut() {
            // SAFETY: every receive is waited for below, while `recvs` is borrowed.
            let b = unsafe { UserBufMut::new(buf.as_mut_ptr(), buf.len()) };
            rids.push(self.irecv(Some(*src), Some(tag), context, b));
        }
        if !sends_first {
            // SAFETY: as above.
            sids = unsafe { self.isend_each(context, tag, sends) };
        }
        let mut first_err = None;
        let mut statuses = Vec::with_capacity(rids.len());
        for r in rids {
            match r.and_then(|id| self.wait(id)) {
                Ok(s) => statuses.push(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for s in sids {
            if let Err(e) = s.and_then(|id| self.wait(id)) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(statuses),
        }
    }

    /// Starts each send of [`Self::exchange`].
    ///
    /// # Safety
    ///
    /// The caller waits for every send started before the borrow of `sends` ends.
    unsafe fn isend_each(
        &mut self,
        context: u32,
        tag: i32,
        sends: &[(usize, &[u8])],
    ) -> Vec<Result<super::RequestId>> {
        sends
            .iter()
            .map(|(dest, buf)| {
                // SAFETY: the caller waits for the send while `buf` is borrowed.
                let b = unsafe { UserBuf::new(buf.as_ptr(), buf.len()) };
                self.isend(*dest, tag, context, b, false)
            })
            .collect()
    }

    /// Writes `src` at `remote_addr` of `target`'s exposed memory under `rkey` (a window's
    /// put). Returns once `src` may be reused: at once for a put that fits the NIC's inline
    /// data (copied when posted; complete at the target after [`Self::rma_flush`]), else
    /// once it is at the target. To a peer on the local path it is one kernel copy (CMA)
    /// into the peer's memory, complete when this returns.
    pub fn put(&mut self, target: usize, remote_addr: u64, rkey: u32, src: &[u8]) -> Result<()> {
        if !self.is_local(target) && self.put_inline(target, remote_addr, rkey, src)? {
            return Ok(());
        }
        // SAFETY: the transfer completes before this returns, while `src` is borrowed.
        let b = unsafe { UserBuf::new(src.as_ptr(), src.len()) };
        self.rma_transfer(target, remote_addr, rkey, super::RmaBuf::Put(b))
    }

    /// Writes each `(remote_addr, rkey, src)` of `runs` into `target`'s exposed memory, all
    /// posted before any is waited for (a put whose target layout has gaps), and returns
    /// once all have completed at the target; the first error.
    pub fn put_runs(&mut self, target: usize, runs: &[(u64, u32, &[u8])]) -> Result<()> {
        let mut started = Vec::with_capacity(runs.len());
        let mut first_err = None;
        for &(remote_addr, rkey, src) in runs {
            // SAFETY: every request started here is waited for below, before this returns,
            // while `runs` (and so `src`) is borrowed.
            let b = unsafe { UserBuf::new(src.as_ptr(), src.len()) };
            match self.rma_start(target, remote_addr, rkey, super::RmaBuf::Put(b)) {
                Ok(r) => started.push(r),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        self.rma_wait_all(started, first_err)
    }

    /// Reads each `(remote_addr, rkey, dst)` of `runs` from `target`'s exposed memory, all
    /// posted before any is waited for, and returns once all are in place; the first error.
    pub fn get_runs(&mut self, target: usize, runs: &mut [(u64, u32, &mut [u8])]) -> Result<()> {
        let mut started = Vec::with_capacity(runs.len());
        let mut first_err = None;
        for (remote_addr, rkey, dst) in runs.iter_mut() {
            // SAFETY: as in `put_runs`; `dst` is exclusively borrowed until then.
            let b = unsafe { UserBufMut::new(dst.as_mut_ptr(), dst.len()) };
            match self.rma_start(target, *remote_addr, *rkey, super::RmaBuf::Get(b)) {
                Ok(r) => started.push(r),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        self.rma_wait_all(started, first_err)
    }

    /// Waits for every request of `started`; the first error, `first_err` before any.
    fn rma_wait_all(
        &mut self,
        started: Vec<super::RmaRequest>,
        mut first_err: Option<crate::error::Error>,
    ) -> Result<()> {
        for r in started {
            if let Err(e) = self.rma_wait(r) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Reads `dst.len()` bytes at `remote_addr` of `target`'s exposed memory under `rkey`
    /// into `dst` (a window's get) and returns once they are there.
    pub fn get(
        &mut self,
        target: usize,
        remote_addr: u64,
        rkey: u32,
        dst: &mut [u8],
    ) -> Result<()> {
        // SAFETY: the transfer completes before this returns, while `dst` is exclusively
        // borrowed.
        let b = unsafe { UserBufMut::new(dst.as_mut_ptr(), dst.len()) };
        self.rma_transfer(target, remote_addr, rkey, super::RmaBuf::Get(b))
    }
}
