//! RPUT: the receiver returns CTS and the sender RDMA-WRITEs.
//!
//! For each chunk of its own granularity the receiver leases a landing area (its buffer
//! itself in zero-copy modes, a bounce slot in `copy`) and sends CTS with its offset and key;
//! the sender writes it in pieces of its own granularity and, once the region is written in
//! full, sends FIN on the same queue pair, so FIN arrives after the data. The receiver stages
//! the chunk in and asks for the next. The last CTS carries ALL_DONE. NFS-RDMA calls this
//! the Read-Write design's write half.

use super::rndv::{chunking, side_chunk, side_piece, Cts};
use super::wire::{self, Header, MsgKind};
use super::{PointToPoint, RdmaOp, RecvState, Req, RequestId, SendState};
use crate::buffer_mode::Direction;
use crate::error::Result;
use crate::nic::Opcode;

impl PointToPoint {
    /// Receiver: asks for chunks while landing leases are available.
    pub(crate) fn advance_put_recv(&mut self, rid: RequestId) -> Result<usize> {
        if self.is_failing(rid) {
            // A failed request starts no more work.
            return Ok(0);
        }
        let mut events = 0;
        loop {
            let Some(Req::Recv(r)) = self.reqs.get(rid) else {
                return Ok(events);
            };
            let RecvState::Rndv(rv) = &r.state else {
                return Ok(events);
            };
            let (chunk, depth) = chunking(&rv.t, rv.scatter_gather);
            if rv.next >= rv.n || rv.leases.len() >= depth {
                return Ok(events);
            }
            let (k, peer, sreq, buf, last, t) = (
                rv.next,
                rv.peer,
                rv.sreq,
                r.buf.clone(),
                rv.next + 1 == rv.n,
                rv.t,
            );
            let (off, mem, len) = side_chunk(&buf, rv.scatter_gather, k, chunk, rv.eff);
            let Some(lease) =
                self.mode
                    .lease(&*self.nic, &t, buf.addr(), mem, len, Direction::Sink)?
            else {
                return Ok(events);
            };
            let mut h = Header::new(MsgKind::Cts);
            h.chunk = k;
            h.size = off as u64; // the region's offset in the message
            h.addr = lease.addr;
            h.rkey = lease.rkey;
            h.len = len as u64;
            h.sreq = sreq;
            h.rreq = rid.0;
            if last {
                h.flags |= wire::ALL_DONE;
            }
            if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
                if let RecvState::Rndv(rv) = &mut r.state {
                    rv.leases.push((k as u64, lease));
                    rv.next += 1;
                }
            }
            self.send_control(peer, h)?;
            events += 1;
        }
    }

    /// Receiver: a region was written.
    pub(crate) fn on_fin(&mut self, peer: usize, h: Header) -> Result<()> {
        if !self.is_rndv_recv_from(RequestId(h.rreq), peer) {
            return Ok(());
        }
        if h.chunk == super::rndv_split::SPLIT_CHUNK {
            return self.on_split_fin(h);
        }
        let rid = RequestId(h.rreq);
        let Some(lease) = self.take_lease(rid, h.chunk as u64) else {
            return Ok(());
        };
        let Some(Req::Recv(r)) = self.reqs.get_mut(rid) else {
            return Ok(());
        };
        let RecvState::Rndv(rv) = &mut r.state else {
            return Ok(());
        };
        let (chunk, _) = chunking(&rv.t, rv.scatter_gather);
        let buf = r.buf.clone();
        let (off, _, len) = side_chunk(&buf, rv.scatter_gather, h.chunk, chunk, rv.eff);
        rv.done += 1;
        rv.landed += len;
        let finished = rv.done == rv.n;
        self.mode.stage_in(&lease, &buf, off, len);
        self.mode.release(&*self.nic, lease);
        if finished {
            self.finish_recv(rid);
        } else {
            self.advance_put_recv(rid)?;
        }
        Ok(())
    }

    /// Sender: the receiver is ready for a region.
    ///
    /// The region must lie inside the message (checked arithmetic): a CTS naming bytes
    /// outside it is a protocol violation, which fails the send before any byte moves.
    pub(crate) fn on_cts(&mut self, peer: usize, h: Header) -> Result<()> {
        let id = RequestId(h.sreq);
        if !self.is_rndv_send_to(id, peer) {
            return Ok(());
        }
        let size = match self.reqs.get(id) {
            Some(Req::Send(s)) => s.buf.len() as u64,
            _ => 0,
        };
        if h.size.checked_add(h.len).is_none_or(|end| end > size) {
            self.protocol_violation(peer, "a CTS for bytes outside the message");
            return Ok(());
        }
        if h.chunk == super::rndv_split::SPLIT_CHUNK && self.write_split_tail(id, &h)? {
            return Ok(());
        }
        let mut ready = None;
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            let (addr, (lo, hi)) = (s.buf.addr(), s.buf.bounds(h.size as usize, h.len as usize));
            if let SendState::Rndv(rs) = &mut s.state {
                ready = Some((rs.t, addr, lo, hi.saturating_sub(lo)));
                rs.rreq = Some(h.rreq);
                rs.pending_cts.push_back(Cts {
                    chunk: h.chunk,
                    offset: h.size,
                    len: h.len,
                    addr: h.addr,
                    rkey: h.rkey,
                    rreq: h.rreq,
                    last: h.flags & wire::ALL_DONE != 0,
                });
            }
        }
        if let Some((t, addr, lo, len)) = ready {
            // This side writes the region now.
            self.mode.about_to_move(&*self.nic, &t, addr, lo, len);
        }
        self.advance_put_send(id).map(|_| ())
    }

    /// Sender: writes the regions asked for, in pieces of its own granularity.
    pub(crate) fn advance_put_send(&mut self, id: RequestId) -> Result<usize> {
        if self.is_failing(id) {
            // A failed request starts no more work.
            return Ok(0);
        }
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
            let (buf, peer, t, issued) = (s.buf.clone(), s.peer, rs.t, rs.issued);
            let (chunk, depth) = chunking(&t, rs.scatter_gather);
            let sg = rs.scatter_gather;
            let end = cts.offset + cts.len;
            let piece_off = cts.offset + issued;
            if cts.len > 0 {
                if rs.leases.len() >= depth {
                    break;
                }
                let (mem, piece_len) =
                    side_piece(&buf, sg, piece_off, (chunk as u64).min(end - piece_off));
                let Some(lease) = self.mode.lease(
                    &*self.nic,
                    &t,
                    buf.addr(),
                    mem,
                    piece_len as usize,
                    Direction::Source,
                )?
                else {
                    break;
                };
                self.mode.stage_out(&lease, &buf, piece_off as usize);
                let key = match self.reqs.get_mut(id) {
                    Some(Req::Send(s)) => match &mut s.state {
                        SendState::Rndv(rs) => {
                            rs.next_key += 1;
                            rs.next_key
                        }
                        _ => 0,
                    },
                    _ => 0,
                };
                let write = Opcode::RdmaWrite {
                    remote_addr: cts.addr + (piece_off - cts.offset),
                    rkey: cts.rkey,
                };
                let op = RdmaOp {
                    req: id,
                    key,
                    chunk: cts.chunk,
                    offset: piece_off as usize,
                    len: piece_len as usize,
                };
                if !self.post_rdma(peer, op, &lease, write)? {
                    self.mode.release(&*self.nic, lease);
                    break;
                }
                if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                    if let SendState::Rndv(rs) = &mut s.state {
                        rs.leases.push((key, lease));
                        rs.writes_out += 1;
                        rs.issued += piece_len;
                    }
                }
                events += 1;
                if piece_off + piece_len < end {
                    continue;
                }
                let mut fin = Header::new(MsgKind::Fin);
                fin.chunk = cts.chunk;
                fin.sreq = id.0;
                fin.rreq = cts.rreq;
                self.send_control(peer, fin)?;
            }
            if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                if let SendState::Rndv(rs) = &mut s.state {
                    rs.pending_cts.pop_front();
                    rs.issued = 0;
                    rs.all_done |= cts.last;
                }
            }
        }
        self.maybe_finish_send(id);
        Ok(events)
    }

    /// Sender: a piece's write completed; its lease is free.
    pub(crate) fn on_write_done(&mut self, op: RdmaOp) -> Result<()> {
        if let Some(lease) = self.take_lease(op.req, op.key) {
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
