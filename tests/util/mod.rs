//! Shared helpers of the facade's multi-process tests: a test runs its ranks by launching
//! this test binary under the built-in launcher, filtered to the one test, with
//! `PAGEWIRE_TEST_ROLE=NAME` set; in those processes the test function plays a rank.
#![allow(dead_code)]

use std::ffi::OsString;
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

/// Like [`launch`], each rank started through `wrapper` (e.g. `["prlimit", "--memlock=65536"]`).
pub fn launch_wrapped(
    name: &str,
    n: usize,
    env: &[(&str, &str)],
    wrapper: Option<&[&str]>,
) -> JobOutcome {
    let mut envs: Vec<(OsString, OsString)> = vec![(ROLE.into(), name.into())];
    envs.extend(
        env.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    let exe = std::env::current_exe().expect("current_exe");
    let mut args: Vec<OsString> = Vec::new();
    let program = match wrapper {
        Some(w) => {
            args.extend(w[1..].iter().map(OsString::from));
            args.push(exe.into_os_string());
            w[0].into()
        }
        None => exe,
    };
    args.extend([name, "--exact", "--nocapture", "--test-threads=1", "-q"].map(OsString::from));
    boot::launch(&LaunchConfig {
        ranks: n,
        program,
        args,
        timeout: Some(Duration::from_secs(180)),
        env: envs,
    })
    .expect("launch")
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
