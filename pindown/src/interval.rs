//! Address ranges and the interval index of cached registrations.
//!
//! The index holds the valid registrations only, keyed by start address. Registrations may
//! overlap (two buffers sharing a page each have their own, as an HCA allows), but none
//! contains another (the cache's overlap rule guarantees it, see [`crate::cache`]). So in
//! start order the ends increase too: the registration that could cover an address range is
//! the one with the greatest start at or below it, one `BTreeMap` range query, and the ones
//! overlapping a range are a run ending at the last start below its end.

use std::collections::BTreeMap;

/// Identifies one registration held by the cache (never reused).
pub(crate) type EntryId = u64;

/// A half-open byte range `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl Span {
    /// `[addr, addr+len)`, or `None` if it wraps around the address space.
    pub fn new(addr: u64, len: u64) -> Option<Span> {
        addr.checked_add(len).map(|end| Span { start: addr, end })
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// No bytes.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// The span rounded out to whole pages of `page` bytes (a power of two), or `None` if
    /// rounding up wraps around.
    pub fn page_aligned(&self, page: u64) -> Option<Span> {
        debug_assert!(page.is_power_of_two());
        let start = self.start & !(page - 1);
        let end = self.end.checked_add(page - 1)? & !(page - 1);
        Some(Span { start, end })
    }

    /// Every byte of `other` is in `self`.
    pub fn contains(&self, other: &Span) -> bool {
        self.start <= other.start && other.end <= self.end
    }

    /// The spans share at least one byte (touching spans do not overlap).
    pub fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// The smallest span containing both.
    pub fn hull(&self, other: &Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// Spans of valid registrations, by start address; none contains another.
#[derive(Debug, Default)]
pub(crate) struct IntervalIndex {
    by_start: BTreeMap<u64, (u64, EntryId)>,
}

impl IntervalIndex {
    /// Adds `span` for `id`; it must neither contain nor lie inside an indexed span.
    pub(crate) fn insert(&mut self, span: Span, id: EntryId) {
        debug_assert!(
            self.overlapping(span)
                .iter()
                .all(|(s, _)| !s.contains(&span) && !span.contains(s)),
            "no index span may contain another"
        );
        self.by_start.insert(span.start, (span.end, id));
    }

    /// Removes the span starting at `start`; returns its entry.
    pub(crate) fn remove(&mut self, start: u64) -> Option<EntryId> {
        self.by_start.remove(&start).map(|(_, id)| id)
    }

    /// The entry whose span contains all of `want`, if any.
    pub(crate) fn covering(&self, want: Span) -> Option<EntryId> {
        let (_, &(end, id)) = self.by_start.range(..=want.start).next_back()?;
        (end >= want.end).then_some(id)
    }

    /// Every indexed span that shares a byte with `span`, in address order.
    pub(crate) fn overlapping(&self, span: Span) -> Vec<(Span, EntryId)> {
        if span.is_empty() {
            return Vec::new();
        }
        // Ends increase with starts: walk back from the last start below `span.end` while
        // the ends still reach into `span`.
        let mut out: Vec<(Span, EntryId)> = self
            .by_start
            .range(..span.end)
            .rev()
            .take_while(|(_, &(end, _))| end > span.start)
            .map(|(&start, &(end, id))| (Span { start, end }, id))
            .collect();
        out.reverse();
        out
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Every indexed span in address order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Span, EntryId)> + '_ {
        self.by_start
            .iter()
            .map(|(&start, &(end, id))| (Span { start, end }, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start: u64, end: u64) -> Span {
        Span { start, end }
    }

    #[test]
    fn page_alignment_rounds_out() {
        assert_eq!(s(4097, 4098).page_aligned(4096), Some(s(4096, 8192)));
        assert_eq!(s(4096, 8192).page_aligned(4096), Some(s(4096, 8192)));
        assert_eq!(s(100, 8193).page_aligned(4096), Some(s(0, 12288)));
        assert_eq!(s(0, u64::MAX).page_aligned(4096), None);
        assert_eq!(Span::new(u64::MAX, 2), None);
    }

    #[test]
    fn overlap_and_containment_are_half_open() {
        assert!(
            !s(0, 10).overlaps(&s(10, 20)),
            "touching is not overlapping"
        );
        assert!(s(0, 11).overlaps(&s(10, 20)));
        assert!(s(0, 20).contains(&s(0, 20)));
        assert!(!s(0, 20).contains(&s(0, 21)));
        assert_eq!(s(0, 10).hull(&s(30, 40)), s(0, 40));
    }

    #[test]
    fn covering_and_overlapping() {
        let mut ix = IntervalIndex::default();
        ix.insert(s(0, 100), 1);
        ix.insert(s(100, 200), 2);
        ix.insert(s(300, 400), 3);
        assert_eq!(ix.covering(s(10, 100)), Some(1));
        assert_eq!(ix.covering(s(100, 101)), Some(2));
        assert_eq!(ix.covering(s(99, 101)), None, "straddles two entries");
        assert_eq!(ix.covering(s(250, 260)), None);
        assert_eq!(ix.covering(s(350, 401)), None);
        let ids = |v: Vec<(Span, EntryId)>| v.into_iter().map(|(_, id)| id).collect::<Vec<_>>();
        assert_eq!(ids(ix.overlapping(s(50, 150))), vec![1, 2]);
        assert_eq!(ids(ix.overlapping(s(200, 300))), Vec::<u64>::new());
        assert_eq!(ids(ix.overlapping(s(199, 301))), vec![2, 3]);
        assert_eq!(ids(ix.overlapping(s(0, 1000))), vec![1, 2, 3]);
        assert_eq!(ix.remove(100), Some(2));
        assert_eq!(ix.covering(s(150, 160)), None);
        assert_eq!(ix.len(), 2);
    }
}
