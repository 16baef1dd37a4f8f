//! Element updates as the NIC's 64-bit compare-and-swap: the words that hold a run of
//! elements, and the elements' bytes taken out of and put into them.
//!
//! An accumulate, a fetching accumulate or a compare-and-swap on elements of up to 8 bytes
//! reads the words that hold them, computes each word's new value from a guess of its
//! current one, and swaps it in with `CMP_SWAP`; a word whose swap finds another value is
//! computed again from the value found. Every word is swapped, changed or not, so that
//! even a `MPI_NO_OP` reads a value some atomic saw. The update of each element is atomic,
//! as MPI requires of accumulates, with respect to every other update that goes through the
//! NIC's atomics, whatever its element size.

/// The aligned 64-bit words that hold `len` bytes at `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WordSpan {
    /// Address of the first word.
    pub(crate) first: u64,
    /// Words.
    pub(crate) words: usize,
    /// Bytes of the first word before the run.
    skip: usize,
    /// Bytes of the run.
    len: usize,
}

impl WordSpan {
    /// The words holding `[addr, addr+len)`.
    pub(crate) fn new(addr: u64, len: usize) -> WordSpan {
        let first = addr & !7;
        let end = (addr + len as u64).next_multiple_of(8);
        WordSpan {
            first,
            words: ((end - first) / 8) as usize,
            skip: (addr - first) as usize,
            len,
        }
    }

    /// The address of word `i`.
    pub(crate) fn word_addr(&self, i: usize) -> u64 {
        self.first + 8 * i as u64
    }

    /// The run's bytes in `words` (values as the NIC returns them: native byte order).
    pub(crate) fn extract(&self, words: &[u64]) -> Vec<u8> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        bytes[self.skip..self.skip + self.len].to_vec()
    }

    /// `words` with the run's bytes replaced by `run`.
    pub(crate) fn insert(&self, words: &[u64], run: &[u8]) -> Vec<u64> {
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        bytes[self.skip..self.skip + self.len].copy_from_slice(run);
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_exactly_the_words_of_the_run() {
        assert_eq!(WordSpan::new(64, 8).words, 1);
        assert_eq!(WordSpan::new(68, 4).words, 1);
        assert_eq!(WordSpan::new(68, 8).words, 2);
        assert_eq!(WordSpan::new(66, 2).first, 64);
        let s = WordSpan::new(60, 12);
        assert_eq!((s.first, s.words, s.word_addr(1)), (56, 2, 64));
    }

    #[test]
    fn runs_come_out_of_and_go_into_their_words_unchanged_around_them() {
        let words = [
            u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8]),
            u64::from_ne_bytes([9; 8]),
        ];
        let s = WordSpan::new(1004, 6); // bytes 4..10 of the two words at 1000
        assert_eq!(s.extract(&words), [5, 6, 7, 8, 9, 9]);
        let out = s.insert(&words, &[0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5]);
        assert_eq!(out[0].to_ne_bytes(), [1, 2, 3, 4, 0xa0, 0xa1, 0xa2, 0xa3]);
        assert_eq!(out[1].to_ne_bytes(), [0xa4, 0xa5, 9, 9, 9, 9, 9, 9]);
        assert_eq!(s.extract(&out), [0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5]);
    }
}
