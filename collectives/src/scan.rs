//! Inclusive scan.
//!
//! **Recursive doubling** (Hillis and Steele 1986): in step `k`, with `d = 2^k`, rank `r`
//! sends its running value to `r + d` and combines the value of `r - d` in front of its
//! own. Before step `k` rank `r` holds `x_{r-d+1} ∘ … ∘ x_r`; the value from `r - d` covers
//! the run just below, so operands stay in rank order and non-commutative operations are
//! correct. Cost: `⌈log₂ p⌉·(α + n·β + n·γ)`.

use crate::call::{algo, bytes, bytes_mut, Call};
use crate::element::Element;
use crate::op::Operation;
use crate::scratch::Scratch;
use crate::Result;

pub(crate) fn scan<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    out: &mut [T],
    op: &O,
) -> Result<()> {
    let (r, p) = (c.rank(), c.size());
    out.copy_from_slice(send);
    let mut tmp_s = Scratch::new(std::mem::size_of_val(send));
    let tmp = tmp_s.slice::<T>(send.len());
    let a = algo::SCAN_RECURSIVE_DOUBLING;
    let mut d = 1;
    while d < p {
        let (up, down) = (r + d < p, r >= d);
        match (up, down) {
            (true, true) => {
                c.sendrecv(r + d, bytes(out), r - d, bytes_mut(tmp), a)?;
                op.apply(tmp, out);
            }
            (true, false) => c.send(r + d, a, bytes(out))?,
            (false, true) => {
                c.recv(r - d, a, bytes_mut(tmp))?;
                op.apply(tmp, out);
            }
            (false, false) => {}
        }
        d <<= 1;
    }
    Ok(())
}
