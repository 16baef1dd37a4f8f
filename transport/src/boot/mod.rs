//! Rank discovery and address exchange (docs/architecture.md).
//!
//! A rank learns its rank, the job size and a job-unique id, and can all-gather small blobs
//! (NIC addresses) with its peers before any NIC is up. Four implementations:
//! [`PwrunBootstrap`] under the built-in launcher `pwrun`, `MpiBootstrap` (feature `mpi`)
//! under an MPI launcher (`mpirun`/`mpiexec` of MPICH or Open MPI), [`PmiBootstrap`]
//! under MPICH's `mpiexec` (hydra) for a program built without the `mpi` feature (a PMI-1
//! client), and [`SingletonBootstrap`] for a program started with no launcher at
//! all (one rank). [`from_env`] picks one from the environment, in that order.
//!
//! A program started by another MPI launcher (PMIx: Open MPI, `srun --mpi=pmix`; Slurm's
//! PMI-2) but built without the `mpi` feature fails in [`from_env`] with
//! [`Error::Bootstrap`] saying so, instead of running as N one-rank jobs.

pub mod binding;
pub mod hosts;
pub mod launcher;
#[cfg(feature = "mpi")]
mod mpi;
mod pmi;
pub(crate) mod pwrun_client;
pub mod spawn;
#[allow(unsafe_code)]
mod sys;

#[cfg(feature = "mpi")]
pub use self::mpi::{MpiBootstrap, MpiWorld};
pub use launcher::{launch, self_launch, JobOutcome, LaunchConfig};
pub use pmi::PmiBootstrap;
pub use pwrun_client::PwrunBootstrap;

use crate::error::{Error, Result};

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
    /// Asks the launcher to start the processes of `request` and to open a connection job
    /// between them and the spawning group (`MPI_Comm_spawn`; module [`spawn`]). Only
    /// `pwrun` can; every other bootstrap says so.
    fn spawn(&self, request: &spawn::SpawnRequest) -> Result<spawn::ConnectionJob> {
        let programs: Vec<_> = request.commands.iter().map(|c| &c.program).collect();
        Err(Error::Launcher(format!(
            "spawn of {programs:?}: this launcher cannot add processes to a running job; run \
             under pwrun, or under mpirun with PAGEWIRE_TRANSPORT=mpi (feature mpi)"
        )))
    }
    /// The MPI bootstrap, when this is one: how a layer above (the host-MPI backend)
    /// borrows MPI's world communicator from the bootstrap that owns MPI.
    #[cfg(feature = "mpi")]
    fn as_mpi(&self) -> Option<&MpiBootstrap> {
        None
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

/// Variables an MPI launcher sets in every rank's environment, one per launcher family:
/// MPICH's hydra (PMI-1: `PMI_RANK`, `PMI_FD`), PMIx-based launchers (`PMIX_RANK`: Open MPI
/// 5, MPICH built with PMIx, Slurm's `srun --mpi=pmix`) and Open MPI's ORTE/PRRTE
/// (`OMPI_COMM_WORLD_RANK`).
pub const MPI_LAUNCHER_VARS: [&str; 4] =
    ["PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"];

/// Which launcher started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// The built-in launcher `pwrun` (or a self-launching binary): `PAGEWIRE_BOOT` is set.
    /// It wins over an MPI launcher's variables, which a `pwrun` started under `mpirun`
    /// passes on to its ranks.
    Pwrun,
    /// An MPI launcher; the variable that showed it.
    Mpi(&'static str),
    /// None: the program runs as one rank.
    None,
}

impl Launcher {
    /// The launcher of this process, from its environment.
    pub fn detect() -> Launcher {
        Self::detect_with(|k| std::env::var_os(k).is_some())
    }

    /// [`Launcher::detect`] with `is_set(name)` telling whether a variable is set.
    pub fn detect_with(is_set: impl Fn(&str) -> bool) -> Launcher {
        if is_set(ENV_BOOT) {
            return Launcher::Pwrun;
        }
        match MPI_LAUNCHER_VARS.into_iter().find(|v| is_set(v)) {
            Some(var) => Launcher::Mpi(var),
            None => Launcher::None,
        }
    }
}

/// True when this process was started by a launcher, `pwrun` or an MPI launcher, and so must
/// not start itself (`self_launch`).
pub fn under_launcher() -> bool {
    Launcher::detect() != Launcher::None
}

/// The bootstrap for this process: `pwrun`'s when started under it, MPI's when started by
/// an MPI launcher (feature `mpi`; without it, PMI-1's under MPICH's hydra, which sets
/// `PMI_FD`, and for other launchers an error that says to rebuild), else a singleton.
pub fn from_env() -> Result<Box<dyn Bootstrap>> {
    match Launcher::detect() {
        Launcher::Pwrun => Ok(Box::new(PwrunBootstrap::connect_from_env()?)),
        Launcher::Mpi(var) => mpi_from_env(var),
        Launcher::None => Ok(Box::new(SingletonBootstrap::new())),
    }
}

#[cfg(feature = "mpi")]
fn mpi_from_env(_var: &str) -> Result<Box<dyn Bootstrap>> {
    Ok(Box::new(MpiBootstrap::init()?))
}

#[cfg(not(feature = "mpi"))]
fn mpi_from_env(var: &str) -> Result<Box<dyn Bootstrap>> {
    if std::env::var_os("PMI_FD").is_some() {
        return Ok(Box::new(PmiBootstrap::connect_from_env()?));
    }
    Err(mpi_feature_missing(var))
}

/// The error of a program started by an MPI launcher but built without the `mpi` feature.
pub fn mpi_feature_missing(var: &str) -> Error {
    Error::Bootstrap(format!(
        "this process was started by an MPI launcher (mpirun/mpiexec: {var} is set), but \
         pagewire was built without MPI support, and speaks no launcher protocol but MPICH \
         hydra's PMI-1 (PMI_FD is not set: PMIx or PMI-2); rebuild with `--features mpi` \
         (it needs an MPI library: Debian's libmpich-dev, libclang-dev and pkg-config), or \
         start the program with pwrun or MPICH's mpiexec"
    ))
}

/// A fresh job id: 12 random lowercase hex digits.
pub fn new_job_id() -> String {
    format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// Prefix of every shared-memory object of job `job` under /dev/shm.
pub fn shm_prefix(job: &str) -> String {
    format!("pagewire-{job}-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect(set: &[&str]) -> Launcher {
        Launcher::detect_with(|k| set.contains(&k))
    }

    #[test]
    fn launchers_are_told_apart() {
        assert_eq!(detect(&[]), Launcher::None);
        assert_eq!(
            detect(&["PMI_RANK", "PMI_SIZE", "PMI_FD"]),
            Launcher::Mpi("PMI_RANK")
        );
        assert_eq!(detect(&["PMIX_RANK"]), Launcher::Mpi("PMIX_RANK"));
        assert_eq!(
            detect(&["OMPI_COMM_WORLD_RANK"]),
            Launcher::Mpi("OMPI_COMM_WORLD_RANK")
        );
        // pwrun started under mpirun passes the MPI variables on: pwrun's job wins.
        assert_eq!(detect(&[ENV_BOOT, "PMI_RANK"]), Launcher::Pwrun);
        assert_eq!(detect(&["PMI_SIZE", "SLURM_PROCID"]), Launcher::None);
    }

    #[test]
    fn the_missing_feature_is_named() {
        let e = mpi_feature_missing("PMI_RANK").to_string();
        assert!(e.contains("PMI_RANK is set"), "{e}");
        assert!(e.contains("--features mpi"), "{e}");
    }
}
