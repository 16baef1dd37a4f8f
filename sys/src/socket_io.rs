//! The system calls of the soft NIC's TCP wire: gathered sends and scattered
//! receives between a socket and extents of this process, never blocking and never raising
//! `SIGPIPE`; `poll` over several descriptors; an eventfd to wake a poller; the IPv4
//! address of a network interface.
//!
//! The kernel reads and writes the extents itself, so an unmapped address is `EFAULT`, not
//! a crash, as for [`super::cma_copy`].

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::cma::iovecs;
use crate::{count_syscall, Extent};

/// At most this many extents go to one `sendmsg`/`recvmsg` (the kernel's `UIO_MAXIOV`).
pub const MAX_IOV: usize = 1024;

/// Sends the bytes of `extents` (of this process) on the stream socket `fd`, as many as the
/// socket takes now: the count sent, 0 included; `WouldBlock` when it takes none. A peer
/// that has closed is `BrokenPipe` (no signal).
pub fn send_extents(fd: RawFd, extents: &[Extent]) -> io::Result<usize> {
    let mut iov = iovecs(extents);
    iov.truncate(MAX_IOV);
    if iov.is_empty() {
        return Ok(0);
    }
    // SAFETY: an all-zero msghdr is valid; it names no address and no control data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    count_syscall();
    // SAFETY: `msg` points at `iov`, valid for its length during the call; the kernel only
    // reads the extents (EFAULT where unmapped).
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives into `extents` (of this process) from the stream socket `fd` what has arrived:
/// the count received; `Ok(0)` means the peer closed the connection; `WouldBlock` when
/// nothing has arrived.
///
/// The caller guarantees, as for [`super::cma_copy`]'s local extents, that the extents are
/// memory it may write: a buffer it owns, or memory the user handed to the NIC.
pub fn recv_extents(fd: RawFd, extents: &[Extent]) -> io::Result<usize> {
    let mut iov = iovecs(extents);
    iov.truncate(MAX_IOV);
    if iov.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "nothing to receive into",
        ));
    }
    // SAFETY: an all-zero msghdr is valid; it names no address and no control data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    count_syscall();
    // SAFETY: `msg` points at `iov`, valid during the call; the kernel writes only into the
    // extents, which the caller may write (above), and fails with EFAULT where unmapped.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// What [`poll`] waits for on one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollFor {
    /// The descriptor.
    pub fd: RawFd,
    /// Wake when it is readable (or closed, or in error).
    pub read: bool,
    /// Wake when it is writable.
    pub write: bool,
}

/// Waits until one of `fds` is ready or `timeout` passes; how many are ready. An
/// interrupted wait counts as a timeout.
pub fn poll(fds: &[PollFor], timeout: Duration) -> io::Result<usize> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.fd,
            events: if f.read { libc::POLLIN } else { 0 } | if f.write { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as libc::c_int;
    count_syscall();
    // SAFETY: `p` is a valid array of `p.len()` pollfds for the duration of the call.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(n as usize)
}

/// An eventfd: a descriptor another thread makes readable to end a [`poll`].
#[derive(Debug)]
pub struct Wakeup {
    fd: OwnedFd,
}

impl Wakeup {
    /// A new, unsignalled one (non-blocking, close-on-exec).
    pub fn new() -> io::Result<Wakeup> {
        // SAFETY: eventfd takes an initial count and flags and returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a freshly created descriptor nothing else owns.
        Ok(Wakeup {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Makes it readable.
    pub fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        count_syscall();
        // SAFETY: writes 8 bytes from a local array to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Makes it unreadable again (after a poll saw it).
    pub fn clear(&self) {
        let mut v = [0u8; 8];
        count_syscall();
        // SAFETY: reads 8 bytes into a local array from our non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
    }

    /// The descriptor, for [`poll`].
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The interfaces that are up and have an IPv4 address: `(name, address, loopback)`, in the
/// kernel's order (`getifaddrs`).
pub fn ipv4_interfaces() -> io::Result<Vec<(String, Ipv4Addr, bool)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocates into `head`.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        let up = ifa.ifa_flags & libc::IFF_UP as libc::c_uint != 0;
        let loopback = ifa.ifa_flags & libc::IFF_LOOPBACK as libc::c_uint != 0;
        // SAFETY: a non-null ifa_addr points at a sockaddr whose family says its type.
        if up
            && !ifa.ifa_addr.is_null()
            && unsafe { (*ifa.ifa_addr).sa_family } as i32 == libc::AF_INET
        {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            // SAFETY: ifa_name is a NUL-terminated string valid until freeifaddrs.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned();
            let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            out.push((name, addr, loopback));
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated, once; nothing refers into it any more.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    /// The extent of `b`, for the kernel to read.
    fn ext(b: &[u8]) -> Extent {
        Extent {
            addr: b.as_ptr() as u64,
            len: b.len() as u64,
        }
    }

    /// The extent of `b`, for the kernel to write.
    fn ext_mut(b: &mut [u8]) -> Extent {
        Extent {
            addr: b.as_mut_ptr() as u64,
            len: b.len() as u64,
        }
    }

    #[test]
    fn gathered_sends_and_scattered_receives_move_every_byte() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let x = *b"hello ";
        let y = *b"world";
        let sent = send_extents(a.as_raw_fd(), &[ext(&x), ext(&y)]).unwrap();
        assert_eq!(sent, 11);
        let mut got = [0u8; 11];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello world");
        b.write_all(b"abcdef").unwrap();
        let mut p = [0u8; 2];
        let mut q = [0u8; 8];
        let n = recv_extents(a.as_raw_fd(), &[ext_mut(&mut p), ext_mut(&mut q)]).unwrap();
        assert_eq!((n, &p, &q[..4]), (6, b"ab", &b"cdef"[..]));
        // Nothing more: would block, not wait.
        let e = recv_extents(a.as_raw_fd(), &[ext_mut(&mut q)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(b);
        assert_eq!(
            recv_extents(a.as_raw_fd(), &[ext_mut(&mut q)]).unwrap(),
            0,
            "closed"
        );
        // A closed peer is an error, not SIGPIPE.
        let e = send_extents(a.as_raw_fd(), &[ext(&x)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn an_unmapped_source_is_efault_not_a_crash() {
        let (a, _b) = UnixStream::pair().unwrap();
        let e = send_extents(a.as_raw_fd(), &[Extent { addr: 8, len: 8 }]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    }

    #[test]
    fn a_wakeup_ends_a_poll_and_clears() {
        let w = Wakeup::new().unwrap();
        let f = [PollFor {
            fd: w.fd(),
            read: true,
            write: false,
        }];
        assert_eq!(poll(&f, Duration::ZERO).unwrap(), 0);
        w.signal();
        assert_eq!(poll(&f, Duration::from_secs(5)).unwrap(), 1);
        w.clear();
        assert_eq!(poll(&f, Duration::ZERO).unwrap(), 0);
    }

    #[test]
    fn the_loopback_interface_is_listed() {
        let all = ipv4_interfaces().unwrap();
        assert!(
            all.iter().any(|(_, a, lo)| *lo && a.is_loopback()),
            "{all:?}"
        );
    }
}
