//! Memory regions: registration (pinned or on demand), deregistration that waits until no
//! byte of the region is moving, and pinned regions detached onto a copy of their pages
//! when the application replaces the range (`bound.rs`).

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};

use pagewire_nic::{Access, RegionInfo};
use pagewire_sys as sys;
use pagewire_sys::error::{Error, Result};

use crate::pin::{PinAccount, RegionPin};
use crate::tpt::{self, Translation, ADDRESS_SPACE_END, MAX_MRS};
use crate::Inner;

/// How long a deregistration waits for an entry's in-use count before it looks at who holds
/// it (a live holder is waited for, a dead one's count is written off).
pub(super) const HOLDERS_CHECK_AFTER: Duration = Duration::from_millis(100);

/// Local bookkeeping of this NIC's regions.
pub(crate) struct RegionBook {
    pub(super) regions: Vec<Option<RegionInfo>>,
    /// How each pinned region holds its pages (by table index).
    pub(super) held: Vec<Option<HeldPages>>,
    pub(super) pins: PinAccount,
}

/// The pages a pinned region holds, and what the NIC needs to keep using them.
pub(super) struct HeldPages {
    pub(super) pin: RegionPin,
    /// The memory monitor's watch on the range (long-term pins only).
    pub(super) watch: Option<pagewire_memmon::SubscriptionId>,
    /// The copy of the pinned pages the region uses once the application replaced them.
    pub(super) detached: Option<sys::PinnedSnapshot>,
}

impl Inner {
    pub(super) fn region(&self, lkey: u32) -> Result<RegionInfo> {
        let r = self.regions.lock();
        r.regions[(lkey as usize) % MAX_MRS]
            .filter(|m| m.lkey == lkey)
            .ok_or(Error::UnknownKey { key: lkey })
    }

    pub(super) fn deregister(&self, lkey: u32) -> Result<()> {
        let t0 = sys::monotonic_ns();
        let mut book = self.regions.lock();
        let idx = lkey as usize % MAX_MRS;
        let info = book.regions[idx]
            .filter(|m| m.lkey == lkey)
            .ok_or(Error::UnknownKey { key: lkey })?;
        self.own.tpt().invalidate(lkey);
        self.own.tpt_cache().evict(lkey);
        self.wait_until_unused(lkey);
        book.regions[idx] = None;
        let mut unwatch = None;
        if let Some(held) = book.held[idx].take() {
            unwatch = held.watch;
            let freed = book.pins.unpin(info.addr, info.len, held.pin);
            self.counters.sub_pinned(freed);
        }
        drop(book);
        if let Some(id) = unwatch {
            self.bound.unsubscribe(id);
        }
        self.counters
            .record_registration(false, sys::monotonic_ns().saturating_sub(t0));
        Ok(())
    }

    /// Waits until no engine moves bytes through `lkey`'s entry any more, as `ibv_dereg_mr`
    /// returns only once the HCA has stopped using the region: with no deadline, since
    /// unpinning under a live holder would let its bytes land in whatever the application
    /// maps there next. A holder that is stopped (SIGSTOP) is waited for.
    /// A count left by a peer that died mid-DMA is recognised — this rank's own engine,
    /// whose holds never outlive its lock, is held, and no live peer claims the entry — and
    /// the entry is retired instead of reused.
    pub(super) fn wait_until_unused(&self, lkey: u32) {
        let tpt = self.own.tpt();
        let start = Instant::now();
        while tpt.in_use(lkey) != 0 {
            if start.elapsed() < HOLDERS_CHECK_AFTER {
                std::thread::yield_now();
                continue;
            }
            let engine = self.engine.lock();
            if tpt.in_use(lkey) == 0 {
                return;
            }
            let tag = tpt::claim_tag(self.rank, lkey);
            let live_holder = self.peers.iter().enumerate().any(|(r, p)| {
                r != self.rank && p.mem.remote_claim().load(SeqCst) == tag && p.is_alive()
            });
            drop(engine);
            if !live_holder {
                tpt.retire(lkey);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The owner entered the NIC: deliver address-space changes to ODP's present bits and
    /// detach the pinned regions whose range changed (`bound.rs`).
    pub(crate) fn on_entry(&self) {
        self.watch.on_post();
        if let Some(changed) = self.bound.take_changes() {
            self.detach(&changed);
        }
    }

    /// Points every live long-term-pinned region overlapping `changed` at a copy of its
    /// pinned pages, if the change reached its watch: a region registered after the change
    /// (over the new pages of a range freed and handed out again) keeps the fast path.
    pub(super) fn detach(&self, changed: &[(u64, u64)]) {
        let mut book = self.regions.lock();
        let tpt = self.own.tpt();
        for idx in 0..MAX_MRS {
            let Some(info) = book.regions[idx] else {
                continue;
            };
            let (start, span) = sys::page_span(info.addr, info.len);
            let hit = changed.iter().any(|&(a, b)| a < start + span && start < b);
            let RegionBook { held, pins, .. } = &mut *book;
            let Some(h) = held[idx].as_mut() else {
                continue;
            };
            let reached = h.watch.is_some_and(|id| self.bound.reached(id));
            if !hit || !reached || h.detached.is_some() {
                continue;
            }
            match pins.snapshot(&h.pin) {
                Some(Ok(copy)) => {
                    let alias = copy.addr() + (info.addr - start);
                    tpt.publish(Translation {
                        key: info.lkey,
                        base: info.addr,
                        len: info.len,
                        access: info.access,
                        alias,
                    });
                    h.detached = Some(copy);
                    self.counters.detached_regions.fetch_add(1, Relaxed);
                }
                Some(Err(e)) => eprintln!(
                    "pagewire: soft NIC: region {:#010x} ({:#x}+{}) changed under its \
                     registration, but its pinned pages could not be copied ({e}); DMA \
                     through it follows the address range",
                    info.lkey, info.addr, info.len
                ),
                None => {}
            }
        }
    }

    pub(super) fn register(&self, addr: u64, len: u64, access: Access) -> Result<RegionInfo> {
        let t0 = sys::monotonic_ns();
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a zero-length region".into(),
            ));
        }
        if addr
            .checked_add(len)
            .is_none_or(|end| end > ADDRESS_SPACE_END)
        {
            return Err(Error::InvalidArgument(format!(
                "region {addr:#x}+{len} lies outside the user address space"
            )));
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "REMOTE_WRITE requires LOCAL_WRITE (as in verbs)".into(),
            ));
        }
        // Watched before the pin, so a change between the two is not missed; outside the
        // book's lock, which the monitor's sinks may take (a cache deregistering).
        let watch = if access.contains(Access::ON_DEMAND) {
            None
        } else {
            self.bound.subscribe(addr, len)
        };
        let mut unwatch = None;
        let mut book = self.regions.lock();
        let tpt = self.own.tpt();
        // A free entry that still has a key it never issued.
        let free = book.regions.iter().enumerate().filter(|(_, r)| r.is_none());
        let Some((idx, key)) = free
            .filter_map(|(i, _)| tpt.fresh_key(i).map(|k| (i, k)))
            .next()
        else {
            drop(book);
            if let Some(id) = watch {
                self.bound.unsubscribe(id);
            }
            return Err(Error::Exhausted {
                what: "memory regions",
                limit: MAX_MRS as u64,
                hint: "deregister regions you no longer use, or use implicit ODP",
            });
        };
        if !access.contains(Access::ON_DEMAND) {
            let (pinned, pin) = match book.pins.pin(addr, len) {
                Ok(p) => p,
                Err(e) => {
                    drop(book);
                    if let Some(id) = watch {
                        self.bound.unsubscribe(id);
                    }
                    return Err(e);
                }
            };
            let watch = match (&pin, watch) {
                (RegionPin::LongTerm(_), w) => w,
                (RegionPin::Locked, w) => {
                    unwatch = w;
                    None
                }
            };
            self.counters.add_pinned(pinned);
            book.held[idx] = Some(HeldPages {
                pin,
                watch,
                detached: None,
            });
        }
        tpt.publish(Translation {
            key,
            base: addr,
            len,
            access,
            alias: 0,
        });
        let info = RegionInfo {
            addr,
            len,
            lkey: key,
            rkey: key,
            access,
        };
        book.regions[idx] = Some(info);
        drop(book);
        if let Some(id) = unwatch {
            self.bound.unsubscribe(id);
        }
        self.counters
            .record_registration(true, sys::monotonic_ns().saturating_sub(t0));
        Ok(info)
    }
}
