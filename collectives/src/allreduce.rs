//! Allreduce. `n` is the message in bytes, γ the time to combine a byte.
//!
//! - **Recursive doubling** (short messages; any operation): in step `k` rank `r` swaps its
//!   whole vector with rank `r XOR 2^k` and combines, lower rank's operand first. Cost:
//!   `log₂ p'·(α + n·β + n·γ)` with `p'` the largest power of two at most `p`.
//! - **Rabenseifner** (long messages; commutative operations): a reduce-scatter by
//!   recursive halving (step `k` swaps half of what is left with rank `r XOR p'/2^(k+1)`),
//!   then an allgather by recursive doubling. Cost:
//!   `2·log₂ p'·α + 2·(p'-1)/p'·n·β + (p'-1)/p'·n·γ`.
//! - **Ring** (the longest messages, and long ones on rank counts that are not a power of
//!   two; commutative): a ring reduce-scatter (`p - 1` steps, each passing one block of
//!   `n/p` on to the right neighbour and combining the one from the left) then a ring
//!   allgather. Cost:
//!   `2·(p-1)·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ`, with no extra steps for odd `p`.
//!
//! For `p` not a power of two, recursive doubling and Rabenseifner first **fold** the
//! `rem = p - p'` extra ranks in (even ranks below `2·rem` send their vector to the odd
//! rank above, which combines: `α + n·β + n·γ`) and at the end send the result back
//! (`α + n·β`); see [`crate::partition::Fold`]. The fold keeps rank order, so recursive
//! doubling stays correct for non-commutative operations; Rabenseifner's halving and the
//! ring combine operands out of rank order and require commutativity.

use crate::allgather;
use crate::call::{algo, bytes, bytes_mut, Call};
use crate::element::Element;
use crate::op::{apply_into_left, Operation};
use crate::partition::{balanced_offsets, Fold};
use crate::reduce_scatter;
use crate::scratch::Scratch;
use crate::tuning::AllreduceAlgo;
use crate::Result;

/// The fold's first step: even ranks below `2·rem` hand `buf` to the odd rank above them,
/// which combines it in front of its own.
pub(crate) fn fold_in<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    fold: &Fold,
    buf: &mut [T],
    tmp: &mut [T],
    op: &O,
    algo: u8,
) -> Result<()> {
    let r = c.rank();
    if r < 2 * fold.rem {
        if r % 2 == 0 {
            c.send(r + 1, algo, bytes(buf))?;
        } else {
            let t = &mut tmp[..buf.len()];
            c.recv(r - 1, algo, bytes_mut(t))?;
            op.apply(t, buf);
        }
    }
    Ok(())
}

/// The fold's last step: the odd ranks below `2·rem` send the result to the even ones.
fn fold_out<T: Element>(c: &mut Call, fold: &Fold, buf: &mut [T], algo: u8) -> Result<()> {
    let r = c.rank();
    if r < 2 * fold.rem {
        if r % 2 == 1 {
            c.send(r - 1, algo, bytes(buf))?;
        } else {
            c.recv(r + 1, algo, bytes_mut(buf))?;
        }
    }
    Ok(())
}

/// Recursive doubling on `buf`, which holds a copy of `send`.
///
/// A rank that took no part in the fold sends its first step's vector from `send`, not from
/// `buf`: the bytes are the same, and the partner's single copy (a local rendezvous reads
/// the sender's memory) then leaves `buf` in this core's cache alone, so the combine
/// that writes `buf` right after does not first have to take its lines back from the
/// partner's core. On two ranks that is the whole exchange.
fn recursive_doubling<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    buf: &mut [T],
    op: &O,
) -> Result<()> {
    let a = algo::RECURSIVE_DOUBLING;
    let (r, fold) = (c.rank(), Fold::new(c.size()));
    let mut tmp_s = Scratch::new(std::mem::size_of_val(buf));
    let tmp = tmp_s.slice::<T>(buf.len());
    let mut scratch = Vec::new();
    fold_in(c, &fold, buf, tmp, op, a)?;
    if let Some(nr) = fold.newrank(r) {
        let mut mask = 1;
        while mask < fold.pof2 {
            let partner = fold.rank_of(nr ^ mask);
            let outgoing = if mask == 1 && r >= 2 * fold.rem {
                send
            } else {
                &*buf
            };
            c.sendrecv(partner, bytes(outgoing), partner, bytes_mut(tmp), a)?;
            if partner < r {
                op.apply(tmp, buf);
            } else {
                apply_into_left(op, buf, tmp, &mut scratch);
            }
            mask <<= 1;
        }
    }
    fold_out(c, &fold, buf, a)
}

/// The `p + 1` boundaries (in `T`s) of `n` `T`s split into `p` nearly equal blocks of whole
/// elements of `op` ([`Operation::granularity`]).
fn element_offsets<T: Element, O: Operation<T> + ?Sized>(n: usize, p: usize, op: &O) -> Vec<usize> {
    let g = op.granularity().max(1);
    debug_assert_eq!(
        n % g,
        0,
        "a reduction buffer of {n} T's is not whole elements of {g}"
    );
    balanced_offsets(n / g, p, g)
}

fn rabenseifner<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    buf: &mut [T],
    op: &O,
) -> Result<()> {
    let a = algo::RABENSEIFNER;
    let (r, fold) = (c.rank(), Fold::new(c.size()));
    let n = buf.len();
    let seg = element_offsets(n, fold.pof2, op);
    // The fold needs the whole vector; the halving at most the larger first half.
    let half = seg[fold.pof2 / 2].max(n - seg[fold.pof2 / 2]);
    let need = if r < 2 * fold.rem { n } else { half };
    let mut tmp_s = Scratch::new(need * std::mem::size_of::<T>());
    let tmp = tmp_s.slice::<T>(need);
    fold_in(c, &fold, buf, tmp, op, a)?;
    if let Some(nr) = fold.newrank(r) {
        reduce_scatter::halving(c, &fold, nr, buf, tmp, &seg, op, a)?;
        let unit = std::mem::size_of::<T>();
        let boffs: Vec<usize> = seg.iter().map(|s| s * unit).collect();
        allgather::recursive_doubling_in(
            c,
            bytes_mut(buf),
            &boffs,
            nr,
            fold.pof2,
            |x| fold.rank_of(x),
            a,
        )?;
    }
    fold_out(c, &fold, buf, a)
}

fn ring<T: Element, O: Operation<T> + ?Sized>(c: &mut Call, buf: &mut [T], op: &O) -> Result<()> {
    let a = algo::RING;
    let p = c.size();
    let offs = element_offsets(buf.len(), p, op);
    reduce_scatter::ring_in_place(c, buf, &offs, op, a)?;
    let unit = std::mem::size_of::<T>();
    let boffs: Vec<usize> = offs.iter().map(|s| s * unit).collect();
    allgather::ring(c, bytes_mut(buf), &boffs, None, a)
}

/// Every rank's `send`, combined, into every rank's `out`.
pub(crate) fn allreduce<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    out: &mut [T],
    op: &O,
) -> Result<()> {
    out.copy_from_slice(send);
    let p = c.size();
    if p == 1 {
        return Ok(());
    }
    let bytes = std::mem::size_of_val(send);
    match c
        .g
        .tuning
        .allreduce_algo(bytes, p, op.is_commutative(), c.g.local)
    {
        AllreduceAlgo::Rabenseifner => rabenseifner(c, out, op),
        AllreduceAlgo::Ring => ring(c, out, op),
        _ => recursive_doubling(c, send, out, op),
    }
}
