//! Fuzz targets of the bootstrap's parsers, which read what other processes send: the
//! frames between a rank and `pwrun` ([`crate::pwrun_client::wire`]) and those between
//! `pwrun --hosts` and its agents (`hosts/relay.rs`), each driven by the mutational fuzzer
//! of `pagewire_test_support::fuzz`. Each accepted frame must encode back to the same
//! bytes. The targets are `#[ignore]`d in ordinary test runs; `.ci/fuzz.sh` runs them:
//!
//! ```text
//! PAGEWIRE_FUZZ_INPUTS=100000 cargo test --release -p pagewire-boot --lib fuzz:: -- --ignored
//! ```

use pagewire_test_support::fuzz::drive;

use crate::pwrun_client::wire as boot_wire;

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

/// The frames between `pwrun --hosts` and its agents (`hosts/relay.rs`): each kind's
/// decoder on mutated frames, accepted ones encoding back to the same bytes.
#[test]
#[ignore = "fuzzing: run by .ci/fuzz.sh"]
fn fuzz_hosts_relay_parser() {
    use crate::binding::BindTo;
    use crate::hosts::relay::{self, Start};
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
