//! User buffers as the buffer modes and the message layer hold them (one of the few modules
//! with `unsafe`).
//!
//! A nonblocking operation keeps a user buffer across calls, so it is held as an address and
//! length. [`UserBuf`] and [`UserBufMut`] are created `unsafe`ly by the API above (whose
//! requests borrow the buffer until completion, rsmpi's scope design) and then used safely:
//! the only operations are bounded copies and handing the range to the NIC. They live at the
//! buffer-mode layer, the lowest that uses them (the message layer re-exports them as
//! `msg::raw`).

/// A user buffer the message layer reads (a send buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserBuf {
    addr: u64,
    len: usize,
}

/// A user buffer the message layer writes (a receive buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserBufMut {
    addr: u64,
    len: usize,
}

impl UserBuf {
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads, and must not be written, until the
    /// operation that receives this value has completed.
    pub unsafe fn new(ptr: *const u8, len: usize) -> UserBuf {
        UserBuf {
            addr: ptr as u64,
            len,
        }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer; never reads outside
    /// it (a range past its end, or one whose end wraps, panics: the protocols check every
    /// range a peer names before it gets here).
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            offset
                .checked_add(dst.len())
                .is_some_and(|end| end <= self.len),
            "read past the end of a user buffer"
        );
        if dst.is_empty() {
            return;
        }
        // SAFETY: in bounds of a range the constructor's caller guaranteed readable for the
        // operation's lifetime; `dst` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr as usize + offset) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
    }
}

impl UserBufMut {
    /// # Safety
    /// `ptr..ptr+len` must stay valid for writes, and must not be read or written by anyone
    /// else, until the operation that receives this value has completed.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> UserBufMut {
        UserBufMut {
            addr: ptr as u64,
            len,
        }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` into the buffer at `offset`; never writes outside the buffer (a range
    /// past its end, or one whose end wraps, panics).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        assert!(
            offset
                .checked_add(src.len())
                .is_some_and(|end| end <= self.len),
            "write past the end of a user buffer"
        );
        if src.is_empty() {
            return;
        }
        // SAFETY: in bounds of a range the constructor's caller guaranteed writable and
        // exclusively ours for the operation's lifetime; `src` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                (self.addr as usize + offset) as *mut u8,
                src.len(),
            )
        };
    }
}
