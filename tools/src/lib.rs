//! pagewire's command-line tools as a library: the NIC-level perftest kernels behind
//! `pw-perftest` (the `pwrun` launcher itself lives in `pagewire_transport::boot`).
// Posting work requests is `unsafe` at the NIC boundary (as in verbs); the two calls that do
// it are the only exceptions, each with its SAFETY argument.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod msgperf;
pub mod perftest;
pub mod placement;
