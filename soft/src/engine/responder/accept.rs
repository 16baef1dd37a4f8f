//! The first packet of a request at the responder: key, length and page checks, the
//! receive it takes, and receive-side network page faults (answered as the job's
//! receive-fault policy says, `receive_fault.rs`).

use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use crate::ack::Nak;
use crate::engine::{
    completion, fault_extent, Engine, Incoming, IncomingKind, KeyedExtent, QueuePair, ReadOut,
    RecvOp, REMOTE_KEY,
};
use crate::receive_fault::ReceiveFaultPolicy;
use crate::ring::{Header, Kind, CMA_DESCRIPTOR, HAS_IMM};
use crate::Inner;
use pagewire_nic::{Access, Sge, WcOpcode, WcStatus};
use pagewire_sys::Extent;

/// Takes the receive at the front of the queue, with its scatter-gather entries.
fn take_receive(qp: &mut QueuePair) -> (RecvOp, SmallVec<[Sge; 2]>) {
    let r = qp.responder.rq.pop_front().expect("a receive is posted");
    let sges = qp.responder.rq_sges.drain(..r.sges as usize).collect();
    (r, sges)
}

impl Inner {
    /// The first packet of a request: checks keys, lengths and pages, takes a receive.
    /// `None` when it was refused (answered with a NAK) or needs nothing more (a READ).
    pub(in crate::engine) fn accept_request(
        &self,
        eng: &mut Engine,
        from: usize,
        kind: Kind,
        h: &Header,
        payload: crate::ring::Payload<'_>,
    ) -> Option<Incoming> {
        let qpn = h.dst_qpn;
        let src_qpn = h.src_qpn;
        let me = &self.peers[self.rank];
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        let recv_cq = qp.recv_cq;
        let data_placed = kind == Kind::WriteImm && h.flags & CMA_DESCRIPTOR != 0;
        // Where the bytes go.
        let targets: SmallVec<[KeyedExtent; 2]>;
        // The parts of `targets` that lie in ODP regions (checked for faults below).
        let mut odp_targets: SmallVec<[Extent; 2]> = SmallVec::new();
        let mut take_recv = false;
        // Set when the message is stored in the backup ring.
        let mut parked = None;
        match kind {
            Kind::Send | Kind::WriteImm => {
                let Some(&r) = qp.responder.rq.front() else {
                    qp.responder.discard_msn = Some(h.msn);
                    self.nak(from, src_qpn, h.msn, Nak::Rnr { fault: None });
                    return None;
                };
                if kind == Kind::Send {
                    let sgl: SmallVec<[Sge; 2]> = qp
                        .responder
                        .rq_sges
                        .iter()
                        .take(r.sges as usize)
                        .copied()
                        .collect();
                    let failure = if h.total_len > r.capacity {
                        Some((
                            WcStatus::LocalLengthError,
                            WcStatus::RemoteInvalidRequest,
                            format!(
                                "a {}-byte send arrived for a {}-byte receive",
                                h.total_len, r.capacity
                            ),
                        ))
                    } else {
                        None
                    };
                    let local = if failure.is_none() {
                        self.local_targets(&sgl)
                    } else {
                        Err(())
                    };
                    let failure = failure.or_else(|| {
                        local.is_err().then(|| {
                            (
                                WcStatus::LocalProtectionError,
                                WcStatus::RemoteOperationError,
                                "a receive buffer failed its key check".to_string(),
                            )
                        })
                    });
                    if let Some((local_status, remote_status, why)) = failure {
                        take_receive(qp);
                        qp.responder.expected_msn += 1;
                        self.counters.error_completions.fetch_add(1, Relaxed);
                        let len = if local_status == WcStatus::LocalLengthError {
                            h.total_len as u32
                        } else {
                            0
                        };
                        eng.push_completion(
                            recv_cq,
                            completion(r.wr_id, local_status, WcOpcode::Recv, len, None, qpn),
                        );
                        let flushed = eng.enter_error(qpn, why);
                        self.counters.error_completions.fetch_add(flushed, Relaxed);
                        self.refuse(eng, from, qpn, h, remote_status);
                        return None;
                    }
                    let (extents, odp) = local.expect("checked");
                    // Fault-check only the ODP parts of what this message fills.
                    let mut at = 0u64;
                    for (e, on_demand) in extents.iter().zip(&odp) {
                        let take = e.len.min(h.total_len.saturating_sub(at));
                        if *on_demand && take > 0 {
                            odp_targets.push(Extent {
                                addr: e.addr,
                                len: take,
                            });
                        }
                        at += e.len;
                    }
                    targets = sgl.iter().map(KeyedExtent::from).collect();
                } else {
                    targets = smallvec::smallvec![KeyedExtent {
                        key: h.rkey,
                        addr: h.remote_addr,
                        len: h.total_len,
                    }];
                }
                take_recv = true;
            }
            Kind::AtomicRequest if h.remote_addr % 8 != 0 => {
                // The word must be naturally aligned (`IBV_WC_REM_INV_REQ_ERR` on an HCA).
                qp.responder.expected_msn += 1;
                self.refuse(eng, from, qpn, h, WcStatus::RemoteInvalidRequest);
                return None;
            }
            Kind::Write | Kind::ReadRequest | Kind::AtomicRequest => {
                targets = smallvec::smallvec![KeyedExtent {
                    key: h.rkey,
                    addr: h.remote_addr,
                    len: h.total_len,
                }];
            }
            Kind::ReadResponse | Kind::AtomicResponse => unreachable!("not a request"),
        }
        // Remote key checks for WRITE / READ / WRITE WITH IMM (not for zero length), also
        // for a WRITE WITH IMM whose bytes the initiator placed already.
        if kind != Kind::Send && h.total_len > 0 {
            let need = match kind {
                Kind::ReadRequest => Access::REMOTE_READ,
                Kind::AtomicRequest => Access::REMOTE_ATOMIC,
                _ => Access::REMOTE_WRITE,
            };
            match me
                .mem
                .tpt()
                .acquire(h.rkey, h.remote_addr, h.total_len, need)
            {
                Ok(g) => {
                    if g.translation.on_demand() {
                        odp_targets = smallvec::smallvec![Extent {
                            addr: h.remote_addr,
                            len: h.total_len,
                        }];
                    }
                    if g.translation.detached() {
                        self.counters.detached_bytes.fetch_add(h.total_len, Relaxed);
                    }
                }
                Err(_) => {
                    eng.qps[qpn as usize]
                        .as_mut()
                        .expect("exists")
                        .responder
                        .expected_msn += 1;
                    self.refuse(eng, from, qpn, h, WcStatus::RemoteAccessError);
                    return None;
                }
            }
        }
        // The keys through this NIC's translation cache (Azimi03): a miss drops the request
        // and its retransmission comes after the requester's timer. A WRITE WITH IMM whose
        // bytes the initiator placed was looked up in this cache by the initiator already.
        if !data_placed {
            let mut keys: SmallVec<[(u32, u32); 2]> = SmallVec::new();
            if kind == Kind::Send {
                let sgl = targets.iter().enumerate().filter(|(_, t)| t.len > 0);
                keys.extend(sgl.map(|(i, t)| (1 << i, t.key)));
            } else if h.total_len > 0 {
                keys.push((REMOTE_KEY, h.rkey));
            }
            let qp = eng.qps[qpn as usize].as_mut().expect("exists");
            if !self.translate_incoming(qp, h.msn, &keys) {
                qp.responder.discard_msn = Some(h.msn);
                self.nak(from, src_qpn, h.msn, Nak::TranslationMiss);
                return None;
            }
        }
        // Receive-side network page faults (Lesokhin17 §4-5, "rNPFs"): file the fault for the
        // driver and, by the job's policy, answer receiver-not-ready, drop the request
        // silently, or park a SEND in the backup ring and take it now.
        if !odp_targets.is_empty() && !data_placed {
            let span =
                odp_targets
                    .iter()
                    .fold(None, |acc, e| match (acc, self.missing_span(me, *e)) {
                        (None, s) => s,
                        (a, None) => a,
                        (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
                    });
            if let Some(span) = span {
                let range = fault_extent(span);
                let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                if let Some((m, seq)) = qp.responder.rx_fault {
                    if m == h.msn && me.mem.npf_slot(qpn).outcome(seq) == Some(false) {
                        // The memory is not mapped: the request fails.
                        qp.responder.rx_fault = None;
                        qp.responder.expected_msn += 1;
                        let status = if kind == Kind::Send {
                            WcStatus::RemoteOperationError
                        } else {
                            WcStatus::RemoteAccessError
                        };
                        if take_recv {
                            let (r, _) = take_receive(qp);
                            self.counters.error_completions.fetch_add(1, Relaxed);
                            eng.push_completion(
                                recv_cq,
                                completion(
                                    r.wr_id,
                                    WcStatus::LocalProtectionError,
                                    WcOpcode::Recv,
                                    0,
                                    None,
                                    qpn,
                                ),
                            );
                            let flushed =
                                eng.enter_error(qpn, "a receive buffer is not mapped".into());
                            self.counters.error_completions.fetch_add(flushed, Relaxed);
                        }
                        self.refuse(eng, from, qpn, h, status);
                        return None;
                    }
                }
                // The receive-fault policy (`receive_fault.rs`): a SEND under `backup` is
                // stored in the ring if there is room.
                let policy = self.receive_fault.policy;
                let backup = policy == ReceiveFaultPolicy::Backup && kind == Kind::Send;
                let ring = if backup {
                    qp.responder.backup.as_mut()
                } else {
                    None
                };
                if let Some(p) = ring.and_then(|ring| ring.reserve(h.total_len, range)) {
                    let rf = &self.counters.receive_fault;
                    rf.backed_up.fetch_add(1, Relaxed);
                    rf.backup_bytes.fetch_add(h.total_len, Relaxed);
                    parked = Some(p);
                } else {
                    let write = kind != Kind::ReadRequest;
                    // Filed on this rank's own memory: the next pass (this application's or
                    // the driver thread's) serves it.
                    let seq = me.mem.npf_slot(qpn).file(range.addr, range.len, write);
                    let qp = eng.qps[qpn as usize].as_mut().expect("exists");
                    qp.responder.rx_fault = Some((h.msn, seq));
                    qp.responder.discard_msn = Some(h.msn);
                    let silent = match policy {
                        ReceiveFaultPolicy::Rnr => false,
                        ReceiveFaultPolicy::Drop => kind != Kind::ReadRequest,
                        ReceiveFaultPolicy::Backup => backup, // the ring is full
                    };
                    if silent {
                        let rf = &self.counters.receive_fault;
                        rf.dropped.fetch_add(1, Relaxed);
                        if backup {
                            rf.backup_full.fetch_add(1, Relaxed);
                        }
                    } else {
                        self.nak(from, src_qpn, h.msn, Nak::Rnr { fault: Some(seq) });
                    }
                    return None;
                }
            }
        }
        let qp = eng.qps[qpn as usize].as_mut().expect("exists");
        qp.responder.rx_fault = None;
        // A parked message's bytes go to the backup ring; its receive waits in `recv`.
        let targets = match (&parked, qp.responder.backup.as_ref()) {
            (Some(p), Some(ring)) => smallvec::smallvec![ring.keyed(p.at, h.total_len)],
            _ => targets,
        };
        match kind {
            Kind::ReadRequest => {
                qp.responder.reads_out.push_back(ReadOut {
                    msn: h.msn,
                    dst_qpn: src_qpn,
                    source: targets[0],
                    sent: 0,
                });
                qp.responder.expected_msn += 1;
                let msn_end = qp.responder.expected_msn;
                self.ack(from, src_qpn, msn_end);
                eng.mark_busy(qpn);
                None // nothing more to receive for it
            }
            Kind::AtomicRequest => {
                // Run once, now that it is accepted in order: a retransmitted copy has an
                // older sequence number and is ignored.
                self.execute_atomic(qp, h, payload, targets[0]);
                qp.responder.expected_msn += 1;
                let msn_end = qp.responder.expected_msn;
                self.ack(from, src_qpn, msn_end);
                eng.mark_busy(qpn);
                None
            }
            Kind::Write => Some(Incoming {
                msn: h.msn,
                kind: IncomingKind::Write,
                imm: None,
                targets,
                need: Access::REMOTE_WRITE,
                total: h.total_len,
                recv: None,
                parked: None,
            }),
            Kind::Send | Kind::WriteImm => {
                let (r, sges) = take_receive(qp);
                let k = if kind == Kind::Send {
                    IncomingKind::Send { wr_id: r.wr_id }
                } else {
                    IncomingKind::WriteImm { wr_id: r.wr_id }
                };
                let imm = (h.flags & HAS_IMM != 0).then_some(h.imm);
                Some(Incoming {
                    msn: h.msn,
                    kind: k,
                    imm,
                    targets,
                    need: if kind == Kind::Send {
                        Access::LOCAL_WRITE
                    } else {
                        Access::REMOTE_WRITE
                    },
                    total: h.total_len,
                    recv: Some((r, sges)),
                    parked,
                })
            }
            Kind::ReadResponse | Kind::AtomicResponse => unreachable!(),
        }
    }

    /// Receive buffers: key and LOCAL_WRITE checks (faults are handled by the caller).
    /// Returns the extents and, for each, whether it lies in an ODP region.
    #[allow(clippy::type_complexity)]
    fn local_targets(
        &self,
        sgl: &[Sge],
    ) -> Result<(SmallVec<[Extent; 2]>, SmallVec<[bool; 2]>), ()> {
        let tpt = self.own.tpt();
        let mut extents = SmallVec::new();
        let mut odp = SmallVec::new();
        for s in sgl.iter().filter(|s| s.len > 0) {
            let g = tpt
                .acquire(s.lkey, s.addr, s.len as u64, Access::LOCAL_WRITE)
                .map_err(|_| ())?;
            extents.push(Extent {
                addr: g.translation.dma_addr(s.addr),
                len: s.len as u64,
            });
            if g.translation.detached() {
                self.counters
                    .detached_bytes
                    .fetch_add(s.len as u64, Relaxed);
            }
            odp.push(g.translation.on_demand());
        }
        Ok((extents, odp))
    }
}
