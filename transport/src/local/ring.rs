//! The rings of the local path: where they lie in a rank's segment, and the single-producer
//! single-consumer protocol that moves messages through them with plain loads and stores.
//!
//! A segment starts with a header line (a magic word, the geometry, and the owner's sleep
//! words: whether it sleeps, and the futex its senders ring) followed by one ring per
//! sender of the host. A ring is a line holding the consumer's position, a line the
//! sender writes (the count of barriers it entered with the owner, `LocalPath::barrier`),
//! then `cells` cells. A cell is one control word, then the message. The control word holds the
//! message's sequence number (its position + 1, modulo 2^32), its length and a bit the
//! message layer gives the message's form (its full 64-byte header or the short one of an
//! eager message: `msg/wire.rs`). The sender fills the cell at its position, then stores
//! the control word with release ordering; the receiver, polling the control word of its
//! next position with acquire ordering, reads the message where it lies and, once done with
//! it, stores its new position. The sender reads that position only when the ring looks
//! full, so a short eager message of up to 44 bytes costs one cache line and nothing else.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::error::Result;
use crate::sys::Error as SystemError;
use crate::sys::SharedSegment;

/// The first word of a local-path segment.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"pwlocal2");

/// A cache line.
const LINE: usize = 64;
/// Bytes of a cell before its message: the control word.
const CELL_HEADER: usize = 8;
/// The control word's bit that marks the short form.
const SHORT_BIT: u64 = 1 << 63;
/// Where the header line holds the owner's sleep words (after the four words of
/// `write_header`): whether it sleeps, and the futex its senders ring.
const ASLEEP_AT: usize = 32;
const BELL_AT: usize = 36;
/// About how many bytes one ring takes: cells of small messages are many, of large ones few.
const RING_TARGET_BYTES: usize = 512 << 10;

/// Where the rings and cells of a segment lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    cells: u64,
    cell_bytes: usize,
    rings: usize,
}

impl Geometry {
    /// Rings for `rings` senders whose cells hold messages of up to `message_bytes`.
    pub(crate) fn new(message_bytes: usize, rings: usize) -> Geometry {
        let cell_bytes = (CELL_HEADER + message_bytes).div_ceil(LINE) * LINE;
        let cells = (RING_TARGET_BYTES / cell_bytes).clamp(8, 64) as u64;
        Geometry {
            cells,
            cell_bytes,
            rings,
        }
    }

    /// Cells per ring.
    pub(crate) fn cells(&self) -> u64 {
        self.cells
    }

    /// Bytes a message may have.
    pub(crate) fn capacity(&self) -> usize {
        self.cell_bytes - CELL_HEADER
    }

    fn ring_bytes(&self) -> usize {
        2 * LINE + self.cells as usize * self.cell_bytes
    }

    fn ring_offset(&self, ring: usize) -> usize {
        assert!(ring < self.rings, "ring {ring} of {}", self.rings);
        LINE + ring * self.ring_bytes()
    }

    fn cell_offset(&self, ring: usize, pos: u64) -> usize {
        self.ring_offset(ring) + 2 * LINE + (pos % self.cells) as usize * self.cell_bytes
    }

    /// Bytes of a segment.
    pub(crate) fn segment_bytes(&self) -> usize {
        LINE + self.rings * self.ring_bytes()
    }

    /// Whether the segment's owner is asleep (non-zero) waiting for a message.
    pub(crate) fn asleep<'s>(&self, seg: &'s SharedSegment) -> &'s AtomicU32 {
        seg.word32(ASLEEP_AT)
    }

    /// The futex word the owner sleeps on; a sender that finds it asleep bumps and wakes it.
    pub(crate) fn bell<'s>(&self, seg: &'s SharedSegment) -> &'s AtomicU32 {
        seg.word32(BELL_AT)
    }

    /// Writes the header of a new segment.
    pub(crate) fn write_header(&self, seg: &SharedSegment) {
        let h = seg.words(0, 4);
        h[1].store(self.cells, Relaxed);
        h[2].store(self.cell_bytes as u64, Relaxed);
        h[3].store(self.rings as u64, Relaxed);
        h[0].store(MAGIC, Release);
    }

    /// Checks that a peer's segment `name` has this geometry (every rank computes it from
    /// the same settings).
    pub(crate) fn check_header(&self, seg: &SharedSegment, name: &str) -> Result<()> {
        let ok = seg.len() >= self.segment_bytes() && {
            let h = seg.words(0, 4);
            h[0].load(Acquire) == MAGIC
                && h[1].load(Relaxed) == self.cells
                && h[2].load(Relaxed) == self.cell_bytes as u64
                && h[3].load(Relaxed) == self.rings as u64
        };
        if ok {
            Ok(())
        } else {
            Err(SystemError::Bootstrap(format!(
                "/dev/shm/{name} is not a local-path segment of this job's geometry (do the \
                 ranks run with different PAGEWIRE_EAGER_LIMIT or PAGEWIRE_LOCAL_EAGER_LIMIT \
                 settings?)"
            ))
            .into())
        }
    }

    /// The position up to which the receiver has consumed ring `ring` of `seg`.
    pub(crate) fn consumed(&self, seg: &SharedSegment, ring: usize) -> u64 {
        seg.words(self.ring_offset(ring), 1)[0].load(Acquire)
    }

    /// The receiver has consumed ring `ring` of `seg` up to `next`.
    pub(crate) fn consume(&self, seg: &SharedSegment, ring: usize, next: u64) {
        seg.words(self.ring_offset(ring), 1)[0].store(next, Release);
    }

    /// How many barriers the sender of ring `ring` of `seg` has entered with the owner.
    pub(crate) fn barriers<'s>(&self, seg: &'s SharedSegment, ring: usize) -> &'s AtomicU64 {
        &seg.words(self.ring_offset(ring) + LINE, 1)[0]
    }

    /// Writes a message of `len` bytes (`fill` gets them; `short`: in the short form) at
    /// position `pos` of ring `ring` of `seg`, then publishes it. The caller checked that the
    /// ring has room.
    pub(crate) fn publish(
        &self,
        seg: &mut SharedSegment,
        ring: usize,
        pos: u64,
        len: usize,
        short: bool,
        fill: impl FnOnce(&mut [u8]),
    ) {
        let at = self.cell_offset(ring, pos);
        fill(seg.bytes_mut(at + CELL_HEADER, len));
        let form = if short { SHORT_BIT } else { 0 };
        let word = form | (len as u64) << 32 | (pos + 1) & 0xffff_ffff;
        seg.words(at, 1)[0].store(word, Release);
    }

    /// The message at position `pos` of ring `ring` of `seg`, if it is published: where
    /// its bytes start in `seg`, how many there are (at most a cell's) and whether it is in
    /// the short form. The sequence number is compared modulo 2^32: a cell last held the
    /// message a lap (at most 64 positions) earlier.
    pub(crate) fn published(
        &self,
        seg: &SharedSegment,
        ring: usize,
        pos: u64,
    ) -> Option<(usize, usize, bool)> {
        let at = self.cell_offset(ring, pos);
        let word = seg.words(at, 1)[0].load(Acquire);
        if word & 0xffff_ffff != (pos + 1) & 0xffff_ffff {
            return None;
        }
        let len = ((word >> 32) as usize & 0x7fff_ffff).min(self.capacity());
        Some((at + CELL_HEADER, len, word & SHORT_BIT != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(g: &Geometry) -> SharedSegment {
        let s = SharedSegment::anonymous(g.segment_bytes(), "a test ring").unwrap();
        g.write_header(&s);
        s
    }

    #[test]
    fn cells_are_whole_lines_and_rings_hold_8_to_64() {
        let g = Geometry::new(64 + (16 << 10), 3);
        assert_eq!(g.cell_bytes % LINE, 0);
        assert!(g.capacity() >= 64 + (16 << 10));
        assert_eq!(g.cells(), 31);
        assert_eq!(Geometry::new(64 + 8, 1).cells(), 64);
        assert_eq!(Geometry::new(1 << 20, 1).cells(), 8);
        assert_eq!(g.segment_bytes(), LINE + 3 * (2 * LINE + 31 * g.cell_bytes));
    }

    #[test]
    fn messages_go_in_order_and_the_sender_sees_a_full_ring() {
        let g = Geometry::new(200, 2);
        let mut seg = segment(&g);
        let mut head = 0;
        // Fill ring 1 completely; ring 0 stays empty.
        while head < g.consumed(&seg, 1) + g.cells() {
            g.publish(&mut seg, 1, head, 3, head % 2 == 0, |b| {
                b.copy_from_slice(&[head as u8, 1, 2])
            });
            head += 1;
        }
        assert_eq!(head, g.cells());
        assert!(
            g.published(&seg, 0, 0).is_none(),
            "another ring is untouched"
        );
        let mut next = 0;
        while let Some((at, len, short)) = g.published(&seg, 1, next) {
            assert_eq!(len, 3);
            assert_eq!(short, next % 2 == 0, "the form travels with the message");
            assert_eq!(seg.bytes(at, 3), &[next as u8, 1, 2]);
            next += 1;
            g.consume(&seg, 1, next);
        }
        assert_eq!(next, g.cells());
        // Room again: the next lap reuses the cells, and old sequence words do not count.
        assert!(g.published(&seg, 1, next).is_none());
        g.publish(&mut seg, 1, head, 1, false, |b| b[0] = 9);
        assert_eq!(g.published(&seg, 1, next).map(|(_, l, _)| l), Some(1));
    }

    #[test]
    fn a_rings_barrier_count_is_apart_from_its_position_and_cells() {
        let g = Geometry::new(200, 2);
        let mut seg = segment(&g);
        g.barriers(&seg, 1).store(7, Relaxed);
        // A full lap of messages and their consumption leave the count alone, and the
        // count leaves them alone.
        for pos in 0..g.cells() {
            g.publish(&mut seg, 1, pos, 200, false, |b| b.fill(0xff));
            assert_eq!(g.published(&seg, 1, pos).map(|(_, l, _)| l), Some(200));
            g.consume(&seg, 1, pos + 1);
        }
        assert_eq!(g.barriers(&seg, 1).load(Relaxed), 7);
        assert_eq!(g.consumed(&seg, 1), g.cells());
        assert_eq!(g.barriers(&seg, 0).load(Relaxed), 0, "another ring's count");
    }

    #[test]
    fn a_peer_segment_of_another_geometry_is_refused() {
        let g = Geometry::new(200, 2);
        let seg = segment(&g);
        assert!(g.check_header(&seg, "x").is_ok());
        let e = Geometry::new(4000, 2).check_header(&seg, "x").unwrap_err();
        assert!(e.to_string().contains("PAGEWIRE_EAGER_LIMIT"), "{e}");
    }
}
