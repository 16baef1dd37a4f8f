//! pagewire's command-line tools as a library: the NIC-level perftest kernels behind
//! `pw-perftest` (the `pwrun` launcher itself lives in `pagewire_transport::boot`), and the
//! infrastructure the benchmarks share: plots ([`plot`]) and `--mode all` ([`mode_all`]).
// Posting work requests is `unsafe` at the NIC boundary (as in verbs); the two calls that do
// it are the only exceptions, each with its SAFETY argument (file mappings are wrapped in
// `pagewire_transport::sys::FileMapping`).
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod error;
pub mod mode_all;
pub mod msgperf;
pub mod perftest;
pub mod placement;
pub mod plot;
pub mod timestamp;
pub mod workset;

pub use error::{Error, Result};
