//! The `pwrun` command line: `--bind-to` values, its default, and its fallback when there
//! are more ranks than cores (the binding itself is tested in
//! `boot/tests/binding.rs`).

use std::process::Command;

use pagewire_transport::boot::binding::Topology;

/// Runs `pwrun ARGS` and returns (exit code, stdout, stderr).
fn pwrun(args: &[&str]) -> (i32, String, String) {
    pwrun_with(args, &[])
}

/// [`pwrun`] with variables `env` added to pwrun's own environment.
fn pwrun_with(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pwrun"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run pwrun");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A rank that prints `RANK BIND CPUS` (the kernel's Cpus_allowed_list).
const SHOW: &str = r#"echo "$PAGEWIRE_RANK $PAGEWIRE_BIND $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)""#;

fn cores() -> usize {
    Topology::detect().expect("topology").cores.len()
}

#[test]
fn bad_bind_value_is_a_usage_error() {
    let (code, out, err) = pwrun(&["-n", "2", "--bind-to", "socket", "--", "/bin/true"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("invalid value 'socket' for '--bind-to <WHAT>'"),
        "{err}"
    );
    assert!(err.contains("[possible values: core, numa, none]"), "{err}");
}

#[test]
fn default_binds_to_cores_when_they_suffice() {
    let ranks = cores().min(2);
    let n = ranks.to_string();
    let (code, out, err) = pwrun(&["-n", &n, "--", "sh", "-c", SHOW]);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "unexpected note: {err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), ranks, "{out}");
    for line in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[1], "core", "{line}");
    }
}

#[test]
fn more_ranks_than_cores_falls_back_with_one_note() {
    let ranks = cores() + 1;
    let n = ranks.to_string();
    for extra in [&[][..], &["--bind-to", "core"][..]] {
        let mut args = vec!["-n", &n];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", SHOW]);
        let (code, out, err) = pwrun(&args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("{ranks} ranks but {} cores", ranks - 1))
                && err.contains("not bound"),
            "{err}"
        );
        assert_eq!(out.lines().count(), ranks, "{out}");
        for line in out.lines() {
            assert!(line.contains(" none "), "{line}");
        }
    }
}

#[test]
fn a_misspelt_setting_stops_pwrun_before_any_rank_starts() {
    let marker = std::env::temp_dir().join(format!("pwrun-unknown-setting-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    // In pwrun's environment.
    let (code, _, err) = pwrun_with(
        &["-n", "2", "--", "sh", "-c", &touch],
        &[("PAGEWIRE_MDOE", "odp")],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim(),
        "pwrun: PAGEWIRE_MDOE is not a pagewire setting; did you mean PAGEWIRE_MODE? \
         (docs/configuration.md lists them all)"
    );
    // In --env, for the ranks.
    let (code, _, err) = pwrun(&[
        "-n",
        "2",
        "--env",
        "PAGEWIRE_EAGER_LIMT=4K",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("did you mean PAGEWIRE_EAGER_LIMIT?"), "{err}");
    assert!(!marker.exists(), "a rank started");
    // A bad value is reported once, by pwrun.
    let (code, _, err) = pwrun_with(
        &["-n", "2", "--", "sh", "-c", &touch],
        &[("PAGEWIRE_MODE", "fast")],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim(),
        "pwrun: PAGEWIRE_MODE=fast: expected copy, pindown or odp"
    );
    // A known one is passed on.
    let (code, out, err) = pwrun(&[
        "-n",
        "1",
        "--env",
        "PAGEWIRE_EAGER_LIMIT=4K",
        "--",
        "sh",
        "-c",
        "echo $PAGEWIRE_EAGER_LIMIT",
    ]);
    assert_eq!((code, out.trim()), (0, "4K"), "{err}");
}
