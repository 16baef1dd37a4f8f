//! Real pinning: non-ODP registrations pin their pages long-term, as
//! `ibv_reg_mr` does (`pin_user_pages(FOLL_LONGTERM)` in `ib_umem_get`), through io_uring
//! fixed-buffer registration ([`sys::LongTermPins`]); where io_uring is unavailable, or for
//! memory the kernel will not pin long-term (read-only or file mappings), with `mlock`
//! (refcounted per page, because regions overlap and `munlock` is not). Every pin is charged
//! against RLIMIT_MEMLOCK (or `PAGEWIRE_MEMLOCK_LIMIT`), once per page.
//!
//! As root the kernel waives the limit (CAP_IPC_LOCK), so the account is kept here as well:
//! a registration fails with the same error an unprivileged user on a cluster would see.

use std::collections::BTreeMap;

use pagewire_nic::PAGE_SIZE;
use pagewire_sys::error::{Error, Result};
use pagewire_sys::{self as sys, LongTermPin, LongTermPins};

/// The locked-memory limit in force and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemlockLimit {
    /// Bytes that may be pinned (`None`: unlimited).
    pub bytes: Option<u64>,
    /// `RLIMIT_MEMLOCK` or `PAGEWIRE_MEMLOCK_LIMIT`.
    pub source: &'static str,
}

/// How registrations pin their pages (`PAGEWIRE_PIN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinMethod {
    /// Long-term pins where io_uring works, `mlock` otherwise (the default).
    Auto,
    /// Long-term pins, or fail at start-up.
    LongTerm,
    /// `mlock`/`munlock` (what the soft NIC did before it pinned long-term; measurably slower).
    Mlock,
}

impl PinMethod {
    /// Parses a `PAGEWIRE_PIN` value (`None`/empty is [`PinMethod::Auto`]).
    pub fn parse(value: Option<&str>) -> Result<PinMethod> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Ok(PinMethod::Auto),
            Some("longterm") => Ok(PinMethod::LongTerm),
            Some("mlock") => Ok(PinMethod::Mlock),
            Some(other) => Err(Error::invalid_setting(
                "PAGEWIRE_PIN",
                other,
                "expected auto, longterm or mlock",
            )),
        }
    }
}

/// How one region's pages are held.
#[derive(Debug)]
pub(crate) enum RegionPin {
    /// A long-term pin: the region stays bound to these pages.
    LongTerm(LongTermPin),
    /// `mlock`ed pages: they follow the address range (a replaced range is not held).
    Locked,
}

/// Reference counts of pages, kept as runs of consecutive pages with the same count, so
/// that pinning or unpinning a region costs a few map operations whatever its size.
#[derive(Debug, Default)]
pub(crate) struct PageCounts {
    /// First page of a run -> (one past its last page, count >= 1); runs are disjoint.
    runs: BTreeMap<u64, (u64, u32)>,
    /// Pages with a count of at least one.
    pages: u64,
}

impl PageCounts {
    /// Pages counted at least once.
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }

    /// Pages of `[first, end)` counted nowhere yet.
    pub(crate) fn uncounted(&self, first: u64, end: u64) -> u64 {
        let mut covered = 0;
        for (&a, &(b, _)) in self.runs.range(..end).rev() {
            if b <= first {
                break;
            }
            covered += b.min(end) - a.max(first);
        }
        (end - first) - covered
    }

    /// Splits the run containing `page` (if any starts before it) so that a run starts there.
    fn split_at(&mut self, page: u64) {
        if let Some((&a, &(b, c))) = self.runs.range(..page).next_back() {
            if b > page {
                self.runs.insert(a, (page, c));
                self.runs.insert(page, (b, c));
            }
        }
    }

    /// Adds one to every page of `[first, end)`; returns the pages counted for the first
    /// time, as runs.
    pub(crate) fn add(&mut self, first: u64, end: u64) -> Vec<(u64, u64)> {
        self.split_at(first);
        self.split_at(end);
        let mut fresh = Vec::new();
        let mut at = first;
        let inside: Vec<(u64, u64, u32)> = self
            .runs
            .range(first..end)
            .map(|(&a, &(b, c))| (a, b, c))
            .collect();
        for (a, b, c) in inside {
            if a > at {
                fresh.push((at, a));
            }
            self.runs.insert(a, (b, c + 1));
            at = b;
        }
        if at < end {
            fresh.push((at, end));
        }
        for &(a, b) in &fresh {
            self.runs.insert(a, (b, 1));
            self.pages += b - a;
        }
        fresh
    }

    /// Takes one from every counted page of `[first, end)`; returns the pages whose count
    /// fell to zero, as runs.
    pub(crate) fn remove(&mut self, first: u64, end: u64) -> Vec<(u64, u64)> {
        self.split_at(first);
        self.split_at(end);
        let inside: Vec<(u64, u64, u32)> = self
            .runs
            .range(first..end)
            .map(|(&a, &(b, c))| (a, b, c))
            .collect();
        let mut freed: Vec<(u64, u64)> = Vec::new();
        for (a, b, c) in inside {
            if c > 1 {
                self.runs.insert(a, (b, c - 1));
            } else {
                self.runs.remove(&a);
                self.pages -= b - a;
                match freed.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => freed.push((a, b)),
                }
            }
        }
        freed
    }
}

/// Per-page pin counts of this process's NIC, and the pinning mechanism.
#[derive(Debug)]
pub(crate) struct PinAccount {
    counts: PageCounts,
    /// Pages `mlock`ed, by refcount (a subset of `counts`).
    locked: PageCounts,
    limit: MemlockLimit,
    longterm: Option<LongTermPins>,
    /// Why long-term pins are not in force, when they are not.
    longterm_unavailable: Option<String>,
}

impl PinAccount {
    /// An account that pins with `method`; fails only if [`PinMethod::LongTerm`] is asked
    /// for and io_uring does not work here.
    pub(crate) fn with_method(limit: MemlockLimit, method: PinMethod) -> Result<PinAccount> {
        let (longterm, why) = match method {
            PinMethod::Mlock => (None, Some("PAGEWIRE_PIN=mlock".to_string())),
            PinMethod::Auto | PinMethod::LongTerm => match LongTermPins::new() {
                Ok(p) => (Some(p), None),
                Err(e) if method == PinMethod::LongTerm => {
                    return Err(Error::os(
                        "PAGEWIRE_PIN=longterm: setting up io_uring fixed buffers (is \
                         kernel.io_uring_disabled set, or io_uring blocked by seccomp?)",
                        e,
                    ))
                }
                Err(e) => (None, Some(format!("io_uring unavailable: {e}"))),
            },
        };
        Ok(PinAccount {
            counts: PageCounts::default(),
            locked: PageCounts::default(),
            limit,
            longterm,
            longterm_unavailable: why,
        })
    }

    /// An `mlock` account (tests).
    #[cfg(test)]
    pub(crate) fn new(limit: MemlockLimit) -> PinAccount {
        PinAccount::with_method(limit, PinMethod::Mlock).expect("mlock needs no setup")
    }

    /// The limit in force.
    pub(crate) fn limit_value(&self) -> MemlockLimit {
        self.limit
    }

    /// One line: how regions are pinned here.
    pub(crate) fn describe(&self) -> String {
        match (&self.longterm, &self.longterm_unavailable) {
            (Some(_), _) => "long-term pins (io_uring fixed buffers, the kernel path of \
                             ibv_reg_mr); mlock for memory the kernel will not pin long-term"
                .into(),
            (None, Some(why)) => format!("mlock ({why})"),
            (None, None) => "mlock".into(),
        }
    }

    /// Whether regions are pinned long-term (and so stay bound to their pages).
    pub(crate) fn long_term(&self) -> bool {
        self.longterm.is_some()
    }

    /// Bytes pinned now.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.counts.pages() * PAGE_SIZE
    }

    /// Pins the pages of the range; returns the bytes newly charged and how it is held.
    pub(crate) fn pin(&mut self, addr: u64, len: u64) -> Result<(u64, RegionPin)> {
        let (start, span) = sys::page_span(addr, len);
        let first = start / PAGE_SIZE;
        let n = span / PAGE_SIZE;
        let new_pages = self.counts.uncounted(first, first + n);
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
        let held = match self.longterm.as_mut().map(|p| p.pin(start, span)) {
            Some(Ok(pin)) => RegionPin::LongTerm(pin),
            Some(Err(e)) if e.raw_os_error() == Some(libc::ENOMEM) => {
                return Err(self.kernel_limit(requested))
            }
            Some(Err(e)) if !sys::is_mapped(start, span) => {
                let _ = e;
                return Err(Error::UnmappedRange { addr, len });
            }
            // Read-only or file mappings, or a full table: pinned the old way.
            Some(Err(_)) | None => {
                self.lock(start, span, addr, len, requested)?;
                RegionPin::Locked
            }
        };
        self.counts.add(first, first + n);
        Ok((requested, held))
    }

    fn kernel_limit(&self, requested: u64) -> Error {
        Error::MemlockLimit {
            requested,
            pinned: self.pinned_bytes(),
            limit: sys::memlock_rlimit().unwrap_or(0),
            source_of_limit: "RLIMIT_MEMLOCK, enforced by the kernel",
        }
    }

    /// `mlock`s the pages not yet locked by another region.
    fn lock(&mut self, start: u64, span: u64, addr: u64, len: u64, requested: u64) -> Result<()> {
        if let Err(e) = sys::mlock(start, span) {
            return Err(match e.raw_os_error() {
                Some(libc::ENOMEM) if !sys::is_mapped(start, span) => {
                    Error::UnmappedRange { addr, len }
                }
                Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN) => {
                    self.kernel_limit(requested)
                }
                _ => Error::os(format!("mlock({start:#x}, {span})"), e),
            });
        }
        let first = start / PAGE_SIZE;
        self.locked.add(first, first + span / PAGE_SIZE);
        Ok(())
    }

    /// Unpins the region's pages; returns the bytes no longer charged to anyone.
    pub(crate) fn unpin(&mut self, addr: u64, len: u64, held: RegionPin) -> u64 {
        let (start, span) = sys::page_span(addr, len);
        let first = start / PAGE_SIZE;
        match held {
            RegionPin::LongTerm(pin) => {
                if let Some(p) = self.longterm.as_mut() {
                    p.unpin(pin);
                }
            }
            RegionPin::Locked => self.unlock(first, span / PAGE_SIZE),
        }
        let freed: u64 = self
            .counts
            .remove(first, first + span / PAGE_SIZE)
            .iter()
            .map(|(a, b)| b - a)
            .sum();
        freed * PAGE_SIZE
    }

    fn unlock(&mut self, first: u64, n: u64) {
        // munlock the runs no region locks any more; a range unmapped meanwhile gives
        // ENOMEM, which is fine: its pages are no longer locked anyway.
        for (a, b) in self.locked.remove(first, first + n) {
            let _ = sys::munlock(a * PAGE_SIZE, (b - a) * PAGE_SIZE);
        }
    }

    /// A copy of the pages `held` pins (not what the range maps now); `None` for `mlock`ed
    /// regions, which hold no pages of their own once the range is replaced.
    pub(crate) fn snapshot(
        &mut self,
        held: &RegionPin,
    ) -> Option<std::io::Result<sys::PinnedSnapshot>> {
        match (held, self.longterm.as_mut()) {
            (RegionPin::LongTerm(pin), Some(p)) => Some(p.snapshot(pin)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewire_sys::AnonMapping;

    #[test]
    fn page_counts_keep_runs_and_report_fresh_and_freed_pages() {
        let mut c = PageCounts::default();
        assert_eq!(c.add(10, 20), vec![(10, 20)]);
        assert_eq!(c.uncounted(5, 25), 10);
        assert_eq!(c.add(15, 30), vec![(20, 30)], "pages 15-19 were counted");
        assert_eq!(c.add(0, 40), vec![(0, 10), (30, 40)]);
        assert_eq!(c.pages(), 40);
        assert_eq!(c.remove(0, 40), vec![(0, 10), (30, 40)]);
        assert_eq!(
            c.remove(10, 20),
            vec![(10, 15)],
            "15-19 still counted by 15-30"
        );
        assert_eq!(c.remove(15, 30), vec![(15, 30)]);
        assert_eq!((c.pages(), c.runs.len()), (0, 0));
        assert_eq!(c.remove(3, 4), vec![], "nothing counted: nothing freed");
    }

    #[test]
    fn overlapping_pins_are_refcounted_and_limited() {
        let m = AnonMapping::new(8 * PAGE_SIZE as usize).unwrap();
        let mut acct = PinAccount::new(MemlockLimit {
            bytes: Some(6 * PAGE_SIZE),
            source: "test",
        });
        let a = m.addr();
        let (n, h1) = acct.pin(a, 4 * PAGE_SIZE).unwrap();
        assert_eq!(n, 4 * PAGE_SIZE);
        let (n, h2) = acct.pin(a + 2 * PAGE_SIZE, 4 * PAGE_SIZE).unwrap();
        assert_eq!(n, 2 * PAGE_SIZE);
        let e = acct.pin(a + 6 * PAGE_SIZE, 2 * PAGE_SIZE).unwrap_err();
        assert!(matches!(e, Error::MemlockLimit { requested, limit, .. }
            if requested == 2 * PAGE_SIZE && limit == 6 * PAGE_SIZE));
        assert!(e.to_string().contains("test"), "{e}");
        assert_eq!(
            acct.unpin(a, 4 * PAGE_SIZE, h1),
            2 * PAGE_SIZE,
            "shared pages stay pinned"
        );
        assert_eq!(acct.pinned_bytes(), 4 * PAGE_SIZE);
        assert_eq!(
            acct.unpin(a + 2 * PAGE_SIZE, 4 * PAGE_SIZE, h2),
            4 * PAGE_SIZE
        );
        assert_eq!(acct.pinned_bytes(), 0);
    }

    #[test]
    fn unmapped_memory_cannot_be_pinned() {
        // An address nothing maps: the unit tests' other threads could take a hole's.
        let mut acct = PinAccount::new(MemlockLimit {
            bytes: None,
            source: "test",
        });
        let e = acct.pin(pagewire_sys::NEVER_MAPPED, PAGE_SIZE).unwrap_err();
        assert!(matches!(e, Error::UnmappedRange { .. }), "{e}");
    }
}
