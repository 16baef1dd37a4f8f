//! The TCP wire's framing: what one rank's NIC writes on its connection to a
//! peer on another host, and the decoder that checks every field before any of it is used.
//!
//! A frame is an 8-byte prefix — kind (1 byte), three zero bytes, body length (u32, little
//! endian) — then its body:
//! - `PACKET`: a ring packet: the ring's 56-byte encoded header ([`ring::Header::encode`])
//!   and `payload_len` bytes of payload, exactly as the shared-memory wire carries it
//!   (SEND, WRITE, WRITE WITH IMM, READ request, READ response);
//! - `ACK`: the responder accepted every request of queue pair `qpn` below `msn_end`;
//! - `NAK`: it refused request `msn` (receiver not ready, with or without a filed fault; a
//!   translation-cache miss; an error status);
//! - `FAULT_DONE`: the fault it filed for queue pair `qpn` as sequence `seq` was resolved
//!   (or not: the memory is unmapped), so that the requester retries at once;
//! - `BYE`: the sender's NIC is going down; an end of stream without it means the peer died.
//!
//! Before the first frame, each side of a connection sends a [`Hello`] that carries the
//! job's secret.
//!
//! A peer on the network can send anything, so the decoder refuses unknown kinds, non-zero
//! reserved bytes, lengths that do not match the kind, payloads longer than the MTU, packet
//! headers the ring's own checks ([`ring::validate`]) refuse, and CMA descriptors (a peer
//! on another host has no memory this rank can read). A refused frame closes the
//! connection; nothing of it is used.

use crate::ack::Nak;
use crate::layout::MAX_QPS;
use crate::ring::{self, Header, CMA_DESCRIPTOR, ENCODED_HEADER_BYTES, MTU};

/// Bytes of a frame's prefix.
pub(crate) const PREFIX_BYTES: usize = 8;
/// The longest frame: a packet with a full payload.
pub(crate) const MAX_FRAME_BYTES: usize = PREFIX_BYTES + ENCODED_HEADER_BYTES + MTU;

const PACKET: u8 = 1;
const ACK: u8 = 2;
const NAK: u8 = 3;
const FAULT_DONE: u8 = 4;
const BYE: u8 = 5;

const ACK_BODY: usize = 16;
const NAK_BODY: usize = 24;
const FAULT_DONE_BODY: usize = 24;

/// One decoded frame, borrowing its payload from the bytes it was decoded from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// A ring packet and its payload.
    Packet { header: Header, payload: &'a [u8] },
    /// Every request of the receiver's queue pair `qpn` below `msn_end` was accepted.
    Ack { qpn: u32, msn_end: u64 },
    /// Request `msn` of the receiver's queue pair `qpn` was refused.
    Nak { qpn: u32, msn: u64, why: Nak },
    /// The fault the sender filed for the receiver's queue pair `qpn` as `seq` was handled;
    /// `resolved` says whether the pages are mapped now.
    FaultDone { qpn: u32, seq: u64, resolved: bool },
    /// The sender's NIC is going down: nothing more comes.
    Bye,
}

/// Why a frame was refused (the connection is closed with it).
pub(crate) type FrameError = &'static str;

/// The prefix of a frame of `kind` with a body of `body` bytes.
fn prefix(kind: u8, body: usize) -> [u8; PREFIX_BYTES] {
    let mut p = [0u8; PREFIX_BYTES];
    p[0] = kind;
    p[4..8].copy_from_slice(&(body as u32).to_le_bytes());
    p
}

/// The prefix and encoded header of a packet frame; its payload (`header.payload_len`
/// bytes) follows.
pub(crate) fn packet_head(header: &Header) -> [u8; PREFIX_BYTES + ENCODED_HEADER_BYTES] {
    let mut out = [0u8; PREFIX_BYTES + ENCODED_HEADER_BYTES];
    out[..PREFIX_BYTES].copy_from_slice(&prefix(
        PACKET,
        ENCODED_HEADER_BYTES + header.payload_len as usize,
    ));
    for (i, w) in header.encode().iter().enumerate() {
        let at = PREFIX_BYTES + i * 8;
        out[at..at + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Appends a control frame (anything but a packet) to `out`.
pub(crate) fn encode_control(frame: &Frame<'_>, out: &mut Vec<u8>) {
    match *frame {
        Frame::Packet { .. } => unreachable!("packets go out of the ring, with packet_head"),
        Frame::Ack { qpn, msn_end } => {
            out.extend_from_slice(&prefix(ACK, ACK_BODY));
            out.extend_from_slice(&qpn.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&msn_end.to_le_bytes());
        }
        Frame::Nak { qpn, msn, why } => {
            let (kind, code, fault) = match why {
                Nak::Error(code) => (0u16, code, 0u64),
                Nak::Rnr { fault: None } => (1, 0, 0),
                Nak::TranslationMiss => (2, 0, 0),
                Nak::Rnr { fault: Some(seq) } => (3, 0, seq),
            };
            out.extend_from_slice(&prefix(NAK, NAK_BODY));
            out.extend_from_slice(&qpn.to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&code.to_le_bytes());
            out.extend_from_slice(&msn.to_le_bytes());
            out.extend_from_slice(&fault.to_le_bytes());
        }
        Frame::FaultDone { qpn, seq, resolved } => {
            out.extend_from_slice(&prefix(FAULT_DONE, FAULT_DONE_BODY));
            out.extend_from_slice(&qpn.to_le_bytes());
            out.extend_from_slice(&(resolved as u32).to_le_bytes());
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&[0; 8]);
        }
        Frame::Bye => out.extend_from_slice(&prefix(BYE, 0)),
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn qpn_at(b: &[u8], at: usize) -> Result<u32, FrameError> {
    let qpn = u32_at(b, at);
    if qpn as usize >= MAX_QPS {
        return Err("a queue pair number out of range");
    }
    Ok(qpn)
}

/// Checks a frame's prefix: the frame's total length in bytes (prefix included), or why it
/// is refused. Needs [`PREFIX_BYTES`] bytes.
pub(crate) fn frame_len(prefix: &[u8]) -> Result<usize, FrameError> {
    let kind = prefix[0];
    if prefix[1..4] != [0, 0, 0] {
        return Err("non-zero reserved bytes in a frame prefix");
    }
    let body = u32_at(prefix, 4) as usize;
    let ok = match kind {
        PACKET => (ENCODED_HEADER_BYTES..=ENCODED_HEADER_BYTES + MTU).contains(&body),
        ACK => body == ACK_BODY,
        NAK => body == NAK_BODY,
        FAULT_DONE => body == FAULT_DONE_BODY,
        BYE => body == 0,
        _ => return Err("an unknown frame kind"),
    };
    if !ok {
        return Err("a frame length its kind cannot have");
    }
    Ok(PREFIX_BYTES + body)
}

/// Decodes the frame at the start of `bytes`: `Ok(None)` while it is incomplete, else the
/// frame and how many bytes it took. A pure function of the bytes (fuzzed in `fuzz.rs`).
pub(crate) fn decode(bytes: &[u8]) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    if bytes.len() < PREFIX_BYTES {
        return Ok(None);
    }
    let len = frame_len(&bytes[..PREFIX_BYTES])?;
    let Some(b) = bytes.get(PREFIX_BYTES..len) else {
        return Ok(None);
    };
    let frame = match bytes[0] {
        PACKET => {
            let (_, header) = ring::decode(b)?;
            if header.flags & CMA_DESCRIPTOR != 0 {
                return Err("a CMA descriptor from another host");
            }
            if header.payload_len as usize != b.len() - ENCODED_HEADER_BYTES {
                return Err("a packet whose payload length is not its frame's");
            }
            if header.dst_qpn as usize >= MAX_QPS || header.src_qpn as usize >= MAX_QPS {
                return Err("a queue pair number out of range");
            }
            Frame::Packet {
                header,
                payload: &b[ENCODED_HEADER_BYTES..],
            }
        }
        ACK => {
            if b[4..8] != [0; 4] {
                return Err("non-zero padding in an ACK");
            }
            Frame::Ack {
                qpn: qpn_at(b, 0)?,
                msn_end: u64_at(b, 8),
            }
        }
        NAK => {
            let kind = u16::from_le_bytes([b[4], b[5]]);
            let code = u16::from_le_bytes([b[6], b[7]]);
            let fault = u64_at(b, 16);
            let why = match (kind, code, fault) {
                (0, code, 0) if code != 0 => Nak::Error(code),
                (1, 0, 0) => Nak::Rnr { fault: None },
                (2, 0, 0) => Nak::TranslationMiss,
                (3, 0, seq) => Nak::Rnr { fault: Some(seq) },
                _ => return Err("a NAK of no kind the protocol has"),
            };
            Frame::Nak {
                qpn: qpn_at(b, 0)?,
                msn: u64_at(b, 8),
                why,
            }
        }
        FAULT_DONE => {
            let resolved = match u32_at(b, 4) {
                0 => false,
                1 => true,
                _ => return Err("a fault outcome that is neither resolved nor failed"),
            };
            if b[16..24] != [0; 8] {
                return Err("non-zero padding in a fault outcome");
            }
            Frame::FaultDone {
                qpn: qpn_at(b, 0)?,
                seq: u64_at(b, 8),
                resolved,
            }
        }
        BYE => Frame::Bye,
        _ => unreachable!("frame_len refused it"),
    };
    Ok(Some((frame, len)))
}

/// Bytes of a [`Hello`].
pub(crate) const HELLO_BYTES: usize = 8 + SECRET_BYTES + 8;
/// Bytes of the job's secret.
pub(crate) const SECRET_BYTES: usize = 32;
const HELLO_MAGIC: [u8; 8] = *b"pwtcp\0v1";

/// What each side of a new connection sends first: who it is, who it meant to reach, and
/// the job's secret (the peer checks it; a wrong one closes the connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub secret: [u8; SECRET_BYTES],
    pub from: u32,
    pub to: u32,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[..8].copy_from_slice(&HELLO_MAGIC);
        out[8..8 + SECRET_BYTES].copy_from_slice(&self.secret);
        out[8 + SECRET_BYTES..12 + SECRET_BYTES].copy_from_slice(&self.from.to_le_bytes());
        out[12 + SECRET_BYTES..].copy_from_slice(&self.to.to_le_bytes());
        out
    }

    /// Reads a hello, refusing anything that is not one.
    pub(crate) fn decode(b: &[u8; HELLO_BYTES]) -> Result<Hello, FrameError> {
        if b[..8] != HELLO_MAGIC {
            return Err("not a pagewire TCP wire hello (wrong magic or version)");
        }
        Ok(Hello {
            secret: b[8..8 + SECRET_BYTES].try_into().expect("32 bytes"),
            from: u32_at(b, 8 + SECRET_BYTES),
            to: u32_at(b, 12 + SECRET_BYTES),
        })
    }

    /// Whether `secret` is this hello's, compared in time independent of where they differ.
    pub(crate) fn has_secret(&self, secret: &[u8; SECRET_BYTES]) -> bool {
        self.secret
            .iter()
            .zip(secret)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Kind, FIRST, LAST};

    fn packet(h: &Header, payload: &[u8]) -> Vec<u8> {
        let mut v = packet_head(h).to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn send_header(len: u32) -> Header {
        Header {
            kind: Kind::Send as u8,
            flags: FIRST | LAST,
            dst_qpn: 3,
            src_qpn: 4,
            msn: 9,
            total_len: len as u64,
            payload_len: len,
            ..Header::default()
        }
    }

    #[test]
    fn every_frame_kind_round_trips() {
        let h = send_header(5);
        let mut bytes = packet(&h, b"hello");
        let controls = [
            Frame::Ack {
                qpn: 7,
                msn_end: 1 << 40,
            },
            Frame::Nak {
                qpn: 1,
                msn: 2,
                why: Nak::Rnr { fault: None },
            },
            Frame::Nak {
                qpn: 1,
                msn: 2,
                why: Nak::Rnr { fault: Some(77) },
            },
            Frame::Nak {
                qpn: 1,
                msn: 2,
                why: Nak::TranslationMiss,
            },
            Frame::Nak {
                qpn: 255,
                msn: 2,
                why: Nak::Error(9),
            },
            Frame::FaultDone {
                qpn: 0,
                seq: 5,
                resolved: true,
            },
            Frame::FaultDone {
                qpn: 0,
                seq: 6,
                resolved: false,
            },
            Frame::Bye,
        ];
        for c in &controls {
            encode_control(c, &mut bytes);
        }
        let mut at = 0;
        let (f, n) = decode(&bytes).unwrap().unwrap();
        assert_eq!(
            f,
            Frame::Packet {
                header: h,
                payload: b"hello"
            }
        );
        at += n;
        for c in &controls {
            let (f, n) = decode(&bytes[at..]).unwrap().unwrap();
            assert_eq!(&f, c);
            at += n;
        }
        assert_eq!(at, bytes.len());
    }

    #[test]
    fn an_incomplete_frame_waits_for_more() {
        let bytes = packet(&send_header(5), b"hello");
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn hostile_frames_are_refused() {
        // Unknown kind, reserved bytes, lengths of no kind, an oversized payload.
        assert!(decode(&[9, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode(&[2, 1, 0, 0, 16, 0, 0, 0]).is_err());
        assert!(decode(&[2, 0, 0, 0, 17, 0, 0, 0]).is_err());
        let big = ((ENCODED_HEADER_BYTES + MTU + 1) as u32).to_le_bytes();
        assert!(decode(&[1, 0, 0, 0, big[0], big[1], big[2], big[3]]).is_err());
        // A payload length that is not the frame's.
        let mut h = send_header(5);
        let mut bytes = packet(&h, b"hello");
        bytes[4] += 1;
        bytes.push(0);
        assert!(decode(&bytes).is_err());
        // A CMA descriptor names memory on another host.
        h.flags |= CMA_DESCRIPTOR;
        h.payload_len = 16;
        h.total_len = 16;
        assert_eq!(
            decode(&packet(&h, &[0; 16])).unwrap_err(),
            "a CMA descriptor from another host"
        );
        // The ring's checks: a payload past the end of its message.
        let mut h = send_header(5);
        h.total_len = 4;
        assert!(decode(&packet(&h, b"hello")).is_err());
        // A queue pair out of range.
        let mut h = send_header(5);
        h.dst_qpn = MAX_QPS as u32;
        assert!(decode(&packet(&h, b"hello")).is_err());
        let mut v = Vec::new();
        encode_control(&Frame::Ack { qpn: 0, msn_end: 1 }, &mut v);
        v[8..12].copy_from_slice(&(MAX_QPS as u32).to_le_bytes());
        assert!(decode(&v).is_err());
        // A NAK of no kind.
        let mut v = Vec::new();
        encode_control(
            &Frame::Nak {
                qpn: 0,
                msn: 1,
                why: Nak::Rnr { fault: None },
            },
            &mut v,
        );
        v[12] = 7;
        assert!(decode(&v).is_err());
    }

    #[test]
    fn a_hello_checks_its_magic_and_compares_secrets() {
        let h = Hello {
            secret: [7; 32],
            from: 1,
            to: 2,
        };
        let b = h.encode();
        let back = Hello::decode(&b).unwrap();
        assert_eq!(back, h);
        assert!(back.has_secret(&[7; 32]));
        let mut other = [7; 32];
        other[31] = 8;
        assert!(!back.has_secret(&other));
        let mut bad = b;
        bad[7] = b'2';
        assert!(Hello::decode(&bad).is_err());
    }
}
