//! RGET: the receiver RDMA-READs the message from the sender.
//!
//! The RTS describes the first `depth` chunks the sender made readable (its buffer itself
//! in zero-copy modes, bounce slots filled with the chunk in `copy`). The receiver reads
//! each into a landing lease, stages it in, and answers ChunkDone; the sender then reuses
//! that lease for the next chunk and announces it with ChunkReady. The last ChunkDone
//! carries ALL_DONE, which ends the send. Seed 001 calls this the Read-Read design.

use super::rndv::chunk_range;
use super::wire::{self, Header, MsgKind};
use super::{ChunkDesc, PointToPoint, RdmaOp, RecvState, Req, RequestId, SendState};
use crate::buffer_mode::Direction;
use crate::error::Result;
use crate::nic::Opcode;

impl PointToPoint {
    /// Sender: announces further chunks as leases free up.
    pub(crate) fn advance_get_send(&mut self, id: RequestId) -> Result<usize> {
        let mut events = 0;
        loop {
            let Some(Req::Send(s)) = self.reqs.get(id) else {
                return Ok(events);
            };
            let SendState::Rndv(rs) = &s.state else {
                return Ok(events);
            };
            let Some(rreq) = rs.rreq else {
                return Ok(events);
            };
            if rs.all_done || rs.next >= rs.n || rs.leases.len() >= rs.depth {
                return Ok(events);
            }
            let (k, buf, peer) = (rs.next, s.buf, s.peer);
            let (off, len) = chunk_range(k, rs.chunk, rs.size);
            let Some(lease) =
                self.mode
                    .lease(&*self.nic, buf.addr(), off, len, Direction::Source)?
            else {
                return Ok(events);
            };
            self.mode.stage_out(&lease, &buf, off);
            if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                if let SendState::Rndv(rs) = &mut s.state {
                    rs.leases.push((k, lease));
                    rs.next += 1;
                }
            }
            let mut h = Header::new(MsgKind::ChunkReady);
            h.chunk = k;
            h.addr = lease.addr;
            h.rkey = lease.rkey;
            h.len = lease.len;
            h.sreq = id.0;
            h.rreq = rreq;
            self.send_control(peer, h)?;
            events += 1;
        }
    }

    /// Receiver: reads announced chunks into landing leases.
    pub(crate) fn advance_get_recv(&mut self, rid: RequestId) -> Result<usize> {
        let mut events = 0;
        loop {
            let Some(Req::Recv(r)) = self.reqs.get(rid) else {
                return Ok(events);
            };
            let RecvState::Rndv(rv) = &r.state else {
                return Ok(events);
            };
            if rv.leases.len() >= rv.depth {
                return Ok(events);
            }
            let Some(desc) = rv.announced.front().copied() else {
                return Ok(events);
            };
            let (peer, buf) = (rv.peer, r.buf);
            if desc.chunk >= rv.n {
                // Past what a short receive buffer takes.
                self.pop_announced(rid);
                continue;
            }
            let (off, len) = chunk_range(desc.chunk, rv.chunk, rv.eff);
            let Some(lease) = self
                .mode
                .lease(&*self.nic, buf.addr(), off, len, Direction::Sink)?
            else {
                return Ok(events);
            };
            let read = Opcode::RdmaRead {
                remote_addr: desc.addr,
                rkey: desc.rkey,
            };
            if !self.post_rdma(peer, rid, desc.chunk, lease, read)? {
                self.mode.release(&*self.nic, lease);
                return Ok(events);
            }
            self.pop_announced(rid);
            if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
                if let RecvState::Rndv(rv) = &mut r.state {
                    rv.leases.push((desc.chunk, lease));
                }
            }
            events += 1;
        }
    }

    fn pop_announced(&mut self, rid: RequestId) {
        if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
            if let RecvState::Rndv(rv) = &mut r.state {
                rv.announced.pop_front();
            }
        }
    }

    /// Receiver: a chunk was read.
    pub(crate) fn on_read_done(&mut self, op: RdmaOp) -> Result<()> {
        let rid = op.req;
        let Some(lease) = self.take_lease(rid, op.chunk) else {
            return Ok(());
        };
        let Some(Req::Recv(r)) = self.reqs.get_mut(rid) else {
            return Ok(());
        };
        let RecvState::Rndv(rv) = &mut r.state else {
            return Ok(());
        };
        let (off, len) = chunk_range(op.chunk, rv.chunk, rv.eff);
        rv.done += 1;
        let (finished, peer, sreq, buf) = (rv.done == rv.n, rv.peer, rv.sreq, r.buf);
        self.mode.stage_in(&lease, &buf, off, len);
        self.mode.release(&*self.nic, lease);
        let mut h = Header::new(MsgKind::ChunkDone);
        h.chunk = op.chunk;
        h.sreq = sreq;
        h.rreq = rid.0;
        if finished {
            h.flags |= wire::ALL_DONE;
        }
        self.send_control(peer, h)?;
        if finished {
            self.finish_recv(rid);
        }
        Ok(())
    }

    /// Receiver: the sender made another chunk readable.
    pub(crate) fn on_chunk_ready(&mut self, h: Header) -> Result<()> {
        if let Some(Req::Recv(r)) = self.reqs.get_mut(RequestId(h.rreq)) {
            if let RecvState::Rndv(rv) = &mut r.state {
                rv.announced.push_back(ChunkDesc {
                    chunk: h.chunk,
                    addr: h.addr,
                    rkey: h.rkey,
                    len: h.len,
                });
            }
        }
        self.advance_get_recv(RequestId(h.rreq)).map(|_| ())
    }

    /// Sender: the receiver read a chunk (or wants nothing more).
    pub(crate) fn on_chunk_done(&mut self, _peer: usize, h: Header) -> Result<()> {
        let id = RequestId(h.sreq);
        if let Some(lease) = self.take_lease(id, h.chunk) {
            self.mode.release(&*self.nic, lease);
        }
        let mut rest = Vec::new();
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            if let SendState::Rndv(rs) = &mut s.state {
                rs.rreq = Some(h.rreq);
                if h.flags & wire::ALL_DONE != 0 {
                    rs.all_done = true;
                    rest = std::mem::take(&mut rs.leases);
                }
            }
        }
        for (_, l) in rest {
            self.mode.release(&*self.nic, l);
        }
        self.maybe_finish_send(id);
        self.advance_get_send(id).map(|_| ())
    }
}
