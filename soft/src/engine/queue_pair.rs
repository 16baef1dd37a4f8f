//! A queue pair's state: its send queue (the work requests and where each stands), its
//! receive queue, and the messages in flight at the responder (a request being received,
//! READ responses being sent).

use smallvec::SmallVec;

use super::requester::Requester;
use super::responder::backup_ring::Parked;
use super::responder::Responder;
use super::KeyedExtent;
use pagewire_nic::{Access, QpCaps, Sge, WcStatus};
use pagewire_sys::error::{Error, Result};

pub(crate) struct QueuePair {
    pub(super) qpn: u32,
    pub(crate) peer: usize,
    pub(super) send_cq: u32,
    pub(super) recv_cq: u32,
    pub(super) caps: QpCaps,
    pub(crate) remote_qpn: Option<u32>,
    pub(super) error: Option<String>,
    /// In `Engine::busy`.
    pub(super) busy: bool,
    /// The requester's half: the send queue.
    pub(super) requester: Requester,
    /// The responder's half: the receive queue and the requests being received.
    pub(super) responder: Responder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpKind {
    Send {
        imm: Option<u32>,
    },
    Write {
        addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    Read {
        addr: u64,
        rkey: u32,
    },
    Atomic {
        addr: u64,
        rkey: u32,
        op: AtomicOp,
    },
}

/// What an atomic work request does to the target word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    FetchAdd { add: u64 },
    CmpSwap { compare: u64, swap: u64 },
}

impl AtomicOp {
    /// The operation's wire code and its two operands.
    pub(crate) fn encode(self) -> (u32, [u64; 2]) {
        use crate::ring::{ATOMIC_CMP_SWAP, ATOMIC_FETCH_ADD};
        match self {
            AtomicOp::FetchAdd { add } => (ATOMIC_FETCH_ADD, [add, 0]),
            AtomicOp::CmpSwap { compare, swap } => (ATOMIC_CMP_SWAP, [compare, swap]),
        }
    }

    /// The operation of a wire code (checked by `ring::validate`) and its operands.
    pub(crate) fn decode(code: u32, operands: [u64; 2]) -> AtomicOp {
        if code == crate::ring::ATOMIC_FETCH_ADD {
            AtomicOp::FetchAdd { add: operands[0] }
        } else {
            AtomicOp::CmpSwap {
                compare: operands[0],
                swap: operands[1],
            }
        }
    }

    /// Runs the operation on the word at `word` in this process: its old value.
    pub(crate) fn execute(self, word: u64) -> std::io::Result<u64> {
        match self {
            AtomicOp::FetchAdd { add } => crate::dma::fetch_add(word, add),
            AtomicOp::CmpSwap { compare, swap } => crate::dma::cmp_swap(word, compare, swap),
        }
    }
}

/// The result of an atomic executed at the responder, to be sent back.
#[derive(Clone, Copy, Debug)]
pub(super) struct AtomicOut {
    pub(super) msn: u64,
    pub(super) dst_qpn: u32,
    /// `WcStatus` wire code (0: success).
    pub(super) code: u16,
    pub(super) old: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpState {
    /// To be transmitted from `sent`.
    Pending,
    /// Partly transmitted: the ring filled up.
    Transmitting,
    /// On the wire: waiting for the responder's acknowledgement (or READ response).
    AwaitingResponse,
    /// Refused receiver-not-ready: retransmit at `retry_at` (engine clock), or once the
    /// fault the responder filed (`fault`, its sequence number in the peer's slot of this
    /// queue pair) is resolved.
    Rnr {
        retry_at: u64,
        fault: Option<u64>,
    },
    /// Dropped by a translation-cache miss (`tpt_cache.rs`) at `since_ns` (monotonic):
    /// goes out again once `wait` allows.
    TranslationMiss {
        retry_at: u64,
        since_ns: u64,
        wait: MissWait,
    },
    Done(WcStatus),
}

/// In [`SendOp::translated`] and the responder's `rx_translated`: the request's remote key
/// (bits `0..16` are its scatter-gather entries).
pub(super) const REMOTE_KEY: u32 = 1 << 31;

/// What a request dropped by a translation-cache miss waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MissWait {
    /// Its own NIC's driver to fill the entry of `bit` (miss `seq` in its requester slot):
    /// the NIC holds the request and sends it as soon as it is filled.
    Local { seq: u64, bit: u32 },
    /// The target's driver to fill the entry of `bit` (miss `seq` in the target's responder
    /// slot), and the retransmission timer (`retry_at`): the retransmission finds the entry
    /// filled, or is dropped again and the timer restarts.
    Remote { seq: u64, bit: u32 },
    /// The retransmission timer, after the target dropped it (the staged path, where the
    /// target's engine looks up its own cache).
    Dropped,
}

/// A send work request in the send queue. Plain data: its scatter-gather entries and
/// inline payload live in the queue pair's stores.
#[derive(Clone, Copy)]
pub(super) struct SendOp {
    pub(super) wr_id: u64,
    pub(super) kind: OpKind,
    /// Message sequence number, given when the request first goes on the wire (requests
    /// executed directly by CMA never do).
    pub(super) msn: Option<u64>,
    pub(super) total: u64,
    pub(super) sent: u64,
    pub(super) state: OpState,
    /// When it was last transmitted, and last checked for liveness (engine clock).
    pub(super) since: u64,
    pub(super) checked_alive: u64,
    /// `sq_sges[sges.0 .. sges.0 + sges.1]`.
    pub(super) sges: (u32, u32),
    /// The payload is `sq_inline[at .. at + total]`.
    pub(super) inline_at: Option<u32>,
    pub(super) rnr_count: u32,
    /// Times it went out again because its acknowledgement did not come in time.
    pub(super) timeouts: u32,
    /// The keys translated through the caches so far: bit `i` for scatter-gather entry
    /// `i`, [`REMOTE_KEY`] for the remote key. Each is looked up once per request.
    pub(super) translated: u32,
    pub(super) signaled: bool,
    /// The payload of a WRITE WITH IMM already went by CMA; only the immediate is left.
    pub(super) data_placed: bool,
}

/// A receive work request: its scatter-gather entries are the next `sges` of `rq_sges`.
#[derive(Clone, Copy)]
pub(super) struct RecvOp {
    pub(super) wr_id: u64,
    pub(super) sges: u32,
    pub(super) capacity: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum IncomingKind {
    Send { wr_id: u64 },
    Write,
    WriteImm { wr_id: u64 },
}

pub(super) struct Incoming {
    pub(super) msn: u64,
    pub(super) kind: IncomingKind,
    pub(super) imm: Option<u32>,
    /// Where the bytes go, checked against the table again for every packet.
    pub(super) targets: SmallVec<[KeyedExtent; 2]>,
    /// The right each packet needs on `targets`.
    pub(super) need: Access,
    pub(super) total: u64,
    /// The receive it consumed and its entries (put back if the message is abandoned).
    pub(super) recv: Option<(RecvOp, SmallVec<[Sge; 2]>)>,
    /// Stored in the backup ring (its receive faulted; `targets` is the ring).
    pub(super) parked: Option<Parked>,
}

pub(super) struct ReadOut {
    pub(super) msn: u64,
    pub(super) dst_qpn: u32,
    /// The bytes asked for, checked against the table again for every response packet.
    pub(super) source: KeyedExtent,
    pub(super) sent: u64,
}

impl QueuePair {
    /// A work request's scatter-gather list fits the queue pair's `max_sge`.
    pub(super) fn check_sges(&self, n: usize) -> Result<()> {
        if n > self.caps.max_sge as usize {
            return Err(Error::InvalidArgument(format!(
                "{n} scatter-gather entries; the queue pair allows {}",
                self.caps.max_sge
            )));
        }
        Ok(())
    }
}
