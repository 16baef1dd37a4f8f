//! Runs the real `pw-msgperf` binary (which starts itself on two ranks): its PingPong on the
//! message layer beneath the API, on both local paths, and the flags that layer refuses.

use std::process::Command;

fn msgperf(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pw-msgperf"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().copied())
        .output()
        .expect("run pw-msgperf");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn pingpong_runs_on_the_message_layer_on_both_paths() {
    for path in ["shm", "nic"] {
        let args = [
            "pingpong", "--layer", "message", "--msglog", "0:17", "--iters", "50", "--json",
        ];
        let (code, out, err) = msgperf(&args, &[("PAGEWIRE_LOCAL", path)]);
        assert_eq!(code, 0, "{path}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["layer"], "message");
        assert_eq!(v["local_path"], path);
        let rows = v["results"][0]["rows"].as_array().unwrap();
        // 0 B, then 1 B .. 128 KiB: eager and rendezvous sizes both.
        assert_eq!(rows.len(), 19, "{path}: {out}");
        for r in rows {
            assert_eq!(r["repetitions"], 50);
            assert!(r["t_usec"].as_f64().unwrap() > 0.0, "{path}: {r}");
        }
    }
}

#[test]
fn the_message_layer_runs_pingpong_only() {
    for args in [
        &["--layer", "message"][..],
        &["stream", "--layer", "message"],
        &["pingpong", "--layer", "message", "--vector", "1K:1K"],
    ] {
        let (code, _, err) = msgperf(args, &[]);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("--layer message runs the pingpong kernel only"),
            "{args:?}: {err}"
        );
    }
}
