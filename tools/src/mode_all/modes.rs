//! What one run of a self-launching benchmark is: its buffer mode, the locked-memory world
//! and host path of the runs of `--mode all`, and the shared flags (`--mode`, `--transport`,
//! `--memlock` …) with the universe configuration they select.

use std::path::PathBuf;

use pagewire::topology::ModeKind;
use pagewire::{TransportKind, UniverseConfig};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The flags every self-launching benchmark shares (flattened into its own `clap` parser):
/// the buffer mode (or `all`), the transport, JSON and plot output, and the ranks to start.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct BenchArgs {
    /// Buffer mode (default: PAGEWIRE_MODE, else copy); `all` runs the job once per mode and
    /// then prints the modes side by side.
    #[arg(long, value_enum)]
    pub mode: Option<ModeChoice>,
    /// What carries the calls: pagewire on its soft NIC, or the host MPI library (feature
    /// `mpi`, under mpirun). Default: PAGEWIRE_TRANSPORT, else soft.
    #[arg(long, value_enum)]
    pub transport: Option<TransportChoice>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Plot the results against message size, one line per mode, to FILE.svg or FILE.png
    /// (imb-bench with several benchmarks: one file each, named FILE-NAME-npN.svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Ranks to start when started without a launcher.
    #[arg(long, default_value_t = 2)]
    pub np: usize,
    /// The tight world's locked-memory limit for `--mode all` (bytes, with K/M/G): pindown
    /// runs once with the limit lifted (HPC) and once under this one. Default: this shell's
    /// `ulimit -l`, or 8M where that is unlimited.
    #[arg(long, value_name = "BYTES", value_parser = parse_memlock)]
    pub memlock: Option<u64>,
}

fn parse_memlock(s: &str) -> std::result::Result<u64, String> {
    match pagewire_transport::nic::soft::parse_bytes(s) {
        Some(Some(b)) => Ok(b),
        _ => Err(format!("{s:?}: expected bytes like 65536, 64K or 8M")),
    }
}

/// The locked-memory limit a run sees (Lesokhin17 §6.2's two worlds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemlockWorld {
    /// Whatever the shell gives (copy and odp, which pin only their bounce pools).
    Machine,
    /// Lifted: the HPC world, where the pin-down cache rarely unpins.
    Unlimited,
    /// A tight limit (bytes): the cloud world, where the cache evicts and pins again.
    Limit(u64),
}

/// How a run's ranks of one host reach each other (`PAGEWIRE_LOCAL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPath {
    /// Through the NIC, where the buffer mode applies (`PAGEWIRE_LOCAL=nic`).
    Nic,
    /// Through shared memory and CMA, as production MPI libraries do (`PAGEWIRE_LOCAL=shm`,
    /// the default): no buffer mode applies.
    Local,
}

impl HostPath {
    /// The value of `PAGEWIRE_LOCAL`.
    pub fn setting(self) -> &'static str {
        match self {
            HostPath::Nic => "nic",
            HostPath::Local => "shm",
        }
    }
}

/// One run of `--mode all`: a buffer mode under a locked-memory world, through the NIC; or
/// the local path, which a user gets by default between ranks of one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModeVariant {
    /// The buffer mode.
    pub mode: BufferMode,
    /// The memlock limit its ranks run under.
    pub memlock: MemlockWorld,
    /// How its ranks of one host reach each other.
    pub path: HostPath,
}

impl ModeVariant {
    /// The runs of `--mode all`, the modes through the NIC (so that they apply between
    /// ranks of one host too): copy, pindown with the limit lifted (HPC), pindown under
    /// `tight` (default: the machine's `ulimit -l`, or 8 MiB where that is unlimited), odp;
    /// then `local`, the default path between ranks of one host, beside them.
    pub fn all(tight: Option<u64>) -> Vec<ModeVariant> {
        let tight = tight
            .or_else(pagewire_transport::sys::memlock_rlimit)
            .unwrap_or(8 << 20);
        let v = |mode, memlock| ModeVariant {
            mode,
            memlock,
            path: HostPath::Nic,
        };
        vec![
            v(BufferMode::Copy, MemlockWorld::Machine),
            v(BufferMode::Pindown, MemlockWorld::Unlimited),
            v(BufferMode::Pindown, MemlockWorld::Limit(tight)),
            v(BufferMode::Odp, MemlockWorld::Machine),
            ModeVariant::local(),
        ]
    }

    /// The local path (with the copy mode for whatever goes through the NIC).
    pub fn local() -> ModeVariant {
        ModeVariant {
            mode: BufferMode::Copy,
            memlock: MemlockWorld::Machine,
            path: HostPath::Local,
        }
    }

    /// The run's name in tables and errors: `local`, or the mode's.
    pub fn name(&self) -> &'static str {
        match self.path {
            HostPath::Local => "local",
            HostPath::Nic => self.mode.name(),
        }
    }
}

impl std::fmt::Display for ModeVariant {
    /// `copy`, `odp`, `pindown-hpc` (limit lifted), `pindown-8M` (under 8 MiB), `local`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path == HostPath::Local {
            return f.write_str("local");
        }
        match self.memlock {
            MemlockWorld::Machine => f.write_str(self.mode.name()),
            MemlockWorld::Unlimited => write!(f, "{}-hpc", self.mode.name()),
            MemlockWorld::Limit(b) => write!(f, "{}-{}", self.mode.name(), short_bytes(b)),
        }
    }
}

/// `65536` -> `64K`, `8388608` -> `8M`, else bytes.
fn short_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// A buffer mode (docs/architecture.md).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    PartialOrd,
    Ord,
)]
#[serde(rename_all = "lowercase")]
pub enum BufferMode {
    /// Copied through pinned bounce buffers.
    Copy,
    /// Registered in place, kept in the pin-down cache.
    Pindown,
    /// On-demand paging.
    Odp,
}

impl BufferMode {
    /// Every mode, `copy` first (the baseline of the ratios).
    pub const ALL: [BufferMode; 3] = [BufferMode::Copy, BufferMode::Pindown, BufferMode::Odp];

    /// The name used by `--mode` and `PAGEWIRE_MODE`.
    pub fn name(self) -> &'static str {
        match self {
            BufferMode::Copy => "copy",
            BufferMode::Pindown => "pindown",
            BufferMode::Odp => "odp",
        }
    }

    /// The facade's mode.
    pub fn kind(self) -> ModeKind {
        match self {
            BufferMode::Copy => ModeKind::Copy,
            BufferMode::Pindown => ModeKind::Pindown,
            BufferMode::Odp => ModeKind::Odp,
        }
    }

    /// The mode `PAGEWIRE_MODE` selects (`copy` when unset or unknown; the universe itself
    /// rejects unknown values).
    pub fn from_env() -> BufferMode {
        match std::env::var("PAGEWIRE_MODE").as_deref() {
            Ok("pindown") => BufferMode::Pindown,
            Ok("odp") => BufferMode::Odp,
            _ => BufferMode::Copy,
        }
    }
}

impl std::fmt::Display for BufferMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The value of a benchmark's `--mode` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeChoice {
    /// Copy through pinned bounce buffers.
    Copy,
    /// Pin-down cache.
    Pindown,
    /// On-demand paging.
    Odp,
    /// Each mode in turn (one job per mode), then a side-by-side comparison.
    All,
}

impl ModeChoice {
    /// The one mode chosen, `None` for `all`.
    pub fn single(self) -> Option<BufferMode> {
        match self {
            ModeChoice::Copy => Some(BufferMode::Copy),
            ModeChoice::Pindown => Some(BufferMode::Pindown),
            ModeChoice::Odp => Some(BufferMode::Odp),
            ModeChoice::All => None,
        }
    }
}

/// The value of a benchmark's `--transport` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TransportChoice {
    /// pagewire's message layer on the soft NIC provider.
    Soft,
    /// The host MPI library (feature `mpi`, under `mpirun`); the buffer mode does not apply.
    Mpi,
}

/// The universe's configuration: the `PAGEWIRE_*` settings, with the buffer mode and the
/// transport replaced by the flags' when given.
pub fn universe_config(
    mode: Option<BufferMode>,
    transport: Option<TransportChoice>,
) -> Result<UniverseConfig> {
    let mut cfg = UniverseConfig::from_env()?;
    if let Some(m) = mode {
        cfg.mode = m.kind();
    }
    match transport {
        Some(TransportChoice::Soft) => cfg.transport = TransportKind::Pagewire,
        Some(TransportChoice::Mpi) => cfg.transport = TransportKind::HostMpi,
        None => {}
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::{parse_memlock, short_bytes, BufferMode, HostPath, ModeChoice, ModeVariant};
    use pagewire::topology::ModeKind;

    #[test]
    fn mode_all_runs_pindown_in_both_worlds_with_labels() {
        let runs = ModeVariant::all(Some(8 << 20));
        let labels: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            labels,
            ["copy", "pindown-hpc", "pindown-8M", "odp", "local"]
        );
        assert!(runs[..4].iter().all(|r| r.path == HostPath::Nic));
        assert_eq!(runs[4].path.setting(), "shm");
        assert_eq!(short_bytes(64 << 10), "64K");
        assert_eq!(short_bytes(1000), "1000");
        assert!(parse_memlock("64K") == Ok(65536) && parse_memlock("lots").is_err());
    }

    #[test]
    fn modes_map_to_the_facade() {
        assert_eq!(ModeChoice::All.single(), None);
        assert_eq!(ModeChoice::Odp.single(), Some(BufferMode::Odp));
        assert_eq!(BufferMode::Pindown.kind(), ModeKind::Pindown);
        assert_eq!(
            serde_json::to_string(&BufferMode::Pindown).unwrap(),
            "\"pindown\""
        );
    }
}
