//! The host-MPI backend's reductions that are more than one call of [`HostMpi`]: a reduction
//! MPI does not define (a user operation, a logical operation on floats, 128-bit integers,
//! minimum and maximum of unsigned integers: see [`reduces_natively`]) moves the
//! contributions with MPI (allgather, gather or alltoall(v)) and combines them here in rank
//! order, so every reduction the facade offers works on this backend.

use pagewire_collectives::{Element, Op, Operation};

use super::reduction::reduces_natively;
use super::HostMpi;
use crate::datatype::Count;
use crate::error::{Error, Result};
use crate::ErrorClass;

/// The predefined operation to hand to MPI, if MPI defines `op` on `T`s.
fn native<T: Element, O: Operation<T>>(op: &O) -> Option<Op> {
    op.predefined().filter(|&p| reduces_natively::<T>(p))
}

/// `out = b_0 ∘ b_1 ∘ … ∘ b_(k-1)` over the `n`-element blocks of `blocks`, in rank
/// order (folded from the right: `op.apply(left, right)` sets `right = left ∘ right`).
fn combine<T: Element, O: Operation<T>>(op: &O, blocks: &[T], n: usize, out: &mut [T]) {
    if n == 0 {
        return;
    }
    let k = blocks.len() / n;
    out.copy_from_slice(&blocks[(k - 1) * n..k * n]);
    for j in (0..k - 1).rev() {
        op.apply(&blocks[j * n..(j + 1) * n], out);
    }
}

fn expect_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::invalid(
            ErrorClass::Count,
            format!("{what} has {got} elements, expected {want}"),
        ))
    }
}

/// `MPI_Allreduce` with `op`.
pub(super) fn all_reduce<T: Element, O: Operation<T>>(
    h: &HostMpi,
    send: &[T],
    recv: &mut [T],
    op: &O,
) -> Result<()> {
    op.check()?;
    if let Some(p) = native::<T, O>(op) {
        return h.all_reduce(send, recv, p);
    }
    expect_len("all_reduce: recv", recv.len(), send.len())?;
    let mut all = vec![T::zeroed(); send.len() * h.size()];
    h.all_gather(send, &mut all)?;
    combine(op, &all, send.len(), recv);
    Ok(())
}

/// `MPI_Reduce` with `op` to `root`, which passes `recv`.
pub(super) fn reduce<T: Element, O: Operation<T>>(
    h: &HostMpi,
    root: usize,
    send: &[T],
    recv: Option<&mut [T]>,
    op: &O,
) -> Result<()> {
    op.check()?;
    if let Some(p) = native::<T, O>(op) {
        return h.reduce(root, send, recv, p);
    }
    match recv {
        Some(recv) => {
            expect_len("reduce: recv", recv.len(), send.len())?;
            let mut all = vec![T::zeroed(); send.len() * h.size()];
            h.gather(root, send, Some(&mut all))?;
            combine(op, &all, send.len(), recv);
            Ok(())
        }
        None => h.gather(root, send, None),
    }
}

/// `MPI_Scan` with `op`.
pub(super) fn scan<T: Element, O: Operation<T>>(
    h: &HostMpi,
    send: &[T],
    recv: &mut [T],
    op: &O,
) -> Result<()> {
    op.check()?;
    if let Some(p) = native::<T, O>(op) {
        return h.scan(send, recv, p);
    }
    expect_len("scan: recv", recv.len(), send.len())?;
    let n = send.len();
    let mut all = vec![T::zeroed(); n * h.size()];
    h.all_gather(send, &mut all)?;
    combine(op, &all[..n * (h.rank() + 1)], n, recv);
    Ok(())
}

/// `MPI_Reduce_scatter_block` with `op`.
pub(super) fn reduce_scatter_block<T: Element, O: Operation<T>>(
    h: &HostMpi,
    send: &[T],
    recv: &mut [T],
    op: &O,
) -> Result<()> {
    op.check()?;
    if let Some(p) = native::<T, O>(op) {
        return h.reduce_scatter_block(send, recv, p);
    }
    let m = recv.len();
    expect_len("reduce_scatter_block: send", send.len(), m * h.size())?;
    // Block j of every rank's send to rank j, then combined.
    let mut mine = vec![T::zeroed(); m * h.size()];
    h.all_to_all(send, &mut mine)?;
    combine(op, &mine, m, recv);
    Ok(())
}

/// `MPI_Reduce_scatter` with `op`, `counts[j]` elements to rank `j`.
pub(super) fn reduce_scatter<T: Element, O: Operation<T>>(
    h: &HostMpi,
    send: &[T],
    recv: &mut [T],
    counts: &[Count],
    op: &O,
) -> Result<()> {
    op.check()?;
    if let Some(p) = native::<T, O>(op) {
        return h.reduce_scatter(send, recv, counts, p);
    }
    let mine = *counts.get(h.rank()).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "reduce_scatter: {} counts for {} ranks",
            counts.len(),
            h.size()
        ))
    })?;
    let m = usize::try_from(mine).map_err(|_| {
        Error::invalid(
            ErrorClass::Count,
            format!("negative count {mine} in {counts:?}"),
        )
    })?;
    expect_len("reduce_scatter: recv", recv.len(), m)?;
    // Block j (counts[j] elements) of every rank's send to rank j, then combined.
    let mut blocks = vec![T::zeroed(); m * h.size()];
    h.all_to_all_varcount(send, counts, &mut blocks, &vec![mine; h.size()])?;
    combine(op, &blocks, m, recv);
    Ok(())
}
