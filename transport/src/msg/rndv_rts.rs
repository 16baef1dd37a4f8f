//! The RTS: how a rendezvous starts. The sender plans its side of the transfer with the
//! buffer mode, picks RGET or RPUT, makes the first chunks readable (RGET) and describes them
//! in the RTS; the receiver whose receive matches the RTS plans its side, builds its state,
//! and says what it takes (nothing, for an empty buffer), whether it splits the transfer,
//! and who it is when the sender has more to announce. From there each side is the machine
//! of its protocol (`rndv_get`, `rndv_put`, `rndv_split`).

use super::rndv::{
    chunk_range, chunking, side_chunk, side_chunk_count, takes_nothing_more, RndvRecv, RndvSend,
    NO_CHUNK,
};
use super::wire::{self, Header, MsgKind};
use super::{ChunkDesc, Payload, PointToPoint, RecvState, Req, RequestId, SendState};
use crate::buffer_mode::Direction;
use crate::error::Result;
use crate::msg::RndvProtocol;
use crate::sys::Error as SystemError;

impl PointToPoint {
    /// Sends the RTS of request `id` (a data message: the caller holds a credit). False if
    /// there was no room to send it now.
    pub(crate) fn start_rndv_send(&mut self, peer: usize, id: RequestId) -> Result<bool> {
        match self.try_start_rndv_send(peer, id) {
            Ok(started) => Ok(started),
            Err(e) => {
                // Nothing was sent: the request ends with the error and leaves the queue.
                self.fail_request(id, e, false);
                Ok(true)
            }
        }
    }

    fn try_start_rndv_send(&mut self, peer: usize, id: RequestId) -> Result<bool> {
        let Some(Req::Send(s)) = self.reqs.get(id) else {
            return Ok(true);
        };
        let (buf, tag, context, sync) = (s.buf.clone(), s.tag, s.context, s.sync);
        let t = self
            .mode
            .begin(&*self.nic, buf.addr(), buf.span(), Direction::Source)?;
        let sg = t.zero_copy && buf.is_gapped();
        let (chunk, depth) = chunking(&t, sg);
        let get = match self.cfg.rndv {
            RndvProtocol::Get => true,
            RndvProtocol::Put => false,
            // Zero-copy: RGET, one control message fewer. Copying: RPUT, which streamed
            // faster at every size measured (docs/results.md, "Choosing the defaults").
            RndvProtocol::Auto => t.zero_copy,
        };
        let n = side_chunk_count(&buf, sg, chunk, buf.len());
        let mut leases = Vec::new();
        let mut descs = Vec::new();
        if get && sg {
            // Every run readable at once through one view of the whole span; the RTS
            // describes as many as fit in it, ChunkReady the rest.
            let lease = self
                .mode
                .lease(&*self.nic, &t, buf.addr(), 0, buf.span(), Direction::Source)?
                .ok_or_else(|| {
                    SystemError::Internal("a zero-copy mode refused a lease of its buffer".into())
                })?;
            let fit = (self.cfg.eager_limit / wire::CHUNK_DESC_BYTES) as u32;
            for k in 0..n.min(fit) {
                let (at, offset, len) = side_chunk(&buf, true, k, chunk, buf.len());
                descs.push(ChunkDesc {
                    chunk: k,
                    offset: at as u64,
                    addr: lease.addr + offset as u64,
                    rkey: lease.rkey,
                    len: len as u64,
                });
            }
            leases.push((0, lease));
        } else if get {
            // Make the first chunks readable now and describe them in the RTS.
            for k in 0..n.min(depth as u32) {
                let (off, len) = chunk_range(k, chunk, buf.len());
                let Some(lease) =
                    self.mode
                        .lease(&*self.nic, &t, buf.addr(), off, len, Direction::Source)?
                else {
                    break;
                };
                self.mode.stage_out(&lease, &buf, off);
                descs.push(ChunkDesc {
                    chunk: k,
                    offset: off as u64,
                    addr: lease.addr,
                    rkey: lease.rkey,
                    len: lease.len,
                });
                leases.push((k as u64, lease));
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
        if get && sg {
            h.flags |= wire::SCATTER_GATHER;
        }
        if sync {
            h.flags |= wire::SYNC;
        }
        let bytes = Self::encode_chunks(&descs);
        if !self.send_message(peer, h, Payload::Bytes(&bytes))? {
            for (_, l) in leases {
                self.mode.release(&*self.nic, l);
            }
            self.mode.end(&*self.nic, t);
            return Ok(false);
        }
        self.counters.rndv_sent += 1;
        if get {
            // The receiver will read the whole buffer once the RTS matches.
            self.mode
                .about_to_move(&*self.nic, &t, buf.addr(), 0, buf.span());
        }
        let next = if sg { descs.len() } else { leases.len() } as u32;
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            s.state = SendState::Rndv(Box::new(RndvSend::new(
                t,
                buf.len(),
                get,
                n,
                next,
                leases,
                sg,
            )));
            if sg {
                self.counters.rndv_scatter_gather += 1;
            }
        }
        self.active.push(id);
        Ok(true)
    }

    pub(crate) fn encode_chunks(descs: &[ChunkDesc]) -> Vec<u8> {
        let mut v = Vec::with_capacity(descs.len() * 32);
        for d in descs {
            v.extend_from_slice(&d.chunk.to_le_bytes());
            v.extend_from_slice(&d.rkey.to_le_bytes());
            v.extend_from_slice(&d.addr.to_le_bytes());
            v.extend_from_slice(&d.len.to_le_bytes());
            v.extend_from_slice(&d.offset.to_le_bytes());
        }
        v
    }

    pub(crate) fn decode_chunks(b: &[u8]) -> Vec<ChunkDesc> {
        b.chunks_exact(32)
            .map(|c| ChunkDesc {
                chunk: u32::from_le_bytes(c[0..4].try_into().expect("4")),
                rkey: u32::from_le_bytes(c[4..8].try_into().expect("4")),
                addr: u64::from_le_bytes(c[8..16].try_into().expect("8")),
                len: u64::from_le_bytes(c[16..24].try_into().expect("8")),
                offset: u64::from_le_bytes(c[24..32].try_into().expect("8")),
            })
            .collect()
    }

    /// Receive `rid` matched the RTS `h` from `peer`. An error fails the receive (and, once
    /// nothing is in flight, tells the sender it takes nothing more).
    pub(crate) fn start_rndv_recv(
        &mut self,
        rid: RequestId,
        peer: usize,
        h: Header,
        chunks: Vec<ChunkDesc>,
    ) -> Result<()> {
        let (sreq, get) = (h.sreq, h.flags & wire::GET != 0);
        if let Err(e) = self.try_start_rndv_recv(rid, peer, h, chunks) {
            let started = matches!(
                self.reqs.get(rid),
                Some(Req::Recv(r)) if matches!(r.state, RecvState::Rndv(_))
            );
            if !started {
                // The sender waits for an answer to its RTS: this side takes nothing.
                let _ = self.send_control(peer, takes_nothing_more(get, 0, sreq, rid.0));
            }
            self.fail_request(rid, e, false);
        }
        Ok(())
    }

    fn try_start_rndv_recv(
        &mut self,
        rid: RequestId,
        peer: usize,
        h: Header,
        chunks: Vec<ChunkDesc>,
    ) -> Result<()> {
        let Some(Req::Recv(r)) = self.reqs.get(rid) else {
            return Ok(());
        };
        let buf = r.buf.clone();
        let size = h.size as usize;
        let eff = size.min(buf.len());
        let sg = buf.is_gapped();
        let t = self.mode.begin(
            &*self.nic,
            buf.addr(),
            if sg { buf.span() } else { eff },
            Direction::Sink,
        )?;
        let sg = sg && t.zero_copy;
        let (chunk, _) = chunking(&t, sg);
        let n = side_chunk_count(&buf, sg, chunk, eff);
        let nothing_announced = chunks.is_empty();
        let state = RndvRecv::new(t, peer, &h, eff, n, chunks.into_iter().collect(), sg);
        let (get, peer_sg) = (state.get, state.peer_scatter_gather);
        let split = get
            && self.cfg.rndv == RndvProtocol::Auto
            && state.t.zero_copy
            && !sg
            && !peer_sg
            && super::rndv_split::splittable(&state.announced, eff, self.cfg.split_min);
        let unannounced = state.announced_bytes < size as u64;
        if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
            r.state = RecvState::Rndv(Box::new(state));
        }
        if eff == 0 {
            // Nothing to take (an empty receive buffer): tell the sender to stop.
            self.send_control(peer, takes_nothing_more(get, 0, h.sreq, rid.0))?;
            self.finish_recv(rid);
            return Ok(());
        }
        if split {
            self.start_split(rid)?;
        }
        if sg {
            self.counters.rndv_scatter_gather += 1;
        }
        if get && (nothing_announced || (peer_sg && unannounced)) {
            // The sender had no lease free when it sent the RTS, or has more runs than the
            // RTS could describe: tell it who we are, so it can announce more (a ChunkDone
            // for no chunk).
            let mut m = Header::new(MsgKind::ChunkDone);
            m.chunk = NO_CHUNK;
            m.sreq = h.sreq;
            m.rreq = rid.0;
            self.send_control(peer, m)?;
        }
        self.active.push(rid);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_descriptors_round_trip() {
        let d = vec![
            ChunkDesc {
                chunk: 0,
                offset: 0,
                addr: 0x1000,
                rkey: 7,
                len: 4096,
            },
            ChunkDesc {
                chunk: 1,
                offset: 4096,
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
