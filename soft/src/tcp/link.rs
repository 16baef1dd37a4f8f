//! One TCP connection to a peer on another host: the wire that carries the ring
//! packets, acknowledgements and fault outcomes a local peer would exchange through shared
//! memory.
//!
//! - **Sending.** The engine writes a TCP peer's packets into the send ring of that peer's
//!   local image (`RankMemory::local_image`), exactly as it writes a local peer's ring;
//!   [`TcpLink::flush`] sends the ring's packets and the queued control frames with one
//!   gathered `sendmsg` per batch, from the slots themselves, and frees each slot once the
//!   socket took all of it. A socket that takes nothing more leaves the rest queued: the ring
//!   fills and the engine waits, as for a full ring in shared memory (back-pressure).
//! - **Receiving.** [`TcpLink::pump`] reads what has arrived into the link's buffer, decodes
//!   and checks every frame (`frame.rs`), and hands each packet to the engine, which takes
//!   it as it takes a packet from a local peer's ring, its payload read where it lies in the
//!   buffer (one copy fewer than placing it into a ring first): so the target's checks (the
//!   TPT, receives, receive-side faults) are the same code on both wires. ACKs and NAKs go
//!   into this rank's acknowledgement lines, fault outcomes into the image's fault slots.
//!   The engine takes every packet at once (refusing what it cannot take, with a NAK, as
//!   from a ring), so reading never waits for room.
//! - **Errors.** A frame the decoder refuses, a connection reset, or an end of stream closes
//!   the link, with one line on stderr saying which peer and why. The peer then counts as
//!   dead: its queue pairs' requests end with retry-exceeded completions as for a peer whose
//!   process died.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Release};

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::frame::{self, Frame, MAX_FRAME_BYTES, PREFIX_BYTES};
use crate::dma;
use crate::layout::RankMemory;
use crate::ring::{Header, Ring, ENCODED_HEADER_BYTES};
use pagewire_sys::{self as sys, Extent};

/// How long a link holds ACKs, when nothing else waits to go out, for a packet to carry
/// them (a reply, in a ping-pong): on a wire where each segment costs the kernel's whole
/// send and receive path, a separate ACK on the critical path costs as much as the message.
/// TCP's delayed ACK, at the scale of a NIC; NAKs and fault outcomes never wait.
pub(crate) const ACK_DELAY_NS: u64 = 20_000;

/// Ring packets one `sendmsg` carries at most.
const SEND_BATCH: usize = 32;
/// Bytes of a link's receive buffer: room for many small frames per `recvmsg` and always for
/// one whole packet after a partial one.
const RECV_BUFFER: usize = 256 * 1024;

type PacketHead = [u8; PREFIX_BYTES + ENCODED_HEADER_BYTES];

/// A packet in the image's ring whose payload is not in its slot: the frame reads it from
/// the sender's memory when it goes out ([`TcpLink::queue_gathered`]).
#[derive(Debug)]
struct Gathered {
    /// Its position in the ring.
    index: u64,
    /// Its payload: `(address, length)` pieces of this process's memory, in order.
    pieces: SmallVec<[(u64, u64); 4]>,
}

/// What is queued to go out, beyond the packets in the image's ring.
#[derive(Debug, Default)]
struct Outbound {
    /// The ring's packets whose payload is read from memory, oldest first.
    gathered: VecDeque<Gathered>,
    /// Encoded control frames (ACK, NAK, fault outcomes).
    control: Vec<u8>,
    /// Bytes of `control` sent.
    control_sent: usize,
    /// Bytes of the ring's oldest packet's frame sent (it goes first when non-zero).
    ring_sent: usize,
    /// When the oldest queued control frame was queued (monotonic ns).
    control_since: u64,
    /// A queued control frame must not wait (a NAK, a fault outcome, a goodbye).
    urgent: bool,
}

/// What has arrived and not been placed yet.
struct Inbound {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// The connection to one peer on another host.
pub(crate) struct TcpLink {
    /// The peer's rank.
    pub peer: usize,
    /// This rank.
    me: usize,
    stream: TcpStream,
    out: Mutex<Outbound>,
    inp: Mutex<Inbound>,
    closed: AtomicBool,
    /// The peer said goodbye: its end of stream is no failure.
    said_bye: AtomicBool,
    /// This NIC is going down: a peer's reset or closed pipe is no news.
    leaving: AtomicBool,
    /// Why the link closed, when it failed (not after a goodbye).
    failure: Mutex<Option<String>>,
}

impl std::fmt::Debug for TcpLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpLink")
            .field("peer", &self.peer)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Sums of extents' lengths.
fn extent_bytes(e: &[Extent]) -> usize {
    e.iter().map(|e| e.len as usize).sum()
}

impl TcpLink {
    /// A link over `stream` (connected and authenticated): made non-blocking, with Nagle's
    /// delay off (a packet goes out when the engine hands it over, as a NIC sends).
    pub(crate) fn new(me: usize, peer: usize, stream: TcpStream) -> io::Result<TcpLink> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(TcpLink {
            peer,
            me,
            stream,
            out: Mutex::new(Outbound::default()),
            inp: Mutex::new(Inbound {
                buf: vec![0; RECV_BUFFER],
                start: 0,
                end: 0,
            }),
            closed: AtomicBool::new(false),
            said_bye: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            failure: Mutex::new(None),
        })
    }

    /// Whether the connection has ended (the peer counts as dead).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Acquire)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Whether anything waits to go out (packets in `ring` or control frames): the driver
    /// then waits for the socket to take more.
    pub(crate) fn has_output(&self, ring: &Ring<'_>) -> bool {
        !self.is_closed()
            && (ring.peek().is_some() || self.out.try_lock().is_none_or(|o| !o.control.is_empty()))
    }

    /// Says goodbye (this NIC is going down) and closes the link, without a word.
    pub(crate) fn say_bye(&self, ring: &Ring<'_>) {
        self.leaving.store(true, Release);
        self.queue(&Frame::Bye);
        // A socket that takes nothing now gets no more tries: the end of stream follows.
        self.flush(ring);
        if !self.closed.swap(true, Release) {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
    }

    /// Closes the link for `why` (once, with one line on stderr unless either side was
    /// going down in order).
    fn close(&self, why: &str) {
        let quiet = self.said_bye.load(Acquire) || self.leaving.load(Acquire);
        if !self.closed.swap(true, Release) && !quiet {
            *self.failure.lock() = Some(why.to_string());
            eprintln!(
                "pagewire: rank {}: closed the TCP connection to rank {}: {why}",
                self.me, self.peer
            );
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Why the link failed, if it did (a goodbye is no failure).
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Writes `bytes` on the connection as they are, after what is queued (hostile-peer
    /// tests: what any program that connects can send). False if the link is closed.
    pub(crate) fn send_raw(&self, ring: &Ring<'_>, bytes: &[u8]) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.has_output(ring) && std::time::Instant::now() < deadline {
            self.flush(ring);
        }
        let _o = self.out.lock();
        let mut at = 0;
        while at < bytes.len() && !self.is_closed() && std::time::Instant::now() < deadline {
            let rest = Extent {
                addr: bytes[at..].as_ptr() as u64,
                len: (bytes.len() - at) as u64,
            };
            match sys::send_extents(self.fd(), &[rest]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::yield_now();
                }
                Err(_) => return false,
            }
        }
        at == bytes.len()
    }

    /// Queues a control frame; [`TcpLink::flush`] sends it.
    pub(crate) fn queue(&self, f: &Frame<'_>) {
        if !self.is_closed() {
            let mut o = self.out.lock();
            if o.control.is_empty() {
                o.control_since = sys::monotonic_ns();
            }
            o.urgent |= !matches!(f, Frame::Ack { .. });
            frame::encode_control(f, &mut o.control);
        }
    }

    /// [`TcpLink::flush`], except that ACKs younger than [`ACK_DELAY_NS`] with nothing
    /// else to go wait (unless `force`).
    pub(crate) fn flush_unless_young(&self, ring: &Ring<'_>, force: bool) -> usize {
        if !force && ring.peek().is_none() {
            let o = self.out.lock();
            let young = !o.urgent
                && o.control_sent == 0
                && o.ring_sent == 0
                && (o.control.is_empty()
                    || sys::monotonic_ns().saturating_sub(o.control_since) < ACK_DELAY_NS);
            if young {
                return 0;
            }
        }
        self.flush(ring)
    }

    /// Queues packet `h` in `ring` (the image's send ring) with its payload left in this
    /// process's memory, the `(address, length)` `pieces` in order, which the caller holds
    /// (translated and in use) until it calls [`TcpLink::settle`]: the frame reads the bytes
    /// from there when it goes out, as an HCA reads host memory by DMA, instead of the
    /// engine copying them into the slot first. False (nothing done) if the ring is full or
    /// a page of the pieces is not mapped: the caller then pushes the packet as any other
    /// (whose guarded copy fails on that page and marks the packet for the receiver to drop;
    /// the socket would fail such a frame half-sent).
    pub(crate) fn queue_gathered(
        &self,
        ring: &Ring<'_>,
        h: &Header,
        pieces: &[(u64, u64)],
    ) -> bool {
        let mut o = self.out.lock();
        if self.is_closed() || !dma::readable(pieces) {
            return false;
        }
        let Some((index, slot)) = ring.reserve_indexed() else {
            return false;
        };
        ring.publish(slot, h);
        o.gathered.push_back(Gathered {
            index,
            pieces: pieces.iter().copied().filter(|p| p.1 > 0).collect(),
        });
        true
    }

    /// Sends what the socket takes now, then copies into their slots the payloads of the
    /// gathered packets it did not take (their memory is about to be released), so that
    /// they go out later like any packet. The engine calls it before it lets go of the
    /// memory it queued with [`TcpLink::queue_gathered`].
    pub(crate) fn settle(&self, ring: &Ring<'_>) {
        let mut o = self.out.lock();
        if o.gathered.is_empty() {
            return;
        }
        self.flush_locked(&mut o, ring);
        while let Some(g) = o.gathered.pop_front() {
            let mut at = ring.slot_at(g.index).payload_addr();
            for &(addr, len) in &g.pieces {
                if dma::copy(at, addr, len).is_err() {
                    // Unmapped since `queue_gathered` probed it: the application broke the
                    // contract of its work request while the NIC read its memory.
                    o.gathered.clear();
                    drop(o);
                    self.close("a payload's memory was unmapped while it was being sent");
                    return;
                }
                at += len;
            }
        }
    }

    /// Sends what is queued — the packets of `ring` (the image's send ring) and the control
    /// frames — as far as the socket takes it now; frees each packet's slot once all of it
    /// went out. Returns the bytes sent.
    pub(crate) fn flush(&self, ring: &Ring<'_>) -> usize {
        if self.is_closed() {
            return 0;
        }
        let mut o = self.out.lock();
        self.flush_locked(&mut o, ring)
    }

    fn flush_locked(&self, o: &mut Outbound, ring: &Ring<'_>) -> usize {
        if self.is_closed() {
            return 0;
        }
        let mut total = 0;
        loop {
            // The oldest packet's frame first if it is part-sent, then the control frames
            // (they never interleave with a part-sent packet), then more packets.
            let head_index = ring.head_index();
            let mut heads: SmallVec<[PacketHead; SEND_BATCH]> = SmallVec::new();
            let mut lens: SmallVec<[usize; SEND_BATCH]> = SmallVec::new();
            let mut payloads: SmallVec<[SmallVec<[Extent; 4]>; SEND_BATCH]> = SmallVec::new();
            let mut gathered = o.gathered.iter().peekable();
            for n in 0..SEND_BATCH as u64 {
                let Some((h, slot)) = ring.peek_nth(n) else {
                    break;
                };
                heads.push(frame::packet_head(&h));
                lens.push(PREFIX_BYTES + ENCODED_HEADER_BYTES + h.payload_len as usize);
                while gathered.next_if(|g| g.index < head_index + n).is_some() {}
                let payload = match gathered.next_if(|g| g.index == head_index + n) {
                    Some(g) => g
                        .pieces
                        .iter()
                        .map(|&(addr, len)| Extent { addr, len })
                        .collect(),
                    None => smallvec::smallvec![Extent {
                        addr: slot.payload_addr(),
                        len: h.payload_len as u64,
                    }],
                };
                payloads.push(payload);
            }
            let frame_extents = |i: usize, skip: usize| -> SmallVec<[Extent; 5]> {
                let head = Extent {
                    addr: heads[i].as_ptr() as u64,
                    len: heads[i].len() as u64,
                };
                let mut v: SmallVec<[Extent; 5]> = SmallVec::new();
                let mut skip = skip as u64;
                for &e in std::iter::once(&head).chain(payloads[i].iter()) {
                    if skip >= e.len {
                        skip -= e.len;
                    } else {
                        v.push(Extent {
                            addr: e.addr + skip,
                            len: e.len - skip,
                        });
                        skip = 0;
                    }
                }
                v
            };
            let mut iov: SmallVec<[Extent; 2 * SEND_BATCH + 1]> = SmallVec::new();
            let mut next = 0;
            if o.ring_sent > 0 {
                iov.extend(frame_extents(0, o.ring_sent));
                next = 1;
            }
            if o.control_sent < o.control.len() {
                iov.push(Extent {
                    addr: o.control[o.control_sent..].as_ptr() as u64,
                    len: (o.control.len() - o.control_sent) as u64,
                });
            }
            for i in next..heads.len() {
                iov.extend(frame_extents(i, 0));
            }
            if iov.is_empty() {
                return total;
            }
            let want = extent_bytes(&iov);
            let mut sent = match sys::send_extents(self.fd(), &iov) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return total,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.close(&format!("sending failed: {e}"));
                    return total;
                }
            };
            total += sent;
            let all = sent == want;
            // Account for what went, in the order it was offered.
            let pop = |o: &mut Outbound| {
                let index = ring.head_index();
                if o.gathered.front().is_some_and(|g| g.index == index) {
                    o.gathered.pop_front();
                }
                ring.pop();
            };
            if o.ring_sent > 0 {
                let rest = lens[0] - o.ring_sent;
                if sent < rest {
                    o.ring_sent += sent;
                    return total;
                }
                sent -= rest;
                o.ring_sent = 0;
                pop(o);
            }
            let control_left = o.control.len() - o.control_sent;
            if control_left > 0 {
                if sent < control_left {
                    o.control_sent += sent;
                    return total;
                }
                sent -= control_left;
                o.control.clear();
                o.control_sent = 0;
                o.urgent = false;
            }
            for &len in &lens[next..] {
                if sent >= len {
                    sent -= len;
                    pop(o);
                } else {
                    o.ring_sent = sent;
                    break;
                }
            }
            if !all {
                // The socket is full: the rest goes when it drains.
                return total;
            }
        }
    }

    /// Reads what has arrived and places it: each packet goes to `on_packet` (the engine,
    /// which takes it as it takes a packet from a ring, with its payload where it lies in
    /// the link's buffer: no copy into a ring), acknowledgements into `own`'s lines, fault
    /// outcomes into `image` (the peer's local image). Whether anything was placed. Another
    /// thread pumping the link is left to it.
    pub(crate) fn pump(
        &self,
        own: &RankMemory,
        image: &RankMemory,
        mut on_packet: impl FnMut(Header, &[u8]),
    ) -> bool {
        if self.is_closed() {
            return false;
        }
        let Some(mut guard) = self.inp.try_lock() else {
            return false;
        };
        let i = &mut *guard;
        let mut placed = false;
        loop {
            // Place every whole frame in the buffer.
            loop {
                let decoded = match frame::decode(&i.buf[i.start..i.end]) {
                    Ok(d) => d,
                    Err(why) => {
                        self.close(&format!("it sent a malformed frame ({why})"));
                        return placed;
                    }
                };
                let Some((f, n)) = decoded else { break };
                match f {
                    Frame::Packet { header, payload } => on_packet(header, payload),
                    Frame::Ack { qpn, msn_end } => own.ack_line(qpn).ack(msn_end),
                    Frame::Nak { qpn, msn, why } => own.ack_line(qpn).nak(msn, why),
                    Frame::FaultDone { qpn, seq, resolved } => {
                        image.npf_slot(qpn).record_outcome(seq, resolved)
                    }
                    Frame::Bye => self.said_bye.store(true, Release),
                }
                i.start += n;
                placed = true;
            }
            // Make room for at least one whole frame, then read.
            if i.start == i.end {
                (i.start, i.end) = (0, 0);
            } else if i.buf.len() - i.start < MAX_FRAME_BYTES {
                i.buf.copy_within(i.start..i.end, 0);
                (i.start, i.end) = (0, i.end - i.start);
            }
            let room = Extent {
                addr: i.buf[i.end..].as_mut_ptr() as u64,
                len: (i.buf.len() - i.end) as u64,
            };
            match sys::recv_extents(self.fd(), &[room]) {
                Ok(0) => {
                    if i.start == i.end && self.said_bye.load(Acquire) {
                        // The peer's NIC went down in order.
                        self.closed.store(true, Release);
                        return placed;
                    }
                    let why = if i.start == i.end {
                        "the peer closed it without a goodbye (its process ended or was killed)"
                            .to_string()
                    } else {
                        format!(
                            "the peer closed it in the middle of a frame ({} bytes of it came)",
                            i.end - i.start
                        )
                    };
                    self.close(&why);
                    return placed;
                }
                Ok(n) => i.end += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return placed,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.close(&format!("receiving failed: {e}"));
                    return placed;
                }
            }
        }
    }
}
