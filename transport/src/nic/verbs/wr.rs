//! Work requests: the trait's [`SendWr`]/[`RecvWr`] as `ibv_send_wr` / `ibv_recv_wr`, their
//! scatter-gather lists checked against the queue pair's limits, and the `wr_id` the NIC is
//! given (the ring sequence of `wr_ring`, [`RECV_BIT`] set for the receive queue).
#![forbid(unsafe_code)]

use rdma_sys::{
    ibv_recv_wr, ibv_send_flags as F, ibv_send_wr, ibv_sge, ibv_wr_opcode as W, rdma_t,
};

use crate::error::{Error, Result};
use crate::nic::{Opcode, RecvWr, SendWr};

use super::ffi::zeroed;

/// Marks a receive-queue sequence number in the `wr_id` given to the NIC.
pub(super) const RECV_BIT: u64 = 1 << 63;
/// Most scatter-gather entries one work request may carry here (mlx5 allows 30).
pub(super) const MAX_SGE: usize = 32;

/// An empty scatter-gather entry.
pub(super) const EMPTY_SGE: ibv_sge = ibv_sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

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
pub(super) struct QueueLimits {
    pub(super) max_send_sge: u32,
    pub(super) max_recv_sge: u32,
    pub(super) max_inline: u32,
}

/// `wr` as an `ibv_send_wr` whose `sg_list` points into `sges` and whose `wr_id` is the
/// ring sequence `seq`. Immediate data goes in network byte order (`ibv_post_send(3)`).
pub(super) fn send_wr(
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
pub(super) fn recv_wr(
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
}
