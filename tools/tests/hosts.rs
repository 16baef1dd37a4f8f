//! `pwrun --hosts` across two hosts made of namespaces: ranks placed by slots,
//! output and input relayed, a pagewire job over shared memory within a host and the TCP
//! wire between them, a failing rank or a killed agent ending the job, and nothing left on
//! either host afterwards. Skipped (one line) where namespaces are not permitted, unless
//! `PAGEWIRE_REQUIRE` names `namespaced-hosts`.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use pagewire_test_support::hosts::TwoHosts;

/// A job here ends within a second or two; one that has not ended after this long is hung
/// and ends as a failure (pwrun's exit code 124), not as a test that never returns.
const JOB_LIMIT: &str = "120";

/// `pwrun --timeout JOB_LIMIT`, to be given its arguments.
fn pwrun_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pwrun"));
    c.args(["--timeout", JOB_LIMIT]);
    c
}

/// `pwrun ARGS` with `PAGEWIRE_RSH` reaching `hosts`, `input` on its stdin.
fn pwrun(hosts: &TwoHosts, args: &[&str], input: &[u8]) -> Output {
    let mut child = pwrun_command()
        .args(args)
        .env("PAGEWIRE_RSH", hosts.rsh())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pwrun");
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(input).expect("pwrun's stdin");
    drop(stdin);
    child.wait_with_output().expect("pwrun's output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that neither host keeps a process or a `/dev/shm` object.
fn assert_clean(hosts: &TwoHosts) {
    for h in 0..2 {
        let (procs, shm) = hosts.leftovers(h, Duration::from_secs(3));
        assert!(
            procs.is_empty() && shm.is_empty(),
            "left on {}: processes {procs:?}, /dev/shm {shm:?}",
            hosts.names[h]
        );
    }
}

#[test]
fn ranks_fill_the_hosts_by_slots_and_their_output_and_input_reach_the_frontend() {
    let Some(hosts) = TwoHosts::up() else { return };
    let list = format!("{}:2,{}", hosts.names[0], hosts.names[1]);
    // 5 ranks on 3 slots: two rounds.
    let o = pwrun(
        &hosts,
        &[
            "--hosts",
            &list,
            "-np",
            "5",
            "sh",
            "-c",
            r#"echo "$PAGEWIRE_RANK $PAGEWIRE_SIZE $(hostname)""#,
        ],
        b"",
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut lines: Vec<String> = text(&o.stdout).lines().map(String::from).collect();
    lines.sort();
    let [a, b] = &hosts.names;
    assert_eq!(
        lines,
        [
            format!("0 5 {a}"),
            format!("1 5 {a}"),
            format!("2 5 {b}"),
            format!("3 5 {a}"),
            format!("4 5 {a}")
        ]
    );
    // -n defaults to the slots; the frontend's stdin goes to rank 0, on the first host
    // named.
    let list = format!("{b},{a}");
    let o = pwrun(
        &hosts,
        &[
            "--hosts",
            &list,
            "sh",
            "-c",
            r#"[ "$PAGEWIRE_RANK" = 0 ] && echo "$(hostname) read $(cat)" || true"#,
        ],
        b"twelve bytes",
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), format!("{b} read twelve bytes\n"));
    assert_clean(&hosts);
}

#[test]
fn a_job_across_two_hosts_moves_its_messages_and_leaves_nothing_behind() {
    let Some(hosts) = TwoHosts::up() else { return };
    let list = format!("{}:2,{}:2", hosts.names[0], hosts.names[1]);
    for mode in ["copy", "pindown", "odp"] {
        let o = pwrun(
            &hosts,
            &[
                "--hosts",
                &list,
                "--env",
                &format!("PAGEWIRE_MODE={mode}"),
                env!("CARGO_BIN_EXE_pw-msgperf"),
                "--msglog",
                "0:20",
                "--iters",
                "20",
            ],
            b"",
        );
        let out = text(&o.stdout);
        assert!(o.status.success(), "{mode}: {}", text(&o.stderr));
        // The table's last row: 1 MiB.
        assert!(
            out.lines().any(|l| l.trim_start().starts_with("1048576")),
            "{mode}: {out}"
        );
        assert_clean(&hosts);
    }
}

#[test]
fn a_failing_rank_on_another_host_ends_the_job_with_its_status() {
    let Some(hosts) = TwoHosts::up() else { return };
    let list = format!("{},{}", hosts.names[0], hosts.names[1]);
    let t = Instant::now();
    let o = pwrun(
        &hosts,
        &[
            "--hosts",
            &list,
            "sh",
            "-c",
            r#"[ "$PAGEWIRE_RANK" = 1 ] && exit 3; sleep 60"#,
        ],
        b"",
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("rank 1 (pid ")
            && err.contains(&format!("on {}) exited with status 3", hosts.names[1])),
        "{err}"
    );
    // The sleeping rank (a shell's child: the leftovers' sweep takes it) is gone.
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_clean(&hosts);
}

#[test]
fn a_killed_agent_ends_the_job_within_10_s_and_leaves_nothing_on_either_host() {
    let Some(hosts) = TwoHosts::up() else { return };
    let list = format!("{}:2,{}:2", hosts.names[0], hosts.names[1]);
    // Every rank leaves a marker in its host's /dev/shm under the job's prefix (as a rank
    // killed during start-up leaves the soft NIC's names), then runs a long pagewire job.
    let program = format!(
        "touch /dev/shm/pagewire-$PAGEWIRE_JOB-marker-$PAGEWIRE_RANK && exec {} --msglog \
         0:22 --iters 1000000",
        env!("CARGO_BIN_EXE_pw-msgperf")
    );
    let child = pwrun_command()
        .args(["--hosts", &list, "sh", "-c", &program])
        .env("PAGEWIRE_RSH", hosts.rsh())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pwrun");
    // Wait for the job to run on the second host, then kill its agent.
    let deadline = Instant::now() + Duration::from_secs(30);
    let agent = loop {
        let pids = hosts.on(
            1,
            "pgrep -f -- 'pwrun --agent$'; ls /dev/shm | grep -c marker",
        );
        let lines: Vec<&str> = pids.lines().collect();
        if lines.len() == 2 && lines[1].trim() == "2" {
            break lines[0].trim().to_string();
        }
        assert!(Instant::now() < deadline, "the job did not start: {pids}");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    hosts.on(1, &format!("kill -KILL {agent}"));
    let o = child.wait_with_output().expect("pwrun's end");
    let took = killed.elapsed();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{err}");
    assert!(
        err.contains(&format!(
            "the agent on {} ended before the job did",
            hosts.names[1]
        )),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(10),
        "ended {took:?} after the kill"
    );
    eprintln!(
        "a killed agent: the job ended {:.2} s after the kill",
        took.as_secs_f64()
    );
    assert_clean(&hosts);
}

#[test]
fn bad_host_lists_and_remote_shells_are_named() {
    let Some(hosts) = TwoHosts::up() else { return };
    for (list, says) in [
        ("a,,b", "is not a host name"),
        ("a:0", "slots must be a positive number"),
        ("a,a", "host a is named twice"),
    ] {
        let o = pwrun(&hosts, &["--hosts", list, "true"], b"");
        assert_eq!(o.status.code(), Some(2), "{list}");
        assert!(
            text(&o.stderr).contains(says),
            "{list}: {}",
            text(&o.stderr)
        );
    }
    // A remote shell that does not exist, and a host it cannot reach.
    let o = pwrun_command()
        .args(["--hosts", &hosts.names[0], "true"])
        .env("PAGEWIRE_RSH", "/no/such/rsh -x")
        .output()
        .expect("run pwrun");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("cannot run the remote shell /no/such/rsh (PAGEWIRE_RSH)"),
        "{}",
        text(&o.stderr)
    );
    let o = pwrun(&hosts, &["--hosts", "nowhere", "true"], b"");
    assert_eq!(o.status.code(), Some(255));
    assert!(
        text(&o.stderr).contains("the agent on nowhere ended before the job did"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_chatty_login_script_does_not_disturb_the_agents() {
    let Some(hosts) = TwoHosts::up() else { return };
    // A remote shell whose login prints a greeting on stdout before running the command.
    let dir = std::env::temp_dir().join(format!("pagewire-chatty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rsh = dir.join("rsh");
    std::fs::write(
        &rsh,
        format!(
            "#!/bin/sh\nh=$1; shift\nexec {} \"$h\" echo Welcome to \"$h\" ';' \"$@\"\n",
            hosts.rsh().display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let list = format!("{},{}", hosts.names[0], hosts.names[1]);
    let o = pwrun_command()
        .args(["--hosts", &list, "sh", "-c", "echo rank $PAGEWIRE_RANK"])
        .env("PAGEWIRE_RSH", &rsh)
        .stdin(Stdio::null())
        .output()
        .expect("run pwrun");
    let _ = std::fs::remove_dir_all(&dir);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["rank 0", "rank 1"],
        "stdout carries the ranks' output only"
    );
    assert!(
        err.contains(&format!("Welcome to {}", hosts.names[1])),
        "the greeting goes to stderr: {err}"
    );
    assert_clean(&hosts);
}
