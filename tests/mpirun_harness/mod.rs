//! Running a test of the current test binary under a real `mpirun` (feature `mpi`): the
//! helpers of `tests/mpirun*.rs`.
//!
//! `PAGEWIRE_MPIRUN` names the launcher command (default `mpirun`; e.g.
//! `mpirun -launcher fork`), `PAGEWIRE_MPI_NP` the rank counts (default `2,3`). Without a
//! launcher on the PATH the tests say so and pass.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The launcher command, if one runs here.
pub fn mpirun() -> Option<Vec<String>> {
    let cmd: Vec<String> = std::env::var("PAGEWIRE_MPIRUN")
        .unwrap_or_else(|_| "mpirun".into())
        .split_whitespace()
        .map(String::from)
        .collect();
    let ok = Command::new(&cmd[0])
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(cmd)
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
    pub stdout: String,
    pub stderr: String,
    pub seconds: f64,
}

impl MpiJob {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs test `test` of this binary (its full path, e.g. `suite::name`) under
/// `mpirun -np np` with `env`, killing the launcher after `limit`. `None` without a
/// launcher.
pub fn run(test: &str, np: usize, env: &[(&str, &str)], limit: Duration) -> Option<MpiJob> {
    let cmd = mpirun()?;
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
            eprintln!("{label}: skipped, no MPI launcher (set PAGEWIRE_MPIRUN or install mpich)");
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
