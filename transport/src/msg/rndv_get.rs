//! RGET: the receiver RDMA-READs the message from the sender.
//!
//! The RTS describes the first chunks the sender made readable (its buffer itself in
//! zero-copy modes, bounce slots filled with the chunk in `copy`), each with its offset. The
//! receiver reads each chunk in pieces of its own granularity into landing leases, stages
//! them in, and answers ChunkDone once a chunk is read in full; the sender then reuses that
//! lease for its next chunk and announces it with ChunkReady. The ChunkDone that completes
//! the receive carries ALL_DONE, which ends the send. NFS-RDMA calls this the Read-Read
//! design.

use super::rndv::{chunking, side_chunk, side_piece, NO_CHUNK};
use super::wire::{self, Header, MsgKind};
use super::{ChunkDesc, PointToPoint, RdmaOp, RecvState, Req, RequestId, SendState};
use crate::buffer_mode::Direction;
use crate::error::Result;
use crate::nic::Opcode;

impl PointToPoint {
    /// Sender: announces further chunks as leases free up.
    pub(crate) fn advance_get_send(&mut self, id: RequestId) -> Result<usize> {
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
            let Some(rreq) = rs.rreq else {
                return Ok(events);
            };
            let (chunk, depth) = chunking(&rs.t, rs.scatter_gather);
            if rs.all_done || rs.next >= rs.n || rs.leases.len() >= depth {
                return Ok(events);
            }
            let (k, buf, peer, t) = (rs.next, s.buf.clone(), s.peer, rs.t);
            let (off, mem, len) = side_chunk(&buf, rs.scatter_gather, k, chunk, rs.size);
            let mut h = Header::new(MsgKind::ChunkReady);
            if rs.scatter_gather {
                // A run of the span the RTS's lease made readable.
                let Some((_, span)) = rs.leases.first() else {
                    return Ok(events);
                };
                h.addr = span.addr + mem as u64;
                h.rkey = span.rkey;
            } else {
                let Some(lease) =
                    self.mode
                        .lease(&*self.nic, &t, buf.addr(), mem, len, Direction::Source)?
                else {
                    return Ok(events);
                };
                self.mode.stage_out(&lease, &buf, off);
                h.addr = lease.addr;
                h.rkey = lease.rkey;
                if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                    if let SendState::Rndv(rs) = &mut s.state {
                        rs.leases.push((k as u64, lease));
                    }
                }
            }
            h.chunk = k;
            h.size = off as u64; // the chunk's offset in the message
            h.len = len as u64;
            h.sreq = id.0;
            h.rreq = rreq;
            if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                if let SendState::Rndv(rs) = &mut s.state {
                    rs.next += 1;
                }
            }
            self.send_control(peer, h)?;
            events += 1;
        }
    }

    /// Receiver: reads announced chunks, in pieces of its own granularity.
    pub(crate) fn advance_get_recv(&mut self, rid: RequestId) -> Result<usize> {
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
            if rv.leases.len() >= depth {
                return Ok(events);
            }
            let Some(desc) = rv.announced.front().copied() else {
                return Ok(events);
            };
            let (peer, buf, t, read_end, issued, sg) = (
                rv.peer,
                r.buf.clone(),
                rv.t,
                rv.read_end as u64,
                rv.issued,
                rv.scatter_gather,
            );
            let end = (desc.offset + desc.len).min(read_end);
            let piece_off = desc.offset + issued;
            if piece_off >= end {
                // Past what a short receive buffer (or this side of a split) takes, or
                // fully posted.
                self.next_announced(rid, desc.chunk, issued > 0);
                continue;
            }
            let (mem, piece_len) =
                side_piece(&buf, sg, piece_off, (chunk as u64).min(end - piece_off));
            let Some(lease) = self.mode.lease(
                &*self.nic,
                &t,
                buf.addr(),
                mem,
                piece_len as usize,
                Direction::Sink,
            )?
            else {
                return Ok(events);
            };
            let read = Opcode::RdmaRead {
                remote_addr: desc.addr + (piece_off - desc.offset),
                rkey: desc.rkey,
            };
            let key = self.next_key_recv(rid);
            let op = RdmaOp {
                req: rid,
                key,
                chunk: desc.chunk,
                offset: piece_off as usize,
                len: piece_len as usize,
            };
            if !self.post_rdma(peer, op, &lease, read)? {
                self.mode.release(&*self.nic, lease);
                return Ok(events);
            }
            if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
                if let RecvState::Rndv(rv) = &mut r.state {
                    rv.leases.push((key, lease));
                    rv.issued += piece_len;
                    match rv.pieces.iter_mut().find(|p| p.0 == desc.chunk) {
                        Some(p) => p.1 += 1,
                        None => rv.pieces.push((desc.chunk, 1, false)),
                    }
                }
            }
            if piece_off + piece_len == end {
                self.next_announced(rid, desc.chunk, true);
            }
            events += 1;
        }
    }

    fn next_key_recv(&mut self, rid: RequestId) -> u64 {
        match self.reqs.get_mut(rid) {
            Some(Req::Recv(r)) => match &mut r.state {
                RecvState::Rndv(rv) => {
                    rv.next_key += 1;
                    rv.next_key
                }
                _ => 0,
            },
            _ => 0,
        }
    }

    /// The front announced chunk is fully posted (or not needed): move to the next.
    fn next_announced(&mut self, rid: RequestId, chunk: u32, posted_some: bool) {
        if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
            if let RecvState::Rndv(rv) = &mut r.state {
                rv.announced.pop_front();
                rv.issued = 0;
                if posted_some {
                    if let Some(p) = rv.pieces.iter_mut().find(|p| p.0 == chunk) {
                        p.2 = true;
                    }
                }
            }
        }
    }

    /// Receiver: a piece was read.
    pub(crate) fn on_read_done(&mut self, op: RdmaOp) -> Result<()> {
        let rid = op.req;
        let Some(lease) = self.take_lease(rid, op.key) else {
            return Ok(());
        };
        let Some(Req::Recv(r)) = self.reqs.get_mut(rid) else {
            return Ok(());
        };
        let RecvState::Rndv(rv) = &mut r.state else {
            return Ok(());
        };
        rv.landed += op.len;
        let mut chunk_done = false;
        if let Some(i) = rv.pieces.iter().position(|p| p.0 == op.chunk) {
            rv.pieces[i].1 -= 1;
            if rv.pieces[i].1 == 0 && rv.pieces[i].2 {
                rv.pieces.swap_remove(i);
                chunk_done = true;
            }
        }
        let finished = rv.landed == rv.eff;
        // A scatter-gather sender needs no ChunkDone but the last.
        let chunk_done = chunk_done && !rv.peer_scatter_gather;
        let (peer, sreq, buf) = (rv.peer, rv.sreq, r.buf.clone());
        self.mode.stage_in(&lease, &buf, op.offset, op.len);
        self.mode.release(&*self.nic, lease);
        if chunk_done || finished {
            let mut h = Header::new(MsgKind::ChunkDone);
            h.chunk = if chunk_done { op.chunk } else { NO_CHUNK };
            h.sreq = sreq;
            h.rreq = rid.0;
            if finished {
                h.flags |= wire::ALL_DONE;
            }
            self.send_control(peer, h)?;
        }
        if finished {
            self.finish_recv(rid);
        }
        Ok(())
    }

    /// Receiver: the sender made another chunk readable.
    ///
    /// The chunk must lie inside the message: one outside it is a protocol violation.
    pub(crate) fn on_chunk_ready(&mut self, peer: usize, h: Header) -> Result<()> {
        if !self.is_rndv_recv_from(RequestId(h.rreq), peer) {
            return Ok(());
        }
        if let Some(Req::Recv(r)) = self.reqs.get_mut(RequestId(h.rreq)) {
            if let RecvState::Rndv(rv) = &mut r.state {
                if h.size
                    .checked_add(h.len)
                    .is_none_or(|end| end > rv.size as u64)
                {
                    self.protocol_violation(peer, "a chunk outside the message");
                    return Ok(());
                }
                rv.announced_bytes += h.len; // at most `size` (checked above) plus `size`
                if rv.announced_bytes > rv.size as u64 {
                    self.protocol_violation(peer, "chunks adding up to more than the message");
                    return Ok(());
                }
                rv.announced.push_back(ChunkDesc {
                    chunk: h.chunk,
                    offset: h.size,
                    addr: h.addr,
                    rkey: h.rkey,
                    len: h.len,
                });
            }
        }
        self.advance_get_recv(RequestId(h.rreq)).map(|_| ())
    }

    /// Sender: the receiver read a chunk (or wants nothing more).
    pub(crate) fn on_chunk_done(&mut self, peer: usize, h: Header) -> Result<()> {
        let id = RequestId(h.sreq);
        if !self.is_rndv_send_to(id, peer) {
            return Ok(());
        }
        if h.chunk != NO_CHUNK {
            if let Some(lease) = self.take_lease(id, h.chunk as u64) {
                self.mode.release(&*self.nic, lease);
            }
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
