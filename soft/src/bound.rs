//! Pinned regions stay bound to the pages they pinned (Wyckoff05).
//!
//! A verbs region keeps using the pages `ibv_reg_mr` pinned: if the application unmaps,
//! moves or discards (`MADV_DONTNEED`) the range while it is registered, the HCA goes on
//! reading the old bytes and writing where the application can no longer see. The soft NIC
//! moves bytes by virtual address, so it must be told: every long-term-pinned region is
//! watched by the memory monitor, and when its range changes the owner *detaches* it at
//! its next NIC entry — the pinned pages are copied (`IORING_OP_WRITE_FIXED` from the pins,
//! [`pagewire_sys::LongTermPins::snapshot`]) into a mapping only the NIC uses, and the region's TPT
//! entry points there ([`super::tpt::Translation::alias`]). From then on every DMA through
//! the region, local or by a peer, reads the old bytes and writes where the application
//! cannot see them, and `detached_bytes` counts it; unchanged regions keep the fast path.
//!
//! The detach is made at the owner's next post or poll, after the monitor's flush (the
//! same ordering contract as ODP invalidation, `odp_watch.rs`): the pinned pages cannot
//! change meanwhile, since the application no longer maps them. Only a change that reached
//! the region's own watch detaches it: a range freed and handed out again at the same
//! address, then registered anew before the next entry, is bound to its new pages (a
//! pin-down cache re-registering a buffer `malloc` gave back; detaching it by range made
//! a rendezvous into it arrive as zeros).
//!
//! What differs from hardware, and why:
//! - A region partly changed is detached whole: its unchanged pages keep, for the NIC, the
//!   bytes they had at the change (hardware would still share them with the application).
//! - `MADV_FREE` is reported like `MADV_DONTNEED` (the monitor cannot tell them apart), so
//!   a region under it is detached, though the kernel keeps pinned pages under `MADV_FREE`.
//! - `fork` detaches nothing: the kernel copies pinned pages for the child at fork, so the
//!   parent keeps its pages, as with a real registration.
//! - With `mlock` pins (`PAGEWIRE_PIN=mlock`, or io_uring unavailable) nothing holds the old
//!   pages once the range is replaced: DMA follows the range, as an `mlock`ed region did.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;

use pagewire_memmon::{
    monitor_for, Cause, ForkPolicy, InvalidationSink, MemoryMonitor, MonitorChoice, MonitorOptions,
    SubscriptionId,
};
use pagewire_sys::error::Result;

/// Ranges whose pages changed under a subscription, waiting for the owner's next entry.
#[derive(Default)]
struct ChangedRanges {
    ranges: Mutex<Vec<(u64, u64)>>,
    any: AtomicBool,
}

impl InvalidationSink for ChangedRanges {
    fn invalidate(&self, addr: u64, len: u64, cause: Cause) {
        // Fork: the kernel copies pinned pages for the child, the parent keeps its own.
        // Lost events: nothing says which regions changed; they stay bound to the range.
        if matches!(cause, Cause::Unmap | Cause::Remap | Cause::Remove) {
            self.ranges.lock().push((addr, addr + len));
            self.any.store(true, Release);
        }
    }
}

/// Watches the ranges of long-term-pinned regions for changes.
pub(crate) struct BoundWatch {
    /// `None`: no monitor works here (or pins are not long-term): nothing is detached.
    monitor: Option<Box<dyn MemoryMonitor>>,
    changes: Arc<ChangedRanges>,
    subscriptions: AtomicU64,
}

impl BoundWatch {
    /// A watch with the monitor `PAGEWIRE_MEMMON` selects, if `long_term` pins are in force.
    pub(crate) fn new(long_term: bool) -> Result<BoundWatch> {
        let changes = Arc::new(ChangedRanges::default());
        let monitor = if long_term {
            let choice = MonitorChoice::parse(std::env::var("PAGEWIRE_MEMMON").ok().as_deref())?;
            // Forks change nothing for the parent's pins (see above).
            let options = MonitorOptions {
                fork: ForkPolicy::Ignore,
            };
            let m = monitor_for(choice, changes.clone(), options, |_| {})?;
            m.is_reliable().then_some(m)
        } else {
            None
        };
        Ok(BoundWatch {
            monitor,
            changes,
            subscriptions: AtomicU64::new(0),
        })
    }

    /// Whether regions are watched (and so detached when their range changes).
    pub(crate) fn active(&self) -> bool {
        self.monitor.is_some()
    }

    /// Watches a region's range; `None` if it cannot be watched (it then follows the
    /// range, as an `mlock`ed region does).
    pub(crate) fn subscribe(&self, addr: u64, len: u64) -> Option<SubscriptionId> {
        let id = self.monitor.as_ref()?.subscribe(addr, len).ok()?;
        self.subscriptions.fetch_add(1, Relaxed);
        Some(id)
    }

    /// Stops watching a region's range.
    pub(crate) fn unsubscribe(&self, id: SubscriptionId) {
        if let Some(m) = &self.monitor {
            m.unsubscribe(id);
            self.subscriptions.fetch_sub(1, Relaxed);
        }
    }

    /// Whether a change reached subscription `id` (as of the last [`BoundWatch::take_changes`]).
    /// A change made before the subscription does not, though its range may overlap: the
    /// buffer a `free()` gave back and `malloc` handed out again is a new range to the
    /// monitor (`memmon/uffd.rs`, "Stale events"), and a region registered over it after
    /// the change is bound to the new pages.
    pub(crate) fn reached(&self, id: SubscriptionId) -> bool {
        self.monitor.as_ref().is_some_and(|m| !m.is_valid(id))
    }

    /// The owner enters the NIC: the ranges changed since the last call (after delivering
    /// every change made before this call). Two atomic loads when nothing changed.
    pub(crate) fn take_changes(&self) -> Option<Vec<(u64, u64)>> {
        let m = self.monitor.as_ref()?;
        if self.subscriptions.load(Relaxed) == 0 {
            return None;
        }
        m.flush();
        if !self.changes.any.load(Acquire) {
            return None;
        }
        self.changes.any.store(false, Relaxed);
        Some(std::mem::take(&mut *self.changes.ranges.lock()))
    }
}
