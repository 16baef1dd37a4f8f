//! The message layer's wire header: 64 bytes at the start of every SEND it makes.

/// Bytes of the header.
pub const HEADER_BYTES: usize = 64;

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
}
