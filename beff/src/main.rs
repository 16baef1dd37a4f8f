//! `beff`: the effective bandwidth benchmark b_eff (version 3.6's definition) on pagewire.
//! Started without a launcher it starts itself on `--np` ranks (2); under `pwrun` or (feature
//! `mpi`) `mpirun` it runs on the job's ranks. `--mode all` runs once per buffer mode and
//! prints the three side by side (Lesokhin17 Table 6).

use std::ffi::OsString;
use std::path::Path;

use anyhow::Context;
use clap::Parser;
use pagewire::traits::*;
use pagewire::{TransportKind, Universe};
use pagewire_tools::mode_all::{self, AllModesPlan, BenchArgs, ModeChoice, ModeVariant};
use pagewire_tools::msgperf;
use pagewire_tools::plot::{LinePlot, Series};

use beff::analysis::analyze;
use beff::lengths::{lmax, message_lengths};
use beff::measure::{measure, Settings};
use beff::patterns::all_patterns;
use beff::report::{self, RunReport, SystemInfo};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "b_eff, the effective bandwidth benchmark (Rabenseifner, version 3.6), on pagewire"
)]
struct Args {
    /// Memory per process in MB (b_eff's MEMORY_PER_PROCESSOR): the largest message is
    /// Lmax = MB / 128 (1 MB at the default).
    #[arg(long, value_name = "MB", default_value_t = 128,
          value_parser = clap::value_parser!(u64).range(1..))]
    memory_per_process: u64,
    /// b_eff's -DSHORT: 2 repetitions, 50 ms per length and method, 6 random patterns.
    #[arg(long)]
    short: bool,
    /// b_eff's -DTEST: 5 ms per length and method, the two largest lengths shortened when
    /// they would take over 1 s, 2 random patterns (the reference run used --short --test).
    #[arg(long)]
    test: bool,
    /// Random patterns (default 30; 6 with --short, 2 with --test).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    random: Option<u64>,
    /// srand48 seed of the random patterns (default: the time, as b_eff; printed).
    #[arg(long)]
    seed: Option<i64>,
    /// Measure the two largest lengths with every method and repetition even when slow
    /// (b_eff's -DNOshortlasttwo).
    #[arg(long)]
    no_short_last_two: bool,
    /// Check every byte of every message (b_eff checks the first and the last).
    #[arg(long)]
    verify: bool,
    #[command(flatten)]
    bench: BenchArgs,
}

impl Args {
    fn random_patterns(&self) -> usize {
        match self.random {
            Some(n) => n as usize,
            None if self.test => 2,
            None if self.short => 6,
            None => 30,
        }
    }

    fn settings(&self) -> Settings {
        Settings {
            repetitions: if self.short { 2 } else { 3 },
            time_per_loop: match (self.short, self.test) {
                (_, true) => 5e-3,
                (true, false) => 5e-2,
                (false, false) => 0.5,
            },
            max_for_last_two: if self.test { 1.0 } else { 60.0 },
            shorten_last_two: !self.no_short_last_two,
            verify: self.verify,
        }
    }
}

/// b_eff's default seed: the time of day.
fn time_seed() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn main() -> std::process::ExitCode {
    pagewire::environment::exit_code("beff", run())
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = std::time::Instant::now();
    // A bad PAGEWIRE_* setting is reported once, here, not by every rank started below.
    pagewire::UniverseConfig::from_env()?;
    if args.bench.mode == Some(ModeChoice::All) {
        return all_modes(&args);
    }
    if let Some(code) = pagewire::boot::self_launch(args.bench.np)? {
        std::process::exit(code);
    }
    let cfg = mode_all::universe_config(
        args.bench.mode.and_then(ModeChoice::single),
        args.bench.transport,
    )?;
    let universe = Universe::from_config(cfg)?.context("pagewire is already initialised")?;
    let world = universe.world();
    let n = world.size() as usize;
    let rank0 = world.rank() == 0;
    let mut seed = [args.seed.unwrap_or_else(time_seed)];
    world.process_at_rank(0).broadcast_into(&mut seed[..]);
    let seed = seed[0];
    let patterns = all_patterns(n, args.random_patterns(), seed);
    let lmax = lmax(args.memory_per_process);
    let (lengths, factor) = message_lengths(lmax);
    let on_mpi = universe.transport() == TransportKind::HostMpi;
    let (mode, transport) = if on_mpi {
        ("mpi".to_string(), "mpi".to_string())
    } else {
        let provider = std::env::var("PAGEWIRE_TRANSPORT").unwrap_or_else(|_| "soft".into());
        (universe.mode_name().to_string(), provider)
    };
    if rank0 {
        println!(
            "# beff: b_eff {} on pagewire, {n} processes, mode {mode}, transport {transport}, \
             ranks of one host through {}",
            report::REVISION,
            universe.local_path()
        );
        println!(
            "# random patterns: {} from srand48 seed {seed} (repeat with --seed {seed})",
            args.random_patterns()
        );
        if n == 1 {
            println!(
                "# one process: every pattern sends to itself, and there is no ping-pong pair"
            );
        }
        print!(
            "{}",
            report::head(args.memory_per_process, &lengths, &patterns)
        );
    }
    let settings = args.settings();
    let m = measure(&universe, &patterns, &lengths, factor, &settings)?;
    if !rank0 {
        return Ok(());
    }
    let kinds: Vec<_> = patterns.iter().map(|p| p.kind).collect();
    let accumulation: Vec<f64> = patterns.iter().map(|p| p.accumulation).collect();
    let analysis = analyze(&m.min_bw, &kinds, &accumulation, n);
    let rows = report::length_rows(&analysis, &lengths);
    let run = RunReport {
        mode,
        transport,
        processes: n,
        memory_per_process_mb: args.memory_per_process,
        variant: report::variant(args.short, args.test).into(),
        seed,
        patterns: patterns.iter().map(|p| p.description.clone()).collect(),
        lengths: rows,
        summary: report::summary(&analysis, lmax),
        shortened: m.shortened,
        measurement_seconds: m.elapsed,
        messages_checked: m.messages_checked,
        verified: args.verify,
        counters: m.counters,
    };
    let info = SystemInfo::read();
    let date = pagewire_tools::timestamp::ctime_local(time_seed());
    print!("{}", report::length_table(&run.lengths, run.shortened));
    print!(
        "{}",
        report::summary_section(&run, &info, &date, started.elapsed().as_secs_f64())
    );
    let line = report::summary_line(&run, &info);
    println!("{line}");
    eprintln!("{line}");
    println!(
        "# measurement loop {:.3} s; {} messages checked ({})",
        run.measurement_seconds,
        run.messages_checked,
        if run.verified {
            "every byte"
        } else {
            "first and last byte"
        }
    );
    if let Some(counters) = &run.counters {
        let rows: Vec<msgperf::Row> = run
            .lengths
            .iter()
            .zip(counters)
            .map(|(r, c)| msgperf::Row {
                bytes: r.length,
                repetitions: 0,
                t_usec: 0.0,
                mbytes_per_sec: r.accumulated,
                counters: *c,
            })
            .collect();
        println!("# per length, all processes (timed and untimed loops):");
        msgperf::print_counters(&rows);
    }
    if let Some(path) = &args.bench.json {
        write_json(path, &run)?;
    }
    if let Some(path) = &args.bench.plot {
        plot_one(&run).write(path)?;
        println!("# plot written to {}", path.display());
    }
    Ok(())
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Per process: b_eff and its ring and random parts against the message length.
fn plot_one(run: &RunReport) -> LinePlot {
    let line = |label: &str, f: fn(&report::LengthRow) -> f64| {
        Series::new(
            label,
            run.lengths
                .iter()
                .map(|r| (r.length as f64, f(r)))
                .collect(),
        )
    };
    LinePlot {
        title: format!(
            "b_eff per process, {} processes, mode {} (b_eff = {:.0} MB/s)",
            run.processes, run.mode, run.summary.b_eff
        ),
        x_label: "message length [bytes]".into(),
        y_label: "bandwidth per process [MB/s]".into(),
        series: vec![
            line("rings & random", |r| r.per_process),
            line("rings", |r| r.rings_per_process),
            line("random", |r| r.random_per_process),
        ],
    }
}

/// `--mode all`: one job per buffer mode with the same seed, then the modes side by side.
fn all_modes(args: &Args) -> anyhow::Result<()> {
    let ranks = match mode_all::all_modes_plan(args.bench.np, "beff")? {
        AllModesPlan::Idle => return Ok(()),
        AllModesPlan::Launch { ranks } => ranks,
    };
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut job_args = mode_all::strip_options(
        &argv,
        &["--mode", "--json", "--plot", "--seed", "--memlock"],
    );
    // The same random patterns in every mode.
    let seed = args.seed.unwrap_or_else(time_seed);
    job_args.extend(["--seed".into(), seed.to_string().into()]);
    let runs: Vec<mode_all::ModeRun<RunReport>> =
        mode_all::run_each_mode(ranks, &job_args, &ModeVariant::all(args.bench.memlock))?;
    let modes: Vec<ModeVariant> = runs.iter().map(|r| r.mode).collect();
    let first = &runs[0].result;
    println!();
    println!(
        "# beff --mode all: {} processes, {} MB per process, seed {seed} (Lesokhin17 Table 6: \
         b_eff in MB/s with pinning, NPF and copying)",
        first.processes, first.memory_per_process_mb
    );
    let summary = mode_all::SideBySide {
        key_heading: "".into(),
        value_heading: "MB/s".into(),
        modes: modes.clone(),
        rows: <[(&str, fn(&RunReport) -> f64); 5]>::into_iter([
            ("b_eff", |r: &RunReport| r.summary.b_eff),
            ("b_eff/PE", |r: &RunReport| r.summary.b_eff_per_process),
            ("at Lmax", |r: &RunReport| r.summary.at_lmax),
            ("rings@Lmax", |r: &RunReport| r.summary.at_lmax_rings),
            ("pingpong", |r: &RunReport| r.summary.pingpong_bandwidth),
        ])
        .map(|(key, f)| {
            (
                key.to_string(),
                runs.iter().map(|r| Some(f(&r.result))).collect(),
            )
        })
        .collect(),
    };
    print!("{}", summary.render());
    println!("#");
    println!("# b_eff at each message length (accumulated, rings & random):");
    let per_length = mode_all::SideBySide {
        key_heading: "msg length".into(),
        value_heading: "MB/s".into(),
        modes,
        rows: (0..first.lengths.len())
            .map(|i| {
                (
                    first.lengths[i].length.to_string(),
                    runs.iter()
                        .map(|r| r.result.lengths.get(i).map(|row| row.accumulated))
                        .collect(),
                )
            })
            .collect(),
    };
    print!("{}", per_length.render());
    if let Some(path) = &args.bench.json {
        let all: serde_json::Map<String, serde_json::Value> = runs
            .iter()
            .map(|r| Ok((r.mode.to_string(), serde_json::to_value(&r.result)?)))
            .collect::<anyhow::Result<_>>()?;
        write_json(path, &serde_json::json!({ "seed": seed, "modes": all }))?;
    }
    if let Some(path) = &args.bench.plot {
        let plot = LinePlot {
            title: format!(
                "b_eff per message length, {} processes, {} MB per process",
                first.processes, first.memory_per_process_mb
            ),
            x_label: "message length [bytes]".into(),
            y_label: "accumulated bandwidth [MB/s]".into(),
            series: runs
                .iter()
                .map(|r| {
                    Series::new(
                        format!("{} (b_eff {:.0})", r.mode, r.result.summary.b_eff),
                        r.result
                            .lengths
                            .iter()
                            .map(|l| (l.length as f64, l.accumulated))
                            .collect(),
                    )
                })
                .collect(),
        };
        plot.write(path)?;
        println!("# plot written to {}", path.display());
    }
    Ok(())
}
