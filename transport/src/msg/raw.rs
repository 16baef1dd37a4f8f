//! The message layer's contract with user buffers and with the NIC's `unsafe` posting calls
//! (one of the few modules with `unsafe`).
//!
//! A nonblocking operation keeps a user buffer across calls, so the layer holds it as an
//! address and length. [`UserBuf`] and [`UserBufMut`] are created `unsafe`ly by the API
//! above (whose requests borrow the buffer until completion, rsmpi's scope design) and then
//! used safely here: the only operations are bounded copies and handing the range to the NIC.

use crate::error::Result;
use crate::nic::{Nic, RecvWr, SendWr};

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

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            offset + dst.len() <= self.len,
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

    /// Copies `src` into the buffer at `offset`; never writes past the buffer's end.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        assert!(
            offset + src.len() <= self.len,
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

/// Posts a send work request whose buffers are message-layer slots or leases.
pub(crate) fn post_send(nic: &dyn Nic, qpn: u32, wr: &SendWr<'_>) -> Result<()> {
    // SAFETY: every SGE names either a slot of a pinned pool the message layer owns for its
    // whole life and does not touch until the completion, or a lease of a user buffer that
    // the request keeps alive (see `UserBuf::new`) until the completion is polled.
    unsafe { nic.post_send(qpn, wr) }
}

/// Posts a receive work request into a message-layer slot.
pub(crate) fn post_recv(nic: &dyn Nic, qpn: u32, wr: &RecvWr<'_>) -> Result<()> {
    // SAFETY: the slot belongs to a pinned pool the message layer owns and does not read
    // until the receive completes.
    unsafe { nic.post_recv(qpn, wr) }
}
