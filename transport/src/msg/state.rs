//! The state the message layer keeps per request, per peer and per work request: what
//! [`super::PointToPoint`] holds between calls.

use std::collections::VecDeque;

use super::credits::Credits;
use super::local_copy::{LocalSend, LocalSplitRecv};
use super::matching::Selector;
use super::raw::{UserBuf, UserBufMut};
use super::rndv;
use super::wire::{self, Header};
use super::{RequestId, Status};
use crate::error::Result;
use crate::nic::WcStatus;

/// Work-request id layout: kind (8 bits) | peer (24 bits) | index (32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WrKind {
    Recv = 1,
    SendSlot = 2,
    SendInline = 3,
    Rdma = 4,
    Probe = 5,
    /// A window's one-sided operation (`rma.rs`).
    Rma = 6,
}

pub(crate) fn wr_id(kind: WrKind, peer: usize, index: usize) -> u64 {
    (kind as u64) << 56 | (peer as u64 & 0xff_ffff) << 32 | index as u64 & 0xffff_ffff
}

pub(super) fn wr_parts(id: u64) -> (u64, usize, usize) {
    (
        id >> 56,
        ((id >> 32) & 0xff_ffff) as usize,
        (id & 0xffff_ffff) as usize,
    )
}

/// A message that arrived before its receive was posted.
pub(crate) enum Unexpected {
    Eager {
        data: EagerData,
        size: usize,
        sync: bool,
        sreq: u64,
    },
    Rts {
        header: Header,
        chunks: Vec<ChunkDesc>,
    },
    /// A local rendezvous (`rndv_local.rs`): the bytes stay in the sender's memory.
    LocalRts {
        header: Header,
        source: wire::LocalSource,
    },
}

/// Where the bytes of a message that arrived are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// In receive slot `slot` of the sender's region (the NIC path).
    Slot(usize),
    /// In a cell of the local path, from this byte of this rank's segment.
    Cell(usize),
    /// The same, in the short form (`wire::decode_short`).
    ShortCell(usize),
}

impl Arrival {
    /// Bytes of the header before the payload.
    pub(crate) fn header_bytes(self) -> usize {
        match self {
            Arrival::ShortCell(_) => wire::SHORT_HEADER_BYTES,
            _ => wire::HEADER_BYTES,
        }
    }
}

/// Where a chunk of a rendezvous send can be read (RGET).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkDesc {
    pub chunk: u32,
    /// Where the chunk starts in the message.
    pub offset: u64,
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

/// What follows a header in a message.
pub(crate) enum Payload<'a> {
    None,
    /// `len` bytes of a user buffer from `offset`.
    User(&'a UserBuf, usize, usize),
    /// Bytes the layer made.
    Bytes(&'a [u8]),
}

/// Where an unexpected eager payload is.
pub(crate) enum EagerData {
    /// Copied out of its slot (the slot went back to the peer).
    Owned(Vec<u8>),
    /// Still in receive slot `slot` of the sender's region (over the unexpected budget).
    Held { slot: usize },
}

pub(crate) enum Req {
    Send(SendReq),
    Recv(RecvReq),
    Done(Result<Status>),
}

pub(crate) struct SendReq {
    pub peer: usize,
    pub tag: i32,
    pub context: u32,
    pub buf: UserBuf,
    pub sync: bool,
    pub state: SendState,
}

pub(crate) enum SendState {
    /// Waiting for a credit or a send slot.
    Queued,
    /// Eager synchronous send: waiting to hear it matched.
    AwaitSyncAck,
    /// Rendezvous in progress (boxed: an eager request stays small, and cheap to move).
    Rndv(Box<rndv::RndvSend>),
    /// Local rendezvous: the receiver copies from the buffer until it says it is done.
    LocalCopy(LocalSend),
}

pub(crate) struct RecvReq {
    pub sel: Selector,
    pub buf: UserBufMut,
    pub state: RecvState,
}

pub(crate) enum RecvState {
    Posted,
    Rndv(Box<rndv::RndvRecv>),
    /// Local rendezvous split between both sides: this side copied the front of the
    /// message and waits for the sender to say it wrote the back.
    LocalSplit(Box<LocalSplitRecv>),
}

/// An RDMA operation in flight for a rendezvous chunk.
pub(crate) struct RdmaOp {
    pub req: RequestId,
    /// The lease's key in the request's state.
    pub key: u64,
    /// The announced chunk (RGET) or CTS region (RPUT) the piece belongs to.
    pub chunk: u32,
    /// The piece's offset in the message and length.
    pub offset: usize,
    pub len: usize,
}

pub(crate) struct Peer {
    pub qpn: u32,
    /// The eager protocol's flow control with this peer: credits both ways, and its
    /// unexpected bytes.
    pub credits: Credits,
    /// Data sends waiting for a credit or a slot, in order.
    pub queued: VecDeque<RequestId>,
    /// Control messages waiting for send-queue room.
    pub control: VecDeque<Header>,
    /// Send work requests outstanding on the queue pair.
    pub in_flight: u32,
    /// Local rendezvous sends to this peer whose data it has not yet copied (it is busy
    /// with them: `rndv_local.rs` does not ask it to share a copy meanwhile).
    pub local_copies_out: u32,
    /// Set once the NIC reported the peer unreachable.
    pub dead: Option<WcStatus>,
    /// In `PointToPoint::service` (it has queued sends, queued control messages or credits
    /// to return).
    pub in_service: bool,
}

impl Peer {
    /// Whether control messages or sends wait in this peer's queues.
    pub fn has_queued(&self) -> bool {
        !self.control.is_empty() || !self.queued.is_empty()
    }

    /// Whether this rank still owes the peer, alive, a message: one queued, or a work
    /// request not yet completed (what a rank must see through before it ends).
    pub fn owes_messages(&self) -> bool {
        self.dead.is_none() && (self.has_queued() || self.in_flight > 0)
    }
}
