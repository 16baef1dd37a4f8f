//! Alltoall and alltoallv.
//!
//! **Pairwise exchange**: in step `s = 1 .. p-1` rank `r` sends its block for rank
//! `(r + s) mod p` and receives the block of rank `(r - s) mod p`, one `sendrecv` per step,
//! so every rank sends and receives exactly one message at a time and no link is
//! oversubscribed; the own block is copied. Cost: `(p-1)·(α + m·β)` for blocks of `m`
//! bytes (alltoallv: `(p-1)·α + max(Σ sent, Σ received)·β`). Bruck's alltoall (`⌈log₂ p⌉`
//! messages, each carrying `p/2` blocks) would win for tiny blocks on many ranks; it is
//! not implemented (see the crate documentation).
//!
//! Counts are checked by the receiver of each block.

use crate::call::{algo, Call};
use crate::Result;

/// Rank `j`'s block of `send` is `soffs[j]..soffs[j+1]`; the block from rank `j` lands at
/// `roffs[j]..roffs[j+1]` of `recv` (bytes). `v` words messages for alltoallv.
pub(crate) fn pairwise(
    c: &mut Call,
    send: &[u8],
    soffs: &[usize],
    recv: &mut [u8],
    roffs: &[usize],
    v: bool,
) -> Result<()> {
    let a = algo::PAIRWISE;
    let (r, p) = (c.rank(), c.size());
    let (own_s, own_r) = (soffs[r]..soffs[r + 1], roffs[r]..roffs[r + 1]);
    if own_s.len() == own_r.len() {
        recv[own_r].copy_from_slice(&send[own_s]);
    } else {
        let (g, w) = (c.amount(own_s.len()), c.amount(own_r.len()));
        c.mismatch(format!(
            "rank {r} sends itself {g} (send_counts[{r}]) but expects {w} (recv_counts[{r}])"
        ));
    }
    for s in 1..p {
        let (dst, src) = ((r + s) % p, (r + p - s) % p);
        let describe = |got: &str, want: &str| {
            if v {
                format!(
                    "rank {src} sends {got} to rank {r}, which expects {want} (recv_counts[{src}] \
                     on rank {r} must equal send_counts[{r}] on rank {src})"
                )
            } else {
                format!(
                    "rank {src} sends {got} per block to rank {r}, which expects {want}: every \
                     rank must pass the same count"
                )
            }
        };
        c.sendrecv_with(
            dst,
            &send[soffs[dst]..soffs[dst + 1]],
            src,
            &mut recv[roffs[src]..roffs[src + 1]],
            a,
            Some(&describe),
        )?;
    }
    Ok(())
}
