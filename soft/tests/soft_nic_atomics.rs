//! Multi-process tests of the soft NIC's atomics (`FETCH_ADD`, `CMP_SWAP`): exact counts
//! under contention from every rank while the target does not poll, atomicity against the
//! target's own CPU, and the errors an HCA gives, on the CMA, staged and TCP paths and on an
//! ODP target.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use pagewire_nic::{Access, Nic, Opcode, SendWr, WcOpcode, WcStatus};
use pagewire_sys::AnonMapping;
use pagewire_sys::Error;
use pagewire_test_support::nic::{ranks, Rank};

mod common;
use common::{post_send, sge};

/// Atomics each origin runs of each kind.
const ROUNDS: u64 = 1500;

fn atomic_rights() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ
}

/// One atomic from this rank on queue pair `qp`: the old value.
fn atomic(r: &Rank, qp: u32, opcode: Opcode, result: &AnonMapping, lkey: u32) -> u64 {
    post_send(r, qp, 7, opcode, &[sge(result.addr(), 8, lkey)]);
    let c = r.wait();
    assert_eq!(c.status, WcStatus::Success, "{opcode:?}");
    let expect = match opcode {
        Opcode::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
        _ => WcOpcode::CompSwap,
    };
    assert_eq!((c.opcode, c.byte_len), (expect, 8));
    u64::from_le_bytes(result.as_slice()[..8].try_into().unwrap())
}

/// Rank 0 owns three words and never polls its NIC while the others hammer them: word 0
/// by fetch-and-add (and by rank 0's own CPU, with locked adds), word 1 by compare-and-swap
/// increments, word 2 by a compare-and-swap that only one origin can win.
fn contention_body(r: &Rank) {
    let (me, n) = (r.rank(), r.size());
    let on_demand = std::env::var("ATOMICS_TARGET_ODP").is_ok();
    let target = AnonMapping::new(4096).unwrap();
    let access = if on_demand {
        atomic_rights() | Access::ON_DEMAND
    } else {
        atomic_rights()
    };
    let region = r.nic.register(target.addr(), 4096, access).unwrap();
    let result = AnonMapping::new(4096).unwrap();
    let lmr = r
        .nic
        .register(result.addr(), 4096, atomic_rights())
        .unwrap();
    let remote = r.exchange(&region);
    let qps = r.connect_all(false);
    r.boot.barrier().unwrap();
    let (word0, rkey) = (remote[0].0, remote[0].1);
    if me == 0 {
        // The target computes: its own CPU adds to word 0 without entering pagewire.
        // SAFETY (test): the word is only ever accessed atomically, here and by the NIC.
        let own = unsafe { AtomicU64::from_ptr(target.addr() as *mut u64) };
        for _ in 0..ROUNDS {
            own.fetch_add(1, SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    } else {
        let qp = qps[0].unwrap();
        let mut wins = 0;
        for i in 0..ROUNDS {
            let fa = Opcode::AtomicFetchAdd {
                remote_addr: word0,
                rkey,
                add: 1,
            };
            atomic(r, qp, fa, &result, lmr.lkey);
            // Increment word 1 with a compare-and-swap loop.
            let mut seen = 0;
            loop {
                let cas = Opcode::AtomicCmpSwap {
                    remote_addr: word0 + 8,
                    rkey,
                    compare: seen,
                    swap: seen + 1,
                };
                let old = atomic(r, qp, cas, &result, lmr.lkey);
                if old == seen {
                    break;
                }
                seen = old;
            }
            if i == 0 {
                // Word 2: 0 -> my rank; exactly one origin sees 0.
                let claim = Opcode::AtomicCmpSwap {
                    remote_addr: word0 + 16,
                    rkey,
                    compare: 0,
                    swap: me as u64,
                };
                wins += u64::from(atomic(r, qp, claim, &result, lmr.lkey) == 0);
            }
        }
        println!("wins {wins}");
    }
    r.boot.barrier().unwrap();
    if me == 0 {
        let words: Vec<u64> = target.as_slice()[..24]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        let origins = (n - 1) as u64;
        assert_eq!(words[0], ROUNDS * (origins + 1), "fetch-and-adds lost");
        assert_eq!(
            words[1],
            ROUNDS * origins,
            "compare-and-swap increments lost"
        );
        assert!((1..n as u64).contains(&words[2]), "word 2 = {}", words[2]);
        assert!(target.as_slice()[24..].iter().all(|&b| b == 0));
    }
    r.boot.barrier().unwrap();
}

#[test]
fn atomics_from_every_rank_lose_nothing_while_the_target_computes() {
    ranks(
        "atomics_from_every_rank_lose_nothing_while_the_target_computes",
        4,
        &[],
        contention_body,
    );
}

#[test]
fn atomics_on_the_tcp_wire_lose_nothing() {
    ranks(
        "atomics_on_the_tcp_wire_lose_nothing",
        3,
        &[("PAGEWIRE_SOFT_WIRE", "tcp")],
        contention_body,
    );
}

#[test]
fn atomics_on_an_odp_target_fault_its_page_in_and_lose_nothing() {
    ranks(
        "atomics_on_an_odp_target_fault_its_page_in_and_lose_nothing",
        3,
        &[("ATOMICS_TARGET_ODP", "1")],
        contention_body,
    );
}

/// Each refused atomic leaves the target's memory untouched and ends its queue pair in the
/// error state, as on an HCA.
fn errors_body(r: &Rank) {
    let me = r.rank();
    let mut target = AnonMapping::new(3 * 4096).unwrap();
    target.as_mut_slice().fill(0xaa);
    let result = AnonMapping::new(4096).unwrap();
    let lmr = r
        .nic
        .register(result.addr(), 4096, atomic_rights())
        .unwrap();
    let atomics = r
        .nic
        .register(target.addr(), 4096, atomic_rights())
        .unwrap();
    let no_atomic = r
        .nic
        .register(
            target.addr() + 4096,
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let ra = r.exchange(&atomics);
    let rn = r.exchange(&no_atomic);
    let add = |remote_addr, rkey| Opcode::AtomicFetchAdd {
        remote_addr,
        rkey,
        add: 1,
    };
    let cases = [
        (
            "no REMOTE_ATOMIC right",
            add(rn[1].0, rn[1].1),
            WcStatus::RemoteAccessError,
        ),
        (
            "past the region's end",
            add(ra[1].0 + 4096, ra[1].1),
            WcStatus::RemoteAccessError,
        ),
        (
            "unaligned",
            add(ra[1].0 + 3, ra[1].1),
            WcStatus::RemoteInvalidRequest,
        ),
        (
            "guessed key",
            add(ra[1].0, ra[1].1 ^ 0x5a5a_0000),
            WcStatus::RemoteAccessError,
        ),
    ];
    for (what, op, expect) in cases {
        let qp = r.fresh_pair(0, 1);
        if me == 0 {
            post_send(r, qp, 10, op, &[sge(result.addr(), 8, lmr.lkey)]);
            assert_eq!(r.wait().status, expect, "{what}");
            post_send(
                r,
                qp,
                11,
                add(ra[1].0, ra[1].1),
                &[sge(result.addr(), 8, lmr.lkey)],
            );
            assert_eq!(r.wait().status, WcStatus::WrFlushError, "{what}: flushed");
        }
        r.boot.barrier().unwrap();
        if me == 1 {
            assert!(
                target.as_slice().iter().all(|&x| x == 0xaa),
                "{what}: target memory touched"
            );
        }
    }
    // A result entry that is not one 8-byte word, or inline: refused when posted.
    let qp = r.fresh_pair(0, 1);
    if me == 0 {
        for (sgl, inline) in [
            (vec![sge(result.addr(), 4, lmr.lkey)], false),
            (
                vec![
                    sge(result.addr(), 4, lmr.lkey),
                    sge(result.addr() + 8, 4, lmr.lkey),
                ],
                false,
            ),
            (vec![sge(result.addr(), 8, lmr.lkey)], true),
        ] {
            let wr = SendWr {
                wr_id: 1,
                opcode: add(ra[1].0, ra[1].1),
                sgl: &sgl,
                inline,
                signaled: true,
            };
            // SAFETY (test): the result page is ours and not touched until completion.
            let e = unsafe { r.nic.post_send(qp, &wr) }.unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        }
    }
    r.boot.barrier().unwrap();
}

#[test]
fn refused_atomics_fail_without_touching_memory() {
    ranks(
        "refused_atomics_fail_without_touching_memory",
        2,
        &[],
        errors_body,
    );
}

#[test]
fn refused_atomics_fail_the_same_on_the_tcp_wire() {
    ranks(
        "refused_atomics_fail_the_same_on_the_tcp_wire",
        2,
        &[("PAGEWIRE_SOFT_WIRE", "tcp")],
        errors_body,
    );
}
