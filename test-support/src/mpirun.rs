//! Running a test of the current test binary under a real `mpirun`: the `mpi` feature's
//! tests (`tests/mpirun*.rs` of the facade, and the facade's suites under mpirun).
//!
//! `PAGEWIRE_MPIRUN` names the launcher command (default `mpirun`; e.g.
//! `mpirun -launcher fork`), `PAGEWIRE_MPI_NP` the rank counts (default `2,3`). Without a
//! launcher the tests say so and pass, or fail when `PAGEWIRE_REQUIRE` names `mpirun`
//! ([`crate::require`]).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Prerequisite;

/// The buffer modes of pagewire's transport, each run bootstrapped by MPI.
pub const MODES: [&str; 3] = ["copy", "pindown", "odp"];

/// The launcher command, or why none runs here.
pub fn launcher() -> Result<Vec<String>, String> {
    let cmd: Vec<String> = std::env::var("PAGEWIRE_MPIRUN")
        .unwrap_or_else(|_| "mpirun".into())
        .split_whitespace()
        .map(String::from)
        .collect();
    let Some(program) = cmd.first() else {
        return Err("PAGEWIRE_MPIRUN is empty".into());
    };
    match Command::new(program).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(cmd),
        Ok(o) => Err(format!("`{program} --version` failed ({})", o.status)),
        Err(e) => Err(format!("no MPI launcher `{program}`: {e}")),
    }
}

/// The launcher command, if one runs here; else `None` after [`crate::require`] said the
/// test is skipped (or failed it, when `mpirun` is required).
pub fn required_launcher() -> Option<Vec<String>> {
    crate::require(Prerequisite::Mpirun, launcher())
}

/// The rank counts to run (`PAGEWIRE_MPI_NP`).
pub fn rank_counts() -> Vec<usize> {
    std::env::var("PAGEWIRE_MPI_NP")
        .unwrap_or_else(|_| "2,3".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("PAGEWIRE_MPI_NP: comma-separated rank counts")
        })
        .collect()
}

/// What one `mpirun` job did.
#[derive(Debug)]
pub struct MpiJob {
    /// The exit status, `None` if it was killed at the time limit.
    pub code: Option<i32>,
    /// What the ranks printed on stdout.
    pub stdout: String,
    /// What the ranks and the launcher printed on stderr.
    pub stderr: String,
    /// How long it ran.
    pub seconds: f64,
}

impl MpiJob {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs test `test` of this binary (its full path, e.g. `suite::name`) under
/// `mpirun -np np` with `env`, killing the launcher after `limit`. `None` without a
/// launcher, after [`required_launcher`] said the test is skipped.
pub fn run(test: &str, np: usize, env: &[(&str, &str)], limit: Duration) -> Option<MpiJob> {
    let cmd = required_launcher()?;
    let exe = std::env::current_exe().expect("current_exe");
    let t = Instant::now();
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .args(["-np", &np.to_string()])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the MPI launcher");
    // Read both pipes on threads, so a chatty job cannot fill one and stall.
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait for mpirun") {
            break status.code();
        }
        if t.elapsed() > limit {
            // The launcher takes its ranks down when it is killed.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Some(MpiJob {
        code,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// Runs test `test` under `mpirun` on every rank count of [`rank_counts`] (those of
/// `only`, if given) with `env`, and asserts that every rank ran it and passed. `label`
/// names the run in messages.
pub fn expect_pass(label: &str, test: &str, env: &[(&str, &str)], only: Option<&[usize]>) {
    for np in rank_counts() {
        if only.is_some_and(|o| !o.contains(&np)) {
            continue;
        }
        let Some(job) = run(test, np, env, Duration::from_secs(600)) else {
            return;
        };
        assert!(
            job.success(),
            "{label}: {test} on {np} ranks failed ({:?} after {:.1} s):\n{}\n{}",
            job.code,
            job.seconds,
            job.stdout,
            job.stderr
        );
        // Every rank ran the body (not zero tests because of a bad filter).
        assert_eq!(
            job.stdout.matches("1 passed").count(),
            np,
            "{label}: {test} on {np} ranks:\n{}\n{}",
            job.stdout,
            job.stderr
        );
        eprintln!(
            "{label}: {test} on {np} ranks passed in {:.1} s",
            job.seconds
        );
    }
}

/// Runs test `test` of this binary as ranks under `mpirun`: [`expect_pass`] with
/// [`ROLE`](crate::ROLE)`=test`, so that the test function plays a rank's part (as under
/// the built-in launcher) and `pagewire::initialize` bootstraps through MPI.
pub fn expect_pass_as_ranks(label: &str, test: &str, env: &[(&str, &str)], only: Option<&[usize]>) {
    let mut env = env.to_vec();
    env.push((crate::ROLE, test));
    expect_pass(label, test, &env, only);
}

/// Tests of a suite to run as ranks under `mpirun`: (test, the rank counts it runs on of
/// [`rank_counts`]; `None`: all).
pub type SuiteTests<'a> = &'a [(&'a str, Option<&'a [usize]>)];

/// Runs each of `tests` as ranks under `mpirun` ([`expect_pass_as_ranks`]) on the mpi
/// transport (`PAGEWIRE_TRANSPORT=mpi`: every call goes to the host MPI library), with
/// `env` added.
pub fn on_the_mpi_transport(tests: SuiteTests, env: &[(&str, &str)]) {
    let mut env = env.to_vec();
    env.push(("PAGEWIRE_TRANSPORT", "mpi"));
    for &(test, only) in tests {
        expect_pass_as_ranks("mpi transport", test, &env, only);
    }
}

/// Runs each of `tests` as ranks under `mpirun` ([`expect_pass_as_ranks`]) on pagewire's
/// transport bootstrapped by MPI, with `env` added: on the default path (shared memory
/// between the ranks of a host), then through the NIC in each of [`MODES`].
pub fn on_pagewire_bootstrapped_by_mpi(tests: SuiteTests, env: &[(&str, &str)]) {
    for &(test, only) in tests {
        expect_pass_as_ranks("pagewire, default path", test, env, only);
    }
    for mode in MODES {
        let label = format!("pagewire, {mode}");
        let mut env = env.to_vec();
        env.push(("PAGEWIRE_MODE", mode));
        let env = crate::with_path_of_mode(&env);
        for &(test, only) in tests {
            expect_pass_as_ranks(&label, test, &env, only);
        }
    }
}
