//! The RC queue-pair state machine (RESET -> INIT -> RTR -> RTS, and ERROR) and the
//! `ibv_qp_attr` + attribute-mask builders of each transition, with exactly the attributes
//! `ibv_modify_qp(3)` lists as required for IBV_QPT_RC:
//!
//! | next state | required attributes |
//! |---|---|
//! | INIT | STATE, PKEY_INDEX, PORT, ACCESS_FLAGS |
//! | RTR | STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER |
//! | RTS | STATE, SQ_PSN, MAX_QP_RD_ATOMIC, RETRY_CNT, RNR_RETRY, TIMEOUT |
#![forbid(unsafe_code)]

use rdma_sys::{ibv_gid, ibv_global_route, ibv_qp_attr, ibv_qp_attr_mask as M, ibv_qp_state};

use super::endpoint::QpAddress;
use super::ffi::zeroed;

/// Local ACK timeout exponent: 4.096 µs * 2^14 ≈ 67 ms before a request is retransmitted
/// (`ibv_qp_attr::timeout`; the value perftest and most MPI libraries use).
pub(crate) const ACK_TIMEOUT: u8 = 14;
/// Transport retries before `IBV_WC_RETRY_EXC_ERR` (`retry_cnt`, 3 bits; 7 is the maximum).
pub(crate) const RETRY_CNT: u8 = 7;
/// Hop limit of the GRH (RoCE v2 TTL).
pub(crate) const HOP_LIMIT: u8 = 64;
/// Cap on outstanding RDMA READs per queue pair, each way (the device may allow fewer).
pub(crate) const MAX_RD_ATOMIC: u8 = 16;
/// `rnr_retry` 7: retry receiver-not-ready forever.
pub(crate) const RNR_RETRY_FOREVER: u8 = 7;
/// The least `min_rnr_timer` (µs) of a queue pair whose device may page-fault as a
/// responder: 0.64 ms (code 12), the value of rdma-core's examples (`rc_pingpong.c`) and
/// tests (`tests/base.py`). See [`rnr_timer_us_for`].
pub(crate) const ODP_MIN_RNR_TIMER_US: u32 = 640;

/// The `rnr_retry` a queue pair gets: `requested`, or [`RNR_RETRY_FOREVER`] when the peer's
/// device may page-fault as a responder.
///
/// A responder resolving a network page fault (an RDMA WRITE or a receive into an ODP region
/// whose page is absent, an RDMA READ from one) answers with RNR NAKs, and each uses up one
/// of the requester's `rnr_retry`; a fault takes 0.1 to 1 ms or more to resolve (docs/verbs.md,
/// "What to expect"), so any finite count can end in `IBV_WC_RNR_RETRY_EXC_ERR` under
/// faults that would have resolved. Whether the peer will register ODP regions is not known
/// when the queue pairs connect (pagewire registers after connecting), so its device's
/// capability decides, sent in the endpoint.
pub(crate) fn rnr_retry_for(requested: u8, peer_may_fault: bool) -> u8 {
    if peer_may_fault {
        RNR_RETRY_FOREVER
    } else {
        requested.min(RNR_RETRY_FOREVER)
    }
}

/// The wait this queue pair, as a responder, asks a requester to keep after its RNR NAKs
/// (`min_rnr_timer`): `requested`, raised to [`ODP_MIN_RNR_TIMER_US`] when this side's
/// device may page-fault as a responder.
///
/// The choice, not measured (no hardware): with [`rnr_retry_for`] retrying forever, the
/// timer no longer decides *whether* a transfer survives a fault, only how often the
/// requester resends into it. A fault takes about 0.1 to 1 ms, so a 20 µs timer (the trait's
/// default) would resend 5 to 50 times per fault, each time the packets from the faulting
/// one on, into a responder that cannot take them yet; 0.64 ms resends at most a few times
/// and costs at most about 0.5 ms of extra latency on an access that is already cold. Where
/// no ODP is possible the caller's value stands: pagewire's credits keep receives posted,
/// so an RNR NAK is a start-up race that a short timer ends sooner. Whether a device puts
/// the QP's `min_rnr_timer` into the RNR NAKs of a page fault, as into those of a missing
/// receive, the verbs API does not say; if it uses a timer of its own, this raise only
/// slows receive-not-ready retries on ODP-capable devices.
pub(crate) fn rnr_timer_us_for(requested: u32, local_may_fault: bool) -> u32 {
    if local_may_fault {
        requested.max(ODP_MIN_RNR_TIMER_US)
    } else {
        requested
    }
}

/// Where a queue pair is in its life (`enum ibv_qp_state`, the part pagewire uses). A queue
/// pair is created in RESET and `create_qp` moves it to INIT before returning, so RESET is
/// never held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpState {
    Init,
    Rtr,
    Rts,
    Error,
}

impl QpState {
    /// The `enum ibv_qp_state` value.
    pub(crate) fn raw(self) -> u32 {
        match self {
            QpState::Init => ibv_qp_state::IBV_QPS_INIT,
            QpState::Rtr => ibv_qp_state::IBV_QPS_RTR,
            QpState::Rts => ibv_qp_state::IBV_QPS_RTS,
            QpState::Error => ibv_qp_state::IBV_QPS_ERR,
        }
    }

    /// Whether `ibv_modify_qp` may take a queue pair from `self` to `next` in pagewire's
    /// flow: one step forward, or to ERROR from anywhere.
    pub(crate) fn may_go_to(self, next: QpState) -> bool {
        matches!(
            (self, next),
            (QpState::Init, QpState::Rtr) | (QpState::Rtr, QpState::Rts) | (_, QpState::Error)
        )
    }
}

/// What the provider knows of a queue pair's life: its state, whether it ever reached RTS,
/// and what put it into ERROR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QpStatus {
    /// The state the provider last moved it to, or ERROR once an error completion or a fatal
    /// event said so.
    pub state: QpState,
    /// It reached RTS at some point (its send queue was enabled then; see [`SendGate`]).
    pub reached_rts: bool,
    /// Why it is in ERROR (the first reason seen).
    pub error: Option<String>,
}

/// Whether `post_send` may hand a work request to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendGate {
    /// RTS, or ERROR after RTS: the device accepts it (and, in ERROR, flushes it).
    Post,
    /// INIT or RTR: `connect` has not brought it to RTS.
    NotConnected,
    /// ERROR without ever having reached RTS: no send can be posted, and none flushed.
    FailedBeforeRts,
}

impl QpStatus {
    /// A queue pair just moved to INIT by `create_qp`.
    pub(crate) fn new() -> QpStatus {
        QpStatus {
            state: QpState::Init,
            reached_rts: false,
            error: None,
        }
    }

    /// Records the move to `next` (which `ibv_modify_qp` just made).
    pub(crate) fn moved_to(&mut self, next: QpState) {
        self.state = next;
        self.reached_rts |= next == QpState::Rts;
    }

    /// Records that the queue pair is in ERROR because of `why` (the first reason is kept).
    pub(crate) fn failed(&mut self, why: impl FnOnce() -> String) {
        self.state = QpState::Error;
        if self.error.is_none() {
            self.error = Some(why());
        }
    }

    /// Whether a send may be posted now.
    ///
    /// Sends are refused before RTS as the soft provider refuses them on an unconnected
    /// queue pair. mlx5 would fail them with `ENOMEM` (`set_qp_operational_state` in
    /// `providers/mlx5/verbs.c` enables the send queue's scatter-gather limit,
    /// `qp_state_max_gs`, only at RTS; `_mlx5_post_send` fails any request above it with
    /// `ENOMEM`), which reads like a full queue and would make a caller that waits for room
    /// wait forever. In ERROR after RTS the device still takes sends and completes them with
    /// `IBV_WC_WR_FLUSH_ERR`, which is how a queue is drained.
    pub(crate) fn send_gate(&self) -> SendGate {
        match self.state {
            QpState::Rts => SendGate::Post,
            QpState::Error if self.reached_rts => SendGate::Post,
            QpState::Error => SendGate::FailedBeforeRts,
            QpState::Init | QpState::Rtr => SendGate::NotConnected,
        }
    }
}

/// `enum ibv_mtu` code to bytes (1: 256 .. 5: 4096).
pub(crate) fn mtu_bytes(code: u32) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

/// Waits of RNR NAK timer codes 1..=31, in units of 10 µs (code 0 is 655.36 ms).
const RNR_TICKS: [u32; 31] = [
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
    3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The RNR NAK timer code (`min_rnr_timer`, 5 bits) for a wait of at least `us`
/// microseconds: the IBA encoding, as the kernel's `enum ib_rnr_timeout` lists it (code 0 is
/// the longest wait, 655.36 ms; codes 1..=31 run from 0.01 ms to 491.52 ms).
pub(crate) fn rnr_timer_code(us: u32) -> u8 {
    RNR_TICKS
        .iter()
        .position(|t| t * 10 >= us)
        .map_or(0, |i| i as u8 + 1)
}

/// RESET -> INIT: port, P_Key index 0, and the remote rights the queue pair grants
/// (`IBV_ACCESS_*`; the regions' own rights still apply).
pub(crate) fn init_attr(port: u8, access: u32) -> (ibv_qp_attr, u32) {
    let mut a: ibv_qp_attr = zeroed();
    a.qp_state = QpState::Init.raw();
    a.pkey_index = 0;
    a.port_num = port;
    a.qp_access_flags = access;
    let mask =
        M::IBV_QP_STATE.0 | M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_PORT.0 | M::IBV_QP_ACCESS_FLAGS.0;
    (a, mask)
}

/// What INIT -> RTR needs from this side.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RtrParams {
    pub port: u8,
    /// This port's active MTU (`enum ibv_mtu`).
    pub local_mtu: u32,
    /// This port's GID index for the GRH (`None`: LID routing).
    pub local_gid_index: Option<u32>,
    /// Responder resources for incoming READs (`max_dest_rd_atomic`).
    pub max_dest_rd_atomic: u8,
    /// From `QpCaps::rnr_timer_us`, through [`rnr_timer_us_for`].
    pub rnr_timer_us: u32,
}

/// INIT -> RTR towards `remote`: the address vector (DLID, or a GRH with the remote GID when
/// the remote sent one), path MTU = the smaller of both ports', the remote QPN and PSN.
pub(crate) fn rtr_attr(p: &RtrParams, remote: &QpAddress) -> Result<(ibv_qp_attr, u32), String> {
    let mut a: ibv_qp_attr = zeroed();
    a.qp_state = QpState::Rtr.raw();
    a.path_mtu = p.local_mtu.min(remote.mtu);
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = p.max_dest_rd_atomic;
    a.min_rnr_timer = rnr_timer_code(p.rnr_timer_us);
    a.ah_attr.dlid = remote.lid;
    a.ah_attr.sl = 0;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = p.port;
    match (remote.gid, p.local_gid_index) {
        (Some(dgid), Some(sgid_index)) => {
            let sgid_index = u8::try_from(sgid_index)
                .map_err(|_| format!("GID index {sgid_index} does not fit the GRH's 8 bits"))?;
            a.ah_attr.is_global = 1;
            a.ah_attr.grh = ibv_global_route {
                dgid: ibv_gid { raw: dgid },
                flow_label: 0,
                sgid_index,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
            };
        }
        (Some(_), None) => {
            return Err(
                "the peer addresses by GID, but this port has no GID selected \
                        (set PAGEWIRE_GID_INDEX)"
                    .into(),
            )
        }
        (None, Some(_)) => {
            return Err("this port routes by GID, but the peer sent no GID \
                        (set PAGEWIRE_GID_INDEX on both sides)"
                .into())
        }
        (None, None) => a.ah_attr.is_global = 0,
    }
    let mask = M::IBV_QP_STATE.0
        | M::IBV_QP_AV.0
        | M::IBV_QP_PATH_MTU.0
        | M::IBV_QP_DEST_QPN.0
        | M::IBV_QP_RQ_PSN.0
        | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
        | M::IBV_QP_MIN_RNR_TIMER.0;
    Ok((a, mask))
}

/// RTR -> RTS: this side's PSN, the ACK timeout and retry count, the RNR retry count
/// ([`rnr_retry_for`]; 7 = retry forever), outstanding READs.
pub(crate) fn rts_attr(sq_psn: u32, rnr_retry: u8, max_rd_atomic: u8) -> (ibv_qp_attr, u32) {
    let mut a: ibv_qp_attr = zeroed();
    a.qp_state = QpState::Rts.raw();
    a.sq_psn = sq_psn;
    a.timeout = ACK_TIMEOUT;
    a.retry_cnt = RETRY_CNT;
    a.rnr_retry = rnr_retry.min(7);
    a.max_rd_atomic = max_rd_atomic;
    let mask = M::IBV_QP_STATE.0
        | M::IBV_QP_SQ_PSN.0
        | M::IBV_QP_TIMEOUT.0
        | M::IBV_QP_RETRY_CNT.0
        | M::IBV_QP_RNR_RETRY.0
        | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
    (a, mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LinkLayer;
    use crate::ffi::gid_bytes;

    fn remote(gid: Option<[u8; 16]>) -> QpAddress {
        QpAddress {
            rank: 1,
            qpn: 0x99,
            psn: 0x1234,
            lid: 7,
            gid,
            mtu: 3,
            link: LinkLayer::Infiniband,
            responder_may_fault: false,
        }
    }

    fn params(gid_index: Option<u32>) -> RtrParams {
        RtrParams {
            port: 1,
            local_mtu: 5,
            local_gid_index: gid_index,
            max_dest_rd_atomic: 16,
            rnr_timer_us: 20,
        }
    }

    #[test]
    fn masks_are_exactly_the_man_pages_required_sets() {
        let (_, init) = init_attr(1, 7);
        assert_eq!(init, 1 | 16 | 32 | 8);
        let (_, rtr) = rtr_attr(&params(None), &remote(None)).unwrap();
        assert_eq!(rtr, 1 | 128 | 256 | 1_048_576 | 4096 | 131_072 | 32_768);
        let (_, rts) = rts_attr(5, 7, 16);
        assert_eq!(rts, 1 | 65_536 | 8192 | 1024 | 2048 | 512);
    }

    #[test]
    fn init_sets_port_and_access() {
        let (a, _) = init_attr(2, 1 | 2 | 4);
        assert_eq!(
            (a.qp_state, a.port_num, a.pkey_index, a.qp_access_flags),
            (ibv_qp_state::IBV_QPS_INIT, 2, 0, 7)
        );
    }

    #[test]
    fn rtr_by_lid_takes_the_smaller_mtu_and_the_peers_qpn_and_psn() {
        let (a, _) = rtr_attr(&params(None), &remote(None)).unwrap();
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!((a.path_mtu, a.dest_qp_num, a.rq_psn), (3, 0x99, 0x1234));
        assert_eq!(
            (a.ah_attr.dlid, a.ah_attr.port_num, a.ah_attr.is_global),
            (7, 1, 0)
        );
        assert_eq!((a.max_dest_rd_atomic, a.min_rnr_timer), (16, 2));
    }

    #[test]
    fn rtr_by_gid_fills_the_grh() {
        let mut g = [0u8; 16];
        g[15] = 9;
        let (a, _) = rtr_attr(&params(Some(3)), &remote(Some(g))).unwrap();
        assert_eq!(a.ah_attr.is_global, 1);
        assert_eq!(gid_bytes(&a.ah_attr.grh.dgid), g);
        assert_eq!(
            (a.ah_attr.grh.sgid_index, a.ah_attr.grh.hop_limit),
            (3, HOP_LIMIT)
        );
        assert!(rtr_attr(&params(None), &remote(Some(g))).is_err());
        assert!(rtr_attr(&params(Some(3)), &remote(None)).is_err());
        assert!(rtr_attr(&params(Some(300)), &remote(Some(g))).is_err());
    }

    #[test]
    fn rts_carries_psn_timeouts_and_retries() {
        let (a, _) = rts_attr(0xabc, 9, 8);
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTS);
        assert_eq!(
            (
                a.sq_psn,
                a.timeout,
                a.retry_cnt,
                a.rnr_retry,
                a.max_rd_atomic
            ),
            (0xabc, ACK_TIMEOUT, RETRY_CNT, 7, 8)
        );
        assert_eq!(rts_attr(1, 3, 1).0.rnr_retry, 3);
    }

    #[test]
    fn the_state_machine_only_steps_forward_or_fails() {
        use QpState::*;
        assert!(Init.may_go_to(Rtr) && Rtr.may_go_to(Rts));
        assert!(Rts.may_go_to(Error) && Init.may_go_to(Error));
        assert!(!Init.may_go_to(Rts) && !Rts.may_go_to(Rtr) && !Rts.may_go_to(Rts));
        assert_eq!(Error.raw(), ibv_qp_state::IBV_QPS_ERR);
    }

    #[test]
    fn sends_are_posted_only_in_rts_or_to_flush_after_rts() {
        let mut s = QpStatus::new();
        assert_eq!(s.send_gate(), SendGate::NotConnected);
        s.moved_to(QpState::Rtr);
        assert_eq!(s.send_gate(), SendGate::NotConnected);
        s.moved_to(QpState::Rts);
        assert_eq!(s.send_gate(), SendGate::Post);
        s.failed(|| "work request 3 ended with remote access error".into());
        s.failed(|| "a later reason".into());
        assert_eq!(s.state, QpState::Error);
        assert_eq!(
            s.send_gate(),
            SendGate::Post,
            "in ERROR after RTS sends are flushed"
        );
        assert_eq!(
            s.error.as_deref(),
            Some("work request 3 ended with remote access error")
        );
        // A queue pair whose connection failed half-way never had a send queue.
        let mut half = QpStatus::new();
        half.moved_to(QpState::Rtr);
        half.failed(|| "IBV_EVENT_QP_FATAL".into());
        assert_eq!(half.send_gate(), SendGate::FailedBeforeRts);
    }

    #[test]
    fn page_faulting_responders_get_infinite_rnr_retries_and_a_longer_timer() {
        // No ODP at the peer: the caller's choice.
        assert_eq!(rnr_retry_for(3, false), 3);
        assert_eq!(rnr_retry_for(9, false), 7);
        // Responder page faults are answered with RNR NAKs: retry forever.
        assert_eq!(rnr_retry_for(0, true), RNR_RETRY_FOREVER);
        assert_eq!(rnr_retry_for(3, true), RNR_RETRY_FOREVER);
        // The trait's default 20 µs, raised to rdma-core's 0.64 ms where this side may fault.
        assert_eq!(rnr_timer_us_for(20, false), 20);
        assert_eq!(rnr_timer_us_for(20, true), ODP_MIN_RNR_TIMER_US);
        assert_eq!(rnr_timer_us_for(5_000, true), 5_000);
        assert_eq!(rnr_timer_code(rnr_timer_us_for(20, true)), 12);
        let (a, _) = rts_attr(1, rnr_retry_for(2, true), 1);
        assert_eq!(a.rnr_retry, 7);
    }

    #[test]
    fn rnr_timer_codes_follow_the_iba_table() {
        assert_eq!(rnr_timer_code(0), 1);
        assert_eq!(rnr_timer_code(10), 1);
        assert_eq!(rnr_timer_code(11), 2);
        assert_eq!(rnr_timer_code(20), 2);
        assert_eq!(rnr_timer_code(50), 5); // 0.06 ms
        assert_eq!(rnr_timer_code(640), 12); // 0.64 ms
        assert_eq!(rnr_timer_code(491_520), 31);
        assert_eq!(rnr_timer_code(491_521), 0); // 655.36 ms, the longest wait
        assert_eq!(RNR_TICKS[11] * 10, 640);
    }

    #[test]
    fn mtu_codes_map_to_bytes() {
        assert_eq!(
            (1..=5).map(mtu_bytes).collect::<Vec<_>>(),
            vec![256, 512, 1024, 2048, 4096]
        );
        assert_eq!(mtu_bytes(0), 0);
    }
}
