//! The userfaultfd system calls the memory monitor stands on, wrapped once (one of the few
//! modules with `unsafe`; every block carries a `// SAFETY:` note).
//!
//! Written against `<linux/userfaultfd.h>` rather than with the `userfaultfd` crate: that
//! crate's `userfaultfd-sys` runs bindgen (libclang) and a C compiler at build time for every
//! build, and hides the feature negotiation this monitor depends on (retrying without
//! `UFFD_FEATURE_EVENT_FORK`, which needs `CAP_SYS_PTRACE`). What is needed here is five
//! ioctls, `read`, `poll` and an eventfd.
//!
//! The ioctl numbers use the generic `_IOC` encoding (x86_64, aarch64, riscv64, loongarch64,
//! s390x); on other architectures [`open`] reports the monitor unavailable.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `UFFD_API`.
const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY` (flag of `userfaultfd(2)`, Linux 5.11).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`: write-protect mode on anonymous memory (5.7).
pub const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// `UFFD_FEATURE_EVENT_FORK` (needs `CAP_SYS_PTRACE` since 5.11).
pub const FEATURE_EVENT_FORK: u64 = 1 << 1;
/// `UFFD_FEATURE_EVENT_REMAP`.
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
/// `UFFD_FEATURE_EVENT_REMOVE`.
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
/// `UFFD_FEATURE_EVENT_UNMAP`.
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`: write-protect mode on shmem and hugetlbfs (5.19).
pub const FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;

/// `UFFDIO_REGISTER_MODE_WP`.
pub const REGISTER_MODE_WP: u64 = 1 << 1;
/// Bit of `_UFFDIO_ZEROPAGE` in the `ioctls` a registration reports: absent when the range
/// contains hugetlbfs memory.
pub const IOCTL_ZEROPAGE_BIT: u64 = 1 << 0x04;

/// `UFFD_EVENT_PAGEFAULT`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_EVENT_FORK`.
pub const EVENT_FORK: u8 = 0x13;
/// `UFFD_EVENT_REMAP`.
pub const EVENT_REMAP: u8 = 0x14;
/// `UFFD_EVENT_REMOVE`.
pub const EVENT_REMOVE: u8 = 0x15;
/// `UFFD_EVENT_UNMAP`.
pub const EVENT_UNMAP: u8 = 0x16;
/// `UFFD_PAGEFAULT_FLAG_WP`.
pub const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0xAA << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3F, 24);
const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, 16);
const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, 16);
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, 0x06, 24);
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd` (6.1).
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

const GENERIC_IOCTL_ENCODING: bool = cfg!(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x"
));

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// One `struct uffd_msg` (32 bytes; the kernel's is packed, this layout is identical).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Msg {
    /// `UFFD_EVENT_*`.
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// The event's arguments: pagefault `{flags, address, ptid}`, fork `{ufd}`, remap
    /// `{from, to, len}`, remove/unmap `{start, end}`.
    pub arg: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<Msg>() == 32);

impl Msg {
    /// The child's userfaultfd of a `UFFD_EVENT_FORK` (the first four bytes of `arg`).
    pub fn fork_fd(&self) -> RawFd {
        let b = self.arg[0].to_ne_bytes();
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as RawFd
    }
}

/// A userfaultfd after `UFFDIO_API`, with the features the kernel enabled.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    /// The enabled features.
    pub features: u64,
}

/// Why a userfaultfd could not be had; `reason` is one line for the user.
#[derive(Debug)]
pub struct OpenError {
    /// One line: what failed and what to do.
    pub reason: String,
}

fn new_fd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes flags and returns a new descriptor or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn new_fd_from_dev(flags: libc::c_int) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")?;
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a new descriptor.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates a descriptor: `userfaultfd(2)` with `UFFD_USER_MODE_ONLY` (without it on kernels
/// older than 5.11), else `/dev/userfaultfd`.
fn create() -> Result<OwnedFd, OpenError> {
    let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let first = match new_fd(base | UFFD_USER_MODE_ONLY) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => match new_fd(base) {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        },
        Err(e) => e,
    };
    match new_fd_from_dev(base | UFFD_USER_MODE_ONLY) {
        Ok(fd) => Ok(fd),
        Err(dev) => {
            let hint = match first.raw_os_error() {
                Some(libc::ENOSYS) => "the kernel has no userfaultfd (CONFIG_USERFAULTFD)",
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    "not permitted here (a seccomp filter, as in a default Docker profile, or \
                     vm.unprivileged_userfaultfd=0 on a kernel older than 5.11)"
                }
                _ => "unexpected error",
            };
            Err(OpenError {
                reason: format!("userfaultfd(2) failed: {first} ({hint}); /dev/userfaultfd: {dev}"),
            })
        }
    }
}

/// The features the running kernel offers (`UFFDIO_API` with none requested, on a
/// throw-away descriptor: a descriptor's features can be set only once).
fn available_features() -> Result<u64, OpenError> {
    let fd = create()?;
    let mut api = UffdioApi {
        api: UFFD_API,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one uffdio_api we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
        return Err(OpenError {
            reason: format!("UFFDIO_API failed: {}", io::Error::last_os_error()),
        });
    }
    Ok(api.features)
}

/// Opens a userfaultfd with the `required` features and as many of `optional` as the kernel
/// grants (each optional feature is dropped, one at a time, if asking for it fails with
/// `EPERM` or `EINVAL`).
pub fn open(required: u64, optional: &[u64]) -> Result<Uffd, OpenError> {
    if !GENERIC_IOCTL_ENCODING {
        return Err(OpenError {
            reason: "the memory monitor's ioctl numbers are not defined for this architecture"
                .into(),
        });
    }
    let available = available_features()?;
    if available & required != required {
        return Err(OpenError {
            reason: format!(
                "the kernel lacks userfaultfd features {:#x} (write-protect mode needs Linux \
                 5.7 and an architecture with uffd-wp; events need 4.11)",
                required & !available
            ),
        });
    }
    let mut wanted: Vec<u64> = optional
        .iter()
        .copied()
        .filter(|f| available & f == *f)
        .collect();
    loop {
        let fd = create()?;
        let features = required | wanted.iter().fold(0, |a, f| a | f);
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes one uffdio_api we own.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } == 0 {
            return Ok(Uffd { fd, features });
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EINVAL) if !wanted.is_empty() => {
                // EPERM: EVENT_FORK without CAP_SYS_PTRACE. Drop the first optional feature
                // and try again on a fresh descriptor.
                wanted.remove(0);
            }
            _ => {
                return Err(OpenError {
                    reason: format!("UFFDIO_API with features {features:#x} failed: {err}"),
                })
            }
        }
    }
}

impl Uffd {
    /// The descriptor, for `poll`.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// `UFFDIO_REGISTER` of `[start, start+len)` (page-aligned) in write-protect mode.
    /// Returns the ioctls the kernel offers for the range.
    pub fn register_wp(&self, start: u64, len: u64) -> io::Result<u64> {
        let mut r = UffdioRegister {
            range: UffdioRange { start, len },
            mode: REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one uffdio_register we own; it changes
        // only the kernel's bookkeeping of the range (no page contents, no protections).
        if unsafe { libc::ioctl(self.raw(), UFFDIO_REGISTER as _, &mut r) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r.ioctls)
    }

    /// `UFFDIO_UNREGISTER` of `[start, start+len)`.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<()> {
        let mut r = UffdioRange { start, len };
        // SAFETY: UFFDIO_UNREGISTER reads one uffdio_range we own.
        if unsafe { libc::ioctl(self.raw(), UFFDIO_UNREGISTER as _, &mut r) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Lets a thread stopped on a write-protect fault at `addr` go on: clears the
    /// protection of its page (which the monitor never sets) and wakes it. Only a defence:
    /// with nothing write-protected, no fault is ever routed here.
    pub fn release_fault(&self, addr: u64, page: u64) {
        let start = addr & !(page - 1);
        let mut wp = UffdioWriteprotect {
            range: UffdioRange { start, len: page },
            mode: 0,
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads one struct we own; mode 0 removes protection.
        unsafe { libc::ioctl(self.raw(), UFFDIO_WRITEPROTECT as _, &mut wp) };
        let mut r = UffdioRange { start, len: page };
        // SAFETY: UFFDIO_WAKE reads one uffdio_range we own.
        unsafe { libc::ioctl(self.raw(), UFFDIO_WAKE as _, &mut r) };
    }

    /// Reads whatever messages are queued into `buf` without blocking; returns how many.
    /// Reading a non-cooperative event is what lets the thread that caused it go on.
    pub fn read_msgs(&self, buf: &mut [Msg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: buf is writable for `bytes` bytes and Msg is plain old data; the kernel
        // writes whole messages.
        let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr() as *mut libc::c_void, bytes) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize / std::mem::size_of::<Msg>())
    }
}

/// Closes a descriptor the kernel handed over in a message (the child's userfaultfd of a
/// fork event). Closing it releases the child's registrations.
pub fn close_handed_fd(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: the kernel installed this descriptor for us while delivering the message;
        // nothing else knows it, so closing it cannot close someone else's file.
        unsafe { libc::close(fd) };
    }
}

/// An eventfd used to wake the reader thread (stop, fork requests).
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A non-blocking, close-on-exec eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes an initial value and flags and returns a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EventFd {
            // SAFETY: a fresh descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor, for `poll`.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Adds one to the counter (wakes a poller).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a u64 we own, as eventfd requires.
        unsafe { libc::write(self.raw(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Resets the counter.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a u64 we own; EAGAIN when zero is fine.
        unsafe { libc::read(self.raw(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

/// What [`poll2`] found readable.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ready {
    /// The first descriptor has input (or an error condition).
    pub first: bool,
    /// The second descriptor has input.
    pub second: bool,
}

/// Waits until `a` or `b` is readable; `EINTR` returns nothing ready.
pub fn poll2(a: RawFd, b: RawFd) -> io::Result<Ready> {
    let mut p = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfd entries we own; no timeout.
    let n = unsafe { libc::poll(p.as_mut_ptr(), 2, -1) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(Ready::default());
        }
        return Err(e);
    }
    Ok(Ready {
        first: p[0].revents != 0,
        second: p[1].revents != 0,
    })
}

/// Installs `parent` as a `pthread_atfork` handler run in the parent after `fork()` (before
/// `fork()` returns to its caller). Call once per process.
pub fn install_atfork_parent(parent: extern "C" fn()) -> io::Result<()> {
    // SAFETY: registers a handler with no prepare/child hooks; the handler is a plain
    // function with static lifetime.
    let rc = unsafe { libc::pthread_atfork(None, Some(parent), None) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}
