//! Reduce-scatter (rank `j` gets block `j` of the combined vector; `reduce_scatter_block`
//! is the case of equal blocks). `n` is the whole vector in bytes.
//!
//! - **Recursive halving** (commutative; shorter vectors): after the power-of-two fold
//!   ([`crate::partition::Fold`], `α + n·β + n·γ` for odd `p`), step `k` swaps half of the
//!   part still being reduced with rank `r XOR p'/2^(k+1)` and combines the half kept;
//!   each group member ends with the blocks of the ranks it stands for, and sends a folded
//!   partner its block. Cost: `log₂ p'·α + (p'-1)/p'·n·(β + γ)`.
//! - **Ring** (commutative; longer vectors): `p - 1` steps; in each, a rank passes a
//!   partial block to its right neighbour and adds its own contribution to the partial
//!   block from its left. Cost: `(p-1)·α + (p-1)/p·n·(β + γ)`.
//! - **Reduce then scatter** (non-commutative operations): the rank-ordered binomial reduce
//!   to rank 0 ([`crate::reduce`]) then a linear scatterv. Cost:
//!   `⌈log₂ p⌉·(α + n·β + n·γ) + (p-1)·α + (p-1)/p·n·β`.

use crate::allreduce::fold_in;
use crate::call::{algo, bytes, bytes_mut, Call};
use crate::element::Element;
use crate::gather_scatter;
use crate::op::{apply_into_left, Operation};
use crate::partition::{offsets, Fold};
use crate::reduce;
use crate::scratch::Scratch;
use crate::tuning::ReduceScatterAlgo;
use crate::Result;

/// Recursive halving among the fold's group: member `nr` ends with `seg[nr]..seg[nr+1]`
/// (elements) of `buf` combined over every rank. `tmp` holds at least half of `buf`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn halving<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    fold: &Fold,
    nr: usize,
    buf: &mut [T],
    tmp: &mut [T],
    seg: &[usize],
    op: &O,
    algo: u8,
) -> Result<()> {
    let r = c.rank();
    let mut scratch = Vec::new();
    let (mut lo, mut hi) = (0, fold.pof2);
    let mut mask = fold.pof2 / 2;
    while mask > 0 {
        let partner = fold.rank_of(nr ^ mask);
        let mid = lo + mask;
        let (keep, give) = if nr < mid {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (kr, gr) = (seg[keep.0]..seg[keep.1], seg[give.0]..seg[give.1]);
        let t = &mut tmp[..kr.len()];
        c.sendrecv(partner, bytes(&buf[gr]), partner, bytes_mut(t), algo)?;
        if partner < r {
            op.apply(t, &mut buf[kr]);
        } else {
            apply_into_left(op, &mut buf[kr], t, &mut scratch);
        }
        (lo, hi) = keep;
        mask >>= 1;
    }
    Ok(())
}

/// Ring reduce-scatter in place: afterwards rank `r` holds block `r`
/// (`offs[r]..offs[r+1]`, elements) combined over every rank. Commutative operations.
pub(crate) fn ring_in_place<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    buf: &mut [T],
    offs: &[usize],
    op: &O,
    algo: u8,
) -> Result<()> {
    let (r, p) = (c.rank(), c.size());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let longest = (0..p).map(|i| offs[i + 1] - offs[i]).max().unwrap_or(0);
    let mut tmp_s = Scratch::new(longest * std::mem::size_of::<T>());
    let tmp = tmp_s.slice::<T>(longest);
    for s in 0..p - 1 {
        let sb = (r + 2 * p - s - 1) % p;
        let rb = (r + 2 * p - s - 2) % p;
        let t = &mut tmp[..offs[rb + 1] - offs[rb]];
        c.sendrecv(
            right,
            bytes(&buf[offs[sb]..offs[sb + 1]]),
            left,
            bytes_mut(t),
            algo,
        )?;
        op.apply(t, &mut buf[offs[rb]..offs[rb + 1]]);
    }
    Ok(())
}

fn recursive_halving<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    out: &mut [T],
    offs: &[usize],
    op: &O,
) -> Result<()> {
    let a = algo::RECURSIVE_HALVING;
    let (r, p) = (c.rank(), c.size());
    let fold = Fold::new(p);
    let mut work_s = Scratch::copy_of(send);
    let work = work_s.slice::<T>(send.len());
    let mut tmp_s = Scratch::new(std::mem::size_of_val(send));
    let tmp = tmp_s.slice::<T>(send.len());
    fold_in(c, &fold, work, tmp, op, a)?;
    match fold.newrank(r) {
        Some(nr) => {
            let seg: Vec<usize> = (0..=fold.pof2)
                .map(|i| {
                    if i == fold.pof2 {
                        offs[p]
                    } else {
                        offs[fold.ranks_of(i).start]
                    }
                })
                .collect();
            halving(c, &fold, nr, work, tmp, &seg, op, a)?;
            if r < 2 * fold.rem {
                c.send(r - 1, a, bytes(&work[offs[r - 1]..offs[r]]))?;
            }
            out.copy_from_slice(&work[offs[r]..offs[r + 1]]);
            Ok(())
        }
        None => c.recv(r + 1, a, bytes_mut(out)),
    }
}

/// Reduce-scatter with `counts[j]` elements for rank `j`; `out` holds `counts[rank]`.
pub(crate) fn reduce_scatter<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    out: &mut [T],
    counts: &[usize],
    op: &O,
) -> Result<()> {
    let (r, p) = (c.rank(), c.size());
    let offs = offsets(counts, 1);
    if p == 1 {
        out.copy_from_slice(send);
        return Ok(());
    }
    if !op.is_commutative() {
        let a = algo::REDUCE_THEN_SCATTER;
        let mut full_s = Scratch::new(if r == 0 {
            std::mem::size_of_val(send)
        } else {
            0
        });
        let full = full_s.slice::<T>(if r == 0 { send.len() } else { 0 });
        if r == 0 {
            reduce::tree(c, send, Some(&mut *full), op, 0, a)?;
        } else {
            reduce::tree(c, send, None, op, 0, a)?;
        }
        let boffs = offsets(counts, std::mem::size_of::<T>());
        let root_part = (r == 0).then_some((bytes(full), &boffs[..]));
        return gather_scatter::scatterv(c, root_part, bytes_mut(out), 0, a);
    }
    match c.g.tuning.reduce_scatter_algo(std::mem::size_of_val(send)) {
        ReduceScatterAlgo::Ring => {
            let mut work_s = Scratch::copy_of(send);
            let work = work_s.slice::<T>(send.len());
            ring_in_place(c, work, &offs, op, algo::REDUCE_SCATTER_RING)?;
            out.copy_from_slice(&work[offs[r]..offs[r + 1]]);
            Ok(())
        }
        _ => recursive_halving(c, send, out, &offs, op),
    }
}
