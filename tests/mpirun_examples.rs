//! The examples of `examples/` under a real `mpirun` (feature `mpi`), on 2 and 4 ranks, on
//! the mpi transport and on pagewire's transport bootstrapped by MPI (copy mode): the
//! ring's token, the parallel sum against the closed form, and the Jacobi line, which
//! must be the same as under `pwrun` (`tests/examples.rs` checks it across modes and rank
//! counts there).
//!
//! The examples and `pwrun` are built first, with this test binary's profile and target
//! directory and the `mpi` feature.
#![cfg(feature = "mpi")]

use std::process::Command;

use pagewire_test_support::{build_examples, mpirun, profile_dir};

/// The transports: (label, environment).
const TRANSPORTS: [(&str, &[(&str, &str)]); 2] = [
    ("mpi transport", &[("PAGEWIRE_TRANSPORT", "mpi")]),
    (
        "pagewire (copy) bootstrapped by MPI",
        &[("PAGEWIRE_MODE", "copy")],
    ),
];

/// Rank counts under mpirun.
const RANKS: [usize; 2] = [2, 4];

/// Runs `example ARGS` under `launcher` (a command line ending before the program); returns
/// stdout after checking that the job succeeded.
fn run(launcher: &[String], example: &str, env: &[(&str, &str)], args: &[&str]) -> String {
    build_examples(&["pagewire/mpi"]);
    let out = Command::new(&launcher[0])
        .args(&launcher[1..])
        .arg(profile_dir().join("examples").join(example))
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("start the launcher");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{example} under {launcher:?} with {env:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// `mpirun -np NP`; the test has checked that a launcher runs here.
fn mpirun_np(np: usize) -> Vec<String> {
    let mut cmd = mpirun::launcher().expect("an MPI launcher");
    cmd.extend(["-np".to_string(), np.to_string()]);
    cmd
}

fn pwrun(np: usize) -> Vec<String> {
    vec![
        profile_dir().join("pwrun").to_string_lossy().into_owned(),
        "-n".into(),
        np.to_string(),
        "--timeout".into(),
        "300".into(),
        "--".into(),
    ]
}

/// The one line of `out` that starts with `prefix`.
fn line<'o>(out: &'o str, prefix: &str) -> &'o str {
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(prefix)).collect();
    assert_eq!(lines.len(), 1, "expected one `{prefix}` line in:\n{out}");
    lines[0]
}

/// The fields of a Jacobi line that must not depend on the launcher, transport or rank
/// count: "jacobi: grid NxN, ranks R, iterations I, residual X, centre C, how (T s)"
/// without the ranks and the time.
fn jacobi_result(out: &str) -> String {
    let l = line(out, "jacobi:");
    let fields: Vec<&str> = l.split(", ").collect();
    assert!(fields.len() >= 6, "{l}");
    [fields[0], fields[2], fields[3], fields[4], fields[5]]
        .map(|f| f.split(" (").next().unwrap_or(f))
        .join(", ")
}

#[test]
fn examples_under_mpirun_in_both_transports() {
    if mpirun::required_launcher().is_none() {
        return;
    }
    let n: u64 = 1_000_003;
    // As in tests/examples.rs: a 34x34 grid that converges in some hundreds of sweeps.
    let jacobi_args = ["34", "5000", "1e-3", "10"];
    let reference = jacobi_result(&run(&pwrun(2), "jacobi", &[], &jacobi_args));
    for (label, env) in TRANSPORTS {
        for ranks in RANKS {
            let launcher = mpirun_np(ranks);
            let expected = ranks * (ranks - 1) / 2;
            assert_eq!(
                line(&run(&launcher, "ring", env, &[]), "ring:"),
                format!("ring: ranks={ranks} token={expected} expected={expected} ok"),
                "{label}"
            );
            let sum = n * (n + 1) / 2;
            assert_eq!(
                line(
                    &run(&launcher, "parallel_sum", env, &[&n.to_string()]),
                    "parallel_sum:"
                ),
                format!("parallel_sum: ranks={ranks} n={n} sum={sum} expected={sum} ok"),
                "{label}"
            );
            let out = run(&launcher, "jacobi", env, &jacobi_args);
            assert!(line(&out, "jacobi:").contains(&format!(", ranks {ranks},")));
            assert_eq!(
                jacobi_result(&out),
                reference,
                "Jacobi under mpirun -np {ranks} ({label}) differs from pwrun -n 2"
            );
            eprintln!("{label}: ring, parallel_sum, jacobi on {ranks} ranks ok");
        }
    }
}
