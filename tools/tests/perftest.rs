//! Runs the real `pw-perftest` binary (which starts itself on two ranks) through every test
//! in every memory-region mode, warm and cold, and checks what the counters must show.

use std::process::Command;

fn perftest(args: &[&str]) -> (i32, String, String) {
    perftest_with(args, &[])
}

fn perftest_with(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pw-perftest"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().copied())
        .output()
        .expect("run pw-perftest");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn counter(report: &serde_json::Value, side: &str, name: &str) -> f64 {
    report["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == side && r[1] == name)
        .unwrap_or_else(|| panic!("no counter {side}/{name}"))[2]
        .as_f64()
        .unwrap()
}

#[test]
fn every_test_runs_in_every_mode_warm_and_cold() {
    for test in ["write_bw", "read_bw", "write_lat", "read_lat", "send_lat"] {
        for mr in ["pinned", "odp", "odp-prefetch", "implicit-odp"] {
            for cold in [false, true] {
                let mut args = vec![
                    test, "--size", "64,16384", "--iters", "20", "--mr", mr, "--json",
                ];
                if cold {
                    args.push("--cold");
                }
                let (code, out, err) = perftest(&args);
                assert_eq!(code, 0, "{args:?} failed: {err}");
                let report: serde_json::Value =
                    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"));
                let results = report["results"].as_array().unwrap();
                assert_eq!(results.len(), 2, "{args:?}");
                assert_eq!(results[1]["bytes"], 16384);
                assert!(results[1]["memcpy"].as_f64().unwrap() > 0.0);
                let figure = if test.ends_with("_bw") {
                    &results[1]["bw_avg_mbs"]
                } else {
                    &results[1]["lat_us"]["typical"]
                };
                assert!(figure.as_f64().unwrap() > 0.0, "{args:?}: {figure}");
                let pinned = counter(&report, "client", "pinned_peak_bytes")
                    + counter(&report, "server", "pinned_peak_bytes");
                if mr == "pinned" {
                    assert!(pinned > 0.0, "{args:?}: pinned mode pinned nothing");
                } else {
                    assert_eq!(pinned, 0.0, "{args:?}: an ODP mode pinned memory");
                }
                let responder_faults = counter(&report, "server", "npf_responder");
                if cold
                    && (mr == "odp" || mr == "implicit-odp")
                    && (test == "write_bw" || test == "read_bw")
                {
                    assert!(
                        responder_faults >= 20.0,
                        "{args:?}: cold ODP target took {responder_faults} faults"
                    );
                }
                if mr == "odp-prefetch" && test.ends_with("_bw") {
                    assert_eq!(
                        responder_faults, 0.0,
                        "{args:?}: a prefetched target faulted"
                    );
                    assert!(counter(&report, "server", "prefetch_pages") > 0.0);
                }
            }
        }
    }
}

#[test]
fn tables_name_the_provider_and_show_the_counters() {
    let (code, out, err) = perftest(&["write_lat", "--size", "8", "--iters", "50"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("RDMA_Write Latency Test"), "{out}");
    assert!(
        out.contains("t_typical[usec]") && out.contains("memcpy[usec]"),
        "{out}"
    );
    assert!(
        out.contains("mean NPF resolution [usec]") && out.contains("data path"),
        "{out}"
    );
}

#[test]
fn the_staged_path_is_reported_when_forced() {
    let (code, text, err) = perftest_with(
        &["write_bw", "--size", "65536", "--iters", "50"],
        &[("PAGEWIRE_SOFT_DMA", "staged")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("staged through the shared-memory ring"),
        "{text}"
    );
}

#[test]
fn bad_flags_and_settings_get_one_clear_line() {
    let (code, _, err) = perftest(&["write_bw", "--mr", "foo"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("invalid value 'foo'") && err.contains("implicit-odp"),
        "{err}"
    );
    let (code, _, err) = perftest(&["fly"]);
    assert_eq!(code, 2);
    assert!(err.contains("write_bw"), "{err}");
    let (code, _, err) = perftest_with(
        &["write_bw", "--iters", "5"],
        &[("PAGEWIRE_SOFT_DMA", "fast")],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("PAGEWIRE_SOFT_DMA=fast") && err.contains("auto, cma or staged"),
        "{err}"
    );
}

#[test]
fn a_memlock_limit_too_small_for_the_buffers_is_reported_not_crashed() {
    let (code, _, err) = perftest_with(
        &["write_bw", "--size", "1048576", "--iters", "5"],
        &[("PAGEWIRE_MEMLOCK_LIMIT", "64K")],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("cannot pin") && err.contains("PAGEWIRE_MEMLOCK_LIMIT"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
