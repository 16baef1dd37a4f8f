//! Work requests and completions: the trait's [`SendWr`]/[`RecvWr`] as `ibv_send_wr` /
//! `ibv_recv_wr`, `ibv_wc` as [`Completion`](crate::nic::Completion), access flags, and the per-queue bookkeeping
//! that gives every completion its caller's `wr_id` and opcode.
//!
//! **Why bookkeeping.** `ibv_poll_cq(3)`: "If the completion status is other than
//! IBV_WC_SUCCESS, only the following attributes are valid: wr_id, status, qp_num, and
//! vendor_err." The trait's [`Completion`](crate::nic::Completion) always carries an opcode, so each queue pair keeps
//! a ring per queue ([`WrRing`]) holding the caller's `wr_id` and the opcode of every posted
//! request, and the NIC is given the ring's sequence number as `wr_id` instead (bit 63 set for
//! the receive queue). RC queues complete in order, so a completion for sequence `s` also
//! retires the unsignaled sends before it; the ring is exactly as deep as the hardware queue
//! (`ibv_create_qp` tells), so a full ring is a full queue.
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

use rdma_sys::{
    ibv_access_flags as A, ibv_recv_wr, ibv_send_flags as F, ibv_send_wr, ibv_sge, ibv_wc,
    ibv_wc_flags, ibv_wc_opcode as O, ibv_wc_status as S, ibv_wr_opcode as W, rdma_t,
};

use crate::error::{Error, Result};
use crate::nic::{Access, Opcode, RecvWr, SendWr, WcOpcode, WcStatus};

use super::ffi::{wc_imm_raw, zeroed};

/// Marks a receive-queue sequence number in the `wr_id` given to the NIC.
pub(crate) const RECV_BIT: u64 = 1 << 63;
/// Most scatter-gather entries one work request may carry here (mlx5 allows 30).
pub(crate) const MAX_SGE: usize = 32;
/// Largest span of one `ibv_sge` given to `ibv_advise_mr` (its length field is 32 bits).
pub(crate) const ADVISE_CHUNK: u64 = 1 << 30;

/// An empty scatter-gather entry.
pub(crate) const EMPTY_SGE: ibv_sge = ibv_sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

/// The `IBV_ACCESS_*` bits of `a` (pagewire's ON_DEMAND bit is 8, verbs' is 64; 8 is
/// IBV_ACCESS_REMOTE_ATOMIC there).
pub(crate) fn access_bits(a: Access) -> u32 {
    let mut bits = 0;
    if a.contains(Access::LOCAL_WRITE) {
        bits |= A::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        bits |= A::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        bits |= A::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(Access::ON_DEMAND) {
        bits |= A::IBV_ACCESS_ON_DEMAND.0;
    }
    bits
}

/// The completion status of an `ibv_wc_status` value (see the module's table).
pub(crate) fn status(raw: u32) -> WcStatus {
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
/// posts (atomics, memory windows, TSO, tag matching).
pub(crate) fn wc_opcode(raw: u32) -> Option<WcOpcode> {
    match raw {
        O::IBV_WC_SEND => Some(WcOpcode::Send),
        O::IBV_WC_RDMA_WRITE => Some(WcOpcode::RdmaWrite),
        O::IBV_WC_RDMA_READ => Some(WcOpcode::RdmaRead),
        O::IBV_WC_RECV => Some(WcOpcode::Recv),
        O::IBV_WC_RECV_RDMA_WITH_IMM => Some(WcOpcode::RecvRdmaWithImm),
        _ => None,
    }
}

/// What a successful completion says beyond its `wr_id` and status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SuccessFields {
    /// The completion's opcode (the posted one when `ibv_wc::opcode` is not one pagewire
    /// posts).
    pub opcode: WcOpcode,
    /// Bytes received (receives) or read (RDMA READ); 0 for sends and writes.
    pub byte_len: u32,
    /// The immediate data of a receive that carried one.
    pub imm: Option<u32>,
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
/// transferred"; `Completion::byte_len`: "bytes received (receives) or transferred (READ)").
pub(crate) fn success_fields(wc: &ibv_wc, posted_as: WcOpcode) -> SuccessFields {
    let opcode = wc_opcode(wc.opcode).unwrap_or(posted_as);
    let receive = matches!(opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
    let byte_len = match opcode {
        WcOpcode::Recv | WcOpcode::RecvRdmaWithImm | WcOpcode::RdmaRead => wc.byte_len,
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
pub(crate) fn completes_as(op: &Opcode) -> WcOpcode {
    match op {
        Opcode::Send | Opcode::SendWithImm(_) => WcOpcode::Send,
        Opcode::RdmaWrite { .. } | Opcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        Opcode::RdmaRead { .. } => WcOpcode::RdmaRead,
    }
}

/// Copies `sgl` into `sges`; `Err` when it has more entries than the queue allows.
fn fill_sges(
    sgl: &[crate::nic::Sge],
    sges: &mut [ibv_sge; MAX_SGE],
    max_sge: u32,
) -> Result<usize> {
    if sgl.len() > max_sge as usize || sgl.len() > MAX_SGE {
        return Err(Error::InvalidArgument(format!(
            "work request has {} scatter-gather entries; the queue pair allows {}",
            sgl.len(),
            max_sge.min(MAX_SGE as u32)
        )));
    }
    for (d, s) in sges.iter_mut().zip(sgl) {
        *d = ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        };
    }
    Ok(sgl.len())
}

/// Limits of the queue pair a request is posted to (what `ibv_create_qp` granted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueLimits {
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
}

/// `wr` as an `ibv_send_wr` whose `sg_list` points into `sges` and whose `wr_id` is the
/// ring sequence `seq`. Immediate data goes in network byte order (`ibv_post_send(3)`).
pub(crate) fn send_wr(
    wr: &SendWr<'_>,
    seq: u64,
    sges: &mut [ibv_sge; MAX_SGE],
    limits: QueueLimits,
) -> Result<ibv_send_wr> {
    let n = fill_sges(wr.sgl, sges, limits.max_send_sge)?;
    let mut w: ibv_send_wr = zeroed();
    w.wr_id = seq;
    w.next = std::ptr::null_mut();
    w.sg_list = sges.as_mut_ptr();
    w.num_sge = n as i32;
    let mut flags = 0;
    if wr.signaled {
        flags |= F::IBV_SEND_SIGNALED.0;
    }
    if wr.inline {
        if matches!(wr.opcode, Opcode::RdmaRead { .. }) {
            return Err(Error::InvalidArgument(
                "an RDMA READ cannot be inline: it writes into its buffers".into(),
            ));
        }
        let total: u64 = wr.sgl.iter().map(|s| u64::from(s.len)).sum();
        if total > u64::from(limits.max_inline) {
            return Err(Error::InvalidArgument(format!(
                "inline send of {total} bytes; the queue pair allows {} inline bytes",
                limits.max_inline
            )));
        }
        flags |= F::IBV_SEND_INLINE.0;
    }
    w.send_flags = flags;
    match wr.opcode {
        Opcode::Send => w.opcode = W::IBV_WR_SEND,
        Opcode::SendWithImm(imm) => {
            w.opcode = W::IBV_WR_SEND_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        Opcode::RdmaWrite { remote_addr, rkey } => {
            w.opcode = W::IBV_WR_RDMA_WRITE;
            w.wr.rdma = rdma_t { remote_addr, rkey };
        }
        Opcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            w.opcode = W::IBV_WR_RDMA_WRITE_WITH_IMM;
            w.wr.rdma = rdma_t { remote_addr, rkey };
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        Opcode::RdmaRead { remote_addr, rkey } => {
            w.opcode = W::IBV_WR_RDMA_READ;
            w.wr.rdma = rdma_t { remote_addr, rkey };
        }
    }
    Ok(w)
}

/// `wr` as an `ibv_recv_wr` whose `sg_list` points into `sges`, `wr_id` = `seq | RECV_BIT`.
pub(crate) fn recv_wr(
    wr: &RecvWr<'_>,
    seq: u64,
    sges: &mut [ibv_sge; MAX_SGE],
    limits: QueueLimits,
) -> Result<ibv_recv_wr> {
    let n = fill_sges(wr.sgl, sges, limits.max_recv_sge)?;
    let mut w: ibv_recv_wr = zeroed();
    w.wr_id = seq | RECV_BIT;
    w.next = std::ptr::null_mut();
    w.sg_list = sges.as_mut_ptr();
    w.num_sge = n as i32;
    Ok(w)
}

/// Most scatter-gather entries one `ibv_advise_mr` call takes: 4095. libibverbs passes the
/// list to the kernel as one ioctl attribute whose length field is 16 bits
/// (`struct ib_uverbs_attr::len`); `fill_attr_in` marks a longer one as a buffer error and
/// `execute_ioctl` then fails the call with `EINVAL` (rdma-core `libibverbs/cmd_ioctl.h`,
/// `cmd_ioctl.c`; `ibv_cmd_advise_mr` in `cmd_mr.c`, which mlx5's `advise_mr` calls).
pub(crate) const ADVISE_MAX_SGES: usize = u16::MAX as usize / std::mem::size_of::<ibv_sge>();

/// The batches of [`advise_batches`] for `len` bytes.
pub(crate) fn advise_batch_count(len: u64) -> u64 {
    len.div_ceil(ADVISE_CHUNK).div_ceil(ADVISE_MAX_SGES as u64)
}

/// The scatter-gather lists `ibv_advise_mr` gets for `[addr, addr+len)` of region `lkey`:
/// pieces of at most [`ADVISE_CHUNK`] bytes, at most [`ADVISE_MAX_SGES`] of them per call
/// (one call covers up to about 4 TiB). Made one batch at a time, so a huge range (an
/// implicit ODP region is `u64::MAX` long) costs no more memory than one batch.
pub(crate) fn advise_batches(lkey: u32, addr: u64, len: u64) -> AdviseBatches {
    AdviseBatches {
        lkey,
        at: addr,
        end: addr.saturating_add(len),
    }
}

/// Iterator of [`advise_batches`].
#[derive(Clone, Debug)]
pub(crate) struct AdviseBatches {
    lkey: u32,
    at: u64,
    end: u64,
}

impl Iterator for AdviseBatches {
    type Item = Vec<ibv_sge>;

    fn next(&mut self) -> Option<Vec<ibv_sge>> {
        if self.at >= self.end {
            return None;
        }
        let pieces = (self.end - self.at).div_ceil(ADVISE_CHUNK);
        let mut batch = Vec::with_capacity(pieces.min(ADVISE_MAX_SGES as u64) as usize);
        while self.at < self.end && batch.len() < ADVISE_MAX_SGES {
            let n = (self.end - self.at).min(ADVISE_CHUNK);
            batch.push(ibv_sge {
                addr: self.at,
                length: n as u32,
                lkey: self.lkey,
            });
            self.at += n;
        }
        Some(batch)
    }
}

/// One posted work request, by ring sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    seq: u64,
    wr_id: u64,
    opcode: WcOpcode,
}

/// The requests posted to one queue of one queue pair, in posting order.
#[derive(Debug)]
pub(crate) struct WrRing {
    /// Requests the queue may hold (0: none at all).
    depth: u64,
    /// At least one, so that sequence numbers index it.
    slots: Vec<Option<Slot>>,
    /// Sequence of the next request.
    head: u64,
    /// Oldest request not known to be complete.
    tail: u64,
}

impl WrRing {
    /// A ring for a queue of `depth` requests.
    pub(crate) fn new(depth: u32) -> WrRing {
        WrRing {
            depth: u64::from(depth),
            slots: vec![None; depth.max(1) as usize],
            head: 0,
            tail: 0,
        }
    }

    /// Requests posted and not known to be complete.
    pub(crate) fn outstanding(&self) -> u64 {
        self.head - self.tail
    }

    /// Records a request; returns its sequence, or `None` when the queue is full.
    pub(crate) fn push(&mut self, wr_id: u64, opcode: WcOpcode) -> Option<u64> {
        let cap = self.slots.len() as u64;
        if self.outstanding() >= self.depth {
            return None;
        }
        let seq = self.head;
        self.slots[(seq % cap) as usize] = Some(Slot { seq, wr_id, opcode });
        self.head += 1;
        Some(seq)
    }

    /// Forgets the request just pushed (its post failed, so the NIC never saw it).
    pub(crate) fn unpush(&mut self, seq: u64) {
        if seq + 1 == self.head {
            let cap = self.slots.len() as u64;
            self.slots[(seq % cap) as usize] = None;
            self.head = seq;
        }
    }

    /// A completion for `seq`: the caller's `wr_id` and opcode. Everything posted before
    /// `seq` on this queue is complete too (RC completes in order; unsignaled sends produce
    /// no entry).
    pub(crate) fn complete(&mut self, seq: u64) -> Option<(u64, WcOpcode)> {
        let cap = self.slots.len() as u64;
        let slot = self.slots[(seq % cap) as usize].filter(|s| s.seq == seq)?;
        if seq >= self.tail {
            self.tail = seq + 1;
        }
        Some((slot.wr_id, slot.opcode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::verbs::ffi::{send_wr_imm_raw, send_wr_rdma};
    use crate::nic::Sge;

    const LIMITS: QueueLimits = QueueLimits {
        max_send_sge: 4,
        max_recv_sge: 2,
        max_inline: 64,
    };

    fn sge(len: u32) -> Sge {
        Sge {
            addr: 0x1000,
            len,
            lkey: 0x77,
        }
    }

    #[test]
    fn access_bits_use_the_verbs_values() {
        assert_eq!(access_bits(Access::NONE), 0);
        assert_eq!(
            access_bits(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ),
            1 | 2 | 4
        );
        // ON_DEMAND is 8 in pagewire but IBV_ACCESS_ON_DEMAND (64) in verbs; 8 would be
        // IBV_ACCESS_REMOTE_ATOMIC.
        assert_eq!(access_bits(Access::ON_DEMAND | Access::LOCAL_WRITE), 64 | 1);
    }

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
                crate::nic::verbs::ffi::wc_status_str(raw),
                "ibv_wc_status {raw}"
            );
        }
    }

    #[test]
    fn completion_opcodes_map() {
        assert_eq!(wc_opcode(0), Some(WcOpcode::Send));
        assert_eq!(wc_opcode(1), Some(WcOpcode::RdmaWrite));
        assert_eq!(wc_opcode(2), Some(WcOpcode::RdmaRead));
        assert_eq!(wc_opcode(128), Some(WcOpcode::Recv));
        assert_eq!(wc_opcode(129), Some(WcOpcode::RecvRdmaWithImm));
        assert_eq!(wc_opcode(3), None);
        assert_eq!(
            completes_as(&Opcode::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 0
            }),
            WcOpcode::RdmaWrite
        );
        assert_eq!(completes_as(&Opcode::SendWithImm(1)), WcOpcode::Send);
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
        wcs[0].opcode = O::IBV_WC_COMP_SWAP;
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

    #[test]
    fn send_requests_carry_opcode_flags_keys_and_immediates() {
        let sgl = [sge(10), sge(20)];
        let mut sges = [EMPTY_SGE; MAX_SGE];
        let wr = SendWr {
            wr_id: 5,
            opcode: Opcode::RdmaWriteWithImm {
                remote_addr: 0xdead_b000,
                rkey: 0x1234,
                imm: 0x0102_0304,
            },
            sgl: &sgl,
            inline: false,
            signaled: true,
        };
        let w = send_wr(&wr, 42, &mut sges, LIMITS).unwrap();
        assert_eq!(w.wr_id, 42);
        assert_eq!(w.opcode, W::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(w.send_flags, F::IBV_SEND_SIGNALED.0);
        assert_eq!(w.num_sge, 2);
        assert_eq!(w.sg_list, sges.as_mut_ptr());
        assert_eq!(
            (sges[1].addr, sges[1].length, sges[1].lkey),
            (0x1000, 20, 0x77)
        );
        assert_eq!(send_wr_rdma(&w), (0xdead_b000, 0x1234));
        // Network byte order: the bytes in memory are 01 02 03 04.
        assert_eq!(send_wr_imm_raw(&w).to_ne_bytes(), [1, 2, 3, 4]);
        assert!(w.next.is_null());
    }

    #[test]
    fn inline_is_checked_against_the_queue_pairs_limit() {
        let mut sges = [EMPTY_SGE; MAX_SGE];
        let ok = [sge(64)];
        let wr = SendWr {
            wr_id: 1,
            opcode: Opcode::Send,
            sgl: &ok,
            inline: true,
            signaled: false,
        };
        let w = send_wr(&wr, 0, &mut sges, LIMITS).unwrap();
        assert_eq!(
            (w.opcode, w.send_flags),
            (W::IBV_WR_SEND, F::IBV_SEND_INLINE.0)
        );
        let big = [sge(40), sge(40)];
        let wr = SendWr { sgl: &big, ..wr };
        assert!(send_wr(&wr, 0, &mut sges, LIMITS).is_err());
        let read = SendWr {
            opcode: Opcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            sgl: &ok,
            ..wr
        };
        assert!(send_wr(&read, 0, &mut sges, LIMITS).is_err());
    }

    #[test]
    fn too_many_sges_are_refused() {
        let mut sges = [EMPTY_SGE; MAX_SGE];
        let sgl = [sge(1); 3];
        let wr = RecvWr {
            wr_id: 1,
            sgl: &sgl,
        };
        assert!(recv_wr(&wr, 0, &mut sges, LIMITS).is_err());
        let w = recv_wr(
            &RecvWr {
                sgl: &sgl[..2],
                ..wr
            },
            9,
            &mut sges,
            LIMITS,
        )
        .unwrap();
        assert_eq!((w.wr_id, w.num_sge), (9 | RECV_BIT, 2));
    }

    #[test]
    fn advise_ranges_split_into_32_bit_pieces() {
        assert!(advise_batches(1, 0x1000, 0).next().is_none());
        assert_eq!(advise_batch_count(0), 0);
        let v: Vec<ibv_sge> = advise_batches(7, 0x1000, 3 * ADVISE_CHUNK + 5)
            .flatten()
            .collect();
        assert_eq!(v.len(), 4);
        assert_eq!((v[0].addr, v[0].length, v[0].lkey), (0x1000, 1 << 30, 7));
        assert_eq!((v[3].addr, v[3].length), (0x1000 + 3 * ADVISE_CHUNK, 5));
    }

    #[test]
    fn advice_above_4_tib_is_given_in_batches_the_ioctl_can_carry() {
        // The SGE list travels in an ioctl attribute with a 16-bit length.
        assert_eq!(ADVISE_MAX_SGES, 4095);
        assert!(ADVISE_MAX_SGES * std::mem::size_of::<ibv_sge>() <= u16::MAX as usize);
        assert!((ADVISE_MAX_SGES + 1) * std::mem::size_of::<ibv_sge>() > u16::MAX as usize);
        // 5 TiB and a bit, from an address that is not 1 GiB-aligned.
        let (addr, len) = (0x7f00_0000_1000u64, (5u64 << 40) + 12345);
        let batches: Vec<Vec<ibv_sge>> = advise_batches(9, addr, len).collect();
        assert_eq!(batches.len() as u64, advise_batch_count(len));
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [4095, 5120 - 4095 + 1]
        );
        // Together they cover the range exactly, in order, without gaps or overlaps.
        let mut at = addr;
        for s in batches.iter().flatten() {
            assert_eq!((s.addr, s.lkey), (at, 9));
            assert!(s.length > 0 && u64::from(s.length) <= ADVISE_CHUNK);
            at += u64::from(s.length);
        }
        assert_eq!(at, addr + len);
        // An implicit ODP region's whole length is not materialised: one batch at a time.
        let mut all = advise_batches(1, 0, u64::MAX);
        assert_eq!(all.next().map(|b| b.len()), Some(ADVISE_MAX_SGES));
    }

    #[test]
    fn rings_return_wr_ids_and_retire_unsignaled_predecessors() {
        let mut r = WrRing::new(3);
        let a = r.push(100, WcOpcode::RdmaWrite).unwrap();
        let b = r.push(101, WcOpcode::RdmaWrite).unwrap();
        let c = r.push(102, WcOpcode::Send).unwrap();
        assert_eq!(
            r.push(103, WcOpcode::Send),
            None,
            "full at the queue's depth"
        );
        // Only `b` was signaled: its completion retires `a` as well.
        assert_eq!(r.complete(b), Some((101, WcOpcode::RdmaWrite)));
        assert_eq!(r.outstanding(), 1);
        let d = r.push(103, WcOpcode::RdmaRead).unwrap();
        let e = r.push(104, WcOpcode::Send).unwrap();
        assert_eq!(r.push(105, WcOpcode::Send), None);
        // After an error every outstanding request completes (flushed), in order.
        assert_eq!(r.complete(c), Some((102, WcOpcode::Send)));
        assert_eq!(r.complete(d), Some((103, WcOpcode::RdmaRead)));
        assert_eq!(r.complete(e), Some((104, WcOpcode::Send)));
        assert_eq!(r.outstanding(), 0);
        // `a`'s slot was reused by `d`: an entry for it is unknown.
        assert_eq!(r.complete(a), None);
    }

    /// A queue pair created with no send (or receive) requests holds none: the completion
    /// queue accounting promised it nothing.
    #[test]
    fn a_ring_of_depth_zero_takes_nothing() {
        let mut r = WrRing::new(0);
        assert_eq!(r.push(1, WcOpcode::Send), None);
        assert_eq!(r.outstanding(), 0);
    }

    #[test]
    fn a_failed_post_is_forgotten() {
        let mut r = WrRing::new(2);
        let a = r.push(1, WcOpcode::Send).unwrap();
        r.unpush(a);
        assert_eq!(r.outstanding(), 0);
        assert_eq!(r.complete(a), None);
        assert_eq!(r.push(2, WcOpcode::Send), Some(0));
    }
}
