//! The staged path's sending side: a request's packets (SENDs, and WRITEs and READs to a
//! peer without CMA) written into the peer's ring, and one packet pushed onto it.

use smallvec::SmallVec;

use super::responder::cache_miss::dropped;
use super::translate::Untranslated;
use super::{Held, OpKind, OpState, SendOp, SEND_CMA_MIN};
use crate::dma;
use crate::ring::{Header, Kind, Slot, CMA_DESCRIPTOR, FIRST, HAS_IMM, LAST, MTU};
use crate::Inner;
use pagewire_nic::{Access, DataPath, Sge, WcStatus};

impl Inner {
    /// Sends the packets of a request from where it stopped; false when the ring filled up
    /// first. A local protection error ends the request (`Done`) and returns true, as does
    /// a miss in this NIC's translation cache (`TranslationMiss`, nothing sent).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn transmit_packets(
        &self,
        op: &mut SendOp,
        sges: &[Sge],
        inline: Option<&[u8]>,
        peer: usize,
        qpn: u32,
        remote_qpn: u32,
        cma: bool,
    ) -> bool {
        // The local holds last until this call returns: every packet it sends is read under
        // them.
        let (_held, local) = if inline.is_some() || op.data_placed {
            (Held::new(), SmallVec::new())
        } else {
            let need = if matches!(op.kind, OpKind::Read { .. } | OpKind::Atomic { .. }) {
                Access::LOCAL_WRITE
            } else {
                Access::NONE
            };
            match self.local_extents(sges, need, qpn, &mut op.translated) {
                Ok(l) => l,
                Err(Untranslated::Refused(s)) => {
                    op.state = OpState::Done(s);
                    return true;
                }
                Err(Untranslated::Missed(wait)) => {
                    op.state = dropped(wait, 0);
                    return true;
                }
            }
        };
        // Before the holds go (declared after them, so dropped first): what a TCP link has
        // not sent of this request's gathered packets is copied into their slots.
        let _settle = SettleLink::new(self, peer);
        let base = Header {
            dst_qpn: remote_qpn,
            src_qpn: qpn,
            msn: op.msn.expect("assigned before transmission"),
            total_len: op.total,
            ..Header::default()
        };
        match op.kind {
            OpKind::Read { addr, rkey } => {
                let h = Header {
                    kind: Kind::ReadRequest as u8,
                    flags: FIRST | LAST,
                    remote_addr: addr,
                    rkey,
                    ..base
                };
                self.push_packet(peer, &h, |_| Ok(()))
            }
            OpKind::Atomic { addr, rkey, op: a } => {
                let (code, operands) = a.encode();
                let h = Header {
                    kind: Kind::AtomicRequest as u8,
                    flags: FIRST | LAST,
                    imm: code,
                    remote_addr: addr,
                    rkey,
                    payload_len: 16,
                    ..base
                };
                self.push_packet(peer, &h, |s| {
                    let mut p = [0u8; 16];
                    p[..8].copy_from_slice(&operands[0].to_le_bytes());
                    p[8..].copy_from_slice(&operands[1].to_le_bytes());
                    s.write_payload(&p);
                    Ok(())
                })
            }
            OpKind::Write { imm, addr, rkey } if op.data_placed => {
                // The bytes are in place; the responder checks the key once more before it
                // reports them (a peer cannot claim a WRITE it had no right to make).
                let h = Header {
                    kind: Kind::WriteImm as u8,
                    flags: FIRST | LAST | HAS_IMM | CMA_DESCRIPTOR,
                    imm: imm.unwrap_or(0),
                    remote_addr: addr,
                    rkey,
                    ..base
                };
                self.push_packet(peer, &h, |_| Ok(()))
            }
            OpKind::Send { imm } if cma && inline.is_none() && op.total >= SEND_CMA_MIN => {
                // The receiver pulls the payload from our memory with one kernel copy.
                let mut desc: SmallVec<[u8; 64]> = SmallVec::with_capacity(local.len() * 16);
                for e in local.iter().filter(|e| e.len > 0) {
                    desc.extend_from_slice(&e.addr.to_le_bytes());
                    desc.extend_from_slice(&e.len.to_le_bytes());
                }
                let h = Header {
                    kind: Kind::Send as u8,
                    flags: FIRST | LAST | CMA_DESCRIPTOR | if imm.is_some() { HAS_IMM } else { 0 },
                    imm: imm.unwrap_or(0),
                    payload_len: desc.len() as u32,
                    ..base
                };
                self.push_packet(peer, &h, |s| {
                    s.write_payload(&desc);
                    Ok(())
                })
            }
            OpKind::Send { .. } | OpKind::Write { .. } => {
                let (kind, imm, raddr, rkey) = match op.kind {
                    OpKind::Send { imm } => (Kind::Send, imm, 0, 0),
                    OpKind::Write {
                        addr,
                        rkey,
                        imm: Some(i),
                    } => (Kind::WriteImm, Some(i), addr, rkey),
                    OpKind::Write {
                        addr,
                        rkey,
                        imm: None,
                    } => (Kind::Write, None, addr, rkey),
                    OpKind::Read { .. } | OpKind::Atomic { .. } => unreachable!(),
                };
                loop {
                    let chunk = (op.total - op.sent).min(MTU as u64);
                    let mut flags = 0;
                    if op.sent == 0 {
                        flags |= FIRST;
                    }
                    if op.sent + chunk == op.total {
                        flags |= LAST;
                    }
                    if imm.is_some() {
                        flags |= HAS_IMM;
                    }
                    let h = Header {
                        kind: kind as u8,
                        flags,
                        imm: imm.unwrap_or(0),
                        offset: op.sent,
                        remote_addr: raddr,
                        rkey,
                        payload_len: chunk as u32,
                        ..base
                    };
                    let offset = op.sent;
                    let mut faulted = false;
                    let gathered = inline.is_none() && {
                        let pieces: SmallVec<[(u64, u64); 4]> =
                            dma::pieces(&local, offset, chunk).collect();
                        self.queue_gathered(peer, &h, &pieces)
                    };
                    let pushed = gathered
                        || self.push_packet(peer, &h, |s| {
                            let r = match inline {
                                Some(d) => {
                                    s.write_payload(&d[offset as usize..(offset + chunk) as usize]);
                                    Ok(())
                                }
                                None => dma::gather(s.payload_addr(), &local, offset, chunk),
                            };
                            faulted = r.is_err();
                            r
                        });
                    if faulted {
                        op.state = OpState::Done(WcStatus::LocalProtectionError);
                        return true;
                    }
                    if !pushed {
                        return false;
                    }
                    if inline.is_none() {
                        self.counters.add_bytes(DataPath::Staged, chunk);
                    }
                    op.sent += chunk;
                    if op.sent == op.total {
                        return true;
                    }
                }
            }
        }
    }

    /// To a peer on the TCP wire, queues one packet whose payload stays in `pieces` of this
    /// process's memory until the frame goes out (`TcpLink::queue_gathered`); the caller
    /// holds that memory until a [`SettleLink`] of the peer drops. False if the peer is
    /// local, or the link cannot take it so (the caller pushes the packet as any other).
    pub(super) fn queue_gathered(&self, peer: usize, h: &Header, pieces: &[(u64, u64)]) -> bool {
        let Some(link) = self.peers[peer].link.as_deref() else {
            return false;
        };
        let ring = self.peers[peer].mem.ring_from(self.rank);
        link.queue_gathered(&ring, h, pieces)
    }

    /// Pushes one packet to `peer`, filling its payload with `fill`; false if the ring is
    /// full. If `fill` fails (the source is not mapped), the header goes out with a local
    /// protection error code so that the receiver drops the message it belongs to.
    pub(super) fn push_packet(
        &self,
        peer: usize,
        h: &Header,
        fill: impl FnOnce(&Slot<'_>) -> std::io::Result<()>,
    ) -> bool {
        let mem = &self.peers[peer].mem;
        let ring = mem.ring_from(self.rank);
        let Some(slot) = ring.reserve() else {
            return false;
        };
        if fill(&slot).is_err() {
            let mut bad = *h;
            bad.code = WcStatus::LocalProtectionError.code();
            bad.payload_len = 0;
            ring.publish(slot, &bad);
        } else {
            ring.publish(slot, h);
        }
        crate::inbox::announce(&ring, mem.pending(), self.rank);
        true
    }
}

/// Settles the TCP link to a peer when dropped ([`crate::tcp::TcpLink::settle`]):
/// sends what its socket takes and copies the rest of the packets queued with their payload
/// in memory into their slots. Declared after the holds on that memory, so that it drops
/// first.
pub(super) struct SettleLink<'a> {
    inner: &'a Inner,
    peer: usize,
}

impl<'a> SettleLink<'a> {
    pub(super) fn new(inner: &'a Inner, peer: usize) -> SettleLink<'a> {
        SettleLink { inner, peer }
    }
}

impl Drop for SettleLink<'_> {
    fn drop(&mut self) {
        let p = &self.inner.peers[self.peer];
        if let Some(link) = p.link.as_deref() {
            link.settle(&p.mem.ring_from(self.inner.rank));
        }
    }
}
