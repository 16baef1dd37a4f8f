//! A fake of [`RendezvousIo`] and [`RmaIo`] for the protocol machines' unit tests: the
//! buffer mode, the NIC and the control path as one side sees them, every call recorded, leases and
//! send-queue room limited on request, and a peer that can be gone.

use super::super::rma_transfer::RmaIo;
use super::super::rndv::{RndvRecv, RndvSend};
use super::super::wire::{self, Header, MsgKind};
use super::super::{ChunkDesc, RdmaOp, RequestId};
use super::{LeaseIo, RendezvousIo};
use crate::buffer_mode::{Lease, Pipeline, Transfer, UserMemory};
use crate::error::{Error, Result};
use crate::nic::{Opcode, Sge, WcStatus};

/// The sending request, as the machines' messages name it.
pub(crate) const SENDER: RequestId = RequestId(7);
/// The receiving request.
pub(crate) const RECEIVER: RequestId = RequestId(9);

/// Where the fake mode's leases of a buffer lie: its offset from here.
pub(crate) const LEASE_BASE: u64 = 0x10_0000;

/// An RDMA operation the machine posted, as the fake NIC keeps it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Posted {
    pub key: u64,
    pub chunk: u32,
    pub offset: usize,
    pub len: usize,
    pub lease_addr: u64,
    /// The READ's source or the WRITE's target at the peer.
    pub remote_addr: u64,
    pub rkey: u32,
    pub write: bool,
}

impl Posted {
    /// The operation as its completion hands it back.
    pub fn op(&self, req: RequestId) -> RdmaOp {
        RdmaOp {
            req,
            key: self.key,
            chunk: self.chunk,
            offset: self.offset,
            len: self.len,
        }
    }
}

/// The buffer mode, the NIC and the control path, as a rendezvous side sees them: every
/// call recorded; leases and send-queue room limited on request; a peer that can be gone.
#[derive(Default)]
pub(crate) struct FakeIo {
    /// Leases the mode can still hand out (`None`: any number).
    pub leases_left: Option<usize>,
    /// RDMA posts the send queue has room for (`None`: any number).
    pub post_room: Option<usize>,
    /// The peer cannot be reached: control messages fail.
    pub peer_gone: bool,
    /// Keys handed out so far.
    pub keys: u32,
    /// Leases out: (lkey, offset, len).
    pub out: Vec<(u32, usize, usize)>,
    /// Staged: (lease address, message offset, length).
    pub staged: Vec<(u64, usize, usize)>,
    /// Ranges the mode was told are about to move: (offset, len).
    pub moving: Vec<(usize, usize)>,
    pub posted: Vec<Posted>,
    pub sent: Vec<Header>,
    /// A put's or get's posts, by slot: (opcode, scatter-gather element).
    pub rma_posts: Vec<(Opcode, Sge)>,
    /// Completed work requests of a put or get not yet reaped: slot and status.
    pub rma_done: Vec<(usize, WcStatus)>,
}

impl LeaseIo for FakeIo {
    fn lease(&mut self, _t: &Transfer, offset: usize, len: usize) -> Result<Option<Lease>> {
        if self.leases_left == Some(0) {
            return Ok(None);
        }
        if let Some(n) = &mut self.leases_left {
            *n -= 1;
        }
        self.keys += 1;
        self.out.push((self.keys, offset, len));
        Ok(Some(Lease {
            addr: LEASE_BASE + offset as u64,
            len: len as u64,
            lkey: self.keys,
            rkey: self.keys,
            token: 0,
        }))
    }

    fn stage(&mut self, lease: &Lease, at: usize, len: usize) {
        self.staged.push((lease.addr, at, len));
    }

    fn release(&mut self, lease: Lease) {
        let i = self
            .out
            .iter()
            .position(|(k, ..)| *k == lease.lkey)
            .expect("a lease given back twice, or never handed out");
        self.out.swap_remove(i);
        if let Some(n) = &mut self.leases_left {
            *n += 1;
        }
    }
}

impl RendezvousIo for FakeIo {
    fn about_to_move(&mut self, _t: &Transfer, offset: usize, len: usize) {
        self.moving.push((offset, len));
    }

    fn post_rdma(&mut self, op: RdmaOp, lease: &Lease, opcode: Opcode) -> Result<bool> {
        if self.post_room == Some(0) {
            return Ok(false);
        }
        if let Some(n) = &mut self.post_room {
            *n -= 1;
        }
        let (remote_addr, rkey, write) = match opcode {
            Opcode::RdmaRead { remote_addr, rkey } => (remote_addr, rkey, false),
            Opcode::RdmaWrite { remote_addr, rkey } => (remote_addr, rkey, true),
            other => panic!("a rendezvous posts READs and WRITEs, not {other:?}"),
        };
        assert_eq!(lease.len, op.len as u64, "an operation covers its lease");
        self.posted.push(Posted {
            key: op.key,
            chunk: op.chunk,
            offset: op.offset,
            len: op.len,
            lease_addr: lease.addr,
            remote_addr,
            rkey,
            write,
        });
        Ok(true)
    }

    fn send_control(&mut self, h: Header) -> Result<()> {
        if self.peer_gone {
            return Err(Error::Communication {
                peer: 1,
                status: WcStatus::RetryExceeded,
                what: "sending a control message",
            });
        }
        self.sent.push(h);
        Ok(())
    }
}

pub(crate) fn plan(chunk: usize, depth: usize) -> Transfer {
    Transfer {
        pipeline: Pipeline { chunk, depth },
        zero_copy: chunk == usize::MAX,
        token: 0,
    }
}

/// The sender's chunk `k` as a ChunkReady (or the RTS) describes it: readable at
/// `0xa000_0000 + offset` under rkey 77.
pub(crate) fn chunk(k: u32, offset: u64, len: u64) -> ChunkDesc {
    ChunkDesc {
        chunk: k,
        offset,
        addr: 0xa000_0000 + offset,
        rkey: 77,
        len,
    }
}

/// A rendezvous receive (RGET if `get`, else RPUT) of a `size`-byte message into a buffer of
/// `cap` bytes, in pieces (RGET) or chunks (RPUT) of `piece` bytes with `depth` in flight;
/// the RTS described `announced`.
pub(crate) fn receiver(
    get: bool,
    size: usize,
    cap: usize,
    piece: usize,
    depth: usize,
    announced: &[ChunkDesc],
) -> RndvRecv {
    let eff = size.min(cap);
    let mut rts = Header::new(MsgKind::Rts);
    rts.sreq = SENDER.0;
    rts.tag = 5;
    rts.size = size as u64;
    if get {
        rts.flags |= wire::GET;
    }
    let n = if get { 0 } else { eff.div_ceil(piece) as u32 };
    let announced = announced.iter().copied().collect();
    RndvRecv::new(plan(piece, depth), 1, &rts, eff, n, announced, false)
}

/// A rendezvous send (RGET if `get`, else RPUT) of `size` bytes in chunks of `chunk` with
/// `depth` leases, after an RTS that announced the first `announced` chunks (RGET: their
/// leases are held).
pub(crate) fn sender(
    get: bool,
    size: usize,
    chunk: usize,
    depth: usize,
    announced: u32,
    io: &mut FakeIo,
) -> RndvSend {
    let n = size.div_ceil(chunk) as u32;
    let leases = (0..announced)
        .map(|k| {
            let off = k as usize * chunk;
            let lease = io.lease(&plan(chunk, depth), off, chunk.min(size - off));
            (k as u64, lease.unwrap().unwrap())
        })
        .collect();
    RndvSend::new(plan(chunk, depth), size, get, n, announced, leases, false)
}

/// A contiguous buffer of `len` bytes (its geometry: nothing touches it).
pub(crate) fn buffer(len: usize) -> UserMemory {
    UserMemory::describing(0x5000_0000, len, None)
}

impl RmaIo for FakeIo {
    fn post(&mut self, opcode: Opcode, sge: Sge) -> Result<usize> {
        if self.peer_gone {
            return Err(Error::Communication {
                peer: 1,
                status: WcStatus::RetryExceeded,
                what: "posting a one-sided operation",
            });
        }
        assert!(
            self.out.iter().any(|&(k, ..)| k == sge.lkey),
            "a post on a lease that is not out"
        );
        self.rma_posts.push((opcode, sge));
        Ok(self.rma_posts.len() - 1)
    }

    fn completion(&mut self, slot: usize, block: bool) -> Option<Result<WcStatus>> {
        match self.rma_done.iter().position(|&(s, _)| s == slot) {
            Some(i) => Some(Ok(self.rma_done.remove(i).1)),
            None if block => panic!("a blocking wait for slot {slot}, which never completes"),
            None => None,
        }
    }
}
