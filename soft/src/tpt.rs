//! The translation and protection table (TPT): each rank's memory-region table, kept in its
//! shared segment so that peers' NIC engines check every RDMA access against it before a
//! byte moves (docs/architecture.md; Azimi03: the NIC's tables live in host memory).
//!
//! An entry is written only by its owner under a sequence lock and read by anyone. A key is
//! `index | tag << INDEX_BITS`. An entry's first tag is random and non-zero, and each
//! registration after it takes the next one (as an HCA's memory key has an index and a
//! variant part that advances); an entry whose tags have all been issued is never used again.
//! So a key never comes back within a job, and a recycled (stale) key always fails (issue
//! 15, item 5), after up to 4,096 x (2^20 - 1) registrations.
//! Readers doing DMA hold an in-use count that deregistration waits on, as `ibv_dereg_mr`
//! waits for the HCA to stop using a region; every byte moved into or out of a region is
//! moved under such a hold, packet by packet on the staged path. An engine
//! holding an entry of another rank's table also says so in a *claim* word of its own
//! segment, so that the owner can tell a live holder (waited for, however long) from the
//! count left behind by one that died mid-DMA (whose entry is retired).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::time::{Duration, Instant};

use pagewire_nic::Access;

/// Entries per table.
pub(crate) const MAX_MRS: usize = 4096;
const INDEX_BITS: u32 = 12;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// 64-bit words per entry.
pub(crate) const ENTRY_WORDS: usize = 8;
/// Bytes of the whole table.
pub(crate) const TPT_BYTES: usize = MAX_MRS * ENTRY_WORDS * 8;
/// Highest user address + 1 (x86-64 and aarch64 with 4-level tables: 47 bits).
pub(crate) const ADDRESS_SPACE_END: u64 = 1 << 47;

const SEQ: usize = 0;
const KEY: usize = 1;
const BASE: usize = 2;
const LEN: usize = 3;
const ACCESS: usize = 4;
const INUSE: usize = 5;
const ALIAS: usize = 6;
/// The tag of the entry's first key (0: the entry was never used), and [`RETIRED`]. Owner
/// only.
const FIRST_TAG: usize = 7;
/// In the `FIRST_TAG` word: the entry issues no more keys (its tags ran out, or a holder died
/// with its in-use count raised).
const RETIRED: u64 = 1 << 32;
/// How long an update of an entry may stay in progress before its writer is taken as gone.
/// An owner descheduled mid-update on a loaded host resumes well within it.
const WRITER_GONE_AFTER: Duration = Duration::from_secs(2);
/// Tags are `1..TAG_LIMIT`.
const TAG_LIMIT: u32 = 1 << (32 - INDEX_BITS);

/// What a key translates to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Translation {
    pub key: u32,
    pub base: u64,
    pub len: u64,
    pub access: Access,
    /// Where the region's bytes are, when that is no longer its range: the copy of the
    /// pinned pages of a region whose range the application unmapped or replaced (0: the
    /// range itself). The owner's address space, like `base`.
    pub alias: u64,
}

impl Translation {
    /// The address DMA uses for `addr` (inside the region): `addr` itself, or its place in
    /// the copy of the pages the region is bound to.
    #[inline]
    pub(crate) fn dma_addr(&self, addr: u64) -> u64 {
        if self.alias == 0 {
            addr
        } else {
            self.alias + (addr - self.base)
        }
    }

    /// Whether the application no longer maps the pages this region is bound to.
    #[inline]
    pub(crate) fn detached(&self) -> bool {
        self.alias != 0
    }

    /// Whether the region pins nothing and maps pages by faults.
    pub(crate) fn on_demand(&self) -> bool {
        self.access.contains(Access::ON_DEMAND)
    }
}

/// Why an access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No live region has this key (never issued, deregistered, or recycled).
    UnknownKey,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region lacks the access right.
    NoAccess,
}

/// A view of one rank's table.
#[derive(Clone, Copy)]
pub(crate) struct Tpt<'a> {
    words: &'a [AtomicU64],
}

/// Proof that the region stays live while DMA runs; dropping it releases the in-use count
/// (and then the holder's claim, if it made one).
pub(crate) struct InUse<'a> {
    count: &'a AtomicU64,
    claim: Option<&'a AtomicU64>,
    pub translation: Translation,
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        release(self.count, self.claim);
    }
}

/// Ends a hold: the count first, so that an owner who finds no claim finds no live count.
fn release(count: &AtomicU64, claim: Option<&AtomicU64>) {
    count.fetch_sub(1, SeqCst);
    if let Some(c) = claim {
        c.store(0, SeqCst);
    }
}

/// What an engine writes in its claim word while it holds entry `key` of rank `owner`'s table.
pub(crate) fn claim_tag(owner: usize, key: u32) -> u64 {
    1 << 63 | (owner as u64) << 32 | key as u64
}

impl<'a> Tpt<'a> {
    /// The table over `words` (`MAX_MRS * ENTRY_WORDS` of them).
    pub(crate) fn new(words: &'a [AtomicU64]) -> Tpt<'a> {
        assert_eq!(words.len(), MAX_MRS * ENTRY_WORDS);
        Tpt { words }
    }

    fn entry(&self, index: usize) -> &'a [AtomicU64] {
        &self.words[index * ENTRY_WORDS..(index + 1) * ENTRY_WORDS]
    }

    /// Owner: the next key of entry `index`, never issued before by this entry; `None` once
    /// the entry has issued every tag (it is then retired).
    pub(crate) fn fresh_key(&self, index: usize) -> Option<u32> {
        let e = self.entry(index);
        let word = e[FIRST_TAG].load(Relaxed);
        if word & RETIRED != 0 {
            return None;
        }
        let first = word as u32;
        let tag = if first == 0 {
            rand::random::<u32>() % (TAG_LIMIT - 1) + 1
        } else {
            let old = e[KEY].load(Relaxed) as u32 >> INDEX_BITS;
            let next = if old + 1 >= TAG_LIMIT { 1 } else { old + 1 };
            if next == first {
                e[FIRST_TAG].store(word | RETIRED, Relaxed);
                return None;
            }
            next
        };
        Some(index as u32 | tag << INDEX_BITS)
    }

    /// Owner: makes `t` visible to every NIC engine.
    pub(crate) fn publish(&self, t: Translation) {
        let e = self.entry((t.key & INDEX_MASK) as usize);
        if e[FIRST_TAG].load(Relaxed) == 0 {
            e[FIRST_TAG].store((t.key >> INDEX_BITS) as u64, Relaxed);
        }
        let seq = e[SEQ].load(Relaxed);
        e[SEQ].store(seq + 1, Relaxed);
        std::sync::atomic::fence(Release);
        e[BASE].store(t.base, Relaxed);
        e[LEN].store(t.len, Relaxed);
        e[ACCESS].store(t.access.bits() as u64, Relaxed);
        e[ALIAS].store(t.alias, Relaxed);
        e[KEY].store(t.key as u64, Relaxed);
        e[SEQ].store(seq + 2, Release);
    }

    /// Owner: invalidates `key`: no access through it starts after this returns. Accesses
    /// already under way keep their hold until they end ([`Tpt::in_use`]).
    pub(crate) fn invalidate(&self, key: u32) {
        let e = self.entry((key & INDEX_MASK) as usize);
        let seq = e[SEQ].load(Relaxed);
        e[SEQ].store(seq + 1, Relaxed);
        // Keep the tag in KEY's high bits' history for `fresh_key`, but mark it dead.
        e[KEY].store((key as u64) | 1 << 40, SeqCst);
        e[SEQ].store(seq + 2, SeqCst);
    }

    /// How many engines hold `key`'s entry now.
    pub(crate) fn in_use(&self, key: u32) -> u64 {
        self.entry((key & INDEX_MASK) as usize)[INUSE].load(SeqCst)
    }

    /// Owner: `key`'s entry issues no more keys (its in-use count was left raised by a
    /// holder that died, so it can no longer tell when the entry is free).
    pub(crate) fn retire(&self, key: u32) {
        let w = &self.entry((key & INDEX_MASK) as usize)[FIRST_TAG];
        w.store(w.load(Relaxed) | RETIRED, Relaxed);
    }

    /// Anyone: what `key` translates to, if it is live.
    ///
    /// An entry whose owner died in the middle of an update stays odd for ever: after
    /// [`WRITER_GONE_AFTER`] the key is taken as unknown instead of spinning on.
    pub(crate) fn lookup(&self, key: u32) -> Option<Translation> {
        let e = self.entry((key & INDEX_MASK) as usize);
        let mut spins = 0u32;
        let mut odd_since: Option<Instant> = None;
        loop {
            let s1 = e[SEQ].load(Acquire);
            if s1 & 1 == 1 {
                spins = spins.wrapping_add(1);
                if spins % 1024 == 0 {
                    let since = *odd_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > WRITER_GONE_AFTER {
                        return None;
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            let k = e[KEY].load(Relaxed);
            let t = Translation {
                key: k as u32,
                base: e[BASE].load(Relaxed),
                len: e[LEN].load(Relaxed),
                access: Access::from_bits_truncate(e[ACCESS].load(Relaxed) as u32),
                alias: e[ALIAS].load(Relaxed),
            };
            std::sync::atomic::fence(Acquire);
            if e[SEQ].load(Relaxed) != s1 {
                continue;
            }
            return (k == key as u64 && key != 0).then_some(t);
        }
    }

    /// Anyone about to DMA: checks `[addr, addr+len)` against `key` with rights `need` and
    /// pins the entry against deregistration until the returned guard drops.
    pub(crate) fn acquire(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<InUse<'a>, Refusal> {
        self.hold(key, addr, len, need, None)
    }

    /// [`Tpt::acquire`] by an engine of another rank, which first writes `claim_tag(owner,
    /// key)` into `claim` (a word of its own segment) and clears it when the hold ends.
    pub(crate) fn acquire_claimed(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
        claim: (&'a AtomicU64, u64),
    ) -> Result<InUse<'a>, Refusal> {
        claim.0.store(claim.1, SeqCst);
        self.hold(key, addr, len, need, Some(claim.0))
    }

    fn hold(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
        claim: Option<&'a AtomicU64>,
    ) -> Result<InUse<'a>, Refusal> {
        let e = self.entry((key & INDEX_MASK) as usize);
        e[INUSE].fetch_add(1, SeqCst);
        let Some(translation) = self.lookup(key) else {
            release(&e[INUSE], claim);
            return Err(Refusal::UnknownKey);
        };
        let g = InUse {
            count: &e[INUSE],
            claim,
            translation,
        };
        check(&translation, addr, len, need)?;
        Ok(g)
    }
}

/// Checks bounds and rights of an access against a translation.
pub(crate) fn check(t: &Translation, addr: u64, len: u64, need: Access) -> Result<(), Refusal> {
    let end = addr.checked_add(len).ok_or(Refusal::OutOfBounds)?;
    // The table lives in shared memory: a garbled entry must not wrap.
    let region_end = t.base.checked_add(t.len).ok_or(Refusal::OutOfBounds)?;
    if addr < t.base || end > region_end {
        return Err(Refusal::OutOfBounds);
    }
    if !t.access.contains(need) {
        return Err(Refusal::NoAccess);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<AtomicU64> {
        (0..MAX_MRS * ENTRY_WORDS)
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    /// A region bound to its own range.
    fn region(key: u32, base: u64, len: u64, access: Access) -> Translation {
        Translation {
            key,
            base,
            len,
            access,
            alias: 0,
        }
    }

    /// Invalidates `key` and checks that nothing holds it.
    fn revoke(tpt: &Tpt<'_>, key: u32) {
        tpt.invalidate(key);
        assert_eq!(tpt.in_use(key), 0);
    }

    #[test]
    fn live_key_checks_bounds_and_rights() {
        let w = table();
        let tpt = Tpt::new(&w);
        let key = tpt.fresh_key(5).expect("an unused entry");
        tpt.publish(region(
            key,
            0x1000,
            0x2000,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        ));
        assert!(tpt
            .acquire(key, 0x1000, 0x2000, Access::REMOTE_READ)
            .is_ok());
        assert_eq!(
            tpt.acquire(key, 0x2fff, 2, Access::REMOTE_READ).err(),
            Some(Refusal::OutOfBounds)
        );
        assert_eq!(
            tpt.acquire(key, 0x1000, 8, Access::REMOTE_WRITE).err(),
            Some(Refusal::NoAccess)
        );
        assert_eq!(
            tpt.acquire(key, u64::MAX, 2, Access::NONE).err(),
            Some(Refusal::OutOfBounds)
        );
    }

    #[test]
    fn revoked_and_recycled_keys_fail() {
        let w = table();
        let tpt = Tpt::new(&w);
        let old = tpt.fresh_key(7).expect("an unused entry");
        let t = region(old, 0, 4096, Access::REMOTE_WRITE);
        tpt.publish(t);
        revoke(&tpt, old);
        assert_eq!(tpt.lookup(old), None);
        let new = tpt.fresh_key(7).expect("an unused entry");
        assert_ne!(new, old, "same slot, new tag");
        tpt.publish(Translation { key: new, ..t });
        assert_eq!(
            tpt.lookup(old),
            None,
            "stale key rejected after reuse of the entry"
        );
        assert!(tpt.lookup(new).is_some());
        assert_eq!(tpt.lookup(new ^ (1 << 20)), None, "a guessed tag fails");
        assert_eq!(tpt.lookup(0), None);
    }

    #[test]
    fn an_entry_never_issues_a_key_twice_and_retires_when_out_of_tags() {
        let w = table();
        let tpt = Tpt::new(&w);
        let mut seen = vec![false; TAG_LIMIT as usize];
        let mut issued = 0u32;
        while let Some(key) = tpt.fresh_key(3) {
            assert_eq!(key & INDEX_MASK, 3);
            let tag = (key >> INDEX_BITS) as usize;
            assert!(tag != 0 && !seen[tag], "tag {tag} issued twice");
            seen[tag] = true;
            issued += 1;
            let t = region(key, 0, 4096, Access::REMOTE_READ);
            tpt.publish(t);
            revoke(&tpt, key);
        }
        assert_eq!(issued, TAG_LIMIT - 1, "every non-zero tag, once");
        assert!(tpt.fresh_key(4).is_some(), "other entries are unaffected");
    }

    #[test]
    fn an_update_left_half_done_by_a_dead_owner_refuses_the_key_instead_of_spinning() {
        let w = table();
        let tpt = Tpt::new(&w);
        let key = tpt.fresh_key(9).expect("an unused entry");
        tpt.publish(region(key, 0, 4096, Access::REMOTE_READ));
        assert!(tpt.lookup(key).is_some());
        // The owner died between the two stores of an update: the sequence stays odd.
        w[9 * ENTRY_WORDS + SEQ].fetch_add(1, SeqCst);
        let t0 = Instant::now();
        assert_eq!(tpt.lookup(key), None);
        assert!(t0.elapsed() >= WRITER_GONE_AFTER);
    }

    #[test]
    fn an_invalidated_key_stays_in_use_until_its_dma_ends() {
        let w = table();
        let tpt = Tpt::new(&w);
        let key = tpt.fresh_key(1).expect("an unused entry");
        tpt.publish(region(key, 0, 4096, Access::REMOTE_READ));
        let g = tpt.acquire(key, 0, 8, Access::REMOTE_READ).unwrap();
        tpt.invalidate(key);
        assert_eq!(tpt.in_use(key), 1, "still in use");
        assert!(tpt.acquire(key, 0, 8, Access::REMOTE_READ).is_err());
        assert_eq!(tpt.in_use(key), 1, "a refused access holds nothing");
        drop(g);
        assert_eq!(tpt.in_use(key), 0);
    }

    #[test]
    fn a_detached_region_translates_into_its_copy() {
        let w = table();
        let tpt = Tpt::new(&w);
        let key = tpt.fresh_key(2).expect("an unused entry");
        let t = region(key, 0x10_0100, 8192, Access::LOCAL_WRITE);
        tpt.publish(t);
        let bound = tpt.lookup(key).unwrap();
        assert!(!bound.detached());
        assert_eq!(bound.dma_addr(0x10_0200), 0x10_0200);
        tpt.publish(Translation {
            alias: 0x7000_0100,
            ..t
        });
        let moved = tpt.lookup(key).unwrap();
        assert!(moved.detached());
        assert_eq!(moved.dma_addr(0x10_0200), 0x7000_0200);
    }

    #[test]
    fn a_claimed_hold_is_visible_to_the_owner_until_it_ends() {
        let w = table();
        let tpt = Tpt::new(&w);
        let key = tpt.fresh_key(6).expect("an unused entry");
        tpt.publish(region(key, 0, 4096, Access::REMOTE_WRITE));
        let claim = AtomicU64::new(0);
        let tag = claim_tag(3, key);
        let g = tpt
            .acquire_claimed(key, 0, 64, Access::REMOTE_WRITE, (&claim, tag))
            .unwrap();
        assert_eq!(claim.load(SeqCst), tag);
        assert_eq!(tpt.in_use(key), 1);
        drop(g);
        assert_eq!((claim.load(SeqCst), tpt.in_use(key)), (0, 0));
        // A refused claimed access leaves neither a count nor a claim.
        assert!(tpt
            .acquire_claimed(key, 4000, 200, Access::REMOTE_WRITE, (&claim, tag))
            .is_err());
        assert_eq!((claim.load(SeqCst), tpt.in_use(key)), (0, 0));
    }

    #[test]
    fn a_retired_entry_issues_no_more_keys() {
        let w = table();
        let tpt = Tpt::new(&w);
        let key = tpt.fresh_key(8).expect("an unused entry");
        tpt.publish(region(key, 0, 4096, Access::REMOTE_READ));
        tpt.invalidate(key);
        tpt.retire(key);
        assert_eq!(tpt.fresh_key(8), None);
        assert!(tpt.fresh_key(9).is_some());
    }
}
