//! RGET: the receiver RDMA-READs the message from the sender.
//!
//! The RTS describes the first chunks the sender made readable (its buffer itself in
//! zero-copy modes, bounce slots filled with the chunk in `copy`), each with its offset. The
//! receiver reads each chunk in pieces of its own granularity into landing leases, stages
//! them in, and answers ChunkDone once a chunk is read in full; the sender then reuses that
//! lease for its next chunk and announces it with ChunkReady. The ChunkDone that completes
//! the receive carries ALL_DONE, which ends the send. NFS-RDMA calls this the Read-Read
//! design.
//!
//! Each side is a machine over its own state ([`RndvSend`], [`RndvRecv`]), moved by the
//! events of the protocol (a pass of progress, a ChunkReady, a ChunkDone, a READ completed)
//! against [`RendezvousIo`] alone; the [`PointToPoint`] methods at the end hand it the
//! request's state and the layer's I/O, and do what ends or fails the request.

use super::rndv::{chunking, side_chunk, side_piece, RndvRecv, RndvSend, NO_CHUNK};
use super::rndv_io::RendezvousIo;
use super::wire::{self, Header, MsgKind};
use super::{ChunkDesc, PointToPoint, RdmaOp, RequestId};
use crate::buffer_mode::UserMemory;
use crate::error::Result;
use crate::nic::Opcode;

impl RndvSend {
    /// RGET sender, a pass: announces further chunks as leases free up, once the receiver
    /// has introduced itself. Returns the chunks announced.
    pub(crate) fn advance_get(
        &mut self,
        id: RequestId,
        buf: &UserMemory,
        io: &mut impl RendezvousIo,
    ) -> Result<usize> {
        let mut events = 0;
        let Some(rreq) = self.rreq else {
            return Ok(0);
        };
        let (chunk, depth) = chunking(&self.t, self.scatter_gather);
        while !self.all_done && self.next < self.n && self.leases.len() < depth {
            let k = self.next;
            let (off, mem, len) = side_chunk(buf, self.scatter_gather, k, chunk, self.size);
            let mut h = Header::new(MsgKind::ChunkReady);
            if self.scatter_gather {
                // A run of the span the RTS's lease made readable.
                let Some((_, span)) = self.leases.first() else {
                    return Ok(events);
                };
                h.addr = span.addr + mem as u64;
                h.rkey = span.rkey;
            } else {
                let Some(lease) = io.lease(&self.t, mem, len)? else {
                    return Ok(events);
                };
                io.stage(&lease, off, len);
                h.addr = lease.addr;
                h.rkey = lease.rkey;
                self.leases.push((k as u64, lease));
            }
            h.chunk = k;
            h.size = off as u64; // the chunk's offset in the message
            h.len = len as u64;
            h.sreq = id.0;
            h.rreq = rreq;
            self.next += 1;
            io.send_control(h)?;
            events += 1;
        }
        Ok(events)
    }

    /// RGET sender: the receiver read chunk `h.chunk` (its lease is free again), or
    /// introduced itself (`NO_CHUNK`), or wants nothing more (`ALL_DONE`: every lease goes
    /// back). The caller then ends the send if nothing is left, or announces more.
    pub(crate) fn on_chunk_done(&mut self, h: &Header, io: &mut impl RendezvousIo) {
        if h.chunk != NO_CHUNK {
            if let Some(lease) = self.take_lease(h.chunk as u64) {
                io.release(lease);
            }
        }
        self.rreq = Some(h.rreq);
        if h.flags & wire::ALL_DONE != 0 {
            self.all_done = true;
            for (_, lease) in std::mem::take(&mut self.leases) {
                io.release(lease);
            }
        }
    }
}

impl RndvRecv {
    /// RGET receiver, a pass: reads the announced chunks in pieces of its own granularity,
    /// as far as leases, its depth and the send queue allow. Returns the READs posted.
    pub(crate) fn advance_get(
        &mut self,
        rid: RequestId,
        buf: &UserMemory,
        io: &mut impl RendezvousIo,
    ) -> Result<usize> {
        let mut events = 0;
        let (chunk, depth) = chunking(&self.t, self.scatter_gather);
        while self.leases.len() < depth {
            let Some(desc) = self.announced.front().copied() else {
                return Ok(events);
            };
            let end = (desc.offset + desc.len).min(self.read_end as u64);
            let piece_off = desc.offset + self.issued;
            if piece_off >= end {
                // Past what a short receive buffer (or this side of a split) takes, or
                // fully posted.
                let posted_some = self.issued > 0;
                self.next_announced(desc.chunk, posted_some);
                continue;
            }
            let (mem, piece_len) = side_piece(
                buf,
                self.scatter_gather,
                piece_off,
                (chunk as u64).min(end - piece_off),
            );
            let Some(lease) = io.lease(&self.t, mem, piece_len as usize)? else {
                return Ok(events);
            };
            let read = Opcode::RdmaRead {
                remote_addr: desc.addr + (piece_off - desc.offset),
                rkey: desc.rkey,
            };
            self.next_key += 1;
            let key = self.next_key;
            let op = RdmaOp {
                req: rid,
                key,
                chunk: desc.chunk,
                offset: piece_off as usize,
                len: piece_len as usize,
            };
            if !io.post_rdma(op, &lease, read)? {
                io.release(lease);
                return Ok(events);
            }
            self.leases.push((key, lease));
            self.issued += piece_len;
            match self.pieces.iter_mut().find(|p| p.0 == desc.chunk) {
                Some(p) => p.1 += 1,
                None => self.pieces.push((desc.chunk, 1, false)),
            }
            if piece_off + piece_len == end {
                self.next_announced(desc.chunk, true);
            }
            events += 1;
        }
        Ok(events)
    }

    /// The front announced chunk is fully posted (or not needed): move to the next.
    fn next_announced(&mut self, chunk: u32, posted_some: bool) {
        self.announced.pop_front();
        self.issued = 0;
        if posted_some {
            if let Some(p) = self.pieces.iter_mut().find(|p| p.0 == chunk) {
                p.2 = true;
            }
        }
    }

    /// RGET receiver: the READ `op` landed. Stages it in, gives its lease back, and tells
    /// the sender when a chunk is read whole (ChunkDone) or the receive has everything
    /// (ChunkDone with ALL_DONE). Returns whether the receive has everything; a READ this
    /// side holds no lease for (one of a request that failed meanwhile) changes nothing.
    pub(crate) fn on_read_done(
        &mut self,
        rid: RequestId,
        op: &RdmaOp,
        io: &mut impl RendezvousIo,
    ) -> Result<bool> {
        let Some(lease) = self.take_lease(op.key) else {
            return Ok(false);
        };
        self.landed += op.len;
        let mut chunk_done = false;
        if let Some(i) = self.pieces.iter().position(|p| p.0 == op.chunk) {
            self.pieces[i].1 -= 1;
            if self.pieces[i].1 == 0 && self.pieces[i].2 {
                self.pieces.swap_remove(i);
                chunk_done = true;
            }
        }
        let finished = self.landed == self.eff;
        // A scatter-gather sender needs no ChunkDone but the last.
        let chunk_done = chunk_done && !self.peer_scatter_gather;
        io.stage(&lease, op.offset, op.len);
        io.release(lease);
        if chunk_done || finished {
            let mut h = Header::new(MsgKind::ChunkDone);
            h.chunk = if chunk_done { op.chunk } else { NO_CHUNK };
            h.sreq = self.sreq;
            h.rreq = rid.0;
            if finished {
                h.flags |= wire::ALL_DONE;
            }
            io.send_control(h)?;
        }
        Ok(finished)
    }

    /// RGET receiver: the sender made another chunk readable. A chunk outside the message,
    /// or chunks adding up to more than it, break the protocol: `Err(why)`, and nothing of
    /// the announcement is kept.
    pub(crate) fn on_chunk_ready(&mut self, h: &Header) -> std::result::Result<(), &'static str> {
        if h.size
            .checked_add(h.len)
            .is_none_or(|end| end > self.size as u64)
        {
            return Err("a chunk outside the message");
        }
        // At most `size` (checked above) plus `size`: no overflow.
        if self.announced_bytes + h.len > self.size as u64 {
            return Err("chunks adding up to more than the message");
        }
        self.announced_bytes += h.len;
        self.announced.push_back(ChunkDesc {
            chunk: h.chunk,
            offset: h.size,
            addr: h.addr,
            rkey: h.rkey,
            len: h.len,
        });
        Ok(())
    }
}

impl PointToPoint {
    /// Sender: announces further chunks as leases free up.
    pub(crate) fn advance_get_send(&mut self, id: RequestId) -> Result<usize> {
        self.advance_rndv_send(id, |rs, buf, io| rs.advance_get(id, buf, io))
    }

    /// Receiver: reads announced chunks, in pieces of its own granularity.
    pub(crate) fn advance_get_recv(&mut self, rid: RequestId) -> Result<usize> {
        self.advance_rndv_recv(rid, |rv, buf, io| rv.advance_get(rid, buf, io))
    }

    /// Receiver: a piece was read.
    pub(crate) fn on_read_done(&mut self, op: RdmaOp) -> Result<()> {
        let rid = op.req;
        match self.step_rndv_recv(rid, |rv, _, io| rv.on_read_done(rid, &op, io)) {
            Some(Ok(true)) => {
                self.finish_recv(rid);
                Ok(())
            }
            Some(Err(e)) => Err(e),
            Some(Ok(false)) | None => Ok(()),
        }
    }

    /// Receiver: the sender made another chunk readable.
    ///
    /// The chunk must lie inside the message: one outside it is a protocol violation.
    pub(crate) fn on_chunk_ready(&mut self, peer: usize, h: Header) -> Result<()> {
        let rid = RequestId(h.rreq);
        if !self.is_rndv_recv_from(rid, peer) {
            return Ok(());
        }
        if let Some(Err(why)) = self.step_rndv_recv(rid, |rv, _, _| rv.on_chunk_ready(&h)) {
            self.protocol_violation(peer, why);
            return Ok(());
        }
        self.advance_get_recv(rid).map(|_| ())
    }

    /// Sender: the receiver read a chunk (or wants nothing more).
    pub(crate) fn on_chunk_done(&mut self, peer: usize, h: Header) -> Result<()> {
        let id = RequestId(h.sreq);
        if !self.is_rndv_send_to(id, peer) {
            return Ok(());
        }
        self.step_rndv_send(id, |rs, _, io| rs.on_chunk_done(&h, io));
        self.maybe_finish_send(id);
        self.advance_get_send(id).map(|_| ())
    }
}

#[cfg(test)]
mod tests;
