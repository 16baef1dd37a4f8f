//! Hostile peer: rank 1 speaks the soft NIC's ring and the message layer's wire
//! by hand and writes malformed ring packets, message headers and CTSs (every field at its
//! extremes) into rank 0, which runs the real message layer. Rank 0 must see an error
//! completion or nothing at all — never a panic, a hang, or a byte outside a posted buffer —
//! and no byte from outside its send buffer may reach rank 1.
//!
//! Each case runs on fresh NICs (both ranks bring theirs up again), since a malformed input
//! ends the victim's communication with the hostile rank.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use pagewire_test_support::nic::launch;
use pagewire_test_support::ROLE;
use pagewire_transport::boot::{self, Bootstrap};
use pagewire_transport::buffer_mode::copy::{CopyConfig, CopyMode};
use pagewire_transport::local::{LocalPath, LocalSetting};
use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::msg::wire::{Header, MsgKind, HEADER_BYTES};
use pagewire_transport::msg::{MsgConfig, PointToPoint, RndvProtocol};
use pagewire_transport::nic::soft::{SoftConfig, SoftNic};
use pagewire_transport::nic::{
    Access, Endpoint, Nic, Opcode, QpCaps, RecvWr, SendWr, Sge, WcOpcode, WcStatus,
};
use pagewire_transport::Error;

const NAME: &str = "hostile_peer_gets_error_completions_never_a_panic_a_hang_or_a_stray_byte";
const VICTIM: usize = 0;
const HOSTILE: usize = 1;
/// Bytes around every victim buffer that must keep their canary.
const GUARD: usize = 8192;
const CANARY: u8 = 0xA5;
/// The hostile rank's landing area for the victim's RDMA WRITEs.
const LANDING: usize = 1 << 20;
const LANDING_FILL: u8 = 0xEE;
/// Bytes of the rendezvous message the victim sends in the CTS cases.
const RNDV_BYTES: usize = 64 << 10;

/// What the hostile rank does in one case.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// SENDs these message bytes (a header and payload) through the NIC.
    Message(&'static str, fn() -> Vec<u8>),
    /// Publishes a raw ring packet: header words and payload bytes.
    Packet(&'static str, fn(dst_qpn: u32, src_qpn: u32) -> [u64; 7]),
    /// Answers the victim's RTS with a CTS for `(offset, len)` of the message.
    Cts(&'static str, u64, u64),
}

/// The victim's outcomes a case allows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// The victim's operation with the hostile rank fails.
    Error,
    /// The packet is refused towards the hostile rank; the victim may see nothing.
    ErrorOrNothing,
}

fn header(kind: u8, f: impl FnOnce(&mut Header)) -> Vec<u8> {
    let mut h = Header {
        kind,
        ..Header::default()
    };
    f(&mut h);
    h.encode().to_vec()
}

fn cases() -> Vec<(Attack, Expect)> {
    use Attack::{Message as M, Packet as P};
    use Expect::{Error as E, ErrorOrNothing as N};
    fn word0(kind: u8, flags: u8, code: u16, imm: u32) -> u64 {
        kind as u64 | (flags as u64) << 8 | (code as u64) << 16 | (imm as u64) << 32
    }
    fn qps(d: u32, s: u32) -> u64 {
        d as u64 | (s as u64) << 32
    }
    fn rkey_len(rkey: u32, len: u32) -> u64 {
        rkey as u64 | (len as u64) << 32
    }
    vec![
        // Message headers.
        (M("empty message", Vec::new), E),
        (M("10 bytes", || vec![MsgKind::Eager as u8; 10]), E),
        (M("RTS of 63 bytes", || vec![MsgKind::Rts as u8; 63]), E),
        (M("kind 0", || header(0, |_| {})), E),
        (M("kind 255", || header(255, |_| {})), E),
        (
            M("unknown flags", || {
                header(MsgKind::Credit as u8, |h| h.flags = 0xff)
            }),
            E,
        ),
        (
            M("credits u16::MAX", || {
                header(MsgKind::Credit as u8, |h| h.credits = u16::MAX)
            }),
            E,
        ),
        (
            M("eager size u64::MAX", || {
                let mut v = header(MsgKind::Eager as u8, |h| h.size = u64::MAX);
                v.extend_from_slice(&[1, 2, 3]);
                v
            }),
            E,
        ),
        (
            M("eager size larger than its payload", || {
                let mut v = header(MsgKind::Eager as u8, |h| h.size = 4096);
                v.extend_from_slice(&[7; 100]);
                v
            }),
            E,
        ),
        (
            M("RTS with a wrapping chunk", || {
                let mut v = header(MsgKind::Rts as u8, |h| {
                    h.size = u64::MAX;
                    h.flags = 2; // GET
                });
                let mut d = [0xffu8; 32];
                d[24..32].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
                v.extend_from_slice(&d);
                v
            }),
            E,
        ),
        (
            M("RTS with a partial chunk descriptor", || {
                let mut v = header(MsgKind::Rts as u8, |h| h.size = 1 << 20);
                v.extend_from_slice(&[0; 31]);
                v
            }),
            E,
        ),
        (
            M("CTS with a payload and every field at its maximum", || {
                let mut v = header(MsgKind::Cts as u8, |h| {
                    h.credits = 0;
                    h.tag = i32::MAX;
                    h.context = u32::MAX;
                    h.chunk = u32::MAX;
                    h.size = u64::MAX;
                    h.sreq = u64::MAX;
                    h.rreq = u64::MAX;
                    h.addr = u64::MAX;
                    h.rkey = u32::MAX;
                    h.len = u64::MAX;
                });
                v.push(0);
                v
            }),
            E,
        ),
        (
            M("ChunkReady whose region wraps", || {
                header(MsgKind::ChunkReady as u8, |h| {
                    h.size = u64::MAX;
                    h.len = u64::MAX;
                })
            }),
            E,
        ),
        // Ring packets.
        (
            P("packet kind 0", |d, s| {
                [word0(0, 3, 0, 0), qps(d, s), 0, 8, 0, 0, rkey_len(0, 8)]
            }),
            E,
        ),
        (
            P("packet kind 255, flags 0xff", |d, s| {
                [
                    word0(255, 0xff, 0, 0),
                    qps(d, s),
                    0,
                    8,
                    0,
                    0,
                    rkey_len(0, 8),
                ]
            }),
            E,
        ),
        (
            P("SEND payload_len u32::MAX", |d, s| {
                [
                    word0(1, 3, 0, 0),
                    qps(d, s),
                    0,
                    u64::MAX,
                    0,
                    0,
                    rkey_len(0, u32::MAX),
                ]
            }),
            E,
        ),
        (
            P("SEND payload_len MTU + 1", |d, s| {
                let mtu = 16 * 1024 - 64;
                [
                    word0(1, 3, 0, 0),
                    qps(d, s),
                    0,
                    1 << 20,
                    0,
                    0,
                    rkey_len(0, mtu + 1),
                ]
            }),
            E,
        ),
        (
            P("SEND offset u64::MAX", |d, s| {
                [
                    word0(1, 1, 0, 0),
                    qps(d, s),
                    0,
                    u64::MAX,
                    u64::MAX,
                    0,
                    rkey_len(0, 4096),
                ]
            }),
            E,
        ),
        (
            P("SEND payload past total_len", |d, s| {
                [word0(1, 3, 0, 0), qps(d, s), 0, 16, 0, 0, rkey_len(0, 4096)]
            }),
            E,
        ),
        (
            P("CMA descriptor of 17 bytes", |d, s| {
                [
                    word0(1, 1 | 2 | 8, 0, 0),
                    qps(d, s),
                    0,
                    4096,
                    0,
                    0,
                    rkey_len(0, 17),
                ]
            }),
            E,
        ),
        (
            P("READ request with a payload", |d, s| {
                [
                    word0(4, 3, 0, 0),
                    qps(d, s),
                    0,
                    64,
                    0,
                    0x1000,
                    rkey_len(1, 64),
                ]
            }),
            E,
        ),
        (
            P(
                "READ response for no READ, every field at its maximum",
                |d, s| {
                    [
                        word0(5, 3, u16::MAX, u32::MAX),
                        qps(d, s),
                        u64::MAX,
                        u64::MAX,
                        u64::MAX,
                        u64::MAX,
                        rkey_len(u32::MAX, u32::MAX),
                    ]
                },
            ),
            E,
        ),
        (
            P("WRITE to u64::MAX with a guessed key", |d, s| {
                [
                    word0(2, 3, 0, 0),
                    qps(d, s),
                    0,
                    8,
                    0,
                    u64::MAX - 3,
                    rkey_len(u32::MAX, 8),
                ]
            }),
            N,
        ),
        (
            P(
                "READ of the whole address space with a guessed key",
                |d, s| {
                    [
                        word0(4, 3, 0, 0),
                        qps(d, s),
                        0,
                        u64::MAX,
                        0,
                        0,
                        rkey_len(0x1234_5678, 0),
                    ]
                },
            ),
            N,
        ),
        (
            P("SEND with msn u64::MAX and code u16::MAX", |d, s| {
                [
                    word0(1, 3, u16::MAX, 0),
                    qps(d, s),
                    u64::MAX,
                    8,
                    0,
                    0,
                    rkey_len(0, 8),
                ]
            }),
            N,
        ),
        (
            P("packet to a queue pair it is not connected to", |_, s| {
                [
                    word0(1, 3, 0, 0),
                    qps(u32::MAX, s),
                    0,
                    8,
                    0,
                    0,
                    rkey_len(0, 8),
                ]
            }),
            N,
        ),
        // CTS against the victim's send.
        (Attack::Cts("CTS at 2^64 - 4096", u64::MAX - 4095, 4096), E),
        (
            Attack::Cts("CTS at the message's end", RNDV_BYTES as u64, 4096),
            E,
        ),
        (
            Attack::Cts("CTS straddling the end", RNDV_BYTES as u64 - 4096, 8192),
            E,
        ),
    ]
}

#[test]
fn hostile_peer_gets_error_completions_never_a_panic_a_hang_or_a_stray_byte() {
    if std::env::var(ROLE).as_deref() == Ok(NAME) {
        let boot = boot::from_env().expect("bootstrap");
        // PAGEWIRE_TEST_HOSTILE_CASES=3,26: only those cases (to see one fail alone).
        let only: Option<Vec<usize>> = std::env::var("PAGEWIRE_TEST_HOSTILE_CASES")
            .ok()
            .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).collect());
        for (i, (attack, expect)) in cases().into_iter().enumerate() {
            if only.as_ref().is_some_and(|o| !o.contains(&i)) {
                continue;
            }
            let nic = SoftNic::new(&*boot, SoftConfig::from_env().expect("config")).expect("NIC");
            if boot.rank() == VICTIM {
                victim(&*boot, nic, i, attack, expect);
            } else {
                hostile(&*boot, nic, attack);
            }
            boot.barrier().unwrap();
        }
        return;
    }
    let cases = std::env::var("PAGEWIRE_TEST_HOSTILE_CASES").unwrap_or_default();
    let outcome = launch(NAME, 2, &[("PAGEWIRE_TEST_HOSTILE_CASES", &cases)], None);
    assert!(
        outcome.success(),
        "the hostile-peer job failed: {outcome:?}"
    );
}

/// A buffer of `len` bytes inside guards of canary bytes.
struct Guarded {
    mem: Vec<u8>,
    len: usize,
}

impl Guarded {
    fn new(len: usize, fill: impl Fn(usize) -> u8) -> Guarded {
        let mut mem = vec![CANARY; len + 2 * GUARD];
        for i in 0..len {
            mem[GUARD + i] = fill(i);
        }
        Guarded { mem, len }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.mem[GUARD..].as_mut_ptr()
    }
    fn guards_intact(&self) -> bool {
        self.mem[..GUARD]
            .iter()
            .chain(&self.mem[GUARD + self.len..])
            .all(|&b| b == CANARY)
    }
}

fn victim(boot: &dyn Bootstrap, nic: SoftNic, case: usize, attack: Attack, expect: Expect) {
    let cfg = MsgConfig {
        rndv: RndvProtocol::Put,
        ..MsgConfig::default()
    };
    let mode = Box::new(CopyMode::new(CopyConfig::default()));
    let mut p2p = PointToPoint::new(Box::new(nic), boot, mode, cfg).expect("message layer");
    let what = match attack {
        Attack::Message(w, _) | Attack::Packet(w, _) | Attack::Cts(w, _, _) => w,
    };
    let mut recv = Guarded::new(4096, |_| 0x11);
    let mut send = Guarded::new(RNDV_BYTES, |i| (i * 7 + 3) as u8);
    // SAFETY: the request is tested to completion or cancelled below, while the buffers live.
    let id = unsafe {
        match attack {
            Attack::Cts(..) => {
                p2p.isend(HOSTILE, 5, 0, UserBuf::new(send.ptr(), RNDV_BYTES), false)
            }
            _ => p2p.irecv(
                Some(HOSTILE),
                None,
                0,
                UserBufMut::new(recv.ptr(), recv.len),
            ),
        }
    }
    .expect("posting");
    boot.barrier().unwrap(); // the hostile rank attacks now
                             // Generous: a request that must fail normally fails within milliseconds; one that may see
                             // nothing is watched this long before it is cancelled.
    let patience = match expect {
        Expect::Error => Duration::from_secs(30),
        Expect::ErrorOrNothing => Duration::from_secs(1),
    };
    let start = Instant::now();
    let outcome = loop {
        match p2p.test(id) {
            Ok(Some(r)) => break Some(r),
            Ok(None) if start.elapsed() > patience => break None,
            Ok(None) => std::thread::yield_now(),
            Err(e) => break Some(Err(e)),
        }
    };
    eprintln!("case {case} ({what}): {outcome:?}");
    match (&outcome, expect) {
        (Some(Err(Error::ProtocolViolation { peer: HOSTILE, .. })), _) => {}
        (Some(Err(Error::Communication { peer: HOSTILE, .. })), _) => {}
        (None, Expect::ErrorOrNothing) => {
            assert!(p2p.cancel(id), "case {case} ({what}): cancel");
        }
        _ => panic!("case {case} ({what}): expected an error completion, got {outcome:?}"),
    }
    assert!(
        recv.guards_intact(),
        "case {case} ({what}): bytes around the receive buffer changed"
    );
    assert!(
        recv.mem[GUARD..GUARD + recv.len].iter().all(|&b| b == 0x11),
        "case {case} ({what}): a malformed message was delivered"
    );
    boot.barrier().unwrap(); // the hostile rank checks its landing area
                             // Later operations with the hostile rank fail at once.
    let mut b = [0u8; 8];
    if outcome.is_some() {
        assert!(p2p.recv(Some(HOSTILE), None, 0, &mut b).is_err());
    }
}

/// The hostile rank's NIC, set up the way `PointToPoint::new` sets up its own.
struct Raw {
    nic: SoftNic,
    cq: u32,
    /// Its queue pair to the victim, and the victim's to it.
    qp: u32,
    victim_qpn: u32,
    recv: Vec<u8>,
    recv_key: u32,
    send: Vec<u8>,
    send_key: u32,
    landing: Vec<u8>,
    landing_rkey: u32,
}

fn raw_setup(boot: &dyn Bootstrap, nic: SoftNic) -> Raw {
    let size = boot.size();
    let cq = nic.create_cq(1 << 16).unwrap();
    let mut qps = Vec::new();
    let mut mine = Vec::new();
    for peer in 0..size {
        let q = nic.create_qp(peer, cq, cq, QpCaps::default()).unwrap();
        let ep = nic.endpoint(q).unwrap();
        mine.extend_from_slice(&(ep.0.len() as u32).to_le_bytes());
        mine.extend_from_slice(&ep.0);
        qps.push(q);
    }
    let all = boot.allgather(&mine).unwrap();
    let mut victim_qpn = 0;
    let mut at = 0;
    let blob = &all[VICTIM];
    for target in 0..size {
        let n = u32::from_le_bytes(blob[at..at + 4].try_into().unwrap()) as usize;
        let ep = Endpoint(blob[at + 4..at + 4 + n].to_vec());
        if target == HOSTILE {
            nic.connect(qps[VICTIM], &ep).unwrap();
            victim_qpn = u32::from_le_bytes(ep.0[4..8].try_into().unwrap());
        }
        at += 4 + n;
    }
    // `PointToPoint::new` sets up the local path next: this rank takes part, and stays off
    // it, so that everything it sends goes through the NIC.
    let local = LocalPath::new(boot, LocalSetting::Nic, 64 << 10).unwrap();
    assert!(local.is_none());
    let recv = vec![0u8; 64 << 10];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let recv_key = nic
        .register(recv.as_ptr() as u64, recv.len() as u64, access)
        .unwrap()
        .lkey;
    let send = vec![0u8; 64 << 10];
    let send_key = nic
        .register(send.as_ptr() as u64, send.len() as u64, access)
        .unwrap()
        .lkey;
    let landing = vec![LANDING_FILL; LANDING];
    let landing_rkey = nic
        .register(landing.as_ptr() as u64, LANDING as u64, access)
        .unwrap()
        .rkey;
    for i in 0..4u64 {
        let sge = [Sge {
            addr: recv.as_ptr() as u64 + i * 16384,
            len: 16384,
            lkey: recv_key,
        }];
        // SAFETY: `recv` is registered and lives, untouched, until the NIC is dropped.
        unsafe {
            nic.post_recv(
                qps[VICTIM],
                &RecvWr {
                    wr_id: i,
                    sgl: &sge,
                },
            )
        }
        .unwrap();
    }
    boot.barrier().unwrap(); // the end of `PointToPoint::new`
    Raw {
        nic,
        cq,
        qp: qps[VICTIM],
        victim_qpn,
        recv,
        recv_key,
        send,
        send_key,
        landing,
        landing_rkey,
    }
}

impl Raw {
    /// SENDs `bytes` to the victim.
    fn send(&mut self, bytes: &[u8]) {
        self.send[..bytes.len()].copy_from_slice(bytes);
        let sge = [Sge {
            addr: self.send.as_ptr() as u64,
            len: bytes.len() as u32,
            lkey: self.send_key,
        }];
        let wr = SendWr {
            wr_id: 100,
            opcode: Opcode::Send,
            sgl: if bytes.is_empty() { &[] } else { &sge },
            inline: false,
            signaled: false,
        };
        // SAFETY: `send` is registered and not touched until the next send, after this one
        // was taken (the victim answers or the case ends first).
        unsafe { self.nic.post_send(self.qp, &wr) }.unwrap();
        self.poll_a_while(Duration::from_millis(50));
    }

    /// Drives the NIC for `d` (its completions are not needed).
    fn poll_a_while(&self, d: Duration) {
        let start = Instant::now();
        let mut out = Vec::new();
        while start.elapsed() < d {
            out.clear();
            let _ = self.nic.poll_cq(self.cq, &mut out, 16);
            std::thread::yield_now();
        }
    }

    /// Waits for the victim's RTS; its header.
    fn rts(&self) -> Header {
        let start = Instant::now();
        let mut out = Vec::new();
        loop {
            out.clear();
            self.nic.poll_cq(self.cq, &mut out, 16).unwrap();
            for c in &out {
                if c.opcode == WcOpcode::Recv && c.status == WcStatus::Success {
                    let at = c.wr_id as usize * 16384;
                    let h = Header::decode(&self.recv[at..at + HEADER_BYTES]);
                    if h.kind() == Some(MsgKind::Rts) {
                        return h;
                    }
                }
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no RTS");
            std::thread::yield_now();
        }
    }
}

fn hostile(boot: &dyn Bootstrap, nic: SoftNic, attack: Attack) {
    let mut raw = raw_setup(boot, nic);
    let _ = raw.recv_key;
    boot.barrier().unwrap(); // the victim's request is posted
    match attack {
        Attack::Message(_, bytes) => raw.send(&bytes()),
        Attack::Packet(_, words) => {
            let w = words(raw.victim_qpn, raw.qp);
            assert!(raw.nic.publish_raw_packet(VICTIM, w, &[0x66; 256]));
        }
        Attack::Cts(_, offset, len) => {
            let rts = raw.rts();
            let mut cts = Header {
                kind: MsgKind::Cts as u8,
                flags: 4, // ALL_DONE
                ..Header::default()
            };
            cts.size = offset;
            cts.len = len;
            cts.addr = raw.landing.as_ptr() as u64 + (LANDING as u64 - len) / 2;
            cts.rkey = raw.landing_rkey;
            cts.sreq = rts.sreq;
            cts.rreq = 1;
            raw.send(&cts.encode());
        }
    }
    boot.barrier().unwrap(); // the victim has its outcome
    assert!(
        raw.landing.iter().all(|&b| b == LANDING_FILL),
        "bytes reached the hostile rank's landing area"
    );
}
