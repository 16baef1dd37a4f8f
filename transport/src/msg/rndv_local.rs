//! The local rendezvous: a message larger than the eager limit to a rank of this host moves
//! with one kernel copy, no registration and no NIC, as MPICH's CH4 POSIX transport (CMA),
//! Open MPI (`smsc/cma`) and UCX (`cma`) move large messages within a node.
//!
//! The RTS, through the local path's ring, names where the sender's bytes lie
//! ([`wire::LocalSource`]: the buffer's address and, for a buffer with gaps, one element's
//! runs; a buffer whose runs do not fit the RTS is packed first). Once the message matches,
//! the receiver copies it into its buffer with `process_vm_readv`, completes its receive and
//! answers CopyDone, which ends the send. A receive buffer shorter than the message gets its
//! prefix and the truncation error, as on the NIC path.
//!
//! From `PAGEWIRE_RNDV_SPLIT_MIN` bytes (64 KiB) both CPUs copy, as the NIC path's split
//! rendezvous does: the receiver first sends CopyShare, describing its buffer, and copies
//! the front half while the sender writes the back half with `process_vm_writev` and
//! answers ShareDone; the receive completes when both halves are in. Not while this rank
//! has a local rendezvous of its own out to the sender (a sendrecv, an exchange): the
//! sender's CPU is then busy copying that one, so a share would only wait for it, and each
//! side copying its own receive keeps both CPUs busy without the extra messages. For the
//! same reason a sender that has a receive posted for the receiver's messages declines the
//! share (ShareDone of length 0; the receiver then copies the back itself and sends a
//! second CopyDone): the receiver matched the RTS before its own send went out, and
//! sharing would leave the sender one and a half copies to make while the receiver made a
//! half.
//!
//! The sender's answer to CopyShare, its count of CopyDones and the receiver's end at
//! ShareDone are machines of their own (`local_copy.rs`), unit-tested against a fake of the
//! copies and the control path.

use super::local_copy::{
    memory_extents, process_gone, source_extents, LocalCopyIo, LocalSend, LocalSplitRecv,
    ShareAnswer, SplitEnd,
};
use super::matching::Envelope;
use super::raw::UserBuf;
use super::wire::{self, Header, LocalSource, MsgKind, HEADER_BYTES};
use super::{Payload, PointToPoint, RecvState, Req, RequestId, SendState};
use crate::buffer_mode::UserMemory;
use crate::error::{Error, Result};
use crate::nic::WcStatus;
use crate::sys::{self, CmaDirection, Extent};

/// A contiguous run of `len` bytes at `addr`.
fn contiguous(addr: u64, len: u64) -> LocalSource {
    LocalSource {
        addr,
        extent: len,
        count: 1,
        runs: vec![(0, len)],
    }
}

/// Where the bytes of user memory `mem` lie, if that fits in `room` bytes.
fn description(mem: &UserMemory, room: usize) -> Option<LocalSource> {
    let Some(layout) = mem.layout() else {
        return Some(contiguous(mem.addr(), mem.len() as u64));
    };
    let runs: Vec<(u64, u64)> = layout.element_runs().collect();
    (LocalSource::encoded_len(runs.len()) <= room).then(|| LocalSource {
        addr: mem.addr(),
        extent: layout.extent(),
        count: layout.count(),
        runs,
    })
}

/// Where a send buffer's bytes lie for the receiver, within `room` bytes of RTS payload:
/// the buffer itself, or a packed copy of it (returned, to keep until the copy is done).
fn describe(buf: &UserBuf, room: usize) -> (LocalSource, Option<Vec<u8>>) {
    if let Some(source) = description(buf, room) {
        return (source, None);
    }
    let mut packed = vec![0u8; buf.len()];
    buf.read(0, &mut packed);
    (
        contiguous(packed.as_ptr() as u64, packed.len() as u64),
        Some(packed),
    )
}

/// Where a split copy of `n` bytes changes hands: the receiver copies `[0, k)`, the sender
/// `[k, n)`.
fn split_point(n: usize) -> usize {
    (n / 2) & !63
}

impl PointToPoint {
    /// Sends the RTS of send `id` to local peer `peer`; false if its ring is full.
    pub(crate) fn start_local_rndv_send(&mut self, peer: usize, id: RequestId) -> Result<bool> {
        let Some(Req::Send(s)) = self.reqs.get(id) else {
            return Ok(true);
        };
        let (buf, tag, context) = (s.buf.clone(), s.tag, s.context);
        let room = self.local.as_ref().map_or(0, |l| l.capacity()) - HEADER_BYTES;
        let (source, packed) = describe(&buf, room);
        let mut h = Header::new(MsgKind::Rts);
        h.flags = wire::LOCAL_COPY;
        h.tag = tag;
        h.context = context;
        h.size = buf.len() as u64;
        h.sreq = id.0;
        if !self.send_message(peer, h, Payload::Bytes(&source.encode()))? {
            return Ok(false);
        }
        self.counters.rndv_sent += 1;
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            s.state = SendState::LocalCopy(LocalSend::new(packed));
            self.peers[peer].local_copies_out += 1;
        }
        Ok(true)
    }

    /// Receive `rid` matched the local RTS `h` of `peer`: copies the message out of the
    /// sender's memory, completes the receive and tells the sender.
    pub(crate) fn local_rndv_recv(
        &mut self,
        rid: RequestId,
        peer: usize,
        h: Header,
        source: &LocalSource,
    ) -> Result<()> {
        let Some(Req::Recv(r)) = self.reqs.get(rid) else {
            return Ok(());
        };
        let buf = r.buf.clone();
        let size = h.size as usize;
        let n = size.min(buf.len());
        let pid = self.local_pid(peer);
        if n >= self.cfg.split_min
            && self.peers[peer].local_copies_out == 0
            && self.share_local_copy(rid, peer, &h, n, pid, source)?
        {
            // The sender copies the back; this side the front.
            let k = split_point(n);
            let front = sys::cma_copy(
                pid,
                CmaDirection::Read,
                &memory_extents(&buf, 0, k),
                &source_extents(source, 0, k),
            );
            return self.front_copied(rid, peer, &h, front);
        }
        let copied = sys::cma_copy(
            pid,
            CmaDirection::Read,
            &memory_extents(&buf, 0, n),
            &source_extents(source, 0, n),
        );
        let env = Envelope {
            source: peer,
            tag: h.tag,
            context: h.context,
        };
        let mut done = Header::new(MsgKind::CopyDone);
        done.sreq = h.sreq;
        match copied {
            Ok(_) => self.complete_eager(rid, env, size, buf.len()),
            Err(e) if process_gone(&e) => {
                // The sender is gone, as a NIC's retries would find: this receive and every
                // other operation with it fail.
                let what = "receiving a local message";
                self.fail_peer(peer, WcStatus::RetryExceeded, what);
                let status = WcStatus::RetryExceeded;
                self.fail_request(rid, Error::Communication { peer, status, what }, true);
                return Ok(());
            }
            Err(e) => {
                done.flags |= wire::COPY_FAILED;
                let what = format!("copying a {size}-byte message from rank {peer} (pid {pid})");
                self.complete(rid, Err(Error::os(what, e)));
            }
        }
        self.send_control(peer, done)
    }

    /// Asks the sender of local RTS `h` to write the back of the message (`n` bytes land)
    /// into receive `rid`'s buffer: true if CopyShare went out (false: its ring is full or
    /// the buffer's description does not fit; this side then copies everything).
    fn share_local_copy(
        &mut self,
        rid: RequestId,
        peer: usize,
        h: &Header,
        n: usize,
        pid: u32,
        source: &LocalSource,
    ) -> Result<bool> {
        let Some(Req::Recv(r)) = self.reqs.get(rid) else {
            return Ok(false);
        };
        let room = self.local.as_ref().map_or(0, |l| l.capacity()) - HEADER_BYTES;
        let Some(desc) = description(&r.buf, room) else {
            return Ok(false);
        };
        let k = split_point(n);
        let mut share = Header::new(MsgKind::CopyShare);
        share.sreq = h.sreq;
        share.rreq = rid.0;
        share.size = k as u64;
        share.len = (n - k) as u64;
        if !self.send_message(peer, share, Payload::Bytes(&desc.encode()))? {
            return Ok(false);
        }
        self.counters.rndv_split += 1;
        if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
            r.state = RecvState::LocalSplit(Box::new(LocalSplitRecv {
                peer,
                tag: h.tag,
                size: h.size as usize,
                sreq: h.sreq,
                pid,
                source: source.clone(),
                back: (k, n),
                failed: None,
            }));
        }
        Ok(true)
    }

    /// This side copied the front of split receive `rid` (`front`: how that went): tells the
    /// sender, and waits for its ShareDone.
    fn front_copied(
        &mut self,
        rid: RequestId,
        peer: usize,
        h: &Header,
        front: std::io::Result<u64>,
    ) -> Result<()> {
        let mut done = Header::new(MsgKind::CopyDone);
        done.sreq = h.sreq;
        match front {
            Ok(_) => {}
            Err(e) if process_gone(&e) => {
                let what = "receiving a local message";
                self.fail_peer(peer, WcStatus::RetryExceeded, what);
                return Ok(());
            }
            Err(e) => {
                done.flags |= wire::COPY_FAILED;
                if let Some(Req::Recv(r)) = self.reqs.get_mut(rid) {
                    if let RecvState::LocalSplit(ls) = &mut r.state {
                        ls.failed = Some(ls.copy_error(e));
                    }
                }
            }
        }
        self.send_control(peer, done)
    }

    /// The sender of a split local rendezvous asks, by CopyShare `h`, for the back of its
    /// message to be written into the receiver's buffer `dest`: writes it, and answers.
    pub(crate) fn local_copy_share(
        &mut self,
        peer: usize,
        h: Header,
        dest: &LocalSource,
    ) -> Result<()> {
        let id = RequestId(h.sreq);
        let Some(Req::Send(s)) = self.reqs.get(id) else {
            self.protocol_violation(peer, "a copy share for no send");
            return Ok(());
        };
        if !matches!(s.state, SendState::LocalCopy(_)) {
            self.protocol_violation(peer, "a copy share for a send that is not a local one");
            return Ok(());
        }
        if s.peer != peer {
            self.protocol_violation(peer, "a copy share outside the message");
            return Ok(());
        }
        // This rank waits for a message from the receiver, whose copy will keep this CPU
        // busy: declined; the receiver copies the back itself.
        let decline = self.matcher.expects_from(peer);
        let answer = self
            .step_local_send(id, |ls, buf, io| {
                ls.on_copy_share(buf, &h, dest, decline, io)
            })
            .expect("checked above");
        match answer? {
            ShareAnswer::OutsideMessage => {
                self.protocol_violation(peer, "a copy share outside the message")
            }
            ShareAnswer::Declined => self.counters.local_shares_declined += 1,
            ShareAnswer::PeerGone => {
                self.fail_peer(peer, WcStatus::RetryExceeded, "sending a local message")
            }
            ShareAnswer::Written => {}
        }
        Ok(())
    }

    /// The sender of split receive `h.rreq` wrote the back (or declined to): the receive
    /// completes.
    pub(crate) fn local_share_done(&mut self, peer: usize, h: Header) {
        let id = RequestId(h.rreq);
        let Some(Req::Recv(r)) = self.reqs.get_mut(id) else {
            return;
        };
        let mut ls = match std::mem::replace(&mut r.state, RecvState::Posted) {
            RecvState::LocalSplit(ls) => ls,
            other => {
                r.state = other;
                return;
            }
        };
        if ls.peer != peer {
            r.state = RecvState::LocalSplit(ls);
            self.protocol_violation(peer, "a share-done for another rank's receive");
            return;
        }
        let (buf, context, tag, size) = (r.buf.clone(), r.sel.context, ls.tag, ls.size);
        let mut io = LocalIo {
            pid: ls.pid,
            peer,
            p2p: self,
        };
        let end = ls.on_share_done(&buf, &h, &mut io);
        if let Some(Req::Recv(r)) = self.reqs.get_mut(id) {
            r.state = RecvState::LocalSplit(ls);
        }
        match end {
            SplitEnd::Received => {
                let env = Envelope {
                    source: peer,
                    tag,
                    context,
                };
                self.complete_eager(id, env, size, buf.len());
            }
            SplitEnd::Failed(e) => self.complete(id, Err(e)),
            SplitEnd::SenderGone => {
                self.fail_peer(peer, WcStatus::RetryExceeded, "receiving a local message")
            }
        }
    }

    /// Local peer `peer` is done with the buffer of the send its CopyDone `h` names.
    pub(crate) fn local_copy_done(&mut self, peer: usize, h: Header) {
        let id = RequestId(h.sreq);
        let Some(Req::Send(s)) = self.reqs.get_mut(id) else {
            return;
        };
        let SendState::LocalCopy(ls) = &mut s.state else {
            return;
        };
        if s.peer != peer {
            self.protocol_violation(peer, "a copy-done for another rank's send");
            return;
        }
        let Some(outcome) = ls.on_copy_done(&h, peer) else {
            return;
        };
        let (tag, len) = (s.tag, s.buf.len());
        let result = outcome.map(|()| self.sent_status(tag, len));
        self.complete(id, result);
    }

    /// Runs `step` on the local rendezvous state of send `id`, with the layer's I/O for it
    /// (the state leaves the request for the step). `None` if `id` is no local send.
    fn step_local_send<T>(
        &mut self,
        id: RequestId,
        step: impl FnOnce(&mut LocalSend, &UserMemory, &mut LocalIo<'_>) -> T,
    ) -> Option<T> {
        let Some(Req::Send(s)) = self.reqs.get_mut(id) else {
            return None;
        };
        let mut ls = match std::mem::replace(&mut s.state, SendState::Queued) {
            SendState::LocalCopy(ls) => ls,
            other => {
                s.state = other;
                return None;
            }
        };
        let (peer, buf) = (s.peer, s.buf.clone());
        let mut io = LocalIo {
            pid: self.local_pid(peer),
            peer,
            p2p: self,
        };
        let out = step(&mut ls, &buf, &mut io);
        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
            s.state = SendState::LocalCopy(ls);
        }
        Some(out)
    }

    /// The process of local peer `peer`.
    fn local_pid(&self, peer: usize) -> u32 {
        self.local
            .as_ref()
            .and_then(|l| l.pid_of(peer))
            .expect("a local peer")
    }
}

/// [`LocalCopyIo`] over the layer: kernel copies with local peer `peer`'s process `pid`, and
/// the layer's control path to it.
struct LocalIo<'a> {
    p2p: &'a mut PointToPoint,
    peer: usize,
    pid: u32,
}

impl LocalCopyIo for LocalIo<'_> {
    fn copy(
        &mut self,
        dir: CmaDirection,
        local: &[Extent],
        remote: &[Extent],
    ) -> std::io::Result<u64> {
        sys::cma_copy(self.pid, dir, local, remote)
    }

    fn send_control(&mut self, h: Header) -> Result<()> {
        self.p2p.send_control(self.peer, h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer_mode::Layout;
    use std::sync::Arc;

    #[test]
    #[allow(unsafe_code)]
    fn a_contiguous_buffer_is_one_run_and_a_gapped_one_its_element() {
        let data = [7u8; 64];
        // SAFETY: `data` outlives the buffers and is not written.
        let buf = unsafe { UserBuf::new(data.as_ptr(), 64) };
        let (s, packed) = describe(&buf, 1024);
        assert!(packed.is_none());
        assert_eq!(
            (s.addr, s.count, s.runs.clone()),
            (data.as_ptr() as u64, 1, vec![(0, 64)])
        );
        assert_eq!(
            source_extents(&s, 0, 10),
            vec![Extent {
                addr: data.as_ptr() as u64,
                len: 10
            }]
        );
        // Four elements 16 bytes apart, each bytes [0, 4) and [8, 12).
        let layout = Arc::new(Layout::new([(0, 4), (8, 4)], 16, 4));
        // SAFETY: as above; the runs lie in `data`.
        let gapped = unsafe { UserBuf::gapped(data.as_ptr(), layout) };
        let (s, packed) = describe(&gapped, 1024);
        assert!(packed.is_none());
        assert_eq!(
            (s.extent, s.count, s.runs.clone()),
            (16, 4, vec![(0, 4), (8, 4)])
        );
        let e = source_extents(&s, 0, 10);
        let base = data.as_ptr() as u64;
        assert_eq!(
            e,
            vec![
                Extent { addr: base, len: 4 },
                Extent {
                    addr: base + 8,
                    len: 4
                },
                Extent {
                    addr: base + 16,
                    len: 2
                },
            ]
        );
        // No room for the runs: a packed copy of the 32 message bytes, described as one run.
        let (s, packed) = describe(&gapped, 40);
        let packed = packed.expect("packed");
        assert_eq!(packed, vec![7u8; 32]);
        assert_eq!((s.addr, s.runs), (packed.as_ptr() as u64, vec![(0, 32)]));
        let encoded = LocalSource::decode(&source_extents_source(&gapped).encode(), 32);
        assert!(encoded.is_ok());
    }

    fn source_extents_source(buf: &UserBuf) -> LocalSource {
        describe(buf, 1024).0
    }
}
