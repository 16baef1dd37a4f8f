//! Shared helpers of the facade's multi-process tests: a test runs its ranks by launching
//! this test binary under the built-in launcher, filtered to the one test, with
//! `PAGEWIRE_TEST_ROLE=NAME` set; in those processes the test function plays a rank.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use pagewire::boot::{self, JobOutcome, LaunchConfig};

/// Names the test whose rank part this process plays.
pub const ROLE: &str = "PAGEWIRE_TEST_ROLE";

/// Runs `body` on `n` ranks of test `name` with extra environment; in the parent, asserts
/// the job succeeded.
pub fn ranks(name: &str, n: usize, env: &[(&str, &str)], body: fn(&pagewire::Universe)) {
    if std::env::var(ROLE).as_deref() == Ok(name) {
        let universe = pagewire::initialize().expect("first initialisation");
        body(&universe);
        return;
    }
    let _shared = ALONE.read().unwrap_or_else(|e| e.into_inner());
    let outcome = launch(name, n, env);
    assert!(outcome.success(), "job of test {name} failed: {outcome:?}");
}

/// Held for reading by every job of this binary, for writing by a job that must have the
/// machine's cores to itself ([`ranks_alone`]).
static ALONE: RwLock<()> = RwLock::new(());

/// [`ranks`], with no other job of this test binary running meanwhile: for checks that
/// hold only while every rank has a core (what a test measures about polling ranks).
pub fn ranks_alone(name: &str, n: usize, env: &[(&str, &str)], body: fn(&pagewire::Universe)) {
    if std::env::var(ROLE).as_deref() == Ok(name) {
        return ranks(name, n, env, body);
    }
    let _alone = ALONE.write().unwrap_or_else(|e| e.into_inner());
    let outcome = launch(name, n, env);
    assert!(outcome.success(), "job of test {name} failed: {outcome:?}");
}

/// Serialises the jobs of [`jobs`] within one test binary.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `body` on each of `rank_counts` in turn (one job each, one job of this binary at a
/// time) with `env`; in a rank, runs `body`, leaving at once if it panics (dropping the
/// universe would wait for the other ranks in a barrier) so the launcher stops the job.
pub fn jobs(
    name: &str,
    rank_counts: &[usize],
    env: &[(&str, &str)],
    body: fn(&pagewire::Universe),
) {
    if std::env::var(ROLE).as_deref() == Ok(name) {
        let universe = pagewire::initialize().expect("first initialisation");
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&universe)));
        if ran.is_err() {
            std::process::exit(101);
        }
        return;
    }
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _shared = ALONE.read().unwrap_or_else(|e| e.into_inner());
    for &n in rank_counts {
        let t = Instant::now();
        let outcome = launch(name, n, env);
        eprintln!("{name}: {n} ranks in {:.1} s", t.elapsed().as_secs_f64());
        assert!(outcome.success(), "{name} on {n} ranks failed: {outcome:?}");
    }
}

/// Launches `n` ranks of test `name` and returns the outcome.
pub fn launch(name: &str, n: usize, env: &[(&str, &str)]) -> JobOutcome {
    launch_wrapped(name, n, env, None)
}

/// Launches `n` ranks of test `name` (optionally each through a `wrapper` such as
/// `prlimit`) and returns the outcome, without judging it.
pub fn launch_wrapped(
    name: &str,
    n: usize,
    env: &[(&str, &str)],
    wrapper: Option<&[&str]>,
) -> JobOutcome {
    let cfg = LaunchConfig::current_test(name, n, ROLE, env, wrapper, Duration::from_secs(180))
        .expect("current_exe");
    boot::launch(&cfg).expect("launch")
}

/// Deterministic bytes: stream `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `target/<profile>`, where this test binary, the examples and `pwrun` live.
pub fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        // target/<profile>/deps/NAME-HASH
        exe.parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf()
    })
}

/// Builds the examples and `pwrun` once per test process, with the cargo that runs the tests,
/// this test binary's profile and target directory, and `features` (e.g. `pagewire/mpi`;
/// `pagewire/hwloc` follows this binary's own feature). `cargo test --test NAME` alone does
/// not build examples.
pub fn build_examples(features: &[&str]) {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let profile = profile_dir();
        let target = profile.parent().expect("target dir");
        let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--quiet", "-p", "pagewire", "--examples"])
            .args(["-p", "pagewire-tools", "--bin", "pwrun"])
            .arg("--target-dir")
            .arg(target);
        for f in features {
            cmd.args(["--features", f]);
        }
        if profile.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        if cfg!(feature = "hwloc") {
            cmd.args(["--features", "pagewire/hwloc"]);
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "building the examples failed: {status}");
    });
}
