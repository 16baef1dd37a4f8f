//! Acknowledgements written into the requester's memory: how a responder tells a
//! requester what became of its requests without a packet and without the requester's CPU,
//! as an HCA writes a completion into host memory that the CPU polls.
//!
//! Each queue pair has one cache line in its owner's segment ([`AckLine`]). The peer's
//! engine, acting as responder for that queue pair, writes it:
//! - `acked`: how many requests it has accepted, in order (RC's cumulative ACK); the
//!   requester completes every request below it;
//! - a negative acknowledgement (NAK): a serial number that changes with each NAK, the
//!   request it names, and why: receiver not ready (retry, possibly after a page fault the
//!   responder filed) or an error status (the request and the queue pair end).
//!
//! A responder never advances `acked` past a request it refused, and stops accepting on a
//! queue pair after an error NAK, so the requester reads the NAK before anything after it.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// Bytes of one line (one per queue pair).
pub(crate) const ACK_LINE_BYTES: usize = 64;

const ACKED: usize = 0;
const NAK_SERIAL: usize = 1;
const NAK_MSN: usize = 2;
const NAK_INFO: usize = 3;
const NAK_FAULT_SEQ: usize = 4;
/// Words of a line the code uses.
pub(crate) const ACK_WORDS: usize = 5;

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nak {
    /// Receiver not ready: no receive posted, or (with `fault`) a receive-side network page
    /// fault filed as sequence number `fault` in the responder's slot for this queue pair.
    Rnr { fault: Option<u64> },
    /// The request was dropped: a key it names missed the responder's translation cache
    /// (`tpt_cache.rs`). It stands for the loss the requester's retransmission timer would
    /// notice (the rings lose nothing); the requester retransmits when that timer fires.
    TranslationMiss,
    /// The request failed with this status (a wire code of `WcStatus`).
    Error(u16),
}

/// One queue pair's acknowledgement line, in the requester's segment.
#[derive(Clone, Copy)]
pub(crate) struct AckLine<'a> {
    w: &'a [AtomicU64],
}

impl<'a> AckLine<'a> {
    /// The line over `words` ([`ACK_WORDS`] of them).
    pub(crate) fn new(w: &'a [AtomicU64]) -> AckLine<'a> {
        assert!(w.len() >= ACK_WORDS);
        AckLine { w }
    }

    /// Responder: every request below `msn_end` has been accepted.
    pub(crate) fn ack(&self, msn_end: u64) {
        self.w[ACKED].store(msn_end, Release);
    }

    /// Responder: request `msn` was refused. NAKs of one queue pair are written by one
    /// responder, one at a time.
    pub(crate) fn nak(&self, msn: u64, why: Nak) {
        let (info, fault) = match why {
            Nak::Rnr { fault: None } => (1u64 << 16, 0),
            Nak::TranslationMiss => (2u64 << 16, 0),
            Nak::Rnr { fault: Some(seq) } => (3u64 << 16, seq),
            Nak::Error(code) => (code as u64, 0),
        };
        self.w[NAK_MSN].store(msn, Relaxed);
        self.w[NAK_INFO].store(info, Relaxed);
        self.w[NAK_FAULT_SEQ].store(fault, Relaxed);
        let serial = self.w[NAK_SERIAL].load(Relaxed);
        self.w[NAK_SERIAL].store(serial + 1, Release);
    }

    /// Requester: how many requests have been accepted.
    pub(crate) fn acked(&self) -> u64 {
        self.w[ACKED].load(Acquire)
    }

    /// Requester: the latest NAK if its serial differs from `seen`: `(serial, msn, why)`.
    pub(crate) fn nak_since(&self, seen: u64) -> Option<(u64, u64, Nak)> {
        let serial = self.w[NAK_SERIAL].load(Acquire);
        if serial == seen {
            return None;
        }
        let msn = self.w[NAK_MSN].load(Relaxed);
        let info = self.w[NAK_INFO].load(Relaxed);
        let why = match info >> 16 {
            0 => Nak::Error(info as u16),
            1 => Nak::Rnr { fault: None },
            2 => Nak::TranslationMiss,
            _ => Nak::Rnr {
                fault: Some(self.w[NAK_FAULT_SEQ].load(Relaxed)),
            },
        };
        Some((serial, msn, why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_and_naks_are_read_once_each() {
        let words: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
        let line = AckLine::new(&words);
        assert_eq!(line.acked(), 0);
        assert_eq!(line.nak_since(0), None);
        line.ack(3);
        assert_eq!(line.acked(), 3);
        line.nak(3, Nak::Rnr { fault: None });
        let (s1, msn, why) = line.nak_since(0).unwrap();
        assert_eq!((msn, why), (3, Nak::Rnr { fault: None }));
        assert_eq!(line.nak_since(s1), None, "read once");
        line.nak(3, Nak::Rnr { fault: Some(42) });
        let (s2, _, why) = line.nak_since(s1).unwrap();
        assert_eq!(why, Nak::Rnr { fault: Some(42) });
        line.nak(4, Nak::TranslationMiss);
        let (s2, _, why) = line.nak_since(s2).unwrap();
        assert_eq!(why, Nak::TranslationMiss);
        line.nak(4, Nak::Error(5));
        assert_eq!(line.nak_since(s2).unwrap().1, 4);
        assert_eq!(line.nak_since(s2).unwrap().2, Nak::Error(5));
    }
}
