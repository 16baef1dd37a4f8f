//! Load: `examples/load.rs` under `pwrun -n 16` in each buffer mode. Every rank
//! sends messages of random sizes (0 B to 1 MiB, log-uniform: eager and rendezvous) with
//! random tags to random peers and receives them with wildcards only; the program checks
//! every byte, the non-overtaking order per (source, tag), the per-pair and total counts
//! (nothing lost, duplicated or left over), and prints each rank's peak resident memory.
//!
//! The full load is 10,000 messages per rank (`.ci/run` runs it); these tests run
//! `PAGEWIRE_LOAD_MESSAGES` per rank (1,000 by default) with seed `PAGEWIRE_LOAD_SEED`
//! (1), so that `cargo test` stays short on two cores. The seed and the memory figures are
//! printed (`cargo test --release --test load -- --nocapture` shows them).

use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use pagewire_test_support::{build_examples, profile_dir};

/// Ranks of the job: 16 on the 2 cores of the development machines.
const RANKS: usize = 16;

/// One 16-rank job at a time.
static ONE_JOB: Mutex<()> = Mutex::new(());

fn env_or(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: expected a number")),
        Err(_) => default,
    }
}

/// Runs `load ARGS` under `pwrun -n ranks` in `mode`.
fn run(ranks: usize, mode: &str, args: &[&str]) -> std::process::Output {
    build_examples(&[]);
    Command::new(profile_dir().join("pwrun"))
        .args(["-n", &ranks.to_string(), "--timeout", "300", "--"])
        .arg(profile_dir().join("examples").join("load"))
        .args(args)
        .env("PAGEWIRE_MODE", mode)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run pwrun")
}

/// Runs the load in `mode` and checks its report.
fn load(mode: &str) {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let messages = env_or("PAGEWIRE_LOAD_MESSAGES", 1000);
    let seed = env_or("PAGEWIRE_LOAD_SEED", 1);
    let t = Instant::now();
    let out = run(
        RANKS,
        mode,
        &[
            "--messages",
            &messages.to_string(),
            "--seed",
            &seed.to_string(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "load in mode {mode} ({messages} messages per rank, seed {seed}) failed ({}):\n\
         {stdout}\n{stderr}",
        out.status
    );
    let report: Vec<&str> = stdout.lines().filter(|l| l.starts_with("load:")).collect();
    for l in &report {
        eprintln!("{l}");
    }
    eprintln!(
        "load: mode={mode}: {:.1} s under pwrun",
        t.elapsed().as_secs_f64()
    );
    let total = RANKS as u64 * messages;
    assert!(
        report.iter().any(|l| l.ends_with(" ok")
            && l.contains(&format!(" mode={mode} "))
            && l.contains(&format!(" sent={total} received={total} "))),
        "no `ok` line with {total} messages sent and received:\n{stdout}"
    );
    assert!(
        report
            .iter()
            .any(|l| l.contains("peak resident memory per rank (VmHWM) min=")),
        "no memory line:\n{stdout}"
    );
}

#[test]
fn load_16_ranks_wildcards_copy() {
    load("copy");
}

#[test]
fn load_16_ranks_wildcards_pindown() {
    load("pindown");
}

#[test]
fn load_16_ranks_wildcards_odp() {
    load("odp");
}

/// The checks catch what they are for: rank 0 flips a byte of one message, sends one twice,
/// or leaves one out, and the job fails with a rank saying what it found.
#[test]
fn load_catches_a_corrupted_duplicated_or_lost_message() {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    for (fault, says) in [
        ("corrupt", "differs at offset"),
        // A message sent twice or left out shows as a length or bytes differing from those
        // of the next one expected from the pair, one too many, one left over, or a stall.
        ("duplicate", "load: FAILED: "),
        ("drop", "load: FAILED: "),
    ] {
        let out = run(
            4,
            "copy",
            &["--messages", "200", "--stall", "5", "--inject", fault],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("load: FAILED: ") && stderr.contains(says),
            "a {fault} message went unnoticed ({}):\n{stderr}",
            out.status
        );
    }
}
