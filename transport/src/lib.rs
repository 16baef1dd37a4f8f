//! pagewire's lower layers (docs/architecture.md): the verbs-shaped NIC boundary
//! ([`nic`]), its default software provider ([`nic::soft`]), and rank discovery and
//! address exchange ([`boot`]). The message layer and the buffer-mode trait come on top.
#![deny(missing_docs)]
// `unsafe` only in the modules that wrap system calls, shared memory and FFI (each marked
// `allow(unsafe_code)` where it is declared) and in the NIC trait's posting calls.
#![deny(unsafe_code)]

pub mod buffer_mode;
pub mod local;
pub mod msg;
pub mod nic;

/// The layer below: system calls, shared memory, the error type, the completion status and
/// the settings (the `pagewire-sys` crate), under the names the modules here use.
pub use pagewire_sys as sys;
pub use pagewire_sys::{env, error, Error, Result};

/// The address-space change monitor (the `pagewire-memmon` crate).
pub use pagewire_memmon as memmon;

/// Rank discovery and address exchange (the `pagewire-boot` crate).
pub use pagewire_boot as boot;

#[cfg(test)]
mod fuzz;
