//! `--mode all` for the self-launching benchmarks (`imb-bench`, `beff`): a [`Universe`] is
//! per process, so comparing the buffer modes means one job per mode. [`run_each_mode`]
//! relaunches the current benchmark binary once per mode through the built-in launcher,
//! with `--mode MODE --json FILE`, and collects each run's JSON; [`SideBySide`] prints the
//! three modes next to each other with the ratio of each zero-copy mode to `copy`. The modes
//! govern the NIC path, so their runs send local traffic through the NIC
//! (`PAGEWIRE_LOCAL=nic`); a `local` run beside them shows what ranks of one host get by
//! default (shared memory and CMA, [`HostPath`]).
//!
//! Also here, so that the benchmarks agree on them: the `--mode` and `--transport` flag
//! values ([`ModeChoice`], [`TransportChoice`]) and the [`UniverseConfig`] they select
//! ([`universe_config`]).
//!
//! How `--mode all` relaunches depends on what started the benchmark ([`all_modes_plan`]):
//! - no launcher: this process launches `--np` ranks per mode, one mode after the other;
//! - `pwrun -n N`: rank 0 launches N ranks per mode, the other ranks exit at once;
//! - `mpirun`: not possible (the MPI job is fixed when it starts): the error says to run the
//!   job once per mode with `--mode MODE --json FILE` instead.
//!
//! [`Universe`]: pagewire::Universe
//! [`UniverseConfig`]: pagewire::UniverseConfig

mod modes;

use std::ffi::OsString;
use std::path::PathBuf;

use pagewire::boot::{self, Launcher};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

pub use modes::{
    universe_config, BenchArgs, BufferMode, HostPath, MemlockWorld, ModeChoice, ModeVariant,
    TransportChoice,
};

/// One mode's result, as its run wrote it with `--json`.
#[derive(Clone, Debug)]
pub struct ModeRun<T> {
    /// The mode and its memlock world.
    pub mode: ModeVariant,
    /// What the run wrote.
    pub result: T,
}

/// What `--mode all` does in this process ([`all_modes_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllModesPlan {
    /// Launch a job of this many ranks per mode from here.
    Launch {
        /// Ranks per job.
        ranks: usize,
    },
    /// A rank of a `pwrun` job other than rank 0: rank 0 does the launching; exit 0.
    Idle,
}

/// What `--mode all` does in this process, started as it was, with `np` ranks when it
/// starts itself; an error under an MPI launcher, which cannot start new jobs.
pub fn all_modes_plan(np: usize, program: &str) -> Result<AllModesPlan> {
    match Launcher::detect() {
        Launcher::None => Ok(AllModesPlan::Launch { ranks: np }),
        Launcher::Pwrun => {
            let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
            match (var(boot::ENV_RANK), var(boot::ENV_SIZE)) {
                (Some(0), Some(size)) => Ok(AllModesPlan::Launch { ranks: size }),
                (Some(_), Some(_)) => Ok(AllModesPlan::Idle),
                _ => Err(Error::ModeAllUnsupported(format!(
                    "{program} --mode all: started by pwrun without {} and {}",
                    boot::ENV_RANK,
                    boot::ENV_SIZE
                ))),
            }
        }
        launcher @ (Launcher::Mpi(_) | Launcher::Slurm) => Err(Error::ModeAllUnsupported(format!(
            "{program} --mode all needs one job per buffer mode (a pagewire universe, like \
             MPI_Init, happens once per process), and a job started by mpirun or srun ({} is \
             set) cannot start new ones. Run it once per mode instead, e.g.\n  for m in copy \
             pindown odp; do mpirun -np 2 {program} --mode $m --json {program}-$m.json ...; \
             done\nor start {program} without mpirun (it then launches itself once per mode).",
            match launcher {
                Launcher::Mpi(var) => var,
                _ => "SLURM_STEP_NUM_TASKS",
            }
        ))),
    }
}

/// Runs the current executable as a job of `ranks` ranks once per mode in `modes`, through
/// the built-in launcher, with `args` followed by `--mode MODE --json FILE`, and reads each
/// run's JSON. The ranks' own output (their tables) goes to this process's stdout and
/// stderr as they print it. `args` must not contain `--mode` or `--json` already
/// ([`strip_options`]). Stops at the first run that fails.
pub fn run_each_mode<T: DeserializeOwned>(
    ranks: usize,
    args: &[OsString],
    modes: &[ModeVariant],
) -> Result<Vec<ModeRun<T>>> {
    let program = std::env::current_exe().map_err(|e| Error::ModeRun {
        mode: "first",
        message: format!("cannot find the current executable: {e}"),
    })?;
    let stem = program
        .file_name()
        .map_or_else(|| "bench".into(), |n| n.to_string_lossy().into_owned());
    let mut runs = Vec::new();
    for &variant in modes {
        let mode = variant.mode;
        let json = result_file(&stem, variant.name());
        let mut job_args = args.to_vec();
        job_args.extend(
            ["--mode", mode.name(), "--json"]
                .iter()
                .map(OsString::from)
                .chain([json.clone().into_os_string()]),
        );
        let cfg = boot::LaunchConfig {
            args: job_args,
            ..boot::LaunchConfig::new(ranks, &program)
        };
        // The world's limit: in the launched ranks' environment (the soft NIC's account and
        // the pin-down cache's default size follow PAGEWIRE_MEMLOCK_LIMIT), and in the kernel's
        // RLIMIT_MEMLOCK where this process may set it (lifting it needs CAP_SYS_RESOURCE;
        // without it, a process with CAP_IPC_LOCK is not limited by the kernel anyway).
        let limit = match variant.memlock {
            MemlockWorld::Machine => None,
            MemlockWorld::Unlimited => Some(None),
            MemlockWorld::Limit(b) => Some(Some(b)),
        };
        let mut cfg = cfg;
        cfg.env
            .push(("PAGEWIRE_LOCAL".into(), variant.path.setting().into()));
        let saved = limit.and_then(|l| {
            cfg.env.push((
                "PAGEWIRE_MEMLOCK_LIMIT".into(),
                l.map_or_else(|| "unlimited".into(), |b| b.to_string())
                    .into(),
            ));
            pagewire_transport::sys::set_memlock_rlimit(l).ok()
        });
        let outcome = boot::launch(&cfg);
        if let Some(old) = saved {
            let _ = pagewire_transport::sys::restore_memlock_rlimit(old);
        }
        let outcome = outcome.map_err(|e| Error::ModeRun {
            mode: variant.name(),
            message: e.to_string(),
        })?;
        if !outcome.success() {
            let _ = std::fs::remove_file(&json);
            return Err(Error::ModeRun {
                mode: variant.name(),
                message: outcome
                    .message
                    .unwrap_or_else(|| format!("the job exited with status {}", outcome.exit_code)),
            });
        }
        let result = read_json(&json);
        let _ = std::fs::remove_file(&json);
        runs.push(ModeRun {
            mode: variant,
            result: result?,
        });
    }
    Ok(runs)
}

/// Reads a result file written with `--json`.
pub fn read_json<T: DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A private name for one mode's result file.
fn result_file(stem: &str, name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "{stem}-{}-{}-{}.json",
        std::process::id(),
        name,
        boot::new_job_id()
    ))
}

/// `args` without the options named in `options`, each of which takes a value, given either
/// as `--name VALUE` or `--name=VALUE`. Everything after a bare `--` is kept as is.
pub fn strip_options(args: &[OsString], options: &[&str]) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let s = arg.to_string_lossy();
        if s == "--" {
            out.push(arg.clone());
            out.extend(it.cloned());
            break;
        }
        if options.iter().any(|o| s == *o) {
            it.next();
            continue;
        }
        if options
            .iter()
            .any(|o| s.strip_prefix(o).is_some_and(|r| r.starts_with('=')))
        {
            continue;
        }
        out.push(arg.clone());
    }
    out
}

/// A table of one value per mode for each row key (e.g. message size), with the ratio of
/// every other mode to the first (normally `copy`): the "side by side" of `--mode all`.
#[derive(Clone, Debug, PartialEq)]
pub struct SideBySide {
    /// Heading of the key column (e.g. `#bytes`).
    pub key_heading: String,
    /// What the values are, with unit (e.g. `Mbytes/sec` or `t[usec]`); repeated per mode
    /// in the headings as `MODE VALUE`.
    pub value_heading: String,
    /// The runs, in column order; ratios are to the first.
    pub modes: Vec<ModeVariant>,
    /// Rows: the key and one value per mode (`None` where a mode has none).
    pub rows: Vec<(String, Vec<Option<f64>>)>,
}

impl SideBySide {
    /// The table as text, every line starting with `#` so it cannot be mistaken for IMB's
    /// rows: the key, each mode's value (2 decimals), then `MODE/BASE` for every mode after
    /// the first (3 decimals; above 1 means more of the value than the base mode).
    pub fn render(&self) -> String {
        let width = 14usize;
        let base = self.modes.first().copied();
        let mut head = format!("#{:>13}", self.key_heading);
        for m in &self.modes {
            head += &format!(" {:>width$}", format!("{m} {}", self.value_heading));
        }
        if let Some(b) = base {
            for m in self.modes.iter().skip(1) {
                head += &format!(" {:>width$}", format!("{m}/{b}"));
            }
        }
        let mut out = head + "\n";
        for (key, values) in &self.rows {
            let mut line = format!("#{key:>13}");
            for i in 0..self.modes.len() {
                match values.get(i).copied().flatten() {
                    Some(v) => line += &format!(" {v:>width$.2}"),
                    None => line += &format!(" {:>width$}", "-"),
                }
            }
            let b = values.first().copied().flatten();
            for i in 1..self.modes.len() {
                match (values.get(i).copied().flatten(), b) {
                    (Some(v), Some(b)) if b > 0.0 => line += &format!(" {:>width$.3}", v / b),
                    _ => line += &format!(" {:>width$}", "-"),
                }
            }
            out += &line;
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn strips_valued_options_in_both_spellings() {
        let args = os(&[
            "PingPong",
            "--mode",
            "all",
            "--json=x.json",
            "-msglog",
            "0:4",
            "--plot",
            "p.svg",
            "--",
            "--mode",
        ]);
        assert_eq!(
            strip_options(&args, &["--mode", "--json", "--plot"]),
            os(&["PingPong", "-msglog", "0:4", "--", "--mode"])
        );
        assert_eq!(
            strip_options(&os(&["--modex=1"]), &["--mode"]),
            os(&["--modex=1"])
        );
    }

    #[test]
    fn side_by_side_gives_ratios_to_the_first_mode() {
        let t = SideBySide {
            key_heading: "#bytes".into(),
            value_heading: "MB/s".into(),
            modes: BufferMode::ALL
                .iter()
                .map(|&mode| ModeVariant {
                    mode,
                    memlock: MemlockWorld::Machine,
                    path: HostPath::Nic,
                })
                .collect(),
            rows: vec![
                ("1024".into(), vec![Some(100.0), Some(150.0), Some(50.0)]),
                ("0".into(), vec![Some(0.0), Some(0.0), None]),
            ],
        };
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("#       #bytes"), "{text}");
        assert!(lines[0].contains("pindown/copy") && lines[0].contains("odp/copy"));
        let cells: Vec<&str> = lines[1]
            .trim_start_matches('#')
            .split_whitespace()
            .collect();
        assert_eq!(
            cells,
            ["1024", "100.00", "150.00", "50.00", "1.500", "0.500"]
        );
        let cells: Vec<&str> = lines[2]
            .trim_start_matches('#')
            .split_whitespace()
            .collect();
        assert_eq!(cells, ["0", "0.00", "0.00", "-", "-", "-"]);
    }
}
