//! The ODP page-present bitmap: one bit per page of a rank's address space telling whether
//! the NIC holds a translation for it (the non-present entries of ODP13's "HW translation
//! tables"). Kept in a sparse 4 GiB shared object (2^47 bytes / 4 KiB pages / 8 bits): only
//! the parts covering used address ranges ever take memory. Set by the owner's driver when
//! it resolves a network page fault or a prefetch; cleared when a mapping goes away.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire};

use super::tpt::ADDRESS_SPACE_END;
use pagewire_nic::PAGE_SIZE;

/// Bytes of the bitmap object.
pub(crate) const PRESENT_BYTES: usize = (ADDRESS_SPACE_END / PAGE_SIZE / 8) as usize;

/// The bitmap words the pages of `[addr, addr+len)` fall in, each with the mask of those
/// pages' bits.
fn word_masks(addr: u64, len: u64) -> impl Iterator<Item = (usize, u64)> {
    let r = pages(addr, len);
    let mut p = r.start;
    std::iter::from_fn(move || {
        if p >= r.end {
            return None;
        }
        let bits_here = (64 - p % 64).min(r.end - p);
        let mask = if bits_here == 64 {
            u64::MAX
        } else {
            ((1u64 << bits_here) - 1) << (p % 64)
        };
        let word = (p / 64) as usize;
        p += bits_here;
        Some((word, mask))
    })
}

/// A view of one rank's present bitmap.
#[derive(Clone, Copy)]
pub(crate) struct PresentBits<'a> {
    words: &'a [AtomicU64],
}

fn pages(addr: u64, len: u64) -> std::ops::Range<u64> {
    let first = addr / PAGE_SIZE;
    let end = if len == 0 {
        first
    } else {
        (addr + len).div_ceil(PAGE_SIZE)
    };
    first..end
}

impl<'a> PresentBits<'a> {
    pub(crate) fn new(words: &'a [AtomicU64]) -> PresentBits<'a> {
        PresentBits { words }
    }

    fn bit(&self, page: u64) -> (&'a AtomicU64, u64) {
        (&self.words[(page / 64) as usize], 1 << (page % 64))
    }

    /// Pages of the range that are not present, in order.
    #[cfg(test)]
    pub(crate) fn missing(&self, addr: u64, len: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let r = pages(addr, len);
        let mut p = r.start;
        while p < r.end {
            let w = self.words[(p / 64) as usize].load(Acquire);
            if w == u64::MAX && p % 64 == 0 && p + 64 <= r.end {
                p += 64;
                continue;
            }
            if w & (1 << (p % 64)) == 0 {
                out.push(p);
            }
            p += 1;
        }
        out
    }

    /// The first and last page of the range that are not present, if any (no allocation:
    /// the data path's check).
    pub(crate) fn missing_span(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let mut first = None;
        let mut last = 0;
        for (word, mask) in word_masks(addr, len) {
            let absent = !self.words[word].load(Acquire) & mask;
            if absent != 0 {
                let base = word as u64 * 64;
                first.get_or_insert(base + absent.trailing_zeros() as u64);
                last = base + 63 - absent.leading_zeros() as u64;
            }
        }
        first.map(|f| (f, last))
    }

    /// Marks the range present; returns how many pages were newly marked.
    pub(crate) fn set(&self, addr: u64, len: u64) -> u64 {
        self.update(addr, len, true)
    }

    /// Marks the range not present; returns how many pages were present before.
    pub(crate) fn clear(&self, addr: u64, len: u64) -> u64 {
        self.update(addr, len, false)
    }

    /// Marks one page not present; true if it was present.
    pub(crate) fn clear_page(&self, page: u64) -> bool {
        let (w, m) = self.bit(page);
        w.fetch_and(!m, AcqRel) & m != 0
    }

    fn update(&self, addr: u64, len: u64, present: bool) -> u64 {
        let mut changed = 0u64;
        for (word, mask) in word_masks(addr, len) {
            let w = &self.words[word];
            let old = if present {
                w.fetch_or(mask, AcqRel)
            } else {
                w.fetch_and(!mask, AcqRel)
            };
            changed += if present {
                (mask & !old).count_ones()
            } else {
                (mask & old).count_ones()
            } as u64;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_and_missing_over_word_boundaries() {
        let words: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(0)).collect();
        let b = PresentBits::new(&words);
        let base = 60 * PAGE_SIZE;
        assert_eq!(b.missing(base, 3 * PAGE_SIZE), vec![60, 61, 62]);
        assert_eq!(
            b.set(base + 100, 100 * PAGE_SIZE),
            101,
            "partial pages count whole"
        );
        assert!(b.missing(base, 101 * PAGE_SIZE).is_empty());
        assert_eq!(b.set(base, PAGE_SIZE), 0);
        assert!(b.clear_page(100));
        assert_eq!(b.missing(base, 101 * PAGE_SIZE), vec![100]);
        assert_eq!(b.missing_span(base, 101 * PAGE_SIZE), Some((100, 100)));
        assert_eq!(b.clear(base, 101 * PAGE_SIZE), 100);
        assert_eq!(b.missing_span(base + 5, 70 * PAGE_SIZE), Some((60, 130)));
        b.set(base + 64 * PAGE_SIZE, PAGE_SIZE);
        assert_eq!(b.missing_span(base + 64 * PAGE_SIZE, 1), None);
        assert_eq!(
            b.missing(base, 0),
            Vec::<u64>::new(),
            "zero length touches nothing"
        );
    }
}
