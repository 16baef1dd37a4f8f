//! Shared helpers of the facade's multi-process tests: a test runs its ranks by launching
//! this test binary under the built-in launcher, filtered to the one test, with
//! `PAGEWIRE_TEST_ROLE=NAME` set; in those processes the test function plays a rank.
#![allow(dead_code)]

use std::time::Duration;

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
    let outcome = launch(name, n, env);
    assert!(outcome.success(), "job of test {name} failed: {outcome:?}");
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
