//! The cache over the real soft NIC in one rank. Its registrations pin with `mlock`, so the
//! kernel's own account (VmLck in /proc/self/status) shows what the cache keeps pinned.
//!
//! One test in this binary on purpose: VmLck is per process, and another test pinning in a
//! parallel thread would disturb it.

mod common;

use pagewire_pindown::{Acquire, Limits, NicRegistrar, PinDownCache, Policy};
use pagewire_transport::nic::soft::PinMethod;
use pagewire_transport::nic::Nic;
use pagewire_transport::sys::{vm_locked_and_resident, AnonMapping};

const BUF: usize = 256 << 10;

fn vm_lck() -> u64 {
    vm_locked_and_resident().expect("read /proc/self/status").0
}

#[test]
fn vmlck_stays_within_max_bytes_and_returns_after_drop() {
    // VmLck moves only with mlock.
    let nic = common::soft_nic(64 << 20, PinMethod::Mlock);
    // 16 buffers of 256 KiB (4 MiB) through a cache of 1 MiB.
    let bufs: Vec<AnonMapping> = (0..16).map(|_| AnonMapping::new(BUF).unwrap()).collect();
    let max_bytes: u64 = 1 << 20;
    let start = vm_lck();
    let nic_start = nic.memlock().1;
    for policy in Policy::ALL {
        let mut cache = PinDownCache::new(
            NicRegistrar::new(&nic),
            policy,
            Limits {
                max_bytes,
                max_entries: 64,
            },
        );
        let mut peak = 0;
        for _round in 0..3 {
            for b in &bufs {
                // Unaligned inside the buffer: the registration rounds out to its pages.
                let a = cache.acquire(b.addr() + 100, BUF as u64 - 200).unwrap();
                let l = *a
                    .lease()
                    .unwrap_or_else(|| panic!("{policy}: one buffer fits"));
                assert_eq!((l.base, l.len), (b.addr(), BUF as u64));
                let locked = vm_lck().saturating_sub(start);
                peak = peak.max(locked);
                assert!(
                    locked <= max_bytes,
                    "{policy}: VmLck grew by {locked} bytes, max_bytes is {max_bytes}"
                );
                assert!(nic.memlock().1 - nic_start <= max_bytes);
                cache.release(l.handle).unwrap();
            }
        }
        // The last buffer is still cached: a hit, no new pin.
        let last = bufs.last().unwrap();
        let a = cache.acquire(last.addr(), BUF as u64).unwrap();
        assert!(matches!(a, Acquire::Hit(_)), "{policy}: {a:?}");
        cache.release(a.lease().unwrap().handle).unwrap();
        let k = cache.counters();
        assert!(k.evictions > 0, "{policy}: {k:?}");
        assert!(k.peak_bytes_pinned <= max_bytes);
        assert_eq!(peak, max_bytes, "{policy}: the cache fills up to its limit");
        assert_eq!(k.fallbacks, 0);
        drop(cache);
        assert_eq!(vm_lck(), start, "{policy}: everything unpinned after drop");
        assert_eq!(nic.memlock().1, nic_start);
        assert_eq!(nic.counters().pinned_now, nic_start);
    }
}
