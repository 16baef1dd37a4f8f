//! Ranks of the facade (feature `facade`), for pagewire's own multi-process tests: [`ranks`],
//! [`ranks_alone`] and [`jobs`] run a test's body on copies of the test binary, each with
//! a `pagewire::Universe`.

use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use pagewire::boot::{self, JobOutcome, LaunchConfig};

use crate::ROLE;

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
    let env = crate::with_path_of_mode(env);
    let cfg = LaunchConfig::current_test(name, n, ROLE, &env, wrapper, Duration::from_secs(180))
        .expect("current_exe");
    boot::launch(&cfg).expect("launch")
}
