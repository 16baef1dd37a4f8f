//! A shared mapping of a file on disk: the item store of the on-demand-paging runs of
//! `pw-workset` (seed 000 §6.1).
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
//! This module wraps the system calls (`mmap`, `msync`, `munmap`) and nothing else; it is
//! the only place in the tools crate besides the two posting calls of the perftest that
//! uses `unsafe`, each block with its argument.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// A read-write `MAP_SHARED` mapping of a file, unmapped on drop (the file stays).
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
        let page = pagewire::sys::PAGE_SIZE as usize;
        let len = len.max(1).div_ceil(page) * page;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(len as u64)?;
        // SAFETY: a new shared mapping of our own open file at an address of the kernel's
        // choosing; the file is `len` bytes long, so every mapped page has file backing.
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
}
