//! What a rendezvous side needs from the layer around it, and nothing more: leases of its
//! buffer from the buffer mode and the bytes staged between lease and buffer ([`LeaseIo`],
//! which a put or get uses too), RDMA operations posted to its peer, control messages sent
//! to it. The protocol machines (`rndv_get.rs`,
//! `rndv_put.rs`, `rndv_split.rs`) are written against [`RendezvousIo`] alone, so their tests
//! drive them with a fake of it, as the pin-down cache's tests drive it with a fake
//! registrar; [`LayerIo`] is the real one, over the buffer mode, the NIC and the
//! layer's control path.

use super::rndv::{RndvRecv, RndvSend};
use super::wire::Header;
use super::{PointToPoint, RdmaOp, RecvState, Req, RequestId, SendState};
use crate::buffer_mode::{Direction, Lease, Transfer, UserBuf, UserBufMut, UserMemory};
use crate::error::Result;
use crate::nic::Opcode;

#[cfg(test)]
pub(crate) mod fake;

/// Leases of one side's buffer, as a protocol machine uses them: a rendezvous side
/// ([`RendezvousIo`]) and a put or get ([`super::rma_transfer::RmaIo`]). The side knows
/// which way bytes move through its buffer.
pub(crate) trait LeaseIo {
    /// A lease for `len` bytes at `offset` of this side's buffer (`offset` from the buffer's
    /// start, gaps included), or `None` when the mode has no resources now (the machine
    /// tries again on a later pass).
    fn lease(&mut self, t: &Transfer, offset: usize, len: usize) -> Result<Option<Lease>>;

    /// Moves the bytes a lease stands for between it and the buffer, message bytes
    /// `[at, at+len)`: into the lease before the NIC reads it (the sending side), out of it
    /// once the NIC wrote it (the receiving side).
    fn stage(&mut self, lease: &Lease, at: usize, len: usize);

    /// Gives a lease back to the mode.
    fn release(&mut self, lease: Lease);
}

/// One side of one rendezvous transfer, as its protocol machine sees the world: leases of
/// its own buffer, and its one peer.
pub(crate) trait RendezvousIo: LeaseIo {
    /// The sending side is about to move `[offset, offset+len)` of its buffer (a CTS asked
    /// for it): the mode may make it ready ahead of the NIC (the ODP mode prefetches it).
    fn about_to_move(&mut self, t: &Transfer, offset: usize, len: usize);

    /// Posts `opcode` (an RDMA READ or WRITE) on `lease` to the peer; `op` comes back with
    /// its completion. `false` when the send queue has no room now (nothing was posted).
    fn post_rdma(&mut self, op: RdmaOp, lease: &Lease, opcode: Opcode) -> Result<bool>;

    /// Sends a control message to the peer (queued if it cannot leave now). An error means
    /// the peer cannot be reached.
    fn send_control(&mut self, h: Header) -> Result<()>;
}

/// The buffer of a rendezvous side, and so the way its bytes move.
pub(crate) enum SideBuf<'a> {
    /// A send buffer: the sending side stages into leases.
    Source(&'a UserBuf),
    /// A receive buffer: the receiving side stages out of leases.
    Sink(&'a UserBufMut),
}

/// [`RendezvousIo`] over the layer: the buffer mode, the NIC and the control path of
/// [`PointToPoint`], for the request whose buffer is `buf` and whose peer is `peer`.
pub(crate) struct LayerIo<'a> {
    pub p2p: &'a mut PointToPoint,
    pub peer: usize,
    pub buf: SideBuf<'a>,
}

impl LeaseIo for LayerIo<'_> {
    fn lease(&mut self, t: &Transfer, offset: usize, len: usize) -> Result<Option<Lease>> {
        let (addr, dir) = match &self.buf {
            SideBuf::Source(b) => (b.addr(), Direction::Source),
            SideBuf::Sink(b) => (b.addr(), Direction::Sink),
        };
        let p = &mut *self.p2p;
        p.mode.lease(&*p.nic, t, addr, offset, len, dir)
    }

    fn stage(&mut self, lease: &Lease, at: usize, len: usize) {
        match &self.buf {
            SideBuf::Source(b) => self.p2p.mode.stage_out(lease, b, at),
            SideBuf::Sink(b) => self.p2p.mode.stage_in(lease, b, at, len),
        }
    }

    fn release(&mut self, lease: Lease) {
        let p = &mut *self.p2p;
        p.mode.release(&*p.nic, lease);
    }
}

impl RendezvousIo for LayerIo<'_> {
    fn about_to_move(&mut self, t: &Transfer, offset: usize, len: usize) {
        let addr = match &self.buf {
            SideBuf::Source(b) => b.addr(),
            SideBuf::Sink(b) => b.addr(),
        };
        let p = &mut *self.p2p;
        p.mode.about_to_move(&*p.nic, t, addr, offset, len);
    }

    fn post_rdma(&mut self, op: RdmaOp, lease: &Lease, opcode: Opcode) -> Result<bool> {
        self.p2p.post_rdma(self.peer, op, lease, opcode)
    }

    fn send_control(&mut self, h: Header) -> Result<()> {
        self.p2p.send_control(self.peer, h)
    }
}

impl PointToPoint {
    /// Runs `step` on the rendezvous state of send `id`, with the layer's I/O for it. The
    /// state leaves the request for the step (the I/O borrows the rest of the layer) and
    /// goes back after it. `None` if `id` is no rendezvous send.
    pub(super) fn step_rndv_send<T>(
        &mut self,
        id: RequestId,
        step: impl FnOnce(&mut RndvSend, &UserMemory, &mut LayerIo<'_>) -> T,
    ) -> Option<T> {
        let Some(Req::Send(s)) = self.reqs.get_mut(id) else {
            return None;
        };
        let mut rs = match std::mem::replace(&mut s.state, SendState::Queued) {
            SendState::Rndv(rs) => rs,
            other => {
                s.state = other;
                return None;
            }
        };
        let (peer, buf) = (s.peer, s.buf.clone());
        let mut io = LayerIo {
            p2p: self,
            peer,
            buf: SideBuf::Source(&buf),
        };
        let out = step(&mut rs, &buf, &mut io);
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            s.state = SendState::Rndv(rs);
        }
        Some(out)
    }

    /// A pass of `advance` over the rendezvous state of send `id`, unless the request failed
    /// (a failed request starts no more work). Returns what the pass started.
    pub(super) fn advance_rndv_send(
        &mut self,
        id: RequestId,
        advance: impl FnOnce(&mut RndvSend, &UserMemory, &mut LayerIo<'_>) -> Result<usize>,
    ) -> Result<usize> {
        if self.is_failing(id) {
            return Ok(0);
        }
        self.step_rndv_send(id, advance).unwrap_or(Ok(0))
    }

    /// [`Self::advance_rndv_send`] for receive `rid`.
    pub(super) fn advance_rndv_recv(
        &mut self,
        rid: RequestId,
        advance: impl FnOnce(&mut RndvRecv, &UserMemory, &mut LayerIo<'_>) -> Result<usize>,
    ) -> Result<usize> {
        if self.is_failing(rid) {
            return Ok(0);
        }
        self.step_rndv_recv(rid, advance).unwrap_or(Ok(0))
    }

    /// [`Self::step_rndv_send`] for the rendezvous state of receive `rid`.
    pub(super) fn step_rndv_recv<T>(
        &mut self,
        rid: RequestId,
        step: impl FnOnce(&mut RndvRecv, &UserMemory, &mut LayerIo<'_>) -> T,
    ) -> Option<T> {
        let Some(Req::Recv(r)) = self.reqs.get_mut(rid) else {
            return None;
        };
        let mut rv = match std::mem::replace(&mut r.state, RecvState::Posted) {
            RecvState::Rndv(rv) => rv,
            other => {
                r.state = other;
                return None;
            }
        };
        let (peer, buf) = (rv.peer, r.buf.clone());
        let mut io = LayerIo {
            p2p: self,
            peer,
            buf: SideBuf::Sink(&buf),
        };
        let out = step(&mut rv, &buf, &mut io);
        if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
            r.state = RecvState::Rndv(rv);
        }
        Some(out)
    }
}
