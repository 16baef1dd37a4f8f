//! Broadcast.
//!
//! - **Binomial tree** (short messages): the root sends the whole message to its children
//!   in the binomial tree over root-relative ranks, largest subtree first; every rank
//!   forwards what it received. Cost: `⌈log₂ p⌉·(α + n·β)`.
//! - **Scatter + allgather** (van de Geijn; long messages on 5 ranks or more by default):
//!   the message is cut into `p` blocks; a binomial *scatter* along the same tree hands
//!   every rank its block (each rank receives its subtree's blocks and passes them on),
//!   then a ring allgather gives every rank every block (the root, which has them all,
//!   only sends). Cost: `(⌈log₂ p⌉ + p - 1)·α + 2·(p-1)/p·n·β`: the bandwidth term no
//!   longer grows with `log p`.
//!
//! Non-roots learn the algorithm from the tag of the message their parent sends them (the
//! two algorithms use the same tree edges in the same order), so a count that differs from
//! the root's is reported as a mismatch and the broadcast still completes on every rank.

use crate::allgather;
use crate::call::{algo, Call};
use crate::partition::{balanced_offsets, Binomial};
use crate::tuning::BcastAlgo;
use crate::Result;

pub(crate) fn bcast(c: &mut Call, buf: &mut [u8], root: usize) -> Result<()> {
    let p = c.size();
    if p == 1 {
        return Ok(());
    }
    let vr = (c.rank() + p - root) % p;
    let real = |v: usize| (v + root) % p;
    let tree = Binomial { p, vr };
    let n = buf.len();
    let mine = match c.g.tuning.bcast_algo(n, p) {
        BcastAlgo::ScatterAllgather => algo::BCAST_SCATTER_ALLGATHER,
        _ => algo::BCAST_BINOMIAL,
    };
    // The scatter's blocks (the binomial tree sends the whole message: no offsets).
    let scatter = |a: u8| a == algo::BCAST_SCATTER_ALLGATHER;
    let mut offs = if scatter(mine) {
        balanced_offsets(n, p, 1)
    } else {
        Vec::new()
    };
    let range_of = |offs: &[usize], a: u8, v: usize| {
        if scatter(a) {
            offs[v]..offs[v + Binomial::subtree_of(p, v)]
        } else {
            0..n
        }
    };
    let mut run = mine;
    if let Some(parent) = tree.parent() {
        let got = c.recv_with(
            real(parent),
            None,
            &mut buf[range_of(&offs, mine, vr)],
            None,
        )?;
        if got.algo != mine
            && (got.algo == algo::BCAST_BINOMIAL || got.algo == algo::BCAST_SCATTER_ALLGATHER)
        {
            // The root's choice wins so every rank runs the same schedule.
            c.mismatch(format!(
                "the root (rank {root}) runs {} but rank {} chose {} for {}: the ranks' counts \
                 (or their PAGEWIRE_BCAST_* settings) differ",
                algo::name(got.algo),
                c.rank(),
                algo::name(mine),
                c.amount(n)
            ));
            run = got.algo;
            if scatter(run) {
                offs = balanced_offsets(n, p, 1);
            }
        }
    }
    for &(child, _) in tree.children().iter().rev() {
        c.send(real(child), run, &buf[range_of(&offs, run, child)])?;
    }
    if scatter(run) {
        allgather::ring(c, buf, &offs, Some(root), run)?;
    }
    Ok(())
}
