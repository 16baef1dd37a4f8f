//! What the soft NIC's multi-process tests share: the usual access rights, a
//! scatter-gather entry, and posting a send or a receive.

#![allow(dead_code)] // each test file uses what it needs

use pagewire_nic::{Access, Nic, Opcode, RecvWr, SendWr, Sge};
use pagewire_test_support::nic::Rank;

/// Local write and both remote rights.
pub fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
}

/// The entry `len` bytes at `addr` under `lkey`.
pub fn sge(addr: u64, len: u64, lkey: u32) -> Sge {
    Sge {
        addr,
        len: len as u32,
        lkey,
    }
}

/// Posts a signaled, non-inline send work request (panics if the NIC refuses it).
pub fn post_send(r: &Rank, qp: u32, wr_id: u64, opcode: Opcode, sgl: &[Sge]) {
    // SAFETY (test): the buffers are test-owned mappings not touched until completion.
    unsafe {
        r.nic
            .post_send(
                qp,
                &SendWr {
                    wr_id,
                    opcode,
                    sgl,
                    inline: false,
                    signaled: true,
                },
            )
            .unwrap()
    };
}

/// Posts a receive (panics if the NIC refuses it).
pub fn post_recv(r: &Rank, qp: u32, wr_id: u64, sgl: &[Sge]) {
    // SAFETY (test): as above.
    unsafe { r.nic.post_recv(qp, &RecvWr { wr_id, sgl }).unwrap() };
}
