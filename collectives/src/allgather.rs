//! Allgather and allgatherv.
//!
//! With `n` the bytes gathered in total (each of the `p` ranks contributes `n/p`):
//!
//! - **Recursive doubling** (short, `p` a power of two): in step `k` rank `r` swaps
//!   everything it has (`2^k` blocks) with rank `r XOR 2^k`. Cost:
//!   `log₂ p·α + (p-1)/p·n·β`.
//! - **Bruck** (short, `p` not a power of two; from 5 ranks, where it takes fewer steps
//!   than the ring): in step `k` rank `r` sends the `min(2^k, p - 2^k)` blocks it has to
//!   rank `r - 2^k` and receives as many from rank `r + 2^k`, in an order rotated so that
//!   rank `r`'s own block comes first; one local rotation at the end. Cost:
//!   `⌈log₂ p⌉·α + (p-1)/p·n·β` plus a copy of `n`.
//! - **Ring** (long): in step `s` rank `r` passes the block it received in step `s - 1` on
//!   to `r + 1`. Cost: `(p-1)·α + (p-1)/p·n·β`, each step a neighbour exchange.
//!
//! **Allgatherv** first exchanges, with Bruck's algorithm, 16 bytes per rank: its own count
//! and a fingerprint of the `counts` slice it was given (cost `⌈log₂ p⌉·α`). Every rank
//! then holds the same table, so all of them agree on whether the counts are consistent;
//! if not, all return the same error (naming the rank and counts) without moving data.
//! Then recursive doubling (short, power of two) or the ring moves the blocks.

use crate::call::{algo, bytes, bytes_mut, Call};
use crate::partition::{offsets, split_ref_mut};
use crate::scratch::Scratch;
use crate::tuning::AllgatherAlgo;
use crate::Result;

/// Ring allgather over `buf` whose blocks are `offs[i]..offs[i+1]` (bytes). With
/// `root`, ranks and blocks are relative to the root, and nothing is sent to the root
/// (scatter+allgather broadcast); the caller holds its own block.
pub(crate) fn ring(
    c: &mut Call,
    buf: &mut [u8],
    offs: &[usize],
    root: Option<usize>,
    algo: u8,
) -> Result<()> {
    let p = c.size();
    let base = root.unwrap_or(0);
    let vr = (c.rank() + p - base) % p;
    let real = |v: usize| (v + base) % p;
    let (right, left) = ((vr + 1) % p, (vr + p - 1) % p);
    let sending = !(root.is_some() && right == 0);
    let receiving = !(root.is_some() && vr == 0);
    for s in 0..p - 1 {
        let sb = (vr + p - s) % p;
        let rb = (vr + 2 * p - s - 1) % p;
        let (sr, rr) = (offs[sb]..offs[sb + 1], offs[rb]..offs[rb + 1]);
        match (sending, receiving) {
            (true, true) => {
                let (out, inp) = split_ref_mut(buf, sr, rr);
                c.sendrecv(real(right), out, real(left), inp, algo)?;
            }
            (true, false) => c.send(real(right), algo, &buf[sr])?,
            (false, true) => c.recv(real(left), algo, &mut buf[rr])?,
            (false, false) => {}
        }
    }
    Ok(())
}

/// Recursive-doubling allgather among `members` group members (a power of two), this rank
/// being member `me`; member `i` is rank `rank_of(i)` and owns bytes `offs[i]..offs[i+1]`.
pub(crate) fn recursive_doubling_in(
    c: &mut Call,
    buf: &mut [u8],
    offs: &[usize],
    me: usize,
    members: usize,
    rank_of: impl Fn(usize) -> usize,
    algo: u8,
) -> Result<()> {
    let mut mask = 1;
    while mask < members {
        let partner = me ^ mask;
        let mine = me & !(mask - 1);
        let theirs = partner & !(mask - 1);
        let (out, inp) = split_ref_mut(
            buf,
            offs[mine]..offs[mine + mask],
            offs[theirs]..offs[theirs + mask],
        );
        let peer = rank_of(partner);
        c.sendrecv(peer, out, peer, inp, algo)?;
        mask <<= 1;
    }
    Ok(())
}

/// Bruck's allgather of equal blocks: `send` is this rank's, `recv` gets all `p`.
pub(crate) fn bruck(c: &mut Call, send: &[u8], recv: &mut [u8], algo: u8) -> Result<()> {
    let (r, p, m) = (c.rank(), c.size(), send.len());
    let mut tmp_s = Scratch::new(p * m);
    let tmp = tmp_s.slice::<u8>(p * m);
    tmp[..m].copy_from_slice(send);
    let mut pow = 1;
    while pow < p {
        let cnt = pow.min(p - pow);
        let (dst, src) = ((r + p - pow) % p, (r + pow) % p);
        let (out, inp) = split_ref_mut(tmp, 0..cnt * m, pow * m..(pow + cnt) * m);
        c.sendrecv(dst, out, src, inp, algo)?;
        pow <<= 1;
    }
    for i in 0..p {
        let j = (r + i) % p;
        recv[j * m..(j + 1) * m].copy_from_slice(&tmp[i * m..(i + 1) * m]);
    }
    Ok(())
}

/// Allgather: `recv` (`p` times `send`'s length) gets every rank's `send` in rank order.
pub(crate) fn allgather(c: &mut Call, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (r, p, m) = (c.rank(), c.size(), send.len());
    recv[r * m..(r + 1) * m].copy_from_slice(send);
    if p == 1 {
        return Ok(());
    }
    let offs: Vec<usize> = (0..=p).map(|i| i * m).collect();
    match c.g.tuning.allgather_algo(p * m, p) {
        AllgatherAlgo::RecursiveDoubling => recursive_doubling_in(
            c,
            recv,
            &offs,
            r,
            p,
            |x| x,
            algo::ALLGATHER_RECURSIVE_DOUBLING,
        ),
        AllgatherAlgo::Bruck => bruck(c, send, recv, algo::BRUCK),
        _ => ring(c, recv, &offs, None, algo::ALLGATHER_RING),
    }
}

/// A fingerprint of a counts slice (FNV-1a over its length and values).
pub(crate) fn fingerprint(counts: &[usize]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in std::iter::once(counts.len()).chain(counts.iter().copied()) {
        for b in (v as u64).to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Every rank's view of the counts agrees, and every rank's contribution matches it?
/// Runs on every rank with the same table, so every rank reaches the same verdict.
/// Returns the mismatch message, worded for rank `me`.
pub(crate) fn check_counts(
    table: &[u64],
    counts: &[usize],
    me: usize,
    what: &str,
) -> Option<String> {
    let p = table.len() / 2;
    let fp = |j: usize| table[2 * j + 1];
    if let Some(j) = (0..p).find(|&j| fp(j) != fp(0)) {
        let other = if fp(me) != fp(0) { 0 } else { j };
        return Some(format!(
            "the ranks pass different {what}: rank {me}'s ({counts:?}) differ from rank \
             {other}'s; every rank must pass the same {what}"
        ));
    }
    (0..p)
        .find(|&j| table[2 * j] as usize != counts[j])
        .map(|j| {
            format!(
                "rank {j} contributes {} elements but rank {me} expects {} ({what}[{j}])",
                table[2 * j],
                counts[j]
            )
        })
}

/// Allgatherv: `recv` gets rank `j`'s `counts[j]` elements (of `unit` bytes) at the sum
/// of the counts before it.
pub(crate) fn allgatherv(
    c: &mut Call,
    send: &[u8],
    recv: &mut [u8],
    counts: &[usize],
    unit: usize,
) -> Result<()> {
    let (r, p) = (c.rank(), c.size());
    let mine = [(send.len() / unit) as u64, fingerprint(counts)];
    let mut table = vec![0u64; 2 * p];
    if p == 1 {
        table.copy_from_slice(&mine);
    } else {
        bruck(c, bytes(&mine), bytes_mut(&mut table), algo::COUNT_CHECK)?;
    }
    if let Some(msg) = check_counts(&table, counts, r, "counts") {
        // Every rank found the same: nobody moves data.
        c.mismatch(msg);
        return Ok(());
    }
    let offs = offsets(counts, unit);
    recv[offs[r]..offs[r + 1]].copy_from_slice(send);
    if p == 1 {
        return Ok(());
    }
    match c.g.tuning.allgather_algo(offs[p], p) {
        AllgatherAlgo::RecursiveDoubling => recursive_doubling_in(
            c,
            recv,
            &offs,
            r,
            p,
            |x| x,
            algo::ALLGATHER_RECURSIVE_DOUBLING,
        ),
        _ => ring(c, recv, &offs, None, algo::ALLGATHER_RING),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_checks_agree_and_name_ranks() {
        let counts = [4usize, 4, 5];
        let fp = fingerprint(&counts);
        let good = [4, fp, 4, fp, 5, fp];
        assert_eq!(check_counts(&good, &counts, 1, "counts"), None);
        // Rank 2 contributes 6 where everyone expects 5.
        let bad = [4, fp, 4, fp, 6, fp];
        let m = check_counts(&bad, &counts, 0, "counts").unwrap();
        assert_eq!(
            m,
            "rank 2 contributes 6 elements but rank 0 expects 5 (counts[2])"
        );
        // Rank 1 passes other counts: everyone finds the slices differ.
        let other = fingerprint(&[4, 4, 6]);
        let split = [4, fp, 4, other, 5, fp];
        for me in 0..3 {
            let m = check_counts(&split, &counts, me, "counts").unwrap();
            assert!(m.contains("different counts"), "{m}");
        }
        assert_ne!(fingerprint(&[1, 2]), fingerprint(&[2, 1]));
        assert_ne!(fingerprint(&[0]), fingerprint(&[0, 0]));
    }
}
