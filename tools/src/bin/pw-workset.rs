//! `pw-workset`: two jobs whose working sets grow and shrink under one
//! memory budget, pinned (`pindown`) against on-demand paging (`odp`), as Lesokhin17 §6.1's
//! Fig. 7. Prints hits per second over time per job for both modes, and a summary; `--plot`
//! draws the figure.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pagewire_tools::workset::driver::{self, StudyConfig, StudyMode};
use pagewire_tools::workset::{self, JobArgs, StoreKind};
use pagewire_tools::Error;

/// The exit status when the study cannot run here (no cgroup v1 memory controller, or not
/// permitted), as automake's test drivers count a skip.
const EXIT_SKIPPED: i32 = 77;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Two jobs' working sets grow and shrink under one memory budget: hits/s over time, pinned vs on-demand paging (Lesokhin17 §6.1, Fig. 7)"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// The memory both item stores share: the memory cgroup's limit, less --overhead
    /// (Lesokhin17: 1 GB). Pinned, each store gets half.
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    budget: u64,
    /// Added to the cgroup's limit for the four processes' own memory (binaries, heaps,
    /// the NIC's rings and pools).
    #[arg(long, value_parser = parse_size, default_value = "128M")]
    overhead: u64,
    /// Bytes per item (Lesokhin17: 20 KB); a multiple of 8.
    #[arg(long, value_parser = parse_size, default_value = "20K")]
    item_size: u64,
    /// The small working set (Lesokhin17: 100 MB).
    #[arg(long, value_parser = parse_size, default_value = "100M")]
    small: u64,
    /// The large working set (Lesokhin17: 900 MB).
    #[arg(long, value_parser = parse_size, default_value = "900M")]
    large: u64,
    /// Seconds of the timed run of each mode (Lesokhin17: about 100).
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Seconds into the run at which the working sets change (default: half-way).
    #[arg(long)]
    switch_at: Option<f64>,
    /// Seconds per reporting window.
    #[arg(long, default_value_t = 1.0)]
    window: f64,
    /// The modes to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "pindown,odp")]
    modes: Vec<StudyMode>,
    /// The memory behind the stores of the odp runs: a file on disk (reclaimable), or
    /// anonymous memory, which the cgroup cannot reclaim without swap (to show why not).
    #[arg(long, value_enum, default_value_t = StoreKind::File)]
    odp_store: StoreKind,
    /// The memory behind the stores of the pindown runs: anonymous (the study's), or a
    /// file on disk, to see how the soft NIC pins a shared file mapping.
    #[arg(long, value_enum, default_value_t = StoreKind::Anon)]
    pindown_store: StoreKind,
    /// Directory for the store files (a disk file system, not tmpfs).
    #[arg(long, default_value = "/var/tmp")]
    store_dir: PathBuf,
    /// Write each job's raw output and the cgroup's statistics into this directory.
    #[arg(long)]
    raw_dir: Option<PathBuf>,
    /// Draw the figure (Lesokhin17 Fig. 7's three panels) into this .svg file.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One job (started by the driver; not for direct use).
    #[command(hide = true)]
    Job(JobArgs),
}

fn parse_size(s: &str) -> Result<u64, String> {
    match pagewire::nic::soft::parse_bytes(s) {
        Some(Some(n)) => Ok(n),
        _ => Err(format!("{s}: expected bytes like 104857600 or 100M")),
    }
}

fn main() {
    let args = Args::parse();
    let code = match &args.command {
        Some(Command::Job(job)) => run_job(job),
        None => run_study(&args),
    };
    match code {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pw-workset: {e:#}");
            std::process::exit(1);
        }
    }
}

/// One job: two ranks through the built-in launcher, then each rank's part.
fn run_job(job: &JobArgs) -> anyhow::Result<i32> {
    if let Some(code) = pagewire::boot::self_launch(2)? {
        return Ok(code);
    }
    let universe = pagewire::try_initialize()?.expect("first initialisation");
    workset::job::run_rank(&universe, &job.config())?;
    Ok(0)
}

fn seconds(what: &str, s: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        s.is_finite() && s > 0.0,
        "--{what} {s}: expected a positive number of seconds"
    );
    Ok(Duration::from_secs_f64(s))
}

fn run_study(args: &Args) -> anyhow::Result<i32> {
    let duration = seconds("duration", args.duration)?;
    let switch_at = seconds("switch-at", args.switch_at.unwrap_or(args.duration / 2.0))?;
    let window = seconds("window", args.window)?;
    anyhow::ensure!(
        switch_at < duration,
        "--switch-at {} must come before the end of the run (--duration {})",
        switch_at.as_secs_f64(),
        args.duration
    );
    anyhow::ensure!(
        window <= switch_at && window.as_millis() > 0,
        "--window {}: expected at least 0.001 s and at most --switch-at",
        args.window
    );
    anyhow::ensure!(
        args.item_size >= 8 && args.item_size % 8 == 0,
        "--item-size {}: expected a multiple of 8 bytes",
        args.item_size
    );
    anyhow::ensure!(
        args.small >= args.item_size && args.large >= args.item_size,
        "--small and --large must each hold at least one item of --item-size {}",
        args.item_size
    );
    anyhow::ensure!(
        args.budget >= 2 * args.item_size,
        "--budget {}: must hold at least one item per store",
        args.budget
    );
    anyhow::ensure!(!args.modes.is_empty(), "--modes: name at least one mode");
    let cfg = StudyConfig {
        budget: args.budget,
        overhead: args.overhead,
        item_size: args.item_size as usize,
        small: args.small,
        large: args.large,
        duration,
        switch_at,
        window,
        odp_store: args.odp_store,
        pindown_store: args.pindown_store,
        store_dir: args.store_dir.clone(),
        exe: std::env::current_exe()?,
    };
    // A bad PAGEWIRE_* setting is reported once, here, not by every rank.
    pagewire::UniverseConfig::from_env()?;
    let file_stores = (args.modes.contains(&StudyMode::Odp) && cfg.odp_store == StoreKind::File)
        || (args.modes.contains(&StudyMode::Pindown) && cfg.pindown_store == StoreKind::File);
    if file_stores {
        driver::check_store_dir(&cfg.store_dir)?;
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let memory = |k: StoreKind| match k {
        StoreKind::File => "a shared file mapping",
        StoreKind::Anon => "anonymous memory",
    };
    println!(
        "# pw-workset: Lesokhin17 §6.1 Fig. 7 — budget {:.0} MiB (cgroup limit {:.0} MiB with {:.0} MiB for the processes), items of {} B, working sets {:.0} MiB and {:.0} MiB, switch at {} s of {} s, soft NIC profile {}",
        mib(cfg.budget),
        mib(cfg.limit()),
        mib(cfg.overhead),
        cfg.item_size,
        mib(cfg.small),
        mib(cfg.large),
        switch_at.as_secs_f64(),
        duration.as_secs_f64(),
        std::env::var("PAGEWIRE_SOFT_PROFILE").unwrap_or_else(|_| "real".into()),
    );
    println!(
        "# stores: pindown {} items each (half the budget, {}, pinned whole); odp {} items each (the largest working set, {}, unpinned)",
        cfg.capacity_items(StudyMode::Pindown),
        memory(cfg.pindown_store),
        cfg.capacity_items(StudyMode::Odp),
        memory(cfg.odp_store),
    );
    println!(
        "# load average before: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!();
    let mut runs = Vec::new();
    for &mode in &args.modes {
        match driver::run_mode(&cfg, mode) {
            Ok(run) => {
                driver::print_windows(&cfg, &run);
                runs.push(run);
            }
            Err(Error::CgroupUnavailable(why)) => {
                println!("skipped: pw-workset needs the cgroup v1 memory controller: {why}");
                return Ok(EXIT_SKIPPED);
            }
            Err(e) => return Err(e.into()),
        }
    }
    driver::print_summary(&cfg, &runs);
    println!(
        "# load average after: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    if let Some(dir) = &args.raw_dir {
        driver::write_raw(dir, &runs)?;
    }
    if let Some(path) = &args.plot {
        workset::plot::write(
            path,
            &runs,
            window.as_secs_f64(),
            switch_at.as_secs_f64(),
            &format!(
                "Hits/s under a {:.0} MiB budget: working sets {:.0} MiB <-> {:.0} MiB at {} s",
                mib(cfg.budget),
                mib(cfg.small),
                mib(cfg.large),
                switch_at.as_secs_f64()
            ),
        )?;
    }
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r.succeeded())
        .map(|r| r.mode.name().to_string())
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "jobs failed in mode(s) {} (see above)",
        failed.join(", ")
    );
    Ok(0)
}
