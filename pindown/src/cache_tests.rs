//! Unit tests of the cache against the fake registrar.

use std::collections::HashSet;

use crate::cache::{Acquire, CacheCounters, LeaseHandle, PinDownCache, PinLease};
use crate::fake::FakeRegistrar;
use crate::interval::Span;
use crate::limits::Limits;
use crate::policy::Policy;
use crate::shared::SharedPinDownCache;
use crate::Error;

const P: u64 = 4096;
const BASE: u64 = 0x7f00_0000_0000;

/// Address of page `n` of the test arena.
fn pg(n: u64) -> u64 {
    BASE + n * P
}

fn span(start: u64, end: u64) -> Span {
    Span { start, end }
}

fn pages(first: u64, n: u64) -> Span {
    span(pg(first), pg(first + n))
}

fn cache(
    policy: Policy,
    max_bytes: u64,
    max_entries: usize,
) -> (PinDownCache<FakeRegistrar>, FakeRegistrar) {
    let f = FakeRegistrar::new();
    let c = PinDownCache::new(
        f.clone(),
        policy,
        Limits {
            max_bytes,
            max_entries,
        },
    );
    (c, f)
}

fn miss(a: Acquire) -> PinLease {
    match a {
        Acquire::Miss(l) => l,
        other => panic!("expected a miss, got {other:?}"),
    }
}

fn hit(a: Acquire) -> PinLease {
    match a {
        Acquire::Hit(l) => l,
        other => panic!("expected a hit, got {other:?}"),
    }
}

/// Acquires and releases at once; returns what the acquire answered.
fn touch(c: &mut PinDownCache<FakeRegistrar>, addr: u64, len: u64) -> Acquire {
    let a = c.acquire(addr, len).unwrap();
    if let Some(l) = a.lease() {
        c.release(l.handle).unwrap();
    }
    c.check_invariants();
    a
}

#[test]
fn hit_inside_a_cached_range() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    // 3 pages from 100 bytes into page 0 touch pages 0..=3: the registration is page-aligned.
    let l = miss(c.acquire(pg(0) + 100, 3 * P).unwrap());
    assert_eq!((l.base, l.len), (pg(0), 4 * P));
    assert_eq!(f.registered_spans(), vec![pages(0, 4)]);
    c.release(l.handle).unwrap();
    for (addr, len) in [
        (pg(1) + 5, 10),
        (pg(0), 4 * P),
        (pg(3) + 4000, 96),
        (pg(0), 1),
    ] {
        let h = hit(c.acquire(addr, len).unwrap());
        assert_eq!((h.lkey, h.rkey, h.base), (l.lkey, l.rkey, l.base));
        assert_eq!(c.keys(h.handle), Some((l.lkey, l.rkey, pg(0))));
        c.release(h.handle).unwrap();
    }
    // One byte past the registration is a miss.
    miss(touch(&mut c, pg(3), P + 1));
    let k = c.counters();
    assert_eq!((k.hits, k.misses, k.registrations), (4, 2, 2));
}

#[test]
fn miss_then_hit_and_lazy_deregistration() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    let l = miss(touch(&mut c, pg(7), 2 * P));
    assert_eq!(
        f.live_keys(),
        vec![l.lkey],
        "released, but still registered"
    );
    assert_eq!(c.counters().deregistrations, 0);
    assert!(c.is_cached(pg(7), 2 * P));
    let h = hit(touch(&mut c, pg(7), 2 * P));
    assert_eq!(h.lkey, l.lkey);
    assert_eq!(f.registered_spans().len(), 1);
}

#[test]
fn unused_entries_inside_a_miss_are_merged_and_neighbours_kept() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    let a = miss(touch(&mut c, pg(0), 2 * P));
    // B shares page 1 with A: a registration of its own, A stays.
    let b = miss(touch(&mut c, pg(1), 3 * P));
    assert_eq!((b.base, b.len), (pg(1), 3 * P), "the request's span only");
    assert!(f.is_live(a.lkey));
    assert_eq!(hit(touch(&mut c, pg(0), P)).lkey, a.lkey);
    assert_eq!(hit(touch(&mut c, pg(1), 3 * P)).lkey, b.lkey);
    c.check_invariants();
    // A request over both contains them: one registration replaces the two.
    let m = miss(touch(&mut c, pg(0), 4 * P));
    assert_eq!((m.base, m.len), (pg(0), 4 * P));
    assert_eq!(f.live_keys(), vec![m.lkey]);
    let k = c.counters();
    assert_eq!((k.merged, k.entries, k.evictions), (2, 1, 0));
    c.check_invariants();
}

#[test]
fn entries_in_use_inside_a_miss_are_superseded_not_merged() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    let a = miss(c.acquire(pg(1), 2 * P).unwrap());
    let b = miss(c.acquire(pg(0), 4 * P).unwrap());
    assert_eq!((b.base, b.len), (pg(0), 4 * P));
    c.check_invariants();
    assert!(f.is_live(a.lkey), "A's transfer still holds it");
    assert_eq!(c.counters().superseded, 1);
    assert_eq!(
        hit(touch(&mut c, pg(1), P)).lkey,
        b.lkey,
        "B serves A's pages now"
    );
    c.release(a.handle).unwrap();
    assert!(!f.is_live(a.lkey), "A's last release deregisters it");
    c.release(b.handle).unwrap();
    // An entry in use that only shares pages with a miss stays in the index.
    let x = miss(c.acquire(pg(10), 2 * P).unwrap());
    let y = miss(touch(&mut c, pg(11), 2 * P));
    assert_eq!((y.base, y.len), (pg(11), 2 * P));
    assert_eq!(hit(touch(&mut c, pg(10), P)).lkey, x.lkey);
    c.release(x.handle).unwrap();
    c.check_invariants();
}

#[test]
fn adjacent_entries_are_not_merged() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    let a = miss(touch(&mut c, pg(0), 2 * P));
    let b = miss(touch(&mut c, pg(2), 2 * P));
    assert_eq!((b.base, b.len), (pg(2), 2 * P));
    assert_eq!(hit(touch(&mut c, pg(0), 2 * P)).lkey, a.lkey);
    assert_eq!(hit(touch(&mut c, pg(2), 2 * P)).lkey, b.lkey);
    assert_eq!(f.live_keys().len(), 2);
    // Unaligned buffers in one page share its registration.
    let u = miss(touch(&mut c, pg(9) + 100, 100));
    assert_eq!(hit(touch(&mut c, pg(9) + 3000, 1000)).lkey, u.lkey);
    // A request across the two adjacent entries is covered by neither: a registration of
    // its own, sharing a page with each.
    let m = miss(touch(&mut c, pg(1), 2 * P));
    assert_eq!((m.base, m.len), (pg(1), 2 * P));
    assert_eq!(c.counters().merged, 0);
    assert_eq!(f.live_keys().len(), 4);
    c.check_invariants();
}

/// Runs `script` (page, pages) through a cache, each acquire released at once, and returns
/// the spans the cache deregistered, in order.
fn victims(policy: Policy, limits: Limits, script: &[(u64, u64)]) -> Vec<Span> {
    let f = FakeRegistrar::new();
    let mut c = PinDownCache::new(f.clone(), policy, limits);
    for &(page, n) in script {
        assert!(touch(&mut c, pg(page), n * P).lease().is_some());
    }
    f.deregistered_spans()
}

const THREE: Limits = Limits {
    max_bytes: 1 << 30,
    max_entries: 3,
};

// Buffers of one page each, far apart.
const A: (u64, u64) = (0, 1);
const B: (u64, u64) = (10, 1);
const C: (u64, u64) = (20, 1);
const D: (u64, u64) = (30, 1);
const E: (u64, u64) = (40, 1);
const F: (u64, u64) = (50, 1);

fn sp(b: (u64, u64)) -> Span {
    pages(b.0, b.1)
}

#[test]
fn lru_evicts_the_least_recently_released() {
    let v = victims(Policy::Lru, THREE, &[A, B, C, A, D, E, A, F]);
    // D evicts B (A was hit after B); E evicts C; F evicts D (A hit again after E).
    assert_eq!(v, vec![sp(B), sp(C), sp(D)]);
}

#[test]
fn lfu_evicts_the_least_used_with_lru_ties() {
    let v = victims(Policy::Lfu, THREE, &[A, A, A, B, C, C, D, E, C, C, F]);
    // D evicts B (1 use); E evicts D (1 use, vs C 2 and A 3); F evicts E.
    assert_eq!(v, vec![sp(B), sp(D), sp(E)]);
    // All once: ties go to the least recently used.
    let v = victims(Policy::Lfu, THREE, &[A, B, C, D, E]);
    assert_eq!(v, vec![sp(A), sp(B)]);
}

#[test]
fn fifo_evicts_the_oldest_registration_however_hot() {
    let v = victims(Policy::Fifo, THREE, &[A, B, C, A, A, A, A, D, B, E]);
    assert_eq!(v, vec![sp(A), sp(B)]);
}

#[test]
fn size_aware_evicts_large_first_but_ages() {
    let eight_pages = Limits {
        max_bytes: 8 * P,
        max_entries: 100,
    };
    let big_a = (0, 4);
    let d2 = (30, 2);
    let f4 = (50, 4);
    let g2 = (60, 2);
    let h4 = (70, 4);
    let i1 = (80, 1);
    let v = victims(
        Policy::SizeAware,
        eight_pages,
        &[big_a, B, C, d2, E, f4, g2, g2, h4, i1],
    );
    // With cost 1 per registration, value = L + 1/pages (in units of 1):
    // A=1/4, B=1, C=1, D=1/2 fill the 8 pages. E evicts A (L=1/4; E=5/4).
    // F (4 pages) evicts D (L=1/2; F=3/4). G (2 pages) evicts F, the largest (L=3/4; G=5/4).
    // G is hit (G=5/4). H (4 pages) needs room: B and C (value 1, set when L was 0) are the
    // lowest although small — values age — and B, used earlier, goes (L=1; H=5/4). I evicts C.
    assert_eq!(
        v,
        vec![sp(big_a), sp(d2), sp(f4), sp(B), sp(C)],
        "victims in order"
    );
}

#[test]
fn in_use_entries_are_never_evicted_and_fallback_when_all_are() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 2);
    let a = miss(c.acquire(pg(0), P).unwrap());
    let b = miss(c.acquire(pg(10), P).unwrap());
    assert_eq!(c.acquire(pg(20), P).unwrap(), Acquire::Fallback);
    assert_eq!(f.registered_spans().len(), 2, "no registration attempted");
    c.release(b.handle).unwrap();
    let n = miss(c.acquire(pg(20), P).unwrap());
    assert_eq!(
        f.deregistered_spans(),
        vec![pages(10, 1)],
        "B, not A in use"
    );
    assert!(f.is_live(a.lkey) && f.is_live(n.lkey));
    let k = c.counters();
    assert_eq!((k.fallbacks, k.evictions, k.entries_in_use), (1, 1, 2));
    c.check_invariants();
}

#[test]
fn fallback_by_bytes_keeps_cached_entries() {
    let (mut c, f) = cache(Policy::Lru, 3 * P, 100);
    let a = miss(c.acquire(pg(0), 2 * P).unwrap());
    miss(touch(&mut c, pg(10), P));
    // Two more pages cannot fit while A holds two of three: fall back without evicting.
    assert_eq!(c.acquire(pg(20), 2 * P).unwrap(), Acquire::Fallback);
    assert_eq!(f.live_keys().len(), 2);
    assert!(c.is_cached(pg(10), P));
    // Larger than the whole cache: fall back.
    assert_eq!(c.acquire(pg(40), 4 * P).unwrap(), Acquire::Fallback);
    // One page fits after evicting the unused one.
    miss(touch(&mut c, pg(20), P));
    assert_eq!(f.deregistered_spans(), vec![pages(10, 1)]);
    c.release(a.handle).unwrap();
    let k = c.counters();
    assert_eq!((k.fallbacks, k.peak_bytes_pinned), (2, 3 * P));
}

#[test]
fn invalidating_an_unused_entry_deregisters_at_once() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    let a = miss(touch(&mut c, pg(0), 2 * P));
    assert_eq!(c.invalidate(pg(1), P), 1);
    assert!(
        f.live_keys().is_empty(),
        "unpinned at once (Wyckoff05 section VII)"
    );
    c.check_invariants();
    let b = miss(touch(&mut c, pg(0), 2 * P));
    assert_ne!(b.lkey, a.lkey, "never the stale registration");
    let k = c.counters();
    assert_eq!(
        (k.invalidations, k.deregistrations, k.bytes_pinned),
        (1, 1, 2 * P)
    );
}

#[test]
fn invalidating_an_entry_in_use_defers_deregistration_to_release() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    let a = miss(c.acquire(pg(0), 2 * P).unwrap());
    assert_eq!(c.invalidate(pg(0), 2 * P), 1);
    c.check_invariants();
    assert!(f.is_live(a.lkey), "the in-flight transfer still uses it");
    assert_eq!(
        c.lease(a.handle),
        Some(a),
        "its keys stay valid for that transfer"
    );
    let b = miss(c.acquire(pg(0), 2 * P).unwrap());
    assert_ne!(b.lkey, a.lkey, "a new acquire never gets the invalid one");
    c.release(a.handle).unwrap();
    assert!(!f.is_live(a.lkey), "deregistered at its last release");
    c.release(b.handle).unwrap();
    assert!(f.is_live(b.lkey), "the new one stays cached");
    assert_eq!(c.counters().invalidations, 1);
    c.check_invariants();
}

#[test]
fn invalidating_part_of_an_entry_drops_it_whole() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    miss(touch(&mut c, pg(0), 4 * P));
    miss(touch(&mut c, pg(10), P));
    miss(touch(&mut c, pg(20), P));
    assert_eq!(
        c.invalidate(pg(4), 6 * P),
        0,
        "touching ranges do not overlap"
    );
    assert_eq!(c.invalidate(pg(2) + 10, 1), 1, "one byte of one page");
    assert!(!c.is_cached(pg(0), P), "the untouched pages went with it");
    assert_eq!(f.deregistered_spans(), vec![pages(0, 4)]);
    assert_eq!(
        c.invalidate(pg(9), 20 * P),
        2,
        "a range over two entries and gaps"
    );
    assert!(f.live_keys().is_empty());
    assert_eq!(c.invalidate(pg(0), 0), 0);
    assert_eq!(c.invalidate(u64::MAX - 10, 100), 0, "clamped, not wrapped");
    c.check_invariants();
}

#[test]
fn registrar_out_of_resources_evicts_and_retries_then_falls_back() {
    // The registrar's own limit (2 pages) is below the cache's (10): the cache learns it
    // from NoResources.
    let f = FakeRegistrar::with_limit(2 * P);
    let lim = Limits {
        max_bytes: 10 * P,
        max_entries: 10,
    };
    let mut c = PinDownCache::new(f.clone(), Policy::Lru, lim);
    miss(touch(&mut c, pg(0), P));
    miss(touch(&mut c, pg(10), P));
    let n = miss(c.acquire(pg(20), P).unwrap());
    assert_eq!(f.deregistered_spans(), vec![pages(0, 1)]);
    let k = c.counters();
    assert_eq!((k.resource_retries, k.evictions), (1, 1));
    let m = hit(c.acquire(pg(10), P).unwrap());
    // Both pages of the registrar are held now: nothing to evict, fall back.
    assert!(f.is_live(n.lkey) && f.is_live(m.lkey));
    assert_eq!(c.acquire(pg(30), P).unwrap(), Acquire::Fallback);
    let k = c.counters();
    assert_eq!((k.fallbacks, k.resource_retries), (1, 2));
    c.check_invariants();
}

#[test]
fn not_mapped_is_an_error_and_not_retried() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    f.unmap(pg(5), P);
    let e = c.acquire(pg(5) + 8, 16).unwrap_err();
    assert!(e.is_not_mapped(), "{e}");
    assert_eq!(f.log.lock().attempts.len(), 1);
    let k = c.counters();
    assert_eq!((k.misses, k.fallbacks, k.entries), (1, 0, 0));
    c.check_invariants();
}

#[test]
fn a_stale_neighbour_is_left_to_the_monitor() {
    // A's first page was unmapped and the monitor has not said so yet: a request sharing
    // A's second page registers its own span and never touches A's stale one.
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    let a = miss(touch(&mut c, pg(0), 2 * P));
    f.unmap(pg(0), P);
    let b = miss(touch(&mut c, pg(1), 2 * P));
    assert_eq!((b.base, b.len), (pg(1), 2 * P));
    assert_eq!(f.log.lock().attempts, vec![pages(0, 2), pages(1, 2)]);
    // The monitor's report then drops A.
    c.invalidate(pg(0), P);
    assert!(!f.is_live(a.lkey));
    assert!(f.is_live(b.lkey));
    c.check_invariants();
}

#[test]
fn drop_deregisters_everything() {
    let f = FakeRegistrar::new();
    {
        let mut c = PinDownCache::new(f.clone(), Policy::Fifo, THREE);
        let _held = miss(c.acquire(pg(0), P).unwrap());
        miss(touch(&mut c, pg(10), 3 * P));
        let _doomed = miss(c.acquire(pg(20), P).unwrap());
        c.invalidate(pg(20), P);
        assert_eq!(f.live_keys().len(), 3);
    }
    let log = f.log.lock();
    assert!(log.live.is_empty(), "nothing stays pinned");
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    assert_eq!(log.registered.len(), log.deregistered.len());
}

#[test]
fn releases_are_checked() {
    let (mut c, _f) = cache(Policy::Lru, 1 << 20, 16);
    let a = miss(c.acquire(pg(0), P).unwrap());
    assert_eq!(LeaseHandle::from_token(a.handle.token()), a.handle);
    c.release(a.handle).unwrap();
    assert!(matches!(
        c.release(a.handle),
        Err(Error::UnknownLease { .. })
    ));
    assert!(matches!(
        c.release(LeaseHandle::from_token(999)),
        Err(Error::UnknownLease { token: 999 })
    ));
    assert_eq!(c.lease(a.handle), None);
    c.check_invariants();
}

#[test]
fn empty_and_wrapping_ranges() {
    let (mut c, f) = cache(Policy::Lru, 1 << 20, 16);
    assert_eq!(c.acquire(pg(0), 0).unwrap(), Acquire::Fallback);
    assert!(matches!(
        c.acquire(u64::MAX - 10, 100),
        Err(Error::InvalidRange { .. })
    ));
    assert!(matches!(
        c.acquire(u64::MAX - 10, 5),
        Err(Error::InvalidRange { .. })
    ));
    assert!(f.log.lock().attempts.is_empty());
    assert!(!c.is_cached(pg(0), 0));
}

#[test]
fn counters_add_up() {
    let (mut c, f) = cache(Policy::Lru, 4 * P, 2);
    miss(touch(&mut c, pg(0), P)); // miss, reg
    hit(touch(&mut c, pg(0), 10)); // hit
    let held = miss(c.acquire(pg(10), 2 * P).unwrap()); // miss, reg
    miss(touch(&mut c, pg(20), P)); // miss, evicts pg0, reg
    assert_eq!(c.acquire(pg(30), 3 * P).unwrap(), Acquire::Fallback); // miss, fallback
    assert_eq!(c.invalidate(pg(10), 1), 1); // in use: deferred
    c.release(held.handle).unwrap(); // deregisters pg10
    assert_eq!(c.flush(), 1); // pg20
    let k = c.counters();
    assert_eq!(k.hits, 1);
    assert_eq!(k.misses, 4);
    assert_eq!(k.registrations, 3);
    assert_eq!(k.evictions, 2);
    assert_eq!(k.invalidations, 1);
    assert_eq!(k.fallbacks, 1);
    assert_eq!(k.deregistrations, 3);
    assert_eq!(k.deregister_failures, 0);
    assert_eq!(k.bytes_pinned, 0);
    assert_eq!(k.peak_bytes_pinned, 3 * P);
    assert_eq!((k.entries, k.entries_in_use), (0, 0));
    assert!(f.live_keys().is_empty());
}

/// xorshift64*: a small deterministic generator for the property loop.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random acquire/release/invalidate sequences, checking after every step: the limits hold,
/// the cache's account matches the registrar's, no leased registration was deregistered,
/// an invalidated registration is never returned, the registrar's contract holds; and after
/// drop nothing stays registered, each registration deregistered exactly once.
/// Returns the counters before drop and how many invalidations found their entry in use.
fn property_run(policy: Policy, seed: u64, steps: usize) -> (CacheCounters, u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let limits = if seed % 2 == 0 {
        Limits {
            max_bytes: 32 * P,
            max_entries: 6,
        }
    } else {
        Limits {
            max_bytes: 12 * P,
            max_entries: 64,
        }
    };
    // A third of the runs have a registrar limit below the cache's.
    let f = if seed % 3 == 0 {
        FakeRegistrar::with_limit(20 * P)
    } else {
        FakeRegistrar::new()
    };
    // Pages 60..64 are a hole that is never mapped.
    f.unmap(pg(60), 4 * P);
    let mut c = PinDownCache::new(f.clone(), policy, limits);
    let mut held: Vec<PinLease> = Vec::new();
    let mut stale: HashSet<u32> = HashSet::new();
    let mut seen: HashSet<u32> = HashSet::new();
    let mut deferred = 0;
    for step in 0..steps {
        let what = rng.below(10);
        let ctx = format!("{policy} seed {seed} step {step}");
        if what < 5 {
            let addr = BASE + rng.below(62 * P);
            let max = if rng.below(4) == 0 { 14 * P } else { 2 * P };
            let len = 1 + rng.below(max);
            let was_cached = c.is_cached(addr, len);
            match c.acquire(addr, len) {
                Ok(Acquire::Fallback) => assert!(!was_cached, "{ctx}: fallback on a hit"),
                Ok(a) => {
                    assert_eq!(a.is_hit(), was_cached, "{ctx}: hit iff covered");
                    let l = *a.lease().unwrap();
                    assert!(!stale.contains(&l.lkey), "{ctx}: invalid entry returned");
                    assert!(
                        l.base <= addr && addr + len <= l.base + l.len,
                        "{ctx}: lease does not cover the request"
                    );
                    assert!(f.is_live(l.lkey), "{ctx}: lease on a dead registration");
                    if a.is_hit() {
                        assert!(seen.contains(&l.lkey), "{ctx}: hit on an unknown key");
                    } else {
                        assert!(seen.insert(l.lkey), "{ctx}: a miss reused a key");
                    }
                    if rng.below(2) == 0 {
                        c.release(l.handle).unwrap();
                    } else {
                        held.push(l);
                    }
                }
                Err(e) => {
                    assert!(e.is_not_mapped(), "{ctx}: {e}");
                    assert!(
                        span(addr, addr + len).overlaps(&pages(60, 4)),
                        "{ctx}: not mapped outside the hole"
                    );
                }
            }
        } else if what < 8 {
            if !held.is_empty() {
                let l = held.swap_remove(rng.below(held.len() as u64) as usize);
                c.release(l.handle).unwrap();
            }
        } else {
            let addr = BASE + rng.below(64 * P);
            let len = rng.below(6 * P);
            let range = span(addr, addr + len);
            for r in f.log.lock().live.values() {
                if span(r.addr, r.addr + r.len).overlaps(&range) {
                    stale.insert(r.lkey);
                    if held.iter().any(|l| l.lkey == r.lkey) {
                        deferred += 1;
                    }
                }
            }
            c.invalidate(addr, len);
        }
        c.check_invariants();
        let k = c.counters();
        assert!(k.bytes_pinned <= limits.max_bytes, "{ctx}: over max_bytes");
        assert!(
            k.entries <= limits.max_entries as u64,
            "{ctx}: over max_entries"
        );
        let log = f.log.lock();
        assert_eq!(k.bytes_pinned, log.live_bytes(), "{ctx}: pinned bytes");
        assert_eq!(k.entries, log.live.len() as u64, "{ctx}: entries");
        assert!(log.violations.is_empty(), "{ctx}: {:?}", log.violations);
        for l in &held {
            assert!(
                log.live.contains_key(&l.lkey),
                "{ctx}: an entry in use was deregistered"
            );
        }
    }
    let k = c.counters();
    for l in held.drain(..) {
        c.release(l.handle).unwrap();
    }
    drop(c);
    let log = f.log.lock();
    assert!(log.live.is_empty(), "registrations left after drop");
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    let mut reg: Vec<u32> = log.registered.iter().map(|r| r.lkey).collect();
    let mut dereg: Vec<u32> = log.deregistered.iter().map(|r| r.lkey).collect();
    reg.sort_unstable();
    dereg.sort_unstable();
    assert_eq!(reg, dereg, "each registration deregistered exactly once");
    (k, deferred)
}

#[test]
fn random_sequences_keep_every_invariant() {
    for policy in Policy::ALL {
        let mut sum = CacheCounters::default();
        let mut deferred = 0;
        for seed in 1..=24 {
            let (k, d) = property_run(policy, seed, 1500);
            sum.hits += k.hits;
            sum.misses += k.misses;
            sum.evictions += k.evictions;
            sum.fallbacks += k.fallbacks;
            sum.merged += k.merged;
            sum.superseded += k.superseded;
            sum.resource_retries += k.resource_retries;
            sum.invalidations += k.invalidations;
            deferred += d;
        }
        // The runs reach every path they are meant to check.
        for (name, n) in [
            ("hits", sum.hits),
            ("misses", sum.misses),
            ("evictions", sum.evictions),
            ("fallbacks", sum.fallbacks),
            ("merged", sum.merged),
            ("superseded", sum.superseded),
            ("resource_retries", sum.resource_retries),
            ("invalidations", sum.invalidations),
            ("invalidations of entries in use", deferred),
        ] {
            assert!(n > 0, "{policy}: no {name} in the random runs");
        }
    }
}

#[test]
fn invalidate_from_another_thread_while_in_use() {
    let f = FakeRegistrar::new();
    let shared = SharedPinDownCache::new(PinDownCache::new(f.clone(), Policy::Lru, THREE));
    let a = miss(shared.acquire(pg(0), P).unwrap());
    let monitor = shared.clone();
    let n = std::thread::spawn(move || monitor.invalidate(pg(0), P))
        .join()
        .unwrap();
    assert_eq!(n, 1);
    assert!(
        f.is_live(a.lkey),
        "in use: not deregistered by the monitor's thread"
    );
    assert_eq!(shared.lease(a.handle), Some(a));
    let b = miss(shared.acquire(pg(0), P).unwrap());
    assert_ne!(b.lkey, a.lkey);
    shared.release(a.handle).unwrap();
    assert!(!f.is_live(a.lkey));
    shared.release(b.handle).unwrap();
    assert!(f.is_live(b.lkey));
    shared.lock().check_invariants();
    drop(shared);
    assert!(f.live_keys().is_empty());
}

#[test]
fn concurrent_invalidations_never_pull_a_registration_from_under_a_lease() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SharedPinDownCache<FakeRegistrar>>();
    assert_send_sync::<SharedPinDownCache<crate::NicRef<'static>>>();

    let f = FakeRegistrar::new();
    let shared = SharedPinDownCache::new(PinDownCache::new(
        f.clone(),
        Policy::Lru,
        Limits {
            max_bytes: 16 * P,
            max_entries: 4,
        },
    ));
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let monitor = shared.clone();
        let stop = &stop;
        s.spawn(move || {
            let mut rng = Rng(7);
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 1000 {
                monitor.invalidate(pg(rng.below(8) * 4), P);
                n += 1;
                if n % 16 == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let mut rng = Rng(11);
        for _ in 0..20_000 {
            let buf = rng.below(8) * 4;
            if let Some(l) = shared.acquire(pg(buf), 2 * P).unwrap().lease().copied() {
                for _ in 0..3 {
                    assert!(f.is_live(l.lkey), "deregistered while leased");
                    std::thread::yield_now();
                }
                shared.release(l.handle).unwrap();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let k = shared.counters();
    assert!(k.invalidations > 0 && k.hits > 0, "{k:?}");
    shared.lock().check_invariants();
    drop(shared);
    let log = f.log.lock();
    assert!(log.live.is_empty());
    assert!(log.violations.is_empty(), "{:?}", log.violations);
}

/// IMB's `-off_cache` rotation: buffers `len + 64` bytes apart, so each shares a page with
/// the next; each gets a registration of its own (no hull that grows with every buffer and
/// is re-pinned whole). A buffer used twice in a row hits the second time. (IMB's own PingPong sends and receives through different
/// rotating buffers, so there it never reuses one: Lesokhin17 Fig. 9.)
#[test]
fn imb_off_cache_rotation_hits_on_reuse() {
    let len = 128 << 10;
    let (mut c, f) = cache(Policy::Lru, 5 << 20, 1024);
    for i in 0..200u64 {
        let addr = BASE + i * (len + 64);
        touch(&mut c, addr, len);
        touch(&mut c, addr, len);
    }
    let k = c.counters();
    assert_eq!((k.hits, k.misses), (200, 200), "{k:?}");
    assert!(k.peak_bytes_pinned <= 5 << 20, "{k:?}");
    // Pinning is linear in the buffers: each miss registers its own pages, once.
    let pinned: u64 = f.log.lock().attempts.iter().map(|s| s.len()).sum();
    assert!(pinned <= 200 * (len + 2 * P), "{pinned} bytes registered");
}
