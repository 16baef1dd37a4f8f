//! The lock-free queue between the reader and the dispatcher thread: fixed-size, written
//! without allocating or locking (the parent module says why).

#![forbid(unsafe_code)]

use super::*;

#[derive(Clone, Copy, Debug)]
pub(super) enum Entry {
    Unmap { start: u64, end: u64 },
    Remove { start: u64, end: u64 },
    Remap { from: u64, to: u64, len: u64 },
    Fork { ticket: u64 },
}

impl Entry {
    pub(super) fn encode(self, seq: u64) -> [u64; 5] {
        match self {
            Entry::Unmap { start, end } => [1, start, end, 0, seq],
            Entry::Remove { start, end } => [2, start, end, 0, seq],
            Entry::Remap { from, to, len } => [3, from, to, len, seq],
            Entry::Fork { ticket } => [4, ticket, 0, 0, seq],
        }
    }

    /// The entry and its batch tag.
    pub(super) fn decode(w: [u64; 5]) -> (Entry, u64) {
        let e = match w[0] {
            1 => Entry::Unmap {
                start: w[1],
                end: w[2],
            },
            2 => Entry::Remove {
                start: w[1],
                end: w[2],
            },
            3 => Entry::Remap {
                from: w[1],
                to: w[2],
                len: w[3],
            },
            _ => Entry::Fork { ticket: w[1] },
        };
        (e, w[4])
    }
}

/// The queue from the reader (sole producer) to the dispatcher (sole consumer): a ring of
/// preallocated slots with atomic indices, so that pushing takes no lock and allocates
/// nothing.
pub(super) struct Ring {
    pub(super) slots: Box<[[AtomicU64; 5]]>,
    /// Next slot the reader writes (only the reader stores it).
    pub(super) tail: AtomicUsize,
    /// Next slot the dispatcher reads (only the dispatcher stores it).
    pub(super) head: AtomicUsize,
    /// Set by the reader when an event did not fit.
    pub(super) overflow: AtomicBool,
    /// Highest read sequence whose events are all in the ring (or lost with `overflow`).
    pub(super) published: AtomicU64,
    /// Bumped by the reader after publishing; the dispatcher sleeps on it (futex).
    pub(super) doorbell: AtomicU32,
}

impl Ring {
    pub(super) fn new(capacity: usize) -> Ring {
        Ring {
            slots: (0..capacity)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            tail: AtomicUsize::new(0),
            head: AtomicUsize::new(0),
            overflow: AtomicBool::new(false),
            published: AtomicU64::new(0),
            doorbell: AtomicU32::new(0),
        }
    }

    /// Reader only: queues `e` of the batch tagged `seq`. Returns false (and marks the
    /// overflow) when full.
    pub(super) fn push(&self, e: Entry, seq: u64) -> bool {
        let tail = self.tail.load(Relaxed);
        if tail - self.head.load(Acquire) >= self.slots.len() {
            self.overflow.store(true, Release);
            return false;
        }
        let slot = &self.slots[tail % self.slots.len()];
        for (w, v) in slot.iter().zip(e.encode(seq)) {
            w.store(v, Relaxed);
        }
        self.tail.store(tail + 1, Release);
        true
    }

    /// Reader only: everything read up to `seq` is in the ring; wakes the dispatcher.
    pub(super) fn publish(&self, seq: u64) {
        self.published.store(seq, Release);
        self.doorbell.fetch_add(1, Release);
        pagewire_sys::futex_wake(&self.doorbell);
    }

    /// Dispatcher only: moves the queued entries (with their tags) to `out`.
    pub(super) fn take(&self, out: &mut Vec<(Entry, u64)>) {
        let head = self.head.load(Relaxed);
        let tail = self.tail.load(Acquire);
        for i in head..tail {
            let slot = &self.slots[i % self.slots.len()];
            out.push(Entry::decode(std::array::from_fn(|k| {
                slot[k].load(Relaxed)
            })));
        }
        self.head.store(tail, Release);
    }
}
