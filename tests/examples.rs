//! The examples of `examples/`, built and run under `pwrun` on 1 to 4 ranks in every
//! buffer mode, with their output checked: the ring's token, the parallel sum against the
//! closed form, and the Jacobi solver's residual, which must be the same bit for bit in
//! every mode and at every rank count (its README promise).
//!
//! The examples and `pwrun` are built first, with the cargo that runs the tests and this
//! test binary's profile and target directory (`cargo test --test examples` alone does
//! not build examples).

use std::process::Command;

use pagewire_test_support::{build_examples, profile_dir};

/// The buffer modes every example runs in.
const MODES: [&str; 3] = ["copy", "pindown", "odp"];
/// Rank counts every example runs on.
const RANKS: std::ops::RangeInclusive<usize> = 1..=4;

/// Runs `example ARGS` under `pwrun -n RANKS` with `PAGEWIRE_MODE=mode`; returns stdout,
/// after checking that the job succeeded.
fn run(example: &str, ranks: usize, mode: &str, args: &[&str]) -> String {
    build_examples(&[]);
    let out = Command::new(profile_dir().join("pwrun"))
        .args(["-n", &ranks.to_string(), "--timeout", "300", "--"])
        .arg(profile_dir().join("examples").join(example))
        .args(args)
        .env("PAGEWIRE_MODE", mode)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run pwrun");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{example} on {ranks} ranks in mode {mode} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// The one line of `out` that starts with `prefix`.
fn line<'o>(out: &'o str, prefix: &str) -> &'o str {
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(prefix)).collect();
    assert_eq!(lines.len(), 1, "expected one `{prefix}` line in:\n{out}");
    lines[0]
}

#[test]
fn ring_passes_the_token_around() {
    for mode in MODES {
        for ranks in RANKS {
            let out = run("ring", ranks, mode, &[]);
            let expected = ranks * (ranks - 1) / 2;
            assert_eq!(
                line(&out, "ring:"),
                format!("ring: ranks={ranks} token={expected} expected={expected} ok"),
                "mode {mode}"
            );
        }
    }
}

#[test]
fn parallel_sum_matches_the_closed_form() {
    // 1_000_003 does not divide evenly by 2, 3 or 4: the blocks differ in length.
    let n: u64 = 1_000_003;
    for mode in MODES {
        for ranks in RANKS {
            let out = run("parallel_sum", ranks, mode, &[&n.to_string()]);
            let expected = n * (n + 1) / 2;
            assert_eq!(
                line(&out, "parallel_sum:"),
                format!("parallel_sum: ranks={ranks} n={n} sum={expected} expected={expected} ok"),
                "mode {mode}"
            );
        }
    }
}

/// The fields of a Jacobi line that must not depend on mode or rank count.
fn jacobi_result(out: &str) -> String {
    let l = line(out, "jacobi:");
    // "jacobi: grid NxN, ranks R, iterations I, residual X, centre C, how (T s)"
    let fields: Vec<&str> = l.split(", ").collect();
    assert!(fields.len() >= 6, "{l}");
    [fields[0], fields[2], fields[3], fields[4], fields[5]]
        .map(|f| f.split(" (").next().unwrap_or(f))
        .join(", ")
}

#[test]
fn jacobi_residual_is_identical_in_every_mode_and_rank_count() {
    // A 34x34 grid (32 interior rows, so 4 ranks get 8 each): converges in some hundreds
    // of sweeps, few enough for 4 ranks on 2 cores.
    let (converging, capped) = (["34", "5000", "1e-3", "10"], ["34", "95", "1e-12", "10"]);
    for (args, how) in [
        (converging, "converged"),
        (capped, "stopped at the iteration limit"),
    ] {
        let mut reference: Option<(String, String)> = None;
        for ranks in RANKS {
            for mode in MODES {
                let out = run("jacobi", ranks, mode, &args);
                assert!(line(&out, "jacobi:").contains(how), "{out}");
                assert!(
                    line(&out, "jacobi:").contains(&format!(", ranks {ranks},")),
                    "{out}"
                );
                let result = jacobi_result(&out);
                let this = format!("{ranks} ranks, mode {mode}");
                match &reference {
                    None => reference = Some((result, this)),
                    Some((r, first)) => assert_eq!(
                        &result, r,
                        "Jacobi differs between {first} and {this} ({args:?})"
                    ),
                }
            }
        }
        if how.starts_with("stopped") {
            let (r, _) = reference.expect("ran");
            assert!(r.contains("iterations 95,"), "{r}");
        }
    }
}
