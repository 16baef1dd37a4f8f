//! Staged READ responses: the responder streams the requested bytes back, and the requester
//! places each response packet.

use smallvec::SmallVec;

use crate::dma;
use crate::engine::staged::SettleLink;
use crate::engine::{Engine, Held, KeyedExtent, OpState};
use crate::ring::{Header, Kind, Payload, FIRST, LAST, MTU};
use crate::Inner;
use pagewire_nic::{Access, DataPath, WcStatus};

impl Inner {
    /// Staged READ responses: stream the requested bytes back as ring space allows.
    pub(in crate::engine) fn send_read_responses(&self, eng: &mut Engine, qpn: u32) {
        let Some(qp) = eng.qps[qpn as usize].as_mut() else {
            return;
        };
        let peer = qp.peer;
        // The holds on the memory of the packets queued with their payload in place
        // (gathered, to a peer on the TCP wire), kept until the link is settled: the settle
        // guard is declared after them, so it drops first.
        let mut holds: SmallVec<[Held<'_>; 8]> = SmallVec::new();
        let _settle = SettleLink::new(self, peer);
        while let Some(r) = qp.responder.reads_out.front_mut() {
            loop {
                let chunk = (r.source.len - r.sent).min(MTU as u64);
                let last = r.sent + chunk == r.source.len;
                let h = Header {
                    kind: Kind::ReadResponse as u8,
                    flags: if last { LAST } else { 0 } | if r.sent == 0 { FIRST } else { 0 },
                    dst_qpn: r.dst_qpn,
                    src_qpn: qpn,
                    msn: r.msn,
                    total_len: r.source.len,
                    offset: r.sent,
                    payload_len: chunk as u32,
                    ..Header::default()
                };
                // Checked again for every packet: a region deregistered mid-READ ends the
                // READ with a remote access error instead of sending what is mapped there now.
                let src = self.hold_own(
                    std::slice::from_ref(&r.source),
                    r.sent,
                    chunk,
                    Access::REMOTE_READ,
                );
                let Ok((_held, src)) = src else {
                    let refused = Header {
                        flags: FIRST | LAST,
                        code: WcStatus::RemoteAccessError.code(),
                        payload_len: 0,
                        ..h
                    };
                    if !self.push_packet(peer, &refused, |_| Ok(())) {
                        self.peers[peer].mem.wake_driver_if_asleep();
                        return;
                    }
                    break;
                };
                let gathered = src
                    .first()
                    .is_some_and(|e| self.queue_gathered(peer, &h, &[(e.addr, chunk)]));
                let pushed = if gathered {
                    holds.push(_held);
                    true
                } else {
                    self.push_packet(peer, &h, |s| match src.first() {
                        Some(e) => dma::copy(s.payload_addr(), e.addr, chunk),
                        None => Ok(()), // a zero-length READ
                    })
                };
                if !pushed {
                    // Ring full: the requester drains it when it polls, or its driver.
                    self.peers[peer].mem.wake_driver_if_asleep();
                    return;
                }
                self.counters.add_bytes(DataPath::Staged, chunk);
                r.sent += chunk;
                if last {
                    break;
                }
            }
            qp.responder.reads_out.pop_front();
        }
    }

    /// The requester's side of a staged READ: a response packet.
    pub(in crate::engine) fn handle_read_response(
        &self,
        eng: &mut Engine,
        h: &Header,
        payload: Payload<'_>,
    ) {
        let Ok(qp) = eng.qp_mut(h.dst_qpn) else {
            return;
        };
        let Some((op, sges)) = qp.requester.successful_response(h.msn, h.code) else {
            return;
        };
        let len = h.payload_len as u64;
        if h.offset.checked_add(len).is_none_or(|end| end > op.total) {
            op.state = OpState::Done(WcStatus::RemoteOperationError);
            return;
        }
        let dst: SmallVec<[KeyedExtent; 2]> = sges.iter().map(KeyedExtent::from).collect();
        let placed = self
            .hold_own(&dst, h.offset, len, Access::LOCAL_WRITE)
            .map_err(|_| ())
            .and_then(|(_held, dst)| dma::scatter(&dst, 0, payload.addr(), len).map_err(|_| ()));
        if placed.is_err() {
            op.state = OpState::Done(WcStatus::LocalProtectionError);
            return;
        }
        self.counters.add_bytes(DataPath::Staged, len);
        op.sent = op.sent.max(h.offset + len);
        if h.flags & LAST != 0 {
            op.state = OpState::Done(WcStatus::Success);
        }
    }
}
