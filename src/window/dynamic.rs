//! Dynamic windows (`MPI_Win_create_dynamic`, `MPI_Win_attach`, `MPI_Win_detach`): the
//! table of attached regions each rank publishes in its control page, and the origins'
//! views of it.
//!
//! The table lies in the owner's control page from byte [`TABLE_AT`]: a generation word
//! (odd while the owner changes the table), the number of regions, then three words per
//! region (address, length, key). The owner changes it as a sequence lock: generation to
//! odd, the entries, the count, generation to even. An origin reads the table with one RDMA
//! READ (two if it holds many regions) and then the generation word again with an atomic:
//! the copy is whole if both generations are equal and even.
//!
//! An origin's view goes stale when the owner detaches a region: the owner detaches under
//! its own exclusive lock, and counts detaches in the lock word's middle bits
//! ([`DETACH_ONE`]); an origin reads that count whenever it takes the lock (the shared
//! lock's fetch-and-add and the exclusive lock's compare-and-swap return it for free) and
//! drops a view taken at another count. Every access to a dynamic window holds a lock on
//! its target (one taken for the access alone if the origin holds none), so a region is
//! never detached while an origin that found it in its view accesses it.

use std::sync::atomic::{fence, Ordering};

use pagewire_transport::sys::AnonMapping;

use super::memory::WindowMemory;

/// Byte of the control page where the table begins (after the lock and the update mutex).
pub(super) const TABLE_AT: usize = 16;
/// Bytes of the table's header: the generation and the count.
const HEADER: usize = 16;
/// Bytes of one region's entry.
const ENTRY: usize = 24;
/// Entries the first READ of a table fetches (most ranks attach a few regions).
pub(super) const FIRST_READ_ENTRIES: usize = 32;
/// Bytes of a dynamic window's control page: room for 2,729 regions per rank.
pub(super) const DYNAMIC_CONTROL_BYTES: usize = 64 << 10;

/// One in the lock word's count of detaches (bits 32..62, below the exclusive bit).
pub(super) const DETACH_ONE: u64 = 1 << 32;
/// The bits of the lock word's count of detaches.
pub(super) const DETACH_BITS: u64 = ((1 << 30) - 1) << 32;

/// The count of detaches a lock word carries.
pub(super) fn detaches(word: u64) -> u64 {
    (word & DETACH_BITS) >> 32
}

/// What the owner adds to its lock word, which it holds exclusively, to count one more
/// detach (the count wraps within its bits, never into the exclusive bit).
pub(super) fn detach_increment(word: u64) -> u64 {
    if word & DETACH_BITS == DETACH_BITS {
        (word & DETACH_BITS).wrapping_neg()
    } else {
        DETACH_ONE
    }
}

/// The most regions a control page of `bytes` holds.
pub(super) fn capacity(bytes: usize) -> usize {
    (bytes - TABLE_AT - HEADER) / ENTRY
}

/// Bytes of a table holding `count` regions, from [`TABLE_AT`].
pub(super) fn table_bytes(count: usize) -> usize {
    HEADER + count * ENTRY
}

/// One region attached to a dynamic window, as peers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AttachedRegion {
    /// First byte, in the owner's address space.
    pub addr: u64,
    /// Bytes attached.
    pub len: u64,
    /// The key peers name to access it.
    pub rkey: u32,
}

impl AttachedRegion {
    /// Whether `[at, at+len)` lies in the region.
    fn holds(&self, at: u64, len: u64) -> bool {
        at >= self.addr && at.saturating_add(len) <= self.addr + self.len
    }
}

/// Writes `regions` into the table of `control`, this rank's control page (owner side).
pub(super) fn publish(control: &AnonMapping, regions: &[AttachedRegion]) {
    assert!(
        regions.len() <= capacity(control.len()),
        "the caller checks the capacity"
    );
    let generation = control.atomic_u64(TABLE_AT);
    let g = generation.load(Ordering::Relaxed);
    generation.store(g + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    for (i, r) in regions.iter().enumerate() {
        let at = TABLE_AT + HEADER + i * ENTRY;
        control.atomic_u64(at).store(r.addr, Ordering::Relaxed);
        control.atomic_u64(at + 8).store(r.len, Ordering::Relaxed);
        control
            .atomic_u64(at + 16)
            .store(u64::from(r.rkey), Ordering::Relaxed);
    }
    control
        .atomic_u64(TABLE_AT + 8)
        .store(regions.len() as u64, Ordering::Relaxed);
    generation.store(g + 2, Ordering::Release);
}

/// The header of a table copy: its generation and count, if the copy was not taken while
/// the owner changed it.
pub(super) fn header(copy: &[u8]) -> Option<(u64, usize)> {
    let word = |at: usize| u64::from_ne_bytes(copy[at..at + 8].try_into().expect("8 bytes"));
    let (generation, count) = (word(0), word(8));
    (generation % 2 == 0).then_some((generation, count as usize))
}

/// The regions of a table copy holding at least `count` entries.
pub(super) fn entries(copy: &[u8], count: usize) -> Vec<AttachedRegion> {
    let word = |at: usize| u64::from_ne_bytes(copy[at..at + 8].try_into().expect("8 bytes"));
    (0..count)
        .map(|i| {
            let at = HEADER + i * ENTRY;
            AttachedRegion {
                addr: word(at),
                len: word(at + 8),
                rkey: word(at + 16) as u32,
            }
        })
        .collect()
}

/// An origin's copy of a target's table (dropped when the target's count of detaches
/// moves).
#[derive(Clone, Debug, Default)]
pub(super) struct RegionView {
    /// The regions.
    pub regions: Vec<AttachedRegion>,
}

impl RegionView {
    /// The region that holds `[at, at+len)` whole.
    pub(super) fn find(&self, at: u64, len: u64) -> Option<AttachedRegion> {
        self.regions.iter().copied().find(|r| r.holds(at, len))
    }
}

/// A region attached on this rank: its memory, what peers see, and its registration (none
/// where the whole address space is exposed on demand).
pub(super) struct Attached<T> {
    pub id: u64,
    pub memory: WindowMemory<T>,
    pub region: AttachedRegion,
    pub lkey: Option<u32>,
    /// Bytes it pinned.
    pub pinned: u64,
}

/// A region attached to a dynamic window: where peers address it. Given back to
/// [`Window::detach`](super::Window::detach), which returns the memory.
#[derive(Debug, PartialEq, Eq)]
pub struct Attachment {
    pub(super) id: u64,
    pub(super) address: usize,
    pub(super) len: usize,
    pub(super) element: usize,
}

impl Attachment {
    /// The region's address: the displacement of its element 0 in put, get and the other
    /// operations on this rank's part of the dynamic window (send it to the peers that
    /// access it, as MPI programs send `MPI_Get_address`'s result).
    pub fn address(&self) -> usize {
        self.address
    }

    /// The displacement of element `index` of the region.
    pub fn disp(&self, index: usize) -> usize {
        self.address + index * self.element
    }

    /// Elements of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no elements (never: empty regions are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: u64, len: u64, rkey: u32) -> AttachedRegion {
        AttachedRegion { addr, len, rkey }
    }

    #[test]
    fn a_published_table_reads_back_whole_with_an_even_generation() {
        let control = AnonMapping::new(DYNAMIC_CONTROL_BYTES).unwrap();
        let regions = [region(0x1000, 64, 7), region(0x9000, 4096, 8)];
        publish(&control, &regions);
        publish(&control, &regions[..1]);
        let copy = &control.as_slice()[TABLE_AT..TABLE_AT + table_bytes(4)];
        let (generation, count) = header(copy).unwrap();
        assert_eq!((generation, count), (4, 1));
        assert_eq!(entries(copy, count), vec![regions[0]]);
    }

    #[test]
    fn a_copy_taken_while_the_owner_writes_is_refused() {
        let control = AnonMapping::new(DYNAMIC_CONTROL_BYTES).unwrap();
        control.atomic_u64(TABLE_AT).store(3, Ordering::Relaxed);
        assert_eq!(header(&control.as_slice()[TABLE_AT..]), None);
    }

    #[test]
    fn a_view_finds_only_ranges_a_region_holds_whole() {
        let view = RegionView {
            regions: vec![region(100, 50, 1), region(200, 8, 2)],
        };
        assert_eq!(view.find(100, 50).map(|r| r.rkey), Some(1));
        assert_eq!(view.find(140, 10).map(|r| r.rkey), Some(1));
        assert_eq!(view.find(200, 8).map(|r| r.rkey), Some(2));
        assert_eq!(view.find(140, 11), None, "past the end");
        assert_eq!(view.find(99, 2), None, "before the start");
        assert_eq!(view.find(150, 50), None, "between regions");
        assert_eq!(view.find(u64::MAX - 1, 8), None, "overflow");
    }

    #[test]
    fn the_detach_count_wraps_inside_its_bits() {
        const EXCLUSIVE: u64 = 1 << 62;
        let mut word = EXCLUSIVE;
        for _ in 0..3 {
            word = word.wrapping_add(detach_increment(word));
        }
        assert_eq!(detaches(word), 3);
        let full = EXCLUSIVE | DETACH_BITS | 5;
        let next = full.wrapping_add(detach_increment(full));
        assert_eq!(
            next,
            EXCLUSIVE | 5,
            "wraps to zero, the exclusive bit and shared count kept"
        );
        assert_eq!(capacity(DYNAMIC_CONTROL_BYTES), 2729);
    }
}
