//! Gather and scatter (equal blocks of `m` bytes per rank), gatherv and scatterv.
//!
//! - **Binomial gather**: over root-relative ranks, every rank collects its subtree's
//!   blocks (its own, then each child's subtree, nearest child first) into one contiguous
//!   buffer and sends it to its parent; the root rotates the result into rank order when
//!   it is not rank 0. Cost: `⌈log₂ p⌉·α + (p-1)·m·β` (the root receives `p - 1` blocks,
//!   in `⌈log₂ p⌉` messages instead of `p - 1`).
//! - **Binomial scatter**: the reverse; every rank receives its subtree's blocks from its
//!   parent and hands each child its subtree's part, largest subtree first. Same cost.
//! - **Linear gatherv / scatterv**: the root receives from (sends to) every rank in turn.
//!   Cost: `(p-1)·α + Σ m_j·β`. With counts that differ per rank a tree would move blocks
//!   several times for no gain in the bandwidth term at the root, which dominates.
//!
//! Counts are checked where the data arrives: a block whose length differs from what the
//! receiver expects is reported with the ranks and counts (see [`crate::call`]).

use crate::call::{algo, Call};
use crate::partition::Binomial;
use crate::scratch::Scratch;
use crate::Result;

/// Gather `send` (`m` bytes) of every rank into `recv` (`p·m`) at `root`.
pub(crate) fn gather(
    c: &mut Call,
    send: &[u8],
    recv: Option<&mut [u8]>,
    root: usize,
) -> Result<()> {
    let a = algo::GATHER_BINOMIAL;
    let (p, m) = (c.size(), send.len());
    let vr = (c.rank() + p - root) % p;
    let real = |v: usize| (v + root) % p;
    let t = Binomial { p, vr };
    let sub = t.subtree_size();
    match (t.parent(), recv) {
        (Some(parent), _) if sub == 1 => c.send(real(parent), a, send),
        (None, Some(out)) if root == 0 => collect(c, &t, root, send, out),
        (None, Some(out)) => {
            let mut rel_s = Scratch::new(p * m);
            let rel = rel_s.slice::<u8>(p * m);
            collect(c, &t, root, send, rel)?;
            // `rel` is in root-relative order; `out` wants rank order.
            for v in 0..p {
                let j = real(v);
                out[j * m..(j + 1) * m].copy_from_slice(&rel[v * m..(v + 1) * m]);
            }
            Ok(())
        }
        (None, None) => unreachable!("the root passes a receive buffer"),
        (Some(parent), _) => {
            let mut tmp_s = Scratch::new(sub * m);
            let tmp = tmp_s.slice::<u8>(sub * m);
            collect(c, &t, root, send, tmp)?;
            c.send(real(parent), a, tmp)
        }
    }
}

/// Puts `send` then each child's subtree blocks into `tmp` (the subtree's blocks in
/// relative order).
fn collect(c: &mut Call, t: &Binomial, root: usize, send: &[u8], tmp: &mut [u8]) -> Result<()> {
    let a = algo::GATHER_BINOMIAL;
    let (r, p, m) = (c.rank(), t.p, send.len());
    tmp[..m].copy_from_slice(send);
    for (child, mask) in t.children() {
        let csub = Binomial::subtree_of(p, child);
        let who = (child + root) % p;
        let describe = |got: &str, want: &str| {
            if csub == 1 {
                format!(
                    "rank {who} contributes {got} but rank {r} expects {want}: every rank \
                     must contribute the same count"
                )
            } else {
                format!(
                    "rank {who} sent {got} for the {csub} ranks of its subtree where rank \
                     {r} expects {want}: every rank must contribute the same count"
                )
            }
        };
        c.recv_with(
            who,
            Some(a),
            &mut tmp[mask * m..(mask + csub) * m],
            Some(&describe),
        )?;
    }
    Ok(())
}

/// Scatter `send` (`p·m` bytes, at `root`) so that every rank's `recv` (`m`) gets its block.
pub(crate) fn scatter(
    c: &mut Call,
    send: Option<&[u8]>,
    recv: &mut [u8],
    root: usize,
) -> Result<()> {
    let a = algo::SCATTER_BINOMIAL;
    let (r, p, m) = (c.rank(), c.size(), recv.len());
    let vr = (r + p - root) % p;
    let real = |v: usize| (v + root) % p;
    let t = Binomial { p, vr };
    let sub = t.subtree_size();
    let mut hold = None;
    let data: &[u8] = match t.parent() {
        None => {
            let send = send.expect("the root passes the data");
            if root == 0 {
                send
            } else {
                let rel = hold.insert(Scratch::new(p * m)).slice::<u8>(p * m);
                for v in 0..p {
                    let j = real(v);
                    rel[v * m..(v + 1) * m].copy_from_slice(&send[j * m..(j + 1) * m]);
                }
                rel
            }
        }
        Some(parent) => {
            let describe = |got: &str, want: &str| {
                format!(
                    "rank {} sent {got} for the {sub} ranks of rank {r}'s subtree, which expects {want}: every rank must pass the root's count",
                    real(parent)
                )
            };
            if sub == 1 {
                c.recv_with(real(parent), Some(a), recv, Some(&describe))?;
                return Ok(());
            }
            let v = hold.insert(Scratch::new(sub * m)).slice::<u8>(sub * m);
            c.recv_with(real(parent), Some(a), v, Some(&describe))?;
            v
        }
    };
    for &(child, mask) in t.children().iter().rev() {
        let csub = Binomial::subtree_of(p, child);
        c.send(real(child), a, &data[mask * m..(mask + csub) * m])?;
    }
    recv.copy_from_slice(&data[..m]);
    Ok(())
}

/// Linear gatherv: rank `j`'s `send` lands at `offs[j]..offs[j+1]` (bytes) of the root's
/// buffer.
pub(crate) fn gatherv(
    c: &mut Call,
    send: &[u8],
    root_part: Option<(&mut [u8], &[usize])>,
    root: usize,
    a: u8,
) -> Result<()> {
    let r = c.rank();
    let Some((recv, offs)) = root_part.filter(|_| r == root) else {
        return c.send(root, a, send);
    };
    let p = c.size();
    for j in 0..p {
        let block = &mut recv[offs[j]..offs[j + 1]];
        if j == r {
            if block.len() == send.len() {
                block.copy_from_slice(send);
            } else {
                let (g, w) = (c.amount(send.len()), c.amount(block.len()));
                c.mismatch(format!(
                    "the root (rank {r}) contributes {g} but its counts[{r}] says {w}"
                ));
            }
            continue;
        }
        let describe = |got: &str, want: &str| {
            format!(
                "rank {j} contributes {got} but the root (rank {r}) expects {want} (counts[{j}])"
            )
        };
        c.recv_with(j, Some(a), block, Some(&describe))?;
    }
    Ok(())
}

/// Linear scatterv: rank `j` gets `offs[j]..offs[j+1]` (bytes) of the root's buffer.
pub(crate) fn scatterv(
    c: &mut Call,
    root_part: Option<(&[u8], &[usize])>,
    recv: &mut [u8],
    root: usize,
    a: u8,
) -> Result<()> {
    let r = c.rank();
    let Some((send, offs)) = root_part.filter(|_| r == root) else {
        let describe = |got: &str, want: &str| {
            format!("the root (rank {root}) sends {got} to rank {r}, which expects {want}")
        };
        c.recv_with(root, Some(a), recv, Some(&describe))?;
        return Ok(());
    };
    let p = c.size();
    for j in 0..p {
        let block = &send[offs[j]..offs[j + 1]];
        if j == r {
            if block.len() == recv.len() {
                recv.copy_from_slice(block);
            } else {
                let (g, w) = (c.amount(block.len()), c.amount(recv.len()));
                c.mismatch(format!(
                    "the root (rank {r}) sends itself {g} (counts[{r}]) but receives {w}"
                ));
            }
            continue;
        }
        c.send(j, a, block)?;
    }
    Ok(())
}
