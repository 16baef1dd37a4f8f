//! A bounded translation cache: the NIC's view of its translation and protection table
//! through a cache of N entries (`PAGEWIRE_SOFT_TPT_CACHE=N`, off by
//! default), after Azimi03 ("dynamic handle lookup"): the
//! tables stay in host memory, the NIC keeps a cache of them in its own small memory, and
//! a lookup that misses
//! - raises a *miss interrupt*: the request is filed in a miss slot of the cache's owner
//!   and its driver thread (the interrupt-handler analogue, as for a responder page fault)
//!   takes it up, reads the entry from the host table (the TPT) and fills the cache;
//! - *drops the request*: nothing of it moves, and the initiator retransmits it (section IV
//!   A (ii): "dropping a request is simple and requires no NIC memory. However, it incurs
//!   the retransmission overhead"). A miss on the initiator's own memory (its
//!   scatter-gather list) holds the request until its own driver has filled the entry; a
//!   miss at the target is retransmitted when the initiator's retransmission timer fires
//!   (the engine's, 200 µs: the seed's NIC has no negative acknowledgement), again every
//!   period until the fill is done.
//!
//! **Costs.** A hit costs nothing modelled. A miss costs its real delay (the owner's driver
//! thread woken by a futex, or the owner's next poll) plus a *modelled* processing time
//! drawn from the seed's figure: "the miss processing time incurs high variations, within
//! the 5-500µs range" (section V C). The seed gives the range, not the distribution: we
//! draw log-uniformly (each decade as likely; an assumption), median 50 µs, mean 107 µs.
//! The counters keep the real wait and the modelled time apart
//! ([`pagewire_nic::tpt_cache_counters::TptCacheCounters`]).
//!
//! **Granularity: one entry per memory key** (a region's base, length and rights, one TPT
//! entry). The seed caches two kinds of handle: communication buffer handles (CBH: "used by
//! the receiving NIC to obtain protection information about a buffer") and virtual memory
//! handles (VMH: one page's physical address, in lines of 8–128 pages). The soft NIC's
//! table holds only the first kind — an entry per key — and the page translation of its
//! DMA is the kernel's page walk inside `process_vm_readv`/`writev`, not a table of ours, so
//! there is no page table to cache; an entry per page would model a structure the soft NIC
//! does not have. A region is then the "line": one fill covers all its pages, as the seed's
//! large lines prefetch. The consequence: a job that registers one region for everything
//! (implicit ODP) never misses after the first lookup, and the misses come from the number
//! of regions a job uses at once (pin-down buffers, `-off_cache`), as the seed's CBH misses.
//!
//! **Structure.** The seed's cache is set-associative with LRU in each set, and it finds 4
//! ways the best compromise (section V C); so is this one: `N / 4` sets of 4 ways (fewer
//! than 4 entries: one fully associative set). It lives in the owner's shared segment, not
//! in a process-local map (such as the `lru` crate's), because on the CMA path the
//! initiator's engine plays the target NIC's part and must look up the target's cache.
//! Lookups from any process update an approximate LRU clock with plain loads and stores;
//! only the owner's driver fills (one at a time), and the owner evicts a key when it
//! deregisters it.
//!
//! **Progress.** Each key of a request is looked up once per request (the engine remembers
//! which it has translated), and a request retransmitted after a fill proceeds with the
//! entry it waited for even if another request evicted it meanwhile: a request that needs
//! more entries than the cache has (many SGEs, a 1-entry cache) still completes, one fill
//! per key, instead of evicting its own entries for ever.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::time::Duration;

use super::layout::{NPF_ADDR, NPF_DONE, NPF_REQ, NPF_STATUS, NPF_TIME};
use super::npf_model::wait_for;
use super::{Inner, MAX_QPS};
use pagewire_sys as sys;
use pagewire_sys::error::{Error, Result};

/// The most entries a cache may have: the seed's largest VMH cache (32K entries, Table
/// III), and room reserved in every rank's segment (16 bytes an entry).
pub(crate) const MAX_ENTRIES: usize = 32 << 10;
/// Ways per set (the seed's best associativity, section V C).
pub(crate) const WAYS: usize = 4;
/// The seed's range of miss processing time, µs (section V C).
const PROCESSING_US: (f64, f64) = (5.0, 500.0);

const ENTRIES: usize = 0;
const WAYS_WORD: usize = 1;
const CLOCK: usize = 2;
const HITS: usize = 3;
const MISSES: usize = 4;
/// Misses filed in the owner's slots (the driver's "is there work" word).
const FILED: usize = 5;
const HEADER_WORDS: usize = 8;
/// Words of a cache: the header, then `(tag, last use)` per entry.
pub(crate) const CACHE_WORDS: usize = HEADER_WORDS + 2 * MAX_ENTRIES;
/// In a tag word: the entry holds a key (the key is the low 32 bits).
const VALID: u64 = 1 << 32;

/// Which side of a queue pair a miss was filed for (a slot each, in the owner's segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MissSide {
    /// The initiator's own scatter-gather list (the seed's send path).
    Requester,
    /// The target's key or receive buffers (the seed's receive path).
    Responder,
}

/// Miss slots per rank: one per queue pair and side.
pub(crate) const MISS_SLOTS: usize = 2 * MAX_QPS;

/// The index of the miss slot of `qpn` on `side`.
pub(crate) fn miss_slot_index(qpn: u32, side: MissSide) -> usize {
    2 * (qpn as usize % MAX_QPS) + (side == MissSide::Responder) as usize
}

/// Reads `PAGEWIRE_SOFT_TPT_CACHE`: unset, empty, `off` or `0` is off (the NIC reads its
/// table directly, at no modelled cost); otherwise the number of entries.
pub(crate) fn parse_entries(value: Option<&str>) -> Result<usize> {
    let v = value.map(str::trim).unwrap_or("");
    if v.is_empty() || v == "off" {
        return Ok(0);
    }
    match v.parse::<usize>() {
        Ok(n) if n <= MAX_ENTRIES && (n < WAYS || n % WAYS == 0) => Ok(n),
        _ => Err(Error::invalid_setting(
            "PAGEWIRE_SOFT_TPT_CACHE",
            v,
            format!(
                "expected off or a number of entries: 0 (off), 1 to {}, or a multiple of {WAYS} \
                 up to {MAX_ENTRIES} ({WAYS}-way sets)",
                WAYS - 1
            ),
        )),
    }
}

/// One rank's translation cache, in its shared segment: written by the owner, looked up by
/// every engine that checks the owner's keys.
#[derive(Clone, Copy)]
pub(crate) struct TranslationCache<'a> {
    w: &'a [AtomicU64],
}

impl<'a> TranslationCache<'a> {
    /// The cache over `words` ([`CACHE_WORDS`] of them).
    pub(crate) fn new(w: &'a [AtomicU64]) -> TranslationCache<'a> {
        assert_eq!(w.len(), CACHE_WORDS);
        TranslationCache { w }
    }

    /// Owner, before anyone looks: `entries` entries (0: off).
    pub(crate) fn configure(&self, entries: usize) {
        let entries = entries.min(MAX_ENTRIES);
        self.w[WAYS_WORD].store(entries.clamp(1, WAYS) as u64, Relaxed);
        self.w[ENTRIES].store(entries as u64, Release);
    }

    /// `(entries, ways)`, or `None` when the cache is off — or its header is not one the
    /// owner could have written (the segment is shared with peers that may be hostile).
    fn shape(&self) -> Option<(usize, usize)> {
        let entries = self.w[ENTRIES].load(Acquire) as usize;
        let ways = self.w[WAYS_WORD].load(Relaxed) as usize;
        (entries > 0 && entries <= MAX_ENTRIES && (1..=WAYS).contains(&ways) && entries % ways == 0)
            .then_some((entries, ways))
    }

    /// Entries of the cache (0: off).
    pub(crate) fn entries(&self) -> usize {
        self.shape().map_or(0, |(n, _)| n)
    }

    /// The words of `key`'s set: the index of its first tag, and its ways.
    fn set_of(&self, key: u32, (entries, ways): (usize, usize)) -> (usize, usize) {
        let sets = entries / ways;
        let hash = (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        let set = hash as usize % sets;
        (HEADER_WORDS + 2 * set * ways, ways)
    }

    /// Marks the entry at tag word `at` used now.
    fn touch(&self, at: usize) {
        let t = self.w[CLOCK].load(Relaxed) + 1;
        self.w[CLOCK].store(t, Relaxed);
        self.w[at + 1].store(t, Relaxed);
    }

    /// Whether `key` is cached (counting a hit and refreshing its entry if so; a miss is
    /// not counted). True when the cache is off.
    pub(crate) fn probe(&self, key: u32) -> bool {
        let Some(shape) = self.shape() else {
            return true;
        };
        let (first, ways) = self.set_of(key, shape);
        let want = key as u64 | VALID;
        for at in (first..first + 2 * ways).step_by(2) {
            if self.w[at].load(Acquire) == want {
                self.touch(at);
                self.w[HITS].fetch_add(1, Relaxed);
                return true;
            }
        }
        false
    }

    /// A lookup of `key`: true on a hit (or with the cache off); a miss is counted.
    pub(crate) fn lookup(&self, key: u32) -> bool {
        let hit = self.probe(key);
        if !hit {
            self.w[MISSES].fetch_add(1, Relaxed);
        }
        hit
    }

    /// Owner's driver: puts `key` in its set, in place of the least recently used entry.
    pub(crate) fn fill(&self, key: u32) {
        let Some(shape) = self.shape() else {
            return;
        };
        let (first, ways) = self.set_of(key, shape);
        let want = key as u64 | VALID;
        let mut victim = first;
        for at in (first..first + 2 * ways).step_by(2) {
            let tag = self.w[at].load(Relaxed);
            if tag == want {
                victim = at;
                break;
            }
            let free = |a: usize| self.w[a].load(Relaxed) & VALID == 0;
            if free(victim) {
                continue;
            }
            if free(at) || self.w[at + 1].load(Relaxed) < self.w[victim + 1].load(Relaxed) {
                victim = at;
            }
        }
        self.touch(victim);
        self.w[victim].store(want, Release);
    }

    /// Owner: `key` is gone (deregistered); its entry is freed.
    pub(crate) fn evict(&self, key: u32) {
        let Some(shape) = self.shape() else {
            return;
        };
        let (first, ways) = self.set_of(key, shape);
        let want = key as u64 | VALID;
        for at in (first..first + 2 * ways).step_by(2) {
            let _ = self.w[at].compare_exchange(want, 0, SeqCst, Relaxed);
        }
    }

    /// Lookups that hit and missed so far.
    pub(crate) fn hits_and_misses(&self) -> (u64, u64) {
        (self.w[HITS].load(Relaxed), self.w[MISSES].load(Relaxed))
    }

    /// The word counting misses filed in the owner's slots.
    pub(crate) fn filed_word(&self) -> &'a AtomicU64 {
        &self.w[FILED]
    }
}

/// The modelled processing time of one miss at cumulative probability `u` (0..1), in µs:
/// log-uniform over the seed's 5–500 µs.
fn processing_us(u: f64) -> f64 {
    let (lo, hi) = PROCESSING_US;
    lo * (hi / lo).powf(u.clamp(0.0, 1.0))
}

/// One line for reports: what the cache charges (`entries` > 0).
pub(crate) fn describe(entries: usize) -> String {
    format!(
        "tpt-cache: {entries} entries ({}-way, LRU, one per key); a miss drops the request, the \
         driver thread fills the entry (real wake-up + modelled 5-500 us processing, Azimi03) \
         and the initiator retransmits",
        entries.clamp(1, WAYS)
    )
}

impl Inner {
    /// The driver's miss handler: fills every miss filed in this rank's slots, after the
    /// modelled processing time. Cheap when none is pending; one thread serves at a time.
    pub(crate) fn serve_translation_misses(&self) {
        let cache = self.own.tpt_cache();
        let filed = cache.filed_word().load(Acquire);
        if self.misses_served.load(Acquire) == filed {
            return;
        }
        let Some(_serving) = self.serving_misses.try_lock() else {
            return;
        };
        let filed = cache.filed_word().load(Acquire);
        self.misses_served.store(filed, SeqCst);
        for i in 0..MISS_SLOTS {
            let slot = self.own.miss_slot_at(i);
            let req = slot.w[NPF_REQ].load(Acquire);
            if req == slot.w[NPF_DONE].load(Relaxed) {
                continue;
            }
            let key = slot.w[NPF_ADDR].load(Relaxed) as u32;
            let taken = sys::monotonic_ns();
            let wait_ns = taken.saturating_sub(slot.w[NPF_TIME].load(Relaxed));
            let us = processing_us(rand::random::<f64>());
            let model_ns = wait_for(Duration::from_nanos((us * 1000.0) as u64));
            // The host table has the entry, or the key was deregistered meanwhile: then
            // nothing is cached and the retransmission fails its key check.
            if self.own.tpt().lookup(key).is_some() {
                cache.fill(key);
            }
            self.counters.tpt_cache.record_fill(wait_ns, model_ns);
            slot.w[NPF_STATUS].store(0, Relaxed);
            slot.w[NPF_DONE].store(req, Release);
        }
    }

    /// Whether a miss filed on this rank waits to be served.
    pub(super) fn misses_waiting(&self) -> bool {
        self.own.tpt_cache().filed_word().load(Acquire) != self.misses_served.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> Vec<AtomicU64> {
        (0..CACHE_WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn sizes_parse_and_bad_ones_say_what_is_accepted() {
        assert_eq!(parse_entries(None).unwrap(), 0);
        assert_eq!(parse_entries(Some("")).unwrap(), 0);
        assert_eq!(parse_entries(Some("off")).unwrap(), 0);
        assert_eq!(parse_entries(Some(" 64 ")).unwrap(), 64);
        assert_eq!(parse_entries(Some("2")).unwrap(), 2);
        assert_eq!(parse_entries(Some("32768")).unwrap(), 32768);
        for bad in ["lots", "-1", "6", "32772", "1e3"] {
            let e = parse_entries(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("PAGEWIRE_SOFT_TPT_CACHE") && e.contains(bad) && e.contains("multiple"),
                "{e}"
            );
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn off_always_hits_and_counts_nothing() {
        let w = words();
        let c = TranslationCache::new(&w);
        assert_eq!(c.entries(), 0);
        assert!(c.lookup(7));
        c.fill(7);
        assert_eq!(c.hits_and_misses(), (0, 0));
    }

    #[test]
    fn a_two_entry_cache_keeps_the_two_most_recently_used_keys() {
        let w = words();
        let c = TranslationCache::new(&w);
        c.configure(2);
        assert_eq!(c.entries(), 2);
        let mut trace = String::new();
        for key in [1, 2, 1, 2, 3, 1, 1, 2] {
            if c.lookup(key) {
                trace.push('h');
            } else {
                trace.push('m');
                c.fill(key);
            }
        }
        // 3 evicts 1 (2 was used after it), then 1 evicts 2.
        assert_eq!(trace, "mmhhmmhm");
        assert_eq!(c.hits_and_misses(), (3, 5));
        c.evict(1);
        assert!(!c.probe(1), "an evicted key misses");
        assert_eq!(c.hits_and_misses(), (3, 5), "a probe counts no miss");
    }

    #[test]
    fn a_set_associative_cache_holds_its_working_set_and_no_more() {
        let w = words();
        let c = TranslationCache::new(&w);
        c.configure(64);
        let keys: Vec<u32> = (0..48u32).map(|i| i | (i * 7 + 1) << 12).collect();
        for &k in &keys {
            assert!(!c.lookup(k));
            c.fill(k);
        }
        // 48 keys over 16 sets of 4: cached unless a set got more than 4 of them.
        let held = keys.iter().filter(|&&k| c.probe(k)).count();
        assert!(held >= 40, "{held} of 48 keys held");
        let many: Vec<u32> = (0..1000u32).map(|i| i + 5000).collect();
        for &k in &many {
            c.fill(k);
        }
        let held = many.iter().filter(|&&k| c.probe(k)).count();
        assert_eq!(held, 64, "never more than the entries");
    }

    #[test]
    fn garbled_headers_turn_the_cache_off() {
        let w = words();
        let c = TranslationCache::new(&w);
        c.configure(8);
        w[WAYS_WORD].store(3, Relaxed); // 8 entries are not sets of 3
        assert_eq!(c.entries(), 0);
        w[WAYS_WORD].store(4, Relaxed);
        w[ENTRIES].store(u64::MAX, Relaxed);
        assert_eq!(c.entries(), 0);
    }

    #[test]
    fn the_modelled_processing_time_spans_the_seeds_range_log_uniformly() {
        assert_eq!(processing_us(0.0), 5.0);
        assert!((processing_us(1.0) - 500.0).abs() < 1e-9);
        assert!((processing_us(0.5) - 50.0).abs() < 1e-9);
        assert_eq!(processing_us(-3.0), 5.0);
        assert_eq!(miss_slot_index(3, MissSide::Requester), 6);
        assert_eq!(miss_slot_index(3, MissSide::Responder), 7);
    }
}
