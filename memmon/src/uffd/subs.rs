//! Subscriptions and the registered segments of the address space: which watched ranges
//! an event touches, and which pages are registered with the descriptor (with reference
//! counts, since subscriptions overlap).

#![forbid(unsafe_code)]

use super::*;

/// One subscription.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sub {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) valid: bool,
    /// `read_seq` before the registration: batches tagged below it do not apply.
    pub(super) born: u64,
    /// The range registered for it (whole huge pages on hugetlbfs).
    pub(super) registered: (u64, u64),
}

/// One monitor's subscriptions, indexed by start for overlap queries.
#[derive(Default)]
pub(super) struct Subs {
    pub(super) by_id: HashMap<u64, Sub>,
    pub(super) by_start: BTreeSet<(u64, u64)>,
    pub(super) max_len: u64,
    pub(super) watched_bytes: u64,
}

impl Subs {
    pub(super) fn insert(&mut self, id: u64, start: u64, end: u64, born: u64) {
        self.by_id.insert(
            id,
            Sub {
                start,
                end,
                valid: true,
                born,
                registered: (start, end),
            },
        );
        self.by_start.insert((start, id));
        self.max_len = self.max_len.max(end - start);
        self.watched_bytes += end - start;
    }

    /// Forgets a subscription; returns the range registered for it.
    pub(super) fn remove(&mut self, id: u64) -> Option<(u64, u64)> {
        let s = self.by_id.remove(&id)?;
        self.by_start.remove(&(s.start, id));
        self.watched_bytes -= s.end - s.start;
        Some(s.registered)
    }

    pub(super) fn set_registered(&mut self, id: u64, start: u64, end: u64) {
        if let Some(s) = self.by_id.get_mut(&id) {
            s.registered = (start, end);
        }
    }

    pub(super) fn is_valid(&self, id: u64) -> bool {
        self.by_id.get(&id).is_some_and(|s| s.valid)
    }

    /// Marks every subscription overlapping `[start, end)` and born no later than `seq`
    /// invalid; returns the overlap (their pages within the range), sorted and coalesced.
    pub(super) fn hit(&mut self, start: u64, end: u64, seq: u64) -> Vec<(u64, u64)> {
        let lo = start.saturating_sub(self.max_len);
        let mut pieces = Vec::new();
        for &(s, id) in self.by_start.range((lo, 0)..(end, 0)) {
            let sub = self
                .by_id
                .get_mut(&id)
                .expect("indexed subscription exists");
            if sub.end > start && s < end && sub.born <= seq {
                sub.valid = false;
                pieces.push((s.max(start), sub.end.min(end)));
            }
        }
        coalesce(pieces)
    }
}

pub(super) fn coalesce(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Reference counts of registered pages: disjoint segments `start -> (end, refs)`.
#[derive(Default, Debug)]
pub(super) struct Segments {
    pub(super) map: BTreeMap<u64, (u64, u32)>,
}

impl Segments {
    /// Splits the segment containing `at` strictly inside, so a segment starts at `at`.
    pub(super) fn split(&mut self, at: u64) {
        if let Some((&s, &(e, r))) = self.map.range(..at).next_back() {
            if s < at && at < e {
                self.map.insert(s, (at, r));
                self.map.insert(at, (e, r));
            }
        }
    }

    /// Merges the segments meeting at `at` if they have the same count.
    pub(super) fn merge_at(&mut self, at: u64) {
        let Some((&s, &(e, r))) = self.map.range(..at).next_back() else {
            return;
        };
        if e != at {
            return;
        }
        if let Some(&(e2, r2)) = self.map.get(&at) {
            if r2 == r {
                self.map.remove(&at);
                self.map.insert(s, (e2, r));
            }
        }
    }

    pub(super) fn add(&mut self, start: u64, end: u64) {
        self.split(start);
        self.split(end);
        let mut pos = start;
        let existing: Vec<(u64, u64)> = self
            .map
            .range(start..end)
            .map(|(&s, &(e, _))| (s, e))
            .collect();
        for (s, e) in existing {
            if pos < s {
                self.map.insert(pos, (s, 1));
            }
            self.map.get_mut(&s).expect("segment").1 += 1;
            pos = e;
        }
        if pos < end {
            self.map.insert(pos, (end, 1));
        }
        self.merge_at(start);
        self.merge_at(end);
    }

    /// Drops one reference on `[start, end)`; returns the ranges left with none.
    pub(super) fn remove(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.split(start);
        self.split(end);
        let keys: Vec<u64> = self.map.range(start..end).map(|(&s, _)| s).collect();
        let mut freed = Vec::new();
        for s in keys {
            let seg = self.map.get_mut(&s).expect("segment");
            seg.1 = seg.1.saturating_sub(1);
            if seg.1 == 0 {
                freed.push((s, seg.0));
                self.map.remove(&s);
            }
        }
        self.merge_at(start);
        self.merge_at(end);
        coalesce(freed)
    }

    /// The parts of `[start, end)` with no reference.
    pub(super) fn uncovered(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = start;
        let first = self
            .map
            .range(..start)
            .next_back()
            .filter(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, _))| (s, e));
        for (s, e) in first
            .into_iter()
            .chain(self.map.range(start..end).map(|(&s, &(e, _))| (s, e)))
        {
            if pos < s {
                out.push((pos, s.min(end)));
            }
            pos = pos.max(e);
            if pos >= end {
                break;
            }
        }
        if pos < end {
            out.push((pos, end));
        }
        out
    }

    #[cfg(test)]
    pub(super) fn refs(&self) -> Vec<(u64, u64, u32)> {
        self.map.iter().map(|(&s, &(e, r))| (s, e, r)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn segments_count_overlapping_references() {
        let mut s = Segments::default();
        s.add(0, 10);
        s.add(5, 15);
        assert_eq!(s.refs(), vec![(0, 5, 1), (5, 10, 2), (10, 15, 1)]);
        assert_eq!(s.uncovered(0, 20), vec![(15, 20)]);
        assert_eq!(s.uncovered(3, 4), vec![]);
        assert_eq!(s.remove(5, 15), vec![(10, 15)]);
        assert_eq!(s.refs(), vec![(0, 10, 1)], "merged back");
        assert_eq!(s.remove(0, 10), vec![(0, 10)]);
        assert!(s.refs().is_empty());
    }

    #[test]
    pub(super) fn segments_gaps_and_nesting() {
        let mut s = Segments::default();
        s.add(10, 20);
        s.add(30, 40);
        s.add(0, 50);
        assert_eq!(
            s.refs(),
            vec![
                (0, 10, 1),
                (10, 20, 2),
                (20, 30, 1),
                (30, 40, 2),
                (40, 50, 1)
            ]
        );
        assert_eq!(s.remove(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(s.uncovered(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(s.remove(10, 20), vec![(10, 20)]);
        assert_eq!(s.remove(30, 40), vec![(30, 40)]);
        assert!(s.refs().is_empty());
    }

    #[test]
    pub(super) fn subs_hit_clips_and_coalesces() {
        let mut s = Subs::default();
        s.insert(1, 0, 100, 0);
        s.insert(2, 50, 150, 0);
        s.insert(3, 300, 400, 0);
        assert_eq!(s.hit(90, 320, 1), vec![(90, 150), (300, 320)]);
        assert!(!s.is_valid(1) && !s.is_valid(2) && !s.is_valid(3));
        s.insert(4, 500, 600, 0);
        assert_eq!(s.hit(600, 700, 1), vec![], "touching is not overlapping");
        assert!(s.is_valid(4));
        assert_eq!(s.remove(4), Some((500, 600)));
        assert_eq!(s.hit(0, u64::MAX, 1), vec![(0, 150), (300, 400)]);
        s.insert(5, 1000, 2000, 7);
        assert_eq!(
            s.hit(1000, 2000, 6),
            vec![],
            "an older batch does not apply"
        );
        assert!(s.is_valid(5));
        assert_eq!(s.hit(1500, 2000, 7), vec![(1500, 2000)]);
    }
}
