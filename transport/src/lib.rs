//! pagewire's message layer (docs/architecture.md): matching, the eager and rendezvous
//! protocols and the local path between ranks of one host ([`msg`], [`local`]), the
//! buffer-mode trait ([`buffer_mode`]), the layer's [`Error`], and the NIC providers behind [`nic::open`] (the soft
//! NIC of `pagewire-soft`, the verbs provider). The crates below it are re-exported under
//! the names the layers above use: [`sys`], [`env`](mod@env), [`memmon`], [`boot`], and
//! `pagewire-nic` as [`nic`].
#![deny(missing_docs)]
// `unsafe` only in the modules that wrap system calls, shared memory and FFI (each marked
// `allow(unsafe_code)` where it is declared) and in the NIC trait's posting calls.
#![deny(unsafe_code)]

pub mod buffer_mode;
pub mod error;
pub mod local;
pub mod msg;
pub mod nic;

/// The layer below: system calls, shared memory, its error type, the completion status and
/// the settings (the `pagewire-sys` crate), under the names the modules here use.
pub use pagewire_sys as sys;
pub use pagewire_sys::{env, ErrorClass};

pub use error::{Error, Result};

/// The address-space change monitor (the `pagewire-memmon` crate).
pub use pagewire_memmon as memmon;

/// Rank discovery and address exchange (the `pagewire-boot` crate).
pub use pagewire_boot as boot;

#[cfg(test)]
mod fuzz;
