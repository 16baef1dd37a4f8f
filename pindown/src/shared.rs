//! The cache shared between the message layer's thread and a memory-monitor thread.
//!
//! The message layer is single-threaded, but invalidations arrive from the monitor's thread
//! (Wyckoff05 section VI-A: "allocate a separate thread to wait for VM changes ... The
//! messaging library must be sure to provide locking around the use and modification of
//! registrations in this scenario"; section VII measured that thread as the faster
//! option). One mutex serialises every operation, and the lock is held only inside each
//! call, never across a transfer: a lease is a token, not a guard. An invalidation that
//! finds an entry in use marks it invalid under the lock, so the next acquire cannot get
//! it, and its deregistration happens in whichever thread releases the last lease.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use crate::cache::{Acquire, CacheCounters, LeaseHandle, PinDownCache, PinLease};
use crate::error::Result;
use crate::registrar::Registrar;

/// A [`PinDownCache`] behind an `Arc<Mutex<_>>`: clone it into the monitor's thread. It is
/// `Send + Sync` when the registrar is `Send`. The last clone dropped drops the cache, which
/// deregisters everything.
#[derive(Debug)]
pub struct SharedPinDownCache<R: Registrar> {
    inner: Arc<Mutex<PinDownCache<R>>>,
}

impl<R: Registrar> Clone for SharedPinDownCache<R> {
    fn clone(&self) -> Self {
        SharedPinDownCache {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<R: Registrar> SharedPinDownCache<R> {
    /// Shares `cache`.
    pub fn new(cache: PinDownCache<R>) -> Self {
        SharedPinDownCache {
            inner: Arc::new(Mutex::new(cache)),
        }
    }

    /// Locks the cache for several operations in a row.
    pub fn lock(&self) -> MutexGuard<'_, PinDownCache<R>> {
        self.inner.lock()
    }

    /// [`PinDownCache::acquire`] under the lock.
    pub fn acquire(&self, addr: u64, len: u64) -> Result<Acquire> {
        self.inner.lock().acquire(addr, len)
    }

    /// [`PinDownCache::release`] under the lock.
    pub fn release(&self, h: LeaseHandle) -> Result<()> {
        self.inner.lock().release(h)
    }

    /// [`PinDownCache::lease`] under the lock.
    pub fn lease(&self, h: LeaseHandle) -> Option<PinLease> {
        self.inner.lock().lease(h)
    }

    /// [`PinDownCache::invalidate`] under the lock: what a monitor's subscriber calls.
    pub fn invalidate(&self, addr: u64, len: u64) -> usize {
        self.inner.lock().invalidate(addr, len)
    }

    /// A handle that does not keep the cache alive (for a monitor's sink, which the cache's
    /// registrar in turn keeps alive: a strong handle there would be a cycle).
    pub fn downgrade(&self) -> WeakPinDownCache<R> {
        WeakPinDownCache {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// [`PinDownCache::counters`] under the lock.
    pub fn counters(&self) -> CacheCounters {
        self.inner.lock().counters()
    }
}

/// A [`SharedPinDownCache`] handle that does not keep the cache alive.
#[derive(Debug)]
pub struct WeakPinDownCache<R: Registrar> {
    inner: std::sync::Weak<Mutex<PinDownCache<R>>>,
}

impl<R: Registrar> WeakPinDownCache<R> {
    /// The cache, if it still exists.
    pub fn upgrade(&self) -> Option<SharedPinDownCache<R>> {
        self.inner
            .upgrade()
            .map(|inner| SharedPinDownCache { inner })
    }
}
