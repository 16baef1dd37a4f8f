//! b_eff, the effective bandwidth benchmark of Rolf Rabenseifner (HLRS), following the
//! definition of its version 3.6 (b_eff.c revision 3.6.0.1), on pagewire's rsmpi-shaped
//! API. It is the second benchmark of Lesokhin17's evaluation (section 6.2, Table 6: b_eff
//! in the pinning, NPF and copying configurations).
//!
//! b_eff measures the accumulated bandwidth of all processes at 21 message lengths
//! ([`lengths`]) in ring and random patterns ([`patterns`]) with three methods
//! ([`measure`]), and averages them into one number ([`analysis`]); [`report`] prints it in
//! the original's layout.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod analysis;
pub mod lengths;
pub mod measure;
pub mod patterns;
pub mod report;

/// What can go wrong in a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A pagewire call failed.
    #[error("pagewire: {0}")]
    Pagewire(#[from] pagewire::Error),
    /// A message arrived with wrong content (b_eff: "invalid message content").
    #[error(
        "invalid message content: rank {rank} received {length} bytes from rank {from} \
         (exchange {exchange}) with byte {offset} = {got}, expected {expected}"
    )]
    Corrupted {
        /// The receiving rank.
        rank: usize,
        /// The sending rank.
        from: usize,
        /// The message length.
        length: usize,
        /// The exchange (tag) within the pattern.
        exchange: usize,
        /// The first wrong byte.
        offset: usize,
        /// Its value.
        got: u8,
        /// The value sent.
        expected: u8,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
