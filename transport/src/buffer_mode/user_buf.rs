//! User buffers as the buffer modes and the message layer hold them (one of the few modules
//! with `unsafe`).
//!
//! A nonblocking operation keeps a user buffer across calls, so it is held as an address and
//! length. [`UserBuf`] and [`UserBufMut`] are created `unsafe`ly by the API above (whose
//! requests borrow the buffer until completion, rsmpi's scope design) and then used safely:
//! the only operations are bounded copies and handing the range to the NIC. They live at the
//! buffer-mode layer, the lowest that uses them (the message layer re-exports them as
//! `msg::raw`).
//!
//! A buffer may have gaps ([`Layout`]: a derived datatype with holes): the message
//! is then its runs' bytes back to back, and nothing here reads or writes a gap. The copies
//! gather and scatter run by run (so the eager slots and the copy mode's bounce slots pack
//! and unpack in passing), and the rendezvous protocols hand the NIC one run at a time in
//! zero-copy modes (`msg/rndv.rs`, "scatter-gather rendezvous").

use std::sync::Arc;

/// Where the bytes of a buffer with gaps lie: `count` elements `extent` bytes apart, each
/// made of runs (offset from the buffer's start for element 0, length) whose bytes travel in
/// order: a derived datatype's type map, flattened (MPI 3.1 §4.1). The message is the runs'
/// bytes back to back; the bytes between runs are never read nor written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// One element's runs, adjacent ones merged, each with where it starts in the element's
    /// share of the message.
    runs: Vec<Run>,
    /// Message bytes per element.
    size: u64,
    extent: u64,
    count: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    /// Bytes from the buffer's start (element 0).
    offset: u64,
    len: u64,
    /// Where the run starts in its element's share of the message.
    at: u64,
}

/// One contiguous run of a buffer as a transfer moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Where it starts in the message.
    pub at: u64,
    /// Bytes from the buffer's start.
    pub offset: u64,
    /// Bytes in it.
    pub len: u64,
}

impl Layout {
    /// `count` elements `extent` bytes apart, each made of `runs` (offset from the buffer's
    /// start, length) in the order their bytes travel. Empty runs are dropped and runs that
    /// continue one another are merged.
    pub fn new(runs: impl IntoIterator<Item = (u64, u64)>, extent: u64, count: u64) -> Layout {
        let mut merged: Vec<Run> = Vec::new();
        let mut at = 0;
        for (offset, len) in runs.into_iter().filter(|r| r.1 > 0) {
            match merged.last_mut() {
                Some(last) if last.offset + last.len == offset => last.len += len,
                _ => merged.push(Run { offset, len, at }),
            }
            at += len;
        }
        Layout {
            runs: merged,
            size: at,
            extent,
            count,
        }
    }

    /// Message bytes (`MPI_Type_size` times the count).
    pub fn len(&self) -> u64 {
        self.size * self.count
    }

    /// True when no byte travels.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes from the buffer's start to the end of its last run: what a registration of the
    /// whole buffer covers.
    pub fn span(&self) -> u64 {
        let end = self
            .runs
            .iter()
            .map(|r| r.offset + r.len)
            .max()
            .unwrap_or(0);
        match self.count {
            0 => 0,
            n => (n - 1) * self.extent + end,
        }
    }

    /// One element's runs (offset from the buffer's start, length), in the order their
    /// bytes travel.
    pub fn element_runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().map(|r| (r.offset, r.len))
    }

    /// Bytes between elements.
    pub fn extent(&self) -> u64 {
        self.extent
    }

    /// Elements.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Contiguous runs in the whole buffer.
    pub fn run_count(&self) -> u64 {
        self.runs.len() as u64 * self.count
    }

    /// The longest run, in bytes.
    pub fn longest_run(&self) -> u64 {
        self.runs.iter().map(|r| r.len).max().unwrap_or(0)
    }

    /// Run `k` of the whole buffer (element `k / runs`), in message order.
    pub fn piece(&self, k: u64) -> Piece {
        let per = self.runs.len() as u64;
        let (element, r) = (k / per, self.runs[(k % per) as usize]);
        Piece {
            at: element * self.size + r.at,
            offset: element * self.extent + r.offset,
            len: r.len,
        }
    }

    /// The run holding message byte `at`, from that byte to the run's end.
    pub fn piece_at(&self, at: u64) -> Piece {
        let (element, within) = (at / self.size, at % self.size);
        let j = self.runs.partition_point(|r| r.at <= within) - 1;
        let r = self.runs[j];
        let skip = within - r.at;
        Piece {
            at,
            offset: element * self.extent + r.offset + skip,
            len: r.len - skip,
        }
    }

    /// How many runs hold some of the first `at` message bytes.
    pub fn runs_before(&self, at: u64) -> u64 {
        if self.size == 0 {
            return 0;
        }
        let (element, within) = (at / self.size, at % self.size);
        let started = self.runs.partition_point(|r| r.at < within) as u64;
        element * self.runs.len() as u64 + started
    }

    /// The runs that message bytes `[at, at+len)` occupy, in order (cut to that range).
    pub fn pieces(&self, at: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let end = at + len;
        let mut next = at;
        std::iter::from_fn(move || {
            if next >= end {
                return None;
            }
            let mut p = self.piece_at(next);
            p.len = p.len.min(end - next);
            next += p.len;
            Some(p)
        })
    }
}

/// The memory of a user buffer: where it starts, the message bytes it holds, and where they
/// lie when it has gaps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserMemory {
    addr: u64,
    len: usize,
    layout: Option<Arc<Layout>>,
}

impl UserMemory {
    /// The geometry of a buffer at `addr` (its runs laid out by `layout` when it has gaps,
    /// else `len` contiguous bytes), without the right to touch it: what the protocols'
    /// tests describe buffers by. Reading or writing takes a [`UserBuf`] or [`UserBufMut`],
    /// whose constructors carry the safety contract.
    #[cfg(test)]
    pub(crate) fn describing(addr: u64, len: usize, layout: Option<Arc<Layout>>) -> UserMemory {
        UserMemory {
            addr,
            len: layout.as_ref().map_or(len, |l| l.len() as usize),
            layout,
        }
    }

    /// Start address (the lowest byte of a buffer with gaps).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Message bytes it holds (without the gaps).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where its bytes lie, if it has gaps.
    pub fn layout(&self) -> Option<&Layout> {
        self.layout.as_deref()
    }

    /// Whether it has gaps.
    pub fn is_gapped(&self) -> bool {
        self.layout.is_some()
    }

    /// Bytes from its start to the end of its last byte (its length, without gaps).
    pub fn span(&self) -> usize {
        self.layout.as_ref().map_or(self.len, |l| l.span() as usize)
    }

    /// The contiguous run holding message byte `at`, from that byte to the run's end.
    pub fn piece_at(&self, at: usize) -> Piece {
        match &self.layout {
            Some(l) => l.piece_at(at as u64),
            None => Piece {
                at: at as u64,
                offset: at as u64,
                len: (self.len - at) as u64,
            },
        }
    }

    /// The lowest and highest byte (offsets from the start, end exclusive) that message bytes
    /// `[at, at+len)` occupy.
    pub fn bounds(&self, at: usize, len: usize) -> (usize, usize) {
        match &self.layout {
            Some(l) => l
                .pieces(at as u64, len as u64)
                .fold((usize::MAX, 0), |(lo, hi), p| {
                    (
                        lo.min(p.offset as usize),
                        hi.max((p.offset + p.len) as usize),
                    )
                }),
            None => (at, at + len),
        }
    }

    /// Calls `f(address, position in the range)` for each contiguous run of message bytes
    /// `[at, at+len)`, after checking that the range lies in the buffer (a range past its
    /// end, or one whose end wraps, panics: the protocols check every range a peer names
    /// before it gets here).
    fn for_each_run(
        &self,
        at: usize,
        len: usize,
        what: &str,
        mut f: impl FnMut(u64, usize, usize),
    ) {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.len),
            "{what} past the end of a user buffer"
        );
        if len == 0 {
            return;
        }
        match &self.layout {
            None => f(self.addr + at as u64, 0, len),
            Some(l) => {
                let mut done = 0;
                for p in l.pieces(at as u64, len as u64) {
                    f(self.addr + p.offset, done, p.len as usize);
                    done += p.len as usize;
                }
            }
        }
    }
}

/// A user buffer the message layer reads (a send buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserBuf(UserMemory);

/// A user buffer the message layer writes (a receive buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserBufMut(UserMemory);

impl std::ops::Deref for UserBuf {
    type Target = UserMemory;
    fn deref(&self) -> &UserMemory {
        &self.0
    }
}

impl std::ops::Deref for UserBufMut {
    type Target = UserMemory;
    fn deref(&self) -> &UserMemory {
        &self.0
    }
}

impl UserBuf {
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads, and must not be written, until the
    /// operation that receives this value has completed.
    pub unsafe fn new(ptr: *const u8, len: usize) -> UserBuf {
        UserBuf(UserMemory {
            addr: ptr as u64,
            len,
            layout: None,
        })
    }

    /// A buffer with gaps: the runs of `layout` from `ptr`.
    ///
    /// # Safety
    /// Every run of `layout` from `ptr` must stay valid for reads, and must not be written,
    /// until the operation that receives this value has completed. The gaps need not be
    /// readable.
    pub unsafe fn gapped(ptr: *const u8, layout: Arc<Layout>) -> UserBuf {
        UserBuf(UserMemory {
            addr: ptr as u64,
            len: layout.len() as usize,
            layout: Some(layout),
        })
    }

    /// Copies `dst.len()` message bytes starting at `offset` out of the buffer, run by run;
    /// never reads outside its runs (a range past its end panics).
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        self.0
            .for_each_run(offset, dst.len(), "read", |addr, at, n| {
                // SAFETY: a run of the range the constructor's caller guaranteed readable for
                // the operation's lifetime (checked in bounds above); `dst` is a distinct Rust
                // buffer of at least `at + n` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        addr as usize as *const u8,
                        dst[at..at + n].as_mut_ptr(),
                        n,
                    )
                };
            });
    }
}

impl UserBufMut {
    /// # Safety
    /// `ptr..ptr+len` must stay valid for writes, and must not be read or written by anyone
    /// else, until the operation that receives this value has completed.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> UserBufMut {
        UserBufMut(UserMemory {
            addr: ptr as u64,
            len,
            layout: None,
        })
    }

    /// A buffer with gaps: the runs of `layout` from `ptr`.
    ///
    /// # Safety
    /// Every run of `layout` from `ptr` must stay valid for writes, and must not be read or
    /// written by anyone else, until the operation that receives this value has completed.
    /// The runs must not overlap (MPI forbids receive datatypes that overlap). The gaps are
    /// never touched.
    pub unsafe fn gapped(ptr: *mut u8, layout: Arc<Layout>) -> UserBufMut {
        UserBufMut(UserMemory {
            addr: ptr as u64,
            len: layout.len() as usize,
            layout: Some(layout),
        })
    }

    /// Copies `src` into the buffer at message offset `offset`, run by run; never writes
    /// outside its runs (a range past its end panics).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        self.0
            .for_each_run(offset, src.len(), "write", |addr, at, n| {
                // SAFETY: a run of the range the constructor's caller guaranteed writable and
                // exclusively ours for the operation's lifetime (checked in bounds above);
                // `src` is a distinct Rust buffer of at least `at + n` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src[at..at + n].as_ptr(),
                        addr as usize as *mut u8,
                        n,
                    )
                };
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two elements 16 bytes apart, each runs [0,4) and [8,12), plus a run [4,8) that
    /// continues the first (merged into [0,8)).
    fn layout() -> Layout {
        Layout::new([(0, 4), (4, 4), (12, 2)], 16, 2)
    }

    #[test]
    fn a_layout_merges_runs_and_maps_message_bytes_to_memory() {
        let l = layout();
        assert_eq!(
            (l.len(), l.span(), l.run_count(), l.longest_run()),
            (20, 30, 4, 8)
        );
        assert_eq!(
            l.piece(0),
            Piece {
                at: 0,
                offset: 0,
                len: 8
            }
        );
        assert_eq!(
            l.piece(3),
            Piece {
                at: 18,
                offset: 28,
                len: 2
            }
        );
        assert_eq!(
            l.piece_at(9),
            Piece {
                at: 9,
                offset: 13,
                len: 1
            }
        );
        assert_eq!(
            l.piece_at(12),
            Piece {
                at: 12,
                offset: 18,
                len: 6
            }
        );
        assert_eq!(
            [0, 1, 8, 9, 10, 19, 20].map(|at| l.runs_before(at)),
            [0, 1, 1, 2, 2, 4, 4]
        );
        let pieces: Vec<(u64, u64)> = l.pieces(6, 8).map(|p| (p.offset, p.len)).collect();
        assert_eq!(pieces, [(6, 2), (12, 2), (16, 4)]);
    }

    #[test]
    fn gathers_and_scatters_touch_the_runs_only() {
        let src: Vec<u8> = (0..30).collect();
        let l = Arc::new(layout());
        // SAFETY: `src` outlives the buffer, which only reads it.
        let ub = unsafe { UserBuf::gapped(src.as_ptr(), l.clone()) };
        let mut msg = [0u8; 20];
        ub.read(0, &mut msg);
        assert_eq!(
            msg,
            [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 17, 18, 19, 20, 21, 22, 23, 28, 29]
        );
        let mut part = [0u8; 5];
        ub.read(7, &mut part);
        assert_eq!(part, [7, 12, 13, 16, 17]);
        let mut dst = vec![0xeeu8; 30];
        // SAFETY: `dst` outlives the buffer and nothing else touches it meanwhile.
        let ubm = unsafe { UserBufMut::gapped(dst.as_mut_ptr(), l) };
        ubm.write(0, &msg[..9]);
        ubm.write(9, &msg[9..]);
        for (i, &b) in dst.iter().enumerate() {
            let in_run = matches!(i % 16, 0..=7 | 12..=13) && i < 30;
            assert_eq!(b, if in_run { i as u8 } else { 0xee }, "byte {i}");
        }
        assert_eq!(ubm.bounds(6, 8), (6, 20));
    }

    #[test]
    #[should_panic(expected = "read past the end of a user buffer")]
    fn a_gathered_read_past_the_message_panics() {
        let src = [0u8; 30];
        // SAFETY: as above.
        let ub = unsafe { UserBuf::gapped(src.as_ptr(), Arc::new(layout())) };
        let mut out = [0u8; 2];
        ub.read(19, &mut out);
    }
}
