//! pagewire's bottom layer: the system calls the NIC providers and the local path stand on,
//! wrapped once (the one crate whose code is mostly `unsafe`; every block carries a
//! `// SAFETY:` note), the error type of the layers above ([`Error`]), the status a work
//! request completes with ([`WcStatus`]), and the settings read from the environment
//! ([`env`](mod@env)).
//!
//! The soft NIC never dereferences a user address with plain Rust: payload bytes move with
//! `process_vm_readv`/`process_vm_writev` (CMA) between processes and with
//! [`guarded_copy`] inside one, so an unmapped address becomes `EFAULT`, not a crash.
#![deny(missing_docs)]

#[deny(unsafe_code)]
mod completion;
#[deny(unsafe_code)]
pub mod env;
#[deny(unsafe_code)]
pub mod error;

pub use completion::WcStatus;
pub use error::{Error, ErrorClass, Result};

mod file_mapping;
mod guarded_copy;
mod host_key;
mod longterm_pin;
mod shm;
mod socket_io;

pub use file_mapping::{memory_file_system, FileMapping};
pub use guarded_copy::{
    guarded_cmp_swap, guarded_copy, guarded_fetch_add, install as install_fault_guard,
};
pub use host_key::{HostKey, HOST_KEY_BYTES};
pub use longterm_pin::{LongTermPin, LongTermPins, PinnedSnapshot, MAX_PIN_CHUNK, PIN_SLOTS};
pub use shm::SharedSegment;
pub use socket_io::{ipv4_interfaces, poll, recv_extents, send_extents, PollFor, Wakeup, MAX_IOV};

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Page size the NIC translates at and the kernel pins and maps in (x86-64 and aarch64 base
/// pages as Linux configures them). Defined at the lowest layer; `nic::PAGE_SIZE` re-exports
/// it.
pub const PAGE_SIZE: u64 = 4096;

/// System calls made through this module (process-wide).
static SYSCALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// Set on threads whose system calls are not the application's (the NIC's driver).
    static NOT_COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count_syscall() {
    if !NOT_COUNTED.with(std::cell::Cell::get) {
        SYSCALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Leaves this thread's system calls out of [`syscalls_made`]: the soft NIC's driver
/// thread, the interrupt-handler analogue, whose timed sleeps and wake-ups depend on how
/// long the application runs and how busy the machine is, not on what it sends.
pub fn exclude_this_thread_from_count() {
    NOT_COUNTED.with(|c| c.set(true));
}

/// How many system calls this process's application threads have made through this
/// module's wrappers: what the soft NIC counts as its own per message.
#[inline]
pub fn syscalls_made() -> u64 {
    SYSCALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A contiguous range of some process's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

fn iovecs(extents: &[Extent]) -> Vec<libc::iovec> {
    extents
        .iter()
        .filter(|e| e.len > 0)
        .map(|e| libc::iovec {
            iov_base: e.addr as *mut libc::c_void,
            iov_len: e.len as usize,
        })
        .collect()
}

/// Which way [`cma_copy`] moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmaDirection {
    /// From `pid`'s `remote` extents into this process's `local` extents.
    Read,
    /// From this process's `local` extents into `pid`'s `remote` extents.
    Write,
}

/// Copies between this process's `local` extents and process `pid`'s `remote` extents with
/// one kernel copy, looping over partial transfers and the kernel's IOV_MAX. Both lists must
/// describe the same number of bytes. Returns `EFAULT` if any address is unmapped (nothing is
/// written past the fault), `EPERM` if the kernel forbids access to `pid`, `ESRCH` if it is
/// gone.
///
/// The caller guarantees that the `local` extents, when written, belong to memory the user
/// handed to the NIC (a registered region named in a posted work request, whose `post_*`
/// contract forbids conflicting Rust accesses) or to a buffer the caller owns.
pub fn cma_copy(
    pid: u32,
    dir: CmaDirection,
    local: &[Extent],
    remote: &[Extent],
) -> io::Result<u64> {
    let total: u64 = local.iter().map(|e| e.len).sum();
    debug_assert_eq!(total, remote.iter().map(|e| e.len).sum::<u64>());
    let (mut l, mut r) = (iovecs(local), iovecs(remote));
    let (mut li, mut ri) = (0usize, 0usize);
    let mut done = 0u64;
    while done < total {
        let ln = (l.len() - li).min(1024);
        let rn = (r.len() - ri).min(1024);
        // SAFETY: the iovec arrays are valid for ln/rn entries. The kernel checks every
        // remote and local address against the target's and our page tables and fails with
        // EFAULT instead of touching unmapped memory; local extents are written only for
        // Read, under the caller's guarantee above.
        count_syscall();
        let n = unsafe {
            match dir {
                CmaDirection::Read => libc::process_vm_readv(
                    pid as libc::pid_t,
                    l.as_ptr().add(li),
                    ln as libc::c_ulong,
                    r.as_ptr().add(ri),
                    rn as libc::c_ulong,
                    0,
                ),
                CmaDirection::Write => libc::process_vm_writev(
                    pid as libc::pid_t,
                    l.as_ptr().add(li),
                    ln as libc::c_ulong,
                    r.as_ptr().add(ri),
                    rn as libc::c_ulong,
                    0,
                ),
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n as u64;
        advance(&mut l, &mut li, n as usize);
        advance(&mut r, &mut ri, n as usize);
    }
    Ok(total)
}

fn advance(v: &mut [libc::iovec], idx: &mut usize, mut n: usize) {
    while n > 0 && *idx < v.len() {
        let cur = &mut v[*idx];
        if n >= cur.iov_len {
            n -= cur.iov_len;
            *idx += 1;
        } else {
            cur.iov_base = (cur.iov_base as usize + n) as *mut libc::c_void;
            cur.iov_len -= n;
            n = 0;
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: comparable between processes of one host.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process's id.
#[inline]
pub fn getpid() -> u32 {
    std::process::id()
}

/// Rounds `[addr, addr+len)` out to whole pages: (first page address, length).
#[inline]
pub fn page_span(addr: u64, len: u64) -> (u64, u64) {
    let start = addr & !(PAGE_SIZE - 1);
    // Saturating: a range reaching the top of the address space ends on its last page.
    let end = addr
        .saturating_add(len)
        .div_ceil(PAGE_SIZE)
        .saturating_mul(PAGE_SIZE);
    (start, end - start)
}

/// `mlock` on the pages covering the range.
pub fn mlock(addr: u64, len: u64) -> io::Result<()> {
    let (a, l) = page_span(addr, len);
    count_syscall();
    // SAFETY: mlock only changes residency of the calling process's pages; it fails with
    // ENOMEM for unmapped ranges and never touches memory contents.
    if unsafe { libc::mlock(a as *const libc::c_void, l as usize) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether every page of the range is mapped in this process (`mincore` fails with ENOMEM
/// on any unmapped page).
pub fn is_mapped(addr: u64, len: u64) -> bool {
    let (a, l) = page_span(addr, len);
    let mut vec = vec![0u8; (l / PAGE_SIZE) as usize];
    count_syscall();
    // SAFETY: vec holds one byte per page of the range, as mincore requires.
    unsafe { libc::mincore(a as *mut libc::c_void, l as usize, vec.as_mut_ptr()) == 0 }
}

/// Whether every extent is entirely mapped in this process.
pub fn is_mapped_all(extents: &[Extent]) -> bool {
    extents
        .iter()
        .all(|e| e.len == 0 || is_mapped(e.addr, e.len))
}

/// `munlock` on the pages covering the range.
pub fn munlock(addr: u64, len: u64) -> io::Result<()> {
    let (a, l) = page_span(addr, len);
    count_syscall();
    // SAFETY: as for mlock.
    if unsafe { libc::munlock(a as *const libc::c_void, l as usize) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps the pages of the range into this process's page tables without changing their
/// contents (`MADV_POPULATE_WRITE`, or `_READ`): the work of resolving a network page
/// fault. Fails with `EFAULT`/`ENOMEM` when part of the range is not mapped.
pub fn populate(addr: u64, len: u64, write: bool) -> io::Result<()> {
    let (a, l) = page_span(addr, len);
    let advice = if write {
        libc::MADV_POPULATE_WRITE
    } else {
        libc::MADV_POPULATE_READ
    };
    count_syscall();
    // SAFETY: MADV_POPULATE_* faults pages in as a CPU access would, without modifying
    // their contents; an unmapped range yields an error.
    if unsafe { libc::madvise(a as *mut libc::c_void, l as usize, advice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Blocks while `*word == expected`, at most `timeout` (`FUTEX_WAIT`, shared: the word may
/// live in memory mapped by several processes).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    count_syscall();
    // SAFETY: the word is a valid, aligned u32 for the duration of the call; FUTEX_WAIT
    // only reads it. Spurious wake-ups and EAGAIN are fine for the callers, who re-check.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every waiter on `word` (`FUTEX_WAKE`, shared).
pub fn futex_wake(word: &AtomicU32) {
    count_syscall();
    // SAFETY: the word is valid and aligned; FUTEX_WAKE does not access memory contents.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// A handle on another process that tells whether it is still running (`pidfd_open`),
/// immune to pid reuse.
#[derive(Debug)]
pub struct ProcessHandle {
    fd: OwnedFd,
}

impl ProcessHandle {
    /// Opens a handle on `pid`.
    pub fn open(pid: u32) -> io::Result<ProcessHandle> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a freshly opened descriptor that nothing else owns.
        Ok(ProcessHandle {
            fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
        })
    }

    /// True while the process has not exited (a pidfd becomes readable at exit).
    pub fn is_alive(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        count_syscall();
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0
    }
}

/// The Yama LSM's `kernel.yama.ptrace_scope` (0 classic, 1 restricted to descendants and
/// named ptracers, 2 admin only, 3 none), or `None` where Yama is not in the kernel.
pub fn yama_ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The process whose descendants may read and write this rank's memory with CMA, when this
/// rank must name one: under Yama's `ptrace_scope` 1, a process may only trace its own
/// descendants or processes that named it (or one of its ancestors) their ptracer, so ranks
/// that are siblings cannot use `process_vm_readv` on each other unless each names their
/// common parent. That parent is `pwrun` (or the test or benchmark that launched the job),
/// or under `mpirun` the launcher's local proxy (MPICH's `hydra_pmi_proxy`, Open MPI's
/// `prted`): its descendants are this host's processes of the job, not other programs of
/// the same user (`PR_SET_PTRACER_ANY` would admit those too).
///
/// `None` when nothing needs naming or naming would not help: a single-rank job (no peer
/// reads its memory); no Yama, or scope 0 (siblings may already), 2 or 3 (only
/// `CAP_SYS_PTRACE`, or nobody, whatever is named); a rank whose parent is gone or is
/// `init` (pid 1, whose descendants are every process). Peers then find CMA forbidden at
/// start-up (the soft NIC then stages payloads through its rings, the local path leaves
/// the peer to the NIC).
pub fn cma_ptracer(ranks: usize, yama_scope: Option<u32>, parent: u32) -> Option<u32> {
    (ranks > 1 && yama_scope == Some(1) && parent > 1).then_some(parent)
}

/// Names this process's parent its CMA tracer where Yama needs that for the `ranks` ranks
/// of a job to read each other's memory ([`cma_ptracer`]); a refusal is left for the
/// callers' probes ([`cma_read_word`]) to find.
pub fn admit_cma_from_siblings(ranks: usize) {
    if let Some(tracer) = cma_ptracer(
        ranks,
        yama_ptrace_scope(),
        std::os::unix::process::parent_id(),
    ) {
        let _ = allow_cma_from_descendants_of(tracer);
    }
}

/// The 8-byte word at `addr` in process `pid`, read with CMA: `None` where the kernel does
/// not let this process read it (the start-up probes of who may use CMA with whom).
pub fn cma_read_word(pid: u32, addr: u64) -> Option<u64> {
    let mut word = [0u8; 8];
    let local = [Extent {
        addr: word.as_mut_ptr() as u64,
        len: 8,
    }];
    let remote = [Extent { addr, len: 8 }];
    cma_copy(pid, CmaDirection::Read, &local, &remote).ok()?;
    Some(u64::from_le_bytes(word))
}

/// Lets process `tracer` and its descendants read and write this process's memory with CMA
/// when Yama restricts ptrace to descendants (`prctl(PR_SET_PTRACER, tracer)`, replacing
/// any earlier exception). Sibling processes, such as the ranks of one job, need it to use
/// `process_vm_readv`/`writev` between each other; naming their common parent admits them
/// and nothing outside that process tree.
pub fn allow_cma_from_descendants_of(tracer: u32) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PTRACER, pid) only changes this process's Yama exception; the
    // variadic arguments are plain integers and no memory of ours is touched.
    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, tracer as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets this process's soft `RLIMIT_MEMLOCK` (`None`: unlimited), which the processes it
/// starts inherit: the benchmarks' "HPC" (lifted) and "tight" worlds of Lesokhin17 §6.2.
/// Returns the previous `(soft, hard)` pair for [`restore_memlock_rlimit`]. Past the hard
/// limit the hard limit is raised too, which needs `CAP_SYS_RESOURCE` (root).
pub fn set_memlock_rlimit(bytes: Option<u64>) -> io::Result<(u64, u64)> {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    count_syscall();
    // SAFETY: getrlimit writes one rlimit struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let v = bytes.unwrap_or(libc::RLIM_INFINITY);
    restore_memlock_rlimit((v, old.rlim_max.max(v)))?;
    Ok((old.rlim_cur, old.rlim_max))
}

/// Sets the `(soft, hard)` `RLIMIT_MEMLOCK` pair [`set_memlock_rlimit`] returned.
pub fn restore_memlock_rlimit((soft, hard): (u64, u64)) -> io::Result<()> {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    count_syscall();
    // SAFETY: setrlimit reads one rlimit we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`None` when unlimited).
pub fn memlock_rlimit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Reads which pages of `[addr, addr+len)` of process `pid` are present in its page tables
/// (`/proc/PID/pagemap`, bit 63 "present" or bit 62 "swapped": a mapping exists). `pagemap`
/// must be that process's opened pagemap file. Appends one bool per page to `out`.
pub fn pages_mapped(pagemap: &File, addr: u64, len: u64, out: &mut Vec<bool>) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let (start, span) = page_span(addr, len);
    let pages = (span / PAGE_SIZE) as usize;
    let mut buf = vec![0u8; pages * 8];
    let mut off = 0;
    while off < buf.len() {
        count_syscall();
        let n = pagemap.read_at(&mut buf[off..], (start / PAGE_SIZE) * 8 + off as u64)?;
        if n == 0 {
            break;
        }
        off += n;
    }
    out.extend(buf.chunks_exact(8).map(|c| {
        let e = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        e & (3 << 62) != 0
    }));
    Ok(())
}

/// An anonymous private mapping owned by the caller, unmapped on drop: the kind of buffer
/// benchmarks and tests hand to the NIC (`--cold` maps a fresh one each iteration).
#[derive(Debug)]
pub struct AnonMapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through &self/&mut self.
unsafe impl Send for AnonMapping {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AnonMapping {}

impl AnonMapping {
    /// Maps `len` bytes (rounded up to pages) of fresh zeroed memory, not yet populated.
    pub fn new(len: usize) -> io::Result<AnonMapping> {
        let len = (len.max(1) as u64).div_ceil(PAGE_SIZE) as usize * PAGE_SIZE as usize;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AnonMapping {
            ptr: p as *mut u8,
            len,
        })
    }

    /// Start address.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length in bytes (whole pages).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings have at least one page.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The memory as bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is our mapping, readable, alive while self is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The memory as mutable bytes.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The byte at `offset` as an atomic, for watching memory that the NIC writes (a
    /// latency test polls the last byte of its landing buffer, as perftest does).
    #[inline]
    pub fn atomic_u8(&self, offset: usize) -> &std::sync::atomic::AtomicU8 {
        assert!(offset < self.len, "offset outside the mapping");
        // SAFETY: in bounds; AtomicU8 has u8's layout; the reference borrows self, so no
        // &mut slice can exist at the same time, and writes from other processes (CMA) are
        // observed through atomic loads.
        unsafe { &*(self.ptr.add(offset) as *const std::sync::atomic::AtomicU8) }
    }

    /// The 8 bytes at `offset` (a multiple of 8) as an atomic word, for control words that
    /// this process updates while peers' NICs read or update them (a window's lock and its
    /// table of attached regions).
    #[inline]
    pub fn atomic_u64(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= self.len,
            "word offset outside the mapping or unaligned"
        );
        // SAFETY: in bounds and 8-byte aligned (the mapping is page-aligned); AtomicU64 has
        // u64's layout; the reference borrows self, so no &mut slice exists meanwhile, and
        // other processes' writes (CMA, the soft NIC's locked instructions) are observed
        // through atomic loads.
        unsafe { &*(self.ptr.add(offset) as *const std::sync::atomic::AtomicU64) }
    }

    /// Drops the pages of `[offset, offset+len)` (`MADV_DONTNEED`): the next access sees
    /// zero-filled fresh pages, and the NIC must fault them in again. Pages locked by a
    /// pinned registration refuse `MADV_DONTNEED` (EINVAL); they are discarded with
    /// `MADV_DONTNEED_LOCKED` (Linux 5.18) instead, as an application would have to.
    pub fn discard(&mut self, offset: usize, len: usize) -> io::Result<()> {
        const MADV_DONTNEED_LOCKED: libc::c_int = 24;
        assert!(
            offset + len <= self.len,
            "discard range outside the mapping"
        );
        let (a, l) = page_span(self.addr() + offset as u64, len as u64);
        for advice in [libc::MADV_DONTNEED, MADV_DONTNEED_LOCKED] {
            // SAFETY: the range lies inside our own mapping; discarding private anonymous
            // memory only replaces pages with zero-fill-on-demand.
            if unsafe { libc::madvise(a as *mut libc::c_void, l as usize, advice) } == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
        Err(io::Error::last_os_error())
    }

    /// Unmaps `[offset, offset+len)` (page-aligned) of the mapping, leaving a hole; the
    /// range must no longer be accessed through this value (accessors skip nothing, so the
    /// caller must only use it for addresses the NIC then fails on). Another thread's
    /// `mmap` may take the hole's addresses afterwards: a test that needs them to stay
    /// unmapped must not run beside threads that map memory, or must use an address
    /// nothing maps ([`NEVER_MAPPED`]).
    pub fn unmap_range(mut self, offset: usize, len: usize) -> io::Result<UnmappedHole> {
        assert!(offset % PAGE_SIZE as usize == 0 && len % PAGE_SIZE as usize == 0);
        assert!(offset + len <= self.len);
        // SAFETY: the range is inside our mapping; after this call we never hand out
        // slices again (the value is consumed), only the addresses.
        if unsafe { libc::munmap(self.ptr.add(offset) as *mut libc::c_void, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let hole = UnmappedHole {
            base: self.ptr,
            len: self.len,
            hole: (offset, len),
        };
        self.len = 0;
        Ok(hole)
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmapping our own mapping once, at drop.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }
}

/// An address no mapping of this process covers: 16 KiB, where `mmap` places nothing
/// unless asked to with `MAP_FIXED` (it allocates from the top of the address space, and
/// the kernel's `mmap_min_addr` is often 64 KiB). For tests that need memory that is not
/// mapped whatever other threads do.
pub const NEVER_MAPPED: u64 = 4 * PAGE_SIZE;

/// What is left of an [`AnonMapping`] after [`AnonMapping::unmap_range`]: addresses only,
/// for tests that DMA into a hole; the rest is unmapped on drop.
#[derive(Debug)]
pub struct UnmappedHole {
    base: *mut u8,
    len: usize,
    hole: (usize, usize),
}

impl UnmappedHole {
    /// Start address of the original mapping.
    pub fn addr(&self) -> u64 {
        self.base as u64
    }
    /// Address of the hole.
    pub fn hole_addr(&self) -> u64 {
        self.base as u64 + self.hole.0 as u64
    }
}

impl Drop for UnmappedHole {
    fn drop(&mut self) {
        // Only what is left of the original mapping: the hole may since have been handed out
        // to another mapping of this process (another thread's), which is not ours to unmap.
        let (off, len) = self.hole;
        // SAFETY: both ranges are the parts of our own mapping around the hole, still ours;
        // a zero-length part is skipped.
        unsafe {
            if off > 0 {
                libc::munmap(self.base as *mut libc::c_void, off);
            }
            if off + len < self.len {
                libc::munmap(
                    self.base.add(off + len) as *mut libc::c_void,
                    self.len - off - len,
                );
            }
        }
    }
}

/// This process's `VmLck` and `VmRSS` from /proc/self/status, in bytes.
pub fn vm_locked_and_resident() -> io::Result<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    Ok((field("VmLck:"), field("VmRSS:")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cma_ptracer_is_the_parent_only_where_yama_needs_one() {
        // Siblings under Yama scope 1 name their parent (pwrun, mpirun's proxy).
        assert_eq!(cma_ptracer(4, Some(1), 4242), Some(4242));
        // A single rank has no peer to admit.
        assert_eq!(cma_ptracer(1, Some(1), 4242), None);
        // No Yama, classic scope, admin-only or no ptrace at all: naming changes nothing.
        for scope in [None, Some(0), Some(2), Some(3)] {
            assert_eq!(cma_ptracer(4, scope, 4242), None, "{scope:?}");
        }
        // An orphan would admit every process by naming init.
        assert_eq!(cma_ptracer(4, Some(1), 1), None);
        assert_eq!(cma_ptracer(4, Some(1), 0), None);
    }
}
