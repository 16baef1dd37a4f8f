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

impl super::PointToPoint {
    /// Sends `buf` to `dest` and returns once it may be reused (`MPI_Send`); safe because
    /// the operation completes before the borrow ends.
    pub fn send(
        &mut self,
        dest: usize,
        tag: i32,
        context: u32,
        buf: &[u8],
    ) -> Result<super::Status> {
        // SAFETY: waited for below, while `buf` is borrowed.
        let b = unsafe { UserBuf::new(buf.as_ptr(), buf.len()) };
        let id = self.isend(dest, tag, context, b, false)?;
        self.wait(id)
    }

    /// Receives into `buf` (`MPI_Recv`); `source`/`tag` `None` are wildcards.
    pub fn recv(
        &mut self,
        source: Option<usize>,
        tag: Option<i32>,
        context: u32,
        buf: &mut [u8],
    ) -> Result<super::Status> {
        // SAFETY: waited for below, while `buf` is exclusively borrowed.
        let b = unsafe { UserBufMut::new(buf.as_mut_ptr(), buf.len()) };
        let id = self.irecv(source, tag, context, b)?;
        self.wait(id)
    }

    /// Sends `send` to `dest` and receives into `recv` from `source` at the same time
    /// (`MPI_Sendrecv`); returns the receive's status.
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv(
        &mut self,
        dest: usize,
        send_tag: i32,
        send: &[u8],
        source: Option<usize>,
        recv_tag: Option<i32>,
        recv: &mut [u8],
        context: u32,
    ) -> Result<super::Status> {
        // SAFETY: both operations are waited for below, while the buffers are borrowed.
        let r = unsafe { UserBufMut::new(recv.as_mut_ptr(), recv.len()) };
        let rid = self.irecv(source, recv_tag, context, r)?;
        // SAFETY: as above.
        let s = unsafe { UserBuf::new(send.as_ptr(), send.len()) };
        let sid = self.isend(dest, send_tag, context, s, false);
        let rstatus = self.wait(rid);
        if let Ok(sid) = sid {
            self.wait(sid)?;
        } else {
            sid?;
        }
        rstatus
    }

    /// Posts every receive and every send, then waits for all (the building block of
    /// alltoall-like exchanges). Returns the receives' statuses in order; the first error
    /// wins, after every operation has completed.
    pub fn exchange(
        &mut self,
        context: u32,
        tag: i32,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> Result<Vec<super::Status>> {
        let mut rids = Vec::with_capacity(recvs.len());
        for (src, buf) in recvs.iter_mut() {
            // SAFETY: every receive is waited for below, while `recvs` is borrowed.
            let b = unsafe { UserBufMut::new(buf.as_mut_ptr(), buf.len()) };
            rids.push(self.irecv(Some(*src), Some(tag), context, b));
        }
        let mut sids = Vec::with_capacity(sends.len());
        for (dest, buf) in sends {
            // SAFETY: every send is waited for below, while `sends` is borrowed.
            let b = unsafe { UserBuf::new(buf.as_ptr(), buf.len()) };
            sids.push(self.isend(*dest, tag, context, b, false));
        }
        let mut first_err = None;
        let mut statuses = Vec::with_capacity(rids.len());
        for r in rids {
            match r.and_then(|id| self.wait(id)) {
                Ok(s) => statuses.push(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for s in sids {
            if let Err(e) = s.and_then(|id| self.wait(id)) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(statuses),
        }
    }
}
