//! The split local rendezvous as machines, against [`LocalCopyIo`] alone: the sender's
//! answer to a CopyShare and its count of CopyDones ([`LocalSend`]), and the receiver's end
//! of a shared copy at ShareDone ([`LocalSplitRecv`]). `rndv_local.rs` has the protocol's
//! whole story and the layer's glue; the copies themselves are one kernel copy each
//! (`process_vm_readv`/`writev`) between this process and the peer's.

use super::wire::{self, Header, LocalSource, MsgKind};
use crate::buffer_mode::{Layout, UserMemory};
use crate::error::{Error, Result};
use crate::nic::WcStatus;
use crate::sys::{CmaDirection, Extent};

#[cfg(test)]
mod tests;

/// What a side of a local rendezvous needs besides its own state: copies to and from its
/// peer's memory, and control messages to it.
pub(crate) trait LocalCopyIo {
    /// One kernel copy between this process's `local` extents and the peer's `remote` ones:
    /// `Read` brings the peer's bytes here, `Write` takes them there.
    fn copy(
        &mut self,
        dir: CmaDirection,
        local: &[Extent],
        remote: &[Extent],
    ) -> std::io::Result<u64>;

    /// Sends a control message to the peer (queued if its ring is full). An error means the
    /// peer cannot be reached.
    fn send_control(&mut self, h: Header) -> Result<()>;
}

/// Whether a CMA copy failed because the peer's process is gone (what a NIC's retries
/// would find).
pub(crate) fn process_gone(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH)
}

/// Message bytes `[at, at + n)` of `source`, as extents of its owner's address space.
pub(crate) fn source_extents(source: &LocalSource, at: usize, n: usize) -> Vec<Extent> {
    let layout = Layout::new(source.runs.iter().copied(), source.extent, source.count);
    layout
        .pieces(at as u64, n as u64)
        .map(|p| Extent {
            addr: source.addr.wrapping_add(p.offset),
            len: p.len,
        })
        .collect()
}

/// Message bytes `[at, at + n)` of user memory `mem`, as extents of this process.
pub(crate) fn memory_extents(mem: &UserMemory, at: usize, n: usize) -> Vec<Extent> {
    match mem.layout() {
        None => vec![Extent {
            addr: mem.addr() + at as u64,
            len: n as u64,
        }],
        Some(layout) => layout
            .pieces(at as u64, n as u64)
            .map(|p| Extent {
                addr: mem.addr() + p.offset,
                len: p.len,
            })
            .collect(),
    }
}

/// The sending side of a local rendezvous: the receiver copies from its buffer (or from
/// `packed`, a packed copy of a buffer whose runs did not fit the RTS) until it says it is
/// done.
#[derive(Debug)]
pub(crate) struct LocalSend {
    packed: Option<Vec<u8>>,
    /// CopyDone messages still to come: one, or two once this side declined to share the
    /// copy (the receiver then copies the back too, and says so again).
    copy_dones: u8,
    /// A CopyDone said the receiver's copy failed.
    copy_failed: bool,
}

/// How the sender answered a CopyShare.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ShareAnswer {
    /// It asked for bytes outside the message: the receiver broke the protocol; nothing was
    /// written or answered.
    OutsideMessage,
    /// Declined (ShareDone of length 0): the receiver copies the back itself.
    Declined,
    /// The back was written (or its write failed, which ShareDone says), and answered.
    Written,
    /// The receiver's process is gone.
    PeerGone,
}

impl LocalSend {
    /// A send whose RTS went out, reading from `packed` if the buffer was packed.
    pub(crate) fn new(packed: Option<Vec<u8>>) -> LocalSend {
        LocalSend {
            packed,
            copy_dones: 1,
            copy_failed: false,
        }
    }

    /// CopyShare `h`: the receiver asks this side to write message bytes
    /// `[h.size, h.size + h.len)` of `buf` into its buffer `dest`. With `decline` (this rank
    /// waits for a message from the receiver, whose copy will keep this CPU busy) it answers
    /// that it will not, and waits for a second CopyDone.
    pub(crate) fn on_copy_share(
        &mut self,
        buf: &UserMemory,
        h: &Header,
        dest: &LocalSource,
        decline: bool,
        io: &mut impl LocalCopyIo,
    ) -> Result<ShareAnswer> {
        let (at, n) = (h.size as usize, h.len as usize);
        if at.checked_add(n).is_none_or(|end| end > buf.len()) {
            return Ok(ShareAnswer::OutsideMessage);
        }
        let mut done = Header::new(MsgKind::ShareDone);
        done.rreq = h.rreq;
        if decline {
            self.copy_dones = 2;
            io.send_control(done)?;
            return Ok(ShareAnswer::Declined);
        }
        let local = match &self.packed {
            Some(p) => vec![Extent {
                addr: p.as_ptr() as u64 + at as u64,
                len: n as u64,
            }],
            None => memory_extents(buf, at, n),
        };
        let written = io.copy(CmaDirection::Write, &local, &source_extents(dest, at, n));
        done.len = n as u64;
        match written {
            Ok(_) => {}
            Err(e) if process_gone(&e) => return Ok(ShareAnswer::PeerGone),
            Err(_) => done.flags |= wire::COPY_FAILED,
        }
        io.send_control(done)?;
        Ok(ShareAnswer::Written)
    }

    /// CopyDone `h`: the receiver is done with (its share of) this side's buffer. Once the
    /// last has come, the send's outcome: `Ok` or, if a copy failed, the error.
    pub(crate) fn on_copy_done(&mut self, h: &Header, peer: usize) -> Option<Result<()>> {
        self.copy_failed |= h.flags & wire::COPY_FAILED != 0;
        self.copy_dones = self.copy_dones.saturating_sub(1);
        if self.copy_dones > 0 {
            return None;
        }
        Some(match self.copy_failed {
            false => Ok(()),
            true => Err(Error::Communication {
                peer,
                status: WcStatus::RemoteAccessError,
                what: "the receiver reading this send's buffer",
            }),
        })
    }
}

/// A receive whose local rendezvous both sides copy: what it waits for.
pub(crate) struct LocalSplitRecv {
    /// The sender.
    pub peer: usize,
    /// The message's tag and size.
    pub tag: i32,
    pub size: usize,
    /// The sender's request, its process, where its bytes lie, and the back's range
    /// `[k, n)` of the bytes that land: this side copies the back too if the sender
    /// declines.
    pub sreq: u64,
    pub pid: u32,
    pub source: LocalSource,
    pub back: (usize, usize),
    /// This side's copy of the front failed with this.
    pub failed: Option<Error>,
}

/// How a split receive ended.
#[derive(Debug)]
pub(crate) enum SplitEnd {
    /// Every byte is in.
    Received,
    /// It failed with this.
    Failed(Error),
    /// The sender's process is gone.
    SenderGone,
}

impl LocalSplitRecv {
    /// ShareDone `h`: the sender wrote the back of the message into `buf` (`h.len` bytes,
    /// flagged COPY_FAILED if its write failed), or declined (`h.len` 0): this side then
    /// copies the back too, unless its front failed, and tells the sender by a second
    /// CopyDone.
    pub(crate) fn on_share_done(
        &mut self,
        buf: &UserMemory,
        h: &Header,
        io: &mut impl LocalCopyIo,
    ) -> SplitEnd {
        let mut failed = self.failed.take();
        if h.len == 0 {
            let (k, n) = self.back;
            let mut done = Header::new(MsgKind::CopyDone);
            done.sreq = self.sreq;
            if failed.is_none() {
                let back = io.copy(
                    CmaDirection::Read,
                    &memory_extents(buf, k, n - k),
                    &source_extents(&self.source, k, n - k),
                );
                match back {
                    Ok(_) => {}
                    Err(e) if process_gone(&e) => return SplitEnd::SenderGone,
                    Err(e) => failed = Some(self.copy_error(e)),
                }
            }
            if failed.is_some() {
                done.flags |= wire::COPY_FAILED;
            }
            if let Err(e) = io.send_control(done) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            Some(e) => SplitEnd::Failed(e),
            None if h.flags & wire::COPY_FAILED != 0 => SplitEnd::Failed(Error::Communication {
                peer: self.peer,
                status: WcStatus::RemoteAccessError,
                what: "the sender writing the back of a local message",
            }),
            None => SplitEnd::Received,
        }
    }

    /// This side's copy from the sender failed with `e`.
    pub(crate) fn copy_error(&self, e: std::io::Error) -> Error {
        let (size, peer, pid) = (self.size, self.peer, self.pid);
        Error::os(
            format!("copying a {size}-byte message from rank {peer} (pid {pid})"),
            e,
        )
    }
}
