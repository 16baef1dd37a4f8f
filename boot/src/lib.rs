//! Rank discovery and address exchange (docs/architecture.md).
//!
//! A rank learns its rank, the job size and a job-unique id, and can all-gather small blobs
//! (NIC addresses) with its peers before any NIC is up. The implementations, one per kind
//! of starter: [`PwrunBootstrap`] under the built-in launcher `pwrun`; a PMI client
//! (PMI-2's wire protocol, or PMI-1's where only that is served) under MPICH's `mpiexec`
//! (hydra) and Slurm's `srun --mpi=pmi2`; a PMIx client under Open MPI's `mpirun` and
//! `srun --mpi=pmix` (libpmix loaded at start-up); `MpiBootstrap` (feature `mpi`) through
//! the MPI library under any MPI launcher; and [`SingletonBootstrap`] for a program started
//! with no launcher (one rank). [`from_env`] picks one as [`Starter::from_env`] says:
//! from the environment, or as `PAGEWIRE_BOOT` forces.
//!
//! A rank whose environment shows a launcher but not enough of it to reach its process
//! manager (a PMIx rank without its namespace, `srun` without `--mpi`) fails in
//! [`from_env`] with [`Error::Bootstrap`] saying so, instead of running as N one-rank jobs.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod binding;
pub mod hosts;
mod kvs;
pub mod launcher;
#[cfg(feature = "mpi")]
mod mpi;
mod pmi;
mod pmix;
pub(crate) mod pwrun_client;
pub mod spawn;
#[allow(unsafe_code)]
mod sys;

#[cfg(test)]
mod fuzz;

#[cfg(feature = "mpi")]
pub use self::mpi::{MpiBootstrap, MpiWorld};
pub use launcher::{launch, self_launch, JobOutcome, LaunchConfig};
pub use pmi::PmiVersion;
pub use pwrun_client::PwrunBootstrap;

use pagewire_sys::{Error, Result};

/// Environment variable naming the job id (set by the launcher).
pub const ENV_JOB: &str = "PAGEWIRE_JOB";
/// Environment variable with this process's rank (set by the launcher).
pub const ENV_RANK: &str = "PAGEWIRE_RANK";
/// Environment variable with the number of ranks (set by the launcher).
pub const ENV_SIZE: &str = "PAGEWIRE_SIZE";
/// Environment variable with the path of the launcher's bootstrap socket.
pub const ENV_BOOT_SOCKET: &str = "PAGEWIRE_BOOT_SOCKET";
/// Environment variable that forces a starter's protocol (`auto`, `pwrun`, `pmi`, `pmi1`,
/// `pmi2`, `pmix`, `mpi`, `single`); see [`Starter`].
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
    /// Who started this rank and how it reaches its process manager, in one line
    /// (`PAGEWIRE_VERBOSE=1` prints it).
    fn starter(&self) -> String;
    /// Asks the launcher to end the whole job with status `code` (`MPI_Abort`), saying
    /// `message` where it can. Returns if the launcher does not end this process at once
    /// (the caller exits). Default: nothing to tell (`pwrun` stops the job when this rank
    /// exits with a non-zero status).
    fn abort(&self, code: i32, message: &str) {
        let _ = (code, message);
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
    fn starter(&self) -> String {
        "no launcher: one rank".into()
    }
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
}

/// Variables an MPI launcher sets in every rank's environment, one per launcher family:
/// PMI servers (`PMI_RANK`, `PMI_FD`: MPICH's hydra, Slurm's `srun --mpi=pmi2`), PMIx
/// servers (`PMIX_RANK`: Open MPI's `mpirun`, Slurm's `srun --mpi=pmix`) and Open MPI's
/// ORTE/PRRTE (`OMPI_COMM_WORLD_RANK`).
pub const MPI_LAUNCHER_VARS: [&str; 4] =
    ["PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"];

/// Which launcher started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// The built-in launcher `pwrun` (or a self-launching binary): `PAGEWIRE_BOOT_SOCKET` is set.
    /// It wins over an MPI launcher's variables, which a `pwrun` started under `mpirun`
    /// passes on to its ranks.
    Pwrun,
    /// An MPI launcher; the variable that showed it.
    Mpi(&'static str),
    /// Slurm's `srun` started this process as one of several tasks of a step, but with no
    /// PMI server (`--mpi=none`): its peers exist, and it cannot find them.
    Slurm,
    /// None: the program runs as one rank.
    None,
}

impl Launcher {
    /// The launcher of this process, from its environment.
    pub fn detect() -> Launcher {
        Self::detect_with(|k| std::env::var(k).ok())
    }

    /// [`Launcher::detect`] with `var(name)` reading a variable.
    pub fn detect_with(var: impl Fn(&str) -> Option<String>) -> Launcher {
        if var(ENV_BOOT_SOCKET).is_some() {
            return Launcher::Pwrun;
        }
        if let Some(v) = MPI_LAUNCHER_VARS.into_iter().find(|v| var(v).is_some()) {
            return Launcher::Mpi(v);
        }
        let tasks = var("SLURM_STEP_NUM_TASKS").and_then(|n| n.trim().parse::<usize>().ok());
        if var("SLURM_PROCID").is_some() && tasks.is_some_and(|n| n > 1) {
            return Launcher::Slurm;
        }
        Launcher::None
    }
}

/// True when this process was started by a launcher, `pwrun` or an MPI launcher, and so must
/// not start itself (`self_launch`).
pub fn under_launcher() -> bool {
    Launcher::detect() != Launcher::None
}

/// How this rank reaches its job: the starter whose protocol its bootstrap speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Starter {
    /// `pwrun`'s bootstrap socket.
    Pwrun,
    /// A PMI server on `PMI_FD` (hydra, `srun --mpi=pmi2`).
    Pmi(PmiVersion),
    /// A PMIx server (Open MPI's `mpirun`, `srun --mpi=pmix`).
    Pmix,
    /// The MPI library's own start-up (feature `mpi`).
    Mpi,
    /// None: one rank.
    Single,
}

impl Starter {
    /// The starter `PAGEWIRE_BOOT` forces, or with `auto` (the default) the one this
    /// process's environment shows: `pwrun`'s socket; under an MPI launcher the MPI library
    /// when built with the `mpi` feature, else PMIx (`PMIX_NAMESPACE` and `PMIX_RANK`) or
    /// PMI (`PMI_FD`); with none of these a single rank. An environment that shows a
    /// launcher this process cannot reach is an error, not a single rank.
    pub fn from_env() -> Result<Starter> {
        let choice = std::env::var(ENV_BOOT).unwrap_or_default();
        Self::choose(&choice, |k| std::env::var(k).ok())
    }

    /// [`Starter::from_env`] with `var(name)` reading a variable and `choice` the value of
    /// `PAGEWIRE_BOOT`.
    pub fn choose(choice: &str, var: impl Fn(&str) -> Option<String>) -> Result<Starter> {
        let is_set = |k: &str| var(k).is_some();
        let forced = match choice.trim() {
            "" | "auto" => None,
            "pwrun" => Some(Starter::Pwrun),
            "pmi" => Some(Starter::Pmi(PmiVersion::Any)),
            "pmi1" => Some(Starter::Pmi(PmiVersion::V1)),
            "pmi2" => Some(Starter::Pmi(PmiVersion::V2)),
            "pmix" => Some(Starter::Pmix),
            "mpi" => Some(Starter::Mpi),
            "single" => Some(Starter::Single),
            other => {
                return Err(Error::Bootstrap(format!(
                    "{ENV_BOOT}={other:?} is not a starter: auto, pwrun, pmi, pmi1, pmi2, \
                     pmix, mpi or single"
                )))
            }
        };
        if let Some(starter) = forced {
            if starter == Starter::Mpi && !cfg!(feature = "mpi") {
                return Err(Error::Bootstrap(format!(
                    "{ENV_BOOT}=mpi: this program was built without the `mpi` feature"
                )));
            }
            return Ok(starter);
        }
        let launcher = Launcher::detect_with(&var);
        match launcher {
            Launcher::Pwrun => return Ok(Starter::Pwrun),
            Launcher::None if !is_set("PMI_PORT") => return Ok(Starter::Single),
            Launcher::Mpi(_) if cfg!(feature = "mpi") => return Ok(Starter::Mpi),
            Launcher::Mpi(_) | Launcher::Slurm | Launcher::None => {}
        }
        match (is_set("PMIX_NAMESPACE"), is_set("PMIX_RANK")) {
            (true, true) => return Ok(Starter::Pmix),
            (false, false) => {}
            (ns, _) => {
                let (has, lacks) = if ns {
                    ("PMIX_NAMESPACE", "PMIX_RANK")
                } else {
                    ("PMIX_RANK", "PMIX_NAMESPACE")
                };
                return Err(Error::Bootstrap(format!(
                    "{has} is set but {lacks} is not: a PMIx launcher sets both; this \
                     environment is half a launch (set {ENV_BOOT}=single to run as one rank)"
                )));
            }
        }
        if is_set("PMI_FD") {
            return Ok(Starter::Pmi(PmiVersion::Any));
        }
        if is_set("PMI_PORT") {
            return Err(Error::Bootstrap(
                "PMI_PORT is set: hydra's -pmi-port mode is not supported; start mpiexec \
                 without -pmi-port (ranks then get PMI_FD)"
                    .into(),
            ));
        }
        if launcher == Launcher::Slurm {
            let tasks = var("SLURM_STEP_NUM_TASKS").unwrap_or_default();
            return Err(Error::Bootstrap(format!(
                "this process is one of {tasks} tasks started by srun without a PMI server, \
                 so it cannot find the others: run srun with --mpi=pmi2 or --mpi=pmix (or set \
                 MpiDefault in slurm.conf); {ENV_BOOT}=single runs each task as a job of one \
                 rank"
            )));
        }
        Err(mpi_feature_missing(match launcher {
            Launcher::Mpi(var) => var,
            _ => "PMI_RANK",
        }))
    }
}

/// The bootstrap for this process, as [`Starter::from_env`] picks it.
pub fn from_env() -> Result<Box<dyn Bootstrap>> {
    Ok(match Starter::from_env()? {
        Starter::Pwrun => Box::new(PwrunBootstrap::connect_from_env()?),
        Starter::Pmi(version) => Box::new(pmi::connect_from_env(version)?),
        Starter::Pmix => Box::new(pmix::connect_from_env()?),
        Starter::Mpi => mpi_from_env()?,
        Starter::Single => Box::new(SingletonBootstrap::new()),
    })
}

#[cfg(feature = "mpi")]
fn mpi_from_env() -> Result<Box<dyn Bootstrap>> {
    Ok(Box::new(MpiBootstrap::init()?))
}

#[cfg(not(feature = "mpi"))]
fn mpi_from_env() -> Result<Box<dyn Bootstrap>> {
    unreachable!("Starter::choose refuses mpi without the feature")
}

/// The error of a program started by an MPI launcher that pagewire cannot reach without
/// the `mpi` feature (neither PMIx nor PMI variables are set).
pub fn mpi_feature_missing(var: &str) -> Error {
    Error::Bootstrap(format!(
        "this process was started by an MPI launcher (mpirun/mpiexec: {var} is set), but \
         neither a PMIx server (PMIX_NAMESPACE, PMIX_RANK) nor a PMI server (PMI_FD) is \
         named in its environment, and pagewire was built without MPI support; rebuild with \
         `--features mpi` (it needs an MPI library: Debian's libmpich-dev, libclang-dev and \
         pkg-config), or start the program with pwrun, srun --mpi=pmi2|pmix, MPICH's \
         mpiexec or Open MPI's mpirun"
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

    /// An environment of `vars` (`NAME=value`, or `NAME` for any value).
    fn env<'a>(vars: &'a [&'a str]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter().find_map(|v| match v.split_once('=') {
                Some((name, value)) if name == k => Some(value.to_string()),
                None if *v == k => Some("1".to_string()),
                _ => None,
            })
        }
    }

    fn detect(vars: &[&str]) -> Launcher {
        Launcher::detect_with(env(vars))
    }

    fn choose(choice: &str, vars: &[&str]) -> Result<Starter> {
        Starter::choose(choice, env(vars))
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
        assert_eq!(detect(&[ENV_BOOT_SOCKET, "PMI_RANK"]), Launcher::Pwrun);
        assert_eq!(detect(&["PMI_SIZE", "SLURM_PROCID"]), Launcher::None);
        // srun without --mpi: several tasks and no PMI; one task is a job of one.
        let srun = ["SLURM_PROCID=1", "SLURM_STEP_NUM_TASKS=4"];
        assert_eq!(detect(&srun), Launcher::Slurm);
        assert_eq!(
            detect(&["SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=1"]),
            Launcher::None
        );
    }

    #[test]
    fn starters_follow_the_environment_or_the_setting() {
        let pmix = ["PMIX_NAMESPACE=slurm.pmix.5.0", "PMIX_RANK=1"];
        let pmi = ["PMI_FD=11", "PMI_RANK=1", "PMI_SIZE=4"];
        assert_eq!(choose("", &[]).unwrap(), Starter::Single);
        assert_eq!(choose("auto", &[ENV_BOOT_SOCKET]).unwrap(), Starter::Pwrun);
        if !cfg!(feature = "mpi") {
            assert_eq!(choose("", &pmix).unwrap(), Starter::Pmix);
            assert_eq!(choose("", &pmi).unwrap(), Starter::Pmi(PmiVersion::Any));
            // Open MPI's mpirun sets its own variables beside PMIx's.
            let ompi = ["OMPI_COMM_WORLD_RANK=0", "PMIX_NAMESPACE=1", "PMIX_RANK=0"];
            assert_eq!(choose("", &ompi).unwrap(), Starter::Pmix);
        }
        assert_eq!(choose("pmi2", &pmix).unwrap(), Starter::Pmi(PmiVersion::V2));
        assert_eq!(choose("pmi1", &[]).unwrap(), Starter::Pmi(PmiVersion::V1));
        assert_eq!(choose("single", &pmi).unwrap(), Starter::Single);
        assert_eq!(choose(" pmix ", &[]).unwrap(), Starter::Pmix);
        let e = choose("slurm", &[]).unwrap_err().to_string();
        assert!(
            e.contains("PAGEWIRE_BOOT=\"slurm\" is not a starter"),
            "{e}"
        );
        if !cfg!(feature = "mpi") {
            let e = choose("mpi", &[]).unwrap_err().to_string();
            assert!(e.contains("without the `mpi` feature"), "{e}");
            // Half a launch says which half is missing.
            let e = choose("", &["PMIX_RANK=0"]).unwrap_err().to_string();
            assert!(
                e.contains("PMIX_RANK is set but PMIX_NAMESPACE is not"),
                "{e}"
            );
            let e = choose("", &["PMI_RANK=0", "PMI_SIZE=2"])
                .unwrap_err()
                .to_string();
            assert!(e.contains("PMI_RANK is set"), "{e}");
            let e = choose("", &["PMI_PORT=h:1", "PMI_ID=0"])
                .unwrap_err()
                .to_string();
            assert!(e.contains("-pmi-port"), "{e}");
        }
        let e = choose("", &["SLURM_PROCID=1", "SLURM_STEP_NUM_TASKS=4"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("one of 4 tasks started by srun"), "{e}");
        assert!(e.contains("--mpi=pmi2 or --mpi=pmix"), "{e}");
    }

    #[test]
    fn the_missing_feature_is_named() {
        let e = mpi_feature_missing("PMI_RANK").to_string();
        assert!(e.contains("PMI_RANK is set"), "{e}");
        assert!(e.contains("--features mpi"), "{e}");
    }
}
