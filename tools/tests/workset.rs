//! Runs the real `pw-workset` briefly (small budget and working sets) in both modes and
//! checks the output's shape and that the mechanism shows: hits counted, the pinned store of
//! the job with the large working set missing, the unpinned one not, and the memory cgroup
//! gone afterwards. Skips with one line where the cgroup v1 memory controller is not
//! available or not permitted, unless `PAGEWIRE_REQUIRE` names `memory-cgroup` (or `all`).

use std::process::{Command, Stdio};

use pagewire_test_support::{require, Prerequisite};

/// pw-workset's exit status for a skip.
const EXIT_SKIPPED: i32 = 77;

/// The steady-phase rows of the summary's first table: mode -> its 7 numbers.
fn steady_rows(out: &str) -> Vec<(String, Vec<String>)> {
    out.lines()
        .skip_while(|l| !l.starts_with("# mode      store_items"))
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .map(|l| {
            let w: Vec<String> = l.split_whitespace().map(str::to_string).collect();
            (w[0].clone(), w[1..].to_vec())
        })
        .collect()
}

/// The hit-ratio rows: mode -> 4 percentages.
fn ratio_rows(out: &str) -> Vec<(String, Vec<f64>)> {
    out.lines()
        .skip_while(|l| !l.starts_with("# hit ratio"))
        .skip(2)
        .take_while(|l| !l.starts_with('#'))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let pct = |s: &str| s.trim_end_matches('%').parse::<f64>().unwrap_or(f64::NAN);
            (w[0].to_string(), w[1..].iter().map(|s| pct(s)).collect())
        })
        .collect()
}

#[test]
fn both_modes_run_and_only_the_pinned_large_working_set_misses() {
    let store_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("workset");
    let raw = store_dir.join("raw");
    let child = Command::new(env!("CARGO_BIN_EXE_pw-workset"))
        .args([
            "--budget",
            "8M",
            "--overhead",
            "128M",
            "--small",
            "1M",
            "--large",
            "6M",
            "--duration",
            "3",
            "--window",
            "0.5",
            "--store-dir",
        ])
        .arg(&store_dir)
        .arg("--raw-dir")
        .arg(&raw)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pw-workset");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for pw-workset");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if out.status.code() == Some(EXIT_SKIPPED) {
        let why: Result<(), String> = Err(stdout.trim().to_string());
        require(Prerequisite::MemoryCgroup, why);
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    // Per-window tables of both modes: 6 windows of 0.5 s each.
    for mode in ["pindown", "odp"] {
        let head = format!("# {mode}: hits and misses per second in 0.5 s windows");
        let table: Vec<&str> = stdout
            .lines()
            .skip_while(|l| !l.starts_with(&head))
            .skip(2)
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(table.len(), 6, "{mode}: {table:?}\n{stdout}");
        for row in &table {
            let cols: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(cols.len(), 6, "{row}");
            let growing_hits: f64 = cols[1].parse().unwrap();
            assert!(growing_hits > 0.0, "{mode}: no hits in {row}");
        }
    }
    let steady = steady_rows(&stdout);
    assert_eq!(
        steady.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
        ["pindown", "odp"],
        "{stdout}"
    );
    // Stores: half of 8 MiB in 20 KiB items pinned; the 6 MiB working set with ODP.
    assert_eq!(steady[0].1[0], "204");
    assert_eq!(steady[1].1[0], "307");
    let ratios = ratio_rows(&stdout);
    let (pinned, odp) = (&ratios[0].1, &ratios[1].1);
    // Before the switch the shrinking job's set is the large one: pinned, 204 of 307 items
    // fit (66 %); with ODP all of them.
    assert!(
        pinned[2] < 85.0,
        "pinned shrinking job hit {}%: {stdout}",
        pinned[2]
    );
    assert!(odp[2] > 99.0, "odp shrinking job hit {}%: {stdout}", odp[2]);
    // After the switch the growing job has the large set.
    assert!(
        pinned[1] < 85.0,
        "pinned growing job hit {}%: {stdout}",
        pinned[1]
    );
    // With ODP its store holds the whole large set: it never evicts, so its misses are
    // first touches only (how soon its hit ratio reaches 100 % depends on how many GETs a
    // loaded machine runs, so the count of evictions is what is checked).
    let evictions = |mode: &str| -> Vec<u64> {
        stdout
            .lines()
            .filter(|l| l.starts_with("#   server ") && l.contains(&format!(" mode={mode} ")))
            .filter_map(|l| {
                let v = l
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("evictions="))?;
                v.parse().ok()
            })
            .collect()
    };
    assert_eq!(evictions("odp"), [0, 0], "odp stores evicted: {stdout}");
    assert!(
        evictions("pindown").iter().all(|&e| e > 0),
        "pinned stores evict: {stdout}"
    );
    // Every hit carried its item's bytes; every server counted its GETs.
    assert_eq!(stdout.matches("damaged_items=0").count(), 4, "{stdout}");
    assert_eq!(stdout.matches("#   server ").count(), 4, "{stdout}");
    // Raw outputs, and no cgroup left behind.
    for f in ["pindown-growing.txt", "odp-shrinking.txt", "odp-cgroup.txt"] {
        assert!(raw.join(f).exists(), "{f} missing");
    }
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup/memory")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("pagewire-workset-{pid}-"))
        })
        .collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

#[test]
fn bad_flags_are_refused_with_a_message() {
    for (args, says) in [
        (
            &["--item-size", "12"][..],
            "--item-size 12: expected a multiple of 8 bytes",
        ),
        (
            &["--duration", "4", "--switch-at", "5"][..],
            "--switch-at 5 must come before",
        ),
        (&["--budget", "lots"][..], "lots: expected bytes"),
        (&["--modes", "copy"][..], "invalid value 'copy'"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pw-workset"))
            .args(args)
            .output()
            .expect("run pw-workset");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
