//! The pin-down cache (Tezuka et al.'s "pin-down cache", Wyckoff05 reference 10; NFS-RDMA
//! "Buffer Registration Cache"): user buffers are registered in place and the registrations
//! kept for reuse, within limits, and dropped when the address space changes under them.
//!
//! # Lookup and the overlap rule
//!
//! Registrations are page-aligned: a request for `[addr, addr+len)` registers the whole
//! pages it touches. The index holds the valid registrations; two may share pages, but none
//! contains another.
//!
//! - **Hit**: one indexed registration covers all of `[addr, addr+len)`.
//! - **Miss**: otherwise the cache registers the request's page span `S`. Indexed
//!   registrations **inside** `S` leave the index, since the new one covers them: unused
//!   ones are deregistered ("merged"), so a buffer first sent in pieces and then whole ends
//!   up as one registration, not as nested copies; ones **in use** are "superseded" (never
//!   returned again, deregistered when their last lease is released). Registrations that
//!   only **share pages** with `S` stay: two buffers side by side on the heap, sharing a
//!   page, get a registration each, as Open MPI's registration cache and an HCA allow. (The
//!   earlier rule, one registration over the hull of everything overlapping, made a stream
//!   of such buffers — IMB's `-off_cache` — grow one registration by a buffer at every miss
//!   and re-pin all of it each time.)
//!
//! # Limits and fallback
//!
//! Every live registration counts against [`Limits`] (cached, or superseded/invalidated but
//! still held by a lease), so the bytes the cache keeps pinned never exceed `max_bytes` and
//! its registrations never exceed `max_entries`. To make room a miss evicts unused entries
//! in the [`Policy`]'s order; entries in use by an in-flight transfer are never evicted. If
//! the registration cannot fit even after evicting every unused entry, or the registrar runs
//! out of resources with nothing left to evict, [`PinDownCache::acquire`] answers
//! [`Acquire::Fallback`] and the caller copies instead (docs/architecture.md).
//!
//! # Lazy deregistration and invalidation
//!
//! Releasing a lease keeps its registration cached; deregistration happens only on
//! eviction, on invalidation, or when the cache is dropped. [`PinDownCache::invalidate`]
//! (called when the memory monitor reports an unmap, remap, discard or fork, Wyckoff05
//! sections IV and VI) removes every overlapping registration from the index at once, so it
//! is never handed out again; an unused one is deregistered (unpinned) immediately and one
//! in use when its last lease is released — so no pinned page outlives its mapping, the
//! leak of Wyckoff05 section VII, and no stale registration is ever used for a new transfer.

use std::collections::HashMap;

use pagewire_transport::nic::PAGE_SIZE;

use crate::error::{Error, Result};
use crate::interval::{EntryId, IntervalIndex, Span};
use crate::limits::{CacheConfig, Limits};
use crate::policy::{EvictionOrder, Policy, UseStats};
use crate::registrar::{RegisterError, Registrar, Registration};

/// Names one acquisition; give it back to [`PinDownCache::release`] exactly once.
///
/// Its [`token`](LeaseHandle::token) fits the `token` of the message layer's
/// `buffer_mode::Lease`/`Transfer`. Tokens are never reused, so a stale or doubled release
/// is reported as [`Error::UnknownLease`] instead of releasing someone else's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseHandle(u64);

impl LeaseHandle {
    /// The handle as a number.
    pub fn token(self) -> u64 {
        self.0
    }

    /// The handle whose [`token`](LeaseHandle::token) was `token`.
    pub fn from_token(token: u64) -> LeaseHandle {
        LeaseHandle(token)
    }
}

/// A leased registration: the keys to put in work requests and what the registration
/// covers (which contains the range acquired).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinLease {
    /// Give back with [`PinDownCache::release`].
    pub handle: LeaseHandle,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// First byte of the registration.
    pub base: u64,
    /// Bytes the registration covers from `base`.
    pub len: u64,
}

/// What [`PinDownCache::acquire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// A cached registration covers the range.
    Hit(PinLease),
    /// The range was newly registered.
    Miss(PinLease),
    /// No registration can be had within the limits now (or the range is empty): copy.
    Fallback,
}

impl Acquire {
    /// The lease, unless this is a fallback.
    pub fn lease(&self) -> Option<&PinLease> {
        match self {
            Acquire::Hit(l) | Acquire::Miss(l) => Some(l),
            Acquire::Fallback => None,
        }
    }

    /// A cached registration served the request.
    pub fn is_hit(&self) -> bool {
        matches!(self, Acquire::Hit(_))
    }
}

/// The cache's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Acquires served by a cached registration.
    pub hits: u64,
    /// Acquires no cached registration covered (each then registers or falls back).
    pub misses: u64,
    /// Unused registrations deregistered to make room (or by [`PinDownCache::flush`]).
    pub evictions: u64,
    /// Registrations invalidated because their memory changed.
    pub invalidations: u64,
    /// Acquires answered with [`Acquire::Fallback`].
    pub fallbacks: u64,
    /// Registrations made.
    pub registrations: u64,
    /// Registrations deregistered (for any reason).
    pub deregistrations: u64,
    /// Unused registrations deregistered because a new one overlapping them took their place.
    pub merged: u64,
    /// Registrations in use that a new overlapping one took out of the index.
    pub superseded: u64,
    /// Times the registrar ran out of resources although the limits allowed the
    /// registration (each followed by an eviction and a retry, or a fallback).
    pub resource_retries: u64,
    /// Deregistrations the registrar reported as failed.
    pub deregister_failures: u64,
    /// Bytes pinned by live registrations now.
    pub bytes_pinned: u64,
    /// Most bytes pinned at once.
    pub peak_bytes_pinned: u64,
    /// Live registrations now (cached, or held only by leases).
    pub entries: u64,
    /// Live registrations with at least one lease.
    pub entries_in_use: u64,
}

/// Whether an entry can still be found by lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In the index.
    Cached,
    /// Out of the index for good (invalidated or superseded); deregistered at its last
    /// release. Only entries with leases are in this state.
    Doomed,
}

#[derive(Debug)]
struct Entry {
    reg: Registration,
    span: Span,
    refs: u32,
    state: State,
    stats: UseStats,
}

/// The pin-down cache over a [`Registrar`]. See the [module documentation](self) for the
/// rules.
///
/// Single-threaded; share it with a memory-monitor thread through
/// [`crate::SharedPinDownCache`].
#[derive(Debug)]
pub struct PinDownCache<R: Registrar> {
    registrar: R,
    policy: Policy,
    limits: Limits,
    page: u64,
    index: IntervalIndex,
    entries: HashMap<EntryId, Entry>,
    leases: HashMap<u64, EntryId>,
    order: EvictionOrder,
    next_entry: EntryId,
    next_lease: u64,
    tick: u64,
    pinned: u64,
    c: CacheCounters,
}

impl<R: Registrar> PinDownCache<R> {
    /// An empty cache registering through `registrar`.
    pub fn new(registrar: R, policy: Policy, limits: Limits) -> Self {
        PinDownCache {
            registrar,
            policy,
            limits,
            page: PAGE_SIZE,
            index: IntervalIndex::default(),
            entries: HashMap::new(),
            leases: HashMap::new(),
            order: EvictionOrder::new(policy),
            next_entry: 1,
            next_lease: 1,
            tick: 0,
            pinned: 0,
            c: CacheCounters::default(),
        }
    }

    /// An empty cache with `config`'s policy and limits.
    pub fn with_config(registrar: R, config: CacheConfig) -> Self {
        Self::new(registrar, config.policy, config.limits)
    }

    /// The eviction policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The registrar.
    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// Takes a lease on a registration covering `[addr, addr+len)`: a cached one (a hit),
    /// else a new one, evicting unused entries to make room (a miss), else
    /// [`Acquire::Fallback`]. An empty range is a fallback (there is nothing to register).
    ///
    /// Errors: the range wraps around ([`Error::InvalidRange`]); the registrar reports it
    /// not mapped or fails for a reason other than resources ([`Error::Register`]). Running
    /// out of pinnable memory is never an error.
    pub fn acquire(&mut self, addr: u64, len: u64) -> Result<Acquire> {
        let bad = || Error::InvalidRange { addr, len };
        let want = Span::new(addr, len).ok_or_else(bad)?;
        let span = want.page_aligned(self.page).ok_or_else(bad)?;
        if want.is_empty() {
            self.c.fallbacks += 1;
            return Ok(Acquire::Fallback);
        }
        self.tick += 1;
        if let Some(id) = self.index.covering(want) {
            self.c.hits += 1;
            let e = self.entries.get_mut(&id).expect("indexed entries exist");
            if e.refs == 0 {
                self.order.remove_idle(id);
            }
            e.refs += 1;
            self.order.used(&mut e.stats, self.tick);
            return Ok(Acquire::Hit(self.new_lease(id)));
        }
        self.c.misses += 1;
        match self.register_for(span)? {
            Some(id) => Ok(Acquire::Miss(self.new_lease(id))),
            None => {
                self.c.fallbacks += 1;
                Ok(Acquire::Fallback)
            }
        }
    }

    /// Gives a lease back. The registration stays cached (lazy deregistration) unless it
    /// was invalidated or superseded meanwhile, in which case this last release
    /// deregisters it.
    pub fn release(&mut self, h: LeaseHandle) -> Result<()> {
        let id = self
            .leases
            .remove(&h.0)
            .ok_or(Error::UnknownLease { token: h.0 })?;
        self.tick += 1;
        let e = self.entries.get_mut(&id).expect("leased entries exist");
        e.refs -= 1;
        e.stats.last_used = self.tick;
        if e.refs == 0 {
            match e.state {
                State::Cached => self.order.push_idle(id, &e.stats, e.span.len()),
                State::Doomed => self.destroy(id),
            }
        }
        Ok(())
    }

    /// The lease `h` names, while it is outstanding (also after its registration was
    /// invalidated: the transfer holding it still uses those keys until it releases).
    pub fn lease(&self, h: LeaseHandle) -> Option<PinLease> {
        let id = *self.leases.get(&h.0)?;
        let e = &self.entries[&id];
        Some(PinLease {
            handle: h,
            lkey: e.reg.lkey,
            rkey: e.reg.rkey,
            base: e.reg.addr,
            len: e.reg.len,
        })
    }

    /// `(lkey, rkey, base)` of the lease `h`, while it is outstanding.
    pub fn keys(&self, h: LeaseHandle) -> Option<(u32, u32, u64)> {
        self.lease(h).map(|l| (l.lkey, l.rkey, l.base))
    }

    /// Whether an acquire of `[addr, addr+len)` now would hit (changes nothing, counts
    /// nothing).
    pub fn is_cached(&self, addr: u64, len: u64) -> bool {
        Span::new(addr, len)
            .filter(|s| !s.is_empty())
            .is_some_and(|s| self.index.covering(s).is_some())
    }

    /// The memory `[addr, addr+len)` changed (unmapped, remapped, discarded, or
    /// copy-on-write after fork): every registration overlapping it leaves the index, and
    /// is deregistered now if unused, at its last release otherwise. Returns how many
    /// registrations were invalidated. A registration is invalidated whole even if only a
    /// part of it changed: registrations cannot shrink (Wyckoff05 Fig. 4 revokes the
    /// mappings that overlap the freed page and keeps the others).
    pub fn invalidate(&mut self, addr: u64, len: u64) -> usize {
        let range = Span {
            start: addr,
            end: addr.saturating_add(len),
        };
        let hit = self.index.overlapping(range);
        for &(span, id) in &hit {
            self.index.remove(span.start);
            self.c.invalidations += 1;
            let e = self.entries.get_mut(&id).expect("indexed entries exist");
            if e.refs == 0 {
                self.order.remove_idle(id);
                self.destroy(id);
            } else {
                e.state = State::Doomed;
            }
        }
        hit.len()
    }

    /// Deregisters every unused registration (counted as evictions); returns how many.
    pub fn flush(&mut self) -> usize {
        let mut n = 0;
        while self.evict_one() {
            n += 1;
        }
        n
    }

    /// The counters now.
    pub fn counters(&self) -> CacheCounters {
        let mut c = self.c.clone();
        c.bytes_pinned = self.pinned;
        c.entries = self.entries.len() as u64;
        c.entries_in_use = (self.entries.len() - self.order.idle_entries()) as u64;
        c
    }

    fn new_lease(&mut self, id: EntryId) -> PinLease {
        let h = LeaseHandle(self.next_lease);
        self.next_lease += 1;
        self.leases.insert(h.0, id);
        self.lease(h).expect("just inserted")
    }

    /// Whether `target` can be registered within the limits once every unused entry is
    /// gone.
    fn fits_after_evicting(&self, target: Span) -> bool {
        let kept_bytes = self.pinned - self.order.idle_bytes();
        let kept_entries = self.entries.len() - self.order.idle_entries();
        kept_bytes
            .checked_add(target.len())
            .is_some_and(|b| b <= self.limits.max_bytes)
            && kept_entries < self.limits.max_entries
    }

    fn fits_now(&self, target: Span) -> bool {
        self.pinned
            .checked_add(target.len())
            .is_some_and(|b| b <= self.limits.max_bytes)
            && self.entries.len() < self.limits.max_entries
    }

    /// Registers the page span `span` of a missed request under the overlap rule; `None`
    /// when it cannot be had (fall back).
    fn register_for(&mut self, span: Span) -> Result<Option<EntryId>> {
        if !self.fits_after_evicting(span) {
            return Ok(None);
        }
        // Registrations inside the span leave the index: the new one covers them. Unused
        // ones are deregistered now; ones in use once the new registration exists (below).
        // Registrations that only share pages with the span stay as they are.
        let inside: Vec<(Span, EntryId)> = self
            .index
            .overlapping(span)
            .into_iter()
            .filter(|(s, _)| span.contains(s))
            .collect();
        for (s, id) in &inside {
            if self.entries[id].refs == 0 {
                self.index.remove(s.start);
                self.order.remove_idle(*id);
                self.c.merged += 1;
                self.destroy(*id);
            }
        }
        let target = span;
        while !self.fits_now(target) {
            let evicted = self.evict_one();
            debug_assert!(evicted, "fits_after_evicting promised room");
            if !evicted {
                return Ok(None);
            }
        }
        let reg = loop {
            match self.registrar.register(target.start, target.len()) {
                Ok(reg) => break reg,
                Err(RegisterError::NoResources(_)) => {
                    self.c.resource_retries += 1;
                    if self.evict_one() {
                        continue;
                    }
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        };
        debug_assert!(
            reg.addr == target.start && reg.len == target.len(),
            "the registrar must register exactly what was asked"
        );
        // Entries in use inside the new one leave the index (superseded).
        for (s, id) in &inside {
            if let Some(e) = self.entries.get_mut(id) {
                self.index.remove(s.start);
                e.state = State::Doomed;
                self.c.superseded += 1;
            }
        }
        self.c.registrations += 1;
        self.pinned += target.len();
        self.c.peak_bytes_pinned = self.c.peak_bytes_pinned.max(self.pinned);
        let id = self.next_entry;
        self.next_entry += 1;
        let mut stats = UseStats {
            pages: target.len() / self.page,
            ..UseStats::default()
        };
        self.order.registered(&mut stats, self.tick);
        self.entries.insert(
            id,
            Entry {
                reg,
                span: target,
                refs: 1,
                state: State::Cached,
                stats,
            },
        );
        self.index.insert(target, id);
        Ok(Some(id))
    }

    /// Evicts the policy's victim; false when no entry is unused.
    fn evict_one(&mut self) -> bool {
        let Some(id) = self.order.pop_victim() else {
            return false;
        };
        let start = self.entries[&id].span.start;
        self.index.remove(start);
        self.c.evictions += 1;
        self.destroy(id);
        true
    }

    /// Deregisters entry `id` and forgets it (it is already out of the index and of the
    /// eviction order).
    fn destroy(&mut self, id: EntryId) {
        let e = self.entries.remove(&id).expect("destroyed entries exist");
        debug_assert_eq!(e.refs, 0, "an entry in use is never deregistered");
        self.pinned -= e.span.len();
        self.c.deregistrations += 1;
        if self.registrar.deregister(&e.reg).is_err() {
            self.c.deregister_failures += 1;
        }
    }

    /// Checks every internal invariant; panics with what broke. For tests.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut prev_end = 0;
        for (span, id) in self.index.iter() {
            assert!(
                span.end > prev_end,
                "an index span contains the next: {span:?}"
            );
            prev_end = span.end;
            let e = &self.entries[&id];
            assert_eq!(e.state, State::Cached);
            assert_eq!(e.span, span);
            assert_eq!(self.order.contains(id), e.refs == 0);
        }
        let mut pinned = 0;
        let mut refs = HashMap::<EntryId, u32>::new();
        for l in self.leases.values() {
            *refs.entry(*l).or_default() += 1;
        }
        for (id, e) in &self.entries {
            pinned += e.span.len();
            assert_eq!(
                e.refs,
                refs.get(id).copied().unwrap_or(0),
                "refcount of {id}"
            );
            assert_eq!(e.span.start % self.page, 0);
            assert_eq!(e.span.end % self.page, 0);
            if e.state == State::Doomed {
                assert!(e.refs > 0, "a doomed entry without leases must be gone");
                assert!(!self.order.contains(*id));
            }
        }
        assert_eq!(pinned, self.pinned);
        let idle_bytes: u64 = self
            .entries
            .iter()
            .filter(|(id, _)| self.order.contains(**id))
            .map(|(_, e)| e.span.len())
            .sum();
        assert_eq!(idle_bytes, self.order.idle_bytes());
        assert!(self.pinned <= self.limits.max_bytes, "over max_bytes");
        assert!(
            self.entries.len() <= self.limits.max_entries,
            "over max_entries"
        );
    }
}

impl<R: Registrar> Drop for PinDownCache<R> {
    /// Deregisters every registration, also those still leased (dropping the cache with
    /// transfers in flight is the caller's bug; the NIC waits for their DMA), so nothing
    /// stays pinned.
    fn drop(&mut self) {
        for (_, e) in self.entries.drain() {
            self.c.deregistrations += 1;
            if self.registrar.deregister(&e.reg).is_err() {
                self.c.deregister_failures += 1;
            }
        }
        self.pinned = 0;
    }
}
