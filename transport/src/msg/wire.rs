//! The message layer's wire header: 64 bytes at the start of every SEND it makes; and its
//! short form, 12 bytes, that the local path's cells carry for an eager message that is
//! not synchronous (kind, flags, tag and context: the size is the cell's, and nothing
//! else of the header is used), so that a small message fits one cache line.

/// Bytes of the header.
pub const HEADER_BYTES: usize = 64;

/// Bytes of the short form: kind, flags, two reserved (zero) bytes, tag, context.
pub const SHORT_HEADER_BYTES: usize = 12;

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgKind {
    /// Eager data: header then payload (data credit).
    Eager = 1,
    /// Request to send a large message (data credit); rendezvous starts.
    Rts = 2,
    /// Clear to send chunk `chunk` into (addr, rkey, len) — RPUT.
    Cts = 3,
    /// Chunk `chunk` was written — RPUT.
    Fin = 4,
    /// Chunk `chunk` can be read at (addr, rkey, len) — RGET.
    ChunkReady = 5,
    /// Chunk `chunk` was read — RGET; `ALL_DONE` ends the send.
    ChunkDone = 6,
    /// An eager synchronous send was matched.
    SyncAck = 7,
    /// Credits returned, nothing else.
    Credit = 8,
    /// The receiver of a local rendezvous copied the message out of the sender's memory
    /// (`msg/rndv_local.rs`); `COPY_FAILED` if it could not.
    CopyDone = 9,
    /// The receiver of a local rendezvous asks the sender to write the back of the message,
    /// bytes `[size, size + len)`, into its buffer, which the payload describes (a
    /// [`LocalSource`] of the receive buffer); `rreq` names the receive.
    CopyShare = 10,
    /// The sender wrote the back of the message, `len` bytes (`COPY_FAILED` if it could
    /// not), or declined to (`len` 0: it expects a message from the receiver, whose copy
    /// will keep its CPU busy; the receiver copies the back itself).
    ShareDone = 11,
}

impl MsgKind {
    fn from_u8(v: u8) -> Option<MsgKind> {
        Some(match v {
            1 => MsgKind::Eager,
            2 => MsgKind::Rts,
            3 => MsgKind::Cts,
            4 => MsgKind::Fin,
            5 => MsgKind::ChunkReady,
            6 => MsgKind::ChunkDone,
            7 => MsgKind::SyncAck,
            8 => MsgKind::Credit,
            9 => MsgKind::CopyDone,
            10 => MsgKind::CopyShare,
            11 => MsgKind::ShareDone,
            _ => return None,
        })
    }

    /// Data messages consume a credit: they can become unexpected messages.
    pub fn is_data(self) -> bool {
        matches!(self, MsgKind::Eager | MsgKind::Rts)
    }
}

/// Flag: synchronous send (complete only once matched).
pub const SYNC: u8 = 1;
/// Flag on RTS: the receiver should RDMA-READ (RGET) rather than return CTS (RPUT).
pub const GET: u8 = 2;
/// Flag on ChunkDone / last CTS: nothing more will be transferred.
pub const ALL_DONE: u8 = 4;
/// Flag on RTS: the header carries chunk 0's descriptor (RGET).
pub const HAS_CHUNK: u8 = 8;
/// Flag on RTS (RGET): the sender's buffer has gaps and moves in place, its chunks are its
/// runs, all readable at once: the receiver answers only when it takes nothing more
/// (`msg/rndv.rs`, scatter-gather rendezvous).
pub const SCATTER_GATHER: u8 = 16;
/// Flag on RTS: a local rendezvous (`msg/rndv_local.rs`): the payload is a [`LocalSource`]
/// the receiver copies from with CMA.
pub const LOCAL_COPY: u8 = 32;
/// Flag on CopyDone: the receiver could not read the sender's memory.
pub const COPY_FAILED: u8 = 64;
/// Every flag a message may carry.
const KNOWN_FLAGS: u8 =
    SYNC | GET | ALL_DONE | HAS_CHUNK | SCATTER_GATHER | LOCAL_COPY | COPY_FAILED;
/// Bytes of one chunk descriptor in the payload of an RTS.
pub const CHUNK_DESC_BYTES: usize = 32;

/// Decodes and checks a message in the short form (`bytes`: the short header, then the
/// payload): an eager message that is not synchronous, whose size is its payload's.
pub fn decode_short(bytes: &[u8]) -> Result<(MsgKind, Header), &'static str> {
    if bytes.len() < SHORT_HEADER_BYTES {
        return Err("shorter than a short message header");
    }
    let h = Header {
        kind: bytes[0],
        flags: bytes[1],
        tag: i32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
        context: u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")),
        size: (bytes.len() - SHORT_HEADER_BYTES) as u64,
        ..Header::default()
    };
    if h.kind() != Some(MsgKind::Eager) {
        return Err("a short message that is not eager data");
    }
    if h.flags != 0 || bytes[2..4] != [0, 0] {
        return Err("a short message with flags or reserved bits");
    }
    Ok((MsgKind::Eager, h))
}

/// Decodes and checks a message as a peer sent it (`bytes`: the header, then the payload):
/// its kind and header, or why no correct peer could have sent it. A pure function of the
/// bytes, the message layer's decoder; what depends on this rank's state (credits, request
/// ids) the protocol checks afterwards.
///
/// Checked here: the length covers a header; the kind and flags are known; an eager
/// payload is exactly `size` bytes; an RTS carries whole chunk descriptors, each inside the
/// message and together no more than it; a control message has no payload, and the region a CTS or ChunkReady names does
/// not wrap.
pub fn decode_message(bytes: &[u8]) -> Result<(MsgKind, Header), &'static str> {
    if bytes.len() < HEADER_BYTES {
        return Err("shorter than a message header");
    }
    let h = Header::decode(bytes);
    let kind = h.kind().ok_or("unknown message kind")?;
    if h.flags & !KNOWN_FLAGS != 0 {
        return Err("unknown flag bits");
    }
    let payload = &bytes[HEADER_BYTES..];
    match kind {
        MsgKind::Eager if h.size != payload.len() as u64 => {
            return Err("an eager message whose size is not its payload's");
        }
        MsgKind::Eager => {}
        MsgKind::Rts if h.flags & LOCAL_COPY != 0 => {
            LocalSource::decode(payload, h.size)?;
        }
        MsgKind::CopyShare => {
            // The payload describes the whole receive buffer; the back lies inside it.
            let end = h
                .size
                .checked_add(h.len)
                .ok_or("a copy share whose range wraps")?;
            let whole = LocalSource::decode_any(payload)?;
            if end > whole.len() {
                return Err("a copy share outside the receive buffer");
            }
        }
        MsgKind::Rts => {
            if payload.len() % CHUNK_DESC_BYTES != 0 {
                return Err("an RTS with a partial chunk descriptor");
            }
            let mut announced = 0u64;
            for d in payload.chunks_exact(CHUNK_DESC_BYTES) {
                let len = u64::from_le_bytes(d[16..24].try_into().expect("8 bytes"));
                let offset = u64::from_le_bytes(d[24..32].try_into().expect("8 bytes"));
                if offset.checked_add(len).is_none_or(|end| end > h.size) {
                    return Err("an RTS chunk outside the message");
                }
                announced += len; // each at most `size`, so no wrap within a payload
                if announced > h.size {
                    return Err("RTS chunks adding up to more than the message");
                }
            }
        }
        _ if !payload.is_empty() => return Err("a control message with a payload"),
        MsgKind::Cts | MsgKind::ChunkReady if h.size.checked_add(h.len).is_none() => {
            return Err("a region whose offset + length wraps");
        }
        _ => {}
    }
    Ok((kind, h))
}

/// Where the sender's bytes of a local rendezvous lie in its address space: `count`
/// elements `extent` bytes apart from `addr`, each made of `runs` (offset from `addr`,
/// length) whose bytes travel in order; a contiguous buffer is one element of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalSource {
    /// The buffer's first byte (element 0's start).
    pub addr: u64,
    /// Bytes between elements.
    pub extent: u64,
    /// Elements.
    pub count: u64,
    /// One element's runs: (offset, length).
    pub runs: Vec<(u64, u64)>,
}

/// Bytes of a [`LocalSource`] before its runs.
const LOCAL_SOURCE_FIXED: usize = 32;

impl LocalSource {
    /// Bytes of the encoding of a source of `runs` runs.
    pub fn encoded_len(runs: usize) -> usize {
        LOCAL_SOURCE_FIXED + 16 * runs
    }

    /// Little-endian encoding: addr, extent, count, the number of runs, then the runs.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::encoded_len(self.runs.len()));
        for w in [self.addr, self.extent, self.count, self.runs.len() as u64] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        for &(offset, len) in &self.runs {
            v.extend_from_slice(&offset.to_le_bytes());
            v.extend_from_slice(&len.to_le_bytes());
        }
        v
    }

    /// Bytes it describes.
    pub fn len(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum::<u64>() * self.count
    }

    /// Whether it describes no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decodes and checks a source as a peer sent it, whatever its size.
    pub fn decode_any(b: &[u8]) -> Result<LocalSource, &'static str> {
        if b.len() < LOCAL_SOURCE_FIXED {
            return Err("a local buffer description cut short");
        }
        let count = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
        let n = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
        if (b.len() - LOCAL_SOURCE_FIXED) as u64 != n.saturating_mul(16) {
            return Err("a local RTS whose runs are not its payload");
        }
        let per_element = (0..n as usize)
            .map(|k| {
                let at = LOCAL_SOURCE_FIXED + 16 * k + 8;
                u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
            })
            .try_fold(0u64, |sum, len| sum.checked_add(len))
            .ok_or("a local RTS run that wraps")?;
        let size = per_element
            .checked_mul(count)
            .ok_or("a local buffer description that wraps")?;
        Self::decode(b, size)
    }

    /// Decodes and checks a source as a peer sent it for a message of `size` bytes: whole,
    /// and its runs adding up to the message exactly, without wrapping.
    pub fn decode(b: &[u8], size: u64) -> Result<LocalSource, &'static str> {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        if b.len() < LOCAL_SOURCE_FIXED {
            return Err("a local RTS without its source");
        }
        let n = word(3);
        if (b.len() - LOCAL_SOURCE_FIXED) as u64 != n.saturating_mul(16) {
            return Err("a local RTS whose runs are not its payload");
        }
        let runs: Vec<(u64, u64)> = (0..n as usize)
            .map(|k| (word(4 + 2 * k), word(5 + 2 * k)))
            .collect();
        let per_element = runs
            .iter()
            .try_fold(0u64, |sum, &(offset, len)| {
                offset.checked_add(len)?;
                sum.checked_add(len)
            })
            .ok_or("a local RTS run that wraps")?;
        let (addr, extent, count) = (word(0), word(1), word(2));
        if per_element.checked_mul(count) != Some(size) {
            return Err("a local RTS whose runs are not the message's size");
        }
        let last = count
            .saturating_sub(1)
            .checked_mul(extent)
            .and_then(|e| e.checked_add(addr));
        if last.is_none() {
            return Err("a local RTS whose elements wrap");
        }
        Ok(LocalSource {
            addr,
            extent,
            count,
            runs,
        })
    }
}

/// The header fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// `MsgKind` as u8.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Credits returned to the receiver of this header.
    pub credits: u16,
    /// Tag.
    pub tag: i32,
    /// Communicator context.
    pub context: u32,
    /// Chunk index (rendezvous).
    pub chunk: u32,
    /// Message size in bytes (Eager, RTS), or a chunk's offset in the message (CTS,
    /// ChunkReady).
    pub size: u64,
    /// Sender's request id.
    pub sreq: u64,
    /// Receiver's request id.
    pub rreq: u64,
    /// Address of a chunk.
    pub addr: u64,
    /// Key of a chunk.
    pub rkey: u32,
    /// Length of a chunk.
    pub len: u64,
}

impl Header {
    /// A header of `kind` with everything else zero.
    pub fn new(kind: MsgKind) -> Header {
        Header {
            kind: kind as u8,
            ..Header::default()
        }
    }

    /// The kind, if valid.
    pub fn kind(&self) -> Option<MsgKind> {
        MsgKind::from_u8(self.kind)
    }

    /// The short form of this header, if it has one: an eager message, not synchronous,
    /// returning no credits (what [`decode_short`] gives back, the size aside).
    pub fn short_form(&self) -> Option<[u8; SHORT_HEADER_BYTES]> {
        if self.kind != MsgKind::Eager as u8 || self.flags != 0 || self.credits != 0 {
            return None;
        }
        let mut b = [0u8; SHORT_HEADER_BYTES];
        b[0] = self.kind;
        b[4..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..12].copy_from_slice(&self.context.to_le_bytes());
        Some(b)
    }

    /// Little-endian encoding.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0] = self.kind;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_le_bytes());
        b[4..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..12].copy_from_slice(&self.context.to_le_bytes());
        b[12..16].copy_from_slice(&self.chunk.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.sreq.to_le_bytes());
        b[32..40].copy_from_slice(&self.rreq.to_le_bytes());
        b[40..48].copy_from_slice(&self.addr.to_le_bytes());
        b[48..52].copy_from_slice(&self.rkey.to_le_bytes());
        b[52..60].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes the first `HEADER_BYTES` of `b`.
    pub fn decode(b: &[u8]) -> Header {
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().expect("2 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Header {
            kind: b[0],
            flags: b[1],
            credits: u16_at(2),
            tag: u32_at(4) as i32,
            context: u32_at(8),
            chunk: u32_at(12),
            size: u64_at(16),
            sreq: u64_at(24),
            rreq: u64_at(32),
            addr: u64_at(40),
            rkey: u32_at(48),
            len: u64_at(52),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_asynchronous_eager_header_has_a_short_form_and_nothing_else_does() {
        let mut h = Header::new(MsgKind::Eager);
        h.tag = 0x7fff_fff0;
        h.context = 0x8000_0003;
        h.sreq = 99; // not carried: only a synchronous send needs it
        let mut m = h.short_form().expect("a short form").to_vec();
        m.extend_from_slice(b"payload");
        let (kind, back) = decode_short(&m).unwrap();
        assert_eq!(kind, MsgKind::Eager);
        assert_eq!((back.tag, back.context, back.size), (h.tag, h.context, 7));
        let sync = Header { flags: SYNC, ..h };
        assert!(sync.short_form().is_none());
        assert!(Header::new(MsgKind::Rts).short_form().is_none());
        assert!(Header { credits: 1, ..h }.short_form().is_none());
        // What a correct peer never puts in the short form is refused.
        let mut bad = m.clone();
        bad[1] = SYNC;
        assert!(decode_short(&bad).is_err());
        bad = m.clone();
        bad[0] = MsgKind::CopyDone as u8;
        assert!(decode_short(&bad).is_err());
        bad = m.clone();
        bad[3] = 1;
        assert!(decode_short(&bad).is_err());
        assert!(decode_short(&m[..SHORT_HEADER_BYTES - 1]).is_err());
    }

    #[test]
    fn header_round_trips() {
        let h = Header {
            kind: MsgKind::Rts as u8,
            flags: SYNC | GET | HAS_CHUNK,
            credits: 17,
            tag: -5,
            context: 9,
            chunk: 3,
            size: 1 << 40,
            sreq: 11,
            rreq: 12,
            addr: 0x7fff_dead_0000,
            rkey: 0x1234_5678,
            len: 1 << 20,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        assert_eq!(h.kind(), Some(MsgKind::Rts));
        assert!(MsgKind::Eager.is_data() && !MsgKind::Cts.is_data());
    }

    fn message(h: Header, payload: &[u8]) -> Vec<u8> {
        let mut v = h.encode().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn the_decoder_refuses_what_no_peer_sends() {
        let mut eager = Header::new(MsgKind::Eager);
        eager.size = 3;
        assert_eq!(
            decode_message(&message(eager, b"abc")),
            Ok((MsgKind::Eager, eager))
        );
        assert!(decode_message(&message(eager, b"ab")).is_err());
        eager.size = u64::MAX;
        assert!(decode_message(&message(eager, b"abc")).is_err());
        assert!(decode_message(&[MsgKind::Rts as u8; 63]).is_err());
        assert!(decode_message(&message(Header::new(MsgKind::Cts), b"x")).is_err());
        let mut unknown = Header::new(MsgKind::Credit);
        unknown.kind = 0;
        assert!(decode_message(&message(unknown, &[])).is_err());
        unknown.kind = 0xff;
        assert!(decode_message(&message(unknown, &[])).is_err());
        let mut flags = Header::new(MsgKind::Credit);
        flags.flags = 0x80;
        assert!(decode_message(&message(flags, &[])).is_err());
        let mut cts = Header::new(MsgKind::Cts);
        cts.size = u64::MAX - 4095;
        cts.len = 4096;
        assert!(decode_message(&message(cts, &[])).is_err());
        let mut rts = Header::new(MsgKind::Rts);
        rts.size = 1 << 20;
        let mut desc = [0u8; CHUNK_DESC_BYTES];
        desc[16..24].copy_from_slice(&4096u64.to_le_bytes());
        desc[24..32].copy_from_slice(&((1u64 << 20) - 4096).to_le_bytes());
        assert!(decode_message(&message(rts, &desc)).is_ok());
        desc[24..32].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(decode_message(&message(rts, &desc)).is_err());
        assert!(decode_message(&message(rts, &desc[..31])).is_err());
        // Each chunk inside the message, but together more than it: refused.
        rts.size = 8192;
        desc[24..32].copy_from_slice(&0u64.to_le_bytes());
        desc[16..24].copy_from_slice(&8192u64.to_le_bytes());
        assert!(decode_message(&message(rts, &desc)).is_ok());
        let twice = [desc, desc].concat();
        assert_eq!(
            decode_message(&message(rts, &twice)),
            Err("RTS chunks adding up to more than the message")
        );
    }

    #[test]
    fn local_rendezvous_messages_are_checked_against_the_message() {
        // Two elements 16 bytes apart, each runs of 4 and 8 bytes: 24 bytes.
        let source = LocalSource {
            addr: 0x1000,
            extent: 16,
            count: 2,
            runs: vec![(0, 4), (8, 8)],
        };
        assert_eq!(source.len(), 24);
        let mut rts = Header::new(MsgKind::Rts);
        rts.flags = LOCAL_COPY;
        rts.size = 24;
        let encoded = source.encode();
        assert_eq!(encoded.len(), LocalSource::encoded_len(2));
        assert_eq!(
            decode_message(&message(rts, &encoded)),
            Ok((MsgKind::Rts, rts))
        );
        assert_eq!(LocalSource::decode(&encoded, 24), Ok(source.clone()));
        assert_eq!(LocalSource::decode_any(&encoded), Ok(source.clone()));
        rts.size = 25;
        assert!(
            decode_message(&message(rts, &encoded)).is_err(),
            "not the message's size"
        );
        rts.size = 24;
        assert!(
            decode_message(&message(rts, &encoded[..40])).is_err(),
            "cut short"
        );
        let wraps = LocalSource {
            addr: u64::MAX - 8,
            extent: 16,
            count: 2,
            runs: vec![(0, 12)],
        };
        rts.size = 24;
        assert!(
            decode_message(&message(rts, &wraps.encode())).is_err(),
            "wraps"
        );
        // A copy share names a range inside the receive buffer it describes.
        let mut share = Header::new(MsgKind::CopyShare);
        share.size = 12;
        share.len = 12;
        assert!(decode_message(&message(share, &encoded)).is_ok());
        share.len = 13;
        assert!(decode_message(&message(share, &encoded)).is_err());
        share.size = u64::MAX;
        assert!(decode_message(&message(share, &encoded)).is_err());
        let done = Header::new(MsgKind::ShareDone);
        assert!(decode_message(&message(done, &[])).is_ok());
        assert!(
            decode_message(&message(done, b"x")).is_err(),
            "a control message with a payload"
        );
    }
}
