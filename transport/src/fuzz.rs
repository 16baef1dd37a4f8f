//! Fuzz targets: the ring packet decoder ([`crate::nic::soft::ring::decode`]),
//! the message decoders ([`crate::msg::wire::decode_message`] and the local path's
//! [`crate::msg::wire::decode_short`]), the bootstrap protocol's
//! parsers ([`crate::boot::pwrun_client::wire`]), the frames of `pwrun --hosts` and its
//! agents (`boot/hosts/relay.rs`) and the TCP wire's frame decoder
//! ([`crate::nic::soft::tcp::frame::decode`]), each driven by a small
//! deterministic mutational fuzzer on the stable toolchain.
//!
//! Each target starts from valid encodings, mutates them (bit flips, bytes and 2/4/8-byte
//! fields set to their extremes or at random, truncation, extension, splices; one input in
//! sixteen is random bytes) and checks that the decoder returns, that what it accepts
//! satisfies the protocol's invariants, and that it encodes back to the same bytes. The
//! targets are `#[ignore]`d in ordinary test runs; `.ci/fuzz.sh` runs them:
//!
//! ```text
//! PAGEWIRE_FUZZ_INPUTS=100000 cargo test --release -p pagewire-transport --lib fuzz:: -- --ignored
//! ```
//!
//! `PAGEWIRE_FUZZ_INPUTS` is the number of inputs per target (default 100,000) and
//! `PAGEWIRE_FUZZ_SEED` the generator's seed (default 1), so a failure is reproducible.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::boot::pwrun_client::wire as boot_wire;
use crate::msg::wire::{self, Header, MsgKind, CHUNK_DESC_BYTES, HEADER_BYTES};
use crate::nic::soft::ring::{self, Kind, CMA_DESCRIPTOR, ENCODED_HEADER_BYTES, MTU};

/// Values a mutated field takes besides random ones.
const EXTREMES: [u64; 10] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x3fc0,
    0x4000,
    u64::MAX - 4095,
    u64::MAX,
];

/// Runs `check` on `PAGEWIRE_FUZZ_INPUTS` inputs mutated from `seeds`, at most `max_len`
/// bytes each; `check` says whether the decoder accepted the input. Prints the counts and
/// the time taken.
fn drive(name: &str, seeds: &[Vec<u8>], max_len: usize, mut check: impl FnMut(&[u8]) -> bool) {
    let inputs: u64 = std::env::var("PAGEWIRE_FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(100_000);
    let seed: u64 = std::env::var("PAGEWIRE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut input = Vec::with_capacity(max_len);
    let start = Instant::now();
    let mut accepted = 0u64;
    for _ in 0..inputs {
        input.clear();
        if rng.gen_ratio(1, 16) {
            let n = rng.gen_range(0..=max_len);
            input.extend((0..n).map(|_| rng.gen::<u8>()));
        } else {
            input.extend_from_slice(&seeds[rng.gen_range(0..seeds.len())]);
            for _ in 0..rng.gen_range(1..=4) {
                mutate(&mut rng, &mut input, seeds, max_len);
            }
        }
        accepted += check(&input) as u64;
    }
    eprintln!(
        "fuzz {name}: {inputs} inputs (seed {seed}), {accepted} accepted, in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    assert!(accepted > 0, "the mutator never produced a valid input");
}

fn mutate(rng: &mut StdRng, b: &mut Vec<u8>, seeds: &[Vec<u8>], max_len: usize) {
    match rng.gen_range(0..7) {
        0 if !b.is_empty() => {
            let i = rng.gen_range(0..b.len());
            b[i] ^= 1 << rng.gen_range(0..8);
        }
        1 if !b.is_empty() => {
            let i = rng.gen_range(0..b.len());
            b[i] = rng.gen();
        }
        2..=4 => {
            // A field of 1, 2, 4 or 8 bytes, aligned to its size most of the time.
            let width = [1usize, 2, 4, 8][rng.gen_range(0..4)];
            if b.len() < width {
                return;
            }
            let mut at = rng.gen_range(0..=b.len() - width);
            if rng.gen_ratio(3, 4) {
                at -= at % width;
            }
            let v = if rng.gen() {
                EXTREMES[rng.gen_range(0..EXTREMES.len())]
            } else {
                rng.gen()
            };
            let v = if rng.gen_ratio(1, 4) {
                v.wrapping_neg()
            } else {
                v
            };
            b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
        }
        5 => {
            let n = rng.gen_range(0..=b.len());
            b.truncate(n);
        }
        _ => {
            if rng.gen() {
                let extra = rng.gen_range(1..=64).min(max_len.saturating_sub(b.len()));
                b.extend((0..extra).map(|_| rng.gen::<u8>()));
            } else {
                // Splice the tail of another seed.
                let other = &seeds[rng.gen_range(0..seeds.len())];
                let from = rng.gen_range(0..=other.len());
                let at = rng.gen_range(0..=b.len());
                b.truncate(at);
                b.extend_from_slice(&other[from..]);
                b.truncate(max_len);
            }
        }
    }
}

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

#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_bootstrap_parser() {
    let frame = |tag: u8, payload: &[u8]| {
        let mut v = Vec::new();
        boot_wire::write_frame(&mut v, tag, payload).unwrap();
        v
    };
    let hello = boot_wire::encode_hello(3, 4, 12345, "abc123");
    let result = boot_wire::encode_result([&b"one"[..], b"", b"three"].into_iter()).unwrap();
    let mut two = frame(boot_wire::HELLO, &hello);
    two.extend(frame(boot_wire::GATHER, b"xyz"));
    let seeds = vec![
        two,
        frame(boot_wire::WELCOME, &[]),
        frame(boot_wire::RESULT, &result),
        frame(boot_wire::ERROR, b"rank 2 left the job"),
        frame(boot_wire::GATHER, &[]),
    ];
    drive("bootstrap parser", &seeds, 128, |input| {
        let mut stream = input;
        let mut decoded = false;
        // A stream of frames, each parsed as the side that receives it does.
        while let Ok(Some((tag, payload))) = boot_wire::read_frame(&mut stream) {
            match tag {
                boot_wire::HELLO => {
                    if let Some(h) = boot_wire::decode_hello(&payload) {
                        decoded = true;
                        let again = boot_wire::encode_hello(h.rank, h.size, h.pid, &h.job);
                        assert_eq!(again, payload, "hello round trip");
                    }
                }
                boot_wire::RESULT => {
                    if let Some(parts) = boot_wire::decode_result(&payload) {
                        decoded = true;
                        let again =
                            boot_wire::encode_result(parts.iter().map(Vec::as_slice)).unwrap();
                        assert_eq!(again, payload, "result round trip");
                    }
                }
                boot_wire::ERROR => {
                    let _ = String::from_utf8_lossy(&payload);
                }
                _ => {}
            }
        }
        decoded
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

/// The frames between `pwrun --hosts` and its agents (`boot/hosts/relay.rs`): each kind's
/// decoder on mutated frames, accepted ones encoding back to the same bytes.
#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_hosts_relay_parser() {
    use crate::boot::binding::BindTo;
    use crate::boot::hosts::relay::{self, Start};
    let frame = |tag: u8, payload: &[u8]| {
        let mut v = Vec::new();
        boot_wire::write_frame(&mut v, tag, payload).unwrap();
        v
    };
    let start = Start {
        job: "0a1b2c3d4e5f".into(),
        size: 4,
        host: 1,
        ranks: vec![2, 3],
        program: "/bin/prog".into(),
        args: vec!["-x".into(), "y".into()],
        env: vec![("PATH".into(), "/bin".into()), ("A".into(), "".into())],
        cwd: "/home".into(),
        bind: BindTo::Auto,
    };
    let seeds = vec![
        frame(relay::START, &start.encode()),
        frame(relay::ERROR, &relay::encode_error(&[1, 3], "rank 2 left")),
        frame(relay::STARTED, &relay::encode_started(&[100, 101])),
        frame(relay::GATHER, &relay::encode_gather(2, b"address")),
        frame(relay::LEFT, &relay::encode_u64(3)),
        frame(
            relay::EXITED,
            &relay::encode_exited(1, 137, "killed by signal SIGKILL"),
        ),
        frame(relay::BYE, &relay::encode_u64(2)),
    ];
    drive("pwrun --hosts relay", &seeds, 512, |input| {
        let mut stream = input;
        let mut decoded = false;
        while let Ok(Some((tag, p))) = boot_wire::read_frame(&mut stream) {
            match tag {
                relay::START => {
                    if let Ok(s) = Start::decode(&p) {
                        decoded = true;
                        assert!(s.ranks.iter().all(|&r| r < s.size), "{s:?}");
                        assert_eq!(s.encode(), p, "START round trip");
                    }
                }
                relay::ERROR => {
                    if let Ok((ranks, text)) = relay::decode_error(&p) {
                        decoded = true;
                        let _ = (ranks, text);
                    }
                }
                relay::STARTED => {
                    if let Ok(pids) = relay::decode_started(&p) {
                        decoded = true;
                        assert_eq!(relay::encode_started(&pids), p, "STARTED round trip");
                    }
                }
                relay::GATHER => {
                    if let Ok((rank, data)) = relay::decode_gather(&p) {
                        decoded = true;
                        assert_eq!(relay::encode_gather(rank, &data), p, "GATHER round trip");
                    }
                }
                relay::LEFT | relay::BYE => {
                    if let Ok(v) = relay::decode_u64(&p) {
                        decoded = true;
                        assert_eq!(relay::encode_u64(v), p, "number round trip");
                    }
                }
                relay::EXITED => {
                    decoded |= relay::decode_exited(&p).is_ok();
                }
                _ => {}
            }
        }
        decoded
    });
}
