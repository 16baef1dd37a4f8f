//! Eviction policies: which unused registration goes first when the cache needs room.
//!
//! Only unused entries (no lease outstanding) are candidates: an entry enters the eviction
//! order when its last lease is released and leaves it when it is leased again, so an entry
//! in use by an in-flight transfer cannot be chosen, by construction (as in UCX's rcache,
//! whose LRU list holds only unreferenced regions).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use lru::LruCache;

use crate::error::{Error, Result};
use crate::interval::EntryId;

/// The eviction policy, chosen at construction (`PAGEWIRE_PINDOWN_POLICY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// `lru`: evict the entry whose last lease was released longest ago (the default).
    #[default]
    Lru,
    /// `lfu`: evict the entry leased fewest times since it was registered; ties go to the
    /// least recently used. Counts never decay, so a once-hot buffer can outstay its use.
    Lfu,
    /// `fifo`: evict the entry registered longest ago, however often it was hit since.
    Fifo,
    /// `size`: GreedyDual-Size with a cost of one registration per entry: evict the lowest
    /// `L + 1/pages`, where `L` (the clock) becomes the victim's value at each eviction and an
    /// entry's value is refreshed when it is leased. Large entries go first (one
    /// deregistration frees the most bytes, and re-registering costs one call whatever the
    /// size, beyond the per-page pinning that any policy pays), but values age, so a large
    /// hot buffer is not evicted before small ones that went cold long ago.
    SizeAware,
}

impl Policy {
    /// Every policy, in the order of [`Policy::name`]'s documentation.
    pub const ALL: [Policy; 4] = [Policy::Lru, Policy::Lfu, Policy::Fifo, Policy::SizeAware];

    /// The name `PAGEWIRE_PINDOWN_POLICY` uses: `lru`, `lfu`, `fifo` or `size`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::Fifo => "fifo",
            Policy::SizeAware => "size",
        }
    }

    /// Reads `PAGEWIRE_PINDOWN_POLICY` (unset or empty: [`Policy::Lru`]).
    pub fn from_env() -> Result<Policy> {
        Policy::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Policy::from_env`], reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Policy> {
        match lookup("PAGEWIRE_PINDOWN_POLICY") {
            None => Ok(Policy::default()),
            Some(v) if v.trim().is_empty() => Ok(Policy::default()),
            Some(v) => v.parse(),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = Error;

    /// `lru`, `lfu`, `fifo` or `size` (also `size-aware` and `gds`), any case.
    fn from_str(s: &str) -> Result<Policy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu),
            "fifo" => Ok(Policy::Fifo),
            "size" | "size-aware" | "gds" => Ok(Policy::SizeAware),
            _ => Err(Error::Config {
                variable: "PAGEWIRE_PINDOWN_POLICY".into(),
                value: s.into(),
                accepted: "expected lru, lfu, fifo or size".into(),
            }),
        }
    }
}

/// What the policies know about an entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct UseStats {
    /// Logical time of registration.
    pub inserted: u64,
    /// Logical time of the last acquire or release.
    pub last_used: u64,
    /// Leases taken since registration.
    pub uses: u64,
    /// Pages covered (at least 1).
    pub pages: u64,
    /// GreedyDual-Size value `H`.
    pub gds: u64,
}

/// The GreedyDual-Size cost of one registration, in fixed point (an entry of `n` pages is
/// worth `GDS_COST / n` above the clock).
const GDS_COST: u64 = 1 << 32;

/// The unused entries of the cache, in eviction order.
#[derive(Debug)]
pub(crate) struct EvictionOrder {
    policy: Policy,
    /// LRU: the unbounded `lru` list of idle entries with their bytes.
    lru: LruCache<EntryId, u64>,
    /// Other policies: idle entries ordered by (key, tie-break, id) ...
    keyed: BTreeSet<(u64, u64, EntryId)>,
    /// ... and each one's key and bytes, to remove it by id.
    keys: HashMap<EntryId, ((u64, u64), u64)>,
    /// GreedyDual-Size clock `L`.
    clock: u64,
    idle_bytes: u64,
}

impl EvictionOrder {
    pub(crate) fn new(policy: Policy) -> Self {
        EvictionOrder {
            policy,
            lru: LruCache::unbounded(),
            keyed: BTreeSet::new(),
            keys: HashMap::new(),
            clock: 0,
            idle_bytes: 0,
        }
    }

    /// A new entry was registered at `tick` (and is in use).
    pub(crate) fn registered(&mut self, s: &mut UseStats, tick: u64) {
        s.inserted = tick;
        s.last_used = tick;
        s.uses = 1;
        s.gds = self.gds_value(s.pages);
    }

    /// An entry was leased again (a hit) at `tick`.
    pub(crate) fn used(&mut self, s: &mut UseStats, tick: u64) {
        s.last_used = tick;
        s.uses += 1;
        s.gds = self.gds_value(s.pages);
    }

    fn gds_value(&self, pages: u64) -> u64 {
        self.clock.saturating_add(GDS_COST / pages.max(1))
    }

    fn key(&self, s: &UseStats) -> (u64, u64) {
        match self.policy {
            Policy::Lru => (s.last_used, 0),
            Policy::Lfu => (s.uses, s.last_used),
            Policy::Fifo => (s.inserted, 0),
            Policy::SizeAware => (s.gds, s.last_used),
        }
    }

    /// The entry became unused: it is now a candidate.
    pub(crate) fn push_idle(&mut self, id: EntryId, s: &UseStats, bytes: u64) {
        self.idle_bytes += bytes;
        if self.policy == Policy::Lru {
            let old = self.lru.push(id, bytes);
            debug_assert!(old.is_none());
        } else {
            let key = self.key(s);
            self.keyed.insert((key.0, key.1, id));
            let old = self.keys.insert(id, (key, bytes));
            debug_assert!(old.is_none());
        }
    }

    /// The entry is no longer a candidate (leased again, invalidated, merged). Returns
    /// whether it was one.
    pub(crate) fn remove_idle(&mut self, id: EntryId) -> bool {
        let bytes = if self.policy == Policy::Lru {
            self.lru.pop(&id)
        } else {
            self.keys.remove(&id).map(|(key, bytes)| {
                self.keyed.remove(&(key.0, key.1, id));
                bytes
            })
        };
        match bytes {
            Some(b) => {
                self.idle_bytes -= b;
                true
            }
            None => false,
        }
    }

    /// Takes the policy's victim out of the order.
    pub(crate) fn pop_victim(&mut self) -> Option<EntryId> {
        let (id, bytes) = if self.policy == Policy::Lru {
            self.lru.pop_lru()?
        } else {
            let (k0, _, id) = self.keyed.pop_first()?;
            let (_, bytes) = self.keys.remove(&id).expect("keyed entries have keys");
            if self.policy == Policy::SizeAware {
                self.clock = self.clock.max(k0);
            }
            (id, bytes)
        };
        self.idle_bytes -= bytes;
        Some(id)
    }

    /// Bytes of the unused entries.
    pub(crate) fn idle_bytes(&self) -> u64 {
        self.idle_bytes
    }

    /// Number of unused entries.
    pub(crate) fn idle_entries(&self) -> usize {
        if self.policy == Policy::Lru {
            self.lru.len()
        } else {
            self.keys.len()
        }
    }

    /// Whether `id` is a candidate.
    #[cfg(test)]
    pub(crate) fn contains(&self, id: EntryId) -> bool {
        if self.policy == Policy::Lru {
            self.lru.contains(&id)
        } else {
            self.keys.contains_key(&id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
            assert_eq!(p.to_string().to_uppercase().parse::<Policy>().unwrap(), p);
        }
        assert_eq!("size-aware".parse::<Policy>().unwrap(), Policy::SizeAware);
        assert_eq!(" gds ".parse::<Policy>().unwrap(), Policy::SizeAware);
        let e = "mru".parse::<Policy>().unwrap_err();
        assert!(
            e.to_string().contains("expected lru, lfu, fifo or size"),
            "{e}"
        );
    }

    #[test]
    fn from_lookup_defaults_to_lru() {
        assert_eq!(Policy::from_lookup(|_| None).unwrap(), Policy::Lru);
        assert_eq!(
            Policy::from_lookup(|_| Some("".into())).unwrap(),
            Policy::Lru
        );
        assert_eq!(
            Policy::from_lookup(|k| (k == "PAGEWIRE_PINDOWN_POLICY").then(|| "fifo".into()))
                .unwrap(),
            Policy::Fifo
        );
        assert!(Policy::from_lookup(|_| Some("x".into())).is_err());
    }

    #[test]
    fn order_tracks_idle_bytes_and_removal() {
        for p in Policy::ALL {
            let mut o = EvictionOrder::new(p);
            let mut stats = [UseStats {
                pages: 1,
                ..UseStats::default()
            }; 3];
            for (i, s) in stats.iter_mut().enumerate() {
                o.registered(s, i as u64);
            }
            for (i, s) in stats.iter().enumerate() {
                o.push_idle(i as u64, s, 4096 * (i as u64 + 1));
            }
            assert_eq!(o.idle_entries(), 3);
            assert_eq!(o.idle_bytes(), 4096 * 6);
            assert!(o.remove_idle(1));
            assert!(!o.remove_idle(1));
            assert_eq!(o.idle_bytes(), 4096 * 4);
            let mut victims = Vec::new();
            while let Some(v) = o.pop_victim() {
                victims.push(v);
            }
            victims.sort();
            assert_eq!(victims, vec![0, 2], "{p}");
            assert_eq!(o.idle_bytes(), 0);
            assert_eq!(o.idle_entries(), 0);
        }
    }
}
