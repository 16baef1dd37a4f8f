//! imb-bench: the MPI-1 part of the Intel MPI Benchmarks (IMB-MPI1) reimplemented on
//! pagewire's rsmpi-shaped facade, so that its output can be put next to a real `IMB-MPI1`
//! run line by line, in each of pagewire's buffer modes and (feature `mpi`) on the host MPI
//! library.
//!
//! - [`bench`](mod@bench): the 18 benchmarks in IMB's order, their types and factors;
//! - [`settings`]: repetitions, warm-up, `-off_cache` rotation, `-npmin`, `-msglog`;
//! - [`run`]: the kernels and the per-size sequence (dynamic repetitions, warm-up, two
//!   barriers, timed loop, times of all processes to rank 0);
//! - [`output`]: IMB's header block, table headers and rows;
//! - [`report`]: what pagewire adds outside IMB's tables: counters, the three-mode
//!   side-by-side, plots.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod bench;
pub mod output;
pub mod report;
pub mod run;
pub mod settings;
