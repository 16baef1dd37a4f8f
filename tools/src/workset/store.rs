//! The item store's bookkeeping: which key lives in which slot, and which item to evict
//! (least recently used), as memcached's LRU does (Lesokhin17 §6.1: "memcached is an LRU
//! cache, and so its hit rate is affected by its size").
//!
//! The bytes live elsewhere (an anonymous or a file mapping, `slot * item_size` bytes in);
//! this type only decides where.

use lru::LruCache;

/// An LRU map from item keys to the slots of a store of `capacity` fixed-size items.
#[derive(Debug)]
pub struct ItemStore {
    lru: LruCache<u64, usize>,
    free: Vec<usize>,
    capacity: usize,
    evictions: u64,
}

impl ItemStore {
    /// An empty store of `capacity` slots (at least one).
    pub fn new(capacity: usize) -> ItemStore {
        let capacity = capacity.max(1);
        ItemStore {
            lru: LruCache::unbounded(),
            // Slot 0 is handed out first.
            free: (0..capacity).rev().collect(),
            capacity,
            evictions: 0,
        }
    }

    /// The slot holding `key`, which becomes the most recently used; `None` on a miss.
    pub fn get(&mut self, key: u64) -> Option<usize> {
        self.lru.get(&key).copied()
    }

    /// The slot to store `key` in: its own if present, else a free one, else the least
    /// recently used item's, which is evicted. `key` becomes the most recently used.
    pub fn insert(&mut self, key: u64) -> usize {
        if let Some(&slot) = self.lru.get(&key) {
            return slot;
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let (_, slot) = self.lru.pop_lru().expect("a full store holds items");
                self.evictions += 1;
                slot
            }
        };
        self.lru.put(key, slot);
        slot
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.lru.len()
    }

    /// Whether no item is held.
    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Items evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_fill_free_slots_then_evict_the_least_recently_used() {
        let mut s = ItemStore::new(3);
        assert_eq!(s.get(7), None);
        assert_eq!([s.insert(7), s.insert(8), s.insert(9)], [0, 1, 2]);
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(7), Some(0), "7 is now the most recently used");
        // 8 is the least recently used: its slot goes to 10.
        assert_eq!(s.insert(10), 1);
        assert_eq!((s.get(8), s.evictions()), (None, 1));
        assert_eq!(s.insert(9), 2, "an item stored again keeps its slot");
        assert_eq!(s.evictions(), 1);
        assert_eq!((s.len(), s.capacity()), (3, 3));
    }

    #[test]
    fn uniform_requests_hit_at_capacity_over_working_set() {
        // The steady state the study relies on: a store of C items under uniform requests
        // over W > C keys (a miss stores the item) hits C/W of them.
        let (c, w) = (500u64, 900u64);
        let mut s = ItemStore::new(c as usize);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let (mut hits, mut total) = (0u64, 0u64);
        for i in 0..400_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = x % w;
            let hit = s.get(key).is_some();
            if !hit {
                s.insert(key);
            }
            if i >= 100_000 {
                total += 1;
                hits += hit as u64;
            }
        }
        let rate = hits as f64 / total as f64;
        assert!((rate - c as f64 / w as f64).abs() < 0.01, "hit rate {rate}");
    }
}
