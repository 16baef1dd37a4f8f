//! Fuzz targets of the soft NIC's decoders, which read what peers send: the ring packet
//! decoder ([`crate::ring::decode`]) and the TCP wire's frame decoder
//! ([`crate::tcp::frame::decode`]), each driven by the mutational fuzzer of
//! `pagewire_test_support::fuzz`. Each accepted input must satisfy the wire's invariants and
//! encode back to the same bytes. The targets are `#[ignore]`d in ordinary test runs;
//! `.ci/fuzz.sh` runs them:
//!
//! ```text
//! PAGEWIRE_FUZZ_INPUTS=100000 cargo test --release -p pagewire-soft --lib fuzz:: -- --ignored
//! ```

use pagewire_test_support::fuzz::drive;

use crate::ring::{self, Kind, CMA_DESCRIPTOR, ENCODED_HEADER_BYTES, MTU};

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

/// The TCP wire's frame decoder: every frame kind as seed, streams of several
/// frames, and the hello.
#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_tcp_frame_decoder() {
    use crate::ack::Nak;
    use crate::tcp::frame::{self, Frame, Hello, HELLO_BYTES};
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
                    assert!((header.dst_qpn as usize) < crate::MAX_QPS);
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
