//! The userfaultfd monitor: one descriptor and two threads per process, shared by every
//! [`UffdMonitor`] handle.
//!
//! - The **reader** thread polls the descriptor and reads events into a fixed-size
//!   lock-free ring. Reading is what lets the thread that caused an event go on, so the
//!   reader takes no lock and never allocates: a thread blocked in `fork()` holds every
//!   malloc arena lock of the C library (and `fork()` waits for the reader to read its
//!   event), and a free could itself unmap a watched range and wait for the reader.
//!   Both threads finish their start-up (whose allocations could meet a `fork()` in
//!   progress) before the first monitor is handed out.
//! - The **dispatcher** thread takes events off the ring, marks the touched subscriptions
//!   invalid and calls the sinks. A sink that unmaps watched memory blocks the dispatcher
//!   until the reader reads that event, which it does at once: no self-deadlock.
//! - Both stay until the process exits (see [`UffdMonitor`] for why).
//!
//! Ordering ([`MemoryMonitor::flush`]): before each `read` the reader bumps `read_seq` to
//! `s` (the batch's tag) and after queueing the batch to `s + 1`; after delivering
//! everything queued up to `s + 1` the dispatcher sets `done_seq = s + 1`. A thread released
//! by the `read` of batch `s` (its `munmap` returned) finds `read_seq >= s`, and `flush`
//! waits for `done_seq >= read_seq`. The first increment happens before the `read` system
//! call that wakes the caller; the kernel's wake-up orders it.
//!
//! Stale events: a subscription records `read_seq` before its registration (`born`); a
//! batch tagged below `born` was read completely before the registration, so its events
//! concern whatever was mapped there before (typically the buffer a `free()` gave back
//! and `malloc` handed out again) and are not applied to it.
//!
//! Files: this one holds the handles, the process's core (descriptor, threads, fork
//! handling); `ring` the queue between the threads, `threads` their shared state and loops,
//! `subs` the subscriptions and registered segments; the system calls are in `uffd_sys`.
#![forbid(unsafe_code)]

mod ring;
mod subs;
mod threads;

use ring::{Entry, Ring};
use subs::{Segments, Subs};
use threads::{dispatcher_loop, reader_loop};

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Once, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use super::uffd_sys as sys;
use super::{
    Cause, ForkPolicy, InvalidationSink, MemoryMonitor, MonitorCounters, MonitorOptions,
    SubscriptionId,
};
use pagewire_sys::PAGE_SIZE;
use pagewire_sys::{Error, Result};

/// Events the queue between the two threads holds; beyond it, events are dropped and every
/// subscription is invalidated ([`Cause::Lost`]).
const QUEUE_CAPACITY: usize = 4096;
/// Messages read per `read` call.
const READ_BATCH: usize = 64;

thread_local! {
    static ON_MONITOR_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn on_monitor_thread() -> bool {
    ON_MONITOR_THREAD.with(|c| c.get())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// The process's core, kept until exit once started (module docs).
static CORE: Mutex<Option<Arc<Core>>> = parking_lot::const_mutex(None);
static FORK_TARGETS: Mutex<Vec<Weak<Shared>>> = parking_lot::const_mutex(Vec::new());
static ATFORK: Once = Once::new();
/// The process whose monitors [`FORK_TARGETS`] lists (a forked child skips the handler
/// without touching a lock another thread may have held at the fork).
static ATFORK_PID: AtomicU64 = AtomicU64::new(0);

/// How forks are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ForkMode {
    /// `UFFD_FEATURE_EVENT_FORK` (needs `CAP_SYS_PTRACE`): every fork, however made.
    Event,
    /// A `pthread_atfork` handler: every `fork()` through the C library.
    AtFork,
}

#[derive(Default)]
struct GlobalCounters {
    events_read: AtomicU64,
    lost: AtomicU64,
    routed_faults: AtomicU64,
    read_errors: AtomicU64,
}

/// State shared by the threads and the handles.
struct Shared {
    uffd: sys::Uffd,
    wake: sys::EventFd,
    pid: u32,
    fork_mode: ForkMode,
    ring: Ring,
    read_seq: AtomicU64,
    done_seq: AtomicU64,
    done_mx: Mutex<()>,
    done_cv: Condvar,
    fork_requested: AtomicU64,
    fork_done: AtomicU64,
    stopping: AtomicBool,
    registry: Mutex<Segments>,
    handles: RwLock<Vec<Weak<Handle>>>,
    counters: GlobalCounters,
}

/// Owns the threads; lives until the process exits (or a start-up fails).
struct Core {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// One monitor's sink and subscriptions.
struct Handle {
    sink: Arc<dyn InvalidationSink>,
    options: MonitorOptions,
    subs: Mutex<Subs>,
    unmap_events: AtomicU64,
    remove_events: AtomicU64,
    remap_events: AtomicU64,
    fork_events: AtomicU64,
    invalidations: AtomicU64,
    invalidated_bytes: AtomicU64,
    subscribe_calls: AtomicU64,
    subscribe_failures: AtomicU64,
}

/// A memory monitor over Linux userfaultfd (the crate's docs: [`crate`]).
///
/// Creating the first one in a process opens the userfaultfd and starts its two threads,
/// which then stay until the process exits (blocked in `poll` while nothing happens):
/// closing the descriptor while a forked child still held a copy of it would leave any
/// page still registered with nobody reading its events, and the next `munmap` of it
/// waiting forever. Dropping a monitor unsubscribes all its ranges.
pub struct UffdMonitor {
    core: Arc<Core>,
    handle: Arc<Handle>,
}

impl std::fmt::Debug for UffdMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UffdMonitor")
            .field("fork_mode", &self.core.shared.fork_mode)
            .field("options", &self.handle.options)
            .finish_non_exhaustive()
    }
}

impl UffdMonitor {
    /// A monitor delivering to `sink`, with the default [`MonitorOptions`].
    pub fn new(sink: Arc<dyn InvalidationSink>) -> Result<UffdMonitor> {
        Self::with_options(sink, MonitorOptions::default())
    }

    /// A monitor delivering to `sink`. Fails with [`Error::MonitorUnavailable`] when
    /// userfaultfd cannot be used here (not permitted, or a kernel without write-protect
    /// mode).
    pub fn with_options(
        sink: Arc<dyn InvalidationSink>,
        options: MonitorOptions,
    ) -> Result<UffdMonitor> {
        let core = Core::get()?;
        let handle = Arc::new(Handle {
            sink,
            options,
            subs: Mutex::new(Subs::default()),
            unmap_events: AtomicU64::new(0),
            remove_events: AtomicU64::new(0),
            remap_events: AtomicU64::new(0),
            fork_events: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            invalidated_bytes: AtomicU64::new(0),
            subscribe_calls: AtomicU64::new(0),
            subscribe_failures: AtomicU64::new(0),
        });
        core.shared.handles.write().push(Arc::downgrade(&handle));
        Ok(UffdMonitor { core, handle })
    }

    /// Whether forks are seen through `UFFD_EVENT_FORK` (true) or a `pthread_atfork`
    /// handler (false: the process lacks `CAP_SYS_PTRACE`, or `PAGEWIRE_MEMMON_FORK=atfork`).
    pub fn fork_events_from_kernel(&self) -> bool {
        self.core.shared.fork_mode == ForkMode::Event
    }

    fn in_owner_process(&self) -> bool {
        self.core.shared.pid == std::process::id()
    }
}

impl MemoryMonitor for UffdMonitor {
    fn subscribe(&self, addr: u64, len: u64) -> Result<SubscriptionId> {
        let h = &self.handle;
        h.subscribe_calls.fetch_add(1, Relaxed);
        let r = self.subscribe_inner(addr, len);
        if r.is_err() {
            h.subscribe_failures.fetch_add(1, Relaxed);
        }
        r
    }

    fn unsubscribe(&self, id: SubscriptionId) {
        // In a forked child the inherited state is not touched (its locks may have been
        // held by threads that do not exist here).
        if !self.in_owner_process() {
            return;
        }
        let removed = self.handle.subs.lock().remove(id.0);
        if let Some((start, end)) = removed {
            self.core.shared.release(start, end);
        }
    }

    fn is_valid(&self, id: SubscriptionId) -> bool {
        self.in_owner_process() && self.handle.subs.lock().is_valid(id.0)
    }

    fn flush(&self) {
        // Two atomic loads when nothing is pending (the common case, on every NIC entry of
        // the soft NIC's ODP table); the owner check costs a getpid system call.
        let sh = &self.core.shared;
        if sh.done_seq.load(SeqCst) >= sh.read_seq.load(SeqCst) {
            return;
        }
        if self.in_owner_process() {
            sh.flush();
        }
    }

    fn is_reliable(&self) -> bool {
        self.in_owner_process()
    }

    fn counters(&self) -> MonitorCounters {
        let h = &self.handle;
        let g = &self.core.shared.counters;
        let (subscriptions, watched_bytes) = if self.in_owner_process() {
            let s = h.subs.lock();
            (s.by_id.len() as u64, s.watched_bytes)
        } else {
            (0, 0)
        };
        MonitorCounters {
            events_read: g.events_read.load(Relaxed),
            unmap_events: h.unmap_events.load(Relaxed),
            remove_events: h.remove_events.load(Relaxed),
            remap_events: h.remap_events.load(Relaxed),
            fork_events: h.fork_events.load(Relaxed),
            invalidations: h.invalidations.load(Relaxed),
            invalidated_bytes: h.invalidated_bytes.load(Relaxed),
            subscriptions,
            watched_bytes,
            subscribe_calls: h.subscribe_calls.load(Relaxed),
            subscribe_failures: h.subscribe_failures.load(Relaxed),
            lost_events: g.lost.load(Relaxed),
            routed_faults: g.routed_faults.load(Relaxed),
        }
    }

    fn describe(&self) -> String {
        let sh = &self.core.shared;
        let mut s = format!(
            "userfaultfd (write-protect registration, nothing protected; unmap/remove/remap \
             events; fork via {}; on fork: {})",
            match sh.fork_mode {
                ForkMode::Event => "UFFD_EVENT_FORK",
                ForkMode::AtFork => "pthread_atfork",
            },
            match self.handle.options.fork {
                ForkPolicy::InvalidateAll => "invalidate all",
                ForkPolicy::Ignore => "ignore",
            }
        );
        if !self.in_owner_process() {
            s.push_str(" [inherited by a forked child: inactive]");
        }
        let errors = sh.counters.read_errors.load(Relaxed);
        if errors > 0 {
            s.push_str(&format!(" [{errors} read errors]"));
        }
        s
    }
}

impl UffdMonitor {
    fn subscribe_inner(&self, addr: u64, len: u64) -> Result<SubscriptionId> {
        if !self.in_owner_process() {
            return Err(Error::MonitorUnavailable {
                reason: "this monitor was inherited through fork(); create a new one in the \
                         child"
                    .into(),
            });
        }
        if len == 0
            || addr
                .checked_add(len)
                .is_none_or(|e| e > u64::MAX - PAGE_SIZE)
        {
            return Err(Error::InvalidArgument(format!(
                "cannot watch {len} bytes at {addr:#x}: empty or past the end of the address \
                 space"
            )));
        }
        let (start, span) = pagewire_sys::page_span(addr, len);
        let end = start + span;
        let id = NEXT_ID.fetch_add(1, Relaxed);
        // Listed before the kernel registration, so an event that follows the registration
        // finds it; `born` before it too (module docs).
        let born = self.core.shared.read_seq.load(SeqCst);
        self.handle.subs.lock().insert(id, start, end, born);
        match self.core.shared.acquire(start, end) {
            Ok((rs, re)) => self.handle.subs.lock().set_registered(id, rs, re),
            Err(e) => {
                self.handle.subs.lock().remove(id);
                return Err(e);
            }
        }
        Ok(SubscriptionId(id))
    }
}

impl Drop for UffdMonitor {
    fn drop(&mut self) {
        if !self.in_owner_process() {
            return; // a forked child's copy: see `unsubscribe`
        }
        let subs = std::mem::take(&mut *self.handle.subs.lock());
        for (start, end) in subs.by_id.values().map(|s| s.registered) {
            self.core.shared.release(start, end);
        }
        self.core
            .shared
            .handles
            .write()
            .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), &*self.handle));
    }
}

impl Core {
    /// The process's core, started on first use (again in a forked child).
    fn get() -> Result<Arc<Core>> {
        let mut slot = CORE.lock();
        if let Some(core) = slot.as_ref() {
            if core.shared.pid == std::process::id() {
                return Ok(core.clone());
            }
        }
        // First use, or first use in a forked child (whose copy of the parent's core has
        // no threads).
        let core = Arc::new(Core::start()?);
        *slot = Some(core.clone());
        Ok(core)
    }

    fn start() -> Result<Core> {
        let unavailable = |reason: String| Error::MonitorUnavailable { reason };
        let want_event_fork = !matches!(
            std::env::var("PAGEWIRE_MEMMON_FORK")
                .as_deref()
                .map(str::trim),
            Ok("atfork")
        );
        let required = sys::FEATURE_PAGEFAULT_FLAG_WP
            | sys::FEATURE_EVENT_UNMAP
            | sys::FEATURE_EVENT_REMOVE
            | sys::FEATURE_EVENT_REMAP;
        let mut optional = Vec::new();
        if want_event_fork {
            optional.push(sys::FEATURE_EVENT_FORK);
        }
        optional.push(sys::FEATURE_WP_HUGETLBFS_SHMEM);
        let uffd = sys::open(required, &optional).map_err(|e| unavailable(e.reason))?;
        let fork_mode = if uffd.features & sys::FEATURE_EVENT_FORK != 0 {
            ForkMode::Event
        } else {
            ForkMode::AtFork
        };
        let wake = sys::EventFd::new().map_err(|e| unavailable(format!("eventfd: {e}")))?;
        let shared = Arc::new(Shared {
            uffd,
            wake,
            pid: std::process::id(),
            fork_mode,
            ring: Ring::new(QUEUE_CAPACITY),
            read_seq: AtomicU64::new(0),
            done_seq: AtomicU64::new(0),
            done_mx: Mutex::new(()),
            done_cv: Condvar::new(),
            fork_requested: AtomicU64::new(0),
            fork_done: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            registry: Mutex::new(Segments::default()),
            handles: RwLock::new(Vec::new()),
            counters: GlobalCounters::default(),
        });
        if fork_mode == ForkMode::AtFork {
            install_atfork(&shared)?;
        }
        // Each thread reports when its start-up is over: starting a thread allocates (the
        // C library's and Rust's per-thread state), and an allocation while another thread
        // is inside fork() waits for fork() to finish, which waits for the reader.
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<()>(2);
        let mut threads = Vec::new();
        for (name, f) in [
            ("pw-memmon-read", reader_loop as fn(Arc<Shared>)),
            ("pw-memmon-call", dispatcher_loop as fn(Arc<Shared>)),
        ] {
            let sh = shared.clone();
            let ready = ready_tx.clone();
            let t = std::thread::Builder::new()
                .name(name.into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    ON_MONITOR_THREAD.with(|c| c.set(true));
                    // Binds this thread to a malloc arena now rather than at a first
                    // allocation later.
                    drop(std::hint::black_box(Box::new(0u64)));
                    let _ = ready.send(());
                    drop(ready);
                    f(sh)
                })
                .map_err(|e| unavailable(format!("cannot start the monitor thread: {e}")));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let core = Core {
                        shared,
                        threads: Mutex::new(threads),
                    };
                    drop(core);
                    return Err(e);
                }
            }
        }
        drop(ready_tx);
        for _ in 0..threads.len() {
            let _ = ready_rx.recv();
        }
        Ok(Core {
            shared,
            threads: Mutex::new(threads),
        })
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        let sh = &self.shared;
        if sh.pid != std::process::id() {
            // A forked child's copy: its threads do not exist here.
            return;
        }
        sh.stopping.store(true, SeqCst);
        sh.ring.doorbell.fetch_add(1, SeqCst);
        pagewire_sys::futex_wake(&sh.ring.doorbell);
        sh.wake.signal();
        {
            let _g = sh.done_mx.lock();
            sh.done_cv.notify_all();
        }
        let me = std::thread::current().id();
        for t in self.threads.lock().drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

fn install_atfork(shared: &Arc<Shared>) -> Result<()> {
    let mut err = None;
    ATFORK.call_once(|| {
        if let Err(e) = sys::install_atfork_parent(atfork_parent) {
            err = Some(e);
        }
    });
    if let Some(e) = err {
        return Err(Error::MonitorUnavailable {
            reason: format!("pthread_atfork failed ({e}), so forks would go unseen"),
        });
    }
    let mut targets = FORK_TARGETS.lock();
    targets.retain(|w| w.strong_count() > 0 && w.upgrade().is_some_and(|s| s.pid == shared.pid));
    targets.push(Arc::downgrade(shared));
    ATFORK_PID.store(shared.pid as u64, SeqCst);
    Ok(())
}

/// Runs in the parent after every `fork()`, before it returns: delivers [`Cause::Fork`]
/// and waits for it.
extern "C" fn atfork_parent() {
    let pid = std::process::id();
    if ATFORK_PID.load(SeqCst) != pid as u64 {
        return;
    }
    let targets: Vec<Arc<Shared>> = FORK_TARGETS
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.pid == pid && !s.stopping.load(Relaxed))
        .collect();
    for sh in targets {
        sh.request_fork();
    }
}

impl Handle {
    /// Invalidates this monitor's subscriptions overlapping `[start, end)` and born no
    /// later than the event's batch `seq`, and calls the sink on the overlap.
    fn hit(&self, start: u64, end: u64, seq: u64, cause: Cause, counter: &AtomicU64) {
        let pieces = self.subs.lock().hit(start, end, seq);
        if !pieces.is_empty() {
            counter.fetch_add(1, Relaxed);
        }
        self.call(&pieces, cause);
    }

    fn hit_all(&self, seq: u64, cause: Cause) {
        let pieces = self.subs.lock().hit(0, u64::MAX, seq);
        self.call(&pieces, cause);
    }

    fn call(&self, pieces: &[(u64, u64)], cause: Cause) {
        for &(a, b) in pieces {
            self.invalidations.fetch_add(1, Relaxed);
            self.invalidated_bytes.fetch_add(b - a, Relaxed);
            self.sink.invalidate(a, b - a, cause);
        }
    }
}

/// Whether `/proc/self/maps` shows a System V shared memory segment in `[start, end)`.
fn overlaps_sysv_shm(start: u64, end: u64) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return true; // cannot tell: refuse
    };
    maps.lines().any(|line| {
        let mut f = line.split_whitespace();
        let Some((a, b)) = f.next().and_then(|r| r.split_once('-')) else {
            return false;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            return false;
        };
        a < end && start < b && f.nth(4).is_some_and(|path| path.starts_with("/SYSV"))
    })
}
