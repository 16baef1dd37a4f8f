//! The soft NIC's bounded translation cache (`PAGEWIRE_SOFT_TPT_CACHE`,
//! after Azimi03): two ranks on the CMA path and on the staged
//! path, checking the hits and misses of a known access pattern, the bytes of many regions
//! through a cache of one or two entries, and that with the cache off nothing is counted.

use pagewire_nic::{Nic, Opcode, Sge, WcStatus};
use pagewire_sys::AnonMapping;
use pagewire_test_support::nic::{ranks, Rank};
use pagewire_test_support::pattern;

mod common;
use common::{post_recv, post_send, rw, sge};

/// The cache's entries as the test's environment sets them (0: off).
fn entries() -> usize {
    std::env::var("PAGEWIRE_SOFT_TPT_CACHE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Rank 0 WRITEs from one source region into rank 1's four target regions in the order
/// T0 T1 T0 T1 T2 T0 T0 T1. Through rank 1's 2-entry LRU cache that is
/// miss miss hit hit miss miss hit miss (T2 evicts T0, T0 then evicts T1): 3 hits and 5
/// misses, each filled by rank 1's driver thread while rank 1 waits in a barrier, and each
/// making rank 0 wait for its retransmission timer (200 µs) at least. Rank 0's own cache
/// sees its source key once per request: 1 miss, 7 hits. Every byte lands. With the cache
/// off, every cache counter stays zero.
fn known_pattern_body(r: &Rank) {
    const LEN: usize = 8192;
    const ORDER: [usize; 8] = [0, 1, 0, 1, 2, 0, 0, 1];
    let qps = r.connect_all(false);
    let me = r.rank();
    let qp = qps[1 - me].unwrap();
    let mut src = AnonMapping::new(LEN * ORDER.len()).unwrap();
    let smr = r.nic.register(src.addr(), src.len() as u64, rw()).unwrap();
    let targets: Vec<AnonMapping> = (0..4).map(|_| AnonMapping::new(LEN).unwrap()).collect();
    let tmrs: Vec<_> = targets
        .iter()
        .map(|t| r.nic.register(t.addr(), LEN as u64, rw()).unwrap())
        .collect();
    let remote: Vec<_> = tmrs.iter().map(|m| r.exchange(m)[1]).collect();
    let before = r.nic.counters();
    r.boot.barrier().unwrap();
    if me == 0 {
        for (i, &t) in ORDER.iter().enumerate() {
            let at = i * LEN;
            src.as_mut_slice()[at..at + LEN].copy_from_slice(&pattern(i as u64, LEN));
            post_send(
                r,
                qp,
                i as u64,
                Opcode::RdmaWrite {
                    remote_addr: remote[t].0,
                    rkey: remote[t].1,
                },
                &[sge(src.addr() + at as u64, LEN as u64, smr.lkey)],
            );
            assert_eq!(r.wait().status, WcStatus::Success, "write {i}");
        }
    }
    r.boot.barrier().unwrap();
    let c = r.nic.counters().since(&before).tpt_cache;
    assert_eq!(r.nic.tpt_cache_entries(), entries());
    if me == 1 {
        // The last write into each target.
        for (t, target) in targets.iter().enumerate().take(3) {
            let last = ORDER.iter().rposition(|&x| x == t).unwrap();
            assert!(
                target.as_slice() == &pattern(last as u64, LEN)[..],
                "target {t}"
            );
        }
    }
    if entries() == 0 {
        assert_eq!(c, Default::default(), "rank {me}: the cache is off");
        return;
    }
    assert_eq!(entries(), 2, "the expectations are for two entries");
    if me == 0 {
        assert_eq!((c.hits, c.misses, c.fills), (7, 1, 1), "rank 0: {c:?}");
        assert!(
            c.stall_ns >= 5 * 200_000,
            "five retransmissions, each after the 200 µs timer: {c:?}"
        );
    } else {
        assert_eq!((c.hits, c.misses, c.fills), (3, 5, 5), "rank 1: {c:?}");
        assert_eq!(c.stall_ns, 0, "rank 1 sent nothing: {c:?}");
    }
    assert!(
        c.fill_model_ns >= c.fills * 5_000,
        "Azimi03's processing is at least 5 µs a miss: {c:?}"
    );
    r.boot.barrier().unwrap();
}

#[test]
fn a_two_entry_cache_counts_the_hits_and_misses_of_a_known_pattern() {
    ranks(
        "a_two_entry_cache_counts_the_hits_and_misses_of_a_known_pattern",
        2,
        &[("PAGEWIRE_SOFT_TPT_CACHE", "2")],
        known_pattern_body,
    );
}

#[test]
fn a_two_entry_cache_counts_the_same_on_the_staged_path() {
    ranks(
        "a_two_entry_cache_counts_the_same_on_the_staged_path",
        2,
        &[
            ("PAGEWIRE_SOFT_TPT_CACHE", "2"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
        known_pattern_body,
    );
}

#[test]
fn with_the_cache_off_nothing_is_counted_and_the_bytes_are_the_same() {
    ranks(
        "with_the_cache_off_nothing_is_counted_and_the_bytes_are_the_same",
        2,
        &[],
        known_pattern_body,
    );
}

/// Both ranks at once, each with 16 regions of its own: WRITEs, READs and SENDs whose
/// scatter-gather lists take three regions each (more keys than a 1- or 2-entry cache
/// holds, so a request needs several fills), all between the two ranks' tiny caches. Every
/// byte is checked.
fn many_regions_body(r: &Rank) {
    const REGIONS: usize = 16;
    const PIECE: usize = 3000; // not page-aligned
    const ROUNDS: usize = 12;
    let qps = r.connect_all(false);
    let me = r.rank();
    let peer = 1 - me;
    let qp = qps[peer].unwrap();
    let mut bufs: Vec<AnonMapping> = (0..REGIONS)
        .map(|_| AnonMapping::new((2 + 2 * ROUNDS) * PIECE).unwrap())
        .collect();
    let mrs: Vec<_> = bufs
        .iter()
        .map(|b| r.nic.register(b.addr(), b.len() as u64, rw()).unwrap())
        .collect();
    let remote: Vec<_> = mrs.iter().map(|m| r.exchange(m)).collect();
    // Region k's piece 0 holds data stream (rank, k); piece 1 takes the peer's WRITE of
    // round k; pieces 2 + k and 2 + ROUNDS + k take round k's READ and receive.
    for (k, b) in bufs.iter_mut().enumerate() {
        let seed = 100 * me as u64 + k as u64;
        b.as_mut_slice()[..PIECE].copy_from_slice(&pattern(seed, PIECE));
    }
    r.boot.barrier().unwrap();
    let three = |k: usize, piece: usize| -> Vec<Sge> {
        (0..3)
            .map(|j| {
                let reg = (k + 5 * j) % REGIONS;
                sge(
                    bufs[reg].addr() + (piece * PIECE) as u64,
                    (PIECE / 3) as u64,
                    mrs[reg].lkey,
                )
            })
            .collect()
    };
    // Receives for the peer's SENDs.
    for k in 0..ROUNDS {
        post_recv(r, qp, 1000 + k as u64, &three(k, 2 + ROUNDS + k));
    }
    r.boot.barrier().unwrap();
    let mut wr = 0u64;
    for k in 0..ROUNDS {
        let (raddr, rkey, _) = remote[k % REGIONS][peer];
        // WRITE piece 0 of three local regions into piece 1 of the peer's region k.
        post_send(
            r,
            qp,
            wr,
            Opcode::RdmaWrite {
                remote_addr: raddr + PIECE as u64,
                rkey,
            },
            &three(k, 0),
        );
        // READ the peer's region k piece 0 into piece 2 of three local regions.
        post_send(
            r,
            qp,
            wr + 1,
            Opcode::RdmaRead {
                remote_addr: raddr,
                rkey,
            },
            &three(k, 2 + k),
        );
        post_send(r, qp, wr + 2, Opcode::Send, &three(k, 0));
        wr += 3;
    }
    // Our 3 per round and the peer's SEND per round.
    for _ in 0..4 * ROUNDS {
        let c = r.wait();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    r.boot.barrier().unwrap();
    // What a three-region list of stream pieces (stream of `rank`, piece 0) holds.
    let gathered = |rank: usize, k: usize| -> Vec<u8> {
        (0..3)
            .flat_map(|j| {
                let reg = (k + 5 * j) % REGIONS;
                pattern(100 * rank as u64 + reg as u64, PIECE)[..PIECE / 3].to_vec()
            })
            .collect()
    };
    for k in 0..ROUNDS {
        // The peer's WRITE of round k into our region k (the last round to name it).
        let reg = k % REGIONS;
        let wrote = gathered(peer, k);
        assert!(
            bufs[reg].as_slice()[PIECE..PIECE + PIECE] == wrote[..],
            "rank {me}: write {k}"
        );
        // Our READ of the peer's region k, scattered over three of ours.
        let read = pattern(100 * peer as u64 + reg as u64, PIECE);
        let mut at = 0;
        for s in three(k, 2 + k) {
            let got = bytes_of(&bufs, s);
            assert!(got == read[at..at + s.len as usize], "rank {me}: read {k}");
            at += s.len as usize;
        }
        // The peer's SEND of round k, in receive k.
        let sent = gathered(peer, k);
        let mut at = 0;
        for s in three(k, 2 + ROUNDS + k) {
            let got = bytes_of(&bufs, s);
            assert!(got == sent[at..at + s.len as usize], "rank {me}: send {k}");
            at += s.len as usize;
        }
    }
    let c = r.nic.counters().tpt_cache;
    if entries() > 0 {
        assert!(c.misses > 0 && c.fills > 0, "rank {me}: {c:?}");
    }
    r.boot.barrier().unwrap();
}

/// The bytes of `s`, which lies in one of `bufs`.
fn bytes_of(bufs: &[AnonMapping], s: Sge) -> Vec<u8> {
    let b = bufs
        .iter()
        .find(|b| b.addr() <= s.addr && s.addr < b.addr() + b.len() as u64)
        .expect("in a buffer");
    let at = (s.addr - b.addr()) as usize;
    b.as_slice()[at..at + s.len as usize].to_vec()
}

#[test]
fn a_one_entry_cache_moves_every_byte_of_many_regions() {
    ranks(
        "a_one_entry_cache_moves_every_byte_of_many_regions",
        2,
        &[("PAGEWIRE_SOFT_TPT_CACHE", "1")],
        many_regions_body,
    );
}

#[test]
fn a_two_entry_cache_moves_every_byte_of_many_regions_on_the_staged_path() {
    ranks(
        "a_two_entry_cache_moves_every_byte_of_many_regions_on_the_staged_path",
        2,
        &[
            ("PAGEWIRE_SOFT_TPT_CACHE", "2"),
            ("PAGEWIRE_SOFT_DMA", "staged"),
        ],
        many_regions_body,
    );
}
