//! Work requests: the trait's [`SendWr`]/[`RecvWr`] as `ibv_send_wr` / `ibv_recv_wr`, their
//! scatter-gather lists checked against the queue pair's limits, and the `wr_id` the NIC is
//! given (the ring sequence of `wr_ring`, [`RECV_BIT`] set for the receive queue).
//!
//! Atomics (`IBV_WR_ATOMIC_FETCH_AND_ADD`, `IBV_WR_ATOMIC_CMP_AND_SWP`) go in `wr.atomic`
//! (`remote_addr`, `compare_add`, `swap`, `rkey`; `swap` unused by fetch-and-add) and are
//! checked here rather than left to the device: one local entry of exactly
//! [`ATOMIC_BYTES`] for the old value, an 8-byte aligned target word, and never inline
//! (`ibv_post_send(3)`: inline is "valid only for Send and RDMA Write").
#![forbid(unsafe_code)]

use rdma_sys::{
    atomic_t, ibv_recv_wr, ibv_send_flags as F, ibv_send_wr, ibv_sge, ibv_wr_opcode as W, rdma_t,
};

use pagewire_nic::{Capabilities, Opcode, RecvWr, SendWr, ATOMIC_BYTES};
use pagewire_sys::error::{Error, Result};

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
    sgl: &[pagewire_nic::Sge],
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

/// `Err` when `op` is an atomic and the device has no atomics (`IBV_ATOMIC_NONE`): a clear
/// error at post time rather than whatever the device would answer.
pub(super) fn require_atomics(caps: &Capabilities, op: &Opcode) -> Result<()> {
    if caps.atomics
        || !matches!(
            op,
            Opcode::AtomicFetchAdd { .. } | Opcode::AtomicCmpSwap { .. }
        )
    {
        return Ok(());
    }
    Err(Error::Unsupported {
        device: format!("{} ({} provider)", caps.device, caps.provider),
        what: "atomic operations (the device reports IBV_ATOMIC_NONE)".into(),
        hint: "check Capabilities::atomics before posting atomics, or use the soft provider \
               (PAGEWIRE_TRANSPORT=soft)",
    })
}

/// `Err` unless the atomic `wr` names one local entry of [`ATOMIC_BYTES`] (where the old
/// value lands) and an aligned target word at `remote_addr`.
fn check_atomic(wr: &SendWr<'_>, name: &str, remote_addr: u64) -> Result<()> {
    match wr.sgl {
        [one] if one.len == ATOMIC_BYTES => {}
        [one] => {
            return Err(Error::InvalidArgument(format!(
                "{name}: its scatter-gather entry is {} bytes; an atomic needs exactly one \
                 entry of {ATOMIC_BYTES} bytes for the old value",
                one.len
            )))
        }
        sgl => {
            return Err(Error::InvalidArgument(format!(
                "{name}: it has {} scatter-gather entries; an atomic needs exactly one entry \
                 of {ATOMIC_BYTES} bytes for the old value",
                sgl.len()
            )))
        }
    }
    if remote_addr % u64::from(ATOMIC_BYTES) != 0 {
        return Err(Error::InvalidArgument(format!(
            "{name}: remote address {remote_addr:#x} is not {ATOMIC_BYTES}-byte aligned"
        )));
    }
    Ok(())
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
        if matches!(
            wr.opcode,
            Opcode::AtomicFetchAdd { .. } | Opcode::AtomicCmpSwap { .. }
        ) {
            return Err(Error::InvalidArgument(
                "an atomic cannot be inline: it writes the remote word's old value into its \
                 buffer"
                    .into(),
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
        Opcode::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            check_atomic(wr, "fetch-and-add", remote_addr)?;
            w.opcode = W::IBV_WR_ATOMIC_FETCH_AND_ADD;
            w.wr.atomic = atomic_t {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        }
        Opcode::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            check_atomic(wr, "compare-and-swap", remote_addr)?;
            w.opcode = W::IBV_WR_ATOMIC_CMP_AND_SWP;
            w.wr.atomic = atomic_t {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
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
    use crate::ffi::{send_wr_atomic, send_wr_imm_raw, send_wr_rdma};
    use pagewire_nic::Sge;

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
    fn atomics_carry_their_operands_in_wr_atomic() {
        let mut sges = [EMPTY_SGE; MAX_SGE];
        let old = [sge(8)];
        let wr = SendWr {
            wr_id: 3,
            opcode: Opcode::AtomicFetchAdd {
                remote_addr: 0xdead_b008,
                rkey: 0x4321,
                add: u64::MAX,
            },
            sgl: &old,
            inline: false,
            signaled: true,
        };
        let w = send_wr(&wr, 7, &mut sges, LIMITS).unwrap();
        assert_eq!(
            (w.wr_id, w.opcode, w.send_flags, w.num_sge),
            (7, W::IBV_WR_ATOMIC_FETCH_AND_ADD, F::IBV_SEND_SIGNALED.0, 1)
        );
        assert_eq!(
            (sges[0].addr, sges[0].length, sges[0].lkey),
            (0x1000, 8, 0x77)
        );
        assert_eq!(send_wr_atomic(&w), (0xdead_b008, u64::MAX, 0, 0x4321));

        let cas = SendWr {
            opcode: Opcode::AtomicCmpSwap {
                remote_addr: 0x10,
                rkey: 9,
                compare: 0x1111,
                swap: 0x2222,
            },
            signaled: false,
            ..wr
        };
        let w = send_wr(&cas, 8, &mut sges, LIMITS).unwrap();
        assert_eq!((w.opcode, w.send_flags), (W::IBV_WR_ATOMIC_CMP_AND_SWP, 0));
        assert_eq!(send_wr_atomic(&w), (0x10, 0x1111, 0x2222, 9));
    }

    #[test]
    fn atomics_need_one_eight_byte_entry_an_aligned_word_and_no_inline() {
        let mut sges = [EMPTY_SGE; MAX_SGE];
        let fetch_add = Opcode::AtomicFetchAdd {
            remote_addr: 0x2000,
            rkey: 1,
            add: 1,
        };
        let cmp_swap = Opcode::AtomicCmpSwap {
            remote_addr: 0x2000,
            rkey: 1,
            compare: 0,
            swap: 1,
        };
        let refused = |opcode: Opcode, sgl: &[Sge], inline: bool| -> String {
            let wr = SendWr {
                wr_id: 1,
                opcode,
                sgl,
                inline,
                signaled: true,
            };
            let mut sges = [EMPTY_SGE; MAX_SGE];
            match send_wr(&wr, 0, &mut sges, LIMITS) {
                Err(Error::InvalidArgument(m)) => m,
                Err(e) => panic!("{opcode:?} with {sgl:?}, inline {inline}: {e}"),
                Ok(_) => panic!("{opcode:?} with {sgl:?}, inline {inline}: accepted"),
            }
        };
        for op in [fetch_add, cmp_swap] {
            let m = refused(op, &[sge(4)], false);
            assert!(m.contains("4 bytes") && m.contains("exactly one"), "{m}");
            let m = refused(op, &[sge(16)], false);
            assert!(m.contains("16 bytes"), "{m}");
            let m = refused(op, &[sge(4), sge(4)], false);
            assert!(m.contains("2 scatter-gather entries"), "{m}");
            let m = refused(op, &[], false);
            assert!(m.contains("0 scatter-gather entries"), "{m}");
            let m = refused(op, &[sge(8)], true);
            assert!(m.contains("cannot be inline"), "{m}");
        }
        let unaligned = |remote_addr| Opcode::AtomicFetchAdd {
            remote_addr,
            rkey: 1,
            add: 1,
        };
        for addr in [0x2001, 0x2004, 0x2007] {
            let m = refused(unaligned(addr), &[sge(8)], false);
            assert!(
                m.contains("not 8-byte aligned") && m.contains("fetch-and-add"),
                "{m}"
            );
        }
        let m = refused(
            Opcode::AtomicCmpSwap {
                remote_addr: 0x2004,
                rkey: 1,
                compare: 0,
                swap: 1,
            },
            &[sge(8)],
            false,
        );
        assert!(
            m.contains("0x2004") && m.contains("compare-and-swap"),
            "{m}"
        );
        // The well-formed ones go through.
        for op in [fetch_add, cmp_swap] {
            let wr = SendWr {
                wr_id: 1,
                opcode: op,
                sgl: &[sge(8)],
                inline: false,
                signaled: true,
            };
            assert!(send_wr(&wr, 0, &mut sges, LIMITS).is_ok());
        }
    }

    #[test]
    fn atomics_on_a_device_without_them_are_unsupported() {
        let mut caps = Capabilities {
            provider: "verbs",
            max_mr_size: 1,
            max_mr: 1,
            max_qp: 1,
            max_sge: 1,
            max_inline: 0,
            max_qp_wr: 1,
            device: "siw0 port 1".into(),
            odp_rc: false,
            odp_rc_send: false,
            odp_rc_recv: false,
            odp_rc_write: false,
            odp_rc_read: false,
            implicit_odp: false,
            prefetch: false,
            atomics: false,
            atomics_global: false,
        };
        let fetch_add = Opcode::AtomicFetchAdd {
            remote_addr: 0,
            rkey: 0,
            add: 1,
        };
        let cmp_swap = Opcode::AtomicCmpSwap {
            remote_addr: 0,
            rkey: 0,
            compare: 0,
            swap: 1,
        };
        for op in [fetch_add, cmp_swap] {
            let e = require_atomics(&caps, &op).unwrap_err();
            assert!(matches!(e, Error::Unsupported { .. }), "{e}");
            let e = e.to_string();
            assert!(
                e.contains("siw0 port 1") && e.contains("IBV_ATOMIC_NONE"),
                "{e}"
            );
        }
        assert!(require_atomics(&caps, &Opcode::Send).is_ok());
        caps.atomics = true;
        assert!(require_atomics(&caps, &fetch_add).is_ok());
        assert!(require_atomics(&caps, &cmp_swap).is_ok());
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
