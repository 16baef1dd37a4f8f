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
#![forbid(unsafe_code)]

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
use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;

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

#[derive(Clone, Copy, Debug)]
enum Entry {
    Unmap { start: u64, end: u64 },
    Remove { start: u64, end: u64 },
    Remap { from: u64, to: u64, len: u64 },
    Fork { ticket: u64 },
}

impl Entry {
    fn encode(self, seq: u64) -> [u64; 5] {
        match self {
            Entry::Unmap { start, end } => [1, start, end, 0, seq],
            Entry::Remove { start, end } => [2, start, end, 0, seq],
            Entry::Remap { from, to, len } => [3, from, to, len, seq],
            Entry::Fork { ticket } => [4, ticket, 0, 0, seq],
        }
    }

    /// The entry and its batch tag.
    fn decode(w: [u64; 5]) -> (Entry, u64) {
        let e = match w[0] {
            1 => Entry::Unmap {
                start: w[1],
                end: w[2],
            },
            2 => Entry::Remove {
                start: w[1],
                end: w[2],
            },
            3 => Entry::Remap {
                from: w[1],
                to: w[2],
                len: w[3],
            },
            _ => Entry::Fork { ticket: w[1] },
        };
        (e, w[4])
    }
}

/// The queue from the reader (sole producer) to the dispatcher (sole consumer): a ring of
/// preallocated slots with atomic indices, so that pushing takes no lock and allocates
/// nothing.
struct Ring {
    slots: Box<[[AtomicU64; 5]]>,
    /// Next slot the reader writes (only the reader stores it).
    tail: AtomicUsize,
    /// Next slot the dispatcher reads (only the dispatcher stores it).
    head: AtomicUsize,
    /// Set by the reader when an event did not fit.
    overflow: AtomicBool,
    /// Highest read sequence whose events are all in the ring (or lost with `overflow`).
    published: AtomicU64,
    /// Bumped by the reader after publishing; the dispatcher sleeps on it (futex).
    doorbell: AtomicU32,
}

impl Ring {
    fn new(capacity: usize) -> Ring {
        Ring {
            slots: (0..capacity)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            tail: AtomicUsize::new(0),
            head: AtomicUsize::new(0),
            overflow: AtomicBool::new(false),
            published: AtomicU64::new(0),
            doorbell: AtomicU32::new(0),
        }
    }

    /// Reader only: queues `e` of the batch tagged `seq`. Returns false (and marks the
    /// overflow) when full.
    fn push(&self, e: Entry, seq: u64) -> bool {
        let tail = self.tail.load(Relaxed);
        if tail - self.head.load(Acquire) >= self.slots.len() {
            self.overflow.store(true, Release);
            return false;
        }
        let slot = &self.slots[tail % self.slots.len()];
        for (w, v) in slot.iter().zip(e.encode(seq)) {
            w.store(v, Relaxed);
        }
        self.tail.store(tail + 1, Release);
        true
    }

    /// Reader only: everything read up to `seq` is in the ring; wakes the dispatcher.
    fn publish(&self, seq: u64) {
        self.published.store(seq, Release);
        self.doorbell.fetch_add(1, Release);
        crate::sys::futex_wake(&self.doorbell);
    }

    /// Dispatcher only: moves the queued entries (with their tags) to `out`.
    fn take(&self, out: &mut Vec<(Entry, u64)>) {
        let head = self.head.load(Relaxed);
        let tail = self.tail.load(Acquire);
        for i in head..tail {
            let slot = &self.slots[i % self.slots.len()];
            out.push(Entry::decode(std::array::from_fn(|k| {
                slot[k].load(Relaxed)
            })));
        }
        self.head.store(tail, Release);
    }
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

/// A memory monitor over Linux userfaultfd (module docs of [`crate::memmon`]).
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
        let (start, span) = crate::sys::page_span(addr, len);
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
        crate::sys::futex_wake(&sh.ring.doorbell);
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

impl Shared {
    /// Registers `[start, end)` with the kernel (idempotent for pages this descriptor
    /// already watches) and counts a reference on its pages.
    ///
    /// hugetlbfs memory must be registered in whole huge pages: when the page-aligned
    /// range is refused with `EINVAL`, the range rounded out to 2 MiB and then to 1 GiB is
    /// tried. Returns the range registered.
    fn acquire(&self, start: u64, end: u64) -> Result<(u64, u64)> {
        let unwatchable = |reason: String| Error::UnwatchableRange {
            addr: start,
            len: end - start,
            reason,
        };
        let mut reg = self.registry.lock();
        let mut attempt = self
            .uffd
            .register_wp(start, end - start)
            .map(|i| (i, start, end));
        for huge in [2u64 << 20, 1 << 30] {
            if !matches!(&attempt, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
                break;
            }
            let (hs, he) = (start & !(huge - 1), end.div_ceil(huge) * huge);
            attempt = self.uffd.register_wp(hs, he - hs).map(|i| (i, hs, he));
        }
        let (ioctls, start, end) = attempt.map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::EINVAL) => {
                    "it is not anonymous, shmem or hugetlbfs memory (a file mapping or a System \
                     V shared memory segment), or not mapped"
                }
                Some(libc::EBUSY) => "another userfaultfd in this process watches part of it",
                Some(libc::ENOMEM) => {
                    "it is not mapped, or the process has reached vm.max_map_count mappings"
                }
                _ => "the kernel refused to register it",
            };
            unwatchable(format!("{why} (UFFDIO_REGISTER: {e})"))
        })?;
        let undo = |reg: &Segments| {
            for (a, b) in reg.uncovered(start, end) {
                let _ = self.uffd.unregister(a, b - a);
            }
        };
        // hugetlbfs ranges report no UFFDIO_ZEROPAGE; among them, System V segments made
        // with SHM_HUGETLB can be registered, but their shmdt is never reported.
        if ioctls & sys::IOCTL_ZEROPAGE_BIT == 0 && overlaps_sysv_shm(start, end) {
            undo(&reg);
            return Err(unwatchable(
                "it is System V shared memory, whose shmdt the kernel does not report".into(),
            ));
        }
        // Registration skips holes; a hole filled later would be unwatched.
        if !crate::sys::is_mapped(start, end - start) {
            undo(&reg);
            return Err(unwatchable("it is not entirely mapped".into()));
        }
        reg.add(start, end);
        Ok((start, end))
    }

    /// Drops a reference on the pages of `[start, end)`; unregisters those left with none.
    fn release(&self, start: u64, end: u64) {
        let mut reg = self.registry.lock();
        for (a, b) in reg.remove(start, end) {
            // Fails harmlessly where the memory is gone.
            let _ = self.uffd.unregister(a, b - a);
        }
    }

    fn flush(&self) {
        if on_monitor_thread() {
            return;
        }
        let target = self.read_seq.load(SeqCst);
        if self.done_seq.load(SeqCst) >= target {
            return;
        }
        let mut g = self.done_mx.lock();
        while self.done_seq.load(SeqCst) < target && !self.stopping.load(SeqCst) {
            self.done_cv.wait_for(&mut g, Duration::from_millis(100));
        }
    }

    /// From the `pthread_atfork` handler: has the dispatcher deliver a fork and waits.
    fn request_fork(&self) {
        let ticket = self.fork_requested.fetch_add(1, SeqCst) + 1;
        self.wake.signal();
        if on_monitor_thread() {
            return;
        }
        let mut g = self.done_mx.lock();
        while self.fork_done.load(SeqCst) < ticket && !self.stopping.load(SeqCst) {
            self.done_cv.wait_for(&mut g, Duration::from_millis(100));
        }
    }

    fn live_handles(&self) -> Vec<Arc<Handle>> {
        self.handles
            .read()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    fn deliver(&self, handles: &[Arc<Handle>], e: Entry, seq: u64) {
        match e {
            Entry::Unmap { start, end } => {
                for h in handles {
                    h.hit(start, end, seq, Cause::Unmap, &h.unmap_events);
                }
            }
            Entry::Remove { start, end } => {
                for h in handles {
                    h.hit(start, end, seq, Cause::Remove, &h.remove_events);
                }
            }
            Entry::Remap { from, to, len } => {
                for h in handles {
                    h.hit(
                        from,
                        from.saturating_add(len),
                        seq,
                        Cause::Remap,
                        &h.remap_events,
                    );
                }
                // The kernel moved our registration along with the pages; nobody
                // subscribed the new place, so stop watching it.
                let reg = self.registry.lock();
                for (a, b) in reg.uncovered(to, to.saturating_add(len)) {
                    let _ = self.uffd.unregister(a, b - a);
                }
            }
            Entry::Fork { ticket } => {
                for h in handles {
                    h.fork_events.fetch_add(1, Relaxed);
                    if h.options.fork == ForkPolicy::InvalidateAll {
                        h.hit_all(seq, Cause::Fork);
                    }
                }
                if ticket > 0 {
                    self.fork_done.fetch_max(ticket, SeqCst);
                }
            }
        }
    }
}

fn reader_loop(sh: Arc<Shared>) {
    let mut buf = [sys::Msg::default(); READ_BATCH];
    let mut pending = [None::<Entry>; READ_BATCH];
    let mut forks_enqueued = 0u64;
    loop {
        let ready = match sys::poll2(sh.uffd.raw(), sh.wake.raw()) {
            Ok(r) => r,
            Err(_) => {
                sh.counters.read_errors.fetch_add(1, Relaxed);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        if ready.second {
            sh.wake.drain();
            if sh.stopping.load(SeqCst) {
                return;
            }
        }
        let forks = sh.fork_requested.load(SeqCst);
        if !ready.first && forks == forks_enqueued {
            continue;
        }
        // Bumped before the read that lets the event's thread go on (module docs).
        let seq = sh.read_seq.fetch_add(1, SeqCst) + 1;
        let n = if ready.first {
            match sh.uffd.read_msgs(&mut buf) {
                Ok(n) => n,
                Err(_) => {
                    // EMFILE while installing a fork event's descriptor, say: the event
                    // stays queued; try again shortly.
                    sh.counters.read_errors.fetch_add(1, Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                    0
                }
            }
        } else {
            0
        };
        let mut k = 0;
        for m in &buf[..n] {
            sh.counters.events_read.fetch_add(1, Relaxed);
            let e = match m.event {
                sys::EVENT_UNMAP => Entry::Unmap {
                    start: m.arg[0],
                    end: m.arg[1],
                },
                sys::EVENT_REMOVE => Entry::Remove {
                    start: m.arg[0],
                    end: m.arg[1],
                },
                sys::EVENT_REMAP => Entry::Remap {
                    from: m.arg[0],
                    to: m.arg[1],
                    len: m.arg[2],
                },
                sys::EVENT_FORK => {
                    // The child's copy of our registrations: closing it releases them.
                    sys::close_handed_fd(m.fork_fd());
                    Entry::Fork { ticket: 0 }
                }
                sys::EVENT_PAGEFAULT => {
                    // Never expected (nothing is write-protected); let the thread go on.
                    sh.counters.routed_faults.fetch_add(1, Relaxed);
                    if m.arg[0] & sys::PAGEFAULT_FLAG_WP != 0 {
                        sh.uffd.release_fault(m.arg[1], PAGE_SIZE);
                    }
                    continue;
                }
                _ => continue,
            };
            pending[k] = Some(e);
            k += 1;
        }
        for e in pending[..k].iter_mut().filter_map(Option::take) {
            if !sh.ring.push(e, seq) {
                sh.counters.lost.fetch_add(1, Relaxed);
            }
        }
        if forks != forks_enqueued {
            if !sh.ring.push(Entry::Fork { ticket: forks }, seq) {
                sh.counters.lost.fetch_add(1, Relaxed);
            }
            forks_enqueued = forks;
        }
        // Closes the batch: a subscription born from now on is not touched by it.
        let closed = sh.read_seq.fetch_add(1, SeqCst) + 1;
        sh.ring.publish(closed);
    }
}

fn dispatcher_loop(sh: Arc<Shared>) {
    let mut local: Vec<(Entry, u64)> = Vec::with_capacity(QUEUE_CAPACITY);
    let mut done = 0u64;
    loop {
        let bell = sh.ring.doorbell.load(Acquire);
        let published = sh.ring.published.load(Acquire);
        let stop = sh.stopping.load(SeqCst);
        if published == done && !stop {
            crate::sys::futex_wait(&sh.ring.doorbell, bell, Duration::from_millis(500));
            continue;
        }
        // Everything of batches up to `published` is in the ring now.
        let overflow = sh.ring.overflow.swap(false, AcqRel);
        sh.ring.take(&mut local);
        let handles = sh.live_handles();
        if overflow {
            for h in &handles {
                h.hit_all(u64::MAX, Cause::Lost);
            }
            sh.fork_done
                .fetch_max(sh.fork_requested.load(SeqCst), SeqCst);
        }
        for (e, seq) in local.drain(..) {
            sh.deliver(&handles, e, seq);
        }
        drop(handles);
        done = published;
        sh.done_seq.store(done, SeqCst);
        {
            let _g = sh.done_mx.lock();
            sh.done_cv.notify_all();
        }
        if stop {
            return;
        }
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

/// One subscription.
#[derive(Clone, Copy, Debug)]
struct Sub {
    start: u64,
    end: u64,
    valid: bool,
    /// `read_seq` before the registration: batches tagged below it do not apply.
    born: u64,
    /// The range registered for it (whole huge pages on hugetlbfs).
    registered: (u64, u64),
}

/// One monitor's subscriptions, indexed by start for overlap queries.
#[derive(Default)]
struct Subs {
    by_id: HashMap<u64, Sub>,
    by_start: BTreeSet<(u64, u64)>,
    max_len: u64,
    watched_bytes: u64,
}

impl Subs {
    fn insert(&mut self, id: u64, start: u64, end: u64, born: u64) {
        self.by_id.insert(
            id,
            Sub {
                start,
                end,
                valid: true,
                born,
                registered: (start, end),
            },
        );
        self.by_start.insert((start, id));
        self.max_len = self.max_len.max(end - start);
        self.watched_bytes += end - start;
    }

    /// Forgets a subscription; returns the range registered for it.
    fn remove(&mut self, id: u64) -> Option<(u64, u64)> {
        let s = self.by_id.remove(&id)?;
        self.by_start.remove(&(s.start, id));
        self.watched_bytes -= s.end - s.start;
        Some(s.registered)
    }

    fn set_registered(&mut self, id: u64, start: u64, end: u64) {
        if let Some(s) = self.by_id.get_mut(&id) {
            s.registered = (start, end);
        }
    }

    fn is_valid(&self, id: u64) -> bool {
        self.by_id.get(&id).is_some_and(|s| s.valid)
    }

    /// Marks every subscription overlapping `[start, end)` and born no later than `seq`
    /// invalid; returns the overlap (their pages within the range), sorted and coalesced.
    fn hit(&mut self, start: u64, end: u64, seq: u64) -> Vec<(u64, u64)> {
        let lo = start.saturating_sub(self.max_len);
        let mut pieces = Vec::new();
        for &(s, id) in self.by_start.range((lo, 0)..(end, 0)) {
            let sub = self
                .by_id
                .get_mut(&id)
                .expect("indexed subscription exists");
            if sub.end > start && s < end && sub.born <= seq {
                sub.valid = false;
                pieces.push((s.max(start), sub.end.min(end)));
            }
        }
        coalesce(pieces)
    }
}

fn coalesce(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Reference counts of registered pages: disjoint segments `start -> (end, refs)`.
#[derive(Default, Debug)]
struct Segments {
    map: BTreeMap<u64, (u64, u32)>,
}

impl Segments {
    /// Splits the segment containing `at` strictly inside, so a segment starts at `at`.
    fn split(&mut self, at: u64) {
        if let Some((&s, &(e, r))) = self.map.range(..at).next_back() {
            if s < at && at < e {
                self.map.insert(s, (at, r));
                self.map.insert(at, (e, r));
            }
        }
    }

    /// Merges the segments meeting at `at` if they have the same count.
    fn merge_at(&mut self, at: u64) {
        let Some((&s, &(e, r))) = self.map.range(..at).next_back() else {
            return;
        };
        if e != at {
            return;
        }
        if let Some(&(e2, r2)) = self.map.get(&at) {
            if r2 == r {
                self.map.remove(&at);
                self.map.insert(s, (e2, r));
            }
        }
    }

    fn add(&mut self, start: u64, end: u64) {
        self.split(start);
        self.split(end);
        let mut pos = start;
        let existing: Vec<(u64, u64)> = self
            .map
            .range(start..end)
            .map(|(&s, &(e, _))| (s, e))
            .collect();
        for (s, e) in existing {
            if pos < s {
                self.map.insert(pos, (s, 1));
            }
            self.map.get_mut(&s).expect("segment").1 += 1;
            pos = e;
        }
        if pos < end {
            self.map.insert(pos, (end, 1));
        }
        self.merge_at(start);
        self.merge_at(end);
    }

    /// Drops one reference on `[start, end)`; returns the ranges left with none.
    fn remove(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.split(start);
        self.split(end);
        let keys: Vec<u64> = self.map.range(start..end).map(|(&s, _)| s).collect();
        let mut freed = Vec::new();
        for s in keys {
            let seg = self.map.get_mut(&s).expect("segment");
            seg.1 = seg.1.saturating_sub(1);
            if seg.1 == 0 {
                freed.push((s, seg.0));
                self.map.remove(&s);
            }
        }
        self.merge_at(start);
        self.merge_at(end);
        coalesce(freed)
    }

    /// The parts of `[start, end)` with no reference.
    fn uncovered(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = start;
        let first = self
            .map
            .range(..start)
            .next_back()
            .filter(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, _))| (s, e));
        for (s, e) in first
            .into_iter()
            .chain(self.map.range(start..end).map(|(&s, &(e, _))| (s, e)))
        {
            if pos < s {
                out.push((pos, s.min(end)));
            }
            pos = pos.max(e);
            if pos >= end {
                break;
            }
        }
        if pos < end {
            out.push((pos, end));
        }
        out
    }

    #[cfg(test)]
    fn refs(&self) -> Vec<(u64, u64, u32)> {
        self.map.iter().map(|(&s, &(e, r))| (s, e, r)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_count_overlapping_references() {
        let mut s = Segments::default();
        s.add(0, 10);
        s.add(5, 15);
        assert_eq!(s.refs(), vec![(0, 5, 1), (5, 10, 2), (10, 15, 1)]);
        assert_eq!(s.uncovered(0, 20), vec![(15, 20)]);
        assert_eq!(s.uncovered(3, 4), vec![]);
        assert_eq!(s.remove(5, 15), vec![(10, 15)]);
        assert_eq!(s.refs(), vec![(0, 10, 1)], "merged back");
        assert_eq!(s.remove(0, 10), vec![(0, 10)]);
        assert!(s.refs().is_empty());
    }

    #[test]
    fn segments_gaps_and_nesting() {
        let mut s = Segments::default();
        s.add(10, 20);
        s.add(30, 40);
        s.add(0, 50);
        assert_eq!(
            s.refs(),
            vec![
                (0, 10, 1),
                (10, 20, 2),
                (20, 30, 1),
                (30, 40, 2),
                (40, 50, 1)
            ]
        );
        assert_eq!(s.remove(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(s.uncovered(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(s.remove(10, 20), vec![(10, 20)]);
        assert_eq!(s.remove(30, 40), vec![(30, 40)]);
        assert!(s.refs().is_empty());
    }

    #[test]
    fn subs_hit_clips_and_coalesces() {
        let mut s = Subs::default();
        s.insert(1, 0, 100, 0);
        s.insert(2, 50, 150, 0);
        s.insert(3, 300, 400, 0);
        assert_eq!(s.hit(90, 320, 1), vec![(90, 150), (300, 320)]);
        assert!(!s.is_valid(1) && !s.is_valid(2) && !s.is_valid(3));
        s.insert(4, 500, 600, 0);
        assert_eq!(s.hit(600, 700, 1), vec![], "touching is not overlapping");
        assert!(s.is_valid(4));
        assert_eq!(s.remove(4), Some((500, 600)));
        assert_eq!(s.hit(0, u64::MAX, 1), vec![(0, 150), (300, 400)]);
        s.insert(5, 1000, 2000, 7);
        assert_eq!(
            s.hit(1000, 2000, 6),
            vec![],
            "an older batch does not apply"
        );
        assert!(s.is_valid(5));
        assert_eq!(s.hit(1500, 2000, 7), vec![(1500, 2000)]);
    }
}
