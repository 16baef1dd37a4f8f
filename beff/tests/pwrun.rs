//! `beff` under `pwrun` on 1 to 4 ranks in every buffer mode, short (`--short --test`, 8 MB
//! per process: lengths up to 64 KiB, past the eager limit) with every byte of every
//! message checked (`--verify`); and `--mode all` with its side-by-side table, JSON and plot.
//!
//! `pwrun` is built first with the cargo that runs the tests, in this test binary's profile
//! and target directory (pagewire-test-support's `build_pwrun`).

use std::process::Command;

use pagewire_test_support::build_pwrun;

const MODES: [&str; 3] = ["copy", "pindown", "odp"];
const SHORT: [&str; 6] = [
    "--short",
    "--test",
    "--verify",
    "--memory-per-process",
    "8",
    "--seed",
];

/// Runs `command`, asserts it succeeded, returns its stdout.
fn run(mut command: Command, what: &str) -> String {
    let out = command.output().expect("start");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// The rows of the per-length table: (length, accumulated MB/s).
fn length_rows(out: &str) -> Vec<(usize, f64)> {
    let start = out
        .find("SECTION-BY-MSGLNG-BEGIN")
        .expect("per-length table");
    let end = out.find("SECTION-BY-MSGLNG-END").expect("end of the table");
    out[start..end]
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            if cells.len() != 8 {
                return None;
            }
            Some((cells[0].parse().ok()?, cells[1].parse().ok()?))
        })
        .collect()
}

#[test]
fn every_method_delivers_exact_bytes_on_1_to_4_ranks_in_every_mode() {
    let pwrun = build_pwrun();
    for ranks in 1..=4 {
        for mode in MODES {
            let mut cmd = Command::new(&pwrun);
            cmd.args(["-n", &ranks.to_string(), "--timeout", "120", "--"])
                .arg(env!("CARGO_BIN_EXE_beff"))
                .args(SHORT)
                .arg("7")
                .args(["--mode", mode])
                .env("RUST_BACKTRACE", "0");
            let out = run(cmd, &format!("beff on {ranks} ranks in mode {mode}"));
            let what = format!("{ranks} ranks, {mode}:\n{out}");
            assert!(
                out.contains(&format!("mode {mode}, transport soft")),
                "{what}"
            );
            let summary: Vec<&str> = out.lines().filter(|l| l.starts_with("b_eff")).collect();
            assert_eq!(summary.len(), 1, "{what}");
            assert!(
                summary[0].starts_with("b_effSHORT&TEST = ")
                    && summary[0].contains(&format!(" * {ranks:3} PEs with   8 MB/PE on ")),
                "{what}"
            );
            let rows = length_rows(&out);
            assert_eq!(rows.len(), 21, "{what}");
            assert_eq!(rows[20].0, 65536, "{what}");
            assert!(rows.iter().all(|r| r.1 > 0.0), "{what}");
            // Every message of every method was compared byte for byte (a mismatch fails
            // the rank, and so the job).
            let checked = out
                .lines()
                .find_map(|l| l.strip_prefix("# measurement loop "))
                .expect("checked line");
            assert!(checked.ends_with("messages checked (every byte)"), "{what}");
            // Six rings and two random patterns: the head names them; one process has no
            // ping-pong pair.
            assert!(
                out.contains("6-7   used for random pattern average"),
                "{what}"
            );
            assert_eq!(out.contains("8=one PingPong Pair"), ranks > 1, "{what}");
        }
    }
}

#[test]
fn mode_all_compares_the_modes_side_by_side() {
    let dir = std::env::temp_dir().join(format!("beff-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("all.json");
    let svg = dir.join("all.svg");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_beff"));
    cmd.args(SHORT)
        .arg("11")
        .args(["--mode", "all", "--memlock", "8M", "--np", "2", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg);
    let out = run(cmd, "beff --mode all");
    // Each mode's own output, then the side-by-side table with ratios to copy.
    for mode in MODES {
        assert!(
            out.contains(&format!("mode {mode}, transport soft")),
            "{out}"
        );
    }
    let head = out
        .lines()
        .find(|l| l.contains("pindown-hpc/copy"))
        .expect("side-by-side heading");
    assert!(
        head.contains("pindown-8M/copy") && head.contains("odp/copy") && head.contains("copy MB/s"),
        "{head}"
    );
    let b_eff = out
        .lines()
        .find(|l| l.trim_start_matches('#').trim_start().starts_with("b_eff "))
        .expect("b_eff row");
    // The key, five runs (copy, pindown in both memlock worlds, odp through the NIC; the
    // local path), four ratios.
    assert_eq!(
        b_eff.trim_start_matches('#').split_whitespace().count(),
        10,
        "{b_eff}"
    );
    assert!(head.contains("local/copy"), "{head}");
    assert!(out.contains("ranks of one host through shm"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["seed"], 11);
    for (label, mode) in [
        ("copy", "copy"),
        ("pindown-hpc", "pindown"),
        ("pindown-8M", "pindown"),
        ("odp", "odp"),
    ] {
        let run = &v["modes"][label];
        assert_eq!(run["mode"], mode, "{label}");
        assert_eq!(run["seed"], 11, "the same random patterns in every mode");
        assert_eq!(run["lengths"].as_array().unwrap().len(), 21);
        assert!(run["summary"]["b_eff"].as_f64().unwrap() > 0.0);
    }
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("pindown"));
    std::fs::remove_dir_all(&dir).unwrap();
}
