//! Registration strategies of the `pindown` mode (NFS-RDMA §3.2, §8):
//! how a user buffer gets a registration for one transfer.
//!
//! - `cache` (the default): the pin-down cache ([`crate::PinDownCache`]), NFS-RDMA's "buffer
//!   registration cache" and Wyckoff05's subject: registrations kept and reused.
//! - `per-op`: register before and deregister after every transfer, NFS-RDMA's baseline
//!   ("the transport has to register the buffer and deregister the buffer on every
//!   operation").
//! - `key-pool`: Fast Memory Registration as the Mellanox FMR pool does it (NFS-RDMA §3.2):
//!   each transfer still pins its buffer and fills a table entry, but a deregistration only
//!   queues the entry; when the queue reaches the *dirty watermark* the whole batch is
//!   invalidated at once. On the soft NIC, allocating a table entry is a store in shared
//!   memory with no device command to wait for, so FMR's other saving, keys allocated at
//!   start-up, has nothing to save here; what this strategy keeps is the batched, deferred
//!   invalidation — and its cost, NFS-RDMA's "window of vulnerability": until the batch is
//!   flushed, a queued registration still answers its key and keeps its pages pinned.
//!
//! NFS-RDMA's fourth strategy, *all-physical* registration (every physical page registered
//! once at start-up, so a transfer only translates addresses), has no user-space
//! equivalent: a process cannot pin memory it has not mapped yet. Its per-transfer cost —
//! a lookup, no registration — is what the `cache` strategy costs once every buffer is
//! registered, with the memlock limit lifted (the benchmarks' "pindown-hpc").

use pagewire_transport::nic::{Access, Nic, RegionInfo};
use pagewire_transport::sys::Error as SystemError;
use pagewire_transport::{Error as TransportError, Result};

/// The dirty watermark of the `key-pool` strategy unless `PAGEWIRE_PINDOWN_POOL_DIRTY` says
/// otherwise: the Linux kernel's FMR pools for NFS/RDMA and iSER flushed at 32 dirty
/// entries.
pub const DEFAULT_DIRTY_WATERMARK: usize = 32;

/// How a transfer's buffer gets its registration (`PAGEWIRE_PINDOWN_STRATEGY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// The pin-down cache (`cache`).
    #[default]
    Cache,
    /// Register before, deregister after each transfer (`per-op`).
    PerOperation,
    /// FMR-style: per-transfer registration, deregistration queued and flushed in batches
    /// of `dirty_watermark` (`key-pool`).
    KeyPool {
        /// Queued deregistrations that trigger a flush.
        dirty_watermark: usize,
    },
}

impl Strategy {
    /// Reads `PAGEWIRE_PINDOWN_STRATEGY` (`cache`, `per-op`, `key-pool`) and, for
    /// `key-pool`, `PAGEWIRE_PINDOWN_POOL_DIRTY` (a count, default 32).
    pub fn from_env() -> Result<Strategy> {
        Strategy::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Strategy::from_env`], reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Strategy> {
        match lookup("PAGEWIRE_PINDOWN_STRATEGY")
            .as_deref()
            .map(str::trim)
        {
            None | Some("") | Some("cache") => Ok(Strategy::Cache),
            Some("per-op") => Ok(Strategy::PerOperation),
            Some("key-pool") => {
                let dirty_watermark = match lookup("PAGEWIRE_PINDOWN_POOL_DIRTY") {
                    None => DEFAULT_DIRTY_WATERMARK,
                    Some(v) => v
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| {
                            TransportError::invalid_setting(
                                "PAGEWIRE_PINDOWN_POOL_DIRTY",
                                &v,
                                "expected a count of at least 1",
                            )
                        })?,
                };
                Ok(Strategy::KeyPool { dirty_watermark })
            }
            Some(other) => Err(TransportError::invalid_setting(
                "PAGEWIRE_PINDOWN_STRATEGY",
                other,
                "expected cache, per-op or key-pool",
            )),
        }
    }

    /// The strategy as reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Cache => "cache",
            Strategy::PerOperation => "per-op",
            Strategy::KeyPool { .. } => "key-pool",
        }
    }
}

/// What the key pool has done, for the mode's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyPoolCounters {
    /// Registrations taken (one per transfer).
    pub registrations: u64,
    /// Batches flushed.
    pub flushes: u64,
    /// Registrations deregistered by flushes.
    pub deregistered: u64,
    /// Transfers the memlock limit refused even after a flush (they copied instead).
    pub fallbacks: u64,
    /// Bytes registered now (in use or queued).
    pub bytes_now: u64,
    /// Most bytes registered at once.
    pub bytes_peak: u64,
}

/// The `key-pool` strategy's registrations: those of transfers in flight, and the queue of
/// finished ones waiting for the next flush.
#[derive(Debug)]
pub struct KeyPool {
    dirty_watermark: usize,
    /// Transfers in flight: (token, region).
    live: Vec<(u64, RegionInfo)>,
    /// Finished transfers' regions, deregistered at the next flush.
    dirty: Vec<RegionInfo>,
    next_token: u64,
    counters: KeyPoolCounters,
}

impl KeyPool {
    /// A pool that flushes at `dirty_watermark` queued deregistrations.
    pub fn new(dirty_watermark: usize) -> KeyPool {
        KeyPool {
            dirty_watermark: dirty_watermark.max(1),
            live: Vec::new(),
            dirty: Vec::new(),
            next_token: 0,
            counters: KeyPoolCounters::default(),
        }
    }

    /// Registers `[addr, addr+len)` for one transfer and returns its token and keys.
    /// `Ok(None)` when the memlock limit refuses it even after flushing the queue (the
    /// caller copies instead).
    pub fn register(
        &mut self,
        nic: &dyn Nic,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<(u64, RegionInfo)>> {
        let info = match nic.register(addr, len, access) {
            Ok(info) => info,
            Err(SystemError::MemlockLimit { .. }) if !self.dirty.is_empty() => {
                self.flush(nic);
                match nic.register(addr, len, access) {
                    Ok(info) => info,
                    Err(SystemError::MemlockLimit { .. }) => {
                        self.counters.fallbacks += 1;
                        return Ok(None);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(SystemError::MemlockLimit { .. }) => {
                self.counters.fallbacks += 1;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        self.next_token += 1;
        let token = self.next_token;
        self.live.push((token, info));
        self.counters.registrations += 1;
        self.counters.bytes_now += info.len;
        self.counters.bytes_peak = self.counters.bytes_peak.max(self.counters.bytes_now);
        Ok(Some((token, info)))
    }

    /// The keys of transfer `token`, while it is in flight.
    pub fn keys(&self, token: u64) -> Option<RegionInfo> {
        self.live.iter().find(|(t, _)| *t == token).map(|(_, r)| *r)
    }

    /// Transfer `token` is over: its registration joins the queue, and a full queue is
    /// flushed.
    pub fn finish(&mut self, nic: &dyn Nic, token: u64) {
        if let Some(i) = self.live.iter().position(|(t, _)| *t == token) {
            let (_, info) = self.live.swap_remove(i);
            self.dirty.push(info);
        }
        if self.dirty.len() >= self.dirty_watermark {
            self.flush(nic);
        }
    }

    /// Deregisters every queued registration.
    pub fn flush(&mut self, nic: &dyn Nic) {
        if self.dirty.is_empty() {
            return;
        }
        self.counters.flushes += 1;
        for info in self.dirty.drain(..) {
            let _ = nic.deregister(info.lkey);
            self.counters.deregistered += 1;
            self.counters.bytes_now -= info.len;
        }
    }

    /// Registrations queued for the next flush.
    pub fn dirty(&self) -> usize {
        self.dirty.len()
    }

    /// What the pool has done.
    pub fn counters(&self) -> KeyPoolCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::env_of as lookup;

    #[test]
    fn strategies_parse_and_bad_values_say_what_is_accepted() {
        assert_eq!(Strategy::from_lookup(lookup(&[])).unwrap(), Strategy::Cache);
        assert_eq!(
            Strategy::from_lookup(lookup(&[("PAGEWIRE_PINDOWN_STRATEGY", "per-op")])).unwrap(),
            Strategy::PerOperation
        );
        assert_eq!(
            Strategy::from_lookup(lookup(&[("PAGEWIRE_PINDOWN_STRATEGY", "key-pool")])).unwrap(),
            Strategy::KeyPool {
                dirty_watermark: DEFAULT_DIRTY_WATERMARK
            }
        );
        assert_eq!(
            Strategy::from_lookup(lookup(&[
                ("PAGEWIRE_PINDOWN_STRATEGY", "key-pool"),
                ("PAGEWIRE_PINDOWN_POOL_DIRTY", "4")
            ]))
            .unwrap(),
            Strategy::KeyPool { dirty_watermark: 4 }
        );
        let e = Strategy::from_lookup(lookup(&[("PAGEWIRE_PINDOWN_STRATEGY", "fmr")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PAGEWIRE_PINDOWN_STRATEGY=fmr") && e.contains("key-pool"),
            "{e}"
        );
        let e = Strategy::from_lookup(lookup(&[
            ("PAGEWIRE_PINDOWN_STRATEGY", "key-pool"),
            ("PAGEWIRE_PINDOWN_POOL_DIRTY", "0"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("PAGEWIRE_PINDOWN_POOL_DIRTY=0"), "{e}");
    }
}
