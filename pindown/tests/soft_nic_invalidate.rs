//! The cache over the real soft NIC in one rank: what happens when memory changes under a
//! cached registration (Wyckoff05), and when the NIC's locked-memory limit is below the
//! cache's.

mod common;

use pagewire_pindown::{Acquire, Limits, NicRegistrar, PinDownCache, Policy};
use pagewire_transport::nic::soft::{PinMethod, SoftNic};
use pagewire_transport::nic::PAGE_SIZE;
use pagewire_transport::sys::AnonMapping;

const P: u64 = PAGE_SIZE;

fn nic(memlock: u64) -> SoftNic {
    // These tests read VmLck, which only mlock moves.
    common::soft_nic(memlock, PinMethod::Mlock)
}

/// Wyckoff05 Fig. 4 and section VII: part of a cached, pinned buffer is unmapped. Until the
/// invalidation the NIC still holds the pages (the leak of section VII); after it they are
/// unpinned, and the cache never hands out the stale registration again.
#[test]
fn partial_unmap_then_invalidate_unpins_and_never_reuses() {
    let nic = nic(64 << 20);
    let base_pinned = nic.memlock().1;
    let mut cache = PinDownCache::new(
        NicRegistrar::new(&nic),
        Policy::Lru,
        Limits {
            max_bytes: 1 << 20,
            max_entries: 16,
        },
    );
    let buf = AnonMapping::new(3 * P as usize).unwrap();
    let addr = buf.addr();
    let a = cache.acquire(addr, 3 * P).unwrap();
    let old = *a.lease().unwrap();
    cache.release(old.handle).unwrap();
    assert_eq!(nic.memlock().1 - base_pinned, 3 * P, "cached, still pinned");

    // munmap of the middle page (what free() of an mmap'd block does).
    let hole = buf.unmap_range(P as usize, P as usize).unwrap();
    assert_eq!(hole.hole_addr(), addr + P);
    assert_eq!(
        nic.memlock().1 - base_pinned,
        3 * P,
        "nobody told the cache: the NIC still counts the pages"
    );

    // The monitor reports the unmap.
    assert_eq!(cache.invalidate(addr + P, P), 1);
    assert_eq!(nic.memlock().1, base_pinned, "unpinned at once");
    assert!(!cache.is_cached(addr, P));

    // The first page is still mapped: a new registration, never the stale one.
    let b = cache.acquire(addr, P).unwrap();
    assert!(matches!(b, Acquire::Miss(_)), "{b:?}");
    let new = *b.lease().unwrap();
    assert_ne!(new.lkey, old.lkey);
    cache.release(new.handle).unwrap();
    // Over the hole: the NIC reports it not mapped; an error, not a fallback.
    let e = cache.acquire(addr, 2 * P).unwrap_err();
    assert!(e.is_not_mapped(), "{e}");

    let k = cache.counters();
    assert_eq!((k.invalidations, k.fallbacks), (1, 0));
    drop(cache);
    assert_eq!(nic.memlock().1, base_pinned);
    drop(hole);
}

/// The NIC's locked-memory limit (512 KiB) is below the cache's (2 MiB): the NIC's refusal
/// makes the cache evict and retry, and when every registration is in use, fall back.
#[test]
fn nic_memlock_limit_below_the_cache_limit() {
    let nic = nic(512 << 10);
    let base_pinned = nic.memlock().1;
    let mut cache = PinDownCache::new(
        NicRegistrar::new(&nic),
        Policy::Lru,
        Limits {
            max_bytes: 2 << 20,
            max_entries: 16,
        },
    );
    let bufs: Vec<AnonMapping> = (0..4)
        .map(|_| AnonMapping::new(256 << 10).unwrap())
        .collect();
    let len = 256u64 << 10;
    for b in &bufs {
        let a = cache.acquire(b.addr(), len).unwrap();
        assert!(matches!(a, Acquire::Miss(_)), "{a:?}");
        cache.release(a.lease().unwrap().handle).unwrap();
        assert!(nic.memlock().1 - base_pinned <= 512 << 10);
    }
    let k = cache.counters();
    assert!(k.resource_retries >= 2 && k.evictions >= 2, "{k:?}");
    // Hold two buffers (the NIC's whole limit): a third falls back.
    let h0 = cache.acquire(bufs[0].addr(), len).unwrap();
    let h1 = cache.acquire(bufs[1].addr(), len).unwrap();
    assert!(h0.lease().is_some() && h1.lease().is_some());
    assert_eq!(
        cache.acquire(bufs[2].addr(), len).unwrap(),
        Acquire::Fallback
    );
    for h in [h0, h1] {
        cache.release(h.lease().unwrap().handle).unwrap();
    }
    assert_eq!(cache.counters().fallbacks, 1);
    drop(cache);
    assert_eq!(nic.memlock().1, base_pinned);
}
