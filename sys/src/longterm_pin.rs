//! Long-term pins, as `ibv_reg_mr` takes them (Lesokhin17 §2.2, §6.2).
//!
//! The RDMA driver pins a region with `pin_user_pages(FOLL_LONGTERM)` (`ib_umem_get`): the
//! pages are held by the pin, VMAs are left alone, and the region stays bound to the pages
//! it pinned even if the application later unmaps or replaces them. Registering a buffer
//! with an io_uring instance (`IORING_REGISTER_BUFFERS_UPDATE`) takes the same kernel pin,
//! and `IORING_OP_READ_FIXED`/`WRITE_FIXED` then move bytes to and from *those* pages,
//! whatever the range maps now — the hardware's behaviour, with a kernel copy.
//!
//! [`LongTermPins`] is one ring per NIC with a sparse table of fixed buffers; a region is one
//! table slot per GiB (the kernel's per-buffer limit). It is not available where io_uring is
//! disabled (`kernel.io_uring_disabled`, seccomp filters in containers); the caller falls
//! back to `mlock`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use io_uring::{opcode, types, IoUring};

use super::{count_syscall, page_span};

/// Largest buffer the kernel registers in one table slot (`io_buffer_validate`: 1 GiB).
pub const MAX_PIN_CHUNK: u64 = 1 << 30;

/// Slots in the fixed-buffer table (the kernel's `IORING_MAX_REG_BUFFERS`).
pub const PIN_SLOTS: u32 = 1 << 14;

/// The pin of one region: the table slots holding its pages, in address order.
#[derive(Debug, PartialEq, Eq)]
pub struct LongTermPin {
    start: u64,
    span: u64,
    slots: Vec<u16>,
}

impl LongTermPin {
    /// First pinned byte (page-aligned).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Pinned bytes (whole pages).
    pub fn span(&self) -> u64 {
        self.span
    }
}

/// One io_uring instance whose fixed-buffer table holds this process's long-term pins.
pub struct LongTermPins {
    ring: IoUring,
    free: Vec<u16>,
}

impl std::fmt::Debug for LongTermPins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LongTermPins")
            .field("free_slots", &self.free.len())
            .finish()
    }
}

impl LongTermPins {
    /// Sets up the ring and an empty table; fails where io_uring or fixed buffers are not
    /// permitted.
    pub fn new() -> io::Result<LongTermPins> {
        count_syscall();
        let ring = IoUring::new(8)?;
        count_syscall();
        ring.submitter().register_buffers_sparse(PIN_SLOTS)?;
        Ok(LongTermPins {
            ring,
            free: (0..PIN_SLOTS as u16).rev().collect(),
        })
    }

    /// Pins the pages of `[addr, addr+len)` long-term. Errors are the kernel's: `EFAULT`
    /// for an unmapped or read-only range or memory the kernel will not pin long-term (file
    /// mappings outside shmem/hugetlbfs), `ENOMEM` past RLIMIT_MEMLOCK for an unprivileged
    /// user, `ENOSPC` when the table is full.
    pub fn pin(&mut self, addr: u64, len: u64) -> io::Result<LongTermPin> {
        let (start, span) = page_span(addr, len);
        let chunks = span.div_ceil(MAX_PIN_CHUNK) as usize;
        if self.free.len() < chunks {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mut pin = LongTermPin {
            start,
            span,
            slots: Vec::with_capacity(chunks),
        };
        for i in 0..chunks as u64 {
            let at = start + i * MAX_PIN_CHUNK;
            let n = (span - i * MAX_PIN_CHUNK).min(MAX_PIN_CHUNK);
            let slot = self.free.pop().expect("counted above");
            let iov = libc::iovec {
                iov_base: at as *mut libc::c_void,
                iov_len: n as usize,
            };
            count_syscall();
            // SAFETY: the kernel pins the pages of this range of our own address space (or
            // fails); it reads and writes them only through fixed-buffer operations this
            // module submits, never behind the application's back.
            if let Err(e) = unsafe {
                self.ring
                    .submitter()
                    .register_buffers_update(slot as u32, &[iov], None)
            } {
                self.free.push(slot);
                self.unpin(pin);
                return Err(e);
            }
            pin.slots.push(slot);
        }
        Ok(pin)
    }

    /// Releases a pin: the kernel unpins the pages (immediately when no fixed-buffer
    /// operation on them is in flight, and none is: this module waits for each).
    pub fn unpin(&mut self, pin: LongTermPin) {
        let clear = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        for slot in pin.slots {
            count_syscall();
            // SAFETY: an empty iovec clears the slot; no memory is named.
            let r = unsafe {
                self.ring
                    .submitter()
                    .register_buffers_update(slot as u32, &[clear], None)
            };
            if r.is_ok() {
                self.free.push(slot);
            }
        }
    }

    /// Copies the bytes of the pinned pages (not what the range maps now) into a new
    /// shared mapping of a memory file: a snapshot of what the NIC holds, for a region whose
    /// range the application replaced (`IORING_OP_WRITE_FIXED` from the pinned pages into
    /// the file, then `mmap`).
    pub fn snapshot(&mut self, pin: &LongTermPin) -> io::Result<PinnedSnapshot> {
        count_syscall();
        // SAFETY: a new anonymous memory file; the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"pagewire-bound-pages".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a descriptor we now own.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        count_syscall();
        // SAFETY: sizing our own memory file.
        if unsafe { libc::ftruncate(file.as_raw_fd(), pin.span as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        for (i, &slot) in pin.slots.iter().enumerate() {
            let chunk_start = pin.start + i as u64 * MAX_PIN_CHUNK;
            let chunk_len = (pin.span - i as u64 * MAX_PIN_CHUNK).min(MAX_PIN_CHUNK);
            let mut done = 0;
            while done < chunk_len {
                let n = (chunk_len - done).min(u32::MAX as u64 & !(4095)) as u32;
                let sqe = opcode::WriteFixed::new(
                    types::Fd(file.as_raw_fd()),
                    (chunk_start + done) as *const u8,
                    n,
                    slot,
                )
                .offset(i as u64 * MAX_PIN_CHUNK + done)
                .build();
                done += self.run(sqe)? as u64;
            }
        }
        count_syscall();
        // SAFETY: a shared mapping of our memory file at an address of the kernel's choosing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pin.span as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(PinnedSnapshot {
            addr: p as u64,
            len: pin.span as usize,
        })
    }

    /// Copies `len` bytes from offset `file_off` of `fd` into the pinned pages at `addr`
    /// (inside `pin`), whatever the range maps now (`IORING_OP_READ_FIXED`).
    pub fn write_pages(
        &mut self,
        pin: &LongTermPin,
        addr: u64,
        len: u64,
        fd: &OwnedFd,
        file_off: u64,
    ) -> io::Result<()> {
        let mut done = 0;
        while done < len {
            let at = addr + done;
            let (slot, room) = self.slot_of(pin, at)?;
            let n = (len - done).min(room).min(1 << 30) as u32;
            let sqe = opcode::ReadFixed::new(types::Fd(fd.as_raw_fd()), at as *mut u8, n, slot)
                .offset(file_off + done)
                .build();
            let got = self.run(sqe)?;
            if got == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            done += got as u64;
        }
        Ok(())
    }

    /// The slot holding `addr` and the bytes from `addr` to that slot's end.
    fn slot_of(&self, pin: &LongTermPin, addr: u64) -> io::Result<(u16, u64)> {
        if addr < pin.start || addr >= pin.start + pin.span {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        let i = (addr - pin.start) / MAX_PIN_CHUNK;
        let chunk_end = (pin.start + (i + 1) * MAX_PIN_CHUNK).min(pin.start + pin.span);
        Ok((pin.slots[i as usize], chunk_end - addr))
    }

    /// Submits one operation and waits for it; returns its result (bytes moved).
    fn run(&mut self, sqe: io_uring::squeue::Entry) -> io::Result<u32> {
        // SAFETY: the operation names a fixed buffer registered in this ring and a
        // descriptor the caller keeps open; we wait for its completion before returning, so
        // nothing it touches is released while it runs.
        unsafe {
            self.ring
                .submission()
                .push(&sqe)
                .map_err(|_| io::Error::from_raw_os_error(libc::EBUSY))?;
        }
        count_syscall();
        self.ring.submit_and_wait(1)?;
        let cqe = self
            .ring
            .completion()
            .next()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
        let r = cqe.result();
        if r < 0 {
            Err(io::Error::from_raw_os_error(-r))
        } else {
            Ok(r as u32)
        }
    }
}

/// A shared mapping holding a copy of a region's pinned pages, unmapped on drop: where the
/// soft NIC's DMA goes for a region whose range the application replaced.
#[derive(Debug)]
pub struct PinnedSnapshot {
    addr: u64,
    len: usize,
}

impl PinnedSnapshot {
    /// Start address of the copy.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Its length (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a snapshot has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for PinnedSnapshot {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once, at drop.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}
