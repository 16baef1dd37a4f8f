//! Fuzz targets of the message layer's decoders, which read what peers send through the NIC
//! and the local path: [`crate::msg::wire::decode_message`] and the local path's
//! [`crate::msg::wire::decode_short`], each driven by the mutational fuzzer of
//! `pagewire_test_support::fuzz` (the soft NIC's decoders have theirs in `pagewire-soft`,
//! the bootstrap's parsers in `pagewire-boot`).
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
