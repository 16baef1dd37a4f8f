//! The arithmetic the algorithms share: balanced blocks, offsets from counts, binomial
//! trees, the power-of-two fold for non-power-of-two rank counts, and disjoint borrows of
//! one buffer.

use std::ops::Range;

/// Block `i` of `n` items split into `p` nearly equal blocks (the first `n % p` blocks hold
/// one more).
pub fn block_range(n: usize, p: usize, i: usize) -> Range<usize> {
    let (q, r) = (n / p, n % p);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

/// The `p + 1` block boundaries of [`block_range`], scaled by `unit` (bytes per item).
pub fn balanced_offsets(n: usize, p: usize, unit: usize) -> Vec<usize> {
    (0..=p)
        .map(|i| {
            if i == p {
                n * unit
            } else {
                block_range(n, p, i).start * unit
            }
        })
        .collect()
}

/// Prefix sums of `counts` scaled by `unit`: `counts.len() + 1` offsets.
pub fn offsets(counts: &[usize], unit: usize) -> Vec<usize> {
    let mut o = Vec::with_capacity(counts.len() + 1);
    let mut at = 0;
    o.push(0);
    for &c in counts {
        at += c * unit;
        o.push(at);
    }
    o
}

/// The range `offs[i]..offs[j]`.
pub fn span(offs: &[usize], i: usize, j: usize) -> Range<usize> {
    offs[i]..offs[j]
}

/// The binomial tree over relative ranks `0..p` rooted at 0 (MPICH's): `vr`'s parent is
/// `vr` with its lowest set bit cleared; its children are `vr + m` for the powers of two
/// `m` below that bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binomial {
    /// Ranks in the tree.
    pub p: usize,
    /// This rank's relative rank.
    pub vr: usize,
}

impl Binomial {
    /// The lowest set bit of `vr` (for the root: the power of two at or above `p`).
    pub fn span_bit(&self) -> usize {
        if self.vr == 0 {
            self.p.next_power_of_two()
        } else {
            1 << self.vr.trailing_zeros()
        }
    }

    /// The parent's relative rank (`None` at the root).
    pub fn parent(&self) -> Option<usize> {
        (self.vr != 0).then(|| self.vr - self.span_bit())
    }

    /// Relative ranks in `vr`'s subtree: `vr .. vr + subtree_size()`.
    pub fn subtree_size(&self) -> usize {
        Self::subtree_of(self.p, self.vr)
    }

    /// The subtree size of relative rank `vr` in a tree of `p`.
    pub fn subtree_of(p: usize, vr: usize) -> usize {
        Binomial { p, vr }.span_bit().min(p - vr)
    }

    /// Children as `(relative rank, mask)`, nearest (smallest subtree) first.
    pub fn children(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        let mut mask = 1;
        while mask < self.span_bit() {
            if self.vr + mask < self.p {
                v.push((self.vr + mask, mask));
            }
            mask <<= 1;
        }
        v
    }
}

/// The standard fold of a non-power-of-two rank count `p` onto `pof2`, the largest power of
/// two at most `p` (Thakur, Rabenseifner and Gropp 2005): with `rem = p - pof2`, among ranks
/// `0..2*rem` each even rank hands its data to the odd rank above it and sits out; the odd
/// ones and ranks `2*rem..p` form a power-of-two group, numbered in rank order (`newrank`).
/// Each newrank stands for a contiguous run of ranks, so rank order is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fold {
    /// Largest power of two at most `p`.
    pub pof2: usize,
    /// `p - pof2`.
    pub rem: usize,
}

impl Fold {
    /// The fold of `p >= 1` ranks.
    pub fn new(p: usize) -> Fold {
        let pof2 = if p.is_power_of_two() {
            p
        } else {
            p.next_power_of_two() / 2
        };
        Fold {
            pof2,
            rem: p - pof2,
        }
    }

    /// `rank`'s number in the power-of-two group, `None` if it sits out.
    pub fn newrank(&self, rank: usize) -> Option<usize> {
        if rank < 2 * self.rem {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - self.rem)
        }
    }

    /// The rank of group member `newrank`.
    pub fn rank_of(&self, newrank: usize) -> usize {
        if newrank < self.rem {
            2 * newrank + 1
        } else {
            newrank + self.rem
        }
    }

    /// The ranks `newrank` stands for: `first..=last`.
    pub fn ranks_of(&self, newrank: usize) -> Range<usize> {
        if newrank < self.rem {
            2 * newrank..2 * newrank + 2
        } else {
            newrank + self.rem..newrank + self.rem + 1
        }
    }
}

/// Borrows `a` for reading and `b` for writing out of one buffer; the ranges must not
/// overlap.
pub fn split_ref_mut<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    assert!(
        a.end <= b.start || b.end <= a.start || a.is_empty() || b.is_empty(),
        "overlapping ranges {a:?} and {b:?}"
    );
    if a.is_empty() {
        return (&[], &mut buf[b]);
    }
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_everything_once() {
        for n in 0..40 {
            for p in 1..10 {
                let mut next = 0;
                for i in 0..p {
                    let r = block_range(n, p, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() == n / p || r.len() == n / p + 1);
                    next = r.end;
                }
                assert_eq!(next, n);
                let o = balanced_offsets(n, p, 4);
                assert_eq!(o.len(), p + 1);
                assert_eq!(o[p], 4 * n);
                assert_eq!(o[1], 4 * block_range(n, p, 0).end);
            }
        }
        assert_eq!(offsets(&[2, 0, 3], 8), vec![0, 16, 16, 40]);
        assert_eq!(span(&[0, 16, 16, 40], 1, 3), 16..40);
    }

    #[test]
    fn binomial_trees_are_trees() {
        for p in 1..=17 {
            let mut seen = vec![0usize; p];
            for vr in 0..p {
                let t = Binomial { p, vr };
                let kids = t.children();
                for &(c, mask) in &kids {
                    assert_eq!(Binomial { p, vr: c }.parent(), Some(vr), "p={p}");
                    assert_eq!(c, vr + mask);
                    seen[c] += 1;
                }
                // The subtree is the node and its children's subtrees.
                let below: usize = kids.iter().map(|&(c, _)| Binomial::subtree_of(p, c)).sum();
                assert_eq!(t.subtree_size(), 1 + below, "p={p} vr={vr}");
            }
            assert_eq!(seen[0], 0);
            assert!(seen[1..].iter().all(|&s| s == 1), "p={p}: {seen:?}");
            assert_eq!(Binomial { p, vr: 0 }.subtree_size(), p);
        }
        assert_eq!(
            Binomial { p: 8, vr: 0 }.children(),
            vec![(1, 1), (2, 2), (4, 4)]
        );
        assert_eq!(Binomial { p: 6, vr: 4 }.children(), vec![(5, 1)]);
        assert_eq!(Binomial { p: 6, vr: 4 }.subtree_size(), 2);
    }

    #[test]
    fn folds_keep_rank_order() {
        for p in 1..=33 {
            let f = Fold::new(p);
            assert!(f.pof2.is_power_of_two() && f.pof2 <= p && p < 2 * f.pof2);
            let mut covered = 0;
            for nr in 0..f.pof2 {
                let r = f.ranks_of(nr);
                assert_eq!(r.start, covered, "p={p}: newranks cover ranks in order");
                covered = r.end;
                assert_eq!(f.newrank(f.rank_of(nr)), Some(nr));
                assert_eq!(f.rank_of(nr), r.end - 1);
            }
            assert_eq!(covered, p);
            let out = (0..p).filter(|&r| f.newrank(r).is_none()).count();
            assert_eq!(out, f.rem);
        }
        assert_eq!(Fold::new(6), Fold { pof2: 4, rem: 2 });
        assert_eq!(Fold::new(6).newrank(2), None);
        assert_eq!(Fold::new(6).newrank(3), Some(1));
        assert_eq!(Fold::new(6).newrank(5), Some(3));
    }

    #[test]
    fn disjoint_borrows() {
        let mut v: Vec<u32> = (0..10).collect();
        let (a, b) = split_ref_mut(&mut v, 0..3, 5..7);
        assert_eq!(a, &[0, 1, 2]);
        b.copy_from_slice(&[50, 60]);
        let (a, b) = split_ref_mut(&mut v, 5..7, 1..2);
        assert_eq!(a, &[50, 60]);
        b[0] = 10;
        assert_eq!(v[..7], [0, 10, 2, 3, 4, 50, 60]);
        let (a, b) = split_ref_mut(&mut v, 3..3, 2..4);
        assert!(a.is_empty() && b.len() == 2);
    }
}
