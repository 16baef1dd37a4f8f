//! `imb-bench`: IMB-MPI1 and IMB-RMA on pagewire. Started without a launcher it starts itself on
//! `--np` ranks (2 by default) through the built-in launcher; under `pwrun` or (feature
//! `mpi`) `mpirun` it runs as the job's ranks. IMB's single-dash flags are accepted as IMB
//! spells them (`-msglog 0:22`, `-off_cache -1`, ...).

use std::ffi::OsString;

use anyhow::Context;
use clap::Parser;
use imb_bench::bench::Benchmark;
use imb_bench::output::{HeaderInfo, FINALIZE};
use imb_bench::report;
use imb_bench::run::{self, Options, RunResult};
use imb_bench::settings::{self, IterPolicy, Iterations, OffCache, WindowKind};
use pagewire::boot::Launcher;
use pagewire::traits::*;
use pagewire_tools::mode_all::{
    self, AllModesPlan, BenchArgs, ModeChoice, ModeVariant, TransportChoice,
};

/// The Intel MPI Benchmarks' suites imb-bench has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Suite {
    /// IMB-MPI1.
    Mpi1,
    /// IMB-RMA.
    Rma,
}

/// IMB's flags, which IMB spells with one dash; `normalise` gives them a second one.
const IMB_FLAGS: [&str; 6] = [
    "msglog",
    "iter",
    "iter_policy",
    "time",
    "npmin",
    "off_cache",
];

#[derive(Parser, Debug)]
#[command(
    name = "imb-bench",
    version,
    about = "The Intel MPI Benchmarks' MPI-1 part (IMB-MPI1) and one-sided part (IMB-RMA) on \
             pagewire, in every buffer mode",
    after_help = "IMB's flags are also accepted with one dash, as IMB-MPI1 spells them: \
                  -msglog, -iter, -iter_policy, -time, -npmin, -off_cache.\n\
                  Example: imb-bench PingPong Allreduce -msglog 0:16 -off_cache -1 --mode all\n\
                  IMB-RMA: imb-bench --suite rma, or its benchmarks by name (Unidir_put ...)"
)]
struct Args {
    /// Benchmarks to run, IMB's names, case-insensitive (default: all of the suite, in
    /// IMB's order).
    #[arg(value_name = "BENCHMARK")]
    benchmarks: Vec<String>,
    /// The suite whose benchmarks run when none is named: `mpi1` (IMB-MPI1's 18) or `rma`
    /// (IMB-RMA's 17, on `pagewire::window`).
    #[arg(long, value_enum, default_value_t = Suite::Mpi1)]
    suite: Suite,
    /// Message sizes 0 and 2^MIN .. 2^MAX bytes (IMB `-msglog`).
    #[arg(long = "msglog", value_name = "MIN:MAX", default_value = "0:22")]
    msglog: String,
    /// Repetitions: MSGSPERSAMPLE[,OVERALL_VOL in MiB] (IMB `-iter`; default 1000,40:
    /// min(1000, 40 MiB / size)).
    #[arg(long = "iter", value_name = "N[,MIB]")]
    iter: Option<String>,
    /// IMB's `-iter_policy`: `dynamic` also caps the repetitions at `-time` seconds per
    /// size, measured by preparatory runs; `off` runs exactly the `-iter` repetitions.
    #[arg(long = "iter_policy", value_enum, default_value_t = IterPolicy::Dynamic)]
    iter_policy: IterPolicy,
    /// Seconds per size at most, with `-iter_policy dynamic` (IMB `-time`).
    #[arg(long = "time", value_name = "SECS", default_value_t = settings::SECS_PER_SAMPLE)]
    time: f64,
    /// Smallest process count of the collectives and Sendrecv/Exchange; then doubled up to
    /// the job's size (IMB `-npmin`).
    #[arg(long = "npmin", value_name = "NP", default_value_t = 2)]
    npmin: usize,
    /// Rotate through buffers spanning twice this last-level cache (MiB; `-1` = 8 MiB with
    /// 64-byte lines), as IMB `-off_cache cache_size[,cache_line_size]`.
    #[arg(
        long = "off_cache",
        value_name = "SIZE[,LINE]",
        allow_hyphen_values = true
    )]
    off_cache: Option<String>,
    /// IMB-RMA's windows: `create` over the benchmark's own memory, as IMB-RMA's
    /// `MPI_Win_create`, or `allocate`d by the window (`MPI_Win_allocate`).
    #[arg(long, value_enum, default_value_t = WindowKind::Create)]
    window: WindowKind,
    #[command(flatten)]
    bench: BenchArgs,
    /// No progress bar on stderr (it appears only when stderr is a terminal).
    #[arg(long)]
    no_progress: bool,
}

/// `-msglog` → `--msglog` etc., so that clap, which knows long flags with two dashes only,
/// takes IMB's spelling. Values (such as `-1` after `-off_cache`) are left alone.
fn normalise(args: &[OsString]) -> Vec<OsString> {
    args.iter()
        .enumerate()
        .map(|(i, a)| {
            let s = a.to_string_lossy();
            let is_imb_flag = i > 0
                && s.strip_prefix('-').is_some_and(|rest| {
                    !rest.starts_with('-')
                        && IMB_FLAGS
                            .iter()
                            .any(|f| rest == *f || rest.starts_with(&format!("{f}=")))
                });
            if is_imb_flag {
                OsString::from(format!("-{s}"))
            } else {
                a.clone()
            }
        })
        .collect()
}

fn options(args: &Args) -> anyhow::Result<Options> {
    let benchmarks = if args.benchmarks.is_empty() {
        match args.suite {
            Suite::Mpi1 => Benchmark::ALL.to_vec(),
            Suite::Rma => Benchmark::RMA.to_vec(),
        }
    } else {
        args.benchmarks
            .iter()
            .map(|n| {
                Benchmark::from_name(n).with_context(|| {
                    format!(
                        "unknown benchmark {n:?}; IMB-MPI1's are: {}; IMB-RMA's: {}",
                        Benchmark::ALL.map(|b| b.name()).join(" "),
                        Benchmark::RMA.map(|b| b.name()).join(" ")
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let (min, max) = settings::parse_msglog(&args.msglog).map_err(anyhow::Error::msg)?;
    let mut iterations = match &args.iter {
        Some(s) => Iterations::parse(s).map_err(anyhow::Error::msg)?,
        None => Iterations::default(),
    };
    iterations.policy = args.iter_policy;
    anyhow::ensure!(args.time > 0.0, "-time {}: expected seconds > 0", args.time);
    iterations.secs = args.time;
    anyhow::ensure!(args.npmin > 0, "-npmin must be at least 1");
    let off_cache = args
        .off_cache
        .as_deref()
        .map(OffCache::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(Options {
        benchmarks,
        sizes: settings::msglog_sizes(min, max),
        iterations,
        off_cache,
        npmin: args.npmin,
        window: args.window,
        progress: !args.no_progress,
    })
}

fn main() -> std::process::ExitCode {
    pagewire::environment::exit_code("imb-bench", run())
}

fn run() -> anyhow::Result<()> {
    let raw: Vec<OsString> = std::env::args_os().collect();
    let normalised = normalise(&raw);
    let args = Args::parse_from(&normalised);
    let opts = options(&args)?;
    if args.bench.transport == Some(TransportChoice::Mpi) {
        anyhow::ensure!(
            args.bench.mode != Some(ModeChoice::All),
            "--mode all compares pagewire's buffer modes; with --transport mpi the host MPI \
             library moves the data and there is no buffer mode: leave out one of the two"
        );
        anyhow::ensure!(
            matches!(Launcher::detect(), Launcher::Mpi(_)),
            "--transport mpi forwards every call to the host MPI library, so imb-bench must \
             be started by mpirun (and built with --features mpi), e.g. \
             mpirun -np 2 imb-bench --transport mpi PingPong"
        );
    }
    // A bad PAGEWIRE_* setting is reported once, here, not by every rank started below.
    pagewire::UniverseConfig::from_env()?;
    if args.bench.mode == Some(ModeChoice::All) {
        return all_modes(&args, &normalised);
    }
    if let Some(code) = pagewire::boot::self_launch(args.bench.np)? {
        std::process::exit(code);
    }
    let mode = args.bench.mode.and_then(ModeChoice::single);
    let cfg = mode_all::universe_config(mode, args.bench.transport)?;
    let universe = pagewire::Universe::from_config(cfg)?.context("pagewire already initialised")?;
    let world = universe.world();
    let transport = match universe.transport() {
        pagewire::TransportKind::HostMpi => "mpi".to_string(),
        pagewire::TransportKind::Pagewire => {
            std::env::var("PAGEWIRE_TRANSPORT").unwrap_or_else(|_| "soft".into())
        }
    };
    let max_size = opts.sizes.last().copied().unwrap_or(0);
    let header = HeaderInfo::of_this_machine(
        format!(
            "pagewire {} (transport {transport}, buffer mode {}, ranks of one host through {})",
            env!("CARGO_PKG_VERSION"),
            universe.mode_name(),
            universe.local_path()
        ),
        raw.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        max_size,
        opts.benchmarks.clone(),
    )
    .render(&if opts.benchmarks.iter().all(|b| b.kind().is_rma()) {
        format!(
            "pagewire imb-bench {}, IMB-RMA 2021's MPI-RMA part reimplemented",
            env!("CARGO_PKG_VERSION")
        )
    } else {
        format!(
            "pagewire imb-bench {}, IMB-MPI1 2021's MPI-1 part reimplemented",
            env!("CARGO_PKG_VERSION")
        )
    });
    let tables = run::run(&universe, &opts, &header);
    if world.rank() != 0 {
        return Ok(());
    }
    let result = RunResult {
        mode: universe.mode_name().to_string(),
        transport,
        ranks: world.size() as usize,
        iterations: opts.iterations,
        off_cache: opts.off_cache,
        tables,
    };
    print!("{}", report::counters_section(&result));
    println!("{FINALIZE}");
    if let Some(path) = &args.bench.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.bench.plot {
        for file in report::plot(&[(result.mode.clone(), &result)], path)? {
            eprintln!("imb-bench: wrote {}", file.display());
        }
    }
    Ok(())
}

/// `--mode all`: one job per mode through the launcher (each prints its own IMB output),
/// then the side-by-side, the combined JSON and the plots.
fn all_modes(args: &Args, normalised: &[OsString]) -> anyhow::Result<()> {
    let ranks = match mode_all::all_modes_plan(args.bench.np, "imb-bench")? {
        AllModesPlan::Idle => return Ok(()),
        AllModesPlan::Launch { ranks } => ranks,
    };
    let child_args = mode_all::strip_options(
        &normalised[1..],
        &["--mode", "--json", "--plot", "--memlock"],
    );
    let variants = ModeVariant::all(args.bench.memlock);
    let runs = mode_all::run_each_mode::<RunResult>(ranks, &child_args, &variants)?;
    print!("{}", report::side_by_side(&runs));
    if let Some(path) = &args.bench.json {
        let all: Vec<_> = runs
            .iter()
            .map(|r| serde_json::json!({ "mode": r.mode.to_string(), "result": r.result }))
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&all)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.bench.plot {
        let labelled: Vec<(String, &RunResult)> = runs
            .iter()
            .map(|r| (r.mode.to_string(), &r.result))
            .collect();
        for file in report::plot(&labelled, path)? {
            eprintln!("imb-bench: wrote {}", file.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imb_spelling_is_accepted() {
        let raw: Vec<OsString> = [
            "imb-bench",
            "pingpong",
            "-msglog",
            "0:4",
            "-off_cache",
            "-1",
            "-npmin=1",
            "--mode",
            "all",
            "-iter",
            "100",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let args = Args::parse_from(normalise(&raw));
        assert_eq!(args.msglog, "0:4");
        assert_eq!(args.off_cache.as_deref(), Some("-1"));
        assert_eq!(args.npmin, 1);
        assert_eq!(args.bench.mode, Some(ModeChoice::All));
        let opts = options(&args).unwrap();
        assert_eq!(opts.benchmarks, [Benchmark::PingPong]);
        assert_eq!(opts.sizes, [0, 1, 2, 4, 8, 16]);
        assert_eq!(opts.iterations.msgs_per_sample, 100);
        assert!(opts.off_cache.is_some());
        let bad = Args::parse_from(["imb-bench", "Uniband"]);
        assert!(options(&bad).unwrap_err().to_string().contains("PingPong"));
    }
}
