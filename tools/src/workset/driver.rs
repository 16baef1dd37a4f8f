//! The study's driver: for each buffer mode, a memory cgroup with the budget as its limit,
//! the two jobs started in it at once (each on two ranks through the built-in launcher),
//! their outputs collected, the cgroup's statistics read and the cgroup removed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cgroup::{CgroupStats, MemoryCgroup};
use super::job::StoreKind;
use super::report::{self, Window};
use super::schedule::JobKind;
use super::JobArgs;
use crate::error::{Error, Result};

/// How the item stores get to the NIC: the seed's two configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StudyMode {
    /// `PAGEWIRE_MODE=pindown`: each store holds half the budget, anonymous memory pinned
    /// whole at the start (Lesokhin17: "we have no choice but to statically divide the
    /// physical memory between the two, 500MB per instance").
    Pindown,
    /// `PAGEWIRE_MODE=odp`: each store can hold the largest working set, unpinned, and the
    /// kernel lends the budget to whichever job uses it (Lesokhin17: "pages are mapped in
    /// the IOMMU on demand based on actual usage").
    Odp,
}

impl StudyMode {
    /// The `PAGEWIRE_MODE` value.
    pub fn name(self) -> &'static str {
        match self {
            StudyMode::Pindown => "pindown",
            StudyMode::Odp => "odp",
        }
    }
}

/// The study's settings.
#[derive(Clone, Debug)]
pub struct StudyConfig {
    /// The memory the two stores share, in bytes (the seed's 1 GB).
    pub budget: u64,
    /// Added to the cgroup's limit for the processes' own memory (binaries, heaps, the
    /// NIC's rings and pools), so the stores get the budget.
    pub overhead: u64,
    /// Bytes per item (the seed's 20 KB).
    pub item_size: usize,
    /// The small working set, bytes (the seed's 100 MB).
    pub small: u64,
    /// The large working set, bytes (the seed's 900 MB).
    pub large: u64,
    /// The timed run.
    pub duration: Duration,
    /// When the working sets change.
    pub switch_at: Duration,
    /// Reporting window.
    pub window: Duration,
    /// The store's memory in `odp` runs (a file; `anon` shows why not).
    pub odp_store: StoreKind,
    /// The store's memory in `pindown` runs (anonymous; `file` shows what pinning a
    /// shared file mapping does).
    pub pindown_store: StoreKind,
    /// Where the file stores and the start signals go (a disk file system).
    pub store_dir: PathBuf,
    /// This program, started as the jobs.
    pub exe: PathBuf,
}

impl StudyConfig {
    /// The cgroup's limit: budget plus overhead.
    pub fn limit(&self) -> u64 {
        self.budget + self.overhead
    }

    fn items(&self, bytes: u64) -> u64 {
        (bytes / self.item_size as u64).max(1)
    }

    /// Items per store in `mode`: half the budget when pinned, the largest working set
    /// with ODP.
    pub fn capacity_items(&self, mode: StudyMode) -> u64 {
        match mode {
            StudyMode::Pindown => self.items(self.budget / 2),
            StudyMode::Odp => self.items(self.small.max(self.large)),
        }
    }
}

/// The settings the jobs of `mode` get beyond `PAGEWIRE_MODE`, each unless the
/// environment already sets it:
///
/// - `PAGEWIRE_WAIT=yield`: two jobs of two ranks share the cores, four ranks on this
///   2-core machine, and each launcher sees only its own two ranks, so a rank waiting for a
///   reply must give its core to the other job's ranks instead of spinning out its time
///   slice;
/// - pinned: `PAGEWIRE_MEMLOCK_LIMIT=unlimited`, since each store is pinned whole and the
///   NIC keeps its own memlock account;
/// - odp with a file store: `PAGEWIRE_SOFT_ODP_CHECK=pagemap`. The memory monitor
///   (userfaultfd) cannot watch file mappings and does not see reclaim at all, so under it
///   an unwatchable range stays present only until the owner's next post and every GET
///   takes a network page fault; with the pagemap check the NIC reads the owner's page
///   tables before each DMA, so a page the kernel reclaimed (its page-table entry gone) is a
///   network page fault and a resident one is not, as the kernel's ODP learns of reclaim
///   from its MMU notifier.
pub fn job_env(cfg: &StudyConfig, mode: StudyMode) -> Vec<(&'static str, &'static str)> {
    let mut env = vec![("PAGEWIRE_WAIT", "yield")];
    match mode {
        StudyMode::Pindown => env.push(("PAGEWIRE_MEMLOCK_LIMIT", "unlimited")),
        StudyMode::Odp if cfg.odp_store == StoreKind::File => {
            env.push(("PAGEWIRE_SOFT_ODP_CHECK", "pagemap"))
        }
        StudyMode::Odp => {}
    }
    env.retain(|(k, _)| std::env::var_os(k).is_none());
    env
}

/// One job's run.
#[derive(Clone, Debug)]
pub struct JobRun {
    /// The job.
    pub job: JobKind,
    /// Its standard output (the launcher forwards both ranks').
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Its exit code (`None`: killed by a signal).
    pub exit_code: Option<i32>,
}

/// One mode's run: both jobs, the cgroup's statistics.
#[derive(Clone, Debug)]
pub struct ModeRun {
    /// The mode.
    pub mode: StudyMode,
    /// Items per store.
    pub capacity_items: u64,
    /// Growing, then shrinking.
    pub jobs: Vec<JobRun>,
    /// The cgroup's statistics at the end.
    pub cgroup: CgroupStats,
}

impl ModeRun {
    /// Every window of both jobs.
    pub fn windows(&self) -> Vec<Window> {
        self.jobs
            .iter()
            .flat_map(|j| report::windows(&j.stdout))
            .collect()
    }

    /// Whether both jobs ended well.
    pub fn succeeded(&self) -> bool {
        self.jobs.iter().all(|j| j.exit_code == Some(0))
    }
}

/// Checks that `dir` can hold reclaimable file stores: a disk file system, not tmpfs (whose
/// pages, like anonymous memory, cannot be reclaimed without swap).
pub fn check_store_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    match pagewire_transport::sys::memory_file_system(dir) {
        Some(t) => Err(Error::Workset(format!(
            "--store-dir {}: a {t} file system; the file stores must be on a disk file \
             system, whose page cache the cgroup can reclaim (tmpfs needs swap for that)",
            dir.display()
        ))),
        None => Ok(()),
    }
}

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Runs both jobs in `mode` under one memory cgroup and collects what they print.
pub fn run_mode(cfg: &StudyConfig, mode: StudyMode) -> Result<ModeRun> {
    let tag = format!("pagewire-workset-{}-{}", std::process::id(), mode.name());
    let cgroup = MemoryCgroup::create(&tag, cfg.limit())?;
    let run_dir = cfg.store_dir.join(&tag);
    std::fs::create_dir_all(&run_dir).map_err(|e| Error::Io {
        path: run_dir.clone(),
        source: e,
    })?;
    let result = run_jobs(cfg, mode, &cgroup, &run_dir);
    let _ = std::fs::remove_dir_all(&run_dir);
    let (jobs, capacity_items) = result?;
    let stats = cgroup.stats()?;
    drop(cgroup);
    Ok(ModeRun {
        mode,
        capacity_items,
        jobs,
        cgroup: stats,
    })
}

/// Kills and reaps the children still running (only processes this driver started).
struct Children(Vec<(JobKind, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn run_jobs(
    cfg: &StudyConfig,
    mode: StudyMode,
    cgroup: &MemoryCgroup,
    run_dir: &Path,
) -> Result<(Vec<JobRun>, u64)> {
    let capacity_items = cfg.capacity_items(mode);
    let store = match mode {
        StudyMode::Pindown => cfg.pindown_store,
        StudyMode::Odp => cfg.odp_store,
    };
    let mut children = Children(Vec::new());
    let mut readers = Vec::new();
    for job in JobKind::BOTH {
        let args = JobArgs {
            job,
            store,
            store_path: run_dir.join(format!("store-{}", job.name())),
            capacity_items,
            item_size: cfg.item_size,
            small_items: cfg.items(cfg.small),
            large_items: cfg.items(cfg.large),
            duration_ms: cfg.duration.as_millis() as u64,
            switch_at_ms: cfg.switch_at.as_millis() as u64,
            window_ms: cfg.window.as_millis() as u64,
            run_dir: run_dir.to_path_buf(),
            pin_store: mode == StudyMode::Pindown,
        };
        // The shell moves itself into the cgroup, then becomes the job: everything the job
        // starts (the launcher's ranks) is charged to the cgroup from its first page.
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(cgroup.dir())
            .arg(&cfg.exe)
            .arg("job")
            .args(args.to_args())
            .env("PAGEWIRE_MODE", mode.name())
            .env_remove("PAGEWIRE_BOOT_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in job_env(cfg, mode) {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| Error::Io {
            path: cfg.exe.clone(),
            source: e,
        })?;
        let out = read_all(child.stdout.take().expect("piped"));
        let err = read_all(child.stderr.take().expect("piped"));
        readers.push((out, err));
        children.0.push((job, child));
    }
    // Both warm-ups done: start both timed runs at once.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut started = false;
    while Instant::now() < deadline {
        if JobKind::BOTH
            .iter()
            .all(|j| run_dir.join(format!("ready-{}", j.name())).exists())
        {
            let go = run_dir.join("go");
            std::fs::write(&go, b"go\n").map_err(|e| Error::Io {
                path: go,
                source: e,
            })?;
            started = true;
            break;
        }
        if children
            .0
            .iter_mut()
            .any(|(_, c)| matches!(c.try_wait(), Ok(Some(_))))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let end = Instant::now() + cfg.duration + Duration::from_secs(120);
    let mut codes = vec![None; children.0.len()];
    let mut done = vec![false; children.0.len()];
    while done.iter().any(|d| !d) {
        for (i, (_, c)) in children.0.iter_mut().enumerate() {
            if !done[i] {
                if let Ok(Some(status)) = c.try_wait() {
                    codes[i] = status.code();
                    done[i] = true;
                }
            }
        }
        if Instant::now() > end || (!started && done.iter().any(|&d| d)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let kinds: Vec<JobKind> = children.0.iter().map(|(k, _)| *k).collect();
    drop(children); // kills and reaps what still runs
    let jobs: Vec<JobRun> = kinds
        .into_iter()
        .zip(readers)
        .zip(codes)
        .map(|((job, (out, err)), exit_code)| JobRun {
            job,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
            exit_code,
        })
        .collect();
    if !started {
        let why: Vec<String> = jobs
            .iter()
            .map(|j| {
                format!(
                    "{} job (exit {:?}): {}",
                    j.job.name(),
                    j.exit_code,
                    last_lines(&j.stderr)
                )
            })
            .collect();
        return Err(Error::Workset(format!(
            "the {} jobs did not get ready: {}",
            mode.name(),
            why.join("; ")
        )));
    }
    Ok((jobs, capacity_items))
}

/// The last few lines of a job's error output, for a message.
fn last_lines(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// The per-window table of one mode: hits/s per job and combined, misses/s per job.
pub fn print_windows(cfg: &StudyConfig, run: &ModeRun) {
    let secs = cfg.window.as_secs_f64();
    let windows = run.windows();
    let per = |job: JobKind, t: u64| windows.iter().find(|w| w.job == job && w.t == t);
    let last = windows.iter().map(|w| w.t).max().unwrap_or(0);
    let env: Vec<String> = std::iter::once(format!("PAGEWIRE_MODE={}", run.mode.name()))
        .chain(
            job_env(cfg, run.mode)
                .iter()
                .map(|(k, v)| format!("{k}={v}")),
        )
        .chain(
            std::env::vars()
                .filter(|(k, _)| k.starts_with("PAGEWIRE_") && k != "PAGEWIRE_MODE")
                .map(|(k, v)| format!("{k}={v}")),
        )
        .collect();
    println!(
        "# {}: hits and misses per second in {} s windows (switch at {} s); jobs run with {}",
        run.mode.name(),
        secs,
        cfg.switch_at.as_secs_f64(),
        env.join(" ")
    );
    println!(
        "#   t[s]  growing_hits/s  shrinking_hits/s  combined_hits/s  growing_misses/s  shrinking_misses/s"
    );
    for t in 0..=last {
        let (g, s) = (per(JobKind::Growing, t), per(JobKind::Shrinking, t));
        let rate = |w: Option<&Window>, f: fn(&Window) -> u64| {
            w.map_or("-".to_string(), |w| format!("{:.0}", f(w) as f64 / secs))
        };
        let combined = match (g, s) {
            (Some(g), Some(s)) => format!("{:.0}", (g.hits + s.hits) as f64 / secs),
            _ => "-".into(),
        };
        println!(
            "{:>8.1} {:>15} {:>17} {:>16} {:>17} {:>19}",
            t as f64 * secs,
            rate(g, |w| w.hits),
            rate(s, |w| w.hits),
            combined,
            rate(g, |w| w.misses),
            rate(s, |w| w.misses),
        );
    }
    println!();
}

/// Mean hits/s of each job and combined in the two steady phases: `[before, after]` per
/// `[growing, shrinking, combined]`.
pub fn phase_means(cfg: &StudyConfig, run: &ModeRun) -> [[Option<f64>; 2]; 3] {
    let secs = cfg.window.as_secs_f64();
    let windows = run.windows();
    let phases = report::steady_phases(cfg.switch_at.as_secs_f64(), cfg.duration.as_secs_f64());
    let of = |job: JobKind, p: usize| {
        let w: Vec<Window> = windows.iter().copied().filter(|w| w.job == job).collect();
        report::mean_hits_per_sec(&w, secs, phases[p].0, phases[p].1)
    };
    let growing = [of(JobKind::Growing, 0), of(JobKind::Growing, 1)];
    let shrinking = [of(JobKind::Shrinking, 0), of(JobKind::Shrinking, 1)];
    let combined = [0, 1].map(|p| growing[p].zip(shrinking[p]).map(|(a, b)| a + b));
    [growing, shrinking, combined]
}

/// The summary of all modes: steady-phase means, the ODP/pinned ratio, and what the
/// cgroup and the servers counted.
pub fn print_summary(cfg: &StudyConfig, runs: &[ModeRun]) {
    let phases = report::steady_phases(cfg.switch_at.as_secs_f64(), cfg.duration.as_secs_f64());
    println!(
        "# Steady phases (mean hits/s over [{:.1}, {:.1}) s before the switch and [{:.1}, {:.1}) s after it)",
        phases[0].0, phases[0].1, phases[1].0, phases[1].1
    );
    println!("# mode      store_items  growing_before  growing_after  shrinking_before  shrinking_after  combined_before  combined_after");
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let mut combined = Vec::new();
    for run in runs {
        let m = phase_means(cfg, run);
        combined.push((run.mode, m[2]));
        println!(
            "  {:<9} {:>11} {:>15} {:>14} {:>17} {:>16} {:>16} {:>15}",
            run.mode.name(),
            run.capacity_items,
            f(m[0][0]),
            f(m[0][1]),
            f(m[1][0]),
            f(m[1][1]),
            f(m[2][0]),
            f(m[2][1])
        );
    }
    println!("# hit ratio (hits / GETs) in the same phases; expected with a uniform key choice: min(1, store items / working-set items)");
    println!("# mode      growing_before  growing_after  shrinking_before  shrinking_after");
    for run in runs {
        let w = run.windows();
        let secs = cfg.window.as_secs_f64();
        let ratio = |job: JobKind, p: usize| {
            let w: Vec<Window> = w.iter().copied().filter(|x| x.job == job).collect();
            report::hit_ratio(&w, secs, phases[p].0, phases[p].1)
                .map_or("-".to_string(), |r| format!("{:.1}%", 100.0 * r))
        };
        println!(
            "  {:<9} {:>15} {:>14} {:>17} {:>16}",
            run.mode.name(),
            ratio(JobKind::Growing, 0),
            ratio(JobKind::Growing, 1),
            ratio(JobKind::Shrinking, 0),
            ratio(JobKind::Shrinking, 1)
        );
    }
    let get = |mode| combined.iter().find(|(m, _)| *m == mode).map(|(_, c)| *c);
    if let (Some(odp), Some(pin)) = (get(StudyMode::Odp), get(StudyMode::Pindown)) {
        let ratio = |p: usize| match (odp[p], pin[p]) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        println!(
            "# combined hits/s, odp / pindown: before the switch {}, after it {}",
            ratio(0),
            ratio(1)
        );
    }
    println!();
    for run in runs {
        let c = &run.cgroup;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        println!(
            "# {}: cgroup limit {:.0} MiB, peak charge {:.1} MiB, {} charges over the limit (reclaim), {} major faults, {} OOM kills",
            run.mode.name(),
            mib(c.limit),
            mib(c.max_usage),
            c.failcnt,
            c.pgmajfault,
            c.oom_kills
        );
        for j in &run.jobs {
            for r in report::records(&j.stdout) {
                if r.kind != "window" {
                    let fields: Vec<String> =
                        r.fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    println!("#   {} {}", r.kind, fields.join(" "));
                }
            }
            if j.exit_code != Some(0) {
                println!(
                    "#   {} job failed (exit {:?}): {}",
                    j.job.name(),
                    j.exit_code,
                    last_lines(&j.stderr)
                );
            }
        }
    }
}

/// Writes each job's raw output and the cgroup's statistics of every run into `dir`.
pub fn write_raw(dir: &Path, runs: &[ModeRun]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    let write = |name: String, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| Error::Io { path, source: e })
    };
    for run in runs {
        for j in &run.jobs {
            write(
                format!("{}-{}.txt", run.mode.name(), j.job.name()),
                format!(
                    "{}\n# exit code {:?}\n# stderr:\n{}",
                    j.stdout, j.exit_code, j.stderr
                ),
            )?;
        }
        write(
            format!("{}-cgroup.txt", run.mode.name()),
            format!("{:#?}\n", run.cgroup),
        )?;
    }
    Ok(())
}
