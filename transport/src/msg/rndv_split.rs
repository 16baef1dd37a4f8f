//! Split rendezvous: the receiver RDMA-READs the front of a large zero-copy message while the
//! sender RDMA-WRITEs the back.
//!
//! On this kind of host a NIC's DMA is a kernel copy made by the CPU of the side that posts
//! it (`process_vm_readv`/`writev`), and one such copy moves about half what a CPU copy does
//! (docs/results.md, "Choosing the defaults"). In RGET the sender's CPU waits while the receiver's
//! copies; here both copy, each byte still exactly once. The receiver starts it when an RGET's
//! RTS that announces the whole sender buffer as one chunk (a zero-copy sender) matches a
//! zero-copy receive of at least [`super::MsgConfig::split_min`] bytes: it reads
//! `[0, half)` and sends a CTS for `[half, eff)` naming its own buffer (chunk
//! [`SPLIT_CHUNK`]); the sender writes that region and sends FIN; the receiver answers the
//! last of its read and the FIN with `ChunkDone(ALL_DONE)`, which ends the send. Four control
//! messages instead of RGET's two, worth it from some tens of KiB.

use std::collections::VecDeque;

use super::rndv::{takes_nothing_more, NO_CHUNK};
use super::wire::{Header, MsgKind};
use super::{ChunkDesc, PointToPoint, RecvState, Req, RequestId};
use crate::buffer_mode::Direction;
use crate::error::Result;
use crate::nic::{Opcode, PAGE_SIZE};

/// The chunk number of the CTS and FIN of a split's tail.
pub(crate) const SPLIT_CHUNK: u32 = u32::MAX - 1;
/// The sender's key for the lease of the tail it writes.
const TAIL_LEASE: u64 = u64::MAX;

/// Whether an RGET whose sender announced `chunks` may be split for an `eff`-byte receive.
pub(crate) fn splittable(chunks: &VecDeque<ChunkDesc>, eff: usize, split_min: usize) -> bool {
    eff >= split_min.max(2 * PAGE_SIZE as usize)
        && chunks.len() == 1
        && chunks[0].offset == 0
        && chunks[0].len as usize >= eff
}

/// Where the tail starts: half-way, on a page boundary.
fn split_point(eff: usize) -> usize {
    (eff / 2) & !(PAGE_SIZE as usize - 1)
}

impl PointToPoint {
    /// Receiver: leases the tail of receive `rid` and asks the sender to write it; the front
    /// is read as in RGET.
    pub(crate) fn start_split(&mut self, rid: RequestId) -> Result<()> {
        let Some(Req::Recv(r)) = self.reqs.get(rid) else {
            return Ok(());
        };
        let RecvState::Rndv(rv) = &r.state else {
            return Ok(());
        };
        let (buf, t, eff, peer, sreq) = (r.buf.clone(), rv.t, rv.eff, rv.peer, rv.sreq);
        let half = split_point(eff);
        let Some(lease) = self.mode.lease(
            &*self.nic,
            &t,
            buf.addr(),
            half,
            eff - half,
            Direction::Sink,
        )?
        else {
            return Ok(()); // no lease now: plain RGET
        };
        let mut h = Header::new(MsgKind::Cts);
        h.chunk = SPLIT_CHUNK;
        h.size = half as u64;
        h.addr = lease.addr;
        h.rkey = lease.rkey;
        h.len = (eff - half) as u64;
        h.sreq = sreq;
        h.rreq = rid.0;
        if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
            if let RecvState::Rndv(rv) = &mut r.state {
                rv.read_end = half;
                rv.split_tail = Some((half, eff - half));
                rv.tail_lease = Some(lease);
            }
        }
        self.counters.rndv_split += 1;
        self.send_control(peer, h)
    }

    /// Sender: the receiver asked for the tail. Writes it now, next to the receiver's read,
    /// and sends FIN; false if that cannot be done at once (it then waits its turn in the
    /// RPUT pipeline).
    pub(crate) fn write_split_tail(&mut self, id: RequestId, h: &Header) -> Result<bool> {
        if self.is_failing(id) {
            return Ok(true); // a failed request writes nothing more
        }
        let Some(Req::Send(s)) = self.reqs.get(id) else {
            return Ok(true);
        };
        let super::SendState::Rndv(rs) = &s.state else {
            return Ok(true);
        };
        let (buf, peer, t) = (s.buf.clone(), s.peer, rs.t);
        let (off, len) = (h.size as usize, h.len as usize);
        if off.checked_add(len).is_none_or(|end| end > rs.size) {
            return Ok(false); // not a region of this message: the RPUT path refuses it
        }
        self.mode
            .about_to_move(&*self.nic, &t, buf.addr(), off, len);
        let Some(lease) =
            self.mode
                .lease(&*self.nic, &t, buf.addr(), off, len, Direction::Source)?
        else {
            return Ok(false);
        };
        self.mode.stage_out(&lease, &buf, off);
        let key = TAIL_LEASE;
        let op = super::RdmaOp {
            req: id,
            key,
            chunk: SPLIT_CHUNK,
            offset: off,
            len,
        };
        let write = Opcode::RdmaWrite {
            remote_addr: h.addr,
            rkey: h.rkey,
        };
        if !self.post_rdma(peer, op, &lease, write)? {
            self.mode.release(&*self.nic, lease);
            return Ok(false);
        }
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            if let super::SendState::Rndv(rs) = &mut s.state {
                rs.leases.push((key, lease));
                rs.writes_out += 1;
                rs.rreq = Some(h.rreq);
            }
        }
        let mut fin = Header::new(MsgKind::Fin);
        fin.chunk = SPLIT_CHUNK;
        fin.sreq = id.0;
        fin.rreq = h.rreq;
        self.send_control(peer, fin)?;
        Ok(true)
    }

    /// Receiver: the tail was written.
    pub(crate) fn on_split_fin(&mut self, h: Header) -> Result<()> {
        let rid = RequestId(h.rreq);
        let Some(Req::Recv(r)) = self.reqs.get_mut(rid) else {
            return Ok(());
        };
        let RecvState::Rndv(rv) = &mut r.state else {
            return Ok(());
        };
        let (Some((off, len)), Some(lease)) = (rv.split_tail, rv.tail_lease.take()) else {
            return Ok(());
        };
        rv.landed += len;
        let (finished, buf, peer, sreq) = (rv.landed == rv.eff, r.buf.clone(), rv.peer, rv.sreq);
        self.mode.stage_in(&lease, &buf, off, len);
        self.mode.release(&*self.nic, lease);
        if finished {
            self.send_control(peer, takes_nothing_more(true, NO_CHUNK, sreq, rid.0))?;
            self.finish_recv(rid);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(len: u64) -> VecDeque<ChunkDesc> {
        VecDeque::from([ChunkDesc {
            chunk: 0,
            offset: 0,
            addr: 0x10000,
            rkey: 1,
            len,
        }])
    }

    #[test]
    fn only_whole_zero_copy_buffers_above_the_threshold_split() {
        assert!(splittable(&chunk(1 << 20), 1 << 20, 64 << 10));
        assert!(
            splittable(&chunk(1 << 20), 100 << 10, 64 << 10),
            "truncated receive"
        );
        assert!(
            !splittable(&chunk(1 << 20), 32 << 10, 64 << 10),
            "below the threshold"
        );
        assert!(
            !splittable(&chunk(512 << 10), 1 << 20, 64 << 10),
            "bounce chunks"
        );
        let mut two = chunk(1 << 20);
        two.push_back(two[0]);
        assert!(!splittable(&two, 1 << 20, 64 << 10));
        assert!(!splittable(&chunk(1 << 20), 1 << 20, usize::MAX), "off");
    }

    #[test]
    fn the_tail_starts_on_a_page_half_way() {
        assert_eq!(split_point(1 << 20), 512 << 10);
        assert_eq!(split_point(3 * 4096 + 100), 4096);
        assert_eq!(split_point(8192) % 4096, 0);
    }
}
