//! Reduce.
//!
//! **Binomial tree**: over root-relative ranks, every rank receives the partial results of
//! its children in the binomial tree (nearest first), combines them into its own, and sends
//! the result to its parent. Cost: `⌈log₂ p⌉·(α + n·β + n·γ)` (γ: time to combine a byte).
//!
//! The root-relative tree reorders operands when the root is not rank 0, so it runs for
//! commutative operations only. A non-commutative operation gets the **rank-ordered
//! binomial reduce**: the same tree rooted at rank 0 over the ranks themselves, where
//! rank `r` always holds the combination of the contiguous ranks `r .. r + 2^k` and
//! combines it with the next run on its right, so the result is
//! `x_0 ∘ x_1 ∘ … ∘ x_{p-1}`; rank 0 then sends it to the root if that is another rank.
//! Cost: `⌈log₂ p⌉·(α + n·β + n·γ)`, plus `α + n·β` when the root is not 0.

use crate::call::{algo, bytes, bytes_mut, Call};
use crate::element::Element;
use crate::op::{apply_into_left, Operation};
use crate::partition::Binomial;
use crate::scratch::Scratch;
use crate::Result;

/// The binomial reduction of `send` towards `root` (relative ranks), with the tree root's
/// result in `out` (which must be `Some` there). `out` is ignored elsewhere.
pub(crate) fn tree<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    out: Option<&mut [T]>,
    op: &O,
    root: usize,
    algo: u8,
) -> Result<()> {
    let p = c.size();
    let vr = (c.rank() + p - root) % p;
    let real = |v: usize| (v + root) % p;
    let t = Binomial { p, vr };
    let children = t.children();
    if children.is_empty() {
        if let Some(parent) = t.parent() {
            return c.send(real(parent), algo, bytes(send));
        }
    }
    let n = send.len();
    let mut own;
    let acc: &mut [T] = match out {
        Some(o) if vr == 0 => o,
        _ => {
            own = Scratch::new(std::mem::size_of_val(send));
            own.slice(n)
        }
    };
    acc.copy_from_slice(send);
    let mut tmp_s = Scratch::new(std::mem::size_of_val(send));
    let tmp = tmp_s.slice::<T>(n);
    let mut scratch = Vec::new();
    for (child, _) in children {
        c.recv(real(child), algo, bytes_mut(tmp))?;
        // `acc` holds ranks vr .. child, the child the run right after it.
        apply_into_left(op, acc, tmp, &mut scratch);
    }
    if let Some(parent) = t.parent() {
        c.send(real(parent), algo, bytes(acc))?;
    }
    Ok(())
}

/// Reduce `send` of every rank into `out` at `root`.
pub(crate) fn reduce<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    out: Option<&mut [T]>,
    op: &O,
    root: usize,
) -> Result<()> {
    if c.size() == 1 {
        if let Some(o) = out {
            o.copy_from_slice(send);
        }
        return Ok(());
    }
    if op.is_commutative() {
        return tree(c, send, out, op, root, algo::REDUCE_BINOMIAL);
    }
    let me = c.rank();
    if root == 0 {
        return tree(c, send, out, op, 0, algo::REDUCE_ORDERED);
    }
    if me == 0 {
        let mut s = Scratch::new(std::mem::size_of_val(send));
        let result = s.slice::<T>(send.len());
        tree(c, send, Some(&mut *result), op, 0, algo::REDUCE_ORDERED)?;
        c.send(root, algo::REDUCE_ORDERED, bytes(result))
    } else {
        tree(c, send, None, op, 0, algo::REDUCE_ORDERED)?;
        match out {
            Some(o) if me == root => c.recv(0, algo::REDUCE_ORDERED, bytes_mut(o)),
            _ => Ok(()),
        }
    }
}
