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

use super::rndv::{takes_nothing_more, RndvRecv, RndvSend, NO_CHUNK};
use super::rndv_io::RendezvousIo;
use super::wire::{Header, MsgKind};
use super::{ChunkDesc, PointToPoint, RdmaOp, RequestId};
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

impl RndvRecv {
    /// Split receiver: leases the tail `[half, eff)` and asks the sender to write it (a CTS
    /// for [`SPLIT_CHUNK`]); the front is read as in RGET. `false` when the mode has no lease
    /// for the tail now: the receive stays a plain RGET.
    pub(crate) fn start_split(
        &mut self,
        rid: RequestId,
        io: &mut impl RendezvousIo,
    ) -> Result<bool> {
        let half = split_point(self.eff);
        let Some(lease) = io.lease(&self.t, half, self.eff - half)? else {
            return Ok(false);
        };
        let mut h = Header::new(MsgKind::Cts);
        h.chunk = SPLIT_CHUNK;
        h.size = half as u64;
        h.addr = lease.addr;
        h.rkey = lease.rkey;
        h.len = (self.eff - half) as u64;
        h.sreq = self.sreq;
        h.rreq = rid.0;
        self.read_end = half;
        self.split_tail = Some((half, self.eff - half));
        self.tail_lease = Some(lease);
        io.send_control(h)?;
        Ok(true)
    }

    /// Split receiver: the sender wrote the tail (its FIN). Stages it in and gives its lease
    /// back; once the front is read too, tells the sender it takes nothing more. Returns
    /// whether the receive has everything.
    pub(crate) fn on_split_fin(
        &mut self,
        rid: RequestId,
        io: &mut impl RendezvousIo,
    ) -> Result<bool> {
        let (Some((off, len)), Some(lease)) = (self.split_tail, self.tail_lease.take()) else {
            return Ok(false);
        };
        self.landed += len;
        io.stage(&lease, off, len);
        io.release(lease);
        let finished = self.landed == self.eff;
        if finished {
            io.send_control(takes_nothing_more(true, NO_CHUNK, self.sreq, rid.0))?;
        }
        Ok(finished)
    }
}

impl RndvSend {
    /// Split sender: the receiver asked for the tail (`h`, a CTS for [`SPLIT_CHUNK`]). Writes
    /// it now, next to the receiver's read, and sends FIN; `false` if that cannot be done at
    /// once (a region outside the message, no lease, no room in the send queue: it then
    /// takes the RPUT path, which refuses the first and waits for the others).
    pub(crate) fn write_split_tail(
        &mut self,
        id: RequestId,
        h: &Header,
        io: &mut impl RendezvousIo,
    ) -> Result<bool> {
        let (off, len) = (h.size as usize, h.len as usize);
        if off.checked_add(len).is_none_or(|end| end > self.size) {
            return Ok(false);
        }
        io.about_to_move(&self.t, off, len);
        let Some(lease) = io.lease(&self.t, off, len)? else {
            return Ok(false);
        };
        io.stage(&lease, off, len);
        let op = RdmaOp {
            req: id,
            key: TAIL_LEASE,
            chunk: SPLIT_CHUNK,
            offset: off,
            len,
        };
        let write = Opcode::RdmaWrite {
            remote_addr: h.addr,
            rkey: h.rkey,
        };
        if !io.post_rdma(op, &lease, write)? {
            io.release(lease);
            return Ok(false);
        }
        self.leases.push((TAIL_LEASE, lease));
        self.writes_out += 1;
        self.rreq = Some(h.rreq);
        let mut fin = Header::new(MsgKind::Fin);
        fin.chunk = SPLIT_CHUNK;
        fin.sreq = id.0;
        fin.rreq = h.rreq;
        io.send_control(fin)?;
        Ok(true)
    }
}

impl PointToPoint {
    /// Receiver: leases the tail of receive `rid` and asks the sender to write it; the front
    /// is read as in RGET.
    pub(crate) fn start_split(&mut self, rid: RequestId) -> Result<()> {
        let started = self
            .step_rndv_recv(rid, |rv, _, io| rv.start_split(rid, io))
            .transpose()?;
        if started == Some(true) {
            self.counters.rndv_split += 1;
        }
        Ok(())
    }

    /// Receiver: the tail was written.
    pub(crate) fn on_split_fin(&mut self, h: Header) -> Result<()> {
        let rid = RequestId(h.rreq);
        if self
            .step_rndv_recv(rid, |rv, _, io| rv.on_split_fin(rid, io))
            .transpose()?
            == Some(true)
        {
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

    use super::super::rndv_io::fake::{
        buffer, receiver, sender, FakeIo, LEASE_BASE, RECEIVER, SENDER,
    };
    use super::super::wire;

    /// A split receive of 64 KiB: the whole buffer announced as one chunk, read in 16 KiB
    /// pieces.
    fn split_receive(io: &mut FakeIo) -> RndvRecv {
        let whole = ChunkDesc {
            chunk: 0,
            offset: 0,
            addr: 0xa000_0000,
            rkey: 77,
            len: 65_536,
        };
        let mut rv = receiver(true, 65_536, 65_536, 16_384, 8, &[whole]);
        assert!(rv.start_split(RECEIVER, io).unwrap());
        rv
    }

    #[test]
    fn the_receiver_reads_the_front_and_asks_for_the_tail() {
        let mut io = FakeIo::default();
        let mut rv = split_receive(&mut io);
        let cts = io.sent[0];
        assert_eq!(
            (cts.kind(), cts.chunk, cts.size, cts.len, cts.addr),
            (
                Some(MsgKind::Cts),
                SPLIT_CHUNK,
                32_768,
                32_768,
                LEASE_BASE + 32_768
            )
        );
        assert_eq!(rv.read_end, 32_768);
        assert_eq!(
            rv.advance_get(RECEIVER, &buffer(65_536), &mut io).unwrap(),
            2
        );
        let reads: Vec<_> = io.posted.iter().map(|p| (p.offset, p.len)).collect();
        assert_eq!(reads, [(0, 16_384), (16_384, 16_384)], "the front only");
    }

    #[test]
    fn the_receive_ends_with_the_later_of_the_front_and_the_tail() {
        // The tail's FIN first: the last READ ends the receive.
        let mut io = FakeIo::default();
        let mut rv = split_receive(&mut io);
        rv.advance_get(RECEIVER, &buffer(65_536), &mut io).unwrap();
        assert!(!rv.on_split_fin(RECEIVER, &mut io).unwrap());
        let reads = std::mem::take(&mut io.posted);
        assert!(!rv
            .on_read_done(RECEIVER, &reads[0].op(RECEIVER), &mut io)
            .unwrap());
        assert!(rv
            .on_read_done(RECEIVER, &reads[1].op(RECEIVER), &mut io)
            .unwrap());
        let last = io.sent.last().unwrap();
        assert_ne!(last.flags & wire::ALL_DONE, 0);
        assert!(io.out.is_empty(), "every lease went back, the tail's too");
        // The front first: the FIN ends it, with ChunkDone(ALL_DONE) for no chunk.
        let mut io = FakeIo::default();
        let mut rv = split_receive(&mut io);
        rv.advance_get(RECEIVER, &buffer(65_536), &mut io).unwrap();
        for p in std::mem::take(&mut io.posted) {
            assert!(!rv.on_read_done(RECEIVER, &p.op(RECEIVER), &mut io).unwrap());
        }
        assert!(rv.on_split_fin(RECEIVER, &mut io).unwrap());
        let last = io.sent.last().unwrap();
        assert_eq!(
            (last.kind(), last.chunk),
            (Some(MsgKind::ChunkDone), NO_CHUNK)
        );
        assert_ne!(last.flags & wire::ALL_DONE, 0);
        assert_eq!(
            io.staged.last(),
            Some(&(LEASE_BASE + 32_768, 32_768, 32_768))
        );
        // A second FIN changes nothing.
        assert!(!rv.on_split_fin(RECEIVER, &mut io).unwrap());
    }

    #[test]
    fn without_a_lease_for_the_tail_the_receive_stays_plain_rget() {
        let mut io = FakeIo {
            leases_left: Some(0),
            ..FakeIo::default()
        };
        let mut rv = receiver(true, 65_536, 65_536, 16_384, 8, &[]);
        assert!(!rv.start_split(RECEIVER, &mut io).unwrap());
        assert_eq!((rv.read_end, rv.split_tail), (65_536, None));
        assert!(io.sent.is_empty());
    }

    fn tail_cts() -> Header {
        let mut h = Header::new(MsgKind::Cts);
        (h.chunk, h.size, h.len, h.addr, h.rkey) = (SPLIT_CHUNK, 32_768, 32_768, 0xc000, 5);
        (h.sreq, h.rreq) = (SENDER.0, RECEIVER.0);
        h
    }

    #[test]
    fn the_sender_writes_the_tail_at_once_and_fins_it() {
        let mut io = FakeIo::default();
        let mut rs = sender(true, 65_536, usize::MAX, 1, 0, &mut io);
        assert!(rs.write_split_tail(SENDER, &tail_cts(), &mut io).unwrap());
        assert_eq!(io.moving, [(32_768, 32_768)]);
        let w = &io.posted[0];
        assert_eq!(
            (w.write, w.offset, w.len, w.remote_addr, w.rkey),
            (true, 32_768, 32_768, 0xc000, 5)
        );
        let fin = io.sent[0];
        assert_eq!((fin.kind(), fin.chunk), (Some(MsgKind::Fin), SPLIT_CHUNK));
        assert_eq!((rs.writes_out, rs.rreq), (1, Some(RECEIVER.0)));
        rs.on_write_done(TAIL_LEASE, &mut io);
        assert!(io.out.is_empty() && rs.writes_out == 0);
    }

    #[test]
    fn a_tail_that_cannot_go_at_once_is_left_to_the_rput_path() {
        let mut io = FakeIo::default();
        let mut rs = sender(true, 65_536, usize::MAX, 1, 0, &mut io);
        // Outside the message: refused here, and as a violation by the RPUT path.
        let mut outside = tail_cts();
        outside.len = 32_769;
        assert!(!rs.write_split_tail(SENDER, &outside, &mut io).unwrap());
        // No room in the send queue: the lease goes back.
        io.post_room = Some(0);
        assert!(!rs.write_split_tail(SENDER, &tail_cts(), &mut io).unwrap());
        assert!(io.out.is_empty() && io.sent.is_empty() && rs.writes_out == 0);
    }

    #[test]
    fn the_tail_starts_on_a_page_half_way() {
        assert_eq!(split_point(1 << 20), 512 << 10);
        assert_eq!(split_point(3 * 4096 + 100), 4096);
        assert_eq!(split_point(8192) % 4096, 0);
    }
}
