//! Connecting an RC queue pair to its peer's endpoint: the checks, then RESET -> INIT ->
//! RTR -> RTS with the attributes `qp_state` builds.
#![forbid(unsafe_code)]

use super::*;

impl VerbsNic {
    /// [`Nic::connect`] for this provider.
    pub(super) fn connect_rc(&self, qpn: u32, remote: &Endpoint) -> Result<()> {
        let q = self.qp(qpn)?;
        let r = QpAddress::decode(remote)?;
        if r.rank as usize != q.peer {
            return Err(Error::InvalidArgument(format!(
                "queue pair {qpn} was created towards rank {}, but the endpoint is rank {}'s",
                q.peer, r.rank
            )));
        }
        if r.link != self.port.link {
            return Err(Error::InvalidArgument(format!(
                "rank {}'s port is {:?}, this one is {:?}: they cannot be connected",
                r.rank, r.link, self.port.link
            )));
        }
        let mut status = q.status.lock();
        if !status.state.may_go_to(QpState::Rtr) {
            return Err(Error::InvalidArgument(format!(
                "queue pair {qpn} is {:?}; only a new queue pair can be connected",
                status.state
            )));
        }
        let fail = |why: String| Error::QueuePairError {
            qpn,
            peer: q.peer,
            why,
        };
        let params = RtrParams {
            port: self.port.port,
            local_mtu: self.port.active_mtu_code,
            local_gid_index: self.port.gid_index,
            max_dest_rd_atomic: self.limits.max_qp_rd_atom.min(qp_state::MAX_RD_ATOMIC),
            rnr_timer_us: qp_state::rnr_timer_us_for(q.caps.rnr_timer_us, self.responder_may_fault),
        };
        let (mut rtr, mask) = qp_state::rtr_attr(&params, &r).map_err(fail)?;
        q.qp.modify(&mut rtr, mask)
            .map_err(|e| fail(format!("ibv_modify_qp INIT->RTR: {e}")))?;
        status.moved_to(QpState::Rtr);
        let (mut rts, mask) = qp_state::rts_attr(
            q.psn,
            qp_state::rnr_retry_for(q.caps.rnr_retry, r.responder_may_fault),
            self.limits.max_qp_init_rd_atom.min(qp_state::MAX_RD_ATOMIC),
        );
        q.qp.modify(&mut rts, mask)
            .map_err(|e| fail(format!("ibv_modify_qp RTR->RTS: {e}")))?;
        status.moved_to(QpState::Rts);
        Ok(())
    }
}
