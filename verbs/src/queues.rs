//! Making completion queues and RC queue pairs: their sizes checked against the device, the
//! completion-queue entries a queue pair reserves (`cq::CqBudget`), and `ibv_create_qp` with
//! the RESET -> INIT transition.
#![forbid(unsafe_code)]

use super::*;

impl VerbsNic {
    /// [`Nic::create_cq`] for this provider.
    pub(super) fn new_cq(&self, depth: u32) -> Result<u32> {
        if depth == 0 || depth > self.limits.max_cqe {
            return Err(Error::InvalidArgument(format!(
                "completion queue depth {depth}: the device allows 1..={}",
                self.limits.max_cqe
            )));
        }
        let cqe = i32::try_from(depth).unwrap_or(i32::MAX);
        let cq = self
            .ctx
            .create_cq(cqe)
            .map_err(|e| os(format!("ibv_create_cq(cqe={depth})"), e))?;
        let entry = CqEntry {
            budget: Mutex::new(cq::CqBudget::new(cq.entries())),
            cq,
            failed: AtomicBool::new(false),
        };
        let mut cqs = self.cqs.write();
        cqs.push(Arc::new(entry));
        Ok((cqs.len() - 1) as u32)
    }

    /// [`Nic::create_qp`] for this provider.
    pub(super) fn new_qp(
        &self,
        peer: usize,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
    ) -> Result<u32> {
        let (scq, rcq) = (self.cq(send_cq)?, self.cq(recv_cq)?);
        self.usable(send_cq, &scq)?;
        self.usable(recv_cq, &rcq)?;
        let c = &self.caps;
        if caps.max_sge > c.max_sge.min(MAX_SGE as u32)
            || caps.max_inline > c.max_inline
            || caps.max_send_wr > c.max_qp_wr
            || caps.max_recv_wr > c.max_qp_wr
        {
            return Err(Error::InvalidArgument(format!(
                "queue pair asks for {} SGEs, {} inline bytes, {}/{} send/receive requests; \
                 the device allows {}, {}, {}",
                caps.max_sge,
                caps.max_inline,
                caps.max_send_wr,
                caps.max_recv_wr,
                c.max_sge.min(MAX_SGE as u32),
                c.max_inline,
                c.max_qp_wr
            )));
        }
        // A request: `connect` raises it to 7 (forever) when the peer's device may page-fault
        // as a responder, whose RNR NAKs would use it up (`qp_state::rnr_retry_for`).
        if caps.rnr_retry > 7 {
            return Err(Error::InvalidArgument(format!(
                "rnr_retry {} does not fit its 3 bits (7 means retry forever)",
                caps.rnr_retry
            )));
        }
        // The completion queues must hold whatever this queue pair can have outstanding.
        let reserved = self.reserve_cq_entries(peer, (send_cq, &scq), (recv_cq, &rcq), &caps)?;
        match self.make_qp(peer, &scq, &rcq, caps) {
            Ok(qpn) => Ok(qpn),
            Err(e) => {
                release_cq_entries(reserved);
                Err(e)
            }
        }
    }

    /// Promises the completion queues of a new queue pair the entries it could fill
    /// (`cq::CqBudget`); `Err` names the numbers when they are not there. Returns what to
    /// give back should the queue pair not be made.
    fn reserve_cq_entries(
        &self,
        peer: usize,
        (send_cq, scq): (u32, &Arc<CqEntry>),
        (recv_cq, rcq): (u32, &Arc<CqEntry>),
        caps: &QpCaps,
    ) -> Result<Vec<(Arc<CqEntry>, u64)>> {
        let (sends, recvs) = (caps.max_send_wr, caps.max_recv_wr);
        let wanted: Vec<(u32, &Arc<CqEntry>, u64)> = if send_cq == recv_cq {
            vec![(send_cq, scq, cq::demand(sends, recvs, true, true))]
        } else {
            vec![
                (send_cq, scq, cq::demand(sends, recvs, true, false)),
                (recv_cq, rcq, cq::demand(sends, recvs, false, true)),
            ]
        };
        let mut reserved: Vec<(Arc<CqEntry>, u64)> = Vec::new();
        for (id, entry, demand) in wanted {
            if let Err(over) = entry.budget.lock().reserve(demand) {
                release_cq_entries(reserved);
                return Err(Error::InvalidArgument(over.message(id, peer, sends, recvs)));
            }
            reserved.push((entry.clone(), demand));
        }
        Ok(reserved)
    }

    /// `ibv_create_qp` and RESET -> INIT for [`Nic::create_qp`], after its checks.
    fn make_qp(
        &self,
        peer: usize,
        scq: &Arc<CqEntry>,
        rcq: &Arc<CqEntry>,
        caps: QpCaps,
    ) -> Result<u32> {
        let want = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_sge,
            max_recv_sge: caps.max_sge,
            max_inline_data: caps.max_inline,
        };
        let (qp, got) = self
            .pd
            .create_rc_qp(&scq.cq, &rcq.cq, want)
            .map_err(|e| os(format!("ibv_create_qp(RC, {caps:?})"), e))?;
        // Peers' atomics are refused by a queue pair without IBV_ACCESS_REMOTE_ATOMIC,
        // whatever the region allows; a device without atomics is not asked for it.
        let mut remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        if self.caps.atomics {
            remote = remote | Access::REMOTE_ATOMIC;
        }
        let (mut attr, mask) = qp_state::init_attr(self.port.port, regions::access_bits(remote));
        // On failure `qp` drops here and is destroyed.
        qp.modify(&mut attr, mask)
            .map_err(|e| os(format!("ibv_modify_qp(qp {}, RESET->INIT)", qp.qp_num()), e))?;
        let qpn = qp.qp_num();
        let entry = QueuePairEntry {
            psn: rand::random::<u32>() & 0xff_ffff,
            peer,
            caps,
            limits: QueueLimits {
                max_send_sge: got.max_send_sge,
                max_recv_sge: got.max_recv_sge,
                max_inline: got.max_inline_data,
            },
            status: Mutex::new(QpStatus::new()),
            // As deep as asked (the device may grant more, `ibv_create_qp(3)`), so that the
            // completion queues' reservation (`reserve_cq_entries`) bounds what can be
            // outstanding.
            sq: Mutex::new(WrRing::new(caps.max_send_wr.min(got.max_send_wr))),
            rq: Mutex::new(WrRing::new(caps.max_recv_wr.min(got.max_recv_wr))),
            qp,
        };
        self.qps.write().insert(qpn, Arc::new(entry));
        Ok(qpn)
    }
}

/// Gives back what [`VerbsNic::reserve_cq_entries`] promised.
fn release_cq_entries(reserved: Vec<(Arc<CqEntry>, u64)>) {
    for (entry, demand) in reserved {
        entry.budget.lock().release(demand);
    }
}
