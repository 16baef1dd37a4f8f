//! Tests of the memory-change monitor (`transport::memmon`) with real system calls in this
//! process: every way of changing a subscribed range that it must catch, the ranges it must
//! refuse, the ordering contract (`flush`), and that registered memory faults in as fast as
//! unregistered memory. Figures are printed (`--nocapture`), bounds asserted loosely.
//!
//! The tests take one lock so that they run one at a time: they share the process's
//! monitor thread, a fork in one would invalidate the others' subscriptions, and the
//! timings want a quiet machine.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pagewire_memmon::{
    monitor_for, Cause, ForkPolicy, InvalidationSink, MemoryMonitor, MonitorChoice, MonitorOptions,
    NullMonitor, UffdMonitor,
};
use pagewire_sys::monotonic_ns;
use pagewire_sys::Error;
use pagewire_test_support::{require, Prerequisite};

const PG: u64 = 4096;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, Debug)]
struct Call {
    addr: u64,
    len: u64,
    cause: Cause,
    at_ns: u64,
}

/// A sink that records every call.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
}

impl InvalidationSink for Recorder {
    fn invalidate(&self, addr: u64, len: u64, cause: Cause) {
        self.calls.lock().unwrap().push(Call {
            addr,
            len,
            cause,
            at_ns: monotonic_ns(),
        });
    }
}

impl Recorder {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The ranges reported for `cause`, as sorted, coalesced `(start, end)`.
    fn of(&self, cause: Cause) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self
            .calls()
            .iter()
            .filter(|c| c.cause == cause)
            .map(|c| (c.addr, c.addr + c.len))
            .collect();
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (a, b) in v {
            match out.last_mut() {
                Some(l) if a <= l.1 => l.1 = l.1.max(b),
                _ => out.push((a, b)),
            }
        }
        out
    }

    fn covers(&self, cause: Cause, start: u64, end: u64) -> bool {
        self.of(cause).iter().any(|&(a, b)| a <= start && end <= b)
    }

    fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }
}

fn monitor_with(fork: ForkPolicy) -> (UffdMonitor, Arc<Recorder>) {
    let r = Arc::new(Recorder::default());
    let m = UffdMonitor::with_options(r.clone(), MonitorOptions { fork })
        .expect("a userfaultfd monitor (this machine permits userfaultfd)");
    // Lets events of earlier tests' unmaps reach their sinks first: a stale event on an
    // address reused here would (harmlessly, for a cache) invalidate a new subscription.
    m.flush();
    (m, r)
}

/// A monitor that ignores forks, so only the change under test is seen.
fn monitor() -> (UffdMonitor, Arc<Recorder>) {
    monitor_with(ForkPolicy::Ignore)
}

fn mmap(len: u64, flags: libc::c_int) -> u64 {
    // SAFETY: a new mapping at an address of the kernel's choosing; nothing else is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    assert_ne!(
        p,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    p as u64
}

/// Fresh private anonymous memory, every page touched (present).
fn anon(pages: u64) -> u64 {
    let a = mmap(pages * PG, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    touch(a, pages * PG);
    a
}

/// Fresh shared anonymous (shmem) memory, every page touched.
fn shared_anon(pages: u64) -> u64 {
    let a = mmap(pages * PG, libc::MAP_SHARED | libc::MAP_ANONYMOUS);
    touch(a, pages * PG);
    a
}

/// Writes one byte in each page of a range this test mapped.
fn touch(addr: u64, len: u64) {
    for off in (0..len).step_by(PG as usize) {
        // SAFETY: the range is a live read-write mapping owned by the calling test.
        unsafe { std::ptr::write_volatile((addr + off) as *mut u8, 1) };
    }
}

fn munmap(addr: u64, len: u64) {
    // SAFETY: unmaps (part of) a mapping the calling test made and no longer accesses.
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
    assert_eq!(rc, 0, "munmap: {}", std::io::Error::last_os_error());
}

fn madvise(addr: u64, len: u64, advice: libc::c_int) {
    // SAFETY: discards pages of a mapping the calling test owns; no Rust reference into it
    // exists.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, advice) };
    assert_eq!(
        rc,
        0,
        "madvise({advice}): {}",
        std::io::Error::last_os_error()
    );
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

#[test]
fn munmap_is_seen_before_flush_returns() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(16);
    let id = m.subscribe(a + 100, 16 * PG - 200).unwrap();
    assert!(m.still_valid(id));
    munmap(a, 16 * PG);
    assert!(!m.still_valid(id), "flush made the invalidation visible");
    assert_eq!(r.of(Cause::Unmap), vec![(a, a + 16 * PG)], "whole pages");
    let c = m.counters();
    assert_eq!((c.unmap_events, c.invalidations), (1, 1));
    assert_eq!(c.invalidated_bytes, 16 * PG);
    assert_eq!(c.routed_faults, 0);
    m.unsubscribe(id);
    assert_eq!(m.counters().subscriptions, 0);
}

#[test]
fn free_of_a_large_vec_is_an_unmap() {
    let _s = serial();
    let (m, r) = monitor();
    // Above glibc's largest dynamic mmap threshold (32 MiB), so malloc maps it and free
    // unmaps it whatever was freed before.
    const N: usize = 40 << 20;
    let mut v: Vec<u8> = Vec::with_capacity(N);
    v.push(1);
    v.spare_capacity_mut()[N - 2].write(1);
    let (addr, len) = (v.as_ptr() as u64, N as u64);
    let id = m.subscribe(addr, len).unwrap();
    drop(v);
    m.flush();
    assert!(!m.is_valid(id));
    let (start, end) = (addr & !(PG - 1), (addr + len).div_ceil(PG) * PG);
    assert!(
        r.covers(Cause::Unmap, start, end),
        "free() of {N} bytes at {addr:#x}: {:?}",
        r.calls()
    );
}

#[test]
fn partial_munmap_invalidates_only_the_hole() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(16);
    let whole = m.subscribe(a, 16 * PG).unwrap();
    let tail = m.subscribe(a + 12 * PG, 2 * PG).unwrap();
    munmap(a + 4 * PG, 4 * PG);
    m.flush();
    assert_eq!(r.of(Cause::Unmap), vec![(a + 4 * PG, a + 8 * PG)]);
    assert!(!m.is_valid(whole));
    assert!(
        m.is_valid(tail),
        "a subscription outside the hole stays valid"
    );
    r.clear();
    // The rest, across the hole: the kernel reports the range munmap was given, hole
    // included, and the hole is still subscribed.
    munmap(a, 16 * PG);
    m.flush();
    assert!(
        r.covers(Cause::Unmap, a, a + 4 * PG) && r.covers(Cause::Unmap, a + 8 * PG, a + 16 * PG)
    );
    assert!(!m.is_valid(tail));
}

#[test]
fn mremap_move_invalidates_the_old_range_only() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(8);
    let dst = mmap(8 * PG, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    let id = m.subscribe(a, 8 * PG).unwrap();
    // SAFETY: moves the test's own mapping onto its own destination mapping.
    let moved = unsafe {
        libc::mremap(
            a as *mut libc::c_void,
            (8 * PG) as usize,
            (8 * PG) as usize,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst as *mut libc::c_void,
        )
    };
    assert_eq!(moved as u64, dst);
    m.flush();
    assert!(!m.is_valid(id));
    assert_eq!(r.of(Cause::Remap), vec![(a, a + 8 * PG)]);
    assert!(
        r.calls()
            .iter()
            .all(|c| c.addr + c.len <= a + 8 * PG && c.addr >= a),
        "nothing reported for the new place: {:?}",
        r.calls()
    );
    r.clear();
    munmap(dst, 8 * PG);
    m.flush();
    assert!(r.calls().is_empty(), "the new place is not subscribed");
}

#[test]
fn mremap_shrink_invalidates_the_tail() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(16);
    let whole = m.subscribe(a, 16 * PG).unwrap();
    let head = m.subscribe(a, 4 * PG).unwrap();
    // SAFETY: shrinks the test's own mapping in place.
    let p = unsafe {
        libc::mremap(
            a as *mut libc::c_void,
            (16 * PG) as usize,
            (8 * PG) as usize,
            0,
        )
    };
    assert_eq!(p as u64, a);
    m.flush();
    assert_eq!(r.of(Cause::Unmap), vec![(a + 8 * PG, a + 16 * PG)]);
    assert!(!m.is_valid(whole));
    assert!(m.is_valid(head));
    munmap(a, 8 * PG);
}

#[test]
fn madvise_dontneed_and_free_are_removes() {
    let _s = serial();
    let (m, r) = monitor();
    for advice in [libc::MADV_DONTNEED, libc::MADV_FREE] {
        r.clear();
        let a = anon(8);
        let id = m.subscribe(a, 8 * PG).unwrap();
        madvise(a + 2 * PG, 4 * PG, advice);
        m.flush();
        assert_eq!(
            r.of(Cause::Remove),
            vec![(a + 2 * PG, a + 6 * PG)],
            "advice {advice}"
        );
        assert!(!m.is_valid(id));
        munmap(a, 8 * PG);
    }
}

/// Pinned memory (the soft NIC mlocks what it registers): MADV_DONTNEED fails on locked
/// pages without changing them, MADV_DONTNEED_LOCKED discards them and is reported.
#[test]
fn madvise_dontneed_locked_on_mlocked_pages_is_a_remove() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(8);
    pagewire_sys::mlock(a, 8 * PG).unwrap();
    let id = m.subscribe(a, 8 * PG).unwrap();
    // SAFETY: advice on the test's own mapping; refused on locked pages.
    let rc = unsafe {
        libc::madvise(
            a as *mut libc::c_void,
            (8 * PG) as usize,
            libc::MADV_DONTNEED,
        )
    };
    assert_eq!(rc, -1, "MADV_DONTNEED on mlocked pages is refused");
    assert!(m.still_valid(id), "nothing changed, nothing reported");
    madvise(a + 2 * PG, 4 * PG, libc::MADV_DONTNEED_LOCKED);
    m.flush();
    assert_eq!(r.of(Cause::Remove), vec![(a + 2 * PG, a + 6 * PG)]);
    assert!(!m.is_valid(id));
    munmap(a, 8 * PG);
}

#[test]
fn madvise_remove_on_shared_memory_is_a_remove() {
    let _s = serial();
    let (m, r) = monitor();
    // MADV_REMOVE needs shared memory (EINVAL on private anonymous).
    let a = shared_anon(8);
    let id = m.subscribe(a, 8 * PG).unwrap();
    madvise(a + 2 * PG, 4 * PG, libc::MADV_REMOVE);
    m.flush();
    assert_eq!(r.of(Cause::Remove), vec![(a + 2 * PG, a + 6 * PG)]);
    assert!(!m.is_valid(id));
    r.clear();
    munmap(a, 8 * PG);
    m.flush();
    assert_eq!(r.of(Cause::Unmap), vec![(a, a + 8 * PG)], "shmem munmap");
}

#[test]
fn mmap_fixed_over_a_range_is_an_unmap() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(8);
    let id = m.subscribe(a, 8 * PG).unwrap();
    // SAFETY: replaces pages of the test's own mapping.
    let p = unsafe {
        libc::mmap(
            (a + 2 * PG) as *mut libc::c_void,
            (2 * PG) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p as u64, a + 2 * PG);
    m.flush();
    assert_eq!(r.of(Cause::Unmap), vec![(a + 2 * PG, a + 4 * PG)]);
    assert!(!m.is_valid(id));
    munmap(a, 8 * PG);
}

#[test]
fn brk_shrink_is_an_unmap() {
    let _s = serial();
    let (m, r) = monitor();
    // Grows the heap by hand past malloc's top, then gives back the upper half. Only the
    // main thread's malloc arena uses brk; the test checks that nobody moved the break in
    // between and leaves it where it found it.
    // SAFETY: sbrk(0) only reads the break.
    let before = unsafe { libc::sbrk(0) } as u64;
    let start = before.div_ceil(PG) * PG;
    let grow = start - before + 16 * PG;
    // SAFETY: extends the data segment; the new pages belong to no one but this test.
    let old = unsafe { libc::sbrk(grow as libc::intptr_t) } as u64;
    assert_eq!(old, before, "the break moved under the test");
    touch(start, 16 * PG);
    let id = m.subscribe(start, 16 * PG).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sbrk(0) } as u64, before + grow);
    // SAFETY: gives back the upper 8 pages this test added.
    unsafe { libc::sbrk(-((8 * PG) as libc::intptr_t)) };
    m.flush();
    assert_eq!(r.of(Cause::Unmap), vec![(start + 8 * PG, start + 16 * PG)]);
    assert!(!m.is_valid(id));
    m.unsubscribe(id);
    // SAFETY: gives back the rest, if the break is still where the test left it.
    unsafe {
        if libc::sbrk(0) as u64 == before + grow - 8 * PG {
            libc::sbrk(-((grow - 8 * PG) as libc::intptr_t));
        }
    }
}

#[test]
fn system_v_shared_memory_is_refused() {
    let _s = serial();
    let (m, _r) = monitor();
    // SAFETY: a private segment, attached where the kernel chooses, marked for removal at
    // once so nothing outlives the test.
    let a = unsafe {
        let id = libc::shmget(
            libc::IPC_PRIVATE,
            (16 * PG) as usize,
            libc::IPC_CREAT | 0o600,
        );
        assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        let a = libc::shmat(id, std::ptr::null(), 0);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        assert_ne!(a as isize, -1, "shmat");
        a as u64
    };
    touch(a, 16 * PG);
    // The kernel reports no event for shmdt, so watching it would mean silent staleness:
    // the monitor refuses, and a cache registers such a buffer uncached.
    match m.subscribe(a, 16 * PG) {
        Err(Error::UnwatchableRange { addr, len, reason }) => {
            assert_eq!((addr, len), (a, 16 * PG));
            println!("SysV segment refused: {reason}");
        }
        other => panic!("expected UnwatchableRange, got {other:?}"),
    }
    assert_eq!(m.counters().subscribe_failures, 1);
    // SAFETY: detaches the test's own segment.
    assert_eq!(unsafe { libc::shmdt(a as *const libc::c_void) }, 0);
}

#[test]
fn file_mappings_and_holes_are_refused() {
    let _s = serial();
    let (m, _r) = monitor();
    let path = std::env::temp_dir().join(format!("pagewire-memmon-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(4 * PG).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: maps the test's own file; unmapped below.
    let a = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            (4 * PG) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    } as u64;
    let _ = std::fs::remove_file(&path);
    assert_ne!(a as *mut libc::c_void, libc::MAP_FAILED);
    let r = m.subscribe(a, 4 * PG);
    assert!(matches!(r, Err(Error::UnwatchableRange { .. })), "{r:?}");
    munmap(a, 4 * PG);
    // A range with a hole: a later mapping in the hole would be unwatched.
    let b = anon(8);
    munmap(b + 3 * PG, PG);
    assert!(matches!(
        m.subscribe(b, 8 * PG),
        Err(Error::UnwatchableRange { .. })
    ));
    // Entirely unmapped.
    assert!(matches!(
        m.subscribe(b + 3 * PG, PG),
        Err(Error::UnwatchableRange { .. })
    ));
    assert!(matches!(m.subscribe(b, 0), Err(Error::InvalidArgument(_))));
    munmap(b, 8 * PG);
    assert_eq!(m.counters().subscriptions, 0);
}

#[test]
fn hugetlb_memory_is_watched_in_whole_huge_pages() {
    let _s = serial();
    let (m, r) = monitor();
    const LEN: u64 = 2 << 20;
    // SAFETY: a new huge-page mapping at an address of the kernel's choosing.
    let a = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
            -1,
            0,
        )
    };
    let mapped = if a == libc::MAP_FAILED {
        Err(format!(
            "no huge pages for MAP_HUGETLB ({})",
            std::io::Error::last_os_error()
        ))
    } else {
        Ok(a as u64)
    };
    let Some(a) = require(Prerequisite::HugePages, mapped) else {
        return;
    };
    touch(a, PG);
    // A buffer inside the huge page: registered as the whole huge page.
    let id = m.subscribe(a + PG, 2 * PG).unwrap();
    munmap(a, LEN);
    m.flush();
    assert!(!m.is_valid(id));
    assert_eq!(r.of(Cause::Unmap), vec![(a + PG, a + 3 * PG)]);
    m.unsubscribe(id);
}

#[test]
fn system_v_hugetlb_shared_memory_is_refused() {
    let _s = serial();
    let (m, _r) = monitor();
    const LEN: u64 = 2 << 20;
    // SAFETY: a private huge-page segment, attached where the kernel chooses and marked
    // for removal at once.
    let a = unsafe {
        let id = libc::shmget(
            libc::IPC_PRIVATE,
            LEN as usize,
            libc::IPC_CREAT | libc::SHM_HUGETLB | 0o600,
        );
        let segment = if id < 0 {
            Err(format!(
                "no huge pages for SHM_HUGETLB ({})",
                std::io::Error::last_os_error()
            ))
        } else {
            Ok(id)
        };
        let Some(id) = require(Prerequisite::HugePages, segment) else {
            return;
        };
        let a = libc::shmat(id, std::ptr::null(), 0);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        assert_ne!(a as isize, -1, "shmat");
        a as u64
    };
    touch(a, PG);
    // hugetlbfs memory can be registered, but shmdt of it is not reported either: the
    // monitor recognises the segment and refuses.
    let r = m.subscribe(a, LEN);
    assert!(matches!(r, Err(Error::UnwatchableRange { .. })), "{r:?}");
    println!("SHM_HUGETLB segment refused: {}", r.unwrap_err());
    // SAFETY: detaches the test's own segment.
    assert_eq!(unsafe { libc::shmdt(a as *const libc::c_void) }, 0);
}

/// Forks a child that reports through its exit status whether the monitor is inactive in
/// it, and waits for it.
fn fork_and_wait(m: &UffdMonitor) {
    // SAFETY: the child calls only getpid (inside is_reliable) and _exit, both
    // async-signal-safe, before exiting at once.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = if m.is_reliable() { 1 } else { 0 };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child saw the inherited monitor as reliable (status {status:#x})"
    );
}

#[test]
fn fork_invalidates_everything_subscribed() {
    let _s = serial();
    let (m, r) = monitor_with(ForkPolicy::InvalidateAll);
    let (quiet, qr) = monitor_with(ForkPolicy::Ignore);
    let a = anon(4);
    let b = anon(4);
    let ia = m.subscribe(a, 4 * PG).unwrap();
    let ib = m.subscribe(b, 4 * PG).unwrap();
    let iq = quiet.subscribe(a, 4 * PG).unwrap();
    fork_and_wait(&m);
    m.flush();
    assert!(r.covers(Cause::Fork, a, a + 4 * PG) && r.covers(Cause::Fork, b, b + 4 * PG));
    assert!(!m.is_valid(ia) && !m.is_valid(ib));
    assert!(m.counters().fork_events >= 1);
    assert!(quiet.is_valid(iq), "ForkPolicy::Ignore keeps subscriptions");
    assert!(qr.calls().is_empty());
    assert!(quiet.counters().fork_events >= 1);
    println!(
        "fork seen through {}",
        if m.fork_events_from_kernel() {
            "UFFD_EVENT_FORK"
        } else {
            "pthread_atfork"
        }
    );
    munmap(a, 4 * PG);
    munmap(b, 4 * PG);
}

/// Runs [`fork_through_atfork_scenario`] in a child process with `PAGEWIRE_MEMMON_FORK=atfork`
/// (how unprivileged processes, without `CAP_SYS_PTRACE`, see forks).
#[test]
fn fork_is_seen_through_pthread_atfork_without_fork_events() {
    let _s = serial();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fork_through_atfork_scenario",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PAGEWIRE_MEMMON_FORK", "atfork")
        .env("PAGEWIRE_MEMMON_TEST_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn fork_through_atfork_scenario() {
    if std::env::var_os("PAGEWIRE_MEMMON_TEST_CHILD").is_none() {
        return; // runs only as the child of the test above
    }
    let _s = serial();
    let (m, r) = monitor_with(ForkPolicy::InvalidateAll);
    assert!(!m.fork_events_from_kernel());
    let a = anon(4);
    let id = m.subscribe(a, 4 * PG).unwrap();
    fork_and_wait(&m);
    // The handler waits for the delivery before fork() returns: no flush needed.
    assert!(r.covers(Cause::Fork, a, a + 4 * PG), "{:?}", r.calls());
    assert!(!m.is_valid(id));
    munmap(a, 4 * PG);
}

#[test]
fn unsubscribed_ranges_produce_no_callback() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(8);
    let b = anon(8);
    let id = m.subscribe(a, 8 * PG).unwrap();
    m.unsubscribe(id);
    m.unsubscribe(id); // repeated: ignored
    munmap(a, 8 * PG);
    munmap(b, 8 * PG); // never subscribed
    let c = anon(8);
    madvise(c, 8 * PG, libc::MADV_DONTNEED);
    munmap(c, 8 * PG);
    m.flush();
    assert!(r.calls().is_empty(), "{:?}", r.calls());
    assert_eq!(m.counters().invalidations, 0);
    assert!(!m.is_valid(id), "an unknown id is not valid");
}

#[test]
fn overlapping_subscriptions_are_counted_per_page() {
    let _s = serial();
    let (m, r) = monitor();
    let a = anon(16);
    let first = m.subscribe(a, 12 * PG).unwrap();
    let second = m.subscribe(a + 8 * PG, 8 * PG).unwrap();
    // Releasing the first must keep the kernel watching the pages the second shares.
    m.unsubscribe(first);
    munmap(a, 16 * PG);
    m.flush();
    assert_eq!(r.of(Cause::Unmap), vec![(a + 8 * PG, a + 16 * PG)]);
    assert!(!m.is_valid(second));
}

#[test]
fn two_monitors_watch_the_same_pages() {
    let _s = serial();
    let (m1, r1) = monitor();
    let (m2, r2) = monitor();
    let a = anon(4);
    let i1 = m1.subscribe(a, 4 * PG).unwrap();
    let i2 = m2.subscribe(a + PG, PG).unwrap();
    drop(m1); // unsubscribes i1; m2 still watches its page
    let _ = i1;
    munmap(a, 4 * PG);
    m2.flush();
    assert!(r1.calls().is_empty());
    assert_eq!(r2.of(Cause::Unmap), vec![(a + PG, a + 2 * PG)]);
    assert!(!m2.is_valid(i2));
}

/// A sink that unmaps other watched memory from its callback: its own munmap waits until
/// the monitor reads that event, which the reader thread does while the dispatcher waits.
#[test]
fn a_sink_may_unmap_watched_memory_without_deadlock() {
    let _s = serial();
    let b = anon(4);
    let done = Arc::new(Mutex::new(Vec::<(u64, Cause)>::new()));
    let (b2, d2) = (b, done.clone());
    let sink = move |addr: u64, _len: u64, cause: Cause| {
        d2.lock().unwrap().push((addr, cause));
        if cause == Cause::Unmap && addr != b2 {
            munmap(b2, 4 * PG);
        }
    };
    let m = UffdMonitor::with_options(
        Arc::new(sink),
        MonitorOptions {
            fork: ForkPolicy::Ignore,
        },
    )
    .unwrap();
    let a = anon(4);
    m.subscribe(a, 4 * PG).unwrap();
    m.subscribe(b, 4 * PG).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        munmap(a, 4 * PG);
        // The first flush covers a's event; b's is caused by the sink while the first
        // flush may already be waiting, and is read before that callback returns, so the
        // second flush covers it.
        m.flush();
        m.flush();
        tx.send(()).unwrap();
        m
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("deadlock: the sink's own munmap was never read");
    let seen = done.lock().unwrap().clone();
    assert!(
        seen.contains(&(a, Cause::Unmap)) && seen.contains(&(b, Cause::Unmap)),
        "{seen:?}"
    );
}

#[test]
fn concurrent_changes_are_all_seen() {
    let _s = serial();
    let (m, r) = monitor();
    let m = Arc::new(m);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    let a = anon(2);
                    let id = m.subscribe(a, 2 * PG).unwrap();
                    if i % 2 == 0 {
                        munmap(a, 2 * PG);
                    } else {
                        madvise(a, 2 * PG, libc::MADV_DONTNEED);
                        munmap(a, 2 * PG);
                    }
                    assert!(!m.still_valid(id), "iteration {i}");
                    m.unsubscribe(id);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // At least: one thread's unmap event may still be in flight when the other gets the
    // same addresses back and subscribes them (a spurious, harmless invalidation).
    let c = m.counters();
    assert!(c.unmap_events >= 600 && c.remove_events >= 300, "{c:?}");
    assert_eq!(c.subscriptions, 0);
    assert!(r.calls().len() >= 900);
}

/// First touch of 64 MiB, registered (write-protect mode, nothing protected) against not
/// registered: no fault may be routed to the monitor, and the cost must stay the same.
#[test]
fn first_touch_of_registered_memory_is_not_slowed_down() {
    let _s = serial();
    let (m, _r) = monitor();
    const LEN: u64 = 64 << 20;
    let routed_before = m.counters().routed_faults;
    let run = |register: bool| {
        let a = mmap(LEN, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        let id = register.then(|| m.subscribe(a, LEN).unwrap());
        let t = monotonic_ns();
        touch(a, LEN);
        let ns = monotonic_ns() - t;
        if let Some(id) = id {
            m.unsubscribe(id);
        }
        munmap(a, LEN);
        ns
    };
    let (mut plain, mut watched) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        plain.push(run(false));
        watched.push(run(true));
    }
    let (p, w) = (median(&mut plain), median(&mut watched));
    println!(
        "first touch of 64 MiB (16384 faults), median of 5: unregistered {:.1} ms, \
         registered {:.1} ms (x{:.2}); {:.0} ns/fault vs {:.0} ns/fault",
        p as f64 / 1e6,
        w as f64 / 1e6,
        w as f64 / p as f64,
        p as f64 / 16384.0,
        w as f64 / 16384.0
    );
    assert_eq!(m.counters().routed_faults, routed_before, "no fault routed");
    assert!(w < 5 * p, "registered first touch {w} ns vs {p} ns");
}

/// The ordering window: how often munmap returns before the callback has run (so flush is
/// needed), event-to-callback latency, and munmap latency with and without a watched range.
#[test]
fn munmap_latency_and_the_window_that_flush_closes() {
    let _s = serial();
    let (m, r) = monitor();
    const N: usize = 400;
    for pages in [1u64, 256] {
        let (mut plain, mut watched, mut to_callback, mut ret_to_callback) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut early = 0;
        for _ in 0..N {
            let a = anon(pages);
            let t = monotonic_ns();
            munmap(a, pages * PG);
            plain.push(monotonic_ns() - t);

            r.clear();
            let a = anon(pages);
            let id = m.subscribe(a, pages * PG).unwrap();
            let t0 = monotonic_ns();
            munmap(a, pages * PG);
            let t1 = monotonic_ns();
            let seen_at_return = !r.calls().is_empty();
            assert!(!m.still_valid(id), "flush closes the window");
            let call = r.calls()[0];
            assert_eq!(call.cause, Cause::Unmap);
            if !seen_at_return {
                early += 1;
            }
            watched.push(t1 - t0);
            to_callback.push(call.at_ns - t0);
            ret_to_callback.push(call.at_ns.saturating_sub(t1));
            m.unsubscribe(id);
        }
        println!(
            "munmap of {pages} page(s), {N} runs: unwatched median {:.1} us; watched median \
             {:.1} us p99 {:.1} us; munmap start to callback median {:.1} us p99 {:.1} us; \
             munmap returned before the callback ran in {early}/{N} runs (callback at most \
             {:.1} us after return)",
            median(&mut plain) as f64 / 1e3,
            median(&mut watched) as f64 / 1e3,
            pct(&mut watched, 0.99) as f64 / 1e3,
            median(&mut to_callback) as f64 / 1e3,
            pct(&mut to_callback, 0.99) as f64 / 1e3,
            pct(&mut ret_to_callback, 1.0) as f64 / 1e3,
        );
    }
    // Subscribe/unsubscribe cost (UFFDIO_REGISTER/UNREGISTER, mincore).
    let a = anon(16);
    let t = monotonic_ns();
    for _ in 0..N {
        let id = m.subscribe(a + 4 * PG, 4 * PG).unwrap();
        m.unsubscribe(id);
    }
    println!(
        "subscribe + unsubscribe of 4 pages: {:.1} us",
        (monotonic_ns() - t) as f64 / N as f64 / 1e3
    );
    munmap(a, 16 * PG);
}

#[test]
fn null_monitor_and_the_environment_setting() {
    let _s = serial();
    let n = NullMonitor::new("test");
    assert!(!n.is_reliable());
    assert!(matches!(
        n.subscribe(0x1000, 10),
        Err(Error::MonitorUnavailable { .. })
    ));
    assert!(!n.describe().is_empty());

    let sink: Arc<dyn InvalidationSink> = Arc::new(Recorder::default());
    let none = monitor_for(
        MonitorChoice::None,
        sink.clone(),
        Default::default(),
        |_| panic!("no warning for an explicit choice"),
    )
    .unwrap();
    assert!(!none.is_reliable());
    let auto = monitor_for(MonitorChoice::Auto, sink, Default::default(), |w| {
        panic!("userfaultfd works on this machine, yet: {w}")
    })
    .unwrap();
    assert!(auto.is_reliable());
    println!("PAGEWIRE_MEMMON unset: {}", auto.describe());
    assert_eq!(MonitorChoice::parse(None).unwrap(), MonitorChoice::Auto);
    assert_eq!(
        MonitorChoice::parse(Some("uffd")).unwrap(),
        MonitorChoice::Uffd
    );
    assert!(MonitorChoice::parse(Some("yes")).is_err());
}

/// The alternative this monitor avoids, measured: registering in `MODE_MISSING` routes
/// every first touch to a resolving thread (here with `UFFDIO_COPY` of a zero page, one
/// round trip per fault). Run with `-- --ignored --nocapture missing_mode`.
#[test]
#[ignore = "measurement for docs/memmon.md"]
fn missing_mode_first_touch_for_comparison() {
    let _s = serial();
    #[repr(C)]
    struct Api {
        api: u64,
        features: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct Register {
        start: u64,
        len: u64,
        mode: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct Copy {
        dst: u64,
        src: u64,
        len: u64,
        mode: u64,
        copy: i64,
    }
    const UFFDIO_API: u64 = 0xC018_AA3F;
    const UFFDIO_REGISTER: u64 = 0xC020_AA00;
    const UFFDIO_COPY: u64 = 0xC028_AA03;
    const LEN: u64 = 64 << 20;
    // SAFETY: creates a descriptor; UFFDIO_API reads and writes one struct we own.
    let fd = unsafe {
        let fd = libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC | libc::O_NONBLOCK | 1,
        ) as i32;
        assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
        let mut api = Api {
            api: 0xAA,
            features: 0,
            ioctls: 0,
        };
        assert_eq!(libc::ioctl(fd, UFFDIO_API as _, &mut api), 0);
        fd
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let resolver = std::thread::spawn(move || {
        let zero = vec![0u8; PG as usize];
        let mut faults = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd we own, 50 ms timeout.
            if unsafe { libc::poll(&mut p, 1, 50) } <= 0 {
                continue;
            }
            let mut msg = [0u64; 4];
            // SAFETY: reads one 32-byte message into a buffer we own.
            let n = unsafe { libc::read(fd, msg.as_mut_ptr() as *mut libc::c_void, 32) };
            if n != 32 {
                continue;
            }
            let event = msg[0] as u8;
            if event != 0x12 {
                continue;
            }
            let addr = msg[2] & !(PG - 1);
            let mut c = Copy {
                dst: addr,
                src: zero.as_ptr() as u64,
                len: PG,
                mode: 0,
                copy: 0,
            };
            // SAFETY: fills the faulting page of the registered test mapping from our zero
            // page and wakes the faulting thread.
            unsafe { libc::ioctl(fd, UFFDIO_COPY as _, &mut c) };
            faults += 1;
        }
        faults
    });
    let time = |missing: bool| {
        let a = mmap(LEN, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        if missing {
            let mut r = Register {
                start: a,
                len: LEN,
                mode: 1,
                ioctls: 0,
            };
            // SAFETY: registers the test's own fresh mapping for missing faults.
            assert_eq!(unsafe { libc::ioctl(fd, UFFDIO_REGISTER as _, &mut r) }, 0);
        }
        let t = monotonic_ns();
        touch(a, LEN);
        let ns = monotonic_ns() - t;
        munmap(a, LEN);
        ns
    };
    let (mut plain, mut missing) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        plain.push(time(false));
        missing.push(time(true));
    }
    let (p, m) = (median(&mut plain), median(&mut missing));
    println!(
        "first touch of 64 MiB: unregistered {:.1} ms, MODE_MISSING with a resolving thread \
         {:.1} ms (x{:.1})",
        p as f64 / 1e6,
        m as f64 / 1e6,
        m as f64 / p as f64
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let faults = resolver.join().unwrap();
    // SAFETY: closes the descriptor this test opened, after its last user stopped.
    unsafe { libc::close(fd) };
    assert_eq!(faults, 3 * LEN / PG);
}
