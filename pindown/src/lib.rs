//! The `pindown` buffer mode's core: a pin-down (registration) cache
//! (docs/architecture.md; Wyckoff05, NFS-RDMA "Buffer Registration Cache").
//!
//! User buffers are registered in place and the registrations kept for reuse, so a buffer
//! sent again costs no registration (Wyckoff05 Fig. 1: registering around every transfer
//! halves bandwidth). The cache is:
//!
//! - an interval index of page-aligned registrations: a buffer inside a cached registration
//!   is a hit; overlapping unused registrations are merged on a miss ([`cache`] documents
//!   the rule);
//! - bounded in bytes and entries ([`Limits`], by default RLIMIT_MEMLOCK minus a reserve),
//!   with an eviction [`Policy`] chosen at construction (LRU, LFU, FIFO, size-aware);
//! - lazy: a released registration stays pinned until evicted, invalidated or dropped;
//! - safe under memory changes: [`PinDownCache::invalidate`] drops every registration over
//!   a changed range, unpinning unused ones at once and in-use ones at their last release
//!   (Wyckoff05 section VII: pinned pages must not outlive their mapping);
//! - never the reason a send fails: when nothing fits it answers [`Acquire::Fallback`] and
//!   the caller copies.
//!
//! It is generic over a [`Registrar`] (UCX's rcache is generic over its callbacks, STYLE.md)
//! and knows nothing of the memory monitor that calls `invalidate` (libfabric keeps its MR
//! cache apart from its monitors the same way). [`NicRegistrar`] registers through a
//! [`pagewire_transport::nic::Nic`]; [`SharedPinDownCache`] shares a cache with a monitor's
//! thread.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cache;
pub mod error;
pub mod interval;
pub mod limits;
pub mod mode;
pub mod monitored;
pub mod policy;
pub mod registrar;
pub mod shared;
pub mod strategy;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod fake;

/// Environment variables for `from_lookup` in unit tests: `pairs` as a lookup function.
#[cfg(test)]
pub(crate) fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

pub use cache::{Acquire, CacheCounters, LeaseHandle, PinDownCache, PinLease};
pub use error::{Error, Result};
pub use interval::Span;
pub use limits::{CacheConfig, Limits};
pub use mode::PindownMode;
pub use monitored::MonitoredRegistrar;
pub use policy::Policy;
pub use registrar::{
    BoxError, NicRef, NicRegistrar, RegisterError, Registrar, Registration, REGISTRATION_ACCESS,
};
pub use shared::{SharedPinDownCache, WeakPinDownCache};
pub use strategy::{KeyPool, Strategy};
