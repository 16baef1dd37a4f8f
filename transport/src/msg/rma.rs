//! One-sided access for windows: memory a rank exposes for the life of a window, and the
//! RDMA WRITEs, READs and atomics that other ranks run on it without its CPU.
//!
//! - **Exposing** registers the window's memory once with remote write, read and atomic
//!   rights: pinned, or on demand in a mode that never pins (the buffer mode says which,
//!   [`BufferMode::exposes_on_demand`]).
//! - **Put and get** move the origin's buffer through the buffer mode, as a rendezvous
//!   does: a bounce slot per chunk in `copy`, the registration cache in `pindown`, the
//!   on-demand key in `odp`; each chunk is one RDMA WRITE or READ straight into or out of
//!   the target's window, a pipeline of the mode's depth.
//! - **Atomics** are the NIC's 64-bit `FETCH_ADD` and `CMP_SWAP`, posted in batches (one
//!   work request per word) with their results landing in a small registered page.
//!
//! A put that fits the NIC's inline data ([`PointToPoint::put`]) is copied into the work
//! request at post time and returns at once, as UCX's short puts do: its completion is
//! collected by the next [`PointToPoint::rma_flush`] (a window's flush, unlock or fence).
//! Every other call returns once its work requests have completed (an RC completion of a
//! WRITE means the target's NIC has placed it), so the caller's buffers are free and the
//! data is at the target when it returns. The queue pair keeps them in order: a get or an
//! atomic after a put to the same target sees it. Bounds are the caller's to check (the
//! window layer does, at the origin): a remote access error would end the queue pair, and
//! with it all traffic with that peer, as on an HCA.

use super::request::Slab;
use super::rma_transfer::RmaEntry;
use super::{eager, raw, wr_id, PointToPoint, RequestId, WrKind};
#[cfg(doc)]
use crate::buffer_mode::BufferMode;
use crate::error::{Error, Result};
use crate::nic::{Access, Advice, Opcode, RegionInfo, SendWr, Sge, WcStatus};
use crate::sys::AnonMapping;
use crate::sys::Error as SystemError;

/// A peer's exposed memory, as its owner announced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteMemory {
    /// First byte, in the owner's address space.
    pub addr: u64,
    /// Bytes exposed.
    pub len: u64,
    /// The key to name in RDMA operations on it.
    pub rkey: u32,
}

/// An atomic on one 64-bit word of a peer's exposed memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAtomic {
    /// Adds (wrapping); the old value comes back.
    FetchAdd {
        /// What is added.
        add: u64,
    },
    /// Swaps if equal; the old value comes back.
    CmpSwap {
        /// The value the word must hold.
        compare: u64,
        /// What it becomes then.
        swap: u64,
    },
}

/// Words of atomic results one batch can take (one page).
const RESULT_WORDS: usize = 32;

/// The one-sided operations' state in the message layer.
#[derive(Default)]
pub(crate) struct RmaState {
    /// By slot: `None` while its work request is in flight, then its status.
    done: Vec<Option<WcStatus>>,
    /// Slots not in use.
    free: Vec<usize>,
    /// Where atomics' old values land, registered at first use.
    pub(super) results: Option<(AnonMapping, u32)>,
    /// Inline puts posted and not yet waited for: (target, slot).
    deferred: Vec<(usize, usize)>,
    /// Regions this rank exposes now: while there are any, progress polls the NIC on every
    /// pass, also when every peer is on the local path, since peers' one-sided operations
    /// on them go through it.
    exposed: u32,
    /// Request-based puts and gets (`rma_transfer.rs`), and those still moving.
    pub(super) ops: Slab<RmaEntry>,
    pub(super) active: Vec<RequestId>,
}

impl RmaState {
    /// Whether this rank exposes memory to peers' one-sided operations now.
    pub(crate) fn exposing(&self) -> bool {
        self.exposed > 0
    }
}

impl PointToPoint {
    /// Registers `[addr, addr+len)` for peers' put, get and atomics, for as long as a window
    /// exposes it: pinned (counted against the locked-memory limit), or on demand where the
    /// buffer mode never pins. Returns the region; deregister it with [`Self::unexpose`].
    pub fn expose(&mut self, addr: u64, len: u64) -> Result<RegionInfo> {
        let mut access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        if self.mode.exposes_on_demand() {
            access = access | Access::ON_DEMAND;
        }
        let region = self.nic.register(addr, len, access)?;
        self.rma.exposed += 1;
        Ok(region)
    }

    /// Whether [`Self::expose`] registers on demand (nothing pinned) in this buffer mode.
    pub fn exposes_on_demand(&self) -> bool {
        self.mode.exposes_on_demand()
    }

    /// Registers this rank's whole address space, on demand, for peers' put, get and
    /// atomics (implicit ODP, as a dynamic window over it uses: memory attached later needs
    /// no registration of its own). Only in a buffer mode that exposes on demand; the
    /// caller checks peers' accesses against what it has attached, since the NIC accepts
    /// any mapped address under this key. Deregister it with [`Self::unexpose`].
    pub fn expose_address_space(&mut self) -> Result<RegionInfo> {
        if !self.mode.exposes_on_demand() {
            return Err(SystemError::NotSupported(format!(
                "the {} buffer mode pins what it exposes: it cannot expose the whole address \
                 space",
                self.mode.name()
            ))
            .into());
        }
        let region = self.nic.register_implicit_odp(
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
        )?;
        self.rma.exposed += 1;
        Ok(region)
    }

    /// Maps `[addr, addr+len)` of an on-demand region for the NIC now (a prefetch for
    /// writing), so that peers' first accesses do not fault.
    pub fn prefetch_exposed(&mut self, lkey: u32, addr: u64, len: u64) -> Result<()> {
        Ok(self.nic.advise(lkey, addr, len, Advice::PrefetchWrite)?)
    }

    /// Ends the exposure of a region [`Self::expose`] made: the NIC waits for any access in
    /// flight, and the key fails from then on.
    pub fn unexpose(&mut self, lkey: u32) -> Result<()> {
        self.nic.deregister(lkey)?;
        self.rma.exposed = self.rma.exposed.saturating_sub(1);
        Ok(())
    }

    /// Whether the NIC's atomics are also atomic against the target's CPU
    /// (`IBV_ATOMIC_GLOB`): a window's owner may then update words with its own atomic
    /// instructions while peers run NIC atomics on them.
    pub fn atomics_global(&self) -> bool {
        self.nic.capabilities().atomics_global
    }

    /// Posts `src` to `remote_addr` of `target`'s exposed memory as an inline RDMA WRITE
    /// (the NIC copies it at post time) and returns; `false` (nothing posted) if it does not
    /// fit the inline size. Its completion is waited for by [`Self::rma_flush`].
    pub fn put_inline(
        &mut self,
        target: usize,
        remote_addr: u64,
        rkey: u32,
        src: &[u8],
    ) -> Result<bool> {
        if src.is_empty() || src.len() > self.max_inline {
            return Ok(false);
        }
        self.check_alive(target)?;
        let sge = Sge {
            addr: src.as_ptr() as u64,
            len: src.len() as u32,
            lkey: 0,
        };
        let opcode = Opcode::RdmaWrite { remote_addr, rkey };
        let slot = self.post_rma_with(target, opcode, &[sge], true)?;
        self.rma.deferred.push((target, slot));
        Ok(true)
    }

    /// Waits for the inline puts and the request-based puts and gets to `target` (every
    /// target: `None`) to complete at their targets; the first error among the inline puts
    /// (a request's error is its own, reported by its test or wait).
    pub fn rma_flush(&mut self, target: Option<usize>) -> Result<()> {
        self.rma_settle(target)?;
        let mut first_err = None;
        let mut i = 0;
        while i < self.rma.deferred.len() {
            let (t, slot) = self.rma.deferred[i];
            if target.is_some_and(|want| want != t) {
                i += 1;
                continue;
            }
            self.rma.deferred.swap_remove(i);
            match self.wait_rma(slot) {
                Ok(WcStatus::Success) => {}
                Ok(status) => {
                    first_err.get_or_insert(Error::Communication {
                        peer: t,
                        status,
                        what: "one-sided access",
                    });
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Runs `ops` on `target`'s exposed memory under `rkey`, each on the 8-byte word at its
    /// address, in order, as NIC atomics (pipelined); their old values.
    pub fn rma_atomics(
        &mut self,
        target: usize,
        rkey: u32,
        ops: &[(u64, RemoteAtomic)],
    ) -> Result<Vec<u64>> {
        self.check_alive(target)?;
        if self.rma.results.is_none() {
            let page = eager::map_slot_pool(RESULT_WORDS * 8, "atomic results page")?;
            let r = self
                .nic
                .register(page.addr(), page.len() as u64, Access::LOCAL_WRITE)?;
            self.rma.results = Some((page, r.lkey));
        }
        let mut old = Vec::with_capacity(ops.len());
        for batch in ops.chunks(RESULT_WORDS) {
            let (base, lkey) = {
                let (page, lkey) = self.rma.results.as_ref().expect("registered above");
                (page.addr(), *lkey)
            };
            let mut slots = Vec::with_capacity(batch.len());
            let mut first_err = None;
            for (i, &(addr, op)) in batch.iter().enumerate() {
                let opcode = match op {
                    RemoteAtomic::FetchAdd { add } => Opcode::AtomicFetchAdd {
                        remote_addr: addr,
                        rkey,
                        add,
                    },
                    RemoteAtomic::CmpSwap { compare, swap } => Opcode::AtomicCmpSwap {
                        remote_addr: addr,
                        rkey,
                        compare,
                        swap,
                    },
                };
                let sge = Sge {
                    addr: base + 8 * i as u64,
                    len: crate::nic::ATOMIC_BYTES,
                    lkey,
                };
                match self.post_rma(target, opcode, &[sge]) {
                    Ok(slot) => slots.push(slot),
                    Err(e) => {
                        first_err = Some(e);
                        break;
                    }
                }
            }
            for slot in slots {
                match self.wait_rma(slot) {
                    Ok(WcStatus::Success) => {}
                    Ok(status) => {
                        first_err.get_or_insert(Error::Communication {
                            peer: target,
                            status,
                            what: "a one-sided atomic",
                        });
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
            let (page, _) = self.rma.results.as_ref().expect("registered above");
            old.extend(
                page.as_slice()[..batch.len() * 8]
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))),
            );
        }
        Ok(old)
    }

    /// An error if `target` failed earlier: nothing is posted to it.
    pub(super) fn check_alive(&self, target: usize) -> Result<()> {
        match self.peers.get(target) {
            None => Err(Error::NoSuchRank {
                rank: target,
                size: self.size(),
            }),
            Some(p) => match p.dead {
                Some(status) => Err(Error::Communication {
                    peer: target,
                    status,
                    what: "one-sided access",
                }),
                None => Ok(()),
            },
        }
    }

    /// Posts one one-sided work request to `target`, waiting (with progress) for room on its
    /// queue pair; the slot its completion will fill.
    pub(super) fn post_rma(&mut self, target: usize, opcode: Opcode, sgl: &[Sge]) -> Result<usize> {
        self.post_rma_with(target, opcode, sgl, false)
    }

    /// [`Self::post_rma`], inline (the NIC copies `sgl`'s bytes at post time) if `inline`.
    fn post_rma_with(
        &mut self,
        target: usize,
        opcode: Opcode,
        sgl: &[Sge],
        inline: bool,
    ) -> Result<usize> {
        while self.peers[target].in_flight + 2 >= self.max_send_wr {
            self.progress()?;
            self.check_alive(target)?;
        }
        let slot = match self.rma.free.pop() {
            Some(s) => {
                self.rma.done[s] = None;
                s
            }
            None => {
                self.rma.done.push(None);
                self.rma.done.len() - 1
            }
        };
        let wr = SendWr {
            wr_id: wr_id(WrKind::Rma, target, slot),
            opcode,
            sgl,
            inline,
            signaled: true,
        };
        if let Err(e) = raw::post_send(&*self.nic, self.peers[target].qpn, &wr) {
            self.rma.free.push(slot);
            return Err(e);
        }
        self.peers[target].in_flight += 1;
        Ok(slot)
    }

    /// Drives progress until the work request of `slot` has completed; its status.
    pub(super) fn wait_rma(&mut self, slot: usize) -> Result<WcStatus> {
        loop {
            if let Some(status) = self.rma.done[slot] {
                self.rma.free.push(slot);
                return Ok(status);
            }
            if let Err(e) = self.progress() {
                // The slot's own completion may be among what failed: wait for it still,
                // unless the error is not about a peer (then nothing more will come).
                if !e.is_peer_failure() {
                    return Err(e);
                }
            }
        }
    }

    /// The status of the work request of `slot` if it has completed (the slot is free
    /// then), without waiting.
    pub(super) fn take_rma(&mut self, slot: usize) -> Option<WcStatus> {
        let status = self.rma.done[slot]?;
        self.rma.free.push(slot);
        Some(status)
    }

    /// A one-sided work request completed (called from the completion handler).
    pub(crate) fn rma_completed(&mut self, slot: usize, status: WcStatus) {
        if let Some(s) = self.rma.done.get_mut(slot) {
            *s = Some(status);
        }
    }
}
