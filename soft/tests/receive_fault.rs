//! The soft NIC's receive-fault policies (`PAGEWIRE_SOFT_RNPF`;
//! Lesokhin17 §4-5): two ranks, a stream of SENDs into receive
//! buffers the NIC has never mapped, one in two (the others prefetched), under `rnr`,
//! `drop` and `backup` (with a ring large enough and one too small), on the CMA path and
//! on the staged path. Every byte must land in its own buffer, the receives must complete
//! in order, and the counters must say what the policy did.

use pagewire_nic::{Access, Advice, Nic, Opcode, WcOpcode, WcStatus};
use pagewire_sys::AnonMapping;
use pagewire_test_support::nic::{ranks, Rank};
use pagewire_test_support::pattern;

mod common;
use common::{post_recv, post_send, rw, sge};

const MESSAGES: usize = 24;

/// Message `i`'s length: 64 KiB (the CMA path pulls it with one kernel copy) or 6 KiB
/// (copied through the ring), in turn.
fn len_of(i: usize) -> usize {
    if i % 2 == 0 {
        64 << 10
    } else {
        6 << 10
    }
}

fn stream_body(r: &Rank) {
    let policy = std::env::var("PAGEWIRE_SOFT_RNPF").unwrap_or_else(|_| "rnr".into());
    let small_ring = std::env::var("PAGEWIRE_SOFT_BACKUP_RING").is_ok_and(|v| v == "64K");
    let qps = r.connect_all(false);
    let me = r.rank();
    let qp = qps[1 - me].unwrap();
    const SLOT: usize = 64 << 10;
    let before = r.nic.counters();
    if me == 1 {
        // One slot per message; the odd-numbered slots' pages are prefetched, so their
        // messages land at once; the even ones (the 64 KiB messages) fault.
        let bufs = AnonMapping::new(SLOT * MESSAGES).unwrap();
        let mr = r
            .nic
            .register(bufs.addr(), bufs.len() as u64, rw() | Access::ON_DEMAND)
            .unwrap();
        for i in (1..MESSAGES).step_by(2) {
            let at = bufs.addr() + (i * SLOT) as u64;
            r.nic
                .advise(mr.lkey, at, SLOT as u64, Advice::PrefetchWrite)
                .unwrap();
        }
        for i in 0..MESSAGES {
            let at = bufs.addr() + (i * SLOT) as u64;
            post_recv(r, qp, i as u64, &[sge(at, SLOT as u64, mr.lkey)]);
        }
        r.boot.barrier().unwrap();
        for i in 0..MESSAGES {
            let c = r.wait();
            assert_eq!(c.status, WcStatus::Success, "receive {i} under {policy}");
            assert_eq!(c.opcode, WcOpcode::Recv);
            assert_eq!(
                c.wr_id, i as u64,
                "receives complete in order under {policy}"
            );
            assert_eq!(c.byte_len as usize, len_of(i));
            let got = &bufs.as_slice()[i * SLOT..i * SLOT + len_of(i)];
            assert!(
                got == &pattern(i as u64, len_of(i))[..],
                "message {i} under {policy}"
            );
            assert!(
                bufs.as_slice()[i * SLOT + len_of(i)..(i + 1) * SLOT]
                    .iter()
                    .all(|&b| b == 0),
                "nothing past message {i}"
            );
        }
    } else {
        let mut src = AnonMapping::new(SLOT * MESSAGES).unwrap();
        let mr = r.nic.register(src.addr(), src.len() as u64, rw()).unwrap();
        for i in 0..MESSAGES {
            src.as_mut_slice()[i * SLOT..i * SLOT + len_of(i)]
                .copy_from_slice(&pattern(i as u64, len_of(i)));
        }
        r.boot.barrier().unwrap();
        for i in 0..MESSAGES {
            let at = src.addr() + (i * SLOT) as u64;
            post_send(
                r,
                qp,
                i as u64,
                Opcode::Send,
                &[sge(at, len_of(i) as u64, mr.lkey)],
            );
        }
        for i in 0..MESSAGES {
            let c = r.wait();
            assert_eq!(
                (c.status, c.wr_id),
                (WcStatus::Success, i as u64),
                "send {i}"
            );
        }
    }
    r.boot.barrier().unwrap();
    let c = r.nic.counters().since(&before);
    let rf = c.receive_fault;
    let faulting = (MESSAGES / 2) as u64;
    if me == 1 {
        // One fault per cold buffer; where messages are dropped (under `drop`, and under
        // `backup` with a full ring) a retransmission that comes before the fault is
        // resolved, or while the ring is still full, is dropped again and may file it again.
        assert!(
            c.npf_responder >= faulting,
            "a fault per cold buffer: {c:?}"
        );
        if policy != "drop" && !small_ring {
            assert_eq!(
                c.npf_responder, faulting,
                "one fault per cold buffer: {c:?}"
            );
        }
        match policy.as_str() {
            "rnr" => {
                assert!(c.rnr_nacks_sent >= faulting, "{c:?}");
                assert_eq!((rf.dropped, rf.backed_up), (0, 0), "{rf:?}");
            }
            "drop" => {
                assert!(
                    rf.dropped >= faulting,
                    "each cold message dropped at least once: {rf:?}"
                );
                assert_eq!((rf.backed_up, c.rnr_nacks_sent), (0, 0), "{c:?}");
            }
            "backup" if small_ring => {
                // A 64 KiB ring holds one 64 KiB message: the next cold one finds it full.
                // A dropped message's retransmission may find the ring full again and be
                // dropped again, so drops can outnumber the messages that were not parked.
                assert!(rf.backed_up >= 1 && rf.backup_full >= 1, "{rf:?}");
                assert!(rf.backed_up < faulting, "{rf:?}");
                assert!(rf.backed_up + rf.dropped >= faulting, "{rf:?}");
                assert_eq!(rf.backup_bytes, rf.backed_up * (64 << 10), "{rf:?}");
            }
            "backup" => {
                // A 2 MiB ring holds all twelve cold 64 KiB messages.
                assert_eq!(
                    rf.backed_up, faulting,
                    "every cold message backed up: {rf:?}"
                );
                assert_eq!(rf.backup_bytes, faulting * (64 << 10), "{rf:?}");
                assert_eq!((rf.dropped, c.rnr_nacks_sent), (0, 0), "{c:?}");
            }
            other => panic!("unexpected policy {other}"),
        }
    } else {
        // Only dropped requests wait for the timer: at least one per dropped message.
        match policy.as_str() {
            "drop" => assert!(rf.timeout_retransmits >= faulting, "rank 0: {rf:?}"),
            "backup" if small_ring => assert!(rf.timeout_retransmits >= 1, "rank 0: {rf:?}"),
            _ => assert_eq!(rf.timeout_retransmits, 0, "rank 0: {rf:?}"),
        }
    }
    r.boot.barrier().unwrap();
}

/// Runs the body on two ranks; `name` is the calling test's own name (the ranks are this
/// test binary started again on it).
fn run(name: &str, env: &[(&str, &str)]) {
    ranks(name, 2, env, stream_body);
}

#[test]
fn under_rnr_every_faulting_send_is_refused_and_retransmitted() {
    run(
        "under_rnr_every_faulting_send_is_refused_and_retransmitted",
        &[("PAGEWIRE_SOFT_RNPF", "rnr")],
    );
}

#[test]
fn under_drop_every_faulting_send_is_dropped_once_and_resent_by_the_timer() {
    run(
        "under_drop_every_faulting_send_is_dropped_once_and_resent_by_the_timer",
        &[
            ("PAGEWIRE_SOFT_RNPF", "drop"),
            ("PAGEWIRE_SOFT_ACK_TIMEOUT", "10"),
        ],
    );
}

#[test]
fn under_backup_every_faulting_send_goes_through_the_ring_in_order() {
    run(
        "under_backup_every_faulting_send_goes_through_the_ring_in_order",
        &[
            ("PAGEWIRE_SOFT_RNPF", "backup"),
            ("PAGEWIRE_SOFT_BACKUP_RING", "2M"),
        ],
    );
}

#[test]
fn under_backup_a_full_ring_drops_and_the_timer_resends() {
    run(
        "under_backup_a_full_ring_drops_and_the_timer_resends",
        &[
            ("PAGEWIRE_SOFT_RNPF", "backup"),
            ("PAGEWIRE_SOFT_BACKUP_RING", "64K"),
            ("PAGEWIRE_SOFT_ACK_TIMEOUT", "10"),
        ],
    );
}

#[test]
fn under_backup_on_the_staged_path_multi_packet_sends_are_parked_whole() {
    run(
        "under_backup_on_the_staged_path_multi_packet_sends_are_parked_whole",
        &[
            ("PAGEWIRE_SOFT_RNPF", "backup"),
            ("PAGEWIRE_SOFT_BACKUP_RING", "2M"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
    );
}

#[test]
fn under_drop_on_the_staged_path_every_byte_arrives() {
    run(
        "under_drop_on_the_staged_path_every_byte_arrives",
        &[
            ("PAGEWIRE_SOFT_RNPF", "drop"),
            ("PAGEWIRE_SOFT_ACK_TIMEOUT", "10"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
    );
}
