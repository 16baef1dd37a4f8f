//! Which inbound rings have packets, found in O(active peers) (progress costs
//! O(active work), not O(ranks)).
//!
//! A rank's segment holds one ring per sender. The receiving engine polls a small *hot set*
//! of rings directly — those that carried packets recently — and learns of the others from
//! a *pending* bitmap in its segment, one bit per sender: a sender that publishes into a
//! ring the receiver is not watching sets its bit. A ring joins the hot set when its bit is
//! found and leaves it after [`DEMOTE_AFTER`] passes without a packet. So a pair of ranks
//! exchanging messages touches no shared word besides the ring itself, and a rank with many
//! idle peers reads one bitmap word per 64 of them.
//!
//! The sender's "publish, then read the watch flag" and the receiver's "clear the watch
//! flag, then read the ring" are sequentially consistent, so at least one side sees the
//! other: a packet is never left unannounced in an unwatched ring.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use smallvec::SmallVec;

use super::ring::Ring;

/// Passes without a packet after which a ring leaves the hot set.
pub(crate) const DEMOTE_AFTER: u32 = 4096;

/// The pending bitmap of one rank (in its segment).
#[derive(Clone, Copy)]
pub(crate) struct PendingBits<'a> {
    words: &'a [AtomicU64],
}

impl<'a> PendingBits<'a> {
    pub(crate) fn new(words: &'a [AtomicU64]) -> PendingBits<'a> {
        PendingBits { words }
    }

    /// Sender `src`: says its ring has packets (no write when the bit is already set).
    pub(crate) fn announce(&self, src: usize) {
        let w = &self.words[src / 64];
        let bit = 1u64 << (src % 64);
        if w.load(SeqCst) & bit == 0 {
            w.fetch_or(bit, SeqCst);
        }
    }
}

/// Publishes into `ring` (sender `src`'s ring in the receiver's segment) have been made; tells
/// the receiver if it is not watching that ring.
pub(crate) fn announce(ring: &Ring<'_>, pending: PendingBits<'_>, src: usize) {
    if !ring.watched() {
        pending.announce(src);
    }
}

/// The receiving side's view: which rings it polls.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    /// Rings polled every pass, with passes since each last had a packet.
    hot: Vec<(usize, u32)>,
    is_hot: Vec<bool>,
}

impl Inbox {
    pub(crate) fn new(senders: usize) -> Inbox {
        Inbox {
            hot: Vec::new(),
            is_hot: vec![false; senders],
        }
    }

    /// Rings polled directly now.
    #[cfg(test)]
    pub(crate) fn hot_len(&self) -> usize {
        self.hot.len()
    }

    /// The rings that may have packets this pass: the hot set, then the senders whose
    /// pending bit was set (which join the hot set). Drain each, then report with
    /// [`Inbox::drained`].
    pub(crate) fn due<'r>(
        &mut self,
        pending: PendingBits<'_>,
        ring: impl Fn(usize) -> Ring<'r>,
    ) -> SmallVec<[usize; 8]> {
        let mut due: SmallVec<[usize; 8]> = self.hot.iter().map(|&(src, _)| src).collect();
        for (wi, w) in pending.words.iter().enumerate() {
            if w.load(Relaxed) == 0 {
                continue;
            }
            let mut bits = w.swap(0, SeqCst);
            while bits != 0 {
                let src = wi * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if src >= self.is_hot.len() {
                    continue; // not a rank of this job: a stray bit
                }
                if !self.is_hot[src] {
                    self.is_hot[src] = true;
                    ring(src).set_watched(true);
                    self.hot.push((src, 0));
                    due.push(src);
                }
            }
        }
        due
    }

    /// Ring `src`, due this pass, had packets (`any`) or not. True when it has just left the
    /// hot set, after `ring(src)`'s watch flag went down: the caller drains it once more,
    /// for a packet published while its sender still saw the flag up.
    pub(crate) fn drained<'r>(
        &mut self,
        src: usize,
        any: bool,
        ring: impl Fn(usize) -> Ring<'r>,
    ) -> bool {
        let Some(i) = self.hot.iter().position(|&(s, _)| s == src) else {
            return false;
        };
        if any {
            self.hot[i].1 = 0;
            return false;
        }
        self.hot[i].1 += 1;
        if self.hot[i].1 < DEMOTE_AFTER {
            return false;
        }
        ring(src).set_watched(false);
        self.is_hot[src] = false;
        self.hot.swap_remove(i);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Header, RING_BYTES};
    use pagewire_sys::SharedSegment;

    #[test]
    fn announced_rings_join_the_hot_set_and_idle_ones_leave_it() {
        let name = format!("pagewire-unittest-inbox-{:x}", rand::random::<u64>());
        let seg = SharedSegment::create(&name, 2 * RING_BYTES + 64).unwrap();
        let bits_words = seg.words(2 * RING_BYTES, 1);
        let pending = PendingBits::new(bits_words);
        let ring = |src: usize| Ring::at(&seg, src * RING_BYTES);
        let mut inbox = Inbox::new(2);
        // Sender 1 publishes; the receiver is not watching, so the bit is set.
        let r1 = ring(1);
        let s = r1.reserve().unwrap();
        r1.publish(s, &Header::default());
        announce(&r1, pending, 1);
        assert_eq!(bits_words[0].load(Relaxed), 0b10);
        let mut seen = Vec::new();
        let pass = |inbox: &mut Inbox, seen: &mut Vec<usize>| {
            for src in inbox.due(pending, ring) {
                let mut any = false;
                while ring(src).peek().is_some() {
                    ring(src).pop();
                    seen.push(src);
                    any = true;
                }
                if inbox.drained(src, any, ring) {
                    while ring(src).peek().is_some() {
                        ring(src).pop();
                        seen.push(src);
                    }
                }
            }
        };
        pass(&mut inbox, &mut seen);
        assert_eq!(seen, vec![1]);
        assert_eq!(bits_words[0].load(Relaxed), 0);
        assert!(r1.watched());
        assert_eq!(inbox.hot_len(), 1);
        // Watched now: publishing sets no bit, and the next pass still finds the packet.
        let s = r1.reserve().unwrap();
        r1.publish(s, &Header::default());
        announce(&r1, pending, 1);
        assert_eq!(bits_words[0].load(Relaxed), 0);
        pass(&mut inbox, &mut seen);
        assert_eq!(seen, vec![1, 1]);
        // Idle: it leaves the hot set, and is no longer watched.
        for _ in 0..DEMOTE_AFTER {
            pass(&mut inbox, &mut seen);
        }
        assert_eq!(inbox.hot_len(), 0);
        assert!(!r1.watched());
    }
}
