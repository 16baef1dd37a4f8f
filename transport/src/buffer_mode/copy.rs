//! The `copy` buffer mode: every payload goes through a pinned bounce pool sized at
//! start-up, and large messages are pipelined in chunks so that copying one chunk overlaps
//! moving another (MVAPICH's R3; Lesokhin17 "copying"). The only mode whose pinned footprint is
//! fixed and independent of the application.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{BufferMode, Direction, Lease, ModeCounters, Pipeline, Transfer};
use super::{UserBuf, UserBufMut};
use crate::error::{Error, Result};
use crate::nic::{Access, Nic};
use crate::sys::AnonMapping;
use crate::sys::Error as SystemError;

/// Default chunk of the pipeline (bytes). Chosen by measurement (docs/results.md, "Choosing the
/// defaults"): 512 KiB chunks streamed 0.5-2 MiB messages at about twice the bandwidth of
/// 64-256 KiB chunks; with 8 slots the pool pins 4 MiB, which with the eager slots stays
/// under a default 8 MiB RLIMIT_MEMLOCK up to 8 ranks.
pub const DEFAULT_CHUNK: usize = 512 << 10;
/// Default number of chunks in flight per transfer and side.
pub const DEFAULT_DEPTH: usize = 4;
/// Default number of chunk slots in the pool (shared by all transfers).
pub const DEFAULT_SLOTS: usize = 8;

/// Sizes of the bounce pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyConfig {
    /// Bytes per chunk slot (`PAGEWIRE_COPY_CHUNK`).
    pub chunk: usize,
    /// Chunks in flight per transfer and side (`PAGEWIRE_COPY_DEPTH`).
    pub depth: usize,
    /// Slots in the pool (`PAGEWIRE_COPY_SLOTS`).
    pub slots: usize,
}

impl Default for CopyConfig {
    fn default() -> Self {
        CopyConfig {
            chunk: DEFAULT_CHUNK,
            depth: DEFAULT_DEPTH,
            slots: DEFAULT_SLOTS,
        }
    }
}

impl CopyConfig {
    /// Reads `PAGEWIRE_COPY_CHUNK`, `PAGEWIRE_COPY_DEPTH` and `PAGEWIRE_COPY_SLOTS`.
    pub fn from_env() -> Result<CopyConfig> {
        let mut c = CopyConfig::default();
        // Each value below its minimum is the setting's error (the defaults are above them).
        let at_least = |variable: &str, min: usize, accepted: &str| -> Result<Option<usize>> {
            match crate::env::bytes(variable)? {
                Some(v) if v < min => Err(Error::invalid_setting(variable, v, accepted)),
                v => Ok(v),
            }
        };
        if let Some(v) = at_least("PAGEWIRE_COPY_CHUNK", 4096, "expected bytes, at least 4K")? {
            c.chunk = v;
        }
        if let Some(v) = at_least("PAGEWIRE_COPY_DEPTH", 1, "expected at least 1")? {
            c.depth = v;
        }
        if let Some(v) = at_least("PAGEWIRE_COPY_SLOTS", 2, "expected at least 2")? {
            c.slots = v;
        }
        Ok(c)
    }
}

fn half(dir: Direction) -> usize {
    match dir {
        Direction::Source => 0,
        Direction::Sink => 1,
    }
}

/// The copy mode: a pinned pool of chunk slots.
#[derive(Debug)]
pub struct CopyMode {
    config: CopyConfig,
    pool: Option<AnonMapping>,
    key: u32,
    /// Free source slots (the first half of the pool) and sink slots (the second half).
    free: [Vec<usize>; 2],
    leases: u64,
    waits: u64,
    on_demand: bool,
    copied: AtomicU64,
}

impl CopyMode {
    /// A copy mode with the given pool sizes (the pool is registered at `start`).
    pub fn new(config: CopyConfig) -> CopyMode {
        CopyMode {
            config,
            pool: None,
            key: 0,
            free: [
                (0..config.slots / 2).rev().collect(),
                (config.slots / 2..config.slots).rev().collect(),
            ],
            leases: 0,
            waits: 0,
            on_demand: false,
            copied: AtomicU64::new(0),
        }
    }

    /// The plan of every copy-mode transfer: chunks of the pool's slot size.
    pub fn transfer(&self) -> Transfer {
        Transfer {
            pipeline: Pipeline {
                chunk: self.config.chunk,
                depth: self.config.depth,
            },
            zero_copy: false,
            token: 0,
        }
    }

    fn slot_addr(&self, slot: usize) -> u64 {
        self.pool.as_ref().expect("started").addr() + (slot * self.config.chunk) as u64
    }
}

impl BufferMode for CopyMode {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn is_zero_copy(&self) -> bool {
        false
    }

    /// Registers the pool pinned. If it does not fit the locked-memory limit, the pool
    /// shrinks (fewer slots, down to 2, then smaller chunks, down to 16 KiB) until it does;
    /// if even that fails and the NIC has on-demand paging, the smallest pool is registered
    /// ODP and prefetched. Either way a line on stderr says what the pool became.
    fn start(&mut self, nic: &dyn Nic) -> Result<()> {
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let wanted = self.config;
        loop {
            let bytes = self.config.chunk * self.config.slots;
            let mut pool = AnonMapping::new(bytes)
                .map_err(|e| Error::os(format!("mmap of the {bytes}-byte bounce pool"), e))?;
            // On this rank's NUMA node, before the first touch (feature `hwloc`).
            crate::boot::binding::place_local(&pool);
            pool.as_mut_slice().fill(0);
            match nic.register(pool.addr(), pool.len() as u64, access) {
                Ok(r) => {
                    self.key = r.lkey;
                    self.pool = Some(pool);
                    break;
                }
                Err(SystemError::MemlockLimit { .. })
                    if self.config.slots > 2 || self.config.chunk > 16 << 10 =>
                {
                    if self.config.slots > 2 {
                        self.config.slots /= 2;
                    } else {
                        self.config.chunk /= 2;
                    }
                }
                Err(SystemError::MemlockLimit { .. }) if nic.capabilities().odp_rc => {
                    self.key = super::register_prefetched(nic, &pool, access)?;
                    self.pool = Some(pool);
                    self.on_demand = true;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if self.config != wanted || self.on_demand {
            eprintln!(
                "pagewire: copy mode: the {}-byte bounce pool does not fit the locked-memory limit; using {} slots of {} bytes{}",
                wanted.chunk * wanted.slots,
                self.config.slots,
                self.config.chunk,
                if self.on_demand { ", registered on demand (not pinned)" } else { "" }
            );
            self.free = [
                (0..self.config.slots / 2).rev().collect(),
                (self.config.slots / 2..self.config.slots).rev().collect(),
            ];
        }
        Ok(())
    }

    fn begin(
        &mut self,
        _nic: &dyn Nic,
        _user_addr: u64,
        _len: usize,
        _dir: Direction,
    ) -> Result<Transfer> {
        Ok(self.transfer())
    }

    fn end(&mut self, _nic: &dyn Nic, _t: Transfer) {}

    fn lease(
        &mut self,
        _nic: &dyn Nic,
        _t: &Transfer,
        _user_addr: u64,
        _offset: usize,
        len: usize,
        dir: Direction,
    ) -> Result<Option<Lease>> {
        assert!(
            len <= self.config.chunk,
            "a copy-mode lease covers at most one chunk"
        );
        let Some(slot) = self.free[half(dir)].pop() else {
            self.waits += 1;
            return Ok(None);
        };
        self.leases += 1;
        Ok(Some(Lease {
            addr: self.slot_addr(slot),
            len: len as u64,
            lkey: self.key,
            rkey: self.key,
            token: slot as u64,
        }))
    }

    fn stage_out(&mut self, lease: &Lease, user: &UserBuf, offset: usize) {
        let slot = lease.token as usize;
        let len = lease.len as usize;
        let start = slot * self.config.chunk;
        let pool = self.pool.as_mut().expect("started");
        user.read(offset, &mut pool.as_mut_slice()[start..start + len]);
        self.copied.fetch_add(len as u64, Relaxed);
    }

    fn stage_in(&mut self, lease: &Lease, user: &UserBufMut, offset: usize, len: usize) {
        let start = lease.token as usize * self.config.chunk;
        let pool = self.pool.as_ref().expect("started");
        user.write(offset, &pool.as_slice()[start..start + len]);
        self.copied.fetch_add(len as u64, Relaxed);
    }

    fn release(&mut self, _nic: &dyn Nic, lease: Lease) {
        let slot = lease.token as usize;
        let dir = if slot < self.config.slots / 2 {
            Direction::Source
        } else {
            Direction::Sink
        };
        self.free[half(dir)].push(slot);
    }

    fn counters(&self) -> ModeCounters {
        ModeCounters {
            leases: self.leases,
            bytes_copied: self.copied.load(Relaxed),
            lease_waits: self.waits,
            pinned_footprint: if self.on_demand {
                0
            } else {
                (self.config.chunk * self.config.slots) as u64
            },
            ..ModeCounters::default()
        }
    }

    fn stop(&mut self, nic: &dyn Nic) {
        if self.pool.is_some() {
            let _ = nic.deregister(self.key);
        }
        self.pool = None;
    }
}
