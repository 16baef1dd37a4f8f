//! The eager protocol and its flow control.
//!
//! A data message (eager payload or RTS) needs a credit: the receiver posted `credits`
//! slots for it per peer and returns a credit each time it puts a slot back, piggybacked on
//! any message it sends or, when it has nothing to send, in an explicit credit message once
//! half are owed. An eager message that finds no receive is copied out of its slot while the
//! peer's unexpected bytes stay under the budget; past that the slot is held and its credit
//! withheld, so a flood of unexpected messages stops the sender instead of growing memory.
//! Held slots go back when a receive matches their message. A program that needs more than
//! the budget plus the credits of unexpected data from one peer before it receives any of it
//! waits for ever, as the MPI standard allows for programs that rely on buffering.
//! Control messages (CTS, FIN, chunk notices, acknowledgements) use extra slots and no credit.
//! The accounting of credits and unexpected bytes is a type of its own, `Credits`
//! (`credits.rs`), and what the receiver does with an unexpected eager message a machine of
//! its own (`eager_recv.rs`), each unit-tested alone; this file is the sending side, the
//! delivery of a message that finds its receive, and the layer's handling of every message
//! that arrives.

use super::credits::Credits;
use super::eager_recv::{self, eager_result, EagerArrival, EagerBytes, EagerIo};
use super::matching::Envelope;
use super::raw::UserBuf;
use super::wire::{self, Header, MsgKind};
use super::{
    Arrival, EagerData, Payload, PointToPoint, Req, RequestId, SendReq, SendState, Status,
    Unexpected,
};
use crate::error::{Error, Result};
use crate::sys::AnonMapping;

/// Maps a pool of `bytes` of eager slots (`what` names it in errors) and places it on this
/// rank's NUMA node before anything touches it (`boot::binding::place_local`).
pub(crate) fn map_slot_pool(bytes: usize, what: &str) -> Result<AnonMapping> {
    let pool = AnonMapping::new(bytes).map_err(|e| Error::os(format!("mmap of the {what}"), e))?;
    crate::boot::binding::place_local(&pool);
    Ok(pool)
}

impl PointToPoint {
    /// Starts the queued data sends to `peer` while credits and slots last, in order.
    pub(crate) fn drain_queued(&mut self, peer: usize) -> Result<()> {
        // The local path's rings are their own flow control: a full ring stops the queue.
        let local = self.is_local(peer);
        let eager_limit = self.eager_limit_on(local);
        while let Some(&id) = self.peers[peer].queued.front() {
            if !local && !self.peers[peer].credits.can_send() {
                self.counters.credit_waits += 1;
                break;
            }
            let Some(Req::Send(s)) = self.reqs.get(id) else {
                self.peers[peer].queued.pop_front();
                continue;
            };
            let (tag, context, buf, sync) = (s.tag, s.context, s.buf.clone(), s.sync);
            let started = if buf.len() <= eager_limit {
                let sent = self.post_eager(peer, tag, context, &buf, sync.then_some(id))?;
                if sent {
                    if sync {
                        if let Some(Req::Send(s)) = self.reqs.get_mut(id) {
                            s.state = SendState::AwaitSyncAck;
                        }
                    } else {
                        // The payload is copied out: the user's buffer is free again.
                        self.complete(id, Ok(self.sent_status(tag, buf.len())));
                    }
                }
                sent
            } else if local {
                self.start_local_rndv_send(peer, id)?
            } else {
                self.start_rndv_send(peer, id)?
            };
            if !started {
                break;
            }
            if !local {
                self.peers[peer].credits.spend();
            }
            self.peers[peer].queued.pop_front();
        }
        Ok(())
    }

    /// Sends `buf` to `peer` as one eager message (synchronous when `sync_id` names the
    /// send that waits for its match); false if the queue pair, the slots or the local ring
    /// are full. The caller checked the size, and takes the credit.
    pub(crate) fn post_eager(
        &mut self,
        peer: usize,
        tag: i32,
        context: u32,
        buf: &UserBuf,
        sync_id: Option<RequestId>,
    ) -> Result<bool> {
        let mut h = Header::new(MsgKind::Eager);
        h.tag = tag;
        h.context = context;
        h.size = buf.len() as u64;
        if let Some(id) = sync_id {
            h.sreq = id.0;
            h.flags |= wire::SYNC;
        }
        let sent = self.send_message(peer, h, Payload::User(buf, 0, buf.len()))?;
        if sent {
            self.counters.eager_sent += 1;
        }
        Ok(sent)
    }

    /// Sends an explicit credit message when half the credits are owed and nothing else
    /// carried them.
    pub(crate) fn return_credits(&mut self, peer: usize) -> Result<()> {
        let p = &self.peers[peer];
        if p.credits.owes_half() && p.control.is_empty() && p.dead.is_none() {
            self.send_message(peer, Header::new(MsgKind::Credit), Payload::None)?;
        }
        Ok(())
    }

    /// A message arrived in receive slot `slot` of `peer`.
    ///
    /// What no correct peer sends (see [`wire::decode_message`], and credits beyond those
    /// this rank was given) fails every operation with `peer` ([`Error::ProtocolViolation`])
    /// and nothing of the message is used.
    pub(crate) fn handle_incoming(&mut self, peer: usize, at: Arrival, len: usize) -> Result<()> {
        let bytes = self.arrived_bytes(peer, at);
        let bytes = &bytes[..len.min(bytes.len())];
        let decoded = match at {
            Arrival::ShortCell(_) => wire::decode_short(bytes),
            _ => wire::decode_message(bytes),
        };
        let body = at.header_bytes();
        let (kind, h) = match decoded {
            Ok(m) => m,
            Err(why) => {
                self.protocol_violation(peer, why);
                return Ok(());
            }
        };
        // A peer returns at most the credits it was given.
        if let Err(why) = self.peers[peer].credits.returned(h.credits) {
            self.protocol_violation(peer, why);
            return Ok(());
        }
        let env = Envelope {
            source: peer,
            tag: h.tag,
            context: h.context,
        };
        match kind {
            MsgKind::Eager if self.active_messages.handles(h.context) => {
                // The decoder checked that the payload is `size` bytes.
                let size = h.size as usize;
                let payload = self.arrived_bytes(peer, at)[body..body + size].to_vec();
                self.put_back_data(peer, at)?;
                if h.flags & wire::SYNC != 0 {
                    self.sync_ack(peer, h.sreq)?;
                }
                self.active_message_arrived(env, payload);
                Ok(())
            }
            MsgKind::Eager => {
                // The decoder checked that the payload is `size` bytes.
                let size = h.size as usize;
                let sync = h.flags & wire::SYNC != 0;
                if let Some(rid) = self.matcher.take_posted(&env) {
                    self.deliver_eager_from_slot(rid, env, peer, at, size);
                    self.put_back_data(peer, at)?;
                    if sync {
                        self.sync_ack(peer, h.sreq)?;
                    }
                    return Ok(());
                }
                self.counters.unexpected += 1;
                let arrival = EagerArrival {
                    env,
                    size,
                    sync,
                    sreq: h.sreq,
                    slot: match at {
                        Arrival::Slot(slot) => Some(slot),
                        Arrival::Cell(_) | Arrival::ShortCell(_) => None,
                    },
                };
                let budget = self.cfg.unexpected_budget;
                let mut io = ArrivalIo {
                    p2p: self,
                    peer,
                    at: Some(at),
                };
                arrival.queue_unexpected(budget, &mut io)
            }
            MsgKind::Rts if h.flags & wire::LOCAL_COPY != 0 => {
                let payload = &self.arrived_bytes(peer, at)[body..len];
                let Ok(source) = wire::LocalSource::decode(payload, h.size) else {
                    unreachable!("decode_message checked the source");
                };
                match self.matcher.take_posted(&env) {
                    Some(rid) => self.local_rndv_recv(rid, peer, h, &source)?,
                    None => {
                        self.counters.unexpected += 1;
                        self.matcher
                            .push_unexpected(env, Unexpected::LocalRts { header: h, source });
                    }
                }
                self.put_back_data(peer, at)
            }
            MsgKind::Rts => {
                let chunks = Self::decode_chunks(&self.arrived_bytes(peer, at)[body..len]);
                match self.matcher.take_posted(&env) {
                    Some(rid) => self.start_rndv_recv(rid, peer, h, chunks)?,
                    None => {
                        self.counters.unexpected += 1;
                        self.matcher
                            .push_unexpected(env, Unexpected::Rts { header: h, chunks });
                    }
                }
                self.put_back_data(peer, at)
            }
            MsgKind::SyncAck => {
                let id = RequestId(h.sreq);
                // Only a synchronous send to this peer that waits for its match ends here.
                if let Some(Req::Send(
                    s @ SendReq {
                        state: SendState::AwaitSyncAck,
                        ..
                    },
                )) = self.reqs.get(id)
                {
                    if s.peer != peer {
                        self.protocol_violation(peer, "a sync ack for another rank's send");
                        return Ok(());
                    }
                    let status = self.sent_status(s.tag, s.buf.len());
                    self.complete(id, Ok(status));
                }
                self.put_back_control(peer, at)
            }
            MsgKind::Credit => self.put_back_control(peer, at),
            MsgKind::CopyDone => {
                self.put_back_control(peer, at)?;
                self.local_copy_done(peer, h);
                Ok(())
            }
            MsgKind::CopyShare => {
                let payload = &self.arrived_bytes(peer, at)[body..len];
                let Ok(dest) = wire::LocalSource::decode_any(payload) else {
                    unreachable!("decode_message checked the description");
                };
                self.put_back_control(peer, at)?;
                self.local_copy_share(peer, h, &dest)
            }
            MsgKind::ShareDone => {
                self.put_back_control(peer, at)?;
                self.local_share_done(peer, h);
                Ok(())
            }
            MsgKind::Cts | MsgKind::Fin | MsgKind::ChunkReady | MsgKind::ChunkDone => {
                self.put_back_control(peer, at)?;
                self.handle_rndv_control(peer, kind, h)
            }
        }
    }

    /// The bytes of a message that arrived: its receive slot, or its local cell.
    pub(crate) fn arrived_bytes(&self, peer: usize, at: Arrival) -> &[u8] {
        match at {
            Arrival::Slot(slot) => self.slot_bytes_of(peer, slot),
            Arrival::Cell(offset) | Arrival::ShortCell(offset) => {
                self.local.as_ref().expect("a local path").message(offset)
            }
        }
    }

    /// A data message is done with its bytes: its slot goes back to the NIC with a credit
    /// owed (a local cell goes back when the poll moves on).
    fn put_back_data(&mut self, peer: usize, at: Arrival) -> Result<()> {
        match at {
            Arrival::Slot(slot) => self.repost_data_slot(peer, slot),
            Arrival::Cell(_) | Arrival::ShortCell(_) => Ok(()),
        }
    }

    /// A control message is done with its bytes.
    fn put_back_control(&mut self, peer: usize, at: Arrival) -> Result<()> {
        match at {
            Arrival::Slot(slot) => self.post_slot(peer, slot),
            Arrival::Cell(_) | Arrival::ShortCell(_) => Ok(()),
        }
    }

    fn repost_data_slot(&mut self, peer: usize, slot: usize) -> Result<()> {
        self.post_slot(peer, slot)?;
        if self.peers[peer].credits.slot_reposted() {
            self.needs_service(peer);
        }
        Ok(())
    }

    fn sync_ack(&mut self, peer: usize, sreq: u64) -> Result<()> {
        let mut h = Header::new(MsgKind::SyncAck);
        h.sreq = sreq;
        self.send_control(peer, h)
    }

    /// Copies the eager payload of `size` bytes that arrived at `at` from `peer` into
    /// receive `rid` and completes it (straight from the slot or cell: one copy).
    fn deliver_eager_from_slot(
        &mut self,
        rid: RequestId,
        env: Envelope,
        peer: usize,
        at: Arrival,
        size: usize,
    ) {
        let Some(Req::Recv(r)) = self.reqs.get(rid) else {
            return;
        };
        let buf = r.buf.clone();
        let (n, body) = (size.min(buf.len()), at.header_bytes());
        buf.write(0, &self.arrived_bytes(peer, at)[body..body + n]);
        self.complete_eager(rid, env, size, buf.len());
    }

    /// Completes eager receive `rid` of a `size`-byte message into a `buffer_bytes` buffer:
    /// its status, or `Error::Truncated` when the message was longer.
    pub(crate) fn complete_eager(
        &mut self,
        rid: RequestId,
        env: Envelope,
        size: usize,
        buffer_bytes: usize,
    ) {
        self.complete(rid, eager_result(env, size, buffer_bytes));
    }

    /// A new receive `rid` matched an unexpected message.
    pub(crate) fn deliver_unexpected(
        &mut self,
        rid: RequestId,
        env: Envelope,
        u: Unexpected,
    ) -> Result<()> {
        match u {
            Unexpected::Eager {
                data,
                size,
                sync,
                sreq,
            } => {
                let at = match data {
                    EagerData::Held { slot } => Some(Arrival::Slot(slot)),
                    EagerData::Owned(_) => None,
                };
                let mut io = ArrivalIo {
                    p2p: self,
                    peer: env.source,
                    at,
                };
                eager_recv::deliver_unexpected(rid, env, &data, size, sync.then_some(sreq), &mut io)
            }
            Unexpected::Rts { header, chunks } => {
                self.start_rndv_recv(rid, env.source, header, chunks)
            }
            Unexpected::LocalRts { header, source } => {
                self.local_rndv_recv(rid, env.source, header, &source)
            }
        }
    }
}

/// The layer as the eager receive machine sees it: one message from `peer`, in its slot or
/// cell `at` (`None`: copied out when it arrived, so nothing is read or given back).
struct ArrivalIo<'a> {
    p2p: &'a mut PointToPoint,
    peer: usize,
    at: Option<Arrival>,
}

impl ArrivalIo<'_> {
    /// The payload's first `n` bytes where the message arrived.
    fn arrived_payload(&self, n: usize) -> &[u8] {
        let at = self
            .at
            .expect("the machine reads only a message in its slot or cell");
        let body = at.header_bytes();
        &self.p2p.arrived_bytes(self.peer, at)[body..body + n]
    }
}

impl EagerIo for ArrivalIo<'_> {
    #[inline]
    fn write_receive(&mut self, rid: RequestId, size: usize, from: EagerBytes) -> Option<usize> {
        let Some(Req::Recv(r)) = self.p2p.reqs.get(rid) else {
            return None;
        };
        let n = size.min(r.buf.len());
        match from {
            EagerBytes::Arrived => r.buf.write(0, self.arrived_payload(n)),
            EagerBytes::Owned(bytes) => r.buf.write(0, &bytes[..n]),
        }
        Some(r.buf.len())
    }

    fn copy_out(&mut self, size: usize) -> Vec<u8> {
        self.arrived_payload(size).to_vec()
    }

    #[inline]
    fn complete(&mut self, rid: RequestId, result: Result<Status>) {
        self.p2p.complete(rid, result);
    }

    #[inline]
    fn put_back(&mut self) -> Result<()> {
        match self.at {
            Some(at) => self.p2p.put_back_data(self.peer, at),
            None => Ok(()),
        }
    }

    fn sync_ack(&mut self, sreq: u64) -> Result<()> {
        self.p2p.sync_ack(self.peer, sreq)
    }

    fn push_unexpected(&mut self, env: Envelope, message: Unexpected) {
        if matches!(
            message,
            Unexpected::Eager {
                data: EagerData::Held { .. },
                ..
            }
        ) {
            self.p2p.counters.held_slots += 1;
        }
        self.p2p.matcher.push_unexpected(env, message);
    }

    #[inline]
    fn credits(&mut self) -> &mut Credits {
        &mut self.p2p.peers[self.peer].credits
    }
}
