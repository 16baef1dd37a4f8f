//! Barrier.
//!
//! **Dissemination barrier** (Hensgen, Finkel and Manber 1988): in round `k` rank `r`
//! signals rank `(r + 2^k) mod p` and waits for rank `(r - 2^k) mod p`, for
//! `k = 0 .. ⌈log₂ p⌉ - 1`. After round `k` a rank has heard, directly or through others,
//! from the `2^(k+1) - 1` ranks below it, so after the last round from all of them. Works
//! for any `p` with no extra step. Cost: `⌈log₂ p⌉·α` (zero-byte messages).

use crate::call::{algo, Call};
use crate::Result;

pub(crate) fn dissemination(c: &mut Call) -> Result<()> {
    let (r, p) = (c.rank(), c.size());
    let mut d = 1;
    while d < p {
        c.sendrecv(
            (r + d) % p,
            &[],
            (r + p - d) % p,
            &mut [],
            algo::DISSEMINATION,
        )?;
        d <<= 1;
    }
    Ok(())
}
