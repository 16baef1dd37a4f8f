//! The soft NIC's TCP wire between two ranks with `PAGEWIRE_SOFT_WIRE=tcp`: the
//! wire is really TCP, and hostile bytes on it — a frame of no kind, lengths out of range,
//! a CMA descriptor, a packet the ring's checks refuse, a queue pair out of range, a packet
//! cut short by the sender's death — close the connection with a clear reason, never a
//! panic, a hang or a stray byte: the victim's memory keeps its canary, its receive takes
//! nothing, and its next request to the hostile rank ends with an error completion.
//!
//! (Data, keys and bounds over TCP are checked by the soft NIC's other suites, which CI
//! runs again with `PAGEWIRE_SOFT_WIRE=tcp`.)

use std::time::{Duration, Instant};

use pagewire_boot::{self as boot, Bootstrap};
use pagewire_nic::{
    Access, Completion, Endpoint, Nic, Opcode, QpCaps, RecvWr, SendWr, Sge, WcStatus,
};
use pagewire_soft::{SoftConfig, SoftNic};
use pagewire_sys::AnonMapping;
use pagewire_test_support::nic::launch;
use pagewire_test_support::ROLE;

const NAME: &str = "hostile_bytes_on_the_tcp_wire_close_the_connection_with_a_clear_reason";
const VICTIM: usize = 0;
const HOSTILE: usize = 1;
const CANARY: u8 = 0xA5;
const REGION: usize = 1 << 16;
/// The soft NIC's MTU (a ring slot's payload).
const MTU: usize = 16 * 1024 - 64;

/// A frame prefix: kind, three zero bytes, body length.
fn prefix(kind: u8, body: u32) -> Vec<u8> {
    let mut v = vec![kind, 0, 0, 0];
    v.extend_from_slice(&body.to_le_bytes());
    v
}

/// A packet frame: the ring header's seven words, then `payload`.
#[allow(clippy::too_many_arguments)]
fn packet(
    kind: u8,
    flags: u8,
    dst_qpn: u32,
    src_qpn: u32,
    total_len: u64,
    offset: u64,
    payload_len: u32,
    payload: &[u8],
) -> Vec<u8> {
    let words = [
        kind as u64 | (flags as u64) << 8,
        dst_qpn as u64 | (src_qpn as u64) << 32,
        0, // msn
        total_len,
        offset,
        0, // remote_addr
        (payload_len as u64) << 32,
    ];
    let mut v = prefix(1, 56 + payload.len() as u32);
    for w in words {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(payload);
    v
}

/// The cases: a name, the bytes the hostile rank writes given (victim's qpn, its own), and
/// what the victim's reason must say.
type Case = (&'static str, fn(u32, u32) -> Vec<u8>, &'static str);

fn cases() -> Vec<Case> {
    vec![
        (
            "frame of no kind",
            |_, _| prefix(9, 0),
            "an unknown frame kind",
        ),
        (
            "packet longer than the MTU",
            |_, _| prefix(1, 56 + MTU as u32 + 1),
            "a frame length its kind cannot have",
        ),
        (
            "reserved bytes set",
            |_, _| {
                let mut v = prefix(2, 16);
                v[2] = 1;
                v.extend_from_slice(&[0; 16]);
                v
            },
            "non-zero reserved bytes",
        ),
        (
            "CMA descriptor naming the victim's memory",
            |d, s| {
                // SEND, FIRST | LAST | CMA_DESCRIPTOR: "pull 16 bytes from address 4096".
                let mut desc = 4096u64.to_le_bytes().to_vec();
                desc.extend_from_slice(&16u64.to_le_bytes());
                packet(1, 1 | 2 | 8, d, s, 16, 0, 16, &desc)
            },
            "a CMA descriptor from another host",
        ),
        (
            "payload past the end of its message",
            |d, s| packet(1, 1 | 2, d, s, 4, 0, 8, &[0xEE; 8]),
            "payload past the end of its message",
        ),
        (
            "payload length not the frame's",
            |d, s| {
                let mut v = packet(1, 1 | 2, d, s, 8, 0, 8, &[0xEE; 8]);
                // The frame says 4 payload bytes more than the header.
                v[4..8].copy_from_slice(&(56u32 + 12).to_le_bytes());
                v.extend_from_slice(&[0xEE; 4]);
                v
            },
            "payload length is not its frame's",
        ),
        (
            "queue pair out of range",
            |_, _| {
                let mut v = prefix(2, 16);
                v.extend_from_slice(&4096u32.to_le_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&1u64.to_le_bytes());
                v
            },
            "a queue pair number out of range",
        ),
    ]
}

#[test]
fn hostile_bytes_on_the_tcp_wire_close_the_connection_with_a_clear_reason() {
    if std::env::var(ROLE).as_deref() == Ok(NAME) {
        rank_main();
        return;
    }
    let outcome = launch(NAME, 2, &[("PAGEWIRE_SOFT_WIRE", "tcp")], None);
    assert!(outcome.success(), "{outcome:?}");
}

/// A NIC, a completion queue and one connected queue pair to the other rank: (NIC, cq,
/// local qpn, remote qpn).
fn bring_up(boot: &dyn Bootstrap) -> (SoftNic, u32, u32, u32) {
    let nic = SoftNic::new(boot, SoftConfig::from_env().expect("config")).expect("NIC up");
    let peer = 1 - boot.rank();
    assert!(
        nic.uses_tcp(peer),
        "PAGEWIRE_SOFT_WIRE=tcp, yet rank {peer} is not on TCP"
    );
    assert!(!nic.uses_cma(peer), "no CMA to a peer over TCP");
    let cq = nic.create_cq(1 << 13).unwrap();
    let qp = nic.create_qp(peer, cq, cq, QpCaps::default()).unwrap();
    let ep = nic.endpoint(qp).unwrap();
    let all = boot.allgather(&ep.0).unwrap();
    nic.connect(qp, &Endpoint(all[peer].clone())).unwrap();
    let rqpn = u32::from_le_bytes(all[peer][4..8].try_into().unwrap());
    boot.barrier().unwrap();
    (nic, cq, qp, rqpn)
}

fn poll_one(nic: &SoftNic, cq: u32, within: Duration) -> Option<Completion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < within {
        if nic.poll_cq(cq, &mut out, 1).unwrap() == 1 {
            return Some(out[0]);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    None
}

fn rank_main() {
    let boot = boot::from_env().expect("bootstrap");
    let me = boot.rank();
    let cases = cases();
    for (i, (what, bytes, reason)) in cases.iter().enumerate() {
        let (nic, cq, qp, rqpn) = bring_up(&*boot);
        let mut mem = AnonMapping::new(REGION).unwrap();
        mem.as_mut_slice().fill(CANARY);
        let mr = nic
            .register(
                mem.addr(),
                REGION as u64,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        if me == VICTIM {
            let sge = Sge {
                addr: mem.addr(),
                len: 4096,
                lkey: mr.lkey,
            };
            // SAFETY (test): the mapping lives until after the last completion.
            unsafe {
                nic.post_recv(
                    qp,
                    &RecvWr {
                        wr_id: 1,
                        sgl: &[sge],
                    },
                )
            }
            .unwrap();
        }
        boot.barrier().unwrap();
        if me == HOSTILE {
            assert!(
                nic.send_raw_wire_bytes(VICTIM, &bytes(rqpn, qp)),
                "{what}: not sent"
            );
        } else {
            let start = Instant::now();
            let why = loop {
                // Polling drives the engine, which reads the wire.
                if let Some(c) = poll_one(&nic, cq, Duration::from_millis(1)) {
                    panic!("{what}: a completion from a hostile frame: {c:?}");
                }
                if let Some(why) = nic.link_failure(HOSTILE) {
                    break why;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "{what}: link still open"
                );
            };
            assert!(
                why.contains(reason),
                "{what}: reason {why:?} lacks {reason:?}"
            );
            assert!(
                mem.as_slice().iter().all(|&b| b == CANARY),
                "{what}: the victim's memory changed"
            );
            // The hostile rank counts as dead: a request to it ends with an error.
            let sge = Sge {
                addr: mem.addr() + 8192,
                len: 64,
                lkey: mr.lkey,
            };
            let wr = SendWr {
                wr_id: 2,
                opcode: Opcode::Send,
                sgl: &[sge],
                inline: false,
                signaled: true,
            };
            // SAFETY (test): as above.
            unsafe { nic.post_send(qp, &wr) }.unwrap();
            let c = poll_one(&nic, cq, Duration::from_secs(30))
                .unwrap_or_else(|| panic!("{what}: no completion for a send to a closed link"));
            assert_ne!(c.status, WcStatus::Success, "{what}: {c:?}");
            eprintln!(
                "case {i} ({what}): closed with {why:?}; the next send: {:?}",
                c.status
            );
        }
        boot.barrier().unwrap();
        drop(nic);
        boot.barrier().unwrap();
    }
    // Last: a packet cut short by the sender's death (no goodbye).
    let (nic, cq, qp, rqpn) = bring_up(&*boot);
    if me == HOSTILE {
        let mut v = packet(1, 1 | 2, rqpn, qp, 100, 0, 100, &[0xEE; 100]);
        v.truncate(8 + 30);
        assert!(nic.send_raw_wire_bytes(VICTIM, &v));
        // Gone without a word: no destructor runs, the kernel closes the socket.
        std::process::exit(0);
    }
    let start = Instant::now();
    let why = loop {
        let _ = poll_one(&nic, cq, Duration::from_millis(1));
        if let Some(why) = nic.link_failure(HOSTILE) {
            break why;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "cut packet: link still open"
        );
    };
    assert!(why.contains("in the middle of a frame"), "{why:?}");
    eprintln!("cut packet: closed with {why:?}");
}
