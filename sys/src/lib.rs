//! pagewire's bottom layer: the system calls the NIC providers and the local path stand on,
//! wrapped once (the one crate whose code is mostly `unsafe`; every block carries a
//! `// SAFETY:` note), the error of the layers below the message layer ([`Error`]), the
//! status a work request completes with ([`WcStatus`]), and the settings read from the
//! environment ([`env`](mod@env)).
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
#[deny(unsafe_code)]
mod error_class;

pub use completion::WcStatus;
pub use error::{Error, ErrorClass, Result};

mod cma;
mod file_mapping;
mod guarded_copy;
mod host_key;
mod longterm_pin;
mod memory;
mod shm;
mod socket_io;

pub use cma::{
    admit_cma_from_siblings, allow_cma_from_descendants_of, cma_copy, cma_ptracer, cma_read_word,
    yama_ptrace_scope, CmaDirection, Extent,
};
pub use file_mapping::{memory_file_system, FileMapping};
pub use guarded_copy::{
    guarded_cmp_swap, guarded_copy, guarded_fetch_add, install as install_fault_guard,
};
pub use host_key::{HostKey, HOST_KEY_BYTES};
pub use longterm_pin::{LongTermPin, LongTermPins, PinnedSnapshot, MAX_PIN_CHUNK, PIN_SLOTS};
pub use memory::{
    is_mapped, is_mapped_all, memlock_rlimit, mlock, munlock, page_span, pages_mapped, populate,
    restore_memlock_rlimit, set_memlock_rlimit, vm_locked_and_resident, AnonMapping, UnmappedHole,
    NEVER_MAPPED,
};
pub use shm::SharedSegment;
pub use socket_io::{ipv4_interfaces, poll, recv_extents, send_extents, PollFor, Wakeup, MAX_IOV};

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

pub(crate) fn count_syscall() {
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
