//! Rank discovery and address exchange (DESIGN.md "Launching").
//!
//! A rank learns its rank, the job size and a job-unique id, and can all-gather small blobs
//! (NIC addresses) with its peers before any NIC is up. Two implementations:
//! [`PwrunBootstrap`] under the built-in launcher `pwrun`, and [`SingletonBootstrap`] for a
//! program started with no launcher at all (one rank). The `mpirun` bootstrap comes with the
//! `mpi` feature.

pub mod launcher;
mod pwrun_client;
mod sys;

pub use launcher::{launch, self_launch, JobOutcome, LaunchConfig};
pub use pwrun_client::PwrunBootstrap;

use crate::error::Result;

/// Environment variable naming the job id (set by the launcher).
pub const ENV_JOB: &str = "PAGEWIRE_JOB";
/// Environment variable with this process's rank (set by the launcher).
pub const ENV_RANK: &str = "PAGEWIRE_RANK";
/// Environment variable with the number of ranks (set by the launcher).
pub const ENV_SIZE: &str = "PAGEWIRE_SIZE";
/// Environment variable with the path of the launcher's bootstrap socket.
pub const ENV_BOOT: &str = "PAGEWIRE_BOOT";
/// Environment variable naming the launcher (`pwrun`).
pub const ENV_LAUNCHER: &str = "PAGEWIRE_LAUNCHER";

/// What a rank can ask of the job before the NIC is up.
pub trait Bootstrap: Send + Sync {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the job.
    fn size(&self) -> usize;
    /// Job-unique id, safe to use in file and shared-memory names (`[0-9a-z]`).
    fn job_id(&self) -> &str;
    /// Every rank contributes `mine`; returns all contributions in rank order.
    /// Fails (never hangs) if a rank exits before contributing.
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }
}

/// The bootstrap of a program started with no launcher: one rank.
#[derive(Debug)]
pub struct SingletonBootstrap {
    job: String,
}

impl SingletonBootstrap {
    /// A one-rank job with a fresh random job id.
    pub fn new() -> Self {
        SingletonBootstrap { job: new_job_id() }
    }
}

impl Default for SingletonBootstrap {
    fn default() -> Self {
        Self::new()
    }
}

impl Bootstrap for SingletonBootstrap {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn job_id(&self) -> &str {
        &self.job
    }
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
}

/// True when this process was started by `pwrun` (or by a self-launching binary).
pub fn under_launcher() -> bool {
    std::env::var_os(ENV_BOOT).is_some()
}

/// The bootstrap for this process: `pwrun`'s when started under it, else a singleton.
pub fn from_env() -> Result<Box<dyn Bootstrap>> {
    if under_launcher() {
        Ok(Box::new(PwrunBootstrap::connect_from_env()?))
    } else {
        Ok(Box::new(SingletonBootstrap::new()))
    }
}

/// A fresh job id: 12 random lowercase hex digits.
pub fn new_job_id() -> String {
    format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Prefix of every shared-memory object of job `job` under /dev/shm.
pub fn shm_prefix(job: &str) -> String {
    format!("pagewire-{job}-")
}
