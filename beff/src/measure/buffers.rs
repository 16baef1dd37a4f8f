//! The send and receive buffers of the measurement loop: each message takes the next
//! 8-byte-aligned slot, wrapping round; the bytes a message carries, how they are written
//! before sending and checked after receiving.

use crate::{Error, Result};

/// The byte at offset `k` of the message a process `sender` sends in exchange `exchange`
/// of loop `iteration` at length index `msg` (b_eff writes `exchange · msg + 1` first).
pub fn message_byte(sender: usize, exchange: usize, msg: usize, iteration: usize, k: usize) -> u8 {
    (1 + exchange * msg + 3 * iteration + 5 * sender + 7 * k) as u8
}

/// The send and receive buffers and where the next message goes.
pub(super) struct Buffers {
    pub(super) send: Vec<u8>,
    pub(super) recv: Vec<u8>,
    pub(super) next: usize,
    pub(super) verify: bool,
    pub(super) checked: u64,
}

/// Identifies one message for filling and checking.
#[derive(Clone, Copy)]
pub(super) struct Stamp {
    exchange: usize,
    msg: usize,
    iteration: usize,
}

impl Stamp {
    pub(super) fn new(exchange: usize, msg: usize, iteration: usize) -> Stamp {
        Stamp {
            exchange,
            msg,
            iteration,
        }
    }
}

impl Buffers {
    /// The offset of a block of `len` bytes in 8-byte-aligned slots, wrapping to the start
    /// when it would not fit.
    pub(super) fn take(&mut self, len: usize) -> usize {
        let slot = len.div_ceil(8) * 8;
        if self.next + slot > self.send.len() {
            self.next = 0;
        }
        let at = self.next;
        self.next += slot;
        at
    }

    pub(super) fn fill(&mut self, at: usize, len: usize, me: usize, s: Stamp) {
        if len == 0 {
            return;
        }
        let byte = |k| message_byte(me, s.exchange, s.msg, s.iteration, k);
        let buf = &mut self.send[at..at + len];
        if self.verify {
            buf.iter_mut().enumerate().for_each(|(k, b)| *b = byte(k));
        } else {
            buf[0] = byte(0);
            buf[len - 1] = byte(len - 1);
        }
    }

    /// With `verify`, overwrites the receive area with bytes that all differ from the
    /// expected ones, so a byte the receive did not write is caught.
    pub(super) fn prepare(&mut self, at: usize, len: usize, sender: usize, s: Stamp) {
        if self.verify {
            let buf = &mut self.recv[at..at + len];
            for (k, b) in buf.iter_mut().enumerate() {
                *b = !message_byte(sender, s.exchange, s.msg, s.iteration, k);
            }
        }
    }

    pub(super) fn check(
        &mut self,
        at: usize,
        len: usize,
        sender: usize,
        me: usize,
        s: Stamp,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let buf = &self.recv[at..at + len];
        let expect = |k| message_byte(sender, s.exchange, s.msg, s.iteration, k);
        let bad = if self.verify {
            buf.iter().enumerate().position(|(k, &b)| b != expect(k))
        } else {
            [0, len - 1].into_iter().find(|&k| buf[k] != expect(k))
        };
        self.checked += 1;
        match bad {
            None => Ok(()),
            Some(k) => Err(Error::Corrupted {
                rank: me,
                from: sender,
                length: len,
                exchange: s.exchange,
                offset: k,
                got: buf[k],
                expected: expect(k),
            }),
        }
    }
}

/// Splits `buf` into the non-overlapping `(offset, len)` ranges, returned in the order given.
pub(super) fn disjoint_mut<'b>(
    mut buf: &'b mut [u8],
    ranges: &[(usize, usize)],
) -> Vec<&'b mut [u8]> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].0);
    let mut out: Vec<Option<&'b mut [u8]>> = (0..ranges.len()).map(|_| None).collect();
    let mut consumed = 0;
    for i in order {
        let (at, len) = ranges[i];
        let rest = std::mem::take(&mut buf);
        let (_, rest) = rest.split_at_mut(at - consumed);
        let (piece, rest) = rest.split_at_mut(len);
        out[i] = Some(piece);
        buf = rest;
        consumed = at + len;
    }
    out.into_iter().map(|p| p.expect("every range")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_bytes_differ_by_sender_exchange_and_loop() {
        let b = |s, e, i, k| message_byte(s, e, 5, i, k);
        assert_ne!(b(0, 0, 0, 0), b(1, 0, 0, 0));
        assert_ne!(b(0, 0, 0, 0), b(0, 1, 0, 0));
        assert_ne!(b(0, 0, 0, 0), b(0, 0, 1, 0));
        // 7 is odd: 256 consecutive offsets take every byte value once.
        let mut seen: Vec<u8> = (0..256).map(|k| b(2, 1, 3, k)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn disjoint_slices_in_the_order_asked() {
        let mut buf: Vec<u8> = (0..32).collect();
        let parts = disjoint_mut(&mut buf, &[(16, 4), (0, 8), (24, 8)]);
        assert_eq!(parts[0], &[16, 17, 18, 19]);
        assert_eq!(parts[1], &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(parts[2].len(), 8);
        assert_eq!(parts[2][0], 24);
    }
}
