//! The wire: a single-producer single-consumer ring of fixed-size packet slots in shared
//! memory, one per (sender, receiver) pair, living in the receiver's segment.
//!
//! Across processes there is exactly one producer (the sender's NIC) and one consumer (the
//! receiver's NIC); inside a process the NIC serialises its threads with a lock, so the
//! protocol is the classic SPSC one, arranged so that a packet costs as few cache-line
//! transfers as it can: the producer fills a slot and publishes it by writing the slot's
//! sequence word (the last word of its header) last; the consumer polls the sequence word
//! of the slot at `head` — so the line that says "a packet is here" is the packet's own
//! header — and frees the slot by advancing `head`. The producer keeps its `tail` and a
//! cached copy of `head` on a line of its own and reads the real `head` only when the
//! cached one says the ring is full. A full ring is back-pressure: the sender keeps the
//! packet and retries. The consumer's *watched* flag ([`super::inbox`]) has a line too.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use pagewire_sys::SharedSegment;

/// Bytes per slot: a 64-byte header plus payload (the soft NIC's MTU).
pub(crate) const SLOT_BYTES: usize = 16 * 1024;
/// Slots per ring.
pub(crate) const SLOTS: u64 = 64;
/// Header bytes at the start of a slot.
pub(crate) const HEADER_BYTES: usize = 64;
/// Payload bytes one packet carries.
pub(crate) const MTU: usize = SLOT_BYTES - HEADER_BYTES;
/// Bytes of the ring's index lines before its slots.
const INDEX_BYTES: usize = 256;
/// Bytes of one ring: the index lines, then the slots.
pub(crate) const RING_BYTES: usize = INDEX_BYTES + SLOTS as usize * SLOT_BYTES;

/// Packet kinds, after the RC opcodes they stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A SEND (first/middle/last segment; or a descriptor the receiver pulls with CMA).
    Send = 1,
    /// An RDMA WRITE segment (staged path).
    Write = 2,
    /// The immediate of an RDMA WRITE WITH IMM whose data went by CMA: consumes a receive.
    WriteImm = 3,
    /// An RDMA READ request (staged path).
    ReadRequest = 4,
    /// An RDMA READ response segment (staged path).
    ReadResponse = 5,
    /// An atomic (`imm`: [`ATOMIC_FETCH_ADD`] or [`ATOMIC_CMP_SWAP`]) on the 8-byte word
    /// at `remote_addr`; the payload is its two operands, 8 bytes each, little endian.
    AtomicRequest = 6,
    /// The word's old value (8 bytes), or an error code.
    AtomicResponse = 7,
}

/// An atomic request's operation: fetch-and-add (operands: the addend, 0).
pub(crate) const ATOMIC_FETCH_ADD: u32 = 1;
/// An atomic request's operation: compare-and-swap (operands: compare, swap).
pub(crate) const ATOMIC_CMP_SWAP: u32 = 2;

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Send,
            2 => Kind::Write,
            3 => Kind::WriteImm,
            4 => Kind::ReadRequest,
            5 => Kind::ReadResponse,
            6 => Kind::AtomicRequest,
            7 => Kind::AtomicResponse,
            _ => return None,
        })
    }
}

/// Flag: first packet of a message.
pub(crate) const FIRST: u8 = 1;
/// Flag: last packet of a message.
pub(crate) const LAST: u8 = 2;
/// Flag: the message carries immediate data.
pub(crate) const HAS_IMM: u8 = 4;
/// Flag: the payload is a list of the sender's extents to pull with CMA, not data.
pub(crate) const CMA_DESCRIPTOR: u8 = 8;
/// Every flag a packet may carry.
const KNOWN_FLAGS: u8 = FIRST | LAST | HAS_IMM | CMA_DESCRIPTOR;
/// Extents a CMA descriptor can name (the device's `max_sge`), 16 bytes each.
pub(crate) const MAX_DESCRIPTOR_EXTENTS: usize = 16;
/// Bytes of an encoded header before the sequence word.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const ENCODED_HEADER_BYTES: usize = 56;

/// A packet header (64 bytes on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Header {
    /// `Kind` as u8.
    pub kind: u8,
    /// FIRST | LAST | HAS_IMM | CMA_DESCRIPTOR.
    pub flags: u8,
    /// Non-zero: the sender could not read the payload (a `WcStatus` wire code); the
    /// message it belongs to is dropped. For READ responses: the READ failed with it.
    pub code: u16,
    /// Immediate data.
    pub imm: u32,
    /// Destination queue pair number (at the receiver of the packet).
    pub dst_qpn: u32,
    /// Source queue pair number (at the sender of the packet).
    pub src_qpn: u32,
    /// Message sequence number of the request this packet belongs to (per queue pair).
    pub msn: u64,
    /// Total length of the message.
    pub total_len: u64,
    /// Offset of this packet's payload within the message.
    pub offset: u64,
    /// Remote address (WRITE/READ), or 0.
    pub remote_addr: u64,
    /// Remote key (WRITE/READ), or 0.
    pub rkey: u32,
    /// Payload bytes in this slot.
    pub payload_len: u32,
}

impl Header {
    pub(crate) fn kind(&self) -> Option<Kind> {
        Kind::from_u8(self.kind)
    }

    /// Words 0..7 of the slot (word 7 is the sequence word, written by `publish`).
    pub(crate) fn encode(&self) -> [u64; 7] {
        [
            self.kind as u64
                | (self.flags as u64) << 8
                | (self.code as u64) << 16
                | (self.imm as u64) << 32,
            self.dst_qpn as u64 | (self.src_qpn as u64) << 32,
            self.msn,
            self.total_len,
            self.offset,
            self.remote_addr,
            self.rkey as u64 | (self.payload_len as u64) << 32,
        ]
    }

    /// The header in words 0..7 of a slot, as read; not yet checked (see [`validate`]).
    fn from_words(w: [u64; 7]) -> Header {
        Header {
            kind: w[0] as u8,
            flags: (w[0] >> 8) as u8,
            code: (w[0] >> 16) as u16,
            imm: (w[0] >> 32) as u32,
            dst_qpn: w[1] as u32,
            src_qpn: (w[1] >> 32) as u32,
            msn: w[2],
            total_len: w[3],
            offset: w[4],
            remote_addr: w[5],
            rkey: w[6] as u32,
            payload_len: (w[6] >> 32) as u32,
        }
    }
}

/// Checks a header read from a peer's packet against what the protocol can produce; the
/// packet's kind, or why it is malformed. A malformed packet puts the queue pair it names in
/// the error state (`engine::responder`): no field of it is used to move bytes.
pub(crate) fn validate(h: &Header) -> Result<Kind, &'static str> {
    let kind = h.kind().ok_or("unknown packet kind")?;
    if h.flags & !KNOWN_FLAGS != 0 {
        return Err("unknown flag bits");
    }
    let len = h.payload_len as usize;
    if len > MTU {
        return Err("payload longer than a slot");
    }
    if h.flags & CMA_DESCRIPTOR != 0 {
        if !matches!(kind, Kind::Send | Kind::WriteImm) {
            return Err("a CMA descriptor on a packet that cannot carry one");
        }
        if h.flags & (FIRST | LAST) != FIRST | LAST || h.offset != 0 {
            return Err("a CMA descriptor that is not a whole message");
        }
        if len % 16 != 0 || len > 16 * MAX_DESCRIPTOR_EXTENTS {
            return Err("a CMA descriptor of a length no descriptor has");
        }
        return Ok(kind);
    }
    match kind {
        Kind::ReadRequest if len != 0 || h.offset != 0 => {
            Err("a READ request with a payload or an offset")
        }
        Kind::WriteImm if h.flags & HAS_IMM == 0 => Err("a WRITE WITH IMM without its immediate"),
        Kind::AtomicRequest
            if h.flags & (FIRST | LAST) != FIRST | LAST
                || h.offset != 0
                || h.total_len != 8
                || len != 16
                || !matches!(h.imm, ATOMIC_FETCH_ADD | ATOMIC_CMP_SWAP) =>
        {
            Err("an atomic request that is not one whole 8-byte operation")
        }
        Kind::AtomicResponse
            if h.flags & (FIRST | LAST) != FIRST | LAST
                || h.offset != 0
                || h.total_len != 8
                || len != if h.code == 0 { 8 } else { 0 } =>
        {
            Err("an atomic response that is not one 8-byte value")
        }
        // The request's payload is its operands, not bytes of the 8-byte message.
        Kind::AtomicRequest | Kind::AtomicResponse => Ok(kind),
        _ => {
            let end = h
                .offset
                .checked_add(len as u64)
                .ok_or("offset + length wraps")?;
            if end > h.total_len {
                return Err("payload past the end of its message");
            }
            Ok(kind)
        }
    }
}

/// Decodes and checks one encoded packet header (the first [`ENCODED_HEADER_BYTES`] of
/// `bytes`, words little endian): a pure function of the bytes, the ring's packet decoder
/// (the engine reads the same words from the slot and calls [`validate`]).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn decode(bytes: &[u8]) -> Result<(Kind, Header), &'static str> {
    let b = bytes
        .get(..ENCODED_HEADER_BYTES)
        .ok_or("shorter than a packet header")?;
    let h = Header::from_words(std::array::from_fn(|i| {
        u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }));
    Ok((validate(&h)?, h))
}

/// A view of one ring inside a segment.
#[derive(Clone, Copy)]
pub(crate) struct Ring<'a> {
    seg: &'a SharedSegment,
    base: usize,
}

impl<'a> Ring<'a> {
    /// The ring whose indices start at byte `base` of `seg`.
    pub(crate) fn at(seg: &'a SharedSegment, base: usize) -> Ring<'a> {
        assert!(base + RING_BYTES <= seg.len());
        Ring { seg, base }
    }

    fn head(&self) -> &'a std::sync::atomic::AtomicU64 {
        &self.seg.words(self.base, 1)[0]
    }

    /// The producer's line: `[tail, cached head]`.
    fn producer(&self) -> &'a [std::sync::atomic::AtomicU64] {
        self.seg.words(self.base + 64, 2)
    }

    fn watch_word(&self) -> &'a std::sync::atomic::AtomicU64 {
        &self.seg.words(self.base + 128, 1)[0]
    }

    fn slot(&self, index: u64) -> usize {
        self.base + INDEX_BYTES + (index % SLOTS) as usize * SLOT_BYTES
    }

    /// Whether the consumer polls this ring directly (so a publish needs no announcement).
    pub(crate) fn watched(&self) -> bool {
        self.watch_word().load(SeqCst) != 0
    }

    /// Consumer: starts or stops polling this ring directly.
    pub(crate) fn set_watched(&self, on: bool) {
        self.watch_word().store(on as u64, SeqCst);
    }

    /// Producer: the free slot to fill next, if the ring is not full.
    pub(crate) fn reserve(&self) -> Option<Slot<'a>> {
        let p = self.producer();
        // The indices live in the receiver's segment, where a peer can write anything: ring
        // arithmetic wraps (a garbled index reads as a full ring, never as a panic).
        let tail = p[0].load(Relaxed);
        if tail.wrapping_sub(p[1].load(Relaxed)) >= SLOTS {
            let head = self.head().load(Acquire);
            p[1].store(head, Relaxed);
            if tail.wrapping_sub(head) >= SLOTS {
                return None;
            }
        }
        Some(Slot {
            seg: self.seg,
            offset: self.slot(tail),
        })
    }

    /// Producer: [`Ring::reserve`], with the slot's position in the ring's sequence (for a
    /// consumer's own bookkeeping of the packet: [`Ring::head_index`], [`Ring::slot_at`]).
    pub(crate) fn reserve_indexed(&self) -> Option<(u64, Slot<'a>)> {
        let slot = self.reserve()?;
        Some((self.producer()[0].load(Relaxed), slot))
    }

    /// Consumer: the position of the oldest packet (`peek_nth(n)` is at `head_index() + n`).
    pub(crate) fn head_index(&self) -> u64 {
        self.head().load(Relaxed)
    }

    /// Consumer: the slot of the published packet at position `index`.
    pub(crate) fn slot_at(&self, index: u64) -> Slot<'a> {
        Slot {
            seg: self.seg,
            offset: self.slot(index),
        }
    }

    /// Producer: publishes the slot returned by `reserve` after writing `header`.
    pub(crate) fn publish(&self, slot: Slot<'a>, header: &Header) {
        self.publish_words(slot, header.encode());
    }

    /// Producer: publishes the slot returned by `reserve` with header words 0..7 as given
    /// (`publish`, and the hostile-peer tests' raw packets).
    pub(crate) fn publish_words(&self, slot: Slot<'a>, header: [u64; 7]) {
        let words = self.seg.words(slot.offset, 8);
        for (w, v) in words.iter().zip(header) {
            w.store(v, Relaxed);
        }
        let p = self.producer();
        let tail = p[0].load(Relaxed).wrapping_add(1);
        p[0].store(tail, Relaxed);
        // Sequentially consistent: it releases the packet, and the producer reads the
        // watched flag next (see `inbox`).
        words[7].store(tail, SeqCst);
    }

    /// Consumer: the oldest published packet, if any.
    pub(crate) fn peek(&self) -> Option<(Header, Slot<'a>)> {
        self.peek_nth(0)
    }

    /// Consumer: the `n`-th published packet after the oldest (`peek_nth(0)` is `peek`),
    /// for a consumer that looks ahead before it frees (the TCP wire's batched sends).
    pub(crate) fn peek_nth(&self, n: u64) -> Option<(Header, Slot<'a>)> {
        if n >= SLOTS {
            return None;
        }
        let at = self.head().load(Relaxed).wrapping_add(n);
        let offset = self.slot(at);
        let words = self.seg.words(offset, 8);
        // Sequentially consistent: pairs with `publish` for the watched flag (see `inbox`).
        if words[7].load(SeqCst) != at.wrapping_add(1) {
            return None;
        }
        let header = Header::from_words(std::array::from_fn(|i| words[i].load(Relaxed)));
        Some((
            header,
            Slot {
                seg: self.seg,
                offset,
            },
        ))
    }

    /// Consumer: frees the slot returned by `peek`.
    pub(crate) fn pop(&self) {
        let head = self.head().load(Relaxed);
        self.head().store(head.wrapping_add(1), Release);
    }

    /// Packets published and not yet consumed.
    #[cfg(test)]
    pub(crate) fn occupancy(&self) -> u64 {
        self.producer()[0]
            .load(Acquire)
            .wrapping_sub(self.head().load(Acquire))
    }
}

/// One slot's payload area.
#[derive(Clone, Copy)]
pub(crate) struct Slot<'a> {
    seg: &'a SharedSegment,
    offset: usize,
}

/// Where a received packet's payload lies while the engine handles it: its slot in a ring,
/// or, for a packet from a peer on the TCP wire, the link's receive buffer (the engine takes
/// it from there without a copy into a ring: `tcp/link.rs`). Either way it stays put until
/// the handler returns.
#[derive(Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// In a ring slot.
    Slot(Slot<'a>),
    /// In this process's memory.
    Bytes(&'a [u8]),
}

impl Payload<'_> {
    /// Its address in this process (a source for the DMA engine's copies).
    pub(crate) fn addr(&self) -> u64 {
        match self {
            Payload::Slot(s) => s.payload_addr(),
            Payload::Bytes(b) => b.as_ptr() as u64,
        }
    }

    /// Reads its first `out.len()` bytes.
    pub(crate) fn read(&self, out: &mut [u8]) {
        match self {
            Payload::Slot(s) => s.read_payload(out),
            Payload::Bytes(b) => out.copy_from_slice(&b[..out.len()]),
        }
    }
}

impl Slot<'_> {
    /// Address of the payload in this process (for CMA into or out of the slot).
    pub(crate) fn payload_addr(&self) -> u64 {
        self.seg.addr_of(self.offset + HEADER_BYTES)
    }

    /// Writes `bytes` at the start of the payload.
    pub(crate) fn write_payload(&self, bytes: &[u8]) {
        assert!(bytes.len() <= MTU);
        self.seg.copy_in(self.offset + HEADER_BYTES, bytes);
    }

    /// Reads the first `out.len()` payload bytes.
    pub(crate) fn read_payload(&self, out: &mut [u8]) {
        assert!(out.len() <= MTU);
        self.seg.copy_out(self.offset + HEADER_BYTES, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment() -> SharedSegment {
        let name = format!("pagewire-unittest-ring-{:x}", rand::random::<u64>());
        SharedSegment::create(&name, RING_BYTES).unwrap()
    }

    #[test]
    fn header_round_trips() {
        let h = Header {
            kind: Kind::ReadResponse as u8,
            flags: FIRST | LAST,
            code: 3,
            imm: 0xdead_beef,
            dst_qpn: 7,
            src_qpn: 9,
            msn: u64::MAX - 1,
            total_len: 1 << 40,
            offset: 12345,
            remote_addr: 0x7fff_0000_1000,
            rkey: 0xabcd_1234,
            payload_len: MTU as u32,
        };
        assert_eq!(Header::from_words(h.encode()), h);
        let bytes: Vec<u8> = h.encode().iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(decode(&bytes), Ok((Kind::ReadResponse, h)));
    }

    #[test]
    fn the_packet_decoder_refuses_what_no_peer_sends() {
        let ok = Header {
            kind: Kind::Send as u8,
            flags: FIRST,
            total_len: 3 * MTU as u64,
            offset: MTU as u64,
            payload_len: MTU as u32,
            ..Header::default()
        };
        assert_eq!(validate(&ok), Ok(Kind::Send));
        let bad = [
            Header { kind: 0, ..ok },
            Header { kind: 0xff, ..ok },
            Header { flags: 0xff, ..ok },
            Header {
                payload_len: MTU as u32 + 1,
                ..ok
            },
            Header {
                payload_len: u32::MAX,
                ..ok
            },
            Header {
                offset: u64::MAX,
                ..ok
            },
            Header { total_len: 0, ..ok },
            Header {
                kind: Kind::ReadRequest as u8,
                ..ok
            },
            Header {
                flags: FIRST | LAST | CMA_DESCRIPTOR,
                payload_len: 17,
                ..ok
            },
        ];
        for h in bad {
            assert!(validate(&h).is_err(), "{h:?}");
        }
        assert!(decode(&[0u8; ENCODED_HEADER_BYTES - 1]).is_err());
    }

    #[test]
    fn fifo_order_and_back_pressure() {
        let seg = segment();
        let ring = Ring::at(&seg, 0);
        // Three laps: a slot's sequence word from an earlier lap never reads as a packet.
        for lap in 0..3 {
            for i in 0..SLOTS {
                let s = ring.reserve().expect("space");
                s.write_payload(&i.to_le_bytes());
                ring.publish(
                    s,
                    &Header {
                        msn: lap * SLOTS + i,
                        payload_len: 8,
                        ..Header::default()
                    },
                );
            }
            assert!(ring.reserve().is_none(), "a full ring refuses");
            assert_eq!(ring.occupancy(), SLOTS);
            for i in 0..SLOTS {
                let (h, s) = ring.peek().expect("packet");
                let mut b = [0u8; 8];
                s.read_payload(&mut b);
                assert_eq!((h.msn, u64::from_le_bytes(b)), (lap * SLOTS + i, i));
                ring.pop();
            }
            assert!(ring.peek().is_none(), "lap {lap}: empty");
        }
    }
}
