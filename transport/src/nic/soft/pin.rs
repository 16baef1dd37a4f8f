//! Real pinning: non-ODP registrations `mlock` their pages, refcounted per page because
//! regions overlap, and are charged against RLIMIT_MEMLOCK (or `PAGEWIRE_MEMLOCK_LIMIT`).
//!
//! As root the kernel waives the limit (CAP_IPC_LOCK), so the account is kept here as well:
//! a registration fails with the same error an unprivileged user on a cluster would see.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::nic::PAGE_SIZE;
use crate::sys;

/// The locked-memory limit in force and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemlockLimit {
    /// Bytes that may be pinned (`None`: unlimited).
    pub bytes: Option<u64>,
    /// `RLIMIT_MEMLOCK` or `PAGEWIRE_MEMLOCK_LIMIT`.
    pub source: &'static str,
}

/// Per-page pin counts of this process's NIC.
#[derive(Debug)]
pub(crate) struct PinAccount {
    counts: BTreeMap<u64, u32>,
    limit: MemlockLimit,
}

impl PinAccount {
    pub(crate) fn new(limit: MemlockLimit) -> PinAccount {
        PinAccount {
            counts: BTreeMap::new(),
            limit,
        }
    }

    /// The limit in force.
    pub(crate) fn limit_value(&self) -> MemlockLimit {
        self.limit
    }

    /// Bytes pinned now.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.counts.len() as u64 * PAGE_SIZE
    }

    /// Pins the pages of the range; returns the bytes newly pinned.
    pub(crate) fn pin(&mut self, addr: u64, len: u64) -> Result<u64> {
        let (start, span) = sys::page_span(addr, len);
        let first = start / PAGE_SIZE;
        let n = span / PAGE_SIZE;
        let new_pages = (first..first + n)
            .filter(|p| !self.counts.contains_key(p))
            .count() as u64;
        let requested = new_pages * PAGE_SIZE;
        if let Some(limit) = self.limit.bytes {
            if self.pinned_bytes() + requested > limit {
                return Err(Error::MemlockLimit {
                    requested,
                    pinned: self.pinned_bytes(),
                    limit,
                    source_of_limit: self.limit.source,
                });
            }
        }
        if let Err(e) = sys::mlock(start, span) {
            return Err(match e.raw_os_error() {
                Some(libc::ENOMEM) if !sys::is_mapped(start, span) => {
                    Error::UnmappedRange { addr, len }
                }
                Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN) => {
                    Error::MemlockLimit {
                        requested,
                        pinned: self.pinned_bytes(),
                        limit: sys::memlock_rlimit().unwrap_or(0),
                        source_of_limit: "RLIMIT_MEMLOCK, enforced by the kernel",
                    }
                }
                _ => Error::os(format!("mlock({start:#x}, {span})"), e),
            });
        }
        for p in first..first + n {
            *self.counts.entry(p).or_insert(0) += 1;
        }
        Ok(requested)
    }

    /// Unpins the pages of the range; returns the bytes no longer pinned by anyone.
    pub(crate) fn unpin(&mut self, addr: u64, len: u64) -> u64 {
        let (start, span) = sys::page_span(addr, len);
        let first = start / PAGE_SIZE;
        let mut freed: Vec<u64> = Vec::new();
        for p in first..first + span / PAGE_SIZE {
            if let Some(c) = self.counts.get_mut(&p) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&p);
                    freed.push(p);
                }
            }
        }
        // munlock runs of freed pages; a range unmapped meanwhile gives ENOMEM, which is fine:
        // its pages are no longer locked anyway.
        let mut i = 0;
        while i < freed.len() {
            let mut j = i + 1;
            while j < freed.len() && freed[j] == freed[j - 1] + 1 {
                j += 1;
            }
            let _ = sys::munlock(freed[i] * PAGE_SIZE, (j - i) as u64 * PAGE_SIZE);
            i = j;
        }
        freed.len() as u64 * PAGE_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::AnonMapping;

    #[test]
    fn overlapping_pins_are_refcounted_and_limited() {
        let m = AnonMapping::new(8 * PAGE_SIZE as usize).unwrap();
        let mut acct = PinAccount::new(MemlockLimit {
            bytes: Some(6 * PAGE_SIZE),
            source: "test",
        });
        let a = m.addr();
        assert_eq!(acct.pin(a, 4 * PAGE_SIZE).unwrap(), 4 * PAGE_SIZE);
        assert_eq!(
            acct.pin(a + 2 * PAGE_SIZE, 4 * PAGE_SIZE).unwrap(),
            2 * PAGE_SIZE
        );
        let e = acct.pin(a + 6 * PAGE_SIZE, 2 * PAGE_SIZE).unwrap_err();
        assert!(matches!(e, Error::MemlockLimit { requested, limit, .. }
            if requested == 2 * PAGE_SIZE && limit == 6 * PAGE_SIZE));
        assert!(e.to_string().contains("test"), "{e}");
        assert_eq!(
            acct.unpin(a, 4 * PAGE_SIZE),
            2 * PAGE_SIZE,
            "shared pages stay pinned"
        );
        assert_eq!(acct.pinned_bytes(), 4 * PAGE_SIZE);
        assert_eq!(acct.unpin(a + 2 * PAGE_SIZE, 4 * PAGE_SIZE), 4 * PAGE_SIZE);
        assert_eq!(acct.pinned_bytes(), 0);
    }

    #[test]
    fn unmapped_memory_cannot_be_pinned() {
        let m = AnonMapping::new(4 * PAGE_SIZE as usize).unwrap();
        let hole = m.unmap_range(0, 4 * PAGE_SIZE as usize).unwrap();
        let mut acct = PinAccount::new(MemlockLimit {
            bytes: None,
            source: "test",
        });
        let e = acct.pin(hole.hole_addr(), PAGE_SIZE).unwrap_err();
        assert!(matches!(e, Error::UnmappedRange { .. }), "{e}");
    }
}
