//! Posting to the NIC: receive slots, messages through send slots or inline, control
//! messages queued per peer, and RDMA operations with their bookkeeping.

use super::liveness;
use super::raw;
use super::wire::{Header, HEADER_BYTES, SHORT_HEADER_BYTES};
use super::{wr_id, Payload, Peer, PointToPoint, RdmaOp, WrKind};
use crate::buffer_mode::Lease;
use crate::error::Result;
use crate::nic::{Opcode, SendWr, Sge};

pub(super) fn fill_payload(src: &Payload<'_>, dst: &mut [u8]) {
    match src {
        Payload::None => {}
        Payload::User(ub, off, len) => ub.read(*off, &mut dst[..*len]),
        Payload::Bytes(b) => dst[..b.len()].copy_from_slice(b),
    }
}

impl PointToPoint {
    /// Posts receive slot `slot` of `peer`'s region again.
    pub(crate) fn post_slot(&mut self, peer: usize, slot: usize) -> Result<()> {
        let per_peer = (self.cfg.credits + self.cfg.control_slots) as usize;
        let addr = self.recv_pool.addr() + ((peer * per_peer + slot) * self.slot_bytes) as u64;
        let sge = [Sge {
            addr,
            len: self.slot_bytes as u32,
            lkey: self.recv_key,
        }];
        let wr = crate::nic::RecvWr {
            wr_id: wr_id(WrKind::Recv, peer, slot),
            sgl: &sge,
        };
        raw::post_recv(&*self.nic, self.peers[peer].qpn, &wr)
    }

    /// The bytes of receive slot `slot` of `peer`.
    pub(crate) fn slot_bytes_of(&self, peer: usize, slot: usize) -> &[u8] {
        let per_peer = (self.cfg.credits + self.cfg.control_slots) as usize;
        let start = (peer * per_peer + slot) * self.slot_bytes;
        &self.recv_pool.as_slice()[start..start + self.slot_bytes]
    }

    /// Sends a message: header plus `payload` bytes of `src` (from `offset`). Inline when it
    /// fits, else through an eager send slot. False if the queue pair or the slots are full.
    pub(crate) fn send_message(
        &mut self,
        peer: usize,
        mut h: Header,
        src: Payload<'_>,
    ) -> Result<bool> {
        if let Some(local) = self.local.as_mut().filter(|l| l.is_local(peer)) {
            // The local path: header and payload straight into the peer's next cell.
            let payload = match src {
                Payload::None => 0,
                Payload::User(_, _, len) => len,
                Payload::Bytes(b) => b.len(),
            };
            h.credits = 0;
            if let Some(short) = h.short_form() {
                return Ok(
                    local.try_send(peer, SHORT_HEADER_BYTES + payload, true, |cell| {
                        cell[..SHORT_HEADER_BYTES].copy_from_slice(&short);
                        fill_payload(&src, &mut cell[SHORT_HEADER_BYTES..]);
                    }),
                );
            }
            let header = h.encode();
            return Ok(local.try_send(peer, HEADER_BYTES + payload, false, |cell| {
                cell[..HEADER_BYTES].copy_from_slice(&header);
                fill_payload(&src, &mut cell[HEADER_BYTES..]);
            }));
        }
        let p = &mut self.peers[peer];
        if p.in_flight + 2 >= self.max_send_wr {
            return Ok(false);
        }
        let payload = match src {
            Payload::None => 0,
            Payload::User(_, _, len) => len,
            Payload::Bytes(b) => b.len(),
        };
        let credits = p.credits.to_carry();
        h.credits = credits;
        let total = HEADER_BYTES + payload;
        // Inline takes one run of user memory; a payload spread over runs of a buffer with
        // gaps is gathered into a send slot instead.
        let one_run = match &src {
            Payload::User(ub, off, len) => *len == 0 || ub.piece_at(*off).len >= *len as u64,
            _ => true,
        };
        if total <= self.max_inline && one_run {
            // Inline: the NIC copies the header and the payload at post time.
            let header = h.encode();
            let (addr, len) = match src {
                Payload::None => (0, 0),
                Payload::User(ub, off, len) => (ub.addr() + off as u64, len),
                Payload::Bytes(b) => (b.as_ptr() as u64, b.len()),
            };
            let sge = [
                Sge {
                    addr: header.as_ptr() as u64,
                    len: HEADER_BYTES as u32,
                    lkey: 0,
                },
                Sge {
                    addr,
                    len: len as u32,
                    lkey: 0,
                },
            ];
            let wr = SendWr {
                wr_id: wr_id(WrKind::SendInline, peer, 0),
                opcode: Opcode::Send,
                sgl: if len == 0 { &sge[..1] } else { &sge },
                inline: true,
                signaled: true,
            };
            raw::post_send(&*self.nic, p.qpn, &wr)?;
        } else {
            let Some(slot) = self.send_free.pop() else {
                return Ok(false);
            };
            let start = slot * self.slot_bytes;
            let mem = &mut self.send_pool.as_mut_slice()[start..start + total];
            mem[..HEADER_BYTES].copy_from_slice(&h.encode());
            fill_payload(&src, &mut mem[HEADER_BYTES..]);
            let sge = [Sge {
                addr: self.send_pool.addr() + start as u64,
                len: total as u32,
                lkey: self.send_key,
            }];
            let wr = SendWr {
                wr_id: wr_id(WrKind::SendSlot, peer, slot),
                opcode: Opcode::Send,
                sgl: &sge,
                inline: false,
                signaled: true,
            };
            raw::post_send(&*self.nic, p.qpn, &wr)?;
        }
        let p = &mut self.peers[peer];
        p.credits.carried(credits);
        p.in_flight += 1;
        Ok(true)
    }

    /// Sends a control message now, or queues it (in order) behind earlier ones.
    pub(crate) fn send_control(&mut self, peer: usize, h: Header) -> Result<()> {
        if self.peers[peer].dead.is_some() {
            return Ok(());
        }
        if self.peers[peer].control.is_empty() && self.send_message(peer, h, Payload::None)? {
            return Ok(());
        }
        self.peers[peer].control.push_back(h);
        self.needs_service(peer);
        Ok(())
    }

    /// Makes progress until nothing this rank owes its peers is left in it (before the
    /// layer ends, as `MPI_Finalize` does): every queued control message (a rendezvous's
    /// FIN, a split copy's half done) and queued send has left, and the NIC has completed
    /// every work request posted. A peer whose last receive completed may then leave at
    /// once, while the sender still waits for the FIN that receive queued: without this,
    /// the FIN would never leave. A failed peer is not waited for; one that stops
    /// answering is probed, and its error completion ends the wait.
    pub fn finish_outgoing(&mut self) -> Result<()> {
        let mut idle = liveness::IdleWait::default();
        while self.peers.iter().any(Peer::owes_messages) {
            self.progress()?;
            if idle.after_pass(self) {
                for q in 0..self.size {
                    if self.peers[q].owes_messages() {
                        self.send_liveness_probe(q);
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn flush_control(&mut self, peer: usize) -> Result<()> {
        while let Some(h) = self.peers[peer].control.front().copied() {
            if !self.send_message(peer, h, Payload::None)? {
                break;
            }
            self.peers[peer].control.pop_front();
        }
        Ok(())
    }

    /// Posts an RDMA operation for a rendezvous chunk.
    pub(crate) fn post_rdma(
        &mut self,
        peer: usize,
        op: RdmaOp,
        lease: &Lease,
        opcode: Opcode,
    ) -> Result<bool> {
        if self.peers[peer].in_flight + 2 >= self.max_send_wr {
            return Ok(false);
        }
        let index = match self.rdma_free.pop() {
            Some(i) => {
                self.rdma[i] = Some(op);
                i
            }
            None => {
                self.rdma.push(Some(op));
                self.rdma.len() - 1
            }
        };
        let sge = [Sge {
            addr: lease.addr,
            len: lease.len as u32,
            lkey: lease.lkey,
        }];
        let wr = SendWr {
            wr_id: wr_id(WrKind::Rdma, peer, index),
            opcode,
            sgl: if lease.len == 0 { &[] } else { &sge },
            inline: false,
            signaled: true,
        };
        raw::post_send(&*self.nic, self.peers[peer].qpn, &wr)?;
        self.peers[peer].in_flight += 1;
        Ok(true)
    }

    pub(super) fn take_rdma(&mut self, index: usize) -> Option<RdmaOp> {
        let op = self.rdma.get_mut(index)?.take()?;
        self.rdma_free.push(index);
        Some(op)
    }

    pub(super) fn rdma_done(&mut self, index: usize) -> Result<()> {
        let Some(op) = self.take_rdma(index) else {
            return Ok(());
        };
        self.rndv_rdma_done(op)
    }
}
