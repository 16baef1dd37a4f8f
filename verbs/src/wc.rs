//! Reading `ibv_wc`: a completion's status and opcode as the trait's [`WcStatus`] and
//! [`WcOpcode`], the fields a successful completion defines, and what a send work request
//! completes as.
//!
//! **Status mapping** (`ibv_wc_status` -> [`WcStatus`]), lossy where the trait has fewer
//! kinds; the raw status and vendor syndrome of recent errors stay available from
//! `VerbsNic::recent_errors`:
//!
//! | ibv_wc_status | WcStatus |
//! |---|---|
//! | SUCCESS | Success |
//! | LOC_LEN_ERR | LocalLengthError |
//! | LOC_PROT_ERR, LOC_ACCESS_ERR | LocalProtectionError |
//! | LOC_QP_OP_ERR, LOC_EEC_OP_ERR, MW_BIND_ERR, LOC_RDD_VIOL_ERR, FATAL_ERR, GENERAL_ERR, TM_ERR, TM_RNDV_INCOMPLETE | LocalProtectionError (no closer kind) |
//! | WR_FLUSH_ERR | WrFlushError |
//! | REM_INV_REQ_ERR, REM_INV_RD_REQ_ERR, INV_EECN_ERR, INV_EEC_STATE_ERR | RemoteInvalidRequest |
//! | REM_ACCESS_ERR | RemoteAccessError |
//! | REM_OP_ERR, REM_ABORT_ERR, BAD_RESP_ERR, any unknown value | RemoteOperationError |
//! | RETRY_EXC_ERR, RESP_TIMEOUT_ERR | RetryExceeded |
//! | RNR_RETRY_EXC_ERR | RnrRetryExceeded |
#![forbid(unsafe_code)]

use rdma_sys::{ibv_wc, ibv_wc_flags, ibv_wc_opcode as O, ibv_wc_status as S};

use pagewire_nic::{Opcode, WcOpcode, WcStatus, ATOMIC_BYTES};

use super::ffi::wc_imm_raw;

/// The completion status of an `ibv_wc_status` value (see the module's table).
pub(super) fn status(raw: u32) -> WcStatus {
    match raw {
        S::IBV_WC_SUCCESS => WcStatus::Success,
        S::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
        S::IBV_WC_LOC_PROT_ERR
        | S::IBV_WC_LOC_ACCESS_ERR
        | S::IBV_WC_LOC_QP_OP_ERR
        | S::IBV_WC_LOC_EEC_OP_ERR
        | S::IBV_WC_MW_BIND_ERR
        | S::IBV_WC_LOC_RDD_VIOL_ERR
        | S::IBV_WC_FATAL_ERR
        | S::IBV_WC_GENERAL_ERR
        | S::IBV_WC_TM_ERR
        | S::IBV_WC_TM_RNDV_INCOMPLETE => WcStatus::LocalProtectionError,
        S::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushError,
        S::IBV_WC_REM_INV_REQ_ERR
        | S::IBV_WC_REM_INV_RD_REQ_ERR
        | S::IBV_WC_INV_EECN_ERR
        | S::IBV_WC_INV_EEC_STATE_ERR => WcStatus::RemoteInvalidRequest,
        S::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        S::IBV_WC_RETRY_EXC_ERR | S::IBV_WC_RESP_TIMEOUT_ERR => WcStatus::RetryExceeded,
        S::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        // REM_OP_ERR, REM_ABORT_ERR, BAD_RESP_ERR and values this build does not know.
        _ => WcStatus::RemoteOperationError,
    }
}

/// The opcode of a successful completion (`ibv_wc_opcode`); `None` for kinds pagewire never
/// posts (memory windows, local invalidation, TSO, tag matching).
fn wc_opcode(raw: u32) -> Option<WcOpcode> {
    match raw {
        O::IBV_WC_SEND => Some(WcOpcode::Send),
        O::IBV_WC_RDMA_WRITE => Some(WcOpcode::RdmaWrite),
        O::IBV_WC_RDMA_READ => Some(WcOpcode::RdmaRead),
        O::IBV_WC_COMP_SWAP => Some(WcOpcode::CompSwap),
        O::IBV_WC_FETCH_ADD => Some(WcOpcode::FetchAdd),
        O::IBV_WC_RECV => Some(WcOpcode::Recv),
        O::IBV_WC_RECV_RDMA_WITH_IMM => Some(WcOpcode::RecvRdmaWithImm),
        _ => None,
    }
}

/// What a successful completion says beyond its `wr_id` and status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SuccessFields {
    /// The completion's opcode (the posted one when `ibv_wc::opcode` is not one pagewire
    /// posts).
    pub(super) opcode: WcOpcode,
    /// Bytes received (receives) or read (RDMA READ); [`ATOMIC_BYTES`] for atomics; 0 for
    /// sends and writes.
    pub(super) byte_len: u32,
    /// The immediate data of a receive that carried one.
    pub(super) imm: Option<u32>,
}

/// The opcode, length and immediate of a successful `wc`, reading only the fields the verbs
/// contract defines for its opcode. `posted_as` is what the provider's own record says the
/// request was.
///
/// A provider writes `byte_len` and `imm_data` only where they mean something: mlx5's
/// `handle_good_req` (`providers/mlx5/cq.c`) writes `byte_len` for RDMA READ and atomics
/// only, never writes `imm_data` for a send-queue completion, yet sets `IBV_WC_WITH_IMM` on
/// the sender's own SEND_WITH_IMM and RDMA_WRITE_WITH_IMM completions. An `ibv_wc` reused
/// across polls therefore still holds an earlier receive's length and immediate when a send
/// completes into it. So: `imm` only for receive opcodes with `IBV_WC_WITH_IMM`, `byte_len`
/// only for receives and RDMA READ (`ibv_poll_cq(3)`: "byte_len: Number of bytes
/// transferred"; `Completion::byte_len`: "bytes received (receives) or transferred (READ; 8
/// for atomics)"). An atomic always moves one word, so its length is [`ATOMIC_BYTES`]
/// whatever the provider wrote (mlx5 writes 8; a provider that writes nothing would leave an
/// earlier completion's length).
pub(super) fn success_fields(wc: &ibv_wc, posted_as: WcOpcode) -> SuccessFields {
    let opcode = wc_opcode(wc.opcode).unwrap_or(posted_as);
    let receive = matches!(opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
    let byte_len = match opcode {
        WcOpcode::Recv | WcOpcode::RecvRdmaWithImm | WcOpcode::RdmaRead => wc.byte_len,
        WcOpcode::FetchAdd | WcOpcode::CompSwap => ATOMIC_BYTES,
        WcOpcode::Send | WcOpcode::RdmaWrite => 0,
    };
    let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    SuccessFields {
        opcode,
        byte_len,
        imm: (receive && with_imm).then(|| u32::from_be(wc_imm_raw(wc))),
    }
}

/// What a send work request completes as.
pub(super) fn completes_as(op: &Opcode) -> WcOpcode {
    match op {
        Opcode::Send | Opcode::SendWithImm(_) => WcOpcode::Send,
        Opcode::RdmaWrite { .. } | Opcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        Opcode::RdmaRead { .. } => WcOpcode::RdmaRead,
        Opcode::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
        Opcode::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::zeroed;

    #[test]
    fn every_ibv_wc_status_maps() {
        use WcStatus::*;
        let expect = [
            (0, Success),
            (1, LocalLengthError),
            (2, LocalProtectionError),
            (3, LocalProtectionError),
            (4, LocalProtectionError),
            (5, WrFlushError),
            (6, LocalProtectionError),
            (7, RemoteOperationError),
            (8, LocalProtectionError),
            (9, RemoteInvalidRequest),
            (10, RemoteAccessError),
            (11, RemoteOperationError),
            (12, RetryExceeded),
            (13, RnrRetryExceeded),
            (14, LocalProtectionError),
            (15, RemoteInvalidRequest),
            (16, RemoteOperationError),
            (17, RemoteInvalidRequest),
            (18, RemoteInvalidRequest),
            (19, LocalProtectionError),
            (20, RetryExceeded),
            (21, LocalProtectionError),
            (22, LocalProtectionError),
            (23, LocalProtectionError),
            (99, RemoteOperationError),
        ];
        for (raw, want) in expect {
            assert_eq!(status(raw), want, "ibv_wc_status {raw}");
        }
        // The names match libibverbs' own strings where the trait has the same kind.
        for raw in [0u32, 1, 4, 5, 9, 10, 11, 12, 13] {
            assert_eq!(
                status(raw).as_str(),
                crate::ffi::wc_status_str(raw),
                "ibv_wc_status {raw}"
            );
        }
    }

    #[test]
    fn completion_opcodes_map() {
        assert_eq!(wc_opcode(0), Some(WcOpcode::Send));
        assert_eq!(wc_opcode(1), Some(WcOpcode::RdmaWrite));
        assert_eq!(wc_opcode(2), Some(WcOpcode::RdmaRead));
        assert_eq!(wc_opcode(3), Some(WcOpcode::CompSwap));
        assert_eq!(wc_opcode(4), Some(WcOpcode::FetchAdd));
        assert_eq!(wc_opcode(128), Some(WcOpcode::Recv));
        assert_eq!(wc_opcode(129), Some(WcOpcode::RecvRdmaWithImm));
        // IBV_WC_BIND_MW, IBV_WC_LOCAL_INV, IBV_WC_TSO: never posted.
        assert_eq!(wc_opcode(5), None);
        assert_eq!(wc_opcode(6), None);
        assert_eq!(wc_opcode(7), None);
        assert_eq!(
            completes_as(&Opcode::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 0
            }),
            WcOpcode::RdmaWrite
        );
        assert_eq!(completes_as(&Opcode::SendWithImm(1)), WcOpcode::Send);
        assert_eq!(
            completes_as(&Opcode::AtomicFetchAdd {
                remote_addr: 0,
                rkey: 0,
                add: 1
            }),
            WcOpcode::FetchAdd
        );
        assert_eq!(
            completes_as(&Opcode::AtomicCmpSwap {
                remote_addr: 0,
                rkey: 0,
                compare: 0,
                swap: 1
            }),
            WcOpcode::CompSwap
        );
    }

    /// An atomic's completion is one word long, whatever the entry held before, and never
    /// carries an immediate.
    #[test]
    fn atomic_completions_are_eight_bytes_long() {
        let mut wc: ibv_wc = zeroed();
        // Left over from a receive polled into the same entry earlier.
        wc.byte_len = 8192;
        wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        wc.imm_data_invalidated_rkey_union.imm_data = 0xfeed_f00du32.to_be();
        for (raw, posted_as) in [
            (O::IBV_WC_FETCH_ADD, WcOpcode::FetchAdd),
            (O::IBV_WC_COMP_SWAP, WcOpcode::CompSwap),
        ] {
            wc.opcode = raw;
            assert_eq!(
                success_fields(&wc, posted_as),
                SuccessFields {
                    opcode: posted_as,
                    byte_len: 8,
                    imm: None
                }
            );
        }
        // The provider's record decides when the device reports an opcode pagewire never
        // posts.
        wc.opcode = O::IBV_WC_BIND_MW;
        assert_eq!(
            success_fields(&wc, WcOpcode::CompSwap).byte_len,
            ATOMIC_BYTES
        );
    }

    /// One `ibv_wc` written the way mlx5 writes it (`mlx5_parse_cqe`: `wc_flags` and
    /// `qp_num` reset, then `handle_good_req` for a send-queue entry): a receive with an
    /// immediate first, then the sender's own SEND_WITH_IMM and RDMA_WRITE_WITH_IMM
    /// completions into the same entry, which leave `byte_len` and `imm_data` as they were.
    #[test]
    fn send_completions_in_a_reused_wc_array_carry_no_stale_length_or_immediate() {
        let mut wcs: [ibv_wc; 2] = std::array::from_fn(|_| zeroed());
        let with_imm = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        // A receive of a SEND_WITH_IMM: length and immediate are the receive's.
        wcs[1].opcode = O::IBV_WC_RECV;
        wcs[1].wc_flags = with_imm;
        wcs[1].byte_len = 8192;
        wcs[1].imm_data_invalidated_rkey_union.imm_data = 0xfeed_f00du32.to_be();
        assert_eq!(
            success_fields(&wcs[1], WcOpcode::Recv),
            SuccessFields {
                opcode: WcOpcode::Recv,
                byte_len: 8192,
                imm: Some(0xfeed_f00d)
            }
        );
        // The next poll reuses the entry for this side's own SEND_WITH_IMM.
        wcs[1].opcode = O::IBV_WC_SEND;
        wcs[1].wc_flags = with_imm;
        assert_eq!(
            success_fields(&wcs[1], WcOpcode::Send),
            SuccessFields {
                opcode: WcOpcode::Send,
                byte_len: 0,
                imm: None
            }
        );
        // ... and for an RDMA_WRITE_WITH_IMM.
        wcs[1].opcode = O::IBV_WC_RDMA_WRITE;
        assert_eq!(
            success_fields(&wcs[1], WcOpcode::RdmaWrite),
            SuccessFields {
                opcode: WcOpcode::RdmaWrite,
                byte_len: 0,
                imm: None
            }
        );
        // An RDMA READ's length is its own (handle_good_req writes it).
        wcs[1].opcode = O::IBV_WC_RDMA_READ;
        wcs[1].wc_flags = 0;
        wcs[1].byte_len = 4096;
        assert_eq!(
            success_fields(&wcs[1], WcOpcode::RdmaRead),
            SuccessFields {
                opcode: WcOpcode::RdmaRead,
                byte_len: 4096,
                imm: None
            }
        );
        // A receive without IBV_WC_WITH_IMM has no immediate, whatever the union holds; a
        // receive consumed by a WRITE_WITH_IMM has one.
        wcs[1].opcode = O::IBV_WC_RECV;
        wcs[1].byte_len = 64;
        assert_eq!(success_fields(&wcs[1], WcOpcode::Recv).imm, None);
        wcs[1].opcode = O::IBV_WC_RECV_RDMA_WITH_IMM;
        wcs[1].wc_flags = with_imm;
        assert_eq!(
            success_fields(&wcs[1], WcOpcode::Recv),
            SuccessFields {
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: 64,
                imm: Some(0xfeed_f00d)
            }
        );
        // An opcode pagewire never posts falls back to the provider's own record.
        wcs[0].opcode = O::IBV_WC_BIND_MW;
        wcs[0].byte_len = 8;
        assert_eq!(
            success_fields(&wcs[0], WcOpcode::Send),
            SuccessFields {
                opcode: WcOpcode::Send,
                byte_len: 0,
                imm: None
            }
        );
    }
}
