//! One rank's shared NIC memory and its layout: the header words peers read and write, the
//! pending bitmap, the translation table, the responder-fault slots, the acknowledgement
//! lines, the translation cache and its miss slots, and the inbound rings.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU32, AtomicU64};

use pagewire_boot::shm_prefix;
use pagewire_sys::error::{Error, Result};
use pagewire_sys::{self as sys, SharedSegment};

use crate::ack::{AckLine, ACK_LINE_BYTES, ACK_WORDS};
use crate::inbox::PendingBits;
use crate::present::{PresentBits, PRESENT_BYTES};
use crate::ring::{self, RING_BYTES};
use crate::tpt::{Tpt, TPT_BYTES};
use crate::tpt_cache::{self, MissSide, TranslationCache};

/// Queue pairs per NIC.
pub(crate) const MAX_QPS: usize = 256;
/// Ranks a job may have (one pending bit each, [`crate::inbox`]).
pub(super) const MAX_RANKS: usize = 8 * PENDING_BYTES;
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"pagewire");
pub(super) const HEADER_BYTES: usize = 4096;
/// Header word (32-bit): the driver thread's futex, bumped to wake it.
pub(super) const DOORBELL: usize = 64;
/// Header word counting faults filed on this rank's memory (by peers and itself).
pub(super) const FAULTS_FILED: usize = 128;
/// Header word: 1 when this rank's memory monitor keeps its present bits true, 0 when
/// initiators must check its pagemap.
pub(super) const ODP_MONITORED: usize = 192;
/// Header word: 1 while the driver thread sleeps (or is about to): peers wake it only then.
pub(super) const DRIVER_ASLEEP: usize = 256;
/// Header word: how many times the application has polled (a heartbeat peers read to tell
/// whether it is polling before they wake its driver).
pub(super) const APP_POLLS: usize = 320;
/// Header word: non-zero while an application thread is inside the NIC (posting or
/// polling, a long DMA included): it is not idle, so peers do not wake its driver.
pub(super) const APP_IN_NIC: usize = 384;
/// Header word: the entry of another rank's table this rank's engine holds now
/// ([`crate::tpt::claim_tag`]), 0 when none; read by that rank when it deregisters.
pub(super) const REMOTE_CLAIM: usize = 448;

pub(super) const PENDING_OFFSET: usize = HEADER_BYTES;
pub(super) const PENDING_BYTES: usize = 4096;
pub(super) const TPT_OFFSET: usize = PENDING_OFFSET + PENDING_BYTES;
pub(super) const NPF_OFFSET: usize = TPT_OFFSET + TPT_BYTES;
pub(super) const NPF_WORDS: usize = 8;
pub(super) const ACK_OFFSET: usize = NPF_OFFSET + MAX_QPS * NPF_WORDS * 8;
pub(super) const TPT_CACHE_OFFSET: usize = ACK_OFFSET + MAX_QPS * ACK_LINE_BYTES;
pub(super) const MISS_OFFSET: usize = TPT_CACHE_OFFSET + tpt_cache::CACHE_WORDS * 8;
pub(super) const RINGS_OFFSET: usize = MISS_OFFSET + tpt_cache::MISS_SLOTS * NPF_WORDS * 8;

/// One rank's shared NIC memory: header, TPT, NPF slots, inbound rings, present bitmap.
pub(crate) struct RankMemory {
    pub(super) seg: SharedSegment,
    pub(super) present: SharedSegment,
    /// Ranks in the job (bounds the pending bitmap).
    pub(super) size: usize,
}

impl RankMemory {
    pub(super) fn names(job: &str, rank: usize) -> (String, String) {
        let p = shm_prefix(job);
        (format!("{p}nic-{rank}"), format!("{p}odp-{rank}"))
    }

    pub(super) fn create(job: &str, rank: usize, size: usize) -> Result<RankMemory> {
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

    pub(super) fn open(job: &str, rank: usize) -> Result<RankMemory> {
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

    /// The local image of rank `rank` of a job of `size`, a peer on another host reached by
    /// TCP (`tcp/`): memory of this process only, laid out as a segment, in which the
    /// engine finds what it would find in a local peer's segment. Its ring from this rank is
    /// the TCP link's send queue; its fault slots hold the outcomes the peer reports; the
    /// rest stays zero (no TPT to read: a remote peer's keys are checked by the peer).
    pub(super) fn local_image(rank: usize, size: usize) -> Result<RankMemory> {
        let what = format!("local image of rank {rank}");
        let seg = SharedSegment::anonymous(RINGS_OFFSET + size * RING_BYTES, &what)?;
        let present = SharedSegment::anonymous(PRESENT_BYTES, &what)?;
        let h = seg.words(0, 4);
        h[2].store(rank as u64, Relaxed);
        h[3].store(size as u64, Relaxed);
        h[0].store(MAGIC, Release);
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
    pub(super) fn note_app_poll(&self) {
        let w = &self.seg.words(APP_POLLS, 1)[0];
        w.store(w.load(Relaxed) + 1, Relaxed);
    }

    /// Whether an application thread of this rank is inside its NIC now.
    pub(crate) fn app_in_nic(&self) -> bool {
        self.seg.words(APP_IN_NIC, 1)[0].load(Relaxed) != 0
    }

    /// The owner: an application thread enters (`true`) or leaves its NIC.
    pub(super) fn note_app_in_nic(&self, inside: bool) {
        self.seg.words(APP_IN_NIC, 1)[0].store(inside as u64, Relaxed);
    }

    /// This rank's claim word ([`REMOTE_CLAIM`]).
    pub(crate) fn remote_claim(&self) -> &AtomicU64 {
        &self.seg.words(REMOTE_CLAIM, 1)[0]
    }

    pub(super) fn asleep_word(&self) -> &AtomicU64 {
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

    /// This rank's translation cache (off unless `PAGEWIRE_SOFT_TPT_CACHE` is set).
    pub(crate) fn tpt_cache(&self) -> TranslationCache<'_> {
        TranslationCache::new(self.seg.words(TPT_CACHE_OFFSET, tpt_cache::CACHE_WORDS))
    }

    /// The slot in which translation-cache misses of queue pair `qpn` on `side` are filed
    /// for this rank's driver: the responder-fault slot's shape, the key in its address word.
    pub(crate) fn miss_slot(&self, qpn: u32, side: MissSide) -> NpfSlot<'_> {
        self.miss_slot_at(tpt_cache::miss_slot_index(qpn, side))
    }

    /// Miss slot `i` (of [`tpt_cache::MISS_SLOTS`]).
    pub(crate) fn miss_slot_at(&self, i: usize) -> NpfSlot<'_> {
        NpfSlot {
            w: self.seg.words(MISS_OFFSET + i * NPF_WORDS * 8, NPF_WORDS),
            filed: self.tpt_cache().filed_word(),
        }
    }

    /// Whether this rank's memory monitor keeps its present bits true.
    pub(crate) fn odp_monitored(&self) -> bool {
        self.seg.words(ODP_MONITORED, 1)[0].load(Acquire) == 1
    }

    pub(super) fn faults_filed(&self) -> u64 {
        self.seg.words(FAULTS_FILED, 1)[0].load(Acquire)
    }

    pub(super) fn doorbell(&self) -> &AtomicU32 {
        self.seg.word32(DOORBELL)
    }

    /// Wakes this rank's driver thread, asleep or not.
    pub(crate) fn ring_doorbell(&self) {
        self.doorbell().fetch_add(1, SeqCst);
        sys::futex_wake(self.doorbell());
    }
}

/// The responder-fault slot of one queue pair in the owner's segment: at most one
/// outstanding fault per queue pair and direction (ODP13).
pub(crate) struct NpfSlot<'a> {
    pub(super) w: &'a [AtomicU64],
    pub(super) filed: &'a AtomicU64,
}

pub(super) const NPF_REQ: usize = 0;
pub(super) const NPF_DONE: usize = 1;
pub(super) const NPF_ADDR: usize = 2;
pub(super) const NPF_LEN: usize = 3;
pub(super) const NPF_WRITE: usize = 4;
pub(super) const NPF_STATUS: usize = 5;
pub(super) const NPF_TIME: usize = 6;

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

    /// Records that fault `seq` was handled (`resolved`: the pages are mapped now), as the
    /// owner's driver does; for the image of a peer on another host, from its report.
    pub(crate) fn record_outcome(&self, seq: u64, resolved: bool) {
        if self.w[NPF_DONE].load(Acquire) < seq {
            self.w[NPF_STATUS].store(!resolved as u64, Relaxed);
            self.w[NPF_DONE].store(seq, Release);
        }
    }

    /// `Some(resolved)` once fault `seq` has been handled.
    pub(crate) fn outcome(&self, seq: u64) -> Option<bool> {
        (self.w[NPF_DONE].load(Acquire) >= seq).then(|| self.w[NPF_STATUS].load(Relaxed) == 0)
    }
}
