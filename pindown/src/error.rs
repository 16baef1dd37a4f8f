//! The one error type of `pagewire-pindown`.
//!
//! Running out of pinnable memory is not an error here: the cache evicts, and when that is
//! not enough it answers [`crate::Acquire::Fallback`] so the caller copies instead
//! (a pin-down send falls back to `copy`, never fails). What remains are
//! caller mistakes (a range that wraps around, a lease released twice), a range the
//! registrar reports as not mapped, and registrar failures that are not about resources.

use crate::registrar::RegisterError;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the cache reports as an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `[addr, addr+len)` wraps around the end of the address space.
    #[error("invalid range: {len} bytes at {addr:#x} wrap around the address space")]
    InvalidRange {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },

    /// The lease was already released, or never came from this cache.
    #[error("unknown lease {token}: already released, or not from this cache")]
    UnknownLease {
        /// The lease's token.
        token: u64,
    },

    /// The registrar refused the range for a reason eviction cannot fix: it is not mapped
    /// ([`RegisterError::NotMapped`]) or the registrar failed otherwise.
    #[error("registration failed: {0}")]
    Register(#[from] RegisterError),

    /// A setting read from the environment (`PAGEWIRE_PINDOWN_*`) has a value the cache does
    /// not accept; the facade reports it as its `InvalidSetting`.
    #[error("invalid setting: {variable}={value}: {accepted}")]
    Config {
        /// The variable.
        variable: String,
        /// Its value.
        value: String,
        /// What it accepts.
        accepted: String,
    },
}

impl Error {
    /// The range (or part of it) is not mapped in this process.
    pub fn is_not_mapped(&self) -> bool {
        matches!(self, Error::Register(RegisterError::NotMapped { .. }))
    }
}
