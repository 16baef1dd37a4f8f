//! Rendezvous, the part shared by RGET and RPUT: the RTS, the per-request state, and the
//! chunk pipeline that both protocols drive.
//!
//! A message of `size` bytes moves as chunks of the buffer mode's `Pipeline::chunk` (one
//! chunk in zero-copy modes), at most `depth` leases per side at once. The receiver decides
//! how much it takes (`eff`, less than `size` when its buffer is shorter: the message is
//! truncated and nothing past the buffer is written) and says when it is done (`ALL_DONE`).

use std::collections::VecDeque;

use super::wire::{self, Header, MsgKind};
use super::{
    ChunkDesc, Payload, PointToPoint, RdmaOp, RecvState, Req, RequestId, SendState, Status,
};
use crate::buffer_mode::{Direction, Lease};
use crate::error::{Error, Result};
use crate::msg::RndvProtocol;

/// The chunk number of a ChunkDone that names no chunk (the receiver introducing itself).
pub(crate) const NO_CHUNK: u32 = u32::MAX;

/// The sending side of a rendezvous.
pub(crate) struct RndvSend {
    pub size: usize,
    pub get: bool,
    pub chunk: usize,
    pub depth: usize,
    /// Chunks of the whole message.
    pub n: u32,
    /// RGET: the next chunk to announce.
    pub next: u32,
    /// Source leases held, by chunk.
    pub leases: Vec<(u32, Lease)>,
    /// RPUT: CTS received and not yet served.
    pub pending_cts: VecDeque<Header>,
    /// The receiver said it wants nothing more.
    pub all_done: bool,
    /// RPUT: writes posted and not yet completed.
    pub writes_out: u32,
    /// The receiver's request id, once known.
    pub rreq: Option<u64>,
}

/// The receiving side of a rendezvous.
pub(crate) struct RndvRecv {
    pub peer: usize,
    pub sreq: u64,
    pub tag: i32,
    pub size: usize,
    /// Bytes taken: `min(size, buffer length)`.
    pub eff: usize,
    pub get: bool,
    pub chunk: usize,
    pub depth: usize,
    /// Chunks needed to take `eff` bytes.
    pub n: u32,
    /// RPUT: the next chunk to ask for.
    pub next: u32,
    /// Chunks landed.
    pub done: u32,
    /// Landing leases held, by chunk.
    pub leases: Vec<(u32, Lease)>,
    /// RGET: chunks the sender made readable and we have not read yet.
    pub announced: VecDeque<ChunkDesc>,
}

/// Chunk `k` of a message of `total` bytes cut in `chunk`-byte pieces: (offset, length).
pub(crate) fn chunk_range(k: u32, chunk: usize, total: usize) -> (usize, usize) {
    let off = k as usize * chunk;
    (off, chunk.min(total.saturating_sub(off)))
}

pub(crate) fn chunk_count(total: usize, chunk: usize) -> u32 {
    total.div_ceil(chunk) as u32
}

impl PointToPoint {
    fn chunking(&self) -> (usize, usize) {
        let p = self.mode.pipeline();
        // One SGE carries at most 4 GiB; zero-copy modes get 1 GiB chunks at most.
        (p.chunk.min(1 << 30), p.depth.max(1))
    }

    /// Sends the RTS of request `id` (a data message: the caller holds a credit). False if
    /// there was no room to send it now.
    pub(crate) fn start_rndv_send(&mut self, peer: usize, id: RequestId) -> Result<bool> {
        let Some(Req::Send(s)) = self.reqs.get(id) else {
            return Ok(true);
        };
        let (buf, tag, context, sync) = (s.buf, s.tag, s.context, s.sync);
        let (chunk, depth) = self.chunking();
        let get = match self.cfg.rndv {
            RndvProtocol::Get => true,
            RndvProtocol::Put => false,
            // Zero-copy modes: RGET, one control message fewer. Copying modes: RPUT, which
            // streamed faster at every size measured (README, "Choosing the defaults").
            RndvProtocol::Auto => self.mode.is_zero_copy(),
        };
        let n = chunk_count(buf.len(), chunk);
        let mut leases = Vec::new();
        let mut descs = Vec::new();
        if get {
            // Make the first chunks readable now and describe them in the RTS.
            for k in 0..n.min(depth as u32) {
                let (off, len) = chunk_range(k, chunk, buf.len());
                let Some(lease) =
                    self.mode
                        .lease(&*self.nic, buf.addr(), off, len, Direction::Source)?
                else {
                    break;
                };
                self.mode.stage_out(&lease, &buf, off);
                leases.push((k, lease));
                descs.push(ChunkDesc {
                    chunk: k,
                    addr: lease.addr,
                    rkey: lease.rkey,
                    len: lease.len,
                });
            }
        }
        let mut h = Header::new(MsgKind::Rts);
        h.tag = tag;
        h.context = context;
        h.size = buf.len() as u64;
        h.sreq = id.0;
        if get {
            h.flags |= wire::GET;
        }
        if sync {
            h.flags |= wire::SYNC;
        }
        let bytes = Self::encode_chunks(&descs);
        if !self.send_message(peer, h, Payload::Bytes(&bytes))? {
            for (_, l) in leases {
                self.mode.release(&*self.nic, l);
            }
            return Ok(false);
        }
        self.counters.rndv_sent += 1;
        let next = leases.len() as u32;
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            s.state = SendState::Rndv(RndvSend {
                size: buf.len(),
                get,
                chunk,
                depth,
                n,
                next,
                leases,
                pending_cts: VecDeque::new(),
                all_done: false,
                writes_out: 0,
                rreq: None,
            });
        }
        self.active.push(id);
        Ok(true)
    }

    pub(crate) fn encode_chunks(descs: &[ChunkDesc]) -> Vec<u8> {
        let mut v = Vec::with_capacity(descs.len() * 24);
        for d in descs {
            v.extend_from_slice(&d.chunk.to_le_bytes());
            v.extend_from_slice(&d.rkey.to_le_bytes());
            v.extend_from_slice(&d.addr.to_le_bytes());
            v.extend_from_slice(&d.len.to_le_bytes());
        }
        v
    }

    pub(crate) fn decode_chunks(b: &[u8]) -> Vec<ChunkDesc> {
        b.chunks_exact(24)
            .map(|c| ChunkDesc {
                chunk: u32::from_le_bytes(c[0..4].try_into().expect("4")),
                rkey: u32::from_le_bytes(c[4..8].try_into().expect("4")),
                addr: u64::from_le_bytes(c[8..16].try_into().expect("8")),
                len: u64::from_le_bytes(c[16..24].try_into().expect("8")),
            })
            .collect()
    }

    /// Receive `rid` matched the RTS `h` from `peer`.
    pub(crate) fn start_rndv_recv(
        &mut self,
        rid: RequestId,
        peer: usize,
        h: Header,
        chunks: Vec<ChunkDesc>,
    ) -> Result<()> {
        let Some(Req::Recv(r)) = self.reqs.get(rid) else {
            return Ok(());
        };
        let size = h.size as usize;
        let eff = size.min(r.buf.len());
        let (chunk, depth) = self.chunking();
        let get = h.flags & wire::GET != 0;
        let n = chunk_count(eff, chunk);
        let state = RndvRecv {
            peer,
            sreq: h.sreq,
            tag: h.tag,
            size,
            eff,
            get,
            chunk,
            depth,
            n,
            next: 0,
            done: 0,
            leases: Vec::new(),
            announced: chunks.into_iter().collect(),
        };
        let nothing_announced = state.announced.is_empty();
        if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
            r.state = RecvState::Rndv(state);
        }
        if get && n > 0 && nothing_announced {
            // The sender had no lease free when it sent the RTS: tell it who we are, so it
            // can announce chunks as leases free up (a ChunkDone for no chunk).
            let mut m = Header::new(MsgKind::ChunkDone);
            m.chunk = NO_CHUNK;
            m.sreq = h.sreq;
            m.rreq = rid.0;
            self.send_control(peer, m)?;
        }
        if n == 0 {
            // Nothing to take (an empty receive buffer): tell the sender to stop.
            let mut m = Header::new(if get {
                MsgKind::ChunkDone
            } else {
                MsgKind::Cts
            });
            m.flags = wire::ALL_DONE;
            m.sreq = h.sreq;
            m.rreq = rid.0;
            self.send_control(peer, m)?;
            self.finish_recv(rid);
            return Ok(());
        }
        self.active.push(rid);
        Ok(())
    }

    /// Completes a rendezvous receive: its status, or `Truncated` if the message was longer.
    pub(crate) fn finish_recv(&mut self, rid: RequestId) {
        let Some(Req::Recv(r)) = self.reqs.get(rid) else {
            return;
        };
        let RecvState::Rndv(rv) = &r.state else {
            return;
        };
        let result = if rv.size > rv.eff {
            Err(Error::Truncated {
                source_rank: rv.peer,
                tag: rv.tag,
                message_bytes: rv.size,
                buffer_bytes: rv.eff,
            })
        } else {
            Ok(Status {
                source: rv.peer,
                tag: rv.tag,
                count: rv.eff,
            })
        };
        self.complete(rid, result);
    }

    /// Completes a rendezvous send once nothing of it is in flight.
    pub(crate) fn maybe_finish_send(&mut self, id: RequestId) {
        let Some(Req::Send(s)) = self.reqs.get(id) else {
            return;
        };
        let SendState::Rndv(rs) = &s.state else {
            return;
        };
        if rs.all_done && rs.leases.is_empty() && rs.writes_out == 0 && rs.pending_cts.is_empty() {
            let status = Status {
                source: self.rank(),
                tag: s.tag,
                count: rs.size,
            };
            self.complete(id, Ok(status));
        }
    }

    /// Releases every lease a request holds (after a failure).
    pub(crate) fn release_leases_of(&mut self, id: RequestId) {
        let leases = match self.reqs.get_mut(id) {
            Some(Req::Send(s)) => match &mut s.state {
                SendState::Rndv(rs) => std::mem::take(&mut rs.leases),
                _ => Vec::new(),
            },
            Some(Req::Recv(r)) => match &mut r.state {
                RecvState::Rndv(rv) => std::mem::take(&mut rv.leases),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        for (_, l) in leases {
            self.mode.release(&*self.nic, l);
        }
    }

    /// Removes and returns the lease of chunk `k` held by request `id`.
    pub(crate) fn take_lease(&mut self, id: RequestId, k: u32) -> Option<Lease> {
        let leases = match self.reqs.get_mut(id)? {
            Req::Send(s) => match &mut s.state {
                SendState::Rndv(rs) => &mut rs.leases,
                _ => return None,
            },
            Req::Recv(r) => match &mut r.state {
                RecvState::Rndv(rv) => &mut rv.leases,
                _ => return None,
            },
            Req::Done(_) => return None,
        };
        let i = leases.iter().position(|(c, _)| *c == k)?;
        Some(leases.swap_remove(i).1)
    }

    /// Drives every active rendezvous as far as leases and queue room allow.
    pub(crate) fn advance_rendezvous(&mut self) -> Result<usize> {
        let mut events = 0;
        for id in self.active.clone() {
            events += match self.reqs.get(id) {
                Some(Req::Send(s)) => match &s.state {
                    SendState::Rndv(rs) if rs.get => self.advance_get_send(id)?,
                    SendState::Rndv(_) => self.advance_put_send(id)?,
                    _ => 0,
                },
                Some(Req::Recv(r)) => match &r.state {
                    RecvState::Rndv(rv) if rv.get => self.advance_get_recv(id)?,
                    RecvState::Rndv(_) => self.advance_put_recv(id)?,
                    _ => 0,
                },
                _ => {
                    self.active.retain(|a| *a != id);
                    0
                }
            };
        }
        Ok(events)
    }

    /// Control messages of the rendezvous protocols.
    pub(crate) fn handle_rndv_control(
        &mut self,
        peer: usize,
        kind: MsgKind,
        h: Header,
    ) -> Result<()> {
        match kind {
            MsgKind::Cts => self.on_cts(peer, h),
            MsgKind::Fin => self.on_fin(h),
            MsgKind::ChunkReady => self.on_chunk_ready(h),
            MsgKind::ChunkDone => self.on_chunk_done(peer, h),
            _ => Ok(()),
        }
    }

    /// An RDMA operation of a rendezvous completed.
    pub(crate) fn rndv_rdma_done(&mut self, op: RdmaOp) -> Result<()> {
        match self.reqs.get(op.req) {
            Some(Req::Send(_)) => self.on_write_done(op),
            Some(Req::Recv(_)) => self.on_read_done(op),
            // The request failed meanwhile; `fail_peer` released its leases.
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_message_exactly() {
        assert_eq!(chunk_count(0, 4096), 0);
        assert_eq!(chunk_count(1, 4096), 1);
        assert_eq!(chunk_count(8192, 4096), 2);
        assert_eq!(chunk_count(8193, 4096), 3);
        assert_eq!(chunk_range(2, 4096, 8193), (8192, 1));
        assert_eq!(chunk_range(0, usize::MAX >> 1, 100), (0, 100));
    }

    #[test]
    fn chunk_descriptors_round_trip() {
        let d = vec![
            ChunkDesc {
                chunk: 0,
                addr: 0x1000,
                rkey: 7,
                len: 4096,
            },
            ChunkDesc {
                chunk: 1,
                addr: 0x2000,
                rkey: 7,
                len: 1,
            },
        ];
        assert_eq!(
            PointToPoint::decode_chunks(&PointToPoint::encode_chunks(&d)),
            d
        );
    }
}
