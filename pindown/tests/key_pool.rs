//! The `key-pool` registration strategy (FMR-style, NFS-RDMA §3.2) over the real soft NIC in
//! one rank: deregistrations wait in a queue until the dirty watermark, and until then a
//! finished registration's key still works (NFS-RDMA's window of vulnerability); the
//! memlock limit flushes the queue before refusing.

mod common;

use pagewire_pindown::KeyPool;
use pagewire_transport::nic::soft::{PinMethod, SoftNic};
use pagewire_transport::nic::{Access, Advice, Nic};
use pagewire_transport::sys::AnonMapping;
use pagewire_transport::sys::Error;

fn nic(memlock: u64) -> SoftNic {
    common::soft_nic(memlock, PinMethod::Auto)
}

fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

#[test]
fn deregistrations_wait_for_the_dirty_watermark_and_keys_stay_valid_until_then() {
    let nic = nic(64 << 20);
    let bufs: Vec<AnonMapping> = (0..5)
        .map(|_| AnonMapping::new(64 << 10).unwrap())
        .collect();
    let mut pool = KeyPool::new(3);
    let before = nic.counters();
    let mut finished = Vec::new();
    for (i, b) in bufs.iter().enumerate() {
        let (token, info) = pool
            .register(&nic, b.addr(), 64 << 10, rw())
            .unwrap()
            .expect("room under the limit");
        assert_eq!(pool.keys(token), Some(info));
        pool.finish(&nic, token);
        assert_eq!(
            pool.keys(token),
            None,
            "a finished transfer has no keys to lease"
        );
        finished.push(info);
        // Flushed after the 3rd: 1, 2, 0 (flush), 1, 2 queued.
        assert_eq!(pool.dirty(), [1, 2, 0, 1, 2][i], "after transfer {i}");
    }
    let c = pool.counters();
    assert_eq!((c.registrations, c.flushes, c.deregistered), (5, 1, 3));
    let n = nic.counters().since(&before);
    assert_eq!((n.registrations, n.deregistrations), (5, 3));
    // The window of vulnerability: the last two finished registrations still answer their
    // keys (and keep their pages pinned) until the next flush; the flushed ones do not.
    let probe = |k: u32, addr: u64| nic.advise(k, addr, 4096, Advice::Prefetch);
    assert!(matches!(
        probe(finished[0].lkey, bufs[0].addr()),
        Err(Error::UnknownKey { .. })
    ));
    for i in [3, 4] {
        let r = probe(finished[i].lkey, bufs[i].addr());
        assert!(!matches!(r, Err(Error::UnknownKey { .. })), "{i}: {r:?}");
    }
    pool.flush(&nic);
    assert_eq!(pool.counters().deregistered, 5);
    assert!(matches!(
        probe(finished[4].lkey, bufs[4].addr()),
        Err(Error::UnknownKey { .. })
    ));
    assert_eq!(pool.counters().bytes_now, 0);
}

#[test]
fn the_memlock_limit_flushes_the_queue_before_refusing() {
    let nic = nic(1 << 20);
    let base = nic.memlock().1;
    assert_eq!(base, 0, "nothing pinned before the test");
    let bufs: Vec<AnonMapping> = (0..4)
        .map(|_| AnonMapping::new(512 << 10).unwrap())
        .collect();
    let mut pool = KeyPool::new(100);
    // Two of 512 KiB fill the 1 MiB limit; finished, they wait in the queue.
    for b in &bufs[..2] {
        let (t, _) = pool
            .register(&nic, b.addr(), 512 << 10, rw())
            .unwrap()
            .unwrap();
        pool.finish(&nic, t);
    }
    assert_eq!(pool.dirty(), 2);
    // The third does not fit until the queue is flushed: the pool flushes and retries.
    let (t, _) = pool
        .register(&nic, bufs[2].addr(), 512 << 10, rw())
        .unwrap()
        .expect("fits after the flush");
    assert_eq!(pool.dirty(), 0);
    assert_eq!(pool.counters().flushes, 1);
    // With nothing queued, a request over the limit is refused (the mode copies instead).
    let (t2, _) = pool
        .register(&nic, bufs[3].addr(), 512 << 10, rw())
        .unwrap()
        .unwrap();
    let big = AnonMapping::new(1 << 20).unwrap();
    assert_eq!(
        pool.register(&nic, big.addr(), 1 << 20, rw()).unwrap(),
        None
    );
    assert_eq!(pool.counters().fallbacks, 1);
    pool.finish(&nic, t);
    pool.finish(&nic, t2);
    pool.flush(&nic);
    assert_eq!(nic.memlock().1, 0, "everything unpinned");
}
