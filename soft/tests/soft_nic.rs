//! Multi-process tests of the soft NIC: real ranks under the built-in launcher checking
//! bytes, counters and error completions.

use pagewire_nic::{
    Access, Advice, Nic, Opcode, Region, SendWr, Sge, WcOpcode, WcStatus, PAGE_SIZE,
};
use pagewire_sys::Error;
use pagewire_sys::{vm_locked_and_resident, AnonMapping};
use pagewire_test_support::nic::{launch, ranks, Rank};
use pagewire_test_support::{pattern, OUT, ROLE};

mod common;
use common::{post_recv, post_send, rw, sge};

/// Sizes from 0 B to 64 MiB, each at a random offset, moved by WRITE, READ and SEND between
/// two ranks; every byte checked on the other side.
fn byte_exact_body(r: &Rank) {
    const MAX: u64 = 64 << 20;
    let qps = r.connect_all(false);
    let me = r.rank();
    let peer = 1 - me;
    let qp = qps[peer].unwrap();
    let span = MAX as usize + 2 * PAGE_SIZE as usize;
    let mut src = AnonMapping::new(span).unwrap();
    let mut dst = AnonMapping::new(span).unwrap();
    let src_mr = r.nic.register(src.addr(), span as u64, rw()).unwrap();
    let dst_mr = r.nic.register(dst.addr(), span as u64, rw()).unwrap();
    let remote = r.exchange(&dst_mr);
    let remote_src = r.exchange(&src_mr);
    let sizes = [
        0u64,
        1,
        7,
        4095,
        4096,
        16321,
        65_537,
        (1 << 20) + 13,
        8 << 20,
        MAX,
    ];
    for (i, &len) in sizes.iter().enumerate() {
        let seed = 1000 + i as u64;
        let src_off = (pattern(seed, 8)[3] as u64 * 37) % PAGE_SIZE;
        let dst_off = (pattern(seed, 8)[5] as u64 * 53) % PAGE_SIZE;
        // Rank 0 fills its source; rank 1 fills its source with another stream (for READ).
        let data = pattern(seed * 2 + me as u64, len as usize);
        src.as_mut_slice()[src_off as usize..(src_off + len) as usize].copy_from_slice(&data);
        // The landing zone and one byte either side start zeroed, to catch overruns.
        dst.as_mut_slice()[..(dst_off + len) as usize + 1].fill(0);
        r.boot.barrier().unwrap();
        // WRITE: rank 0 -> rank 1's dst; READ: rank 0 <- rank 1's src.
        if me == 0 {
            let (raddr, rkey, _) = remote[1];
            post_send(
                r,
                qp,
                1,
                Opcode::RdmaWrite {
                    remote_addr: raddr + dst_off,
                    rkey,
                },
                &[sge(src.addr() + src_off, len, src_mr.lkey)],
            );
            let c = r.wait();
            assert_eq!(
                (c.wr_id, c.status, c.opcode),
                (1, WcStatus::Success, WcOpcode::RdmaWrite),
                "len {len}"
            );
            let (saddr, skey, _) = remote_src[1];
            post_send(
                r,
                qp,
                2,
                Opcode::RdmaRead {
                    remote_addr: saddr + src_off,
                    rkey: skey,
                },
                &[sge(dst.addr() + dst_off, len, dst_mr.lkey)],
            );
            let c = r.wait();
            assert_eq!(
                (c.status, c.opcode),
                (WcStatus::Success, WcOpcode::RdmaRead),
                "len {len}"
            );
            let expect = pattern(seed * 2 + 1, len as usize);
            assert!(
                dst.as_slice()[dst_off as usize..(dst_off + len) as usize] == expect[..],
                "READ bytes differ at len {len}"
            );
        }
        r.boot.barrier().unwrap();
        if me == 1 {
            let expect = pattern(seed * 2, len as usize);
            assert!(
                dst.as_slice()[dst_off as usize..(dst_off + len) as usize] == expect[..],
                "WRITE bytes differ at len {len}"
            );
            // Bytes around the target are untouched (still zero from the fresh mapping).
            if dst_off > 0 {
                assert_eq!(
                    dst.as_slice()[dst_off as usize - 1],
                    0,
                    "byte before a WRITE touched"
                );
            }
            assert_eq!(
                dst.as_slice()[(dst_off + len) as usize],
                0,
                "byte after a WRITE touched"
            );
        }
        r.boot.barrier().unwrap();
        // SEND: rank 1 -> rank 0, into a receive at an offset.
        if me == 0 {
            post_recv(r, qp, 3, &[sge(dst.addr() + dst_off, len + 1, dst_mr.lkey)]);
        }
        r.boot.barrier().unwrap();
        if me == 1 {
            post_send(
                r,
                qp,
                4,
                Opcode::SendWithImm(len as u32),
                &[sge(src.addr() + src_off, len, src_mr.lkey)],
            );
            let c = r.wait();
            assert_eq!((c.wr_id, c.status), (4, WcStatus::Success));
        } else {
            let c = r.wait();
            assert_eq!(
                (c.wr_id, c.status, c.opcode, c.byte_len as u64, c.imm),
                (3, WcStatus::Success, WcOpcode::Recv, len, Some(len as u32))
            );
            let expect = pattern(seed * 2 + 1, len as usize);
            assert!(
                dst.as_slice()[dst_off as usize..(dst_off + len) as usize] == expect[..],
                "SEND bytes differ at len {len}"
            );
        }
        r.boot.barrier().unwrap();
    }
    // Across the job, bytes moved by the path in force and none by the other.
    let c = r.nic.counters();
    let mut mine = c.bytes_cma.to_le_bytes().to_vec();
    mine.extend_from_slice(&c.bytes_staged.to_le_bytes());
    let all = r.boot.allgather(&mine).unwrap();
    let sum = |i: usize| -> u64 {
        all.iter()
            .map(|v| u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().unwrap()))
            .sum()
    };
    if r.nic.uses_cma(peer) {
        assert!(sum(0) > 0);
    } else {
        assert_eq!(sum(0), 0, "forced staging moved bytes by CMA");
        assert!(sum(1) > 0);
    }
}

#[test]
fn write_read_send_are_byte_exact_from_0_to_64_mib() {
    ranks(
        "write_read_send_are_byte_exact_from_0_to_64_mib",
        2,
        &[("PAGEWIRE_MEMLOCK_LIMIT", "1G")],
        byte_exact_body,
    );
}

#[test]
fn the_forced_staged_path_gives_the_same_bytes() {
    ranks(
        "the_forced_staged_path_gives_the_same_bytes",
        2,
        &[
            ("PAGEWIRE_MEMLOCK_LIMIT", "1G"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
        byte_exact_body,
    );
}

/// Bad keys, stale keys, out-of-bounds and missing rights end in error completions at the
/// initiator, and the target memory is untouched.
fn protection_body(r: &Rank) {
    let me = r.rank();
    let mut target = AnonMapping::new(1 << 16).unwrap();
    target.as_mut_slice().fill(0xaa);
    let local = AnonMapping::new(1 << 16).unwrap();
    let lmr = r.nic.register(local.addr(), 1 << 16, rw()).unwrap();
    // A: writable; B: read-only remotely; C: registered then deregistered (stale).
    let a = r.nic.register(target.addr(), 4096, rw()).unwrap();
    let b = r
        .nic
        .register(
            target.addr() + 4096,
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let c = r.nic.register(target.addr() + 8192, 4096, rw()).unwrap();
    r.nic.deregister(c.lkey).unwrap();
    let d = r
        .nic
        .register(
            target.addr() + 8192,
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let ra = r.exchange(&a);
    let rb = r.exchange(&b);
    let rc = r.exchange(&c);
    let rd = r.exchange(&d);
    let cases: Vec<(&str, Opcode, WcStatus)> = vec![
        (
            "guessed key",
            Opcode::RdmaWrite {
                remote_addr: ra[1].0,
                rkey: ra[1].1 ^ 0x5a5a_0000,
            },
            WcStatus::RemoteAccessError,
        ),
        (
            "stale key",
            Opcode::RdmaWrite {
                remote_addr: rc[1].0,
                rkey: rc[1].1,
            },
            WcStatus::RemoteAccessError,
        ),
        (
            "out of bounds",
            Opcode::RdmaWrite {
                remote_addr: ra[1].0 + 4000,
                rkey: ra[1].1,
            },
            WcStatus::RemoteAccessError,
        ),
        (
            "write without REMOTE_WRITE",
            Opcode::RdmaWrite {
                remote_addr: rb[1].0,
                rkey: rb[1].1,
            },
            WcStatus::RemoteAccessError,
        ),
        (
            "read without REMOTE_READ",
            Opcode::RdmaRead {
                remote_addr: rd[1].0,
                rkey: rd[1].1,
            },
            WcStatus::RemoteAccessError,
        ),
    ];
    for (what, op, expect) in cases {
        let qp = r.fresh_pair(0, 1);
        if me == 0 {
            post_send(r, qp, 10, op, &[sge(local.addr(), 200, lmr.lkey)]);
            let c = r.wait();
            assert_eq!(c.status, expect, "{what}");
            // The queue pair is now in the error state: what follows is flushed.
            post_send(
                r,
                qp,
                11,
                Opcode::RdmaWrite {
                    remote_addr: ra[1].0,
                    rkey: ra[1].1,
                },
                &[sge(local.addr(), 8, lmr.lkey)],
            );
            assert_eq!(
                r.wait().status,
                WcStatus::WrFlushError,
                "{what}: flush after error"
            );
        }
        r.boot.barrier().unwrap();
        if me == 1 {
            assert!(
                target.as_slice()[..12288].iter().all(|&x| x == 0xaa),
                "{what}: target memory touched"
            );
        }
    }
    // A local key that does not cover the buffer: local protection error.
    let qp = r.fresh_pair(0, 1);
    if me == 0 {
        post_send(
            r,
            qp,
            20,
            Opcode::RdmaWrite {
                remote_addr: ra[1].0,
                rkey: ra[1].1,
            },
            &[sge(local.addr() + 65000, 1000, lmr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::LocalProtectionError);
    }
    r.boot.barrier().unwrap();
    if me == 1 {
        assert!(target.as_slice()[..4096].iter().all(|&x| x == 0xaa));
    }
    // A send longer than the posted receive: the receiver sees a length error and nothing
    // past its buffer is written; the sender a remote invalid request.
    let qp = r.fresh_pair(0, 1);
    if me == 1 {
        post_recv(r, qp, 30, &[sge(target.addr(), 100, a.lkey)]);
    }
    r.boot.barrier().unwrap();
    if me == 0 {
        post_send(
            r,
            qp,
            31,
            Opcode::Send,
            &[sge(local.addr(), 4000, lmr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::RemoteInvalidRequest);
    } else {
        let c = r.wait();
        assert_eq!((c.wr_id, c.status), (30, WcStatus::LocalLengthError));
        assert!(
            target.as_slice()[..4096].iter().all(|&x| x == 0xaa),
            "truncated receive overran"
        );
    }
    r.boot.barrier().unwrap();
}

#[test]
fn bad_keys_bounds_and_rights_fail_without_touching_memory() {
    ranks(
        "bad_keys_bounds_and_rights_fail_without_touching_memory",
        2,
        &[],
        protection_body,
    );
}

/// With a translation cache a key is checked against the table before
/// the cache is looked up: the same errors, on both paths.
#[test]
fn bad_keys_bounds_and_rights_fail_the_same_with_a_translation_cache() {
    ranks(
        "bad_keys_bounds_and_rights_fail_the_same_with_a_translation_cache",
        2,
        &[("PAGEWIRE_SOFT_TPT_CACHE", "4")],
        protection_body,
    );
}

#[test]
fn bad_keys_fail_the_same_with_a_translation_cache_on_the_staged_path() {
    ranks(
        "bad_keys_fail_the_same_with_a_translation_cache_on_the_staged_path",
        2,
        &[
            ("PAGEWIRE_SOFT_TPT_CACHE", "4"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
        protection_body,
    );
}

/// A work request over the NIC's `max_msg_sz` (2 GiB: a completion's byte count is 32
/// bits) is refused when posted, naming the limit, before any byte moves.
fn oversized_body(r: &Rank) {
    let qps = r.connect_all(true);
    let qp = qps[0].expect("loopback");
    let buf = AnonMapping::new(4096).unwrap();
    let mr = r.nic.register(buf.addr(), 4096, rw()).unwrap();
    // Three entries of 1 GiB: each fits its 32-bit length, together they do not fit.
    let big = sge(buf.addr(), 1 << 30, mr.lkey);
    let wr = SendWr {
        wr_id: 1,
        opcode: Opcode::RdmaWrite {
            remote_addr: buf.addr(),
            rkey: mr.rkey,
        },
        sgl: &[big, big, big],
        inline: false,
        signaled: true,
    };
    // SAFETY (test): refused at posting; nothing is read.
    let e = unsafe { r.nic.post_send(qp, &wr) }.unwrap_err();
    assert!(
        e.to_string()
            .contains("at most 2147483648 bytes per work request"),
        "{e}"
    );
    let mut out = Vec::new();
    assert_eq!(
        r.nic.poll_cq(r.cq, &mut out, 1).unwrap(),
        0,
        "nothing was posted"
    );
    r.nic.deregister(mr.lkey).unwrap();
}

#[test]
fn a_work_request_over_2_gib_is_refused_when_posted() {
    ranks(
        "a_work_request_over_2_gib_is_refused_when_posted",
        1,
        &[],
        oversized_body,
    );
}

fn zero_length_body(r: &Rank) {
    let qps = r.connect_all(true);
    let me = r.rank();
    let buf = AnonMapping::new(4096).unwrap();
    let mr = r.nic.register(buf.addr(), 4096, rw()).unwrap();
    let peer = 1 - me;
    let qp = qps[peer].unwrap();
    post_recv(r, qp, 1, &[sge(buf.addr(), 0, mr.lkey)]);
    r.boot.barrier().unwrap();
    // Zero-length RDMA checks no key (IB semantics): a bogus key succeeds and moves nothing.
    post_send(
        r,
        qp,
        2,
        Opcode::RdmaWrite {
            remote_addr: 0,
            rkey: 0xdead_beef,
        },
        &[],
    );
    post_send(
        r,
        qp,
        3,
        Opcode::RdmaRead {
            remote_addr: 0,
            rkey: 0xdead_beef,
        },
        &[],
    );
    post_send(r, qp, 4, Opcode::Send, &[]);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let c = r.wait();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        seen.push((c.wr_id, c.byte_len));
    }
    seen.sort();
    assert_eq!(seen, vec![(1, 0), (2, 0), (3, 0), (4, 0)]);
    // Loopback to oneself works like any peer.
    let lq = qps[me].unwrap();
    post_recv(r, lq, 5, &[sge(buf.addr() + 100, 10, mr.lkey)]);
    post_send(r, lq, 6, Opcode::Send, &[sge(buf.addr(), 10, mr.lkey)]);
    let mut ids = [r.wait().wr_id, r.wait().wr_id];
    ids.sort();
    assert_eq!(ids, [5, 6]);
    r.boot.barrier().unwrap();
}

#[test]
fn zero_length_operations_and_loopback_complete() {
    ranks(
        "zero_length_operations_and_loopback_complete",
        2,
        &[],
        zero_length_body,
    );
}

fn dead_peer_body(r: &Rank) {
    let qps = r.connect_all(false);
    if r.rank() == 1 {
        return; // exits at once: the peer is gone
    }
    let buf = AnonMapping::new(4096).unwrap();
    let mr = r.nic.register(buf.addr(), 4096, rw()).unwrap();
    let qp = qps[1].unwrap();
    let start = std::time::Instant::now();
    post_send(r, qp, 1, Opcode::Send, &[sge(buf.addr(), 64, mr.lkey)]);
    let c = r.wait();
    assert_eq!(c.status, WcStatus::RetryExceeded, "{c:?}");
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
    post_send(r, qp, 2, Opcode::Send, &[sge(buf.addr(), 64, mr.lkey)]);
    assert_eq!(r.wait().status, WcStatus::WrFlushError);
}

#[test]
fn posting_to_a_dead_peer_completes_with_an_error_not_a_hang() {
    ranks(
        "posting_to_a_dead_peer_completes_with_an_error_not_a_hang",
        2,
        &[],
        dead_peer_body,
    );
}

/// A staged RDMA WRITE of 4 MiB (256 packets) to a peer that exits: the
/// WRITE's own packets fill the ring, so no request ahead of it awaits a response whose
/// liveness check would end it. It ends with RETRY_EXC_ERR instead of waiting for ever
/// for room in a ring nobody drains.
fn dead_peer_full_ring_body(r: &Rank) {
    const LEN: usize = 4 << 20;
    let qps = r.connect_all(false);
    let buf = AnonMapping::new(LEN).unwrap();
    let mr = r.nic.register(buf.addr(), LEN as u64, rw()).unwrap();
    let remote = r.exchange(&mr);
    let pids = r.boot.allgather(&std::process::id().to_le_bytes()).unwrap();
    if r.rank() == 1 {
        // Gone at once, its region never deregistered (as if killed): the WRITE is valid,
        // and only liveness can end it. `_exit`, not `exit`: no exit handler runs.
        // SAFETY (test): ends the process at once; nothing after it runs.
        unsafe { libc::_exit(0) };
    }
    // Post only once the peer is gone: while it lives, its driver thread may take the whole
    // WRITE and acknowledge it (one-sided, as an HCA would), which ended this test with
    // success under load.
    let peer = u32::from_le_bytes(pids[1][..4].try_into().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !process_gone(peer) {
        assert!(std::time::Instant::now() < deadline, "rank 1 did not exit");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (addr, rkey, _) = remote[1];
    let start = std::time::Instant::now();
    post_send(
        r,
        qps[1].unwrap(),
        1,
        Opcode::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        &[sge(buf.addr(), LEN as u64, mr.lkey)],
    );
    let c = r.wait();
    assert_eq!(c.status, WcStatus::RetryExceeded, "{c:?}");
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn a_write_filling_the_ring_to_a_dead_peer_completes_with_an_error_not_a_hang() {
    ranks(
        "a_write_filling_the_ring_to_a_dead_peer_completes_with_an_error_not_a_hang",
        2,
        &[("PAGEWIRE_SOFT_DMA", "staged")],
        dead_peer_full_ring_body,
    );
}

/// The target deregisters its 64 MiB region in the middle of a staged RDMA
/// WRITE (or READ, with `PAGEWIRE_TEST_OP=read`) and hands the range back to its application:
/// new pages, new bytes. To be sure the transfer is mid-way, the initiator posts it, makes
/// one engine pass and stops itself (SIGSTOP); the target then takes what the ring between
/// them holds (at most 1 MiB of 64), deregisters, and lets the initiator go on after
/// `PAGEWIRE_TEST_STOP_SECS` (6: longer than deregistration used to wait). The transfer ends
/// with a remote access error; not one of its bytes lands in the new mapping, and a READ
/// brings back none of the new bytes.
fn deregistered_mid_transfer_body(r: &Rank) {
    const LEN: usize = 64 << 20;
    const OLD: u8 = 0x5a;
    const NEW: u8 = 0xc5;
    let read = std::env::var("PAGEWIRE_TEST_OP").as_deref() == Ok("read");
    let stop_secs: u64 =
        std::env::var("PAGEWIRE_TEST_STOP_SECS").map_or(0, |v| v.parse().expect("seconds"));
    let qps = r.connect_all(false);
    let me = r.rank();
    let mut buf = AnonMapping::new(LEN).unwrap();
    // The initiator's source (WRITE) or the target's region (READ) holds the old bytes.
    if (me == 0) != read {
        buf.as_mut_slice().fill(OLD);
    }
    let mr = r.nic.register(buf.addr(), LEN as u64, rw()).unwrap();
    let remote = r.exchange(&mr);
    let pids = r.boot.allgather(&std::process::id().to_le_bytes()).unwrap();
    if me == 0 {
        let (remote_addr, rkey, _) = remote[1];
        let opcode = if read {
            Opcode::RdmaRead { remote_addr, rkey }
        } else {
            Opcode::RdmaWrite { remote_addr, rkey }
        };
        post_send(
            r,
            qps[1].unwrap(),
            1,
            opcode,
            &[sge(buf.addr(), LEN as u64, mr.lkey)],
        );
        r.nic.poll_cq(r.cq, &mut Vec::new(), 1).unwrap();
        // SAFETY (test): stops this process until rank 1 sends SIGCONT.
        assert_eq!(unsafe { libc::raise(libc::SIGSTOP) }, 0);
        let c = r.wait();
        assert_eq!(c.status, WcStatus::RemoteAccessError, "{c:?}");
        if read {
            assert!(
                !buf.as_slice().contains(&NEW),
                "a READ brought back bytes of the target's new mapping"
            );
        }
    } else {
        let initiator = u32::from_le_bytes(pids[0][..4].try_into().unwrap());
        let start = std::time::Instant::now();
        while !process_stopped(initiator) {
            assert!(start.elapsed() < std::time::Duration::from_secs(60));
            std::thread::yield_now();
        }
        // Take what the ring holds: until nothing more moves for 50 ms.
        let mut out = Vec::new();
        let (mut moved, mut quiet_since) = (0, std::time::Instant::now());
        while quiet_since.elapsed() < std::time::Duration::from_millis(50) {
            r.nic.poll_cq(r.cq, &mut out, 1).unwrap();
            let now = r.nic.counters().bytes_staged;
            if now != moved {
                (moved, quiet_since) = (now, std::time::Instant::now());
            }
        }
        assert!(
            moved > 0 && moved < LEN as u64,
            "the transfer is mid-way ({moved} bytes moved)"
        );
        let t0 = std::time::Instant::now();
        r.nic.deregister(mr.lkey).unwrap();
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(2),
            "a staged transfer holds the target's region only while a packet moves"
        );
        buf.discard(0, LEN).unwrap();
        buf.as_mut_slice().fill(NEW);
        std::thread::sleep(std::time::Duration::from_secs(stop_secs));
        // SAFETY (test): resumes the job's other rank, a child of the same launcher.
        assert_eq!(
            unsafe { libc::kill(initiator as libc::pid_t, libc::SIGCONT) },
            0
        );
    }
    // Rank 1's driver thread refuses the rest of the transfer while it waits here.
    r.boot.barrier().unwrap();
    if me == 1 {
        assert!(
            buf.as_slice().iter().all(|&b| b == NEW),
            "a byte of the transfer landed in the new mapping"
        );
    } else {
        r.nic.deregister(mr.lkey).unwrap();
    }
}

#[test]
fn a_write_into_a_region_deregistered_mid_transfer_fails_and_leaves_the_new_mapping_alone() {
    ranks(
        "a_write_into_a_region_deregistered_mid_transfer_fails_and_leaves_the_new_mapping_alone",
        2,
        &[
            ("PAGEWIRE_MEMLOCK_LIMIT", "1G"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
        deregistered_mid_transfer_body,
    );
}

#[test]
fn the_same_with_the_initiator_stopped_for_6_s() {
    ranks(
        "the_same_with_the_initiator_stopped_for_6_s",
        2,
        &[
            ("PAGEWIRE_MEMLOCK_LIMIT", "1G"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
            ("PAGEWIRE_TEST_STOP_SECS", "6"),
        ],
        deregistered_mid_transfer_body,
    );
}

#[test]
fn a_read_of_a_region_deregistered_mid_transfer_fails_and_returns_none_of_the_new_bytes() {
    ranks(
        "a_read_of_a_region_deregistered_mid_transfer_fails_and_returns_none_of_the_new_bytes",
        2,
        &[
            ("PAGEWIRE_MEMLOCK_LIMIT", "1G"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
            ("PAGEWIRE_TEST_OP", "read"),
        ],
        deregistered_mid_transfer_body,
    );
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`).
fn process_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The state follows the command name, which is in parentheses.
    stat.rsplit(')')
        .next()
        .unwrap()
        .trim_start()
        .starts_with('T')
}

/// Whether process `pid` has exited (gone, or a zombie its parent has not reaped yet).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            state.starts_with('Z') || state.starts_with('X')
        }
    }
}

fn memlock_body(r: &Rank) {
    let (limit, _) = r.nic.memlock();
    assert_eq!(
        limit.bytes,
        Some(64 << 10),
        "the rank runs under a 64 KiB memlock limit"
    );
    let buf = AnonMapping::new(1 << 20).unwrap();
    let first = r.nic.register(buf.addr(), 64 << 10, rw()).unwrap();
    // Overlapping pages are not charged twice.
    let overlap = r.nic.register(buf.addr() + 4096, 8192, rw()).unwrap();
    let e = r
        .nic
        .register(buf.addr() + (64 << 10), 4096, rw())
        .unwrap_err();
    match &e {
        Error::MemlockLimit {
            requested, limit, ..
        } => assert_eq!((*requested, *limit), (4096, 64 << 10)),
        other => panic!("expected a memlock error, got {other}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("ulimit -l") && msg.contains("65536"), "{msg}");
    // ODP pins nothing, so it is not limited.
    let odp = r
        .nic
        .register(buf.addr(), 1 << 20, rw() | Access::ON_DEMAND)
        .unwrap();
    r.nic.deregister(odp.lkey).unwrap();
    r.nic.deregister(first.lkey).unwrap();
    r.nic.deregister(overlap.lkey).unwrap();
    assert!(
        r.nic.register(buf.addr() + (64 << 10), 4096, rw()).is_ok(),
        "deregistration gives the budget back"
    );
}

#[test]
fn rlimit_memlock_is_enforced_with_a_clear_error() {
    let name = "rlimit_memlock_is_enforced_with_a_clear_error";
    if std::env::var(ROLE).is_ok() {
        ranks(name, 1, &[], memlock_body);
        return;
    }
    let outcome = launch(name, 1, &[], Some(&["prlimit", "--memlock=65536:65536"]));
    assert!(outcome.success(), "{outcome:?}");
}

fn vmlck_body(r: &Rank) {
    let buf = AnonMapping::new(8 << 20).unwrap();
    let (lck0, _) = vm_locked_and_resident().unwrap();
    let a = r.nic.register(buf.addr(), 4 << 20, rw()).unwrap();
    let (lck1, _) = vm_locked_and_resident().unwrap();
    assert_eq!(lck1 - lck0, 4 << 20, "VmLck rises by the registered bytes");
    let b = r
        .nic
        .register(buf.addr() + (2 << 20), 4 << 20, rw())
        .unwrap();
    let (lck2, _) = vm_locked_and_resident().unwrap();
    assert_eq!(lck2 - lck0, 6 << 20, "overlap is pinned once");
    r.nic.deregister(a.lkey).unwrap();
    let (lck3, _) = vm_locked_and_resident().unwrap();
    assert_eq!(
        lck3 - lck0,
        4 << 20,
        "pages still used by the other region stay pinned"
    );
    r.nic.deregister(b.lkey).unwrap();
    let (lck4, _) = vm_locked_and_resident().unwrap();
    assert_eq!(lck4, lck0, "VmLck falls back on deregistration");
    let c = r.nic.counters();
    assert_eq!((c.pinned_now, c.pinned_peak), (0, 6 << 20));
    // Unmapped memory cannot be registered (pinned); the error says so.
    let hole = AnonMapping::new(1 << 16)
        .unwrap()
        .unmap_range(0, 1 << 16)
        .unwrap();
    let e = r.nic.register(hole.hole_addr(), 4096, rw()).unwrap_err();
    assert!(matches!(e, Error::UnmappedRange { .. }), "{e}");
    assert!(
        r.nic.register(buf.addr(), 0, rw()).is_err(),
        "zero-length registration"
    );
    assert!(
        r.nic
            .register(buf.addr(), 4096, Access::REMOTE_WRITE)
            .is_err(),
        "REMOTE_WRITE without LOCAL_WRITE"
    );
}

#[test]
fn vmlck_rises_on_registration_and_falls_on_deregistration() {
    ranks(
        "vmlck_rises_on_registration_and_falls_on_deregistration",
        1,
        &[("PAGEWIRE_MEMLOCK_LIMIT", "64M"), ("PAGEWIRE_PIN", "mlock")],
        vmlck_body,
    );
}

/// With long-term pins (the default where io_uring works) a registration does
/// not `mlock` (VmLck stays), is charged to the memlock account all the same, and stays
/// bound to the pages it pinned. After the application discards a registered range and
/// writes new bytes there: a peer's READ through the region gets the old bytes, its WRITE
/// lands where the application cannot see it (and a second READ finds it there), and a
/// WRITE *from* a replaced local region sends its old bytes: what an HCA does (Wyckoff05).
fn bound_body(r: &Rank) {
    const LEN: usize = 64 << 10;
    let qps = r.connect_all(false);
    let me = r.rank();
    let qp = qps[1 - me].unwrap();
    let mut buf = AnonMapping::new(LEN).unwrap();
    buf.as_mut_slice().fill(0xaa);
    let (lck0, _) = vm_locked_and_resident().unwrap();
    let mr = r.nic.register(buf.addr(), LEN as u64, rw()).unwrap();
    let (lck1, _) = vm_locked_and_resident().unwrap();
    assert_eq!(lck1, lck0, "a long-term pin does not mlock");
    assert_eq!(r.nic.counters().pinned_now, LEN as u64, "but it is charged");
    let mut land = AnonMapping::new(LEN).unwrap();
    let land_mr = r.nic.register(land.addr(), LEN as u64, rw()).unwrap();
    let remote = r.exchange(&mr);
    let (raddr, rkey, _) = remote[1 - me];
    // Both replace their registered range: new pages, new bytes, registration kept.
    buf.discard(0, LEN).unwrap();
    buf.as_mut_slice().fill(0x55);
    enter_nic(r);
    r.boot.barrier().unwrap();
    if me == 0 {
        // READ rank 1's region: the old bytes.
        let read = Opcode::RdmaRead {
            remote_addr: raddr,
            rkey,
        };
        post_send(
            r,
            qp,
            1,
            read,
            &[sge(land.addr(), LEN as u64, land_mr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        assert!(
            land.as_slice().iter().all(|&b| b == 0xaa),
            "READ saw old pages"
        );
        // WRITE into it from this rank's replaced region: this region's old bytes (0xaa)
        // go where rank 1's application cannot see them.
        land.as_mut_slice().fill(0);
        let write = Opcode::RdmaWrite {
            remote_addr: raddr + 4096,
            rkey,
        };
        post_send(r, qp, 2, write, &[sge(buf.addr(), 4096, mr.lkey)]);
        assert_eq!(r.wait().status, WcStatus::Success);
        post_send(
            r,
            qp,
            3,
            read,
            &[sge(land.addr(), LEN as u64, land_mr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        assert!(land.as_slice().iter().all(|&b| b == 0xaa));
        // And new bytes from a fresh region land in the old pages, not in the range.
        let mut fresh = AnonMapping::new(4096).unwrap();
        fresh.as_mut_slice().fill(0x77);
        let fresh_mr = r.nic.register(fresh.addr(), 4096, rw()).unwrap();
        post_send(r, qp, 4, write, &[sge(fresh.addr(), 4096, fresh_mr.lkey)]);
        assert_eq!(r.wait().status, WcStatus::Success);
        post_send(
            r,
            qp,
            5,
            read,
            &[sge(land.addr(), LEN as u64, land_mr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        assert!(land.as_slice()[4096..8192].iter().all(|&b| b == 0x77));
        assert!(land.as_slice()[..4096].iter().all(|&b| b == 0xaa));
        r.nic.deregister(fresh_mr.lkey).unwrap();
    }
    r.boot.barrier().unwrap();
    // Nobody's application saw a byte of it.
    assert!(
        buf.as_slice().iter().all(|&b| b == 0x55),
        "the range is untouched"
    );
    let c = r.nic.counters();
    assert_eq!(c.detached_regions, 1, "{c:?}");
    // Counted by the NIC that moved them: rank 0's by CMA, rank 1's driver when staged.
    let moved: u64 = r
        .boot
        .allgather(&c.detached_bytes.to_le_bytes())
        .unwrap()
        .iter()
        .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
        .sum();
    assert!(moved >= 2 * LEN as u64, "{moved} bytes: {c:?}");
    r.nic.deregister(mr.lkey).unwrap();
    r.nic.deregister(land_mr.lkey).unwrap();
    assert_eq!(r.nic.counters().pinned_now, 0);
    assert!(c.registration_mean_us() > 0.0);
}

#[test]
fn a_pinned_region_stays_bound_to_its_pages_when_the_application_replaces_them() {
    ranks(
        "a_pinned_region_stays_bound_to_its_pages_when_the_application_replaces_them",
        2,
        &[("PAGEWIRE_PIN", "longterm")],
        bound_body,
    );
}

#[test]
fn a_pinned_region_stays_bound_to_its_pages_on_the_staged_path_too() {
    ranks(
        "a_pinned_region_stays_bound_to_its_pages_on_the_staged_path_too",
        2,
        &[
            ("PAGEWIRE_PIN", "longterm"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
        bound_body,
    );
}

/// A range freed and handed out again is new memory: a region registered over it after the
/// change is bound to the new pages, though the change's event reaches the NIC's watch only
/// later (a pin-down cache re-registering a buffer `malloc` gave back at the same address:
/// the zeroed rendezvous the TCP wire once showed). The peer's WRITE through the new region is what the
/// application reads, and nothing is detached.
fn rebound_body(r: &Rank) {
    const LEN: usize = 64 << 10;
    let qps = r.connect_all(false);
    let me = r.rank();
    let qp = qps[1 - me].unwrap();
    let mut buf = AnonMapping::new(LEN).unwrap();
    let mut mr = r.nic.register(buf.addr(), LEN as u64, rw()).unwrap();
    if me == 1 {
        buf.as_mut_slice().fill(0xaa);
        enter_nic(r);
        buf.discard(0, LEN).unwrap();
        // The change reaches the NIC's watch (every monitor of the process delivers it)
        // while no NIC entry takes it; then the old region goes and a new one comes.
        struct Ignore;
        impl pagewire_memmon::InvalidationSink for Ignore {
            fn invalidate(&self, _: u64, _: u64, _: pagewire_memmon::Cause) {}
        }
        pagewire_memmon::monitor_from_env(std::sync::Arc::new(Ignore))
            .unwrap()
            .flush();
        r.nic.deregister(mr.lkey).unwrap();
        buf.as_mut_slice().fill(0x55);
        mr = r.nic.register(buf.addr(), LEN as u64, rw()).unwrap();
        enter_nic(r);
    }
    let remote = r.exchange(&mr);
    if me == 0 {
        let mut src = AnonMapping::new(LEN).unwrap();
        src.as_mut_slice().fill(0x77);
        let src_mr = r.nic.register(src.addr(), LEN as u64, rw()).unwrap();
        let (raddr, rkey, _) = remote[1];
        let write = Opcode::RdmaWrite {
            remote_addr: raddr,
            rkey,
        };
        post_send(r, qp, 1, write, &[sge(src.addr(), LEN as u64, src_mr.lkey)]);
        assert_eq!(r.wait().status, WcStatus::Success);
        r.nic.deregister(src_mr.lkey).unwrap();
    }
    r.boot.barrier().unwrap();
    if me == 1 {
        enter_nic(r);
        let c = r.nic.counters();
        assert_eq!((c.detached_regions, c.detached_bytes), (0, 0), "{c:?}");
        assert!(
            buf.as_slice().iter().all(|&b| b == 0x77),
            "the WRITE landed in the pages the application maps"
        );
    }
    r.nic.deregister(mr.lkey).unwrap();
}

#[test]
fn a_region_registered_after_its_range_changed_is_bound_to_the_new_pages() {
    for dma in ["cma", "staged"] {
        ranks(
            "a_region_registered_after_its_range_changed_is_bound_to_the_new_pages",
            2,
            &[("PAGEWIRE_PIN", "longterm"), ("PAGEWIRE_SOFT_DMA", dma)],
            rebound_body,
        );
    }
}

/// ODP: a cold region faults on first touch (responder side on the target, requester side on
/// the initiator), RSS grows only by the touched pages, prefetch makes the next access
/// fault-free, a discarded page faults again, and an unmapped page is never written.
/// A NIC call with no effect: the soft NIC delivers the owner's pending address-space
/// changes to its ODP present bits whenever the application enters it.
fn enter_nic(r: &Rank) {
    let mut none = Vec::new();
    r.nic.poll_cq(r.cq, &mut none, 0).unwrap();
}

fn odp_body(r: &Rank) {
    const SPAN: usize = 256 << 20;
    let qps = r.connect_all(false);
    let me = r.rank();
    let qp = qps[1 - me].unwrap();
    let mut target = AnonMapping::new(SPAN).unwrap();
    let (_, rss0) = vm_locked_and_resident().unwrap();
    let odp = r
        .nic
        .register(target.addr(), SPAN as u64, rw() | Access::ON_DEMAND)
        .unwrap();
    let mut src = AnonMapping::new(1 << 20).unwrap();
    src.as_mut_slice().copy_from_slice(&pattern(7, 1 << 20));
    let smr = r
        .nic
        .register(src.addr(), 1 << 20, rw() | Access::ON_DEMAND)
        .unwrap();
    let before = r.nic.counters(); // taken before the collective that releases rank 0
    let remote = r.exchange(&odp);
    let (raddr, rkey, _) = remote[1];
    let off = 64u64 << 20;
    // 1. Cold write of 1 MiB into rank 1's ODP region.
    if me == 0 {
        post_send(
            r,
            qp,
            1,
            Opcode::RdmaWrite {
                remote_addr: raddr + off,
                rkey,
            },
            &[sge(src.addr(), 1 << 20, smr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        let c = r.nic.counters().since(&before);
        assert!(
            c.rnr_retries >= 1,
            "the initiator retried after the rNPF: {c:?}"
        );
    }
    r.boot.barrier().unwrap();
    if me == 1 {
        let c = r.nic.counters().since(&before);
        assert!(
            c.npf_responder >= 1 && c.npf_pages >= 256,
            "responder faults counted: {c:?}"
        );
        assert_eq!(c.pinned_now, 0, "ODP pins nothing");
        assert!(
            target.as_slice()[off as usize..off as usize + (1 << 20)] == pattern(7, 1 << 20)[..]
        );
        let (_, rss1) = vm_locked_and_resident().unwrap();
        assert!(
            rss1 - rss0 < 32 << 20,
            "RSS grew by {} bytes for a 1 MiB touch of a 256 MiB region",
            rss1 - rss0
        );
        // Prefetch the next megabyte.
        r.nic
            .advise(
                odp.lkey,
                target.addr() + off + (1 << 20),
                1 << 20,
                Advice::PrefetchWrite,
            )
            .unwrap();
        assert!(r.nic.counters().prefetch_pages >= 256);
    }
    // 2. The prefetched range: no fault at all.
    let before = r.nic.counters();
    r.boot.barrier().unwrap();
    if me == 0 {
        post_send(
            r,
            qp,
            2,
            Opcode::RdmaWrite {
                remote_addr: raddr + off + (1 << 20),
                rkey,
            },
            &[sge(src.addr(), 1 << 20, smr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        assert_eq!(
            r.nic.counters().since(&before).rnr_retries,
            0,
            "prefetched pages did not fault"
        );
    }
    r.boot.barrier().unwrap();
    let before_discard = r.nic.counters();
    if me == 1 {
        assert_eq!(r.nic.counters().since(&before).npf_responder, 0);
        // 3. Discard the first megabyte (MADV_DONTNEED): its pages must fault again. The
        // owner enters the NIC before telling the peer (pagewire's protocols always post):
        // from then on the change has reached its present bits.
        target.discard(off as usize, 1 << 20).unwrap();
        enter_nic(r);
    }
    let before = r.nic.counters();
    r.boot.barrier().unwrap();
    if me == 0 {
        post_send(
            r,
            qp,
            3,
            Opcode::RdmaWrite {
                remote_addr: raddr + off,
                rkey,
            },
            &[sge(src.addr(), 4096, smr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        assert!(
            r.nic.counters().since(&before).rnr_retries >= 1,
            "discarded page faulted again"
        );
    }
    r.boot.barrier().unwrap();
    // The target's memory monitor (or, with PAGEWIRE_MEMMON=none, whoever checked its page
    // tables) saw the discarded page and cleared its present bit.
    let inval = r.nic.counters().since(&before_discard).invalidated_pages;
    let all = r.boot.allgather(&inval.to_le_bytes()).unwrap();
    let total: u64 = all
        .iter()
        .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
        .sum();
    assert!(total >= 1, "no invalidation seen");
    if me == 1 {
        assert!(r.nic.counters().since(&before).npf_responder >= 1);
        assert!(target.as_slice()[off as usize..off as usize + 4096] == pattern(7, 4096)[..]);
    }
    r.boot.barrier().unwrap();
    // 4. Unmap the target: the next write faults, the fault cannot be resolved, and the
    // initiator gets a remote access error; nothing lands anywhere.
    let hole = if me == 1 {
        let hole = target.unmap_range(0, SPAN).unwrap();
        enter_nic(r);
        Some(hole)
    } else {
        drop(target);
        None
    };
    r.boot.barrier().unwrap();
    if me == 0 {
        post_send(
            r,
            qp,
            4,
            Opcode::RdmaWrite {
                remote_addr: raddr + off,
                rkey,
            },
            &[sge(src.addr(), 4096, smr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::RemoteAccessError);
    }
    r.boot.barrier().unwrap();
    if me == 1 {
        assert!(r.nic.counters().npf_failed >= 1);
    }
    drop(hole);
    // 5. Requester side: a cold local ODP source faults on the initiator.
    let cold = AnonMapping::new(1 << 20).unwrap();
    let cmr = r
        .nic
        .register(cold.addr(), 1 << 20, rw() | Access::ON_DEMAND)
        .unwrap();
    let landing = AnonMapping::new(1 << 20).unwrap();
    let lmr = r.nic.register(landing.addr(), 1 << 20, rw()).unwrap();
    let lremote = r.exchange(&lmr);
    let before = r.nic.counters();
    let qp2 = r.fresh_pair(0, 1);
    if me == 0 {
        post_send(
            r,
            qp2,
            5,
            Opcode::RdmaWrite {
                remote_addr: lremote[1].0,
                rkey: lremote[1].1,
            },
            &[sge(cold.addr(), 1 << 20, cmr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        let c = r.nic.counters().since(&before);
        assert!(c.npf_requester >= 1, "{c:?}");
    }
    r.boot.barrier().unwrap();
}

#[test]
fn odp_faults_prefetch_discard_and_unmap() {
    ranks("odp_faults_prefetch_discard_and_unmap", 2, &[], odp_body);
}

#[test]
fn odp_faults_prefetch_discard_and_unmap_staged() {
    ranks(
        "odp_faults_prefetch_discard_and_unmap_staged",
        2,
        &[("PAGEWIRE_SOFT_DMA", "staged")],
        odp_body,
    );
}

/// A SEND into a cold ODP receive buffer: receiver-not-ready, the driver maps the pages,
/// the retransmission lands.
fn odp_receive_body(r: &Rank) {
    let qps = r.connect_all(false);
    let me = r.rank();
    let qp = qps[1 - me].unwrap();
    let buf = AnonMapping::new(4 << 20).unwrap();
    let implicit = r.nic.register_implicit_odp(rw()).unwrap();
    let mut src = AnonMapping::new(1 << 20).unwrap();
    src.as_mut_slice().copy_from_slice(&pattern(3, 1 << 20));
    let before = r.nic.counters(); // the fault happens only after the barrier below
    if me == 1 {
        post_recv(r, qp, 1, &[sge(buf.addr() + 4096, 1 << 20, implicit.lkey)]);
    }
    r.boot.barrier().unwrap();
    if me == 0 {
        post_send(
            r,
            qp,
            2,
            Opcode::Send,
            &[sge(src.addr(), 1 << 20, implicit.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
        assert!(r.nic.counters().since(&before).rnr_retries >= 1);
    } else {
        let c = r.wait();
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 1 << 20));
        assert!(buf.as_slice()[4096..4096 + (1 << 20)] == pattern(3, 1 << 20)[..]);
        let d = r.nic.counters().since(&before);
        assert!(d.rnr_nacks_sent >= 1 && d.npf_responder >= 1, "{d:?}");
    }
    r.boot.barrier().unwrap();
}

#[test]
fn a_send_into_a_cold_odp_receive_faults_and_retries() {
    ranks(
        "a_send_into_a_cold_odp_receive_faults_and_retries",
        2,
        &[],
        odp_receive_body,
    );
}

fn killed_body(r: &Rank) {
    let qps = r.connect_all(false);
    if r.rank() == 0 {
        std::fs::write(
            std::path::Path::new(&std::env::var(OUT).unwrap()).join("job"),
            r.boot.job_id(),
        )
        .unwrap();
    }
    r.boot.barrier().unwrap();
    if r.rank() == 1 {
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
    // The others wait for a receive that never comes; the launcher must take them down.
    let buf = AnonMapping::new(4096).unwrap();
    let mr = r.nic.register(buf.addr(), 4096, rw()).unwrap();
    let peer = if r.rank() == 0 { 2 } else { 0 };
    post_recv(r, qps[peer].unwrap(), 1, &[sge(buf.addr(), 64, mr.lkey)]);
    let _ = r.wait();
}

#[test]
fn a_rank_killed_mid_job_takes_the_job_down_and_leaves_no_shared_memory() {
    let name = "a_rank_killed_mid_job_takes_the_job_down_and_leaves_no_shared_memory";
    if std::env::var(ROLE).is_ok() {
        ranks(name, 3, &[], killed_body);
        return;
    }
    let out = std::env::temp_dir().join(format!("pagewire-test-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let start = std::time::Instant::now();
    let outcome = launch(name, 3, &[(OUT, out.to_str().unwrap())], None);
    assert_eq!(outcome.exit_code, 137, "{outcome:?}");
    assert_eq!(outcome.failed_rank, Some(1));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    let job = std::fs::read_to_string(out.join("job")).unwrap();
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("pagewire-{job}-"))
        })
        .collect();
    assert!(left.is_empty(), "shared memory left behind: {left:?}");
    let _ = std::fs::remove_dir_all(out);
}

/// A SEND or RDMA WRITE whose local memory is unmapped or unregistered completes with a
/// local protection error and the process goes on: the soft NIC copies its own
/// process's memory with the CPU, guarded so that a bad address fails the work request, not
/// the process. Inline payloads are copied at post time, registered ones at transmission.
fn local_faults_body(r: &Rank) {
    let me = r.rank();
    let page = PAGE_SIZE as usize;
    let mut landing = AnonMapping::new(1 << 16).unwrap();
    landing.as_mut_slice()[8192..8292].copy_from_slice(&pattern(5, 100));
    let lmr = r.nic.register(landing.addr(), 1 << 16, rw()).unwrap();
    let rl = r.exchange(&lmr);
    // Three pages; the middle one is unmapped after registration (ODP, so it is never
    // pinned and its present bits follow the unmap).
    let victim = AnonMapping::new(3 * page).unwrap();
    let odp = r
        .nic
        .register(victim.addr(), 3 * page as u64, rw() | Access::ON_DEMAND)
        .unwrap();
    let hole = victim.unmap_range(page, page).unwrap();
    let bad = hole.hole_addr();
    let cases: Vec<(&str, Opcode, Sge, bool)> = vec![
        (
            "inline SEND from unmapped memory",
            Opcode::Send,
            sge(bad, 64, 0),
            true,
        ),
        (
            "SEND from an unmapped page of an ODP region",
            Opcode::Send,
            sge(bad, 64, odp.lkey),
            false,
        ),
        (
            "RDMA WRITE from an unmapped page of an ODP region",
            Opcode::RdmaWrite {
                remote_addr: rl[1 - me].0,
                rkey: rl[1 - me].1,
            },
            sge(bad - 100, 300, odp.lkey),
            false,
        ),
        (
            "SEND with a key nobody registered",
            Opcode::Send,
            sge(landing.addr(), 64, lmr.lkey ^ 0x0ff0_0000),
            false,
        ),
    ];
    for (what, opcode, s, inline) in cases {
        let qp = r.fresh_pair(0, 1);
        if me == 1 {
            post_recv(r, qp, 1, &[sge(landing.addr(), 4096, lmr.lkey)]);
        }
        r.boot.barrier().unwrap();
        if me == 0 {
            // SAFETY (test): the addresses are ours; the NIC must fail on them, not crash.
            unsafe {
                r.nic
                    .post_send(
                        qp,
                        &SendWr {
                            wr_id: 7,
                            opcode,
                            sgl: &[s],
                            inline,
                            signaled: true,
                        },
                    )
                    .unwrap()
            };
            let c = r.wait();
            assert_eq!(
                (c.wr_id, c.status),
                (7, WcStatus::LocalProtectionError),
                "{what}"
            );
        }
        r.boot.barrier().unwrap();
    }
    // The process goes on: a good SEND on a fresh pair arrives.
    let qp = r.fresh_pair(0, 1);
    if me == 1 {
        post_recv(r, qp, 2, &[sge(landing.addr(), 4096, lmr.lkey)]);
    }
    r.boot.barrier().unwrap();
    if me == 0 {
        post_send(
            r,
            qp,
            3,
            Opcode::Send,
            &[sge(landing.addr() + 8192, 100, lmr.lkey)],
        );
    }
    let c = r.wait();
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    if me == 1 {
        assert_eq!(c.byte_len, 100);
        assert_eq!(&landing.as_slice()[..100], &pattern(5, 100)[..]);
    }
    r.boot.barrier().unwrap();
}

#[test]
fn a_send_or_write_from_unmapped_or_unregistered_memory_fails_locally_and_the_process_goes_on() {
    ranks(
        "a_send_or_write_from_unmapped_or_unregistered_memory_fails_locally_and_the_process_goes_on",
        2,
        &[],
        local_faults_body,
    );
}

/// A WRITE from a resident but NIC-cold ODP source into a cold ODP target: one requester
/// fault at rank 0, one responder fault at rank 1. The counters split each fault's time into
/// the driver's wait, the OS's work and (profile `npf-model`) the modelled
/// firmware time, and the parts add up to no more than the whole.
fn npf_parts_body(r: &Rank) {
    const LEN: usize = 64 << 10;
    let qps = r.connect_all(false);
    let me = r.rank();
    let qp = qps[1 - me].unwrap();
    let mut src = AnonMapping::new(LEN).unwrap();
    src.as_mut_slice().copy_from_slice(&pattern(11, LEN));
    let smr = r
        .nic
        .register(src.addr(), LEN as u64, rw() | Access::ON_DEMAND)
        .unwrap();
    let target = AnonMapping::new(LEN).unwrap();
    let tmr = r
        .nic
        .register(target.addr(), LEN as u64, rw() | Access::ON_DEMAND)
        .unwrap();
    let before = r.nic.counters(); // taken before the collective that releases rank 0
    let remote = r.exchange(&tmr);
    if me == 0 {
        let (raddr, rkey, _) = remote[1];
        post_send(
            r,
            qp,
            1,
            Opcode::RdmaWrite {
                remote_addr: raddr,
                rkey,
            },
            &[sge(src.addr(), LEN as u64, smr.lkey)],
        );
        assert_eq!(r.wait().status, WcStatus::Success);
    }
    r.boot.barrier().unwrap();
    if me == 1 {
        assert!(target.as_slice()[..] == pattern(11, LEN)[..]);
    }
    let c = r.nic.counters().since(&before);
    let n = c.npf_count();
    let side = if me == 0 {
        c.npf_requester
    } else {
        c.npf_responder
    };
    assert!(side >= 1 && side == n, "rank {me}: {c:?}");
    assert!(c.npf_os_ns > 0, "the OS's work is measured: {c:?}");
    assert!(
        c.npf_resolve_ns >= c.npf_wait_ns + c.npf_os_ns + c.npf_model_ns,
        "the parts fit in the whole: {c:?}"
    );
    if me == 0 {
        assert_eq!(c.npf_wait_ns, 0, "a requester fault waits for no driver");
    }
    assert!(c.npf_max_ns * n >= c.npf_resolve_ns);
    assert!(c.npf_percentile_us(100.0) > 0.0);
    match std::env::var("PAGEWIRE_SOFT_PROFILE").as_deref() {
        Ok("npf-model") => assert!(
            c.npf_model_ns >= 147_000 * n,
            "Lesokhin17's firmware time is at least 147 µs a fault: {c:?}"
        ),
        _ => assert_eq!(c.npf_model_ns, 0, "the real profile models nothing"),
    }
    r.boot.barrier().unwrap();
}

#[test]
fn a_fault_s_time_is_split_into_wait_os_work_and_nothing_modelled() {
    ranks(
        "a_fault_s_time_is_split_into_wait_os_work_and_nothing_modelled",
        2,
        &[],
        npf_parts_body,
    );
}

#[test]
fn the_npf_model_profile_adds_seed_000_s_firmware_time_to_every_fault() {
    ranks(
        "the_npf_model_profile_adds_seed_000_s_firmware_time_to_every_fault",
        2,
        &[("PAGEWIRE_SOFT_PROFILE", "npf-model")],
        npf_parts_body,
    );
}

/// A [`Region`] deregisters itself when dropped, once; `deregister` returns the NIC's answer;
/// the key is dead afterwards.
fn region_body(r: &Rank) {
    let buf = AnonMapping::new(1 << 20).unwrap();
    let before = r.nic.counters();
    let key = {
        let region = Region::register(&r.nic, buf.addr(), 1 << 20, rw()).unwrap();
        assert_eq!(r.nic.counters().since(&before).registrations, 1);
        assert_eq!(region.info().len, 1 << 20);
        region.lkey()
    };
    let c = r.nic.counters().since(&before);
    assert_eq!((c.registrations, c.deregistrations), (1, 1), "{c:?}");
    assert!(
        matches!(r.nic.deregister(key), Err(Error::UnknownKey { .. })),
        "the dropped region's key is dead"
    );
    let region = Region::register(&r.nic, buf.addr(), 4096, rw()).unwrap();
    region.deregister().unwrap();
    let implicit = Region::implicit_odp(&r.nic, rw()).unwrap();
    drop(implicit);
    let c = r.nic.counters().since(&before);
    assert_eq!((c.registrations, c.deregistrations), (3, 3), "{c:?}");
}

#[test]
fn a_region_deregisters_itself_when_dropped() {
    ranks(
        "a_region_deregisters_itself_when_dropped",
        1,
        &[],
        region_body,
    );
}
