//! The soft provider: a software RDMA NIC in user space, the way Soft-RoCE is one in the
//! kernel (docs/architecture.md). It enforces verbs semantics and charges what the
//! OS really charges; it adds no artificial delay.
//!
//! - **Wire**: one shared-memory ring per (sender, receiver) pair (`ring.rs`); the receiver
//!   polls the rings that carried packets recently and learns of the others from a bitmap
//!   (`inbox.rs`); responders acknowledge by writing the requester's memory (`ack.rs`).
//! - **No kernel on the fast path**: posting and polling are loads, stores and
//!   memory copies (`dma.rs`); a waiting driver thread is woken only when it said it sleeps
//!   and its application is not polling.
//! - **DMA engine**: payloads between processes move with one kernel copy
//!   (`process_vm_readv`/`writev`) when the kernel allows it, else they are staged through
//!   the ring; `PAGEWIRE_SOFT_DMA=staged` forces the fallback.
//! - **TPT**: each rank's region table lives in its shared segment, so RDMA WRITE and READ
//!   are checked against the target's table by the initiator's engine, before any byte moves,
//!   without the target's CPU (`tpt.rs`).
//! - **Pinning** is the long-term pin `ibv_reg_mr` makes (`mlock` where io_uring is
//!   unavailable), charged against RLIMIT_MEMLOCK (`pin.rs`).
//! - **ODP**: regions are never pinned; pages start non-present in the NIC's bitmap
//!   (`present.rs`); an access to a non-present page is a network page fault (NPF). Faults on
//!   the initiator's own memory are resolved in place before data is read; faults on the
//!   target's memory (rNPF, Lesokhin17 section 4) answer the initiator receiver-not-ready while
//!   the target's *driver thread* — the interrupt-handler analogue, asleep on a futex until a
//!   peer rings its doorbell — populates the pages (`MADV_POPULATE_*`) and marks them
//!   present; the initiator then retries. One outstanding fault per queue-pair direction
//!   (ODP13, "Concurrent page faults"); a whole work request's pages in one batch
//!   (Lesokhin17, "Optimizations").
//! - **Invalidation**: every range made present is watched by the memory monitor, whose
//!   sink clears the bits of pages that are unmapped, moved, discarded or shared by `fork`
//!   (`odp_watch.rs`); without a monitor, initiators check the owner's `/proc/PID/pagemap`
//!   before DMA into present pages. A fault on unmapped memory ends in an error completion.
#![deny(missing_docs)]
// `unsafe` only in the modules marked `allow(unsafe_code)` where they are declared (the
// NIC's copies, the TCP wire's gathered sends) and in the `Nic` trait's posting calls.
#![deny(unsafe_code)]

pub(crate) mod ack;
mod bound;
mod config;
#[allow(unsafe_code)]
mod dma;
mod driver;
mod engine;
mod inbox;
mod inspect;
mod layout;
mod lifecycle;
mod npf_model;
mod odp_watch;
mod pin;
mod present;
mod receive_fault;
mod regions;
pub(crate) mod ring;
#[allow(unsafe_code)]
pub(crate) mod tcp;
mod tpt;
mod tpt_cache;

#[cfg(test)]
mod fuzz;

pub use config::{parse_bytes, DmaMode, SoftConfig};
pub use npf_model::SoftProfile;
pub use odp_watch::OdpCheck;
pub use pin::{MemlockLimit, PinMethod};
pub use receive_fault::{ReceiveFaultPolicy, ReceiveFaultSettings, BACKUP_RING_MAX_MESSAGES};
pub use tcp::{WireMode, WireSettings};

use std::fs::File;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use pagewire_nic::{
    Access, Advice, Capabilities, Completion, Counters, CountersSnapshot, Endpoint, Nic, QpCaps,
    RecvWr, RegionInfo, SendWr,
};
use pagewire_sys::error::{Error, Result};
use pagewire_sys::{self as sys, ProcessHandle};

use bound::BoundWatch;
use engine::Engine;
use odp_watch::PresentWatch;
use tpt::ADDRESS_SPACE_END;

pub(crate) use layout::{RankMemory, MAX_QPS};
use regions::RegionBook;

/// A peer as this rank's NIC sees it.
pub(crate) struct Peer {
    pub rank: usize,
    pub pid: u32,
    pub mem: Arc<RankMemory>,
    pub cma: bool,
    pub process: Option<ProcessHandle>,
    pub pagemap: Option<File>,
    /// The TCP connection to a peer on another host (`tcp/`); `mem` is then the peer's
    /// local image, not its segment.
    pub link: Option<Arc<tcp::TcpLink>>,
}

impl Peer {
    /// Whether the peer's process still runs (always true for this rank itself); a peer on
    /// another host while its connection stands.
    pub(crate) fn is_alive(&self) -> bool {
        match &self.link {
            Some(l) => !l.is_closed(),
            None => self.process.as_ref().is_none_or(|p| p.is_alive()),
        }
    }
}

pub(crate) struct Inner {
    pub rank: usize,
    pub caps: Capabilities,
    /// Which costs beyond the real ones the NIC charges.
    pub profile: SoftProfile,
    /// What the NIC does on a receive-side network page fault (one policy per job).
    pub receive_fault: ReceiveFaultSettings,
    pub counters: Counters,
    pub own: Arc<RankMemory>,
    /// Keeps `own`'s present bits true against address-space changes.
    pub watch: PresentWatch,
    /// Detaches pinned regions whose range the application replaced.
    bound: BoundWatch,
    pub peers: Vec<Peer>,
    /// The TCP links to peers on other hosts, when there are any.
    wire: Option<tcp::TcpWire>,
    /// The peer each queue pair was created towards (`u32::MAX`: none), for the driver's
    /// fault outcomes to peers on other hosts.
    qp_peers: Vec<AtomicU32>,
    regions: Mutex<RegionBook>,
    pub engine: Mutex<Engine>,
    /// Faults filed on this rank's memory that have been served.
    faults_served: AtomicU64,
    /// Held by the thread serving faults (one at a time).
    serving_faults: Mutex<()>,
    /// Translation-cache misses filed on this rank that have been served.
    misses_served: AtomicU64,
    /// Held by the thread serving translation-cache misses (one at a time).
    serving_misses: Mutex<()>,
    shutdown: AtomicBool,
}

/// The soft NIC of one rank. Dropping it deregisters (unpins) every region and removes its
/// shared memory.
pub struct SoftNic {
    inner: Arc<Inner>,
    driver: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SoftNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftNic")
            .field("rank", &self.inner.rank)
            .field("peers", &self.inner.peers.len())
            .finish()
    }
}

impl Nic for SoftNic {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    fn register(&self, addr: u64, len: u64, access: Access) -> Result<RegionInfo> {
        self.inner.register(addr, len, access)
    }

    fn register_implicit_odp(&self, access: Access) -> Result<RegionInfo> {
        self.inner
            .register(0, ADDRESS_SPACE_END, access | Access::ON_DEMAND)
    }

    fn deregister(&self, lkey: u32) -> Result<()> {
        self.inner.deregister(lkey)
    }

    fn advise(&self, lkey: u32, addr: u64, len: u64, advice: Advice) -> Result<()> {
        let r = self.inner.region(lkey)?;
        if !r.access.contains(Access::ON_DEMAND) {
            return Err(Error::InvalidArgument(format!(
                "advise needs an ODP region; key {lkey:#010x} is pinned"
            )));
        }
        if addr < r.addr || addr.saturating_add(len) > r.addr + r.len {
            return Err(Error::InvalidArgument(format!(
                "advise range {addr:#x}+{len} is outside region {:#x}+{}",
                r.addr, r.len
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let write = advice == Advice::PrefetchWrite;
        self.inner.on_entry();
        if self.inner.own.present().missing_span(addr, len).is_none() {
            // Every page is mapped for the NIC already (and the monitor, just flushed, keeps
            // the bits true): nothing to do, as for a prefetch of resident ODP pages.
            return Ok(());
        }
        let newly = self
            .inner
            .watch
            .make_present(addr, len, write)
            .ok_or(Error::UnmappedRange { addr, len })?;
        self.inner.counters.prefetch_pages.fetch_add(newly, Relaxed);
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<u32> {
        self.inner.engine.lock().create_cq(depth)
    }

    fn create_qp(&self, peer: usize, send_cq: u32, recv_cq: u32, caps: QpCaps) -> Result<u32> {
        if peer >= self.inner.peers.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {peer} does not exist (job of {} ranks)",
                self.inner.peers.len()
            )));
        }
        if caps.max_sge > self.inner.caps.max_sge || caps.max_inline > self.inner.caps.max_inline {
            return Err(Error::InvalidArgument(format!(
                "queue pair asks for {} SGEs / {} inline bytes; the device allows {} / {}",
                caps.max_sge, caps.max_inline, self.inner.caps.max_sge, self.inner.caps.max_inline
            )));
        }
        // The backup ring (`receive_fault.rs`): pinned by a registration of the NIC's own,
        // as the driver of Lesokhin17 Fig. 5 owns its ring.
        let backup = if self.inner.receive_fault.policy == ReceiveFaultPolicy::Backup {
            let bytes = self.inner.receive_fault.backup_ring_bytes as usize;
            let mem = sys::AnonMapping::new(bytes)
                .map_err(|e| Error::os("mapping the backup ring of a queue pair", e))?;
            let region = self
                .inner
                .register(mem.addr(), mem.len() as u64, Access::LOCAL_WRITE)?;
            Some(engine::BackupRing::new(mem, region.lkey))
        } else {
            None
        };
        let lkey = backup.as_ref().map(engine::BackupRing::lkey);
        let made = self
            .inner
            .engine
            .lock()
            .create_qp(peer, send_cq, recv_cq, caps, backup);
        if let (Err(_), Some(lkey)) = (&made, lkey) {
            let _ = self.inner.deregister(lkey);
        }
        if let Ok(qpn) = made {
            self.inner.qp_peers[qpn as usize].store(peer as u32, Release);
        }
        made
    }

    fn endpoint(&self, qpn: u32) -> Result<Endpoint> {
        self.inner.engine.lock().qp(qpn)?;
        let mut v = (self.inner.rank as u32).to_le_bytes().to_vec();
        v.extend_from_slice(&qpn.to_le_bytes());
        Ok(Endpoint(v))
    }

    fn connect(&self, qpn: u32, remote: &Endpoint) -> Result<()> {
        let e = &remote.0;
        if e.len() != 8 {
            return Err(Error::InvalidArgument("malformed endpoint".into()));
        }
        let rank = u32::from_le_bytes(e[0..4].try_into().expect("4 bytes")) as usize;
        let rqpn = u32::from_le_bytes(e[4..8].try_into().expect("4 bytes"));
        let mut eng = self.inner.engine.lock();
        let qp = eng.qp_mut(qpn)?;
        if qp.peer != rank {
            return Err(Error::InvalidArgument(format!(
                "queue pair {qpn} was created towards rank {}, but the endpoint is rank {rank}'s",
                qp.peer
            )));
        }
        if rqpn as usize >= MAX_QPS {
            return Err(Error::InvalidArgument(format!(
                "remote queue pair number {rqpn} is out of range"
            )));
        }
        qp.remote_qpn = Some(rqpn);
        Ok(())
    }

    #[allow(unsafe_code)]
    unsafe fn post_send(&self, qpn: u32, wr: &SendWr<'_>) -> Result<()> {
        self.inner.on_entry();
        self.inner.own.note_app_in_nic(true);
        let r = self.inner.post_send(qpn, wr);
        // What the post put on a TCP link goes out now, as a NIC sends on its doorbell.
        self.inner.flush_link_of(qpn);
        self.inner.own.note_app_in_nic(false);
        r
    }

    #[allow(unsafe_code)]
    unsafe fn post_recv(&self, qpn: u32, wr: &RecvWr<'_>) -> Result<()> {
        self.inner.on_entry();
        self.inner.post_recv(qpn, wr)
    }

    fn poll_cq(&self, cq: u32, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        self.inner.on_entry();
        self.inner.own.note_app_poll();
        self.inner.own.note_app_in_nic(true);
        let mut eng = self.inner.engine.lock();
        self.inner.progress(&mut eng);
        let n = eng.drain_cq(cq, out, max);
        drop(eng);
        self.inner.flush_links(false);
        self.inner.own.note_app_in_nic(false);
        n.ok_or_else(|| Error::InvalidArgument(format!("no completion queue {cq}")))
    }

    fn pinning(&self) -> String {
        self.describe_pinning()
    }

    fn counters(&self) -> CountersSnapshot {
        let mut s = self.inner.counters.snapshot();
        s.invalidated_pages += self.inner.watch.invalidated_pages();
        (s.tpt_cache.hits, s.tpt_cache.misses) = self.inner.own.tpt_cache().hits_and_misses();
        s.syscalls = sys::syscalls_made();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_suffixes() {
        assert_eq!(parse_bytes("65536"), Some(Some(65536)));
        assert_eq!(parse_bytes("64K"), Some(Some(65536)));
        assert_eq!(parse_bytes("8m"), Some(Some(8 << 20)));
        assert_eq!(parse_bytes("1G"), Some(Some(1 << 30)));
        assert_eq!(parse_bytes("unlimited"), Some(None));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes(""), None);
    }
}
