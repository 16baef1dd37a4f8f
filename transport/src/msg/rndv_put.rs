//! RPUT: the receiver returns CTS and the sender RDMA-WRITEs.
//!
//! For each chunk the receiver leases a landing area (its buffer itself in zero-copy modes,
//! a bounce slot in `copy`) and sends CTS with its key; the sender stages the chunk into a
//! source lease, RDMA-WRITEs it and sends FIN on the same queue pair, so FIN arrives after
//! the data. The receiver stages the chunk in and asks for the next. The last CTS carries
//! ALL_DONE. Seed 001 calls this the Read-Write design's write half.

use super::rndv::chunk_range;
use super::wire::{self, Header, MsgKind};
use super::{PointToPoint, RdmaOp, RecvState, Req, RequestId, SendState};
use crate::buffer_mode::Direction;
use crate::error::Result;
use crate::nic::Opcode;

impl PointToPoint {
    /// Receiver: asks for chunks while landing leases are available.
    pub(crate) fn advance_put_recv(&mut self, rid: RequestId) -> Result<usize> {
        let mut events = 0;
        loop {
            let Some(Req::Recv(r)) = self.reqs.get(rid) else {
                return Ok(events);
            };
            let RecvState::Rndv(rv) = &r.state else {
                return Ok(events);
            };
            if rv.next >= rv.n || rv.leases.len() >= rv.depth {
                return Ok(events);
            }
            let (k, peer, sreq, buf, last) =
                (rv.next, rv.peer, rv.sreq, r.buf, rv.next + 1 == rv.n);
            let (off, len) = chunk_range(k, rv.chunk, rv.eff);
            let Some(lease) = self
                .mode
                .lease(&*self.nic, buf.addr(), off, len, Direction::Sink)?
            else {
                return Ok(events);
            };
            if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
                if let RecvState::Rndv(rv) = &mut r.state {
                    rv.leases.push((k, lease));
                    rv.next += 1;
                }
            }
            let mut h = Header::new(MsgKind::Cts);
            h.chunk = k;
            h.addr = lease.addr;
            h.rkey = lease.rkey;
            h.len = len as u64;
            h.sreq = sreq;
            h.rreq = rid.0;
            if last {
                h.flags |= wire::ALL_DONE;
            }
            self.send_control(peer, h)?;
            events += 1;
        }
    }

    /// Receiver: a chunk was written.
    pub(crate) fn on_fin(&mut self, h: Header) -> Result<()> {
        let rid = RequestId(h.rreq);
        let Some(lease) = self.take_lease(rid, h.chunk) else {
            return Ok(());
        };
        let Some(Req::Recv(r)) = self.reqs.get_mut(rid) else {
            return Ok(());
        };
        let RecvState::Rndv(rv) = &mut r.state else {
            return Ok(());
        };
        let (off, len) = chunk_range(h.chunk, rv.chunk, rv.eff);
        rv.done += 1;
        let (finished, buf) = (rv.done == rv.n, r.buf);
        self.mode.stage_in(&lease, &buf, off, len);
        self.mode.release(&*self.nic, lease);
        if finished {
            self.finish_recv(rid);
        } else {
            self.advance_put_recv(rid)?;
        }
        Ok(())
    }

    /// Sender: the receiver is ready for a chunk.
    pub(crate) fn on_cts(&mut self, _peer: usize, h: Header) -> Result<()> {
        let id = RequestId(h.sreq);
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            if let SendState::Rndv(rs) = &mut s.state {
                rs.rreq = Some(h.rreq);
                rs.pending_cts.push_back(h);
            }
        }
        self.advance_put_send(id).map(|_| ())
    }

    /// Sender: writes the chunks asked for while source leases are available.
    pub(crate) fn advance_put_send(&mut self, id: RequestId) -> Result<usize> {
        let mut events = 0;
        loop {
            let Some(Req::Send(s)) = self.reqs.get(id) else {
                return Ok(events);
            };
            let SendState::Rndv(rs) = &s.state else {
                return Ok(events);
            };
            let Some(cts) = rs.pending_cts.front().copied() else {
                break;
            };
            let (buf, peer, chunk, size) = (s.buf, s.peer, rs.chunk, rs.size);
            let last = cts.flags & wire::ALL_DONE != 0;
            if cts.len > 0 {
                let (off, _) = chunk_range(cts.chunk, chunk, size);
                let len = cts.len as usize;
                let Some(lease) =
                    self.mode
                        .lease(&*self.nic, buf.addr(), off, len, Direction::Source)?
                else {
                    break;
                };
                self.mode.stage_out(&lease, &buf, off);
                let write = Opcode::RdmaWrite {
                    remote_addr: cts.addr,
                    rkey: cts.rkey,
                };
                if !self.post_rdma(peer, id, cts.chunk, lease, write)? {
                    self.mode.release(&*self.nic, lease);
                    break;
                }
                let mut fin = Header::new(MsgKind::Fin);
                fin.chunk = cts.chunk;
                fin.sreq = id.0;
                fin.rreq = cts.rreq;
                self.send_control(peer, fin)?;
                if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                    if let SendState::Rndv(rs) = &mut s.state {
                        rs.leases.push((cts.chunk, lease));
                        rs.writes_out += 1;
                    }
                }
            }
            if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                if let SendState::Rndv(rs) = &mut s.state {
                    rs.pending_cts.pop_front();
                    rs.all_done |= last;
                }
            }
            events += 1;
        }
        self.maybe_finish_send(id);
        Ok(events)
    }

    /// Sender: a chunk's write completed; its lease is free.
    pub(crate) fn on_write_done(&mut self, op: RdmaOp) -> Result<()> {
        if let Some(lease) = self.take_lease(op.req, op.chunk) {
            self.mode.release(&*self.nic, lease);
        }
        if let Some(Req::Send(s)) = self.reqs.get_mut(op.req) {
            if let SendState::Rndv(rs) = &mut s.state {
                rs.writes_out -= 1;
            }
        }
        self.maybe_finish_send(op.req);
        self.advance_put_send(op.req).map(|_| ())
    }
}
