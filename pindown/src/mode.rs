//! The `pindown` buffer mode: user buffers registered in place and kept in a
//! [`PinDownCache`](crate::PinDownCache) (docs/architecture.md; Wyckoff05; Lesokhin17 "pinning").
//!
//! A transfer leases the registration covering its whole buffer (one chunk, zero-copy).
//! When the cache cannot register the buffer even after evicting everything unused, the
//! transfer falls back to copying through a small pinned bounce pool (counted in
//! `fallbacks`); a send never fails for lack of pinnable memory.
//!
//! Correctness needs invalidations: a cached registration over memory that was unmapped or
//! remapped must never be used again (Wyckoff05). Every registration is watched by the
//! memory monitor (`transport::memmon`, chosen by `PAGEWIRE_MEMMON`), whose sink invalidates
//! the cache; before each lookup the mode flushes the monitor, so every change that
//! returned to the application before the transfer began has reached the cache (the
//! monitor's contract). When no monitor works (`PAGEWIRE_MEMMON=none`, or userfaultfd is
//! not permitted) or a range cannot be watched (System V shared memory), registrations are
//! not kept between transfers: slower, never stale.
//!
//! **Expert switch, unsafe:** `PAGEWIRE_PINDOWN_INVALIDATE=off` keeps every registration
//! cached and ignores the monitor, as MPI libraries run that rely on malloc hooks they do
//! not have, or `leave_pinned` without MMU notifiers (Wyckoff05 §II-III). A buffer freed and
//! reallocated at the same address then reuses the stale registration, which stays bound to
//! the old pages: old bytes are sent and received bytes vanish. It exists to
//! measure what invalidation costs and to show that the tests can see the failure.
//!
//! **Registration strategies** (`PAGEWIRE_PINDOWN_STRATEGY`, [`crate::strategy`]): the
//! cache above (`cache`, the default), a registration per transfer (`per-op`), or an
//! FMR-style pool that defers and batches deregistration (`key-pool`), NFS-RDMA's
//! strategies side by side.

use std::sync::Arc;

use pagewire_transport::buffer_mode::copy::{CopyConfig, CopyMode};
use pagewire_transport::buffer_mode::{
    BufferMode, Direction, Lease, ModeCounters, Pipeline, Transfer,
};
use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::nic::Nic;
use pagewire_transport::sys::Error as SystemError;
use pagewire_transport::{Error as TransportError, Result};

use pagewire_transport::memmon::{self, Cause, MemoryMonitor};

use crate::registrar::REGISTRATION_ACCESS;
use crate::strategy::{KeyPool, Strategy};
use crate::{
    Acquire, CacheConfig, LeaseHandle, MonitoredRegistrar, NicRegistrar, RegisterError,
    SharedPinDownCache,
};

/// The cache as the mode keeps it: watched registrations through a shared handle on the NIC.
pub type NicCache = SharedPinDownCache<MonitoredRegistrar<Arc<dyn Nic>>>;

/// Where the monitor's sink finds the cache (filled in once the cache exists).
type WeakCache = crate::WeakPinDownCache<MonitoredRegistrar<Arc<dyn Nic>>>;

/// Marks transfers served by the fallback pool (a transfer's token is otherwise its cache
/// lease handle).
const FALLBACK: u64 = 1 << 63;
/// Marks leases of a registered user buffer (a lease's token is otherwise a bounce slot).
const IN_PLACE: u64 = 1 << 62;
/// Marks transfers registered by the `key-pool` strategy (the rest of the token is the
/// pool's).
const POOL: u64 = 1 << 61;

/// The `pindown` mode.
pub struct PindownMode {
    config: Option<CacheConfig>,
    cache: Option<NicCache>,
    fallback: CopyMode,
    monitor: Option<Arc<dyn MemoryMonitor>>,
    /// Registrations are kept between transfers only when invalidations are delivered.
    caching: bool,
    /// Whether the monitor's invalidations reach the cache (`PAGEWIRE_PINDOWN_INVALIDATE`;
    /// `None`: read at attach).
    invalidate: Option<bool>,
    /// How a transfer gets its registration (`PAGEWIRE_PINDOWN_STRATEGY`; `None`: read at
    /// attach).
    strategy: Option<Strategy>,
    /// The `key-pool` strategy's registrations.
    pool: Option<KeyPool>,
}

/// The locked-memory limit the cache sizes itself by (`None`: unlimited):
/// `PAGEWIRE_MEMLOCK_LIMIT` when set (the soft NIC's account follows it too), else
/// RLIMIT_MEMLOCK. A value that is not a byte count is an error, on every provider.
pub fn memlock_limit_from_env() -> Result<Option<u64>> {
    match std::env::var("PAGEWIRE_MEMLOCK_LIMIT") {
        Err(_) => Ok(pagewire_transport::sys::memlock_rlimit()),
        Ok(v) => pagewire_transport::nic::soft::parse_bytes(&v).ok_or_else(|| {
            TransportError::invalid_setting(
                "PAGEWIRE_MEMLOCK_LIMIT",
                v,
                "expected bytes like 65536, 64K, 8M, 1G or unlimited",
            )
        }),
    }
}

/// Parses `PAGEWIRE_PINDOWN_INVALIDATE` (`on`, the default, or `off`).
pub fn invalidation_from_env() -> Result<bool> {
    match std::env::var("PAGEWIRE_PINDOWN_INVALIDATE")
        .as_deref()
        .map(str::trim)
    {
        Err(_) | Ok("") | Ok("on") => Ok(true),
        Ok("off") => Ok(false),
        Ok(other) => Err(TransportError::invalid_setting(
            "PAGEWIRE_PINDOWN_INVALIDATE",
            other,
            "expected on or off (off is unsafe: stale registrations are reused)",
        )),
    }
}

impl std::fmt::Debug for PindownMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PindownMode")
            .field("caching", &self.caching)
            .finish()
    }
}

impl PindownMode {
    /// A mode whose cache settings come from the environment at start-up
    /// (`PAGEWIRE_PINDOWN_POLICY`, `PAGEWIRE_PINDOWN_MAX_BYTES`, `..._MAX_ENTRIES`; the byte
    /// limit defaults to RLIMIT_MEMLOCK minus what is pinned when the mode starts). Without
    /// a memory monitor it does not cache between transfers.
    pub fn new() -> PindownMode {
        PindownMode {
            config: None,
            cache: None,
            fallback: CopyMode::new(CopyConfig {
                chunk: 256 << 10,
                depth: 2,
                slots: 4,
            }),
            monitor: None,
            caching: false,
            invalidate: None,
            strategy: None,
            pool: None,
        }
    }

    /// Uses `strategy` instead of `PAGEWIRE_PINDOWN_STRATEGY`.
    pub fn with_strategy(mut self, strategy: Strategy) -> PindownMode {
        self.strategy = Some(strategy);
        self
    }

    /// The registration strategy (the default before attach).
    pub fn strategy(&self) -> Strategy {
        self.strategy.unwrap_or_default()
    }

    /// Delivers (`true`, the default) or ignores the memory monitor's invalidations; `false`
    /// is unsafe (see the module docs) and overrides `PAGEWIRE_PINDOWN_INVALIDATE`.
    pub fn with_invalidation(mut self, on: bool) -> PindownMode {
        self.invalidate = Some(on);
        self
    }

    /// Whether invalidations reach the cache.
    pub fn invalidates(&self) -> bool {
        self.invalidate != Some(false)
    }

    /// The memory monitor, once attached (for reports).
    pub fn monitor(&self) -> Option<&Arc<dyn MemoryMonitor>> {
        self.monitor.as_ref()
    }

    /// Whether registrations are kept between transfers.
    pub fn is_caching(&self) -> bool {
        self.caching
    }

    /// Uses `config` instead of the environment.
    pub fn with_config(mut self, config: CacheConfig) -> PindownMode {
        self.config = Some(config);
        self
    }

    /// The cache, once started (to subscribe it to a memory monitor, or for reports).
    pub fn cache(&self) -> Option<&NicCache> {
        self.cache.as_ref()
    }
}

impl Default for PindownMode {
    fn default() -> Self {
        Self::new()
    }
}

/// The cache's error as the message layer reports it: an unmapped range and the NIC's own
/// errors as themselves, anything else as this mode's typed error.
fn cache_err(e: crate::Error) -> TransportError {
    match e {
        crate::Error::Register(RegisterError::NotMapped { addr, len }) => {
            SystemError::UnmappedRange { addr, len }.into()
        }
        crate::Error::Register(RegisterError::Other(b) | RegisterError::NoResources(b)) => {
            match b.downcast::<SystemError>() {
                Ok(nic) => (*nic).into(),
                Err(b) => TransportError::BufferMode {
                    mode: "pindown",
                    source: b,
                },
            }
        }
        other => TransportError::BufferMode {
            mode: "pindown",
            source: Box::new(other),
        },
    }
}

impl BufferMode for PindownMode {
    fn name(&self) -> &'static str {
        "pindown"
    }

    fn is_zero_copy(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        let Some(cache) = self.cache.as_ref() else {
            return "pindown (not attached)".into();
        };
        let (policy, limits) = {
            let c = cache.lock();
            (c.policy(), c.limits())
        };
        let bytes = if limits.max_bytes == u64::MAX {
            "unlimited".to_string()
        } else {
            format!("{:.1} MiB", limits.max_bytes as f64 / (1 << 20) as f64)
        };
        format!(
            "pindown: strategy {}, policy {policy}, limit {bytes} and {} entries, {}; memory \
             monitor: {}",
            self.strategy().name(),
            limits.max_entries,
            if !self.invalidates() {
                "caching with invalidation OFF (unsafe: stale registrations are reused)"
            } else if self.caching {
                "caching"
            } else {
                "not caching (registrations last one transfer)"
            },
            self.monitor
                .as_ref()
                .map_or_else(|| "none".to_string(), |m| m.describe()),
        )
    }

    fn attach(&mut self, nic: &Arc<dyn Nic>) {
        let invalidate = match self.invalidate {
            Some(on) => on,
            None => {
                invalidation_from_env().unwrap_or_else(|e| panic!("pagewire: pindown mode: {e}"))
            }
        };
        self.invalidate = Some(invalidate);
        let strategy = match self.strategy {
            Some(s) => s,
            None => Strategy::from_env().unwrap_or_else(|e| panic!("pagewire: pindown mode: {e}")),
        };
        self.strategy = Some(strategy);
        if let Strategy::KeyPool { dirty_watermark } = strategy {
            self.pool = Some(KeyPool::new(dirty_watermark));
        }
        // The sink reaches the cache through a weak handle: the cache's registrar keeps the
        // monitor (and so the sink) alive, and a strong handle would be a cycle.
        let slot: Arc<parking_lot::Mutex<Option<WeakCache>>> =
            Arc::new(parking_lot::Mutex::new(None));
        let sink_slot = slot.clone();
        let sink = move |addr: u64, len: u64, cause: Cause| {
            if !invalidate {
                return;
            }
            let weak = sink_slot.lock();
            if let Some(cache) = weak.as_ref().and_then(|w| w.upgrade()) {
                match cause {
                    // Everything may have moved.
                    Cause::Fork | Cause::Lost => cache.invalidate(0, u64::MAX),
                    _ => cache.invalidate(addr, len),
                };
            }
        };
        let monitor: Arc<dyn MemoryMonitor> = Arc::from(
            memmon::monitor_from_env(Arc::new(sink))
                .unwrap_or_else(|e| panic!("pagewire: pindown mode: {e}")),
        );
        // Without invalidation nothing is dropped for want of a monitor either.
        self.caching = strategy == Strategy::Cache && (monitor.is_reliable() || !invalidate);
        let registrar = MonitoredRegistrar::new(NicRegistrar::new(nic.clone()), monitor.clone());
        let reserve = nic.counters().pinned_now + (256 << 10) * 4;
        let config = self.config.unwrap_or_else(|| {
            let limit = memlock_limit_from_env()
                .unwrap_or_else(|e| panic!("pagewire: pindown mode settings: {e}"));
            CacheConfig::from_env(limit, reserve)
                .unwrap_or_else(|e| panic!("pagewire: pindown mode settings: {e}"))
        });
        let cache = SharedPinDownCache::new(crate::PinDownCache::with_config(registrar, config));
        *slot.lock() = Some(cache.downgrade());
        self.cache = Some(cache);
        self.monitor = Some(monitor);
    }

    fn start(&mut self, nic: &dyn Nic) -> Result<()> {
        if self.cache.is_none() {
            return Err(SystemError::Internal("pindown mode started without attach".into()).into());
        }
        self.fallback.start(nic)
    }

    fn begin(
        &mut self,
        nic: &dyn Nic,
        user_addr: u64,
        len: usize,
        dir: Direction,
    ) -> Result<Transfer> {
        if len == 0 {
            return Ok(Transfer {
                token: FALLBACK,
                ..self.fallback.transfer()
            });
        }
        // Every change that returned to the application before now reaches the cache first
        // (the monitor's contract: munmap may return before the callback has run). No cache
        // lock is held here: the sink takes it.
        if let Some(pool) = self.pool.as_mut() {
            return match pool.register(nic, user_addr, len as u64, REGISTRATION_ACCESS)? {
                Some((token, _)) => Ok(Transfer {
                    pipeline: Pipeline {
                        chunk: len,
                        depth: 1,
                    },
                    zero_copy: true,
                    token: POOL | token,
                }),
                None => {
                    let t = self.fallback.begin(nic, user_addr, len, dir)?;
                    Ok(Transfer {
                        token: FALLBACK,
                        ..t
                    })
                }
            };
        }
        if let Some(m) = &self.monitor {
            m.flush();
        }
        let cache = self.cache.as_ref().expect("started");
        match cache.acquire(user_addr, len as u64).map_err(cache_err)? {
            Acquire::Hit(l) | Acquire::Miss(l) => Ok(Transfer {
                pipeline: Pipeline {
                    chunk: len,
                    depth: 1,
                },
                zero_copy: true,
                token: l.handle.token(),
            }),
            Acquire::Fallback => {
                let t = self.fallback.begin(nic, user_addr, len, dir)?;
                Ok(Transfer {
                    token: FALLBACK,
                    ..t
                })
            }
        }
    }

    fn lease(
        &mut self,
        nic: &dyn Nic,
        t: &Transfer,
        user_addr: u64,
        offset: usize,
        len: usize,
        dir: Direction,
    ) -> Result<Option<Lease>> {
        if t.token == FALLBACK {
            return self.fallback.lease(nic, t, user_addr, offset, len, dir);
        }
        if t.token & POOL != 0 {
            let r = self
                .pool
                .as_ref()
                .and_then(|p| p.keys(t.token & !POOL))
                .ok_or_else(|| {
                    TransportError::from(SystemError::Internal(
                        "key-pool registration vanished during its transfer".into(),
                    ))
                })?;
            return Ok(Some(Lease {
                addr: user_addr + offset as u64,
                len: len as u64,
                lkey: r.lkey,
                rkey: r.rkey,
                token: IN_PLACE,
            }));
        }
        let cache = self.cache.as_ref().expect("started");
        let (lkey, rkey, _) = cache
            .lock()
            .keys(LeaseHandle::from_token(t.token))
            .ok_or_else(|| {
                TransportError::from(SystemError::Internal(
                    "pin-down lease vanished during its transfer".into(),
                ))
            })?;
        Ok(Some(Lease {
            addr: user_addr + offset as u64,
            len: len as u64,
            lkey,
            rkey,
            token: IN_PLACE,
        }))
    }

    fn stage_out(&mut self, lease: &Lease, user: &UserBuf, offset: usize) {
        if lease.token != IN_PLACE {
            self.fallback.stage_out(lease, user, offset);
        }
    }

    fn stage_in(&mut self, lease: &Lease, user: &UserBufMut, offset: usize, len: usize) {
        if lease.token != IN_PLACE {
            self.fallback.stage_in(lease, user, offset, len);
        }
    }

    fn release(&mut self, nic: &dyn Nic, lease: Lease) {
        if lease.token != IN_PLACE {
            self.fallback.release(nic, lease);
        }
    }

    fn end(&mut self, nic: &dyn Nic, t: Transfer) {
        if t.token == FALLBACK {
            self.fallback.end(nic, t);
            return;
        }
        if t.token & POOL != 0 {
            if let Some(pool) = self.pool.as_mut() {
                pool.finish(nic, t.token & !POOL);
            }
            return;
        }
        let cache = self.cache.as_ref().expect("started");
        let mut c = cache.lock();
        let h = LeaseHandle::from_token(t.token);
        let lease = c.lease(h);
        let _ = c.release(h);
        if let Some(l) = lease {
            let per_op = self.strategy() == Strategy::PerOperation;
            if per_op
                || (self.invalidates() && (!self.caching || !c.registrar().is_watched(l.lkey)))
            {
                // Nobody would tell us if this memory changed: do not keep it registered.
                c.invalidate(l.base, l.len);
            }
        }
    }

    fn counters(&self) -> ModeCounters {
        let f = self.fallback.counters();
        if let Some(pool) = self.pool.as_ref() {
            let p = pool.counters();
            return ModeCounters {
                leases: p.registrations,
                bytes_copied: f.bytes_copied,
                lease_waits: f.lease_waits,
                pinned_footprint: f.pinned_footprint,
                // Every transfer registers: a miss; a flushed registration: an eviction.
                misses: p.registrations,
                evictions: p.deregistered,
                fallbacks: p.fallbacks,
                registered_bytes: p.bytes_now,
                registered_peak: p.bytes_peak,
                ..ModeCounters::default()
            };
        }
        let Some(cache) = self.cache.as_ref() else {
            return f;
        };
        let c = cache.counters();
        ModeCounters {
            leases: c.hits + c.misses,
            bytes_copied: f.bytes_copied,
            lease_waits: f.lease_waits,
            pinned_footprint: f.pinned_footprint,
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
            invalidations: c.invalidations,
            fallbacks: c.fallbacks,
            registered_bytes: c.bytes_pinned,
            registered_peak: c.peak_bytes_pinned,
        }
    }

    fn stop(&mut self, nic: &dyn Nic) {
        if let Some(pool) = self.pool.as_mut() {
            pool.flush(nic);
        }
        if let Some(c) = self.cache.take() {
            c.lock().flush();
        }
        self.fallback.stop(nic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_errors_stay_typed() {
        let e = cache_err(crate::Error::Register(RegisterError::NotMapped {
            addr: 0x1000,
            len: 4096,
        }));
        assert!(matches!(
            e,
            TransportError::System(SystemError::UnmappedRange {
                addr: 0x1000,
                len: 4096
            })
        ));
        // The NIC's own error, boxed by the registrar, comes back as itself.
        let nic = SystemError::UnknownKey { key: 7 };
        let e = cache_err(crate::Error::Register(RegisterError::Other(Box::new(nic))));
        assert!(matches!(
            e,
            TransportError::System(SystemError::UnknownKey { key: 7 })
        ));
        // The cache's own error is the typed source of a BufferMode error.
        let e = cache_err(crate::Error::UnknownLease { token: 3 });
        let TransportError::BufferMode { mode, source } = e else {
            panic!("expected a BufferMode error");
        };
        assert_eq!(mode, "pindown");
        assert!(matches!(
            source.downcast_ref::<crate::Error>(),
            Some(crate::Error::UnknownLease { token: 3 })
        ));
    }
}
