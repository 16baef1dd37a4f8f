//! RPUT: the receiver returns CTS and the sender RDMA-WRITEs.
//!
//! For each chunk of its own granularity the receiver leases a landing area (its buffer
//! itself in zero-copy modes, a bounce slot in `copy`) and sends CTS with its offset and key;
//! the sender writes it in pieces of its own granularity and, once the region is written in
//! full, sends FIN on the same queue pair, so FIN arrives after the data. The receiver stages
//! the chunk in and asks for the next. The last CTS carries ALL_DONE. NFS-RDMA calls this
//! the Read-Write design's write half.
//!
//! As in RGET, each side is a machine over its own state, moved by the protocol's events
//! (a pass of progress, a CTS, a FIN, a WRITE completed) against [`RendezvousIo`] alone;
//! the [`PointToPoint`] methods at the end hand it the request's state and the layer's I/O.

use super::rndv::{chunking, side_chunk, side_piece, Cts, RndvRecv, RndvSend};
use super::rndv_io::RendezvousIo;
use super::rndv_split::SPLIT_CHUNK;
use super::wire::{self, Header, MsgKind};
use super::{PointToPoint, RdmaOp, RequestId};
use crate::buffer_mode::UserMemory;
use crate::error::Result;
use crate::nic::Opcode;

/// What became of a CTS at the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CtsTaken {
    /// The region lies outside the message: the receiver broke the protocol.
    OutsideMessage,
    /// It was the split tail, written and FIN sent at once.
    TailWritten,
    /// It waits its turn in the RPUT pipeline.
    Queued,
    /// The send has failed: nothing more of it is written.
    Dropped,
}

impl RndvRecv {
    /// RPUT receiver, a pass: asks for chunks (a CTS each, the last with ALL_DONE) while
    /// landing leases are available. Returns the CTS sent.
    pub(crate) fn advance_put(
        &mut self,
        rid: RequestId,
        buf: &UserMemory,
        io: &mut impl RendezvousIo,
    ) -> Result<usize> {
        let mut events = 0;
        let (chunk, depth) = chunking(&self.t, self.scatter_gather);
        while self.next < self.n && self.leases.len() < depth {
            let k = self.next;
            let (off, mem, len) = side_chunk(buf, self.scatter_gather, k, chunk, self.eff);
            let Some(lease) = io.lease(&self.t, mem, len)? else {
                return Ok(events);
            };
            let mut h = Header::new(MsgKind::Cts);
            h.chunk = k;
            h.size = off as u64; // the region's offset in the message
            h.addr = lease.addr;
            h.rkey = lease.rkey;
            h.len = len as u64;
            h.sreq = self.sreq;
            h.rreq = rid.0;
            if k + 1 == self.n {
                h.flags |= wire::ALL_DONE;
            }
            self.leases.push((k as u64, lease));
            self.next += 1;
            io.send_control(h)?;
            events += 1;
        }
        Ok(events)
    }

    /// RPUT receiver: the sender wrote region `chunk` whole (its FIN). Stages it in and gives
    /// its lease back; returns whether the receive has everything, or `None` for a FIN of a
    /// region this side holds no lease for (which changes nothing).
    pub(crate) fn on_fin(
        &mut self,
        chunk: u32,
        buf: &UserMemory,
        io: &mut impl RendezvousIo,
    ) -> Option<bool> {
        let lease = self.take_lease(chunk as u64)?;
        let (size, _) = chunking(&self.t, self.scatter_gather);
        let (off, _, len) = side_chunk(buf, self.scatter_gather, chunk, size, self.eff);
        self.done += 1;
        self.landed += len;
        io.stage(&lease, off, len);
        io.release(lease);
        Some(self.done == self.n)
    }
}

impl RndvSend {
    /// RPUT sender: whether the region a CTS names lies inside the message (checked
    /// arithmetic). One outside it breaks the protocol: nothing of it may be written.
    pub(crate) fn cts_inside_message(&self, h: &Header) -> bool {
        h.size
            .checked_add(h.len)
            .is_some_and(|end| end <= self.size as u64)
    }

    /// RPUT sender: the receiver is ready for a region. A region outside the message breaks
    /// the protocol and nothing of it is written; the tail of a split rendezvous is written
    /// at once when it can be ([`RndvSend::write_split_tail`]); any other region is queued
    /// for [`RndvSend::advance_put`], and the mode told which bytes are about to move.
    pub(crate) fn take_cts(
        &mut self,
        id: RequestId,
        h: &Header,
        buf: &UserMemory,
        io: &mut impl RendezvousIo,
    ) -> Result<CtsTaken> {
        if !self.cts_inside_message(h) {
            return Ok(CtsTaken::OutsideMessage);
        }
        if h.chunk == SPLIT_CHUNK && self.write_split_tail(id, h, io)? {
            return Ok(CtsTaken::TailWritten);
        }
        self.rreq = Some(h.rreq);
        self.pending_cts.push_back(Cts {
            chunk: h.chunk,
            offset: h.size,
            len: h.len,
            addr: h.addr,
            rkey: h.rkey,
            rreq: h.rreq,
            last: h.flags & wire::ALL_DONE != 0,
        });
        let (lo, hi) = buf.bounds(h.size as usize, h.len as usize);
        io.about_to_move(&self.t, lo, hi.saturating_sub(lo));
        Ok(CtsTaken::Queued)
    }

    /// RPUT sender, a pass: writes the regions asked for, in pieces of its own granularity,
    /// and sends each region's FIN once it is written whole. Returns the WRITEs posted.
    pub(crate) fn advance_put(
        &mut self,
        id: RequestId,
        buf: &UserMemory,
        io: &mut impl RendezvousIo,
    ) -> Result<usize> {
        let mut events = 0;
        let (chunk, depth) = chunking(&self.t, self.scatter_gather);
        while let Some(cts) = self.pending_cts.front().copied() {
            let end = cts.offset + cts.len;
            let piece_off = cts.offset + self.issued;
            if cts.len > 0 {
                if self.leases.len() >= depth {
                    break;
                }
                let (mem, piece_len) = side_piece(
                    buf,
                    self.scatter_gather,
                    piece_off,
                    (chunk as u64).min(end - piece_off),
                );
                let Some(lease) = io.lease(&self.t, mem, piece_len as usize)? else {
                    break;
                };
                io.stage(&lease, piece_off as usize, piece_len as usize);
                self.next_key += 1;
                let key = self.next_key;
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
                if !io.post_rdma(op, &lease, write)? {
                    io.release(lease);
                    break;
                }
                self.leases.push((key, lease));
                self.writes_out += 1;
                self.issued += piece_len;
                events += 1;
                if piece_off + piece_len < end {
                    continue;
                }
                let mut fin = Header::new(MsgKind::Fin);
                fin.chunk = cts.chunk;
                fin.sreq = id.0;
                fin.rreq = cts.rreq;
                io.send_control(fin)?;
            }
            self.pending_cts.pop_front();
            self.issued = 0;
            self.all_done |= cts.last;
        }
        Ok(events)
    }

    /// RPUT sender: the WRITE with `key` completed; its lease is free.
    pub(crate) fn on_write_done(&mut self, key: u64, io: &mut impl RendezvousIo) {
        if let Some(lease) = self.take_lease(key) {
            io.release(lease);
        }
        self.writes_out -= 1;
    }
}

impl PointToPoint {
    /// Receiver: asks for chunks while landing leases are available.
    pub(crate) fn advance_put_recv(&mut self, rid: RequestId) -> Result<usize> {
        self.advance_rndv_recv(rid, |rv, buf, io| rv.advance_put(rid, buf, io))
    }

    /// Receiver: a region was written.
    pub(crate) fn on_fin(&mut self, peer: usize, h: Header) -> Result<()> {
        let rid = RequestId(h.rreq);
        if !self.is_rndv_recv_from(rid, peer) {
            return Ok(());
        }
        if h.chunk == super::rndv_split::SPLIT_CHUNK {
            return self.on_split_fin(h);
        }
        match self.step_rndv_recv(rid, |rv, buf, io| rv.on_fin(h.chunk, buf, io)) {
            Some(Some(true)) => self.finish_recv(rid),
            Some(Some(false)) => {
                self.advance_put_recv(rid)?;
            }
            Some(None) | None => {}
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
        // A failed request writes nothing more, but a CTS outside the message still breaks
        // the protocol.
        let failing = self.is_failing(id);
        let taken = self.step_rndv_send(id, |rs, buf, io| match failing {
            false => rs.take_cts(id, &h, buf, io),
            true if rs.cts_inside_message(&h) => Ok(CtsTaken::Dropped),
            true => Ok(CtsTaken::OutsideMessage),
        });
        match taken.transpose()? {
            Some(CtsTaken::OutsideMessage) => {
                self.protocol_violation(peer, "a CTS for bytes outside the message");
                Ok(())
            }
            Some(CtsTaken::Queued) => self.advance_put_send(id).map(|_| ()),
            Some(CtsTaken::TailWritten | CtsTaken::Dropped) | None => Ok(()),
        }
    }

    /// Sender: writes the regions asked for, in pieces of its own granularity.
    pub(crate) fn advance_put_send(&mut self, id: RequestId) -> Result<usize> {
        if self.is_failing(id) {
            // A failed request starts no more work, and ends as `failure.rs` says.
            return Ok(0);
        }
        let events = self.advance_rndv_send(id, |rs, buf, io| rs.advance_put(id, buf, io))?;
        self.maybe_finish_send(id);
        Ok(events)
    }

    /// Sender: a piece's write completed; its lease is free.
    pub(crate) fn on_write_done(&mut self, op: RdmaOp) -> Result<()> {
        self.step_rndv_send(op.req, |rs, _, io| rs.on_write_done(op.key, io));
        self.maybe_finish_send(op.req);
        self.advance_put_send(op.req).map(|_| ())
    }
}

#[cfg(test)]
mod tests;
