//! Fuzz targets of the decoders that read what peers send through the NIC and the local
//! path: the ring packet decoder ([`crate::nic::soft::ring::decode`]), the message decoders
//! ([`crate::msg::wire::decode_message`] and the local path's
//! [`crate::msg::wire::decode_short`]) and the TCP wire's frame decoder
//! ([`crate::nic::soft::tcp::frame::decode`]), each driven by the mutational fuzzer of
//! `pagewire_test_support::fuzz` (the bootstrap's parsers have theirs in `pagewire-boot`).
//!
//! Each target starts from valid encodings and checks that the decoder returns on every
//! mutated input, that what it accepts satisfies the protocol's invariants, and that it
//! encodes back to the same bytes. The targets are `#[ignore]`d in ordinary test runs;
//! `.ci/fuzz.sh` runs them:
//!
//! ```text
//! PAGEWIRE_FUZZ_INPUTS=100000 cargo test --release -p pagewire-transport --lib fuzz:: -- --ignored
//! ```

use pagewire_test_support::fuzz::drive;

use crate::msg::wire::{self, Header, MsgKind, CHUNK_DESC_BYTES, HEADER_BYTES};
use crate::nic::soft::ring::{self, Kind, CMA_DESCRIPTOR, ENCODED_HEADER_BYTES, MTU};

fn ring_header(h: ring::Header) -> Vec<u8> {
    h.encode().iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_ring_packet_decoder() {
    use ring::{FIRST, HAS_IMM, LAST};
    let base = ring::Header {
        dst_qpn: 3,
        src_qpn: 4,
        msn: 17,
        ..ring::Header::default()
    };
    let seeds: Vec<Vec<u8>> = [
        ring::Header {
            kind: Kind::Send as u8,
            flags: FIRST | LAST,
            total_len: 100,
            payload_len: 100,
            ..base
        },
        ring::Header {
            kind: Kind::Send as u8,
            flags: LAST | HAS_IMM,
            imm: 9,
            total_len: 3 * MTU as u64,
            offset: 2 * MTU as u64,
            payload_len: MTU as u32,
            ..base
        },
        ring::Header {
            kind: Kind::Send as u8,
            flags: FIRST | LAST | CMA_DESCRIPTOR,
            total_len: 1 << 20,
            payload_len: 32,
            ..base
        },
        ring::Header {
            kind: Kind::Write as u8,
            flags: FIRST,
            total_len: 1 << 20,
            remote_addr: 0x7f00_0000_0000,
            rkey: 0x1234_5601,
            payload_len: MTU as u32,
            ..base
        },
        ring::Header {
            kind: Kind::WriteImm as u8,
            flags: FIRST | LAST | HAS_IMM | CMA_DESCRIPTOR,
            imm: 1,
            total_len: 4096,
            ..base
        },
        ring::Header {
            kind: Kind::ReadRequest as u8,
            flags: FIRST | LAST,
            total_len: 1 << 30,
            remote_addr: 0x1000,
            rkey: 7,
            ..base
        },
        ring::Header {
            kind: Kind::ReadResponse as u8,
            flags: LAST,
            code: 5,
            total_len: 8192,
            offset: 4096,
            payload_len: 4096,
            ..base
        },
    ]
    .into_iter()
    .map(ring_header)
    .collect();
    for s in &seeds {
        assert!(ring::decode(s).is_ok(), "seed {s:?}");
    }
    drive("ring packet decoder", &seeds, 64, |input| {
        let Ok((kind, h)) = ring::decode(input) else {
            return false;
        };
        assert_eq!(h.kind(), Some(kind));
        assert!(h.payload_len as usize <= MTU, "{h:?}");
        if h.flags & CMA_DESCRIPTOR == 0 {
            let end = h.offset.checked_add(h.payload_len as u64);
            assert!(end.is_some_and(|e| e <= h.total_len), "{h:?}");
        } else {
            assert!(h.payload_len % 16 == 0 && h.payload_len <= 256, "{h:?}");
        }
        assert_eq!(ring_header(h), input[..ENCODED_HEADER_BYTES], "round trip");
        true
    });
}

fn message(h: Header, payload: &[u8]) -> Vec<u8> {
    let mut v = h.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_message_decoder() {
    let with = |kind: MsgKind, f: &dyn Fn(&mut Header)| {
        let mut h = Header::new(kind);
        f(&mut h);
        h
    };
    let mut desc = Vec::new();
    for (k, off) in [(0u32, 0u64), (1, 1 << 20)] {
        desc.extend_from_slice(&k.to_le_bytes());
        desc.extend_from_slice(&0x55u32.to_le_bytes());
        desc.extend_from_slice(&0x7f00_0000_0000u64.to_le_bytes());
        desc.extend_from_slice(&(1u64 << 20).to_le_bytes());
        desc.extend_from_slice(&off.to_le_bytes());
    }
    // 3 elements 32 bytes apart, runs of 8 and 8 bytes: 48 bytes.
    let local_source = wire::LocalSource {
        addr: 0x7f00_0000_0000,
        extent: 32,
        count: 3,
        runs: vec![(0, 8), (16, 8)],
    };
    let seeds = vec![
        message(
            with(MsgKind::Eager, &|h| {
                h.size = 5;
                h.tag = 3;
                h.credits = 2;
            }),
            b"hello",
        ),
        message(with(MsgKind::Eager, &|h| h.flags = wire::SYNC), &[]),
        message(
            with(MsgKind::Rts, &|h| {
                h.size = 2 << 20;
                h.flags = wire::GET | wire::SYNC;
                h.sreq = 0x1_0000_0002;
            }),
            &desc,
        ),
        message(with(MsgKind::Rts, &|h| h.size = 1 << 30), &[]),
        message(
            with(MsgKind::Cts, &|h| {
                h.size = 4096;
                h.len = 8192;
                h.addr = 0x7f00_0000_0000;
                h.rkey = 9;
                h.flags = wire::ALL_DONE;
            }),
            &[],
        ),
        message(with(MsgKind::Fin, &|h| h.chunk = 3), &[]),
        message(
            with(MsgKind::ChunkReady, &|h| {
                h.size = 1 << 20;
                h.len = 1 << 20;
            }),
            &[],
        ),
        message(with(MsgKind::ChunkDone, &|h| h.chunk = u32::MAX), &[]),
        message(with(MsgKind::SyncAck, &|h| h.sreq = 1), &[]),
        message(with(MsgKind::Credit, &|h| h.credits = 8), &[]),
        message(
            with(MsgKind::Rts, &|h| {
                h.flags = wire::LOCAL_COPY;
                h.size = 48;
            }),
            &local_source.encode(),
        ),
        message(
            with(MsgKind::CopyShare, &|h| {
                h.size = 16;
                h.len = 32;
            }),
            &local_source.encode(),
        ),
        message(
            with(MsgKind::CopyDone, &|h| h.flags = wire::COPY_FAILED),
            &[],
        ),
        message(with(MsgKind::ShareDone, &|h| h.rreq = 7), &[]),
    ];
    for s in &seeds {
        assert!(wire::decode_message(s).is_ok(), "seed {s:?}");
    }
    drive(
        "message decoder",
        &seeds,
        HEADER_BYTES + 4 * CHUNK_DESC_BYTES,
        |input| {
            let Ok((kind, h)) = wire::decode_message(input) else {
                return false;
            };
            assert_eq!(h.kind(), Some(kind));
            assert_eq!(h.encode()[..60], input[..60], "round trip");
            let payload = &input[HEADER_BYTES..];
            match kind {
                MsgKind::Eager => assert_eq!(h.size, payload.len() as u64),
                MsgKind::Rts if h.flags & wire::LOCAL_COPY != 0 => {
                    let source = wire::LocalSource::decode(payload, h.size).expect("accepted");
                    assert_eq!(source.len(), h.size);
                    assert_eq!(source.encode(), payload, "round trip");
                }
                MsgKind::CopyShare => {
                    let dest = wire::LocalSource::decode_any(payload).expect("accepted");
                    assert!(h.size.checked_add(h.len).is_some_and(|e| e <= dest.len()));
                    assert_eq!(dest.encode(), payload, "round trip");
                }
                MsgKind::Rts => {
                    for c in crate::msg::PointToPoint::decode_chunks(payload) {
                        assert!(c.offset.checked_add(c.len).is_some_and(|e| e <= h.size));
                    }
                    assert_eq!(payload.len() % CHUNK_DESC_BYTES, 0);
                }
                _ => assert!(payload.is_empty()),
            }
            true
        },
    );
}

#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_short_message_decoder() {
    let short = |tag: i32, context: u32, payload: &[u8]| {
        let mut h = Header::new(MsgKind::Eager);
        h.tag = tag;
        h.context = context;
        let mut v = h
            .short_form()
            .expect("an eager header has a short form")
            .to_vec();
        v.extend_from_slice(payload);
        v
    };
    let seeds = vec![
        short(0, 0, &[]),
        short(7, 1 << 31, b"12345678"),
        short(i32::MAX, u32::MAX, &[0xa5; 40]),
    ];
    for s in &seeds {
        assert!(wire::decode_short(s).is_ok(), "seed {s:?}");
    }
    drive("short message decoder", &seeds, 64, |input| {
        let Ok((kind, h)) = wire::decode_short(input) else {
            return false;
        };
        assert_eq!(kind, MsgKind::Eager);
        assert_eq!(h.flags, 0, "a short message is never synchronous");
        assert_eq!(h.size as usize, input.len() - wire::SHORT_HEADER_BYTES);
        let again = h.short_form().expect("what decodes has a short form");
        assert_eq!(again[..], input[..wire::SHORT_HEADER_BYTES], "round trip");
        true
    });
}

/// The TCP wire's frame decoder: every frame kind as seed, streams of several
/// frames, and the hello.
#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_tcp_frame_decoder() {
    use crate::nic::soft::ack::Nak;
    use crate::nic::soft::tcp::frame::{self, Frame, Hello, HELLO_BYTES};
    use ring::{FIRST, HAS_IMM, LAST};
    let packet = |h: ring::Header, payload: &[u8]| {
        let mut v = frame::packet_head(&h).to_vec();
        v.extend_from_slice(payload);
        v
    };
    let base = ring::Header {
        dst_qpn: 3,
        src_qpn: 4,
        msn: 17,
        ..ring::Header::default()
    };
    let mut seeds = vec![
        packet(
            ring::Header {
                kind: Kind::Send as u8,
                flags: FIRST | LAST | HAS_IMM,
                imm: 5,
                total_len: 40,
                payload_len: 40,
                ..base
            },
            &[0x42; 40],
        ),
        packet(
            ring::Header {
                kind: Kind::Write as u8,
                flags: FIRST,
                total_len: 1 << 20,
                remote_addr: 0x7f00_0000_0000,
                rkey: 0x1234_5601,
                payload_len: 16,
                ..base
            },
            &[7; 16],
        ),
        packet(
            ring::Header {
                kind: Kind::ReadRequest as u8,
                flags: FIRST | LAST,
                total_len: 1 << 30,
                remote_addr: 0x1000,
                rkey: 7,
                ..base
            },
            &[],
        ),
    ];
    for c in [
        Frame::Ack { qpn: 2, msn_end: 9 },
        Frame::Nak {
            qpn: 2,
            msn: 9,
            why: Nak::Rnr { fault: Some(3) },
        },
        Frame::Nak {
            qpn: 2,
            msn: 9,
            why: Nak::Error(5),
        },
        Frame::FaultDone {
            qpn: 1,
            seq: 4,
            resolved: true,
        },
        Frame::Bye,
    ] {
        let mut v = Vec::new();
        frame::encode_control(&c, &mut v);
        seeds.push(v);
    }
    // A stream of three frames, and a hello.
    seeds.push(seeds[..3].concat());
    seeds.push(
        Hello {
            secret: [9; 32],
            from: 1,
            to: 0,
        }
        .encode()
        .to_vec(),
    );
    for s in &seeds[..8] {
        assert!(
            matches!(frame::decode(s), Ok(Some((_, n))) if n == s.len()),
            "seed {s:?}"
        );
    }
    drive("tcp frame decoder", &seeds, 512, |input| {
        if let Ok(b) = <&[u8; HELLO_BYTES]>::try_from(input) {
            let _ = Hello::decode(b).map(|h| assert_eq!(&h.encode(), b, "hello round trip"));
        }
        // Decode the input as a stream, as a link does.
        let mut at = 0;
        let mut any = false;
        while let Ok(Some((f, n))) = frame::decode(&input[at..]) {
            assert!(n >= frame::PREFIX_BYTES && at + n <= input.len());
            let again = match f {
                Frame::Packet { header, payload } => {
                    assert_eq!(header.payload_len as usize, payload.len());
                    assert!(payload.len() <= MTU && header.flags & CMA_DESCRIPTOR == 0);
                    assert!((header.dst_qpn as usize) < crate::nic::soft::MAX_QPS);
                    let mut v = frame::packet_head(&header).to_vec();
                    v.extend_from_slice(payload);
                    v
                }
                other => {
                    let mut v = Vec::new();
                    frame::encode_control(&other, &mut v);
                    v
                }
            };
            assert_eq!(again, input[at..at + n], "round trip");
            at += n;
            any = true;
        }
        any
    });
}
