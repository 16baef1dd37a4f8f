//! Rendezvous, the part shared by RGET and RPUT: the per-request state each side's machine
//! works on, the chunk pipeline both protocols drive, and how a transfer ends (its RTS is in
//! `rndv_rts.rs`).
//!
//! Each side of a transfer has its own plan from its buffer mode ([`Transfer`]): a chunk size
//! and how many leases it may hold at once. The side that announces regions (the sender in
//! RGET, the receiver in RPUT) cuts the buffer in its own chunks; the side that posts the
//! RDMA operations splits each announced chunk into pieces of its own. So a zero-copy side
//! (one chunk) and a copying side (bounce-slot chunks) work together, as when `pindown` falls
//! back to copying for one transfer. The receiver decides how much it takes (`eff`, less than
//! `size` when its buffer is shorter: the message is truncated and nothing past the buffer is
//! written) and says when it is done (`ALL_DONE`).
//!
//! **Scatter-gather rendezvous**. A buffer with gaps (a derived datatype,
//! [`Layout`](crate::buffer_mode::Layout)) in a zero-copy transfer moves in place, run by run,
//! as MPI libraries move non-contiguous datatypes over RDMA instead of packing them: the
//! mode registers the buffer's whole span once (registering reads no byte, gaps included);
//! the announcing side's chunks are its runs; the side posting the RDMA operations cuts each
//! piece at its own runs as well, so every READ or WRITE joins one run of each side and no
//! gap is read or written. An RGET sender announces every run at once (as many as fit in the
//! RTS, the rest by ChunkReady) and flags the RTS `SCATTER_GATHER`, so the receiver answers
//! only with the final ChunkDone. Whether a buffer with gaps goes this way or is packed is
//! the caller's choice ([`PointToPoint::moves_in_place`]); in `copy` (and in a pindown
//! transfer that fell back to copying) the bounce slots gather and scatter the runs instead.

use std::collections::VecDeque;

use super::wire::{self, Header, MsgKind};
use super::{ChunkDesc, PointToPoint, RdmaOp, RecvState, Req, RequestId, SendState, Status};
use crate::buffer_mode::{Lease, Transfer, UserMemory};
use crate::error::{Error, Result};

/// The chunk number of a ChunkDone that names no chunk (the receiver introducing itself).
pub(crate) const NO_CHUNK: u32 = u32::MAX;

/// The receiver's last word in a rendezvous: it takes nothing more, so the send may end —
/// `ChunkDone(ALL_DONE)` when the receiver reads (RGET), a CTS with ALL_DONE for chunk `next`
/// when the sender writes (RPUT). Sent when the data is all in, and when a receive fails or
/// has room for nothing.
pub(super) fn takes_nothing_more(get: bool, next: u32, sreq: u64, rreq: u64) -> Header {
    let mut m = Header::new(if get {
        MsgKind::ChunkDone
    } else {
        MsgKind::Cts
    });
    m.flags = wire::ALL_DONE;
    m.chunk = if get { NO_CHUNK } else { next };
    m.sreq = sreq;
    m.rreq = rreq;
    m
}

/// A region the receiver made writable (RPUT), as the sender works through it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cts {
    pub chunk: u32,
    pub offset: u64,
    pub len: u64,
    pub addr: u64,
    pub rkey: u32,
    pub rreq: u64,
    pub last: bool,
}

/// The sending side of a rendezvous.
pub(crate) struct RndvSend {
    pub t: Transfer,
    pub size: usize,
    pub get: bool,
    /// RGET: chunks of the whole message in this side's granularity.
    pub n: u32,
    /// RGET: the next chunk to announce.
    pub next: u32,
    /// Leases held: RGET by chunk, RPUT by piece key.
    pub leases: Vec<(u64, Lease)>,
    /// RPUT: regions received and not yet written in full.
    pub pending_cts: VecDeque<Cts>,
    /// RPUT: bytes of the front region already written.
    pub issued: u64,
    /// The receiver said it wants nothing more.
    pub all_done: bool,
    /// RPUT: writes posted and not yet completed.
    pub writes_out: u32,
    /// The receiver's request id, once known.
    pub rreq: Option<u64>,
    pub next_key: u64,
    /// Scatter-gather: this side moves its gapped buffer in place, run by run.
    pub scatter_gather: bool,
}

/// Removes and returns the lease held under `key` (a chunk number or a piece's key).
fn take_lease(leases: &mut Vec<(u64, Lease)>, key: u64) -> Option<Lease> {
    let i = leases.iter().position(|(k, _)| *k == key)?;
    Some(leases.swap_remove(i).1)
}

impl RndvSend {
    /// The send as its RTS leaves: `size` bytes under plan `t`, by RGET (`get`) or RPUT, in
    /// `n` chunks of this side; `leases` are the chunks the RTS made readable (RGET), and
    /// `announced` how many chunks (runs, when `scatter_gather`) it described.
    pub(crate) fn new(
        t: Transfer,
        size: usize,
        get: bool,
        n: u32,
        announced: u32,
        leases: Vec<(u64, Lease)>,
        scatter_gather: bool,
    ) -> Self {
        Self {
            t,
            size,
            get,
            n,
            next: announced,
            leases,
            pending_cts: VecDeque::new(),
            issued: 0,
            all_done: false,
            writes_out: 0,
            rreq: None,
            next_key: 0,
            scatter_gather,
        }
    }

    /// Removes and returns the lease held under `key`.
    pub(crate) fn take_lease(&mut self, key: u64) -> Option<Lease> {
        take_lease(&mut self.leases, key)
    }

    /// Whether nothing of the send is left: the receiver takes nothing more, and no lease,
    /// WRITE or region asked for is outstanding.
    pub(crate) fn is_finished(&self) -> bool {
        self.all_done
            && self.leases.is_empty()
            && self.writes_out == 0
            && self.pending_cts.is_empty()
    }
}

/// The receiving side of a rendezvous.
pub(crate) struct RndvRecv {
    pub t: Transfer,
    pub peer: usize,
    pub sreq: u64,
    pub tag: i32,
    pub size: usize,
    /// Bytes taken: `min(size, buffer length)`.
    pub eff: usize,
    pub get: bool,
    /// RPUT: chunks needed to take `eff` bytes, in this side's granularity.
    pub n: u32,
    /// RPUT: the next chunk to ask for.
    pub next: u32,
    /// RPUT: chunks landed.
    pub done: u32,
    /// Leases held: RPUT by chunk, RGET by piece key.
    pub leases: Vec<(u64, Lease)>,
    /// RGET: chunks the sender made readable and not yet read in full.
    pub announced: VecDeque<ChunkDesc>,
    /// RGET: bytes of every chunk the sender announced (never more than `size`: a peer that
    /// announces more breaks the protocol, and the receive would never end).
    pub announced_bytes: u64,
    /// RGET: bytes of the front announced chunk already read.
    pub issued: u64,
    /// RGET: per announced chunk, pieces in flight and whether all were posted.
    pub pieces: Vec<(u32, u32, bool)>,
    /// Bytes landed.
    pub landed: usize,
    pub next_key: u64,
    /// RGET: where this side's reads stop (`eff`, or the start of the split tail).
    pub read_end: usize,
    /// Split rendezvous ([`super::rndv_split`]): the tail `(offset, len)` the sender writes.
    pub split_tail: Option<(usize, usize)>,
    /// The lease of that tail, held until its FIN (apart from `leases`, which bound the
    /// reads in flight).
    pub tail_lease: Option<Lease>,
    /// Scatter-gather: this side moves its gapped buffer in place, run by run.
    pub scatter_gather: bool,
    /// RGET: the sender announced its runs all at once (`SCATTER_GATHER`); it needs no
    /// ChunkDone but the last.
    pub peer_scatter_gather: bool,
}

impl RndvRecv {
    /// The receive as the RTS `rts` from `peer` matched it: this side takes `eff` bytes
    /// under plan `t`, in `n` chunks of its own (RPUT), moving its buffer in place when
    /// `scatter_gather`; `announced` are the chunks the RTS described (RGET).
    pub(crate) fn new(
        t: Transfer,
        peer: usize,
        rts: &Header,
        eff: usize,
        n: u32,
        announced: VecDeque<ChunkDesc>,
        scatter_gather: bool,
    ) -> Self {
        let get = rts.flags & wire::GET != 0;
        Self {
            t,
            peer,
            sreq: rts.sreq,
            tag: rts.tag,
            size: rts.size as usize,
            eff,
            get,
            n,
            next: 0,
            done: 0,
            leases: Vec::new(),
            announced_bytes: announced.iter().map(|c| c.len).sum(),
            announced,
            issued: 0,
            pieces: Vec::new(),
            landed: 0,
            next_key: 0,
            read_end: eff,
            split_tail: None,
            tail_lease: None,
            scatter_gather,
            peer_scatter_gather: get && rts.flags & wire::SCATTER_GATHER != 0,
        }
    }

    /// Removes and returns the lease held under `key`.
    pub(crate) fn take_lease(&mut self, key: u64) -> Option<Lease> {
        take_lease(&mut self.leases, key)
    }
}

/// Chunk `k` of `total` bytes cut in `chunk`-byte pieces: (offset, length).
pub(crate) fn chunk_range(k: u32, chunk: usize, total: usize) -> (usize, usize) {
    let off = k as usize * chunk;
    (off, chunk.min(total.saturating_sub(off)))
}

pub(crate) fn chunk_count(total: usize, chunk: usize) -> u32 {
    total.div_ceil(chunk) as u32
}

/// This side's chunk size and lease depth (one SGE carries at most 4 GiB; zero-copy
/// transfers get 1 GiB chunks at most). A scatter-gather side holds up to
/// [`SCATTER_GATHER_DEPTH`] leases, views of one registration, so that its runs move
/// concurrently.
pub(crate) fn chunking(t: &Transfer, scatter_gather: bool) -> (usize, usize) {
    let depth = if scatter_gather {
        SCATTER_GATHER_DEPTH
    } else {
        t.pipeline.depth.max(1)
    };
    (t.pipeline.chunk.clamp(4096, 1 << 30), depth)
}

/// RDMA operations (or regions asked for) one scatter-gather side keeps in flight.
pub(crate) const SCATTER_GATHER_DEPTH: usize = 64;

/// Runs a gapped buffer may have to move in place (beyond it, it is packed): chunk numbers
/// stay clear of the protocol's reserved ones.
pub(crate) const SCATTER_GATHER_MAX_RUNS: u64 = 1 << 24;

/// Chunk `k` of the first `total` message bytes of `buf`, cut in `chunk`-byte chunks, or in
/// its runs when the side moves it scatter-gather: (message offset, offset from the buffer's
/// start, length).
pub(crate) fn side_chunk(
    buf: &UserMemory,
    scatter_gather: bool,
    k: u32,
    chunk: usize,
    total: usize,
) -> (usize, usize, usize) {
    match buf.layout() {
        Some(l) if scatter_gather => {
            let p = l.piece(k as u64);
            let len = (p.len as usize).min(total.saturating_sub(p.at as usize));
            (p.at as usize, p.offset as usize, len)
        }
        _ => {
            let (off, len) = chunk_range(k, chunk, total);
            (off, off, len)
        }
    }
}

/// Chunks of the first `total` message bytes of `buf` (see [`side_chunk`]).
pub(crate) fn side_chunk_count(
    buf: &UserMemory,
    scatter_gather: bool,
    chunk: usize,
    total: usize,
) -> u32 {
    match buf.layout() {
        Some(l) if scatter_gather => l.runs_before(total as u64) as u32,
        _ => chunk_count(total, chunk),
    }
}

/// Where this side's next RDMA piece from message byte `at` lies: its offset from the
/// buffer's start and at most `len` bytes, cut at the end of a run when the side moves its
/// buffer scatter-gather.
pub(crate) fn side_piece(
    buf: &UserMemory,
    scatter_gather: bool,
    at: u64,
    len: u64,
) -> (usize, u64) {
    if scatter_gather {
        let p = buf.piece_at(at as usize);
        (p.offset as usize, len.min(p.len))
    } else {
        (at as usize, len)
    }
}

impl PointToPoint {
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
        if rs.is_finished() {
            let status = self.sent_status(s.tag, rs.size);
            self.complete(id, Ok(status));
        }
    }

    /// Gives back what a rendezvous request holds (leases, the mode's transfer); called when
    /// it completes, normally or not.
    pub(crate) fn end_rndv(&mut self, req: &mut Req) {
        let (leases, t) = match req {
            Req::Send(s) => match &mut s.state {
                SendState::Rndv(rs) => (std::mem::take(&mut rs.leases), Some(rs.t)),
                SendState::LocalCopy(_) => {
                    let p = &mut self.peers[s.peer];
                    p.local_copies_out = p.local_copies_out.saturating_sub(1);
                    (Vec::new(), None)
                }
                _ => (Vec::new(), None),
            },
            Req::Recv(r) => match &mut r.state {
                RecvState::Rndv(rv) => {
                    let mut l = std::mem::take(&mut rv.leases);
                    l.extend(rv.tail_lease.take().map(|t| (u64::MAX, t)));
                    (l, Some(rv.t))
                }
                _ => (Vec::new(), None),
            },
            Req::Done(_) => (Vec::new(), None),
        };
        for (_, l) in leases {
            self.mode.release(&*self.nic, l);
        }
        if let Some(t) = t {
            self.mode.end(&*self.nic, t);
        }
    }

    /// Drives every active rendezvous as far as leases and queue room allow.
    /// Advances every active rendezvous; an error fails the request it belongs to.
    pub(crate) fn advance_rendezvous(&mut self) -> usize {
        let mut events = 0;
        let active: smallvec::SmallVec<[RequestId; 8]> = self.active.iter().copied().collect();
        for id in active {
            let advanced = match self.reqs.get(id) {
                Some(Req::Send(s)) => match &s.state {
                    SendState::Rndv(rs) if rs.get => self.advance_get_send(id),
                    SendState::Rndv(_) => self.advance_put_send(id),
                    _ => Ok(0),
                },
                Some(Req::Recv(r)) => match &r.state {
                    RecvState::Rndv(rv) if rv.get => self.advance_get_recv(id),
                    RecvState::Rndv(_) => self.advance_put_recv(id),
                    _ => Ok(0),
                },
                _ => {
                    self.active.retain(|a| *a != id);
                    Ok(0)
                }
            };
            match advanced {
                Ok(n) => events += n,
                Err(e) => self.fail_request(id, e, false),
            }
        }
        events
    }

    /// Whether request `id` is a rendezvous send to `peer` (a control message from `peer`
    /// may only concern its own transfers; one naming another is ignored).
    pub(crate) fn is_rndv_send_to(&self, id: RequestId, peer: usize) -> bool {
        matches!(self.reqs.get(id), Some(Req::Send(s)) if s.peer == peer && matches!(s.state, SendState::Rndv(_)))
    }

    /// Whether request `id` is a rendezvous receive from `peer`.
    pub(crate) fn is_rndv_recv_from(&self, id: RequestId, peer: usize) -> bool {
        matches!(self.reqs.get(id), Some(Req::Recv(r)) if matches!(&r.state, RecvState::Rndv(rv) if rv.peer == peer))
    }

    /// Control messages of the rendezvous protocols.
    pub(crate) fn handle_rndv_control(
        &mut self,
        peer: usize,
        kind: MsgKind,
        h: Header,
    ) -> Result<()> {
        // The request the message is for: the sender's for CTS and ChunkDone, the
        // receiver's for FIN and ChunkReady.
        let (id, handled) = match kind {
            MsgKind::Cts => (h.sreq, self.on_cts(peer, h)),
            MsgKind::Fin => (h.rreq, self.on_fin(peer, h)),
            MsgKind::ChunkReady => (h.rreq, self.on_chunk_ready(peer, h)),
            MsgKind::ChunkDone => (h.sreq, self.on_chunk_done(peer, h)),
            _ => return Ok(()),
        };
        if let Err(e) = handled {
            let id = RequestId(id);
            // Only a request of this peer's transfers (a message naming another is ignored).
            let ours = match kind {
                MsgKind::Cts | MsgKind::ChunkDone => self.is_rndv_send_to(id, peer),
                _ => self.is_rndv_recv_from(id, peer),
            };
            if ours {
                self.fail_request(id, e, false);
            }
        }
        Ok(())
    }

    /// An RDMA operation of a rendezvous completed.
    pub(crate) fn rndv_rdma_done(&mut self, op: RdmaOp) -> Result<()> {
        match self.reqs.get(op.req) {
            Some(Req::Send(_)) => self.on_write_done(op),
            Some(Req::Recv(_)) => self.on_read_done(op),
            // The request failed meanwhile and gave its leases back.
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
        assert_eq!(chunk_range(0, 1 << 30, 100), (0, 100));
    }
}
