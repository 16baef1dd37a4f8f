//! The soft provider: a software RDMA NIC in user space, the way Soft-RoCE is one in the
//! kernel (DESIGN.md "The soft provider"). It enforces verbs semantics and charges what the
//! OS really charges; it adds no artificial delay.
//!
//! - **Wire**: one shared-memory ring per (sender, receiver) pair ([`ring`]); the receiver
//!   polls the rings that carried packets recently and learns of the others from a bitmap
//!   ([`inbox`]); responders acknowledge by writing the requester's memory ([`ack`]).
//! - **No kernel on the fast path** (issue 12): posting and polling are loads, stores and
//!   memory copies ([`dma`]); a waiting driver thread is woken only when it said it sleeps
//!   and its application is not polling.
//! - **DMA engine**: payloads between processes move with one kernel copy
//!   (`process_vm_readv`/`writev`) when the kernel allows it, else they are staged through
//!   the ring; `PAGEWIRE_SOFT_DMA=staged` forces the fallback.
//! - **TPT**: each rank's region table lives in its shared segment, so RDMA WRITE and READ
//!   are checked against the target's table by the initiator's engine, before any byte moves,
//!   without the target's CPU ([`tpt`]).
//! - **Pinning** is `mlock`, charged against RLIMIT_MEMLOCK ([`pin`]).
//! - **ODP**: regions are never pinned; pages start non-present in the NIC's bitmap
//!   ([`present`]); an access to a non-present page is a network page fault (NPF). Faults on
//!   the initiator's own memory are resolved in place before data is read; faults on the
//!   target's memory (rNPF, seed 000 section 4) answer the initiator receiver-not-ready while
//!   the target's *driver thread* — the interrupt-handler analogue, asleep on a futex until a
//!   peer rings its doorbell — populates the pages (`MADV_POPULATE_*`) and marks them
//!   present; the initiator then retries. One outstanding fault per queue-pair direction
//!   (seed 003, "Concurrent page faults"); a whole work request's pages in one batch (seed
//!   000, "Optimizations").
//! - **Invalidation**: every range made present is watched by the memory monitor, whose
//!   sink clears the bits of pages that are unmapped, moved, discarded or shared by `fork`
//!   ([`odp_watch`]); without a monitor, initiators check the owner's `/proc/PID/pagemap`
//!   before DMA into present pages. A fault on unmapped memory ends in an error completion.

mod ack;
mod bound;
#[allow(unsafe_code)]
mod dma;
mod engine;
mod inbox;
mod odp_watch;
mod pin;
mod present;
pub(crate) mod ring;
#[allow(unsafe_code)]
mod shm;
mod tpt;

pub use odp_watch::OdpCheck;
pub use pin::{MemlockLimit, PinMethod};

use std::fs::File;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::boot::{shm_prefix, Bootstrap};
use crate::error::{Error, Result};
use crate::nic::{
    Access, Advice, Capabilities, Completion, Counters, CountersSnapshot, Endpoint, Nic, QpCaps,
    RecvWr, RegionInfo, SendWr, PAGE_SIZE,
};
use crate::sys::{self, CmaDirection, Extent, ProcessHandle};

use ack::{AckLine, ACK_LINE_BYTES, ACK_WORDS};
use bound::BoundWatch;
use engine::Engine;
use inbox::PendingBits;
use odp_watch::PresentWatch;
use pin::{PinAccount, RegionPin};
use present::{PresentBits, PRESENT_BYTES};
use ring::RING_BYTES;
use shm::SharedSegment;
use tpt::{Tpt, Translation, ADDRESS_SPACE_END, MAX_MRS, TPT_BYTES};

/// How long the driver thread sleeps between passes while it drives the engine for an
/// application that is not polling and has work outstanding.
const DRIVER_BUSY_SLEEP: Duration = Duration::from_micros(100);
/// How long the driver thread sleeps when nothing needs it (it is woken earlier by a peer
/// that files a fault, finds a ring full, or waits too long for an acknowledgement).
const DRIVER_IDLE_SLEEP: Duration = Duration::from_millis(200);

/// Queue pairs per NIC.
pub(crate) const MAX_QPS: usize = 256;
/// Ranks a job may have (one pending bit each, [`inbox`]).
const MAX_RANKS: usize = 8 * PENDING_BYTES;
const MAGIC: u64 = u64::from_le_bytes(*b"pagewire");
const HEADER_BYTES: usize = 4096;
/// Header word (32-bit): the driver thread's futex, bumped to wake it.
const DOORBELL: usize = 64;
/// Header word counting faults filed on this rank's memory (by peers and itself).
const FAULTS_FILED: usize = 128;
/// Header word: 1 when this rank's memory monitor keeps its present bits true, 0 when
/// initiators must check its pagemap.
const ODP_MONITORED: usize = 192;
/// Header word: 1 while the driver thread sleeps (or is about to): peers wake it only then.
const DRIVER_ASLEEP: usize = 256;
/// Header word: how many times the application has polled (a heartbeat peers read to tell
/// whether it is polling before they wake its driver).
const APP_POLLS: usize = 320;
/// Header word: non-zero while an application thread is inside the NIC (posting or
/// polling, a long DMA included): it is not idle, so peers do not wake its driver.
const APP_IN_NIC: usize = 384;
/// Header word: the entry of another rank's table this rank's engine holds now
/// ([`tpt::claim_tag`]), 0 when none; read by that rank when it deregisters.
const REMOTE_CLAIM: usize = 448;
/// How long a deregistration waits for an entry's in-use count before it looks at who holds
/// it (a live holder is waited for, a dead one's count is written off).
const HOLDERS_CHECK_AFTER: Duration = Duration::from_millis(100);
const PENDING_OFFSET: usize = HEADER_BYTES;
const PENDING_BYTES: usize = 4096;
const TPT_OFFSET: usize = PENDING_OFFSET + PENDING_BYTES;
const NPF_OFFSET: usize = TPT_OFFSET + TPT_BYTES;
const NPF_WORDS: usize = 8;
const ACK_OFFSET: usize = NPF_OFFSET + MAX_QPS * NPF_WORDS * 8;
const RINGS_OFFSET: usize = ACK_OFFSET + MAX_QPS * ACK_LINE_BYTES;

/// How payload bytes move between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaMode {
    /// CMA where the kernel permits it, staged otherwise (detected per peer at start-up).
    Auto,
    /// CMA, or fail at start-up.
    Cma,
    /// Always staged through the ring (the fallback, forced).
    Staged,
}

/// Settings of the soft provider.
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Payload path (`PAGEWIRE_SOFT_DMA=auto|cma|staged`).
    pub dma: DmaMode,
    /// Locked-memory limit (`PAGEWIRE_MEMLOCK_LIMIT`, else RLIMIT_MEMLOCK).
    pub memlock: MemlockLimit,
    /// How ODP present bits learn of address-space changes (`PAGEWIRE_SOFT_ODP_CHECK`).
    pub odp_check: OdpCheck,
    /// How registrations pin (`PAGEWIRE_PIN=auto|longterm|mlock`).
    pub pin: PinMethod,
}

impl SoftConfig {
    /// Reads `PAGEWIRE_SOFT_DMA`, `PAGEWIRE_MEMLOCK_LIMIT` (bytes, with an optional
    /// K/M/G suffix, or `unlimited`), `PAGEWIRE_SOFT_ODP_CHECK` (`monitor`, `pagemap`) and
    /// `PAGEWIRE_PIN` (`auto`, `longterm`, `mlock`).
    pub fn from_env() -> Result<SoftConfig> {
        let dma = match std::env::var("PAGEWIRE_SOFT_DMA").as_deref() {
            Err(_) | Ok("") | Ok("auto") => DmaMode::Auto,
            Ok("cma") => DmaMode::Cma,
            Ok("staged") => DmaMode::Staged,
            Ok(other) => {
                return Err(Error::InvalidArgument(format!(
                    "PAGEWIRE_SOFT_DMA={other}: expected auto, cma or staged"
                )))
            }
        };
        let memlock = match std::env::var("PAGEWIRE_MEMLOCK_LIMIT") {
            Ok(v) => MemlockLimit {
                bytes: parse_bytes(&v).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "PAGEWIRE_MEMLOCK_LIMIT={v}: expected bytes like 65536, 64K, 8M, 1G or `unlimited`"
                    ))
                })?,
                source: "PAGEWIRE_MEMLOCK_LIMIT",
            },
            Err(_) => MemlockLimit {
                bytes: sys::memlock_rlimit(),
                source: "RLIMIT_MEMLOCK",
            },
        };
        let odp_check = OdpCheck::parse(std::env::var("PAGEWIRE_SOFT_ODP_CHECK").ok().as_deref())?;
        let pin = PinMethod::parse(std::env::var("PAGEWIRE_PIN").ok().as_deref())?;
        Ok(SoftConfig {
            dma,
            memlock,
            odp_check,
            pin,
        })
    }
}

pub use crate::env::parse_bytes;

/// One rank's shared NIC memory: header, TPT, NPF slots, inbound rings, present bitmap.
pub(crate) struct RankMemory {
    seg: SharedSegment,
    present: SharedSegment,
    /// Ranks in the job (bounds the pending bitmap).
    size: usize,
}

impl RankMemory {
    fn names(job: &str, rank: usize) -> (String, String) {
        let p = shm_prefix(job);
        (format!("{p}nic-{rank}"), format!("{p}odp-{rank}"))
    }

    fn create(job: &str, rank: usize, size: usize) -> Result<RankMemory> {
        if size > MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "{size} ranks; the soft NIC supports at most {MAX_RANKS}"
            )));
        }
        let (nic, odp) = Self::names(job, rank);
        let seg_bytes = RINGS_OFFSET + size * RING_BYTES;
        let seg = SharedSegment::create(&nic, seg_bytes).map_err(|e| match e {
            Error::SharedMemoryFull {
                object,
                needed,
                available,
                ..
            } => Error::SharedMemoryFull {
                object,
                needed,
                job_needed: needed.saturating_mul(size as u64),
                ranks: size,
                available,
            },
            e => e,
        })?;
        // The bitmap covers the whole address space (4 GiB): only the pages covering the
        // ranges a job registers for ODP are ever touched, so it stays sparse.
        let present = SharedSegment::create_sparse(&odp, PRESENT_BYTES)?;
        let h = seg.words(0, 4);
        h[1].store(std::process::id() as u64, Relaxed);
        h[2].store(rank as u64, Relaxed);
        h[3].store(size as u64, Relaxed);
        h[0].store(MAGIC, Release);
        Ok(RankMemory { seg, present, size })
    }

    fn open(job: &str, rank: usize) -> Result<RankMemory> {
        let (nic, odp) = Self::names(job, rank);
        let seg = SharedSegment::open(&nic)?;
        let present = SharedSegment::open(&odp)?;
        if seg.words(0, 1)[0].load(Acquire) != MAGIC {
            return Err(Error::Bootstrap(format!(
                "/dev/shm/{nic} is not a pagewire NIC segment"
            )));
        }
        let size = seg.words(24, 1)[0].load(Relaxed) as usize;
        if size == 0 || size > MAX_RANKS || seg.len() < RINGS_OFFSET + size * RING_BYTES {
            return Err(Error::Bootstrap(format!(
                "/dev/shm/{nic} has a malformed NIC header ({size} ranks)"
            )));
        }
        Ok(RankMemory { seg, present, size })
    }

    pub(crate) fn tpt(&self) -> Tpt<'_> {
        Tpt::new(self.seg.words(TPT_OFFSET, TPT_BYTES / 8))
    }

    pub(crate) fn present(&self) -> PresentBits<'_> {
        PresentBits::new(self.present.words(0, PRESENT_BYTES / 8))
    }

    pub(crate) fn ring_from(&self, src: usize) -> ring::Ring<'_> {
        ring::Ring::at(&self.seg, RINGS_OFFSET + src * RING_BYTES)
    }

    /// The bitmap in which senders announce packets in rings this rank does not watch.
    pub(crate) fn pending(&self) -> PendingBits<'_> {
        PendingBits::new(self.seg.words(PENDING_OFFSET, self.size.div_ceil(64)))
    }

    /// The acknowledgement line of this rank's queue pair `qpn` (written by its peer).
    pub(crate) fn ack_line(&self, qpn: u32) -> AckLine<'_> {
        AckLine::new(
            self.seg
                .words(ACK_OFFSET + qpn as usize * ACK_LINE_BYTES, ACK_WORDS),
        )
    }

    /// The application's poll count (see [`APP_POLLS`]).
    pub(crate) fn app_polls(&self) -> u64 {
        self.seg.words(APP_POLLS, 1)[0].load(Relaxed)
    }

    /// The owner: one more poll.
    fn note_app_poll(&self) {
        let w = &self.seg.words(APP_POLLS, 1)[0];
        w.store(w.load(Relaxed) + 1, Relaxed);
    }

    /// Whether an application thread of this rank is inside its NIC now.
    pub(crate) fn app_in_nic(&self) -> bool {
        self.seg.words(APP_IN_NIC, 1)[0].load(Relaxed) != 0
    }

    /// The owner: an application thread enters (`true`) or leaves its NIC.
    fn note_app_in_nic(&self, inside: bool) {
        self.seg.words(APP_IN_NIC, 1)[0].store(inside as u64, Relaxed);
    }

    /// This rank's claim word ([`REMOTE_CLAIM`]).
    pub(crate) fn remote_claim(&self) -> &AtomicU64 {
        &self.seg.words(REMOTE_CLAIM, 1)[0]
    }

    fn asleep_word(&self) -> &AtomicU64 {
        &self.seg.words(DRIVER_ASLEEP, 1)[0]
    }

    /// Wakes this rank's driver thread if it sleeps (no system call otherwise). Callers
    /// publish what the driver must see (a filed fault, a packet) before calling.
    pub(crate) fn wake_driver_if_asleep(&self) {
        if self.asleep_word().load(SeqCst) != 0 {
            self.ring_doorbell();
        }
    }

    pub(crate) fn npf_slot(&self, qpn: u32) -> NpfSlot<'_> {
        NpfSlot {
            w: self
                .seg
                .words(NPF_OFFSET + qpn as usize * NPF_WORDS * 8, NPF_WORDS),
            filed: &self.seg.words(FAULTS_FILED, 1)[0],
        }
    }

    /// Whether this rank's memory monitor keeps its present bits true.
    pub(crate) fn odp_monitored(&self) -> bool {
        self.seg.words(ODP_MONITORED, 1)[0].load(Acquire) == 1
    }

    fn faults_filed(&self) -> u64 {
        self.seg.words(FAULTS_FILED, 1)[0].load(Acquire)
    }

    fn doorbell(&self) -> &AtomicU32 {
        self.seg.word32(DOORBELL)
    }

    /// Wakes this rank's driver thread, asleep or not.
    pub(crate) fn ring_doorbell(&self) {
        self.doorbell().fetch_add(1, SeqCst);
        sys::futex_wake(self.doorbell());
    }
}

/// The responder-fault slot of one queue pair in the owner's segment: at most one
/// outstanding fault per queue pair and direction (seed 003).
pub(crate) struct NpfSlot<'a> {
    w: &'a [AtomicU64],
    filed: &'a AtomicU64,
}

const NPF_REQ: usize = 0;
const NPF_DONE: usize = 1;
const NPF_ADDR: usize = 2;
const NPF_LEN: usize = 3;
const NPF_WRITE: usize = 4;
const NPF_STATUS: usize = 5;
const NPF_TIME: usize = 6;

impl NpfSlot<'_> {
    /// Files a fault on `[addr, addr+len)`; returns its sequence number.
    pub(crate) fn file(&self, addr: u64, len: u64, write: bool) -> u64 {
        let seq = self.w[NPF_REQ].load(Relaxed) + 1;
        self.w[NPF_ADDR].store(addr, Relaxed);
        self.w[NPF_LEN].store(len, Relaxed);
        self.w[NPF_WRITE].store(write as u64, Relaxed);
        self.w[NPF_TIME].store(sys::monotonic_ns(), Relaxed);
        self.w[NPF_REQ].store(seq, Release);
        self.filed.fetch_add(1, Release);
        seq
    }

    /// `Some(resolved)` once fault `seq` has been handled.
    pub(crate) fn outcome(&self, seq: u64) -> Option<bool> {
        (self.w[NPF_DONE].load(Acquire) >= seq).then(|| self.w[NPF_STATUS].load(Relaxed) == 0)
    }
}

/// A peer as this rank's NIC sees it.
pub(crate) struct Peer {
    pub rank: usize,
    pub pid: u32,
    pub mem: Arc<RankMemory>,
    pub cma: bool,
    pub process: Option<ProcessHandle>,
    pub pagemap: Option<File>,
}

impl Peer {
    /// Whether the peer's process still runs (always true for this rank itself).
    pub(crate) fn is_alive(&self) -> bool {
        self.process.as_ref().is_none_or(|p| p.is_alive())
    }
}

/// Local bookkeeping of this NIC's regions.
pub(crate) struct RegionBook {
    regions: Vec<Option<RegionInfo>>,
    /// How each pinned region holds its pages (by table index).
    held: Vec<Option<HeldPages>>,
    pins: PinAccount,
}

/// The pages a pinned region holds, and what the NIC needs to keep using them.
struct HeldPages {
    pin: RegionPin,
    /// The memory monitor's watch on the range (long-term pins only).
    watch: Option<crate::memmon::SubscriptionId>,
    /// The copy of the pinned pages the region uses once the application replaced them.
    detached: Option<sys::PinnedSnapshot>,
}

pub(crate) struct Inner {
    pub rank: usize,
    pub caps: Capabilities,
    pub counters: Counters,
    pub own: Arc<RankMemory>,
    /// Keeps `own`'s present bits true against address-space changes.
    pub watch: PresentWatch,
    /// Detaches pinned regions whose range the application replaced.
    bound: BoundWatch,
    pub peers: Vec<Peer>,
    regions: Mutex<RegionBook>,
    pub engine: Mutex<Engine>,
    /// Faults filed on this rank's memory that have been served.
    faults_served: AtomicU64,
    /// Held by the thread serving faults (one at a time).
    serving_faults: Mutex<()>,
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
        if let Some(tracer) = cma_ptracer(
            size,
            sys::yama_ptrace_scope(),
            std::os::unix::process::parent_id(),
        ) {
            // Should the kernel refuse, the probe below finds CMA forbidden and the peers
            // stage payloads through the rings instead.
            let _ = sys::allow_cma_from_descendants_of(tracer);
        }
        let probe = own.seg.addr_of(0);
        let mut mine = Vec::with_capacity(12);
        mine.extend_from_slice(&std::process::id().to_le_bytes());
        mine.extend_from_slice(&probe.to_le_bytes());
        let all = boot.allgather(&mine)?;
        let mut peers = Vec::with_capacity(size);
        for (r, blob) in all.iter().enumerate() {
            if blob.len() != 12 {
                return Err(Error::Bootstrap(format!(
                    "rank {r} sent a malformed NIC address"
                )));
            }
            let pid = u32::from_le_bytes(blob[0..4].try_into().expect("4 bytes"));
            let probe = u64::from_le_bytes(blob[4..12].try_into().expect("8 bytes"));
            let mem = if r == rank {
                own.clone()
            } else {
                Arc::new(RankMemory::open(&job, r)?)
            };
            let cma = match config.dma {
                DmaMode::Staged => false,
                DmaMode::Auto | DmaMode::Cma => {
                    let ok = cma_permitted(pid, probe);
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
            });
        }
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
        };
        let pins = PinAccount::with_method(config.memlock, config.pin)?;
        let inner = Arc::new(Inner {
            rank,
            caps,
            counters: Counters::default(),
            own,
            watch,
            peers,
            bound: BoundWatch::new(pins.long_term())?,
            regions: Mutex::new(RegionBook {
                regions: vec![None; MAX_MRS],
                held: (0..MAX_MRS).map(|_| None).collect(),
                pins,
            }),
            engine: Mutex::new(Engine::new(size)),
            faults_served: AtomicU64::new(0),
            serving_faults: Mutex::new(()),
            shutdown: AtomicBool::new(false),
        });
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

/// The process whose descendants may read and write this rank's memory with CMA, when this
/// rank must name one: under Yama's `ptrace_scope` 1, a process may only trace its own
/// descendants or processes that named it (or one of its ancestors) their ptracer, so ranks
/// that are siblings cannot use `process_vm_readv` on each other unless each names their
/// common parent. That parent is `pwrun` (or the test or benchmark that launched the job),
/// or under `mpirun` the launcher's local proxy (MPICH's `hydra_pmi_proxy`, Open MPI's
/// `prted`): its descendants are this host's processes of the job, not other programs of
/// the same user (`PR_SET_PTRACER_ANY` would admit those too).
///
/// `None` when nothing needs naming or naming would not help: a single-rank job (no peer
/// reads its memory); no Yama, or scope 0 (siblings may already), 2 or 3 (only
/// `CAP_SYS_PTRACE`, or nobody, whatever is named); a rank whose parent is gone or is
/// `init` (pid 1, whose descendants are every process). Peers then find CMA forbidden at
/// start-up and stage payloads through the rings.
fn cma_ptracer(ranks: usize, yama_scope: Option<u32>, parent: u32) -> Option<u32> {
    (ranks > 1 && yama_scope == Some(1) && parent > 1).then_some(parent)
}

fn cma_permitted(pid: u32, probe: u64) -> bool {
    let mut word = [0u8; 8];
    let local = [Extent {
        addr: word.as_mut_ptr() as u64,
        len: 8,
    }];
    let ok = sys::cma_copy(
        pid,
        CmaDirection::Read,
        &local,
        &[Extent {
            addr: probe,
            len: 8,
        }],
    )
    .is_ok();
    ok && u64::from_le_bytes(word) == MAGIC
}

impl Drop for SoftNic {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Release);
        self.inner.own.ring_doorbell();
        if let Some(d) = self.driver.take() {
            let _ = d.join();
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

impl Inner {
    /// The driver thread: the interrupt-handler analogue. It sleeps on the doorbell until a
    /// peer (or a timeout) wakes it, serves the faults filed on this rank's memory, and
    /// drives the engine while the application is not polling and work is outstanding
    /// (acknowledging peers' requests, streaming staged READ responses). While the
    /// application polls, it does all of this itself and the driver stays asleep.
    fn driver_loop(&self) {
        sys::exclude_this_thread_from_count();
        let bell = self.own.doorbell();
        let asleep = self.own.asleep_word();
        let mut polls_seen = self.own.app_polls();
        loop {
            let seen = bell.load(SeqCst);
            if self.shutdown.load(Acquire) {
                return;
            }
            self.serve_faults();
            let polls = self.own.app_polls();
            let app_polling = polls != polls_seen;
            polls_seen = polls;
            let mut work = false;
            if !app_polling {
                if let Some(mut eng) = self.engine.try_lock() {
                    self.progress(&mut eng);
                    work = eng.has_work();
                }
            }
            asleep.store(1, SeqCst);
            // A fault filed or a bell rung after the checks above: go round again.
            let faults_waiting = self.own.faults_filed() != self.faults_served.load(SeqCst);
            if faults_waiting || bell.load(SeqCst) != seen {
                asleep.store(0, SeqCst);
                continue;
            }
            let wait = if work && !app_polling {
                DRIVER_BUSY_SLEEP
            } else {
                DRIVER_IDLE_SLEEP
            };
            sys::futex_wait(bell, seen, wait);
            asleep.store(0, SeqCst);
        }
    }

    /// The driver's fault handler: resolves every filed fault on this rank's memory. Cheap
    /// when none is pending; one thread serves at a time.
    pub(crate) fn serve_faults(&self) {
        if self.faults_served.load(Acquire) == self.own.faults_filed() {
            return;
        }
        let Some(_serving) = self.serving_faults.try_lock() else {
            return;
        };
        let filed = self.own.faults_filed();
        self.faults_served.store(filed, SeqCst);
        for qpn in 0..MAX_QPS as u32 {
            let slot = self.own.npf_slot(qpn);
            let req = slot.w[NPF_REQ].load(Acquire);
            if req == slot.w[NPF_DONE].load(Relaxed) {
                continue;
            }
            let (addr, len) = (
                slot.w[NPF_ADDR].load(Relaxed),
                slot.w[NPF_LEN].load(Relaxed),
            );
            let write = slot.w[NPF_WRITE].load(Relaxed) != 0;
            let ok = self.resolve_fault(addr, len, write);
            let t0 = slot.w[NPF_TIME].load(Relaxed);
            let pages = sys::page_span(addr, len).1 / PAGE_SIZE;
            // Count before publishing, so whoever sees the fault resolved sees it counted.
            self.counters
                .record_npf(false, pages, sys::monotonic_ns().saturating_sub(t0));
            slot.w[NPF_STATUS].store(!ok as u64, Relaxed);
            slot.w[NPF_DONE].store(req, Release);
        }
    }

    /// Maps `[addr, addr+len)` of this process and marks it present for the NIC.
    pub(crate) fn resolve_fault(&self, addr: u64, len: u64, write: bool) -> bool {
        if self.watch.make_present(addr, len, write).is_some() {
            true
        } else {
            self.counters.npf_failed.fetch_add(1, Relaxed);
            false
        }
    }

    fn region(&self, lkey: u32) -> Result<RegionInfo> {
        let r = self.regions.lock();
        r.regions[(lkey as usize) % MAX_MRS]
            .filter(|m| m.lkey == lkey)
            .ok_or(Error::UnknownKey { key: lkey })
    }

    fn deregister(&self, lkey: u32) -> Result<()> {
        let t0 = sys::monotonic_ns();
        let mut book = self.regions.lock();
        let idx = lkey as usize % MAX_MRS;
        let info = book.regions[idx]
            .filter(|m| m.lkey == lkey)
            .ok_or(Error::UnknownKey { key: lkey })?;
        self.own.tpt().invalidate(lkey);
        self.wait_until_unused(lkey);
        book.regions[idx] = None;
        let mut unwatch = None;
        if let Some(held) = book.held[idx].take() {
            unwatch = held.watch;
            let freed = book.pins.unpin(info.addr, info.len, held.pin);
            self.counters.sub_pinned(freed);
        }
        drop(book);
        if let Some(id) = unwatch {
            self.bound.unsubscribe(id);
        }
        self.counters
            .record_registration(false, sys::monotonic_ns().saturating_sub(t0));
        Ok(())
    }

    /// Waits until no engine moves bytes through `lkey`'s entry any more, as `ibv_dereg_mr`
    /// returns only once the HCA has stopped using the region: with no deadline, since
    /// unpinning under a live holder would let its bytes land in whatever the application
    /// maps there next (issue 15, item 4). A holder that is stopped (SIGSTOP) is waited for.
    /// A count left by a peer that died mid-DMA is recognised — this rank's own engine,
    /// whose holds never outlive its lock, is held, and no live peer claims the entry — and
    /// the entry is retired instead of reused.
    fn wait_until_unused(&self, lkey: u32) {
        let tpt = self.own.tpt();
        let start = Instant::now();
        while tpt.in_use(lkey) != 0 {
            if start.elapsed() < HOLDERS_CHECK_AFTER {
                std::thread::yield_now();
                continue;
            }
            let engine = self.engine.lock();
            if tpt.in_use(lkey) == 0 {
                return;
            }
            let tag = tpt::claim_tag(self.rank, lkey);
            let live_holder = self.peers.iter().enumerate().any(|(r, p)| {
                r != self.rank && p.mem.remote_claim().load(SeqCst) == tag && p.is_alive()
            });
            drop(engine);
            if !live_holder {
                tpt.retire(lkey);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The owner entered the NIC: deliver address-space changes to ODP's present bits and
    /// detach the pinned regions whose range changed (`bound.rs`).
    pub(crate) fn on_entry(&self) {
        self.watch.on_post();
        if let Some(changed) = self.bound.take_changes() {
            self.detach(&changed);
        }
    }

    /// Points every live long-term-pinned region overlapping `changed` at a copy of its
    /// pinned pages.
    fn detach(&self, changed: &[(u64, u64)]) {
        let mut book = self.regions.lock();
        let tpt = self.own.tpt();
        for idx in 0..MAX_MRS {
            let Some(info) = book.regions[idx] else {
                continue;
            };
            let (start, span) = sys::page_span(info.addr, info.len);
            let hit = changed.iter().any(|&(a, b)| a < start + span && start < b);
            let RegionBook { held, pins, .. } = &mut *book;
            let Some(h) = held[idx].as_mut() else {
                continue;
            };
            if !hit || h.detached.is_some() {
                continue;
            }
            match pins.snapshot(&h.pin) {
                Some(Ok(copy)) => {
                    let alias = copy.addr() + (info.addr - start);
                    tpt.publish(Translation {
                        key: info.lkey,
                        base: info.addr,
                        len: info.len,
                        access: info.access,
                        alias,
                    });
                    h.detached = Some(copy);
                    self.counters.detached_regions.fetch_add(1, Relaxed);
                }
                Some(Err(e)) => eprintln!(
                    "pagewire: soft NIC: region {:#010x} ({:#x}+{}) changed under its \
                     registration, but its pinned pages could not be copied ({e}); DMA \
                     through it follows the address range",
                    info.lkey, info.addr, info.len
                ),
                None => {}
            }
        }
    }

    fn register(&self, addr: u64, len: u64, access: Access) -> Result<RegionInfo> {
        let t0 = sys::monotonic_ns();
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a zero-length region".into(),
            ));
        }
        if addr
            .checked_add(len)
            .is_none_or(|end| end > ADDRESS_SPACE_END)
        {
            return Err(Error::InvalidArgument(format!(
                "region {addr:#x}+{len} lies outside the user address space"
            )));
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "REMOTE_WRITE requires LOCAL_WRITE (as in verbs)".into(),
            ));
        }
        // Watched before the pin, so a change between the two is not missed; outside the
        // book's lock, which the monitor's sinks may take (a cache deregistering).
        let watch = if access.contains(Access::ON_DEMAND) {
            None
        } else {
            self.bound.subscribe(addr, len)
        };
        let mut unwatch = None;
        let mut book = self.regions.lock();
        let tpt = self.own.tpt();
        // A free entry that still has a key it never issued (issue 15, item 5).
        let free = book.regions.iter().enumerate().filter(|(_, r)| r.is_none());
        let Some((idx, key)) = free
            .filter_map(|(i, _)| tpt.fresh_key(i).map(|k| (i, k)))
            .next()
        else {
            drop(book);
            if let Some(id) = watch {
                self.bound.unsubscribe(id);
            }
            return Err(Error::Exhausted {
                what: "memory regions",
                limit: MAX_MRS as u64,
                hint: "deregister regions you no longer use, or use implicit ODP",
            });
        };
        if !access.contains(Access::ON_DEMAND) {
            let (pinned, pin) = match book.pins.pin(addr, len) {
                Ok(p) => p,
                Err(e) => {
                    drop(book);
                    if let Some(id) = watch {
                        self.bound.unsubscribe(id);
                    }
                    return Err(e);
                }
            };
            let watch = match (&pin, watch) {
                (RegionPin::LongTerm(_), w) => w,
                (RegionPin::Locked, w) => {
                    unwatch = w;
                    None
                }
            };
            self.counters.add_pinned(pinned);
            book.held[idx] = Some(HeldPages {
                pin,
                watch,
                detached: None,
            });
        }
        tpt.publish(Translation {
            key,
            base: addr,
            len,
            access,
            alias: 0,
        });
        let info = RegionInfo {
            addr,
            len,
            lkey: key,
            rkey: key,
            access,
        };
        book.regions[idx] = Some(info);
        drop(book);
        if let Some(id) = unwatch {
            self.bound.unsubscribe(id);
        }
        self.counters
            .record_registration(true, sys::monotonic_ns().saturating_sub(t0));
        Ok(info)
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
        self.inner
            .engine
            .lock()
            .create_qp(peer, send_cq, recv_cq, caps)
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
        self.inner.own.note_app_in_nic(false);
        n.ok_or_else(|| Error::InvalidArgument(format!("no completion queue {cq}")))
    }

    fn pinning(&self) -> String {
        self.describe_pinning()
    }

    fn counters(&self) -> CountersSnapshot {
        let mut s = self.inner.counters.snapshot();
        s.invalidated_pages += self.inner.watch.invalidated_pages();
        s.syscalls = sys::syscalls_made();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cma_ptracer_is_the_parent_only_where_yama_needs_one() {
        // Siblings under Yama scope 1 name their parent (pwrun, mpirun's proxy).
        assert_eq!(cma_ptracer(4, Some(1), 4242), Some(4242));
        // A single rank has no peer to admit.
        assert_eq!(cma_ptracer(1, Some(1), 4242), None);
        // No Yama, classic scope, admin-only or no ptrace at all: naming changes nothing.
        for scope in [None, Some(0), Some(2), Some(3)] {
            assert_eq!(cma_ptracer(4, scope, 4242), None, "{scope:?}");
        }
        // An orphan would admit every process by naming init.
        assert_eq!(cma_ptracer(4, Some(1), 1), None);
        assert_eq!(cma_ptracer(4, Some(1), 0), None);
    }

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
