//! `pwrun`: pagewire's built-in launcher (docs/architecture.md).
//!
//! `pwrun -n N [--bind-to core|numa|none] [--timeout SECONDS] [--env KEY=VALUE]... [--]
//! PROGRAM [ARGS]...` starts N local ranks of PROGRAM, bound to cores or NUMA nodes, serves
//! their bootstrap, and takes the job down when a rank fails. The heavy lifting is
//! `pagewire_transport::boot::launch`.
//!
//! `pwrun --hosts h1,h2[:slots] [-n N] ...` runs the job across hosts, through an agent per
//! host started by `PAGEWIRE_RSH` (default `ssh`): `pagewire_transport::boot::hosts`. The
//! agents are this program too (`pwrun --agent`, `pwrun --agent-clean JOB`: not for users).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::{Parser, ValueEnum};
use pagewire_transport::boot::binding::BindTo;
use pagewire_transport::boot::hosts::{self, HostList};
use pagewire_transport::boot::{launch, launcher, LaunchConfig};
use pagewire_transport::env::settings;
use pagewire_transport::sys::Error;

/// Start N local ranks of PROGRAM under pagewire's built-in launcher.
#[derive(Debug, Parser)]
#[command(
    name = "pwrun",
    version,
    about,
    override_usage = "pwrun -n N [--bind-to core|numa|none] [--timeout SECONDS] [--env KEY=VALUE]... [--] PROGRAM [ARGS]...\n       pwrun --hosts HOST[:SLOTS],... [-n N] [OPTIONS] [--] PROGRAM [ARGS]...",
    after_help = "Exit status: 0 when every rank exits 0; else the first failing rank's \
                  status (128+N if killed by signal N), 124 on timeout, 2 on bad usage."
)]
struct Cli {
    /// Number of ranks to start (`-np N` is taken too). With --hosts, default: the sum of
    /// the slots.
    #[arg(
        short = 'n',
        long = "np",
        value_name = "N",
        required_unless_present = "hosts",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    ranks: Option<u32>,

    /// Run the ranks on these hosts, filling each with SLOTS ranks (default 1) in turn,
    /// through an agent per host started by the remote shell in PAGEWIRE_RSH (default
    /// `ssh`). The hosts must share this program's path, PROGRAM and the working directory.
    #[arg(long, value_name = "HOST[:SLOTS],...", value_parser = HostList::parse)]
    hosts: Option<HostList>,

    /// Bind each rank to a core, to the CPUs of a NUMA node, or not at all. Default: core
    /// when every rank gets a core of its own, else none (with a note).
    #[arg(long = "bind-to", value_enum, value_name = "WHAT")]
    bind_to: Option<BindArg>,

    /// Stop the job after SECONDS (fractions allowed); the exit status is then 124.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    timeout: Option<Duration>,

    /// Set KEY=VALUE in every rank's environment (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(OsString, OsString)>,

    /// The program every rank runs, followed by its arguments (passed through as is).
    #[arg(
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// `--bind-to` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BindArg {
    /// One core (all its hardware threads) per rank; ranks fill cores in topology order.
    Core,
    /// All CPUs of the NUMA node of the rank's core.
    Numa,
    /// No binding: ranks inherit pwrun's CPU affinity.
    None,
}

impl From<BindArg> for BindTo {
    fn from(b: BindArg) -> BindTo {
        match b {
            BindArg::Core => BindTo::Core,
            BindArg::Numa => BindTo::Numa,
            BindArg::None => BindTo::None,
        }
    }
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("the timeout must be positive, got {s}"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}`: {e}"))
}

fn parse_env(s: &str) -> Result<(OsString, OsString), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.into(), value.into())),
        _ => Err(format!("`{s}` is not of the form KEY=VALUE")),
    }
}

/// Runs the job; returns the exit status for `pwrun`.
fn run(cli: Cli) -> Result<i32> {
    let mut command = cli.command.into_iter();
    let program = PathBuf::from(command.next().ok_or_else(|| anyhow!("no PROGRAM given"))?);
    let ranks = match (cli.ranks, &cli.hosts) {
        (Some(n), _) => n as usize,
        (None, Some(h)) => h.slots(),
        (None, None) => unreachable!("clap requires -n without --hosts"),
    };
    // A misspelt setting, in pwrun's environment or in --env, is reported once here rather
    // than by every rank.
    settings::check_environment()?;
    settings::check_names(cli.env.iter().filter_map(|(k, _)| k.to_str()))?;
    // So are bad values in pwrun's environment (the ranks inherit it).
    if std::env::var("PAGEWIRE_TRANSPORT").as_deref() == Ok("mpi") {
        anyhow::bail!(
            "PAGEWIRE_TRANSPORT=mpi: the mpi transport runs under an MPI library's mpirun \
             (feature `mpi`), not under pwrun"
        );
    }
    pagewire::UniverseConfig::from_env()?;
    let cfg = LaunchConfig {
        ranks,
        program,
        args: command.collect(),
        timeout: cli.timeout,
        env: cli.env,
        bind: cli.bind_to.map_or(BindTo::Auto, BindTo::from),
    };
    let outcome = match &cli.hosts {
        Some(list) => hosts::launch_hosts(&cfg, list, &hosts::rsh_from_env()?),
        None => launch(&cfg),
    };
    let outcome = outcome.map_err(|e| match e {
        Error::Launcher(msg) => anyhow!(msg),
        e => anyhow!(e),
    })?;
    if let Some(message) = &outcome.message {
        launcher::report_line(message);
    }
    Ok(outcome.exit_code)
}

/// MPI launchers' `-np N`, which clap would read as `-n p`, as `--np N`: among pwrun's own
/// options only, not in PROGRAM's arguments.
fn np_as_long(args: Vec<OsString>) -> Vec<OsString> {
    const TAKE_VALUE: [&str; 7] = [
        "-n",
        "--np",
        "-np",
        "--bind-to",
        "--timeout",
        "--env",
        "--hosts",
    ];
    let mut out = Vec::with_capacity(args.len());
    let mut args = args.into_iter();
    out.extend(args.next());
    let mut value_next = false;
    for a in args.by_ref() {
        let s = a.to_str().unwrap_or("");
        if value_next {
            value_next = false;
        } else if s == "--" || !s.starts_with('-') {
            out.push(a);
            break;
        } else {
            value_next = TAKE_VALUE.contains(&s);
        }
        out.push(if s == "-np" { "--np".into() } else { a });
    }
    out.extend(args);
    out
}

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    // The agent of a host of `pwrun --hosts`, started by the frontend.
    match args.get(1).and_then(|a| a.to_str()) {
        Some("--agent") if args.len() == 2 => std::process::exit(hosts::run_agent()),
        Some("--agent-clean") if args.len() == 3 => {
            let job = args[2].to_string_lossy();
            match hosts::clean_host(&job) {
                Ok(removed) => {
                    println!("{removed}");
                    std::process::exit(0)
                }
                Err(e) => {
                    launcher::report_line(&format!("pwrun --agent-clean: {e}"));
                    std::process::exit(2)
                }
            }
        }
        _ => {}
    }
    let cli = Cli::parse_from(np_as_long(args));
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            launcher::report_line(&format!("pwrun: {e:#}"));
            2
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn np_is_read_as_mpirun_reads_it_before_the_program_only() {
        assert_eq!(
            np_as_long(words("pwrun --hosts a,b -np 4 prog -np 3")),
            words("pwrun --hosts a,b --np 4 prog -np 3")
        );
        assert_eq!(
            np_as_long(words("pwrun --env X=-np -n 2 -- prog")),
            words("pwrun --env X=-np -n 2 -- prog")
        );
    }
}
