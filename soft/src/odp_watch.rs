//! ODP invalidation in the soft NIC: the memory monitor keeps the present bitmap true
//! (ODP13 "ODP invalidation"; docs/architecture.md).
//!
//! Every range the NIC makes present — a resolved network page fault or a prefetch — is
//! watched by a [`MemoryMonitor`]. The monitor's sink clears the present bits of every page
//! that is unmapped, moved, discarded (`MADV_DONTNEED`...) or shared copy-on-write by
//! `fork`, so the next access to it faults again: the kernel's ODP does the same from its
//! MMU interval notifier. A fault resolution that races an invalidation is guarded the way
//! the kernel guards it (`mmu_interval_read_begin`/`_retry`): the resolver notes the
//! invalidation sequence before populating and, if an invalidation of an overlapping range
//! was delivered meanwhile, clears the bits it just set (the access faults once more).
//!
//! The owner flushes the monitor whenever the application enters the NIC — a post, a poll
//! or a prefetch ([`PresentWatch::on_post`]). A peer only touches the owner's memory in
//! answer to something the owner posted after changing it, so by the monitor's contract
//! every change the application made before that post has cleared its bits before any peer
//! can act on the post. This is where the soft NIC differs from the kernel's ODP, whose
//! notifier runs before `munmap` returns: the monitor may see the change a few
//! microseconds after it returned, so a raw-NIC program that changes memory and then tells
//! a peer through another channel (a socket, the bootstrap) must enter the NIC in between
//! (a `poll_cq` will do). Pagewire's message layer always does.
//!
//! Two fallbacks, both never stale:
//! - **Unwatchable memory** (System V shared memory, file mappings: the monitor refuses
//!   them): such ranges are made present until the owner's next post, which clears them,
//!   so every new operation on them faults (what the pin-down cache does: not cached).
//! - **No monitor** (`PAGEWIRE_MEMMON=none`, userfaultfd not permitted, or
//!   `PAGEWIRE_SOFT_ODP_CHECK=pagemap`): the owner's header says so, and initiators check
//!   the owner's `/proc/PID/pagemap` before every DMA into pages marked present, as the
//!   interim check of the NIC issue did. It catches an unmapped page, not a page replaced
//!   by a new mapping at the same address (data still lands right: the soft NIC moves
//!   bytes by virtual address).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;

use super::RankMemory;
use pagewire_memmon::{
    monitor_for, Cause, InvalidationSink, MemoryMonitor, MonitorChoice, MonitorOptions,
};
use pagewire_sys as sys;
use pagewire_sys::error::{Error, Result};

/// How the soft NIC learns that memory under present ODP pages changed
/// (`PAGEWIRE_SOFT_ODP_CHECK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OdpCheck {
    /// The memory monitor clears present bits (default); the pagemap check where no monitor
    /// works here.
    Monitor,
    /// No monitor: initiators read the owner's `/proc/PID/pagemap` before each DMA into
    /// present pages (the measured fallback).
    Pagemap,
}

impl OdpCheck {
    /// Parses a `PAGEWIRE_SOFT_ODP_CHECK` value (`None`/empty is [`OdpCheck::Monitor`]).
    pub fn parse(value: Option<&str>) -> Result<OdpCheck> {
        match value.map(str::trim) {
            None | Some("") | Some("monitor") => Ok(OdpCheck::Monitor),
            Some("pagemap") => Ok(OdpCheck::Pagemap),
            Some(other) => Err(Error::invalid_setting(
                "PAGEWIRE_SOFT_ODP_CHECK",
                other,
                "expected monitor or pagemap",
            )),
        }
    }
}

/// Recent invalidations kept for the resolvers' retry check.
const RECENT: usize = 64;

/// What the sink (on the monitor's thread) and the NIC share.
struct WatchShared {
    own: Arc<RankMemory>,
    /// Present pages cleared by invalidations.
    invalidated_pages: AtomicU64,
    /// Invalidations delivered so far (the interval notifier's sequence).
    seq: AtomicU64,
    /// The last [`RECENT`] invalidations: `(seq, start, end)`.
    recent: Mutex<VecDeque<(u64, u64, u64)>>,
    /// Ranges whose mapping went away (unmap, remap): no longer watched by the kernel.
    unmapped: Mutex<Vec<(u64, u64)>>,
    has_unmapped: AtomicBool,
}

impl InvalidationSink for WatchShared {
    fn invalidate(&self, addr: u64, len: u64, cause: Cause) {
        let cleared = self.own.present().clear(addr, len);
        self.invalidated_pages.fetch_add(cleared, Relaxed);
        {
            let mut recent = self.recent.lock();
            let seq = self.seq.load(Relaxed) + 1;
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back((seq, addr, addr + len));
            self.seq.store(seq, std::sync::atomic::Ordering::Release);
        }
        if matches!(cause, Cause::Unmap | Cause::Remap) {
            self.unmapped.lock().push((addr, addr + len));
            self.has_unmapped.store(true, Relaxed);
        }
    }
}

impl WatchShared {
    /// What `own`'s watch and its sink share, before any invalidation.
    fn new(own: Arc<RankMemory>) -> WatchShared {
        WatchShared {
            own,
            invalidated_pages: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            unmapped: Mutex::new(Vec::new()),
            has_unmapped: AtomicBool::new(false),
        }
    }

    /// Whether an invalidation after `since` touched `[start, end)` (true when that is no
    /// longer known).
    fn invalidated_since(&self, since: u64, start: u64, end: u64) -> bool {
        if self.seq.load(Acquire) == since {
            return false;
        }
        let recent = self.recent.lock();
        match recent.front() {
            Some(&(oldest, _, _)) if oldest <= since + 1 => recent
                .iter()
                .any(|&(s, a, b)| s > since && a < end && start < b),
            _ => true,
        }
    }
}

/// One monitor subscription of the watch.
struct Subscription {
    end: u64,
    id: pagewire_memmon::SubscriptionId,
    /// Invalidation sequence when it was made.
    born: u64,
}

#[derive(Default)]
struct WatchState {
    /// Pages (byte ranges, page-aligned, disjoint, merged) under a live kernel watch.
    watched: BTreeMap<u64, u64>,
    /// The monitor subscriptions, by start.
    subs: BTreeMap<u64, Subscription>,
    /// Unwatchable ranges made present until the owner's next post.
    volatile: Vec<(u64, u64)>,
}

/// Keeps one rank's ODP present bits true against changes to its address space.
pub(crate) struct PresentWatch {
    /// `None`: the pagemap fallback is in force.
    monitor: Option<Box<dyn MemoryMonitor>>,
    shared: Arc<WatchShared>,
    state: Mutex<WatchState>,
    has_volatile: AtomicBool,
}

impl PresentWatch {
    /// The watch of `own`'s present bits: a monitor as `PAGEWIRE_MEMMON` selects it unless
    /// `check` is [`OdpCheck::Pagemap`]. A fallback to the pagemap check is announced in
    /// one line on stderr.
    pub(crate) fn new(own: Arc<RankMemory>, check: OdpCheck) -> Result<PresentWatch> {
        let shared = Arc::new(WatchShared::new(own));
        let monitor = match check {
            OdpCheck::Pagemap => None,
            OdpCheck::Monitor => {
                let choice =
                    MonitorChoice::parse(std::env::var("PAGEWIRE_MEMMON").ok().as_deref())?;
                // A fork shares pages copy-on-write: the kernel's ODP is invalidated then
                // (the parent's page-table entries change), and so is this one.
                let m = monitor_for(choice, shared.clone(), MonitorOptions::default(), |_| {})?;
                if m.is_reliable() {
                    Some(m)
                } else {
                    if choice != MonitorChoice::None {
                        eprintln!(
                            "pagewire: soft NIC: no memory monitor ({}); ODP pages are checked \
                             against /proc/PID/pagemap before each DMA instead",
                            m.describe()
                        );
                    }
                    None
                }
            }
        };
        Ok(PresentWatch {
            monitor,
            shared,
            state: Mutex::new(WatchState::default()),
            has_volatile: AtomicBool::new(false),
        })
    }

    /// Whether the monitor keeps the bits true (else initiators check the pagemap).
    pub(crate) fn uses_monitor(&self) -> bool {
        self.monitor.is_some()
    }

    /// Present pages cleared by invalidations so far.
    pub(crate) fn invalidated_pages(&self) -> u64 {
        self.shared.invalidated_pages.load(Relaxed)
    }

    /// The application enters the NIC: deliver every change it made before (monitor
    /// flush) and end the presence of unwatchable ranges.
    pub(crate) fn on_post(&self) {
        if let Some(m) = &self.monitor {
            m.flush();
        }
        if self.has_volatile.load(Relaxed) {
            let ranges = std::mem::take(&mut self.state.lock().volatile);
            self.has_volatile.store(false, Relaxed);
            let bits = self.shared.own.present();
            for (a, b) in ranges {
                let cleared = bits.clear(a, b - a);
                self.shared.invalidated_pages.fetch_add(cleared, Relaxed);
            }
        }
    }

    /// Populates `[addr, addr+len)` (for writing if `write`) and marks it present, watched.
    /// Returns how many pages were newly marked, or `None` if the range is not mapped.
    pub(crate) fn make_present(&self, addr: u64, len: u64, write: bool) -> Option<u64> {
        let (start, span) = sys::page_span(addr, len);
        let end = start + span;
        let Some(monitor) = &self.monitor else {
            sys::populate(addr, len, write)
                .or_else(|_| sys::populate(addr, len, false))
                .ok()?;
            return Some(self.shared.own.present().set(addr, len));
        };
        self.forget_unmapped(monitor.as_ref());
        let since = self.shared.seq.load(Acquire);
        let watchable = self.watch(monitor.as_ref(), start, end, since);
        sys::populate(addr, len, write)
            .or_else(|_| sys::populate(addr, len, false))
            .ok()?;
        let bits = self.shared.own.present();
        let newly = bits.set(addr, len);
        if !watchable {
            self.state.lock().volatile.push((start, end));
            self.has_volatile.store(true, Relaxed);
        }
        // Retry check: an invalidation of this range delivered while it was being made
        // present may have cleared nothing; its bits must not stay set. One delivered
        // after the bits were set clears them itself. No flush here: this runs under the
        // engine, which a sink may be waiting for (a pin-down cache deregistering a region),
        // and the changes the application made before its last entry into the NIC, the
        // only ones a peer may act on, were delivered then (the module's doc).
        if self.shared.invalidated_since(since, start, end) {
            bits.clear(addr, len);
        }
        Some(newly)
    }

    /// Subscribes the parts of `[start, end)` not yet watched; false if the monitor cannot
    /// watch (part of) it.
    fn watch(&self, monitor: &dyn MemoryMonitor, start: u64, end: u64, since: u64) -> bool {
        let gaps = {
            let st = self.state.lock();
            gaps_in(&st.watched, start, end)
        };
        let mut ok = true;
        for (a, b) in gaps {
            // Not under the state lock: the sink may be waiting for it, and subscribing
            // may wait for the sink.
            match monitor.subscribe(a, b - a) {
                Ok(id) => {
                    let mut st = self.state.lock();
                    insert_merged(&mut st.watched, a, b);
                    st.subs.insert(
                        a,
                        Subscription {
                            end: b,
                            id,
                            born: since,
                        },
                    );
                }
                Err(_) => ok = false,
            }
        }
        ok
    }

    /// Drops what unmaps and remaps took away from the kernel's watch: the ranges leave the
    /// watched set (a new mapping there must be subscribed anew) and subscriptions made
    /// before the change and lying wholly inside it end.
    fn forget_unmapped(&self, monitor: &dyn MemoryMonitor) {
        if !self.shared.has_unmapped.swap(false, AcqRel) {
            return;
        }
        let gone = std::mem::take(&mut *self.shared.unmapped.lock());
        let seq_now = self.shared.seq.load(Acquire);
        let mut dead = Vec::new();
        {
            let mut st = self.state.lock();
            for &(a, b) in &gone {
                remove_range(&mut st.watched, a, b);
                let inside: Vec<u64> = st
                    .subs
                    .range(a..b)
                    .filter(|(_, s)| s.end <= b && s.born < seq_now)
                    .map(|(&k, _)| k)
                    .collect();
                for k in inside {
                    if let Some(s) = st.subs.remove(&k) {
                        dead.push(s.id);
                    }
                }
            }
        }
        for id in dead {
            monitor.unsubscribe(id);
        }
    }
}

/// The parts of `[start, end)` not covered by the disjoint ranges of `set`.
fn gaps_in(set: &BTreeMap<u64, u64>, start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = start;
    let first = set
        .range(..=start)
        .next_back()
        .map(|(&a, _)| a)
        .unwrap_or(start);
    for (&a, &b) in set.range(first..end) {
        if b <= at {
            continue;
        }
        if a > at {
            out.push((at, a.min(end)));
        }
        at = at.max(b);
        if at >= end {
            break;
        }
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// Adds `[start, end)` to the disjoint ranges of `set`, merging overlapping and adjacent
/// ones.
fn insert_merged(set: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    if let Some((&a, &b)) = set.range(..=start).next_back() {
        if b >= start {
            start = a;
            end = end.max(b);
        }
    }
    let covered: Vec<(u64, u64)> = set.range(start..=end).map(|(&a, &b)| (a, b)).collect();
    for (a, b) in covered {
        set.remove(&a);
        end = end.max(b);
    }
    set.insert(start, end);
}

/// Removes `[start, end)` from the disjoint ranges of `set`, splitting where needed.
fn remove_range(set: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let first = set
        .range(..=start)
        .next_back()
        .map(|(&a, _)| a)
        .unwrap_or(start);
    let hit: Vec<(u64, u64)> = set
        .range(first..end)
        .filter(|(_, &b)| b > start)
        .map(|(&a, &b)| (a, b))
        .collect();
    for (a, b) in hit {
        set.remove(&a);
        if a < start {
            set.insert(a, start);
        }
        if b > end {
            set.insert(end, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewire_nic::PAGE_SIZE;

    const P: u64 = PAGE_SIZE;

    #[test]
    fn interval_set_gaps_merge_and_removal() {
        let mut s = BTreeMap::new();
        assert_eq!(gaps_in(&s, 0, 4 * P), vec![(0, 4 * P)]);
        insert_merged(&mut s, P, 2 * P);
        insert_merged(&mut s, 3 * P, 4 * P);
        assert_eq!(
            gaps_in(&s, 0, 5 * P),
            vec![(0, P), (2 * P, 3 * P), (4 * P, 5 * P)]
        );
        insert_merged(&mut s, 2 * P, 3 * P);
        assert_eq!(s.len(), 1, "adjacent ranges merge: {s:?}");
        assert_eq!(gaps_in(&s, P, 4 * P), vec![]);
        remove_range(&mut s, 2 * P, 3 * P);
        assert_eq!(
            s.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
            vec![(P, 2 * P), (3 * P, 4 * P)]
        );
        remove_range(&mut s, 0, 10 * P);
        assert!(s.is_empty());
    }

    /// A real monitor whose `flush` must not be called: `make_present` runs under the
    /// engine lock, which a sink may be waiting for.
    struct NoFlush(Box<dyn MemoryMonitor>);

    impl MemoryMonitor for NoFlush {
        fn subscribe(&self, addr: u64, len: u64) -> Result<pagewire_memmon::SubscriptionId> {
            self.0.subscribe(addr, len)
        }
        fn unsubscribe(&self, id: pagewire_memmon::SubscriptionId) {
            self.0.unsubscribe(id)
        }
        fn is_valid(&self, id: pagewire_memmon::SubscriptionId) -> bool {
            self.0.is_valid(id)
        }
        fn flush(&self) {
            panic!("make_present flushed the monitor under the engine lock");
        }
        fn is_reliable(&self) -> bool {
            self.0.is_reliable()
        }
        fn counters(&self) -> pagewire_memmon::MonitorCounters {
            self.0.counters()
        }
        fn describe(&self) -> String {
            self.0.describe()
        }
    }

    #[test]
    fn making_pages_present_never_waits_for_the_monitors_sinks() {
        let job = format!("odp-watch-test-{}", std::process::id());
        let own = Arc::new(RankMemory::create(&job, 0, 1).unwrap());
        let shared = Arc::new(WatchShared::new(own));
        let monitor = monitor_for(
            MonitorChoice::Auto,
            shared.clone(),
            MonitorOptions::default(),
            |_| {},
        )
        .unwrap();
        if !monitor.is_reliable() {
            eprintln!("no userfaultfd monitor here: {}", monitor.describe());
            return;
        }
        let watch = PresentWatch {
            monitor: Some(Box::new(NoFlush(monitor))),
            shared,
            state: Mutex::new(WatchState::default()),
            has_volatile: AtomicBool::new(false),
        };
        let buf = sys::AnonMapping::new(4 * P as usize).unwrap();
        assert_eq!(watch.make_present(buf.addr(), 4 * P, true), Some(4));
        assert_eq!(
            watch.make_present(buf.addr(), 4 * P, false),
            Some(0),
            "already present"
        );
    }

    #[test]
    fn odp_check_parses() {
        assert_eq!(OdpCheck::parse(None).unwrap(), OdpCheck::Monitor);
        assert_eq!(OdpCheck::parse(Some("pagemap")).unwrap(), OdpCheck::Pagemap);
        let e = OdpCheck::parse(Some("kernel")).unwrap_err().to_string();
        assert!(e.contains("PAGEWIRE_SOFT_ODP_CHECK=kernel"), "{e}");
    }
}
