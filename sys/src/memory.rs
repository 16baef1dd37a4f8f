//! This process's memory as a NIC sees it: page spans, locking and the locked-memory limit,
//! which pages are mapped or resident, and anonymous mappings the NIC owns.

use std::fs::File;
use std::io;

use crate::{count_syscall, Extent, PAGE_SIZE};

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
