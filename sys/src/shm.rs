//! POSIX shared-memory segments: the soft NIC's wire (rings), its translation and protection
//! table and its ODP present bitmap live in them, and so do the local path's cells (one of
//! the few modules with `unsafe`).
//!
//! Everything shared across processes is accessed as atomics ([`SharedSegment::words`]) or
//! copied in and out as bytes under the ring protocol's acquire/release ordering.

use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::error::{Error, Result};

/// One mapped shared-memory object (`/dev/shm/NAME`).
#[derive(Debug)]
pub struct SharedSegment {
    ptr: *mut u8,
    len: usize,
    name: String,
    /// Whether this process created the object and its name has not been removed yet.
    owner: std::sync::atomic::AtomicBool,
    /// The object's inode, when this process created it: the name is removed only while it
    /// still names this object (a later NIC of the same job and rank may have taken it).
    inode: u64,
}

// SAFETY: the mapping is process-shared memory accessed only through atomics or explicit
// byte copies; the pointer itself is valid from any thread until drop.
unsafe impl Send for SharedSegment {}
// SAFETY: as above; all shared access goes through &self methods that use atomics or copies.
unsafe impl Sync for SharedSegment {}

impl SharedSegment {
    /// Creates `/dev/shm/NAME` of `len` bytes, reserves all of them in `/dev/shm` up front
    /// and maps it; the name is removed by [`SharedSegment::unlink_name`] or when this value
    /// drops. A `/dev/shm` without room for it is [`Error::SharedMemoryFull`] here, never a
    /// `SIGBUS` when a page is first touched.
    pub fn create(name: &str, len: usize) -> Result<SharedSegment> {
        Self::create_with(name, len, true)
    }

    /// Creates `/dev/shm/NAME` of `len` bytes without reserving them (sparse: pages cost
    /// memory when first touched), for objects far larger than what is ever touched (the
    /// 4 GiB ODP present bitmap). Touching a page when `/dev/shm` is full raises `SIGBUS`.
    pub fn create_sparse(name: &str, len: usize) -> Result<SharedSegment> {
        Self::create_with(name, len, false)
    }

    fn create_with(name: &str, len: usize, reserve: bool) -> Result<SharedSegment> {
        let c =
            CString::new(format!("/{name}")).map_err(|_| Error::InvalidArgument(name.into()))?;
        let create = || {
            // SAFETY: shm_open with a valid NUL-terminated name.
            unsafe {
                libc::shm_open(
                    c.as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                    0o600,
                )
            }
        };
        let mut fd = create();
        if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
            // Names carry the job and the rank, so only this process makes this one: it is
            // left by this process's previous NIC of the same job (a universe initialised
            // again), whose teardown may still be under way on another thread. Whoever maps
            // the old object keeps it; the name is taken for the new one.
            // SAFETY: unlinking a name of this job and rank, as above.
            unsafe { libc::shm_unlink(c.as_ptr()) };
            fd = create();
        }
        if fd < 0 {
            return Err(Error::last_os(format!(
                "shm_open(/dev/shm/{name}, O_CREAT)"
            )));
        }
        // SAFETY: fd is our open descriptor.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = Error::last_os(format!("ftruncate(/dev/shm/{name}, {len})"));
            // SAFETY: closing and unlinking what we just created.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
            }
            return Err(e);
        }
        if reserve {
            // SAFETY: fd is our open descriptor; posix_fallocate touches no memory of ours.
            let rc = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
            if rc != 0 {
                let e = if rc == libc::ENOSPC {
                    Error::SharedMemoryFull {
                        object: format!("/dev/shm/{name}"),
                        needed: len as u64,
                        job_needed: len as u64,
                        ranks: 1,
                        available: free_bytes(fd),
                    }
                } else {
                    Error::os(
                        format!("posix_fallocate(/dev/shm/{name}, {len})"),
                        std::io::Error::from_raw_os_error(rc),
                    )
                };
                // SAFETY: closing and unlinking what we just created.
                unsafe {
                    libc::close(fd);
                    libc::shm_unlink(c.as_ptr());
                }
                return Err(e);
            }
        }
        // SAFETY: fstat into a stat struct we own, on our open descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let inode = if unsafe { libc::fstat(fd, &mut st) } == 0 {
            st.st_ino
        } else {
            0
        };
        let seg = Self::map(fd, len, name, true).map(|mut seg| {
            seg.inode = inode;
            seg
        });
        if seg.is_err() {
            // SAFETY: removing the object we created.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
        seg
    }

    /// Maps an existing `/dev/shm/NAME` (a peer's), whole.
    pub fn open(name: &str) -> Result<SharedSegment> {
        let c =
            CString::new(format!("/{name}")).map_err(|_| Error::InvalidArgument(name.into()))?;
        // SAFETY: shm_open with a valid NUL-terminated name.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(Error::last_os(format!("shm_open(/dev/shm/{name})")));
        }
        // SAFETY: fstat into a stat struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is our open descriptor and st is a valid out pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = Error::last_os(format!("fstat(/dev/shm/{name})"));
            // SAFETY: closing our descriptor.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Self::map(fd, st.st_size as usize, name, false)
    }

    fn map(fd: libc::c_int, len: usize, name: &str, owner: bool) -> Result<SharedSegment> {
        // SAFETY: a shared mapping of the whole object at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd,
                0,
            )
        };
        let err = (p == libc::MAP_FAILED).then(|| Error::last_os(format!("mmap(/dev/shm/{name})")));
        // SAFETY: the mapping keeps the object alive; the descriptor is no longer needed.
        unsafe { libc::close(fd) };
        if let Some(e) = err {
            return Err(e);
        }
        Ok(SharedSegment {
            ptr: p as *mut u8,
            len,
            name: name.to_string(),
            owner: std::sync::atomic::AtomicBool::new(owner),
            inode: 0,
        })
    }

    /// A mapping of `len` bytes that no other process can open (shared anonymous memory,
    /// sparse): the local image of a peer on another host (`RankMemory::local_image`).
    pub fn anonymous(len: usize, what: &str) -> Result<SharedSegment> {
        // SAFETY: a new shared anonymous mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os(format!("mmap({what}, {len} bytes)")));
        }
        Ok(SharedSegment {
            ptr: p as *mut u8,
            len,
            name: what.to_string(),
            owner: std::sync::atomic::AtomicBool::new(false),
            inode: 0,
        })
    }

    /// Removes the object's name now, if this process created it (once); the mapping stays.
    /// The owner calls it when its NIC goes down, so that the name is free at once even if
    /// something (a monitor thread finishing an event) holds the mapping a little longer.
    pub fn unlink_name(&self) {
        if self.owner.swap(false, std::sync::atomic::Ordering::AcqRel) {
            use std::os::unix::fs::MetadataExt;
            let path = format!("/dev/shm/{}", self.name);
            let still_ours = std::fs::metadata(&path).is_ok_and(|m| m.ino() == self.inode);
            if !still_ours {
                return;
            }
            if let Ok(c) = CString::new(format!("/{}", self.name)) {
                // SAFETY: unlinking the object this process created, once.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
        }
    }

    /// Size in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: a segment has at least one page).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of byte `offset` in this process (for CMA into or out of the segment).
    #[inline]
    pub fn addr_of(&self, offset: usize) -> u64 {
        assert!(offset <= self.len);
        self.ptr as u64 + offset as u64
    }

    /// `count` 64-bit atomic words starting at byte `offset` (8-aligned).
    #[inline]
    pub fn words(&self, offset: usize, count: usize) -> &[AtomicU64] {
        assert!(
            offset % 8 == 0 && offset + count * 8 <= self.len,
            "words out of segment"
        );
        // SAFETY: in bounds and aligned (mmap is page-aligned, offset 8-aligned); AtomicU64
        // has the layout of u64 and any bit pattern is valid; the slice lives as long as the
        // mapping (&self). Other processes access the same memory only atomically.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset) as *const AtomicU64, count) }
    }

    /// The 32-bit atomic word at byte `offset` (4-aligned), e.g. a futex.
    #[inline]
    pub fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset % 4 == 0 && offset + 4 <= self.len,
            "word out of segment"
        );
        // SAFETY: as for `words`.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU32) }
    }

    /// Copies `src` into the segment at `offset`.
    #[inline]
    pub fn copy_in(&self, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.len, "copy_in out of segment");
        // SAFETY: in bounds; the ring protocol gives the writer exclusive use of the slot
        // until it publishes it with a release store.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) };
    }

    /// `len` bytes of the segment at `offset`, to read in place: a ring entry that the
    /// writer published with a release store this process acquired, and that the writer
    /// leaves alone until this process releases it (the local path's cells).
    #[inline]
    pub fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.len, "bytes out of segment");
        // SAFETY: in bounds; by the ring protocol nobody writes these bytes while the
        // reader holds them (the writer reuses an entry only after the reader moved past it).
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }

    /// `len` bytes of the segment at `offset`, to write in place: a ring entry this process
    /// owns as the writer until it publishes it (the local path's cells).
    #[inline]
    pub fn bytes_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len, "bytes out of segment");
        // SAFETY: in bounds; `&mut self` makes the slice the only one this process has, and
        // by the ring protocol the reader does not look at an entry before it is published.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }

    /// Copies bytes of the segment at `offset` into `dst`.
    #[inline]
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len, "copy_out out of segment");
        // SAFETY: in bounds; the slot was published with a release store that the reader
        // acquired, and the writer does not reuse it until the reader releases it.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
    }
}

/// Bytes free for an unprivileged writer in the file system of `fd` (0 if unknown).
fn free_bytes(fd: libc::c_int) -> u64 {
    // SAFETY: an all-zero statvfs is a valid value; fstatvfs only writes into it.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is an open descriptor of the caller; `fs` is a valid out pointer.
    if unsafe { libc::fstatvfs(fd, &mut fs) } != 0 {
        return 0;
    }
    (fs.f_bavail as u64).saturating_mul(fs.f_frsize as u64)
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once; no references into it outlive &self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        self.unlink_name();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn create_open_share_and_unlink() {
        let name = format!("pagewire-unittest-{:x}", rand::random::<u64>());
        let a = SharedSegment::create(&name, 1 << 20).unwrap();
        let b = SharedSegment::open(&name).unwrap();
        assert_eq!(b.len(), 1 << 20);
        a.words(64, 1)[0].store(42, Ordering::Release);
        assert_eq!(b.words(64, 1)[0].load(Ordering::Acquire), 42);
        a.copy_in(4096, b"hello");
        let mut out = [0u8; 5];
        b.copy_out(4096, &mut out);
        assert_eq!(&out, b"hello");
        drop(b);
        drop(a);
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    }

    #[test]
    fn a_segment_is_reserved_up_front_and_the_bitmap_stays_sparse() {
        // Reserved: a full /dev/shm is an error at creation, never a SIGBUS on first touch.
        use std::os::unix::fs::MetadataExt;
        let name = format!("pagewire-unittest-{:x}", rand::random::<u64>());
        let seg = SharedSegment::create(&name, 1 << 20).unwrap();
        let meta = std::fs::metadata(format!("/dev/shm/{name}")).unwrap();
        assert!(meta.blocks() * 512 >= 1 << 20, "{} blocks", meta.blocks());
        drop(seg);
        let sparse = SharedSegment::create_sparse(&name, 1 << 30).unwrap();
        let meta = std::fs::metadata(format!("/dev/shm/{name}")).unwrap();
        assert_eq!(meta.blocks(), 0);
        drop(sparse);
    }

    #[test]
    fn a_name_left_by_an_earlier_segment_is_taken_over_and_kept() {
        // A NIC brought up again in the same process finds its previous NIC's name while
        // that one's teardown is still under way: the new object takes the name, and the old
        // one's teardown leaves it alone.
        let name = format!("pagewire-unittest-{:x}", rand::random::<u64>());
        let old = SharedSegment::create(&name, 4096).unwrap();
        old.copy_in(0, b"old");
        let new = SharedSegment::create(&name, 8192).unwrap();
        let mut out = [0u8; 3];
        new.copy_out(0, &mut out);
        assert_eq!(out, [0, 0, 0], "a fresh object");
        old.copy_out(0, &mut out);
        assert_eq!(&out, b"old", "the old mapping keeps its bytes");
        drop(old);
        let peer = SharedSegment::open(&name).expect("the name still names the new object");
        assert_eq!(peer.len(), 8192);
        drop(peer);
        drop(new);
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    }
}
