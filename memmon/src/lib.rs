//! The address-space change monitor (docs/architecture.md; Wyckoff05): tells
//! the pin-down registration cache and ODP translation tables when memory under one of
//! their registrations is unmapped, moved, discarded or shared copy-on-write by `fork`, so
//! that a registration is never used after its range changed. It is the user-space
//! counterpart of the kernel's MMU notifiers, with the interface of libfabric's monitors
//! (start = [`UffdMonitor::new`], stop = drop, subscribe, unsubscribe, valid =
//! [`MemoryMonitor::still_valid`]) and kept apart from any cache.
//!
//! # Mechanism
//!
//! [`UffdMonitor`] registers each subscribed range with Linux `userfaultfd` in
//! **write-protect mode** (`UFFDIO_REGISTER_MODE_WP`) and never write-protects anything, so
//! no page fault is ever routed to the monitor (first touch of registered memory costs what
//! it costs unregistered; docs/memmon.md has the figures), while the kernel still reports
//! the non-cooperative events of the range: `UNMAP`, `REMOVE`, `REMAP` and `FORK`. The
//! descriptor is opened with `UFFD_USER_MODE_ONLY`, which unprivileged processes may do
//! (`vm.unprivileged_userfaultfd=0`). One descriptor and two threads serve the whole
//! process; every [`UffdMonitor`] is a handle on them with its own sink and subscriptions,
//! so a cache and an ODP table can watch the same pages (a page can be registered with
//! only one userfaultfd).
//!
//! # What is caught, and how it is reported
//!
//! | change to a subscribed range | [`Cause`] |
//! |---|---|
//! | `munmap`, whole or partial; `free()` of a large (`mmap`ed) allocation; `brk`/`sbrk` shrinking the heap; `mmap(MAP_FIXED)` over it; the tail cut by `mremap` shrinking | [`Cause::Unmap`] |
//! | `mremap` moving it (the old range; an `Unmap` of the old range follows) | [`Cause::Remap`] |
//! | `madvise` `MADV_DONTNEED`, `MADV_DONTNEED_LOCKED`, `MADV_FREE`, `MADV_REMOVE` (shmem) | [`Cause::Remove`] |
//! | `fork()` (pages now shared copy-on-write with the child), per [`ForkPolicy`] | [`Cause::Fork`] |
//! | events lost (the monitor's queue overflowed) | [`Cause::Lost`], for every subscription |
//!
//! Callbacks cover only the pages that are both subscribed (by this monitor) and changed,
//! page-aligned, one call per maximal run, for every event (a subscription's
//! [`MemoryMonitor::is_valid`] turns false at the first and stays false; an ODP table that
//! keeps its subscription gets every later change too). Invalidations err on the safe side:
//! the kernel reports the range given to `munmap`/`madvise` even where a call failed or
//! left a hole, and an event read while a range is being subscribed may hit the new
//! subscription.
//!
//! # What is not caught
//!
//! - **System V shared memory** (`shmat`/`shmdt`): the kernel sends no event for `shmdt`,
//!   so [`MemoryMonitor::subscribe`] refuses such ranges ([`Error::UnwatchableRange`]):
//!   the cache must not cache a registration over them.
//! - **File mappings** (other than shmem/tmpfs and hugetlbfs) cannot be registered in
//!   write-protect mode: also refused, also not to be cached.
//! - `mprotect` (the pages stay; an RDMA write to a read-only page still lands, as with
//!   any pinned registration), `process_vm_writev` and writes by other processes through
//!   shared memory (contents change, mappings do not), page migration, KSM, swap (the
//!   kernel does not move pinned pages), and `fork` through a raw `clone` system call when
//!   `UFFD_FEATURE_EVENT_FORK` is not granted (it needs `CAP_SYS_PTRACE`; the monitor
//!   then catches `fork()` through a `pthread_atfork` handler).
//!
//! The user sees nothing for these: mapping-preserving changes do not make a registration
//! stale, and refused ranges are registered uncached by the cache.
//!
//! # The contract a cache relies on
//!
//! The kernel lets the thread that called `munmap`/`madvise`/`mremap`/`fork` go on as soon
//! as the monitor thread has *read* the event, which may be before the sink's callback has
//! run (measured: docs/memmon.md). So the order guarantee is: **when the call has returned
//! and the caller then calls [`MemoryMonitor::flush`], every callback for the change has
//! completed and [`MemoryMonitor::is_valid`] is false for every subscription it touched.**
//! [`MemoryMonitor::still_valid`] does both. A cache therefore:
//!
//! 1. does not cache at all when [`MemoryMonitor::is_reliable`] is false ([`NullMonitor`],
//!    or a forked child);
//! 2. on a miss, subscribes *before* registering (so a change between the two is seen),
//!    and registers uncached if `subscribe` fails;
//! 3. on a hit, calls `still_valid(id)` before handing the registration out, without
//!    holding a lock its sink takes (the sink runs on the monitor thread and `flush` waits
//!    for it), and treats `false` as a miss;
//! 4. unsubscribes when it drops the entry.
//!
//! The sink may take locks, allocate, drop and deregister entries, even unmap subscribed
//! memory: events are read by a second thread that takes no lock and never allocates, so
//! neither the sink nor a `fork()` in progress can stop them being read (the hang of
//! libfabric issue 5554). Events a sink causes are covered by the next `flush`. The sink
//! should be quick: threads in `flush` wait for it.
//!
//! # When userfaultfd is not permitted
//!
//! In containers with a default seccomp profile, or on kernels without userfaultfd or its
//! write-protect mode, [`monitor_from_env`] prints one line on stderr saying why and
//! returns a [`NullMonitor`], whose [`MemoryMonitor::is_reliable`] is false: registrations
//! are then not cached (every transfer registers and deregisters), which is slower but
//! never stale.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod uffd;
#[allow(unsafe_code)]
mod uffd_sys;

pub use uffd::UffdMonitor;

use std::sync::Arc;

use pagewire_sys::{Error, Result};

/// Names one subscription of one monitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionId(u64);

impl SubscriptionId {
    /// The number behind the id (unique in the process).
    pub fn raw(self) -> u64 {
        self.0
    }
}

/// Why a range was invalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// Unmapped: `munmap` (also inside `free()`), `brk` shrinking, `mmap(MAP_FIXED)` over it,
    /// the tail of a shrinking `mremap`.
    Unmap,
    /// Moved elsewhere by `mremap` (this is the old range).
    Remap,
    /// Pages discarded by `madvise` (`DONTNEED`, `DONTNEED_LOCKED`, `FREE`, `REMOVE`): the
    /// range stays mapped but its next access gets other pages.
    Remove,
    /// The process forked: its private pages are shared copy-on-write with the child, and
    /// the parent's next write to an unpinned page moves it.
    Fork,
    /// The monitor lost events (its queue overflowed): everything subscribed is
    /// invalidated.
    Lost,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cause::Unmap => "unmap",
            Cause::Remap => "remap",
            Cause::Remove => "remove",
            Cause::Fork => "fork",
            Cause::Lost => "lost events",
        })
    }
}

/// What subscribers implement.
///
/// Called on the monitor's dispatch thread, never concurrently with itself for one
/// monitor. `addr` and `len` are page-aligned and cover only subscribed pages of this
/// monitor that the change touched.
pub trait InvalidationSink: Send + Sync {
    /// `[addr, addr+len)` changed for `cause`.
    fn invalidate(&self, addr: u64, len: u64, cause: Cause);
}

impl<F: Fn(u64, u64, Cause) + Send + Sync> InvalidationSink for F {
    fn invalidate(&self, addr: u64, len: u64, cause: Cause) {
        self(addr, len, cause)
    }
}

/// What a monitor has seen, for one monitor (a cache's or a table's) unless noted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorCounters {
    /// Events the process's monitor thread read from the kernel, for all monitors and
    /// unsubscribed ranges alike.
    pub events_read: u64,
    /// Unmap events that touched this monitor's subscriptions.
    pub unmap_events: u64,
    /// Remove (madvise) events that touched this monitor's subscriptions.
    pub remove_events: u64,
    /// Remap (mremap) events that touched this monitor's subscriptions.
    pub remap_events: u64,
    /// Forks seen (whatever the [`ForkPolicy`]).
    pub fork_events: u64,
    /// Calls of the sink.
    pub invalidations: u64,
    /// Bytes passed to the sink.
    pub invalidated_bytes: u64,
    /// Live subscriptions.
    pub subscriptions: u64,
    /// Bytes (whole pages) under live subscriptions, overlaps counted twice.
    pub watched_bytes: u64,
    /// Calls of `subscribe`.
    pub subscribe_calls: u64,
    /// Calls of `subscribe` that failed (ranges that must not be cached).
    pub subscribe_failures: u64,
    /// Times the process's monitor queue overflowed (each delivers [`Cause::Lost`]).
    pub lost_events: u64,
    /// Page faults routed to the monitor (process-wide; expected 0: nothing is ever
    /// write-protected).
    pub routed_faults: u64,
}

/// What a monitor does on `fork()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForkPolicy {
    /// Invalidate every subscription ([`Cause::Fork`]). Needed where the NIC holds
    /// physical pages that the parent's next write may replace (copy-on-write): kernels
    /// before 5.13, or registrations not pinned with `FOLL_LONGTERM`.
    #[default]
    InvalidateAll,
    /// Count the fork, invalidate nothing. Right for the soft NIC (it moves bytes by
    /// virtual address) and for verbs registrations on Linux 5.13 or later, where `fork`
    /// copies pinned pages for the child at once and the parent keeps its own.
    Ignore,
}

/// Options of one monitor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorOptions {
    /// What to do on `fork()`.
    pub fork: ForkPolicy,
}

/// libfabric's monitor interface (start, stop, subscribe, unsubscribe, valid).
pub trait MemoryMonitor: Send + Sync {
    /// Starts watching `[addr, addr+len)` (rounded out to whole pages) and returns a
    /// subscription id. Subscriptions may overlap, within one monitor and between
    /// monitors. Fails with [`Error::UnwatchableRange`] for memory whose changes cannot be
    /// seen (a registration over it must not be cached) and with
    /// [`Error::MonitorUnavailable`] when the monitor does not work at all.
    fn subscribe(&self, addr: u64, len: u64) -> Result<SubscriptionId>;

    /// Stops watching; unknown or repeated ids are ignored.
    fn unsubscribe(&self, id: SubscriptionId);

    /// False once any change touched the subscription (sticky), and for unknown ids.
    /// Reflects only events already delivered: see [`MemoryMonitor::flush`].
    fn is_valid(&self, id: SubscriptionId) -> bool;

    /// Waits until every event that the kernel has let go on (every `munmap`, `madvise`,
    /// `mremap`, `fork` that has returned) has been delivered to the sinks. Costs two atomic
    /// loads when nothing is pending. Returns at once on the monitor's own thread.
    fn flush(&self);

    /// [`MemoryMonitor::flush`], then [`MemoryMonitor::is_valid`]: whether a registration
    /// made over the subscription may still be used.
    fn still_valid(&self, id: SubscriptionId) -> bool {
        self.flush();
        self.is_valid(id)
    }

    /// Whether invalidations are delivered at all. False: the caller must not cache.
    fn is_reliable(&self) -> bool;

    /// What the monitor has seen.
    fn counters(&self) -> MonitorCounters;

    /// One line naming the mechanism and its state, for printing the configuration.
    fn describe(&self) -> String;
}

/// The monitor for when none can run: delivers nothing, so it is unreliable and refuses
/// every subscription. A cache given one must not cache (every registration is made for
/// one transfer and dropped after it).
#[derive(Clone, Debug)]
pub struct NullMonitor {
    reason: String,
}

impl NullMonitor {
    /// A null monitor; `reason` says why there is no real one.
    pub fn new(reason: impl Into<String>) -> NullMonitor {
        NullMonitor {
            reason: reason.into(),
        }
    }

    /// Why there is no real monitor.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl MemoryMonitor for NullMonitor {
    fn subscribe(&self, _addr: u64, _len: u64) -> Result<SubscriptionId> {
        Err(Error::MonitorUnavailable {
            reason: self.reason.clone(),
        })
    }

    fn unsubscribe(&self, _id: SubscriptionId) {}

    fn is_valid(&self, _id: SubscriptionId) -> bool {
        false
    }

    fn flush(&self) {}

    fn is_reliable(&self) -> bool {
        false
    }

    fn counters(&self) -> MonitorCounters {
        MonitorCounters::default()
    }

    fn describe(&self) -> String {
        format!("none ({}): registrations are not cached", self.reason)
    }
}

/// Which monitor `PAGEWIRE_MEMMON` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorChoice {
    /// Unset: userfaultfd if it works here, else none with a one-line warning.
    Auto,
    /// `uffd`: userfaultfd, and an error if it does not work here.
    Uffd,
    /// `none`: no monitor (registrations are not cached).
    None,
}

impl MonitorChoice {
    /// Parses a `PAGEWIRE_MEMMON` value (`None`/empty is [`MonitorChoice::Auto`]).
    pub fn parse(value: Option<&str>) -> Result<MonitorChoice> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Ok(MonitorChoice::Auto),
            Some("uffd") => Ok(MonitorChoice::Uffd),
            Some("none") => Ok(MonitorChoice::None),
            Some(other) => Err(Error::invalid_setting(
                "PAGEWIRE_MEMMON",
                other,
                "expected uffd, none or auto",
            )),
        }
    }
}

/// The monitor `PAGEWIRE_MEMMON` (`uffd`, `none`; unset: userfaultfd, falling back to none
/// with a one-line warning on stderr saying why) selects, delivering to `sink`.
pub fn monitor_from_env(sink: Arc<dyn InvalidationSink>) -> Result<Box<dyn MemoryMonitor>> {
    let value = std::env::var("PAGEWIRE_MEMMON").ok();
    monitor_for(
        MonitorChoice::parse(value.as_deref())?,
        sink,
        MonitorOptions::default(),
        |line| eprintln!("{line}"),
    )
}

/// The monitor for `choice`, delivering to `sink`; `warn` receives the one-line warning of
/// a fallback from [`MonitorChoice::Auto`] to none.
pub fn monitor_for(
    choice: MonitorChoice,
    sink: Arc<dyn InvalidationSink>,
    options: MonitorOptions,
    warn: impl FnOnce(&str),
) -> Result<Box<dyn MemoryMonitor>> {
    match choice {
        MonitorChoice::None => Ok(Box::new(NullMonitor::new("PAGEWIRE_MEMMON=none"))),
        MonitorChoice::Uffd => Ok(Box::new(UffdMonitor::with_options(sink, options)?)),
        MonitorChoice::Auto => match UffdMonitor::with_options(sink, options) {
            Ok(m) => Ok(Box::new(m)),
            Err(e) => {
                let reason = match &e {
                    Error::MonitorUnavailable { reason } => reason.clone(),
                    other => other.to_string(),
                };
                warn(&format!(
                    "pagewire: memory monitor unavailable, registrations will not be cached \
                     (slower, never stale): {reason} [PAGEWIRE_MEMMON=none silences this]"
                ));
                Ok(Box::new(NullMonitor::new(reason)))
            }
        },
    }
}
