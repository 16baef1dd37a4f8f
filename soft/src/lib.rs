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
mod layout;
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
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use pagewire_boot::{shm_prefix, Bootstrap};
use pagewire_nic::counters::NpfTiming;
use pagewire_nic::{
    Access, Advice, Capabilities, Completion, Counters, CountersSnapshot, Endpoint, Nic, QpCaps,
    RecvWr, RegionInfo, SendWr, PAGE_SIZE,
};
use pagewire_sys::error::{Error, Result};
use pagewire_sys::{self as sys, ProcessHandle};

use ack::{AckLine, ACK_LINE_BYTES, ACK_WORDS};
use bound::BoundWatch;
use engine::Engine;
use inbox::PendingBits;
use odp_watch::PresentWatch;
use pagewire_sys::SharedSegment;
use pin::{PinAccount, RegionPin};
use present::{PresentBits, PRESENT_BYTES};
use ring::RING_BYTES;
use tpt::{Tpt, Translation, ADDRESS_SPACE_END, MAX_MRS, TPT_BYTES};
use tpt_cache::{MissSide, TranslationCache};

use layout::*;
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

impl SoftNic {
    /// Brings the NIC up: creates this rank's shared memory, exchanges addresses through
    /// `boot`, maps every peer's, detects per peer whether CMA is permitted, and starts the
    /// driver thread. Collective: every rank of the job must call it.
    pub fn new(boot: &dyn Bootstrap, config: SoftConfig) -> Result<SoftNic> {
        let (rank, size, job) = (boot.rank(), boot.size(), boot.job_id().to_string());
        // Local DMA faults become error completions from here on (see `sys::guarded_copy`).
        sys::install_fault_guard();
        let own = Arc::new(RankMemory::create(&job, rank, size)?);
        let watch = PresentWatch::new(own.clone(), config.odp_check)?;
        own.seg.words(ODP_MONITORED, 1)[0].store(watch.uses_monitor() as u64, Release);
        // Peers read it after the barrier below, before their first access.
        own.tpt_cache().configure(config.tpt_cache);
        // Should the kernel refuse, the probe below finds CMA forbidden and the peers stage
        // payloads through the rings instead.
        sys::admit_cma_from_siblings(size);
        let probe = own.seg.addr_of(0);
        let wire_start = tcp::WireStart::new(&config.wire, rank, size)?;
        let mut mine = Vec::with_capacity(12 + tcp::WIRE_ADDRESS_BYTES);
        mine.extend_from_slice(&std::process::id().to_le_bytes());
        mine.extend_from_slice(&probe.to_le_bytes());
        wire_start.address.encode(&mut mine);
        let all = boot.allgather(&mine)?;
        let mut addresses = Vec::with_capacity(size);
        for (r, blob) in all.iter().enumerate() {
            let wire = (blob.len() == 12 + tcp::WIRE_ADDRESS_BYTES)
                .then(|| tcp::WireAddress::decode(&blob[12..]))
                .flatten()
                .ok_or_else(|| {
                    Error::Bootstrap(format!("rank {r} sent a malformed NIC address"))
                })?;
            let pid = u32::from_le_bytes(blob[0..4].try_into().expect("4 bytes"));
            let probe = u64::from_le_bytes(blob[4..12].try_into().expect("8 bytes"));
            addresses.push((pid, probe, wire));
        }
        let secret = addresses[0].2.secret;
        let mut tcp_peers = Vec::new();
        for (r, (_, _, wire)) in addresses.iter().enumerate() {
            if wire_start.uses_tcp(config.wire.mode, rank, r, wire)? {
                tcp_peers.push((r, wire.addr));
            }
        }
        let mut streams = wire_start.connect_all(rank, &tcp_peers, &secret)?;
        let mut peers = Vec::with_capacity(size);
        let mut links = Vec::new();
        for (r, &(pid, probe, _)) in addresses.iter().enumerate() {
            if let Some(at) = streams.iter().position(|(p, _)| *p == r) {
                let (_, stream) = streams.swap_remove(at);
                let link =
                    Arc::new(tcp::TcpLink::new(rank, r, stream).map_err(|e| {
                        Error::os(format!("setting up the TCP wire to rank {r}"), e)
                    })?);
                links.push(link.clone());
                peers.push(Peer {
                    rank: r,
                    pid: 0,
                    mem: Arc::new(RankMemory::local_image(r, size)?),
                    cma: false,
                    process: None,
                    pagemap: None,
                    link: Some(link),
                });
                continue;
            }
            let mem = if r == rank {
                own.clone()
            } else {
                Arc::new(RankMemory::open(&job, r)?)
            };
            let cma = match config.dma {
                DmaMode::Staged => false,
                DmaMode::Auto | DmaMode::Cma => {
                    let ok = sys::cma_read_word(pid, probe) == Some(MAGIC);
                    if !ok && config.dma == DmaMode::Cma {
                        return Err(Error::InvalidArgument(format!(
                            "PAGEWIRE_SOFT_DMA=cma, but the kernel forbids process_vm_readv from \
                             rank {rank} to rank {r} (pid {pid}); check kernel.yama.ptrace_scope \
                             or use PAGEWIRE_SOFT_DMA=auto"
                        )));
                    }
                    ok
                }
            };
            peers.push(Peer {
                rank: r,
                pid,
                mem,
                cma,
                process: (r != rank).then(|| ProcessHandle::open(pid).ok()).flatten(),
                pagemap: File::open(format!("/proc/{pid}/pagemap")).ok(),
                link: None,
            });
        }
        let wire = if links.is_empty() {
            None
        } else {
            Some(tcp::TcpWire {
                links,
                wakeup: sys::Wakeup::new()
                    .map_err(|e| Error::os("creating the TCP wire's wakeup eventfd", e))?,
            })
        };
        // Nobody may remove its segment before everyone has mapped it.
        boot.barrier()?;
        // Everyone has: the names can go now (the mappings keep the objects alive), so that
        // nothing is left in /dev/shm however the job ends, even if the launcher is killed.
        // No name of this job is opened after this point.
        own.seg.unlink_name();
        own.present.unlink_name();
        let caps = Capabilities {
            provider: "soft",
            max_mr_size: ADDRESS_SPACE_END,
            max_mr: MAX_MRS as u32,
            max_qp: MAX_QPS as u32,
            max_sge: 16,
            max_inline: 1024,
            max_qp_wr: 16384,
            device: "soft".into(),
            odp_rc: true,
            odp_rc_send: true,
            odp_rc_recv: true,
            odp_rc_write: true,
            odp_rc_read: true,
            implicit_odp: true,
            prefetch: true,
            // Run by the target's engine with locked instructions (`engine/atomic.rs`).
            atomics: true,
            atomics_global: true,
        };
        let pins = PinAccount::with_method(config.memlock, config.pin)?;
        let inner = Arc::new(Inner {
            rank,
            caps,
            profile: config.profile,
            receive_fault: config.receive_fault,
            counters: Counters::default(),
            own,
            watch,
            peers,
            wire,
            qp_peers: (0..MAX_QPS).map(|_| AtomicU32::new(u32::MAX)).collect(),
            bound: BoundWatch::new(pins.long_term())?,
            regions: Mutex::new(RegionBook {
                regions: vec![None; MAX_MRS],
                held: (0..MAX_MRS).map(|_| None).collect(),
                pins,
            }),
            engine: Mutex::new(Engine::new(size)),
            faults_served: AtomicU64::new(0),
            serving_faults: Mutex::new(()),
            misses_served: AtomicU64::new(0),
            serving_misses: Mutex::new(()),
            shutdown: AtomicBool::new(false),
        });
        if rank == 0 && config.tpt_cache > 0 {
            eprintln!(
                "pagewire: soft NIC profile {} + {}",
                config.profile.name(),
                tpt_cache::describe(config.tpt_cache)
            );
        }
        if rank == 0 && config.receive_fault != ReceiveFaultSettings::default() {
            eprintln!("pagewire: soft NIC {}", config.receive_fault.describe());
        }
        let d = inner.clone();
        let driver = std::thread::Builder::new()
            .name(format!("pagewire-nic-driver-{rank}"))
            .spawn(move || d.driver_loop())
            .map_err(|e| Error::os("spawning the NIC driver thread", e))?;
        Ok(SoftNic {
            inner,
            driver: Some(driver),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks the NIC is connected to (including itself).
    pub fn size(&self) -> usize {
        self.inner.peers.len()
    }

    /// Whether packets to `peer` go over TCP (a peer on another host, or
    /// `PAGEWIRE_SOFT_WIRE=tcp`) rather than through shared memory.
    pub fn uses_tcp(&self, peer: usize) -> bool {
        self.inner.peers.get(peer).is_some_and(|p| p.link.is_some())
    }

    /// Why the TCP connection to `peer` failed (a malformed frame, a reset, an end of
    /// stream without a goodbye), once it has; `None` while it stands, after an orderly
    /// goodbye, and for a peer reached through shared memory.
    pub fn link_failure(&self, peer: usize) -> Option<String> {
        self.inner.peers.get(peer)?.link.as_ref()?.failure()
    }

    /// For hostile-peer tests only: writes `bytes` on the TCP connection to `peer` as they
    /// are, after what is queued. False if `peer` is not reached by TCP or its connection is
    /// closed.
    #[doc(hidden)]
    pub fn send_raw_wire_bytes(&self, peer: usize, bytes: &[u8]) -> bool {
        let Some(p) = self.inner.peers.get(peer) else {
            return false;
        };
        let Some(l) = &p.link else {
            return false;
        };
        l.send_raw(&p.mem.ring_from(self.inner.rank), bytes)
    }

    /// Whether payloads to `peer` move by CMA (one kernel copy) rather than staged.
    pub fn uses_cma(&self, peer: usize) -> bool {
        self.inner.peers.get(peer).is_some_and(|p| p.cma)
    }

    /// The locked-memory limit in force and bytes pinned now.
    pub fn memlock(&self) -> (MemlockLimit, u64) {
        let r = self.inner.regions.lock();
        (r.pins.limit_value(), r.pins.pinned_bytes())
    }

    /// For hostile-peer tests only: publishes one packet into the ring to `peer` with header
    /// words 0..7 exactly as given (the ring's encoding, little-endian words: kind | flags<<8
    /// | code<<16 | imm<<32; dst_qpn | src_qpn<<32; msn; total_len; offset; remote_addr;
    /// rkey | payload_len<<32) and `payload` (at most one slot), checking nothing: what a
    /// peer that writes anything into the shared memory it maps can do. False if `peer` does
    /// not exist or its ring is full.
    #[doc(hidden)]
    pub fn publish_raw_packet(&self, peer: usize, header: [u64; 7], payload: &[u8]) -> bool {
        let Some(p) = self.inner.peers.get(peer) else {
            return false;
        };
        let ring = p.mem.ring_from(self.inner.rank);
        let Some(slot) = ring.reserve() else {
            return false;
        };
        slot.write_payload(&payload[..payload.len().min(ring::MTU)]);
        ring.publish_words(slot, header);
        inbox::announce(&ring, p.mem.pending(), self.inner.rank);
        p.mem.wake_driver_if_asleep();
        true
    }

    /// Which costs beyond the real ones this NIC charges (`PAGEWIRE_SOFT_PROFILE`).
    pub fn profile(&self) -> SoftProfile {
        self.inner.profile
    }

    /// Entries of this NIC's translation cache, 0 when it has none
    /// (`PAGEWIRE_SOFT_TPT_CACHE`).
    pub fn tpt_cache_entries(&self) -> usize {
        self.inner.own.tpt_cache().entries()
    }

    /// What this NIC does on a receive-side network page fault (`PAGEWIRE_SOFT_RNPF`).
    pub fn receive_fault(&self) -> ReceiveFaultSettings {
        self.inner.receive_fault
    }

    /// One line for reports on the translation cache (`tpt-cache: N entries ...`, with what
    /// it models), or `None` when the NIC has none.
    pub fn describe_tpt_cache(&self) -> Option<String> {
        let n = self.tpt_cache_entries();
        (n > 0).then(|| tpt_cache::describe(n))
    }

    /// One line: how this NIC pins registered memory, and whether regions stay bound to
    /// their pages (`PAGEWIRE_VERBOSE=1` prints it).
    pub fn describe_pinning(&self) -> String {
        let how = self.inner.regions.lock().pins.describe();
        if self.inner.bound.active() {
            format!("{how}; regions stay bound to their pages")
        } else {
            format!("{how}; regions follow their address range (no long-term pins or no memory monitor)")
        }
    }
}

impl Drop for SoftNic {
    fn drop(&mut self) {
        let entries = self.tpt_cache_entries();
        if entries > 0 {
            // A what-if run says what its cache did (summed over ranks by the benchmarks'
            // scripts, tools/bench/tpt_cache.sh).
            let c = self.counters().tpt_cache;
            let line = format!(
                "pagewire: rank {}: tpt-cache {entries} entries: {} hits, {} misses, {} fills \
                 (wait {} ns real, processing {} ns modelled), stall {} ns\n",
                self.inner.rank,
                c.hits,
                c.misses,
                c.fills,
                c.fill_wait_ns,
                c.fill_model_ns,
                c.stall_ns
            );
            // One write, so that the ranks' lines do not interleave.
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        self.inner.shutdown.store(true, Release);
        self.inner.own.ring_doorbell();
        if let Some(w) = &self.inner.wire {
            w.wakeup.signal();
        }
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
        if let Some(w) = &self.inner.wire {
            for l in &w.links {
                l.say_bye(&self.inner.peers[l.peer].mem.ring_from(self.inner.rank));
            }
        }
        let keys: Vec<u32> = self
            .inner
            .regions
            .lock()
            .regions
            .iter()
            .flatten()
            .map(|r| r.lkey)
            .collect();
        for k in keys {
            let _ = self.inner.deregister(k);
        }
        // The shared memory's names went when the NIC came up (a NIC brought up again in
        // this process finds them free); the objects go with the last mapping.
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
