//! Shared mappings of files on disk, for the studies that need memory the kernel can take
//! back without swap: the item store of `pw-workset`'s on-demand-paging runs (Lesokhin17
//! §6.1) and the never-cached pages of `pw-perftest send_bw --rnpf-kind major` (Lesokhin17
//! Fig. 10).
//!
//! Why a file: this machine has no swap, and a memory cgroup can only take back memory it
//! can reclaim. Anonymous memory (and tmpfs or System V shared memory, which live in the
//! shmem cache) over the cgroup's limit cannot be reclaimed without swap, so the cgroup's
//! OOM killer ends the process. The page cache of a file on a disk file system is charged
//! to the cgroup that first touched it and is reclaimed under its limit (written back
//! first when dirty); touching a reclaimed page again is a major fault that reads it from
//! the disk. That is how the kernel lends one budget to whichever process uses it, which is
//! what the study needs from the memory behind an unpinned (ODP) store.
//!
//! This module wraps the system calls (`mmap`, `msync`, `munmap`, `posix_fadvise`,
//! `mincore`, `statfs`) and nothing else.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::{monotonic_ns, PAGE_SIZE};

/// A read-write `MAP_SHARED` mapping of a file, unmapped on drop (the file stays, unless
/// it was made by [`FileMapping::evicted_in`]).
#[derive(Debug)]
pub struct FileMapping {
    ptr: *mut u8,
    len: usize,
    path: PathBuf,
    _file: File,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through &self /
// &mut self.
unsafe impl Send for FileMapping {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Creates (or truncates) `path` as a sparse file of `len` bytes, rounded up to whole
    /// pages, and maps it shared, readable and writable. No page is read or allocated yet:
    /// a hole reads as zeros and gets a page-cache page at its first touch, charged to the
    /// memory cgroup of the process that touches it.
    pub fn create(path: &Path, len: usize) -> io::Result<FileMapping> {
        let page = PAGE_SIZE as usize;
        let len = len.max(1).div_ceil(page) * page;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(len as u64)?;
        FileMapping::map(file, len, path)
    }

    /// A file of `len` bytes (rounded up to pages) made in `dir`, written, synced and
    /// dropped from the page cache, then mapped: the first touch of each page is a major
    /// fault, a read from the disk. The file is unlinked at once and lives as long as the
    /// mapping. Fails on a file system in memory ([`memory_file_system`]).
    pub fn evicted_in(dir: &Path, len: usize) -> io::Result<FileMapping> {
        use std::io::Write;
        let page = PAGE_SIZE as usize;
        let len = len.max(1).div_ceil(page) * page;
        if let Some(fs) = memory_file_system(dir) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} is on a {fs}, whose pages stay in memory: major faults need a \
                     directory on a disk",
                    dir.display()
                ),
            ));
        }
        let path = dir.join(format!(
            ".pagewire-evicted-{}-{:x}",
            std::process::id(),
            monotonic_ns()
        ));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let _ = std::fs::remove_file(&path);
        let chunk = vec![0xa5u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            file.write_all(&chunk[..n])?;
            left -= n;
        }
        file.sync_all()?;
        // SAFETY: advice on our own file descriptor; it only drops clean cached pages.
        let rc = unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, len as i64, libc::POSIX_FADV_DONTNEED)
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        FileMapping::map(file, len, &path)
    }

    /// Maps the first `len` bytes (whole pages, within the file) of `file` shared.
    fn map(file: File, len: usize, path: &Path) -> io::Result<FileMapping> {
        // SAFETY: a new shared mapping of our own open file at an address of the kernel's
        // choosing; the file is at least `len` bytes long, so every page has file backing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FileMapping {
            ptr: p as *mut u8,
            len,
            path: path.to_path_buf(),
            _file: file,
        })
    }

    /// How many of its pages are in the page cache now (`mincore`).
    pub fn cached_pages(&self) -> io::Result<usize> {
        let mut v = vec![0u8; self.len / PAGE_SIZE as usize];
        // SAFETY: the range is our mapping; `v` has one byte per page.
        if unsafe { libc::mincore(self.ptr as *mut libc::c_void, self.len, v.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v.iter().filter(|b| **b & 1 != 0).count())
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings have at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The memory as bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is our mapping, readable, alive while self is. Other
        // processes write it only through the NIC, into ranges the message layer hands it
        // for a receive, which this process does not read meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The memory as mutable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access within this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Writes every dirty page back to the file and waits (`msync(MS_SYNC)`), so that the
    /// pages are clean and the cgroup can reclaim them without writing.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: the range is exactly our mapping; msync does not change its contents.
        if unsafe { libc::msync(self.ptr as *mut libc::c_void, self.len, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The type of the file system holding `dir` when it keeps its files in memory (`tmpfs`,
/// `ramfs`, `devtmpfs`), whose pages, like anonymous memory, cannot leave memory without
/// swap; `None` for a disk file system or when `/proc/self/mountinfo` does not say.
pub fn memory_file_system(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let fstype = right.split_whitespace().next()?;
            dir.starts_with(mount_point)
                .then(|| (mount_point.len(), fstype.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, t)| t)
        .filter(|t| matches!(t.as_str(), "tmpfs" | "ramfs" | "devtmpfs"))
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once, at drop; no slice of it outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_mapping_is_shared_with_the_file() {
        let path = std::env::temp_dir().join(format!("pw-workset-map-{}", std::process::id()));
        let mut m = FileMapping::create(&path, 10_000).unwrap();
        assert_eq!(m.len(), 12_288, "rounded up to pages");
        assert!(
            m.as_slice().iter().all(|&b| b == 0),
            "a sparse file reads as zeros"
        );
        m.as_mut_slice()[4096..4101].copy_from_slice(b"pages");
        m.sync().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        drop(m);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(on_disk.len(), 12_288);
        assert_eq!(&on_disk[4096..4101], b"pages");
    }

    #[test]
    fn an_evicted_file_starts_out_of_the_page_cache() {
        let dir = std::env::current_dir().unwrap();
        let Ok(m) = FileMapping::evicted_in(&dir, 64 << 10) else {
            return; // a tmpfs working directory: nothing to evict
        };
        // The disk may keep a page or two of readahead; most must be gone.
        assert!(
            m.cached_pages().unwrap() <= 2,
            "{}",
            m.cached_pages().unwrap()
        );
        assert_eq!(
            m.as_slice()[4096],
            0xa5,
            "the bytes come back from the disk"
        );
        assert!(m.cached_pages().unwrap() >= 1);
    }
}
