//! How much the cache may keep pinned, and the configuration read from the environment.
//!
//! Static limits are what keep a registration cache from "growing endlessly, particularly in
//! the face of applications with poor buffer reuse patterns" (NFS-RDMA, "Buffer Registration
//! Cache"); the default byte limit follows RLIMIT_MEMLOCK, the limit verbs registrations are
//! charged against, minus what the rest of the rank pins (eager slots, a bounce pool).

use pagewire_transport::nic::soft::parse_bytes;

use crate::error::{Error, Result};
use crate::policy::Policy;

/// Bounds on what the cache holds, counting every live registration (cached, or kept only
/// for a transfer still in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes pinned at most (`PAGEWIRE_PINDOWN_MAX_BYTES`).
    pub max_bytes: u64,
    /// Registrations at most (`PAGEWIRE_PINDOWN_MAX_ENTRIES`).
    pub max_entries: usize,
}

impl Limits {
    /// Default entry limit: well below the memory-region tables of the soft NIC (4096 per
    /// context) and of common HCAs, which the rest of the rank also uses.
    pub const DEFAULT_MAX_ENTRIES: usize = 1024;

    /// Default byte limit when the locked-memory limit is unlimited: a cache must still be
    /// bounded (NFS-RDMA).
    pub const DEFAULT_MAX_BYTES_UNLIMITED: u64 = 1 << 30;

    /// The defaults: `memlock_limit - reserve` bytes (or
    /// [`Limits::DEFAULT_MAX_BYTES_UNLIMITED`] when `memlock_limit` is `None`, i.e.
    /// unlimited) and [`Limits::DEFAULT_MAX_ENTRIES`] entries. A reserve at or above the
    /// limit leaves 0 bytes: every acquire then falls back to copying.
    pub fn defaults(memlock_limit: Option<u64>, reserve: u64) -> Limits {
        Limits {
            max_bytes: memlock_limit.map_or(Self::DEFAULT_MAX_BYTES_UNLIMITED, |m| {
                m.saturating_sub(reserve)
            }),
            max_entries: Self::DEFAULT_MAX_ENTRIES,
        }
    }

    /// Reads `PAGEWIRE_PINDOWN_MAX_BYTES` (bytes with an optional K/M/G suffix, or
    /// `unlimited`) and `PAGEWIRE_PINDOWN_MAX_ENTRIES`; unset ones take
    /// [`Limits::defaults`]`(memlock_limit, reserve)`. `memlock_limit` is the locked-memory
    /// limit in force (RLIMIT_MEMLOCK or `PAGEWIRE_MEMLOCK_LIMIT`, `None` when unlimited);
    /// `reserve` is what the caller pins outside the cache.
    pub fn from_env(memlock_limit: Option<u64>, reserve: u64) -> Result<Limits> {
        Self::from_lookup(|k| std::env::var(k).ok(), memlock_limit, reserve)
    }

    /// Like [`Limits::from_env`], reading variables through `lookup`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        memlock_limit: Option<u64>,
        reserve: u64,
    ) -> Result<Limits> {
        let mut l = Limits::defaults(memlock_limit, reserve);
        if let Some(v) = lookup("PAGEWIRE_PINDOWN_MAX_BYTES") {
            l.max_bytes = parse_bytes(&v)
                .ok_or_else(|| Error::Config {
                    variable: "PAGEWIRE_PINDOWN_MAX_BYTES".into(),
                    value: v.clone(),
                    accepted: "expected bytes like 65536, 64K, 8M, 1G or `unlimited`".into(),
                })?
                .unwrap_or(u64::MAX);
        }
        if let Some(v) = lookup("PAGEWIRE_PINDOWN_MAX_ENTRIES") {
            l.max_entries = v.trim().parse().map_err(|_| Error::Config {
                variable: "PAGEWIRE_PINDOWN_MAX_ENTRIES".into(),
                value: v.clone(),
                accepted: "expected a number of registrations".into(),
            })?;
        }
        Ok(l)
    }
}

/// Everything the cache is built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// The eviction policy.
    pub policy: Policy,
    /// The limits.
    pub limits: Limits,
}

impl CacheConfig {
    /// Reads `PAGEWIRE_PINDOWN_POLICY`, `PAGEWIRE_PINDOWN_MAX_BYTES` and
    /// `PAGEWIRE_PINDOWN_MAX_ENTRIES` (see [`Policy::from_env`], [`Limits::from_env`]).
    pub fn from_env(memlock_limit: Option<u64>, reserve: u64) -> Result<CacheConfig> {
        Self::from_lookup(|k| std::env::var(k).ok(), memlock_limit, reserve)
    }

    /// Like [`CacheConfig::from_env`], reading variables through `lookup`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        memlock_limit: Option<u64>,
        reserve: u64,
    ) -> Result<CacheConfig> {
        Ok(CacheConfig {
            policy: Policy::from_lookup(&lookup)?,
            limits: Limits::from_lookup(&lookup, memlock_limit, reserve)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::env_of as vars;

    #[test]
    fn defaults_follow_memlock_minus_reserve() {
        let l = Limits::from_lookup(vars(&[]), Some(8 << 20), 3 << 20).unwrap();
        assert_eq!(l.max_bytes, 5 << 20);
        assert_eq!(l.max_entries, Limits::DEFAULT_MAX_ENTRIES);
        assert_eq!(Limits::defaults(Some(1 << 20), 2 << 20).max_bytes, 0);
        assert_eq!(
            Limits::defaults(None, 2 << 20).max_bytes,
            Limits::DEFAULT_MAX_BYTES_UNLIMITED
        );
    }

    #[test]
    fn variables_override_defaults() {
        let l = Limits::from_lookup(
            vars(&[
                ("PAGEWIRE_PINDOWN_MAX_BYTES", "2M"),
                ("PAGEWIRE_PINDOWN_MAX_ENTRIES", " 17 "),
            ]),
            Some(8 << 20),
            0,
        )
        .unwrap();
        assert_eq!(
            l,
            Limits {
                max_bytes: 2 << 20,
                max_entries: 17
            }
        );
        let l = Limits::from_lookup(
            vars(&[("PAGEWIRE_PINDOWN_MAX_BYTES", "unlimited")]),
            None,
            0,
        )
        .unwrap();
        assert_eq!(l.max_bytes, u64::MAX);
    }

    #[test]
    fn malformed_variables_are_named() {
        let e = Limits::from_lookup(vars(&[("PAGEWIRE_PINDOWN_MAX_BYTES", "lots")]), None, 0)
            .unwrap_err();
        assert!(
            e.to_string().contains("PAGEWIRE_PINDOWN_MAX_BYTES=lots"),
            "{e}"
        );
        let e = Limits::from_lookup(vars(&[("PAGEWIRE_PINDOWN_MAX_ENTRIES", "-1")]), None, 0)
            .unwrap_err();
        assert!(
            e.to_string().contains("PAGEWIRE_PINDOWN_MAX_ENTRIES=-1"),
            "{e}"
        );
        // Named as fields too, so the facade reports it as its InvalidSetting.
        assert!(
            matches!(&e, Error::Config { variable, value, .. }
                if variable == "PAGEWIRE_PINDOWN_MAX_ENTRIES" && value == "-1"),
            "{e:?}"
        );
    }

    #[test]
    fn config_reads_all_three() {
        let c = CacheConfig::from_lookup(
            vars(&[
                ("PAGEWIRE_PINDOWN_POLICY", "size"),
                ("PAGEWIRE_PINDOWN_MAX_ENTRIES", "8"),
            ]),
            Some(1 << 20),
            0,
        )
        .unwrap();
        assert_eq!(c.policy, Policy::SizeAware);
        assert_eq!(c.limits.max_entries, 8);
        assert_eq!(c.limits.max_bytes, 1 << 20);
    }
}
