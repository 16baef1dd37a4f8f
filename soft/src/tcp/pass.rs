//! The TCP links in the engine's passes: a pass reads what the links brought
//! before it polls the rings, and sends what it produced after; acknowledgements and fault
//! outcomes for a peer on another host become frames on its link.

use std::sync::atomic::Ordering::Acquire;

use super::frame::Frame;
use super::TcpLink;
use crate::ack::Nak;
use crate::engine::Engine;
use crate::ring::Payload;
use crate::{Inner, Peer};

impl Inner {
    /// Reads every link's arrivals: packets go to the engine straight from the link's
    /// receive buffer (the handlers of packets from a ring, with the payload where it lies),
    /// acknowledgements into this rank's lines, fault outcomes into the peer's image.
    pub(crate) fn pump_links(&self, eng: &mut Engine) {
        if let Some(w) = &self.wire {
            for l in &w.links {
                l.pump(&self.own, &self.peers[l.peer].mem, |header, payload| {
                    self.handle_packet(eng, l.peer, header, Payload::Bytes(payload))
                });
            }
        }
    }

    /// Sends what waits on every link, as far as the sockets take it; unless `force`, a
    /// link with nothing but young ACKs keeps them for a packet to carry
    /// ([`super::link::ACK_DELAY_NS`]).
    pub(crate) fn flush_links(&self, force: bool) {
        if let Some(w) = &self.wire {
            for l in &w.links {
                l.flush_unless_young(&self.peers[l.peer].mem.ring_from(self.rank), force);
            }
        }
    }

    /// The peer queue pair `qpn` was created towards, and its link, if it has one.
    fn link_of_qp(&self, qpn: u32) -> Option<(&Peer, &TcpLink)> {
        self.wire.as_ref()?;
        let peer = self.qp_peers.get(qpn as usize)?.load(Acquire) as usize;
        let p = self.peers.get(peer)?;
        Some((p, p.link.as_deref()?))
    }

    /// Sends what waits on the link of queue pair `qpn`'s peer, if it has one.
    pub(crate) fn flush_link_of(&self, qpn: u32) {
        if let Some((p, l)) = self.link_of_qp(qpn) {
            l.flush(&p.mem.ring_from(self.rank));
        }
    }

    /// For each link, whether something waits to go out (the driver then waits for room).
    pub(crate) fn links_output(&self) -> Vec<bool> {
        self.wire.as_ref().map_or_else(Vec::new, |w| {
            w.links
                .iter()
                .map(|l| l.has_output(&self.peers[l.peer].mem.ring_from(self.rank)))
                .collect()
        })
    }

    /// Tells a requester on another host that accepted every request of its queue pair
    /// `qpn` below `msn_end`; false if `from` is a local peer.
    pub(crate) fn ack_by_link(&self, from: usize, qpn: u32, msn_end: u64) -> bool {
        match &self.peers[from].link {
            Some(l) => {
                l.queue(&Frame::Ack { qpn, msn_end });
                true
            }
            None => false,
        }
    }

    /// Tells a requester on another host that request `msn` of its queue pair `qpn` was
    /// refused; false if `from` is a local peer.
    pub(crate) fn nak_by_link(&self, from: usize, qpn: u32, msn: u64, why: Nak) -> bool {
        match &self.peers[from].link {
            Some(l) => {
                l.queue(&Frame::Nak { qpn, msn, why });
                true
            }
            None => false,
        }
    }

    /// Reports the outcome of fault `seq`, filed on this rank's queue pair `qpn` for a
    /// requester on another host, and sends it at once (the requester retries on it).
    pub(crate) fn report_fault_by_link(&self, qpn: u32, seq: u64, resolved: bool) {
        if let Some((p, l)) = self.link_of_qp(qpn) {
            l.queue(&Frame::FaultDone { qpn, seq, resolved });
            l.flush(&p.mem.ring_from(self.rank));
        }
    }
}
