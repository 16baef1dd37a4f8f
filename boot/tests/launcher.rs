//! Multi-process tests of the built-in launcher and the `pwrun` bootstrap.
//!
//! Each test that needs ranks launches this very test binary, filtered to the one test
//! (`NAME --exact`), with `PAGEWIRE_TEST_ROLE=NAME` in the environment; the test function
//! then plays the rank's part instead of the parent's (see [`as_rank`]).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use pagewire_boot::{
    self as boot, Bootstrap, JobOutcome, LaunchConfig, PwrunBootstrap, SingletonBootstrap,
};
use pagewire_sys::Error;
use pagewire_test_support::{as_rank, Scratch, ROLE, SCRATCH};

/// What a child of `bad_environment_is_reported` expects in its error.
const EXPECT: &str = "PAGEWIRE_TEST_EXPECT";

/// Arguments that make this test binary run only test `name`.
fn self_args(name: &str) -> Vec<OsString> {
    [name, "--exact", "--nocapture", "--test-threads=1"]
        .into_iter()
        .map(OsString::from)
        .collect()
}

/// A job of `ranks` copies of this test binary playing test `name`'s ranks. The 60 s
/// timeout only keeps a broken build from hanging the suite.
fn self_job(name: &str, ranks: usize) -> LaunchConfig {
    LaunchConfig {
        ranks,
        program: std::env::current_exe().expect("current_exe"),
        args: self_args(name),
        timeout: Some(Duration::from_secs(60)),
        env: vec![(ROLE.into(), name.into())],
        bind: boot::binding::BindTo::None,
    }
}

/// Runs `cfg` and returns the outcome and how long it took.
fn run(cfg: &LaunchConfig) -> (JobOutcome, Duration) {
    let start = Instant::now();
    let outcome = boot::launch(cfg).expect("launch");
    (outcome, start.elapsed())
}

/// A fresh scratch directory for test `name`, removed on drop.
fn scratch(name: &str) -> Scratch {
    Scratch::new("launcher", name)
}

fn bootstrap_text(e: &Error) -> String {
    assert!(
        matches!(e, Error::Bootstrap(_)),
        "expected a bootstrap error, got {e:?}"
    );
    e.to_string()
}

fn sleep_until_killed() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

#[test]
fn allgather_three_ranks() {
    const NAME: &str = "allgather_three_ranks";
    if as_rank(NAME) {
        let b = boot::from_env().expect("bootstrap");
        assert!(boot::under_launcher());
        assert_eq!(std::env::var("PAGEWIRE_LAUNCHER").as_deref(), Ok("pwrun"));
        assert_eq!(
            boot::self_launch(4).expect("self_launch"),
            None,
            "a rank must not relaunch"
        );
        assert_eq!(b.size(), 3);
        let (rank, me) = (b.rank(), std::process::id());

        let all = b
            .allgather(format!("{rank}:{me}").as_bytes())
            .expect("allgather");
        assert_eq!(all.len(), 3);
        let pids: Vec<u32> = all
            .iter()
            .enumerate()
            .map(|(r, entry)| {
                let text = std::str::from_utf8(entry).expect("utf-8");
                let (er, pid) = text.split_once(':').expect("rank:pid");
                assert_eq!(er.parse::<usize>().unwrap(), r, "entry {r} is {text:?}");
                pid.parse().unwrap()
            })
            .collect();
        assert_eq!(pids[rank], me);
        assert!(pids[0] != pids[1] && pids[1] != pids[2] && pids[0] != pids[2]);
        b.barrier().expect("barrier");

        // Uneven sizes, one empty, one too big for a socket buffer.
        let blob = vec![rank as u8 + 1; rank * 300_000];
        let all = b.allgather(&blob).expect("allgather of blobs");
        for (r, got) in all.iter().enumerate() {
            assert_eq!(got, &vec![r as u8 + 1; r * 300_000], "blob of rank {r}");
        }

        // Every rank saw the same pids.
        let digest = format!("{pids:?}");
        let all = b
            .allgather(digest.as_bytes())
            .expect("allgather of digests");
        assert!(all.iter().all(|d| d == digest.as_bytes()), "{all:?}");
        b.barrier().expect("final barrier");
        return;
    }
    let (outcome, _) = run(&self_job(NAME, 3));
    assert_eq!(
        outcome,
        JobOutcome {
            exit_code: 0,
            failed_rank: None,
            message: None
        }
    );
}

#[test]
fn failing_rank_takes_the_job_down() {
    const NAME: &str = "failing_rank_takes_the_job_down";
    if as_rank(NAME) {
        let b = PwrunBootstrap::connect_from_env().expect("bootstrap");
        b.barrier().expect("barrier");
        match b.rank() {
            1 => std::process::exit(3),
            // Waits in a barrier rank 1 never joins, then for the launcher's SIGTERM.
            2 => {
                let _ = b.barrier();
                sleep_until_killed()
            }
            _ => sleep_until_killed(),
        }
    }
    let (outcome, elapsed) = run(&self_job(NAME, 3));
    assert_eq!(outcome.exit_code, 3, "{outcome:?}");
    assert_eq!(outcome.failed_rank, Some(1));
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[test]
fn killed_rank_gives_137_and_shared_memory_is_removed() {
    const NAME: &str = "killed_rank_gives_137_and_shared_memory_is_removed";
    if as_rank(NAME) {
        let b = PwrunBootstrap::connect_from_env().expect("bootstrap");
        let name = format!("{}test-{}", boot::shm_prefix(b.job_id()), b.rank());
        std::fs::write(Path::new("/dev/shm").join(name), b"x").expect("create shm object");
        if b.rank() == 0 {
            std::fs::write(Scratch::of_rank().join("job"), b.job_id()).expect("write job id");
        }
        b.barrier().expect("barrier");
        if b.rank() == 2 {
            let me = std::process::id();
            let _ = Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("kill -KILL {me}"))
                .status();
            sleep_until_killed()
        }
        let _ = b.barrier();
        sleep_until_killed()
    }
    let scratch = scratch(NAME);
    let mut cfg = self_job(NAME, 3);
    cfg.env.push((SCRATCH.into(), scratch.path().into()));
    let (outcome, elapsed) = run(&cfg);
    assert_eq!(outcome.exit_code, 137, "{outcome:?}");
    assert_eq!(outcome.failed_rank, Some(2));
    assert_eq!(
        outcome.message.as_deref(),
        Some("pwrun: removed 3 shared-memory objects left by the job")
    );
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");

    let job = std::fs::read_to_string(scratch.path().join("job")).expect("job id from rank 0");
    let prefix = boot::shm_prefix(&job);
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
    let socket = std::env::temp_dir().join(format!("pagewire-{job}.sock"));
    assert!(!socket.exists(), "socket {} left behind", socket.display());
}

#[test]
fn sigterm_is_followed_by_sigkill() {
    const NAME: &str = "sigterm_is_followed_by_sigkill";
    let scratch = scratch(NAME);
    // Rank 1 ignores SIGTERM (the disposition survives exec); rank 0 fails once rank 1
    // is ready, so the launcher has to escalate to SIGKILL.
    let script = r#"
        if [ "$PAGEWIRE_RANK" = 0 ]; then
            while [ ! -e "$PAGEWIRE_TEST_SCRATCH/ready" ]; do sleep 0.01; done
            exit 5
        fi
        trap '' TERM
        : > "$PAGEWIRE_TEST_SCRATCH/ready"
        exec sleep 30
    "#;
    let cfg = LaunchConfig {
        args: vec!["-c".into(), script.into()],
        timeout: Some(Duration::from_secs(60)),
        env: vec![(SCRATCH.into(), scratch.path().into())],
        ..LaunchConfig::new(2, "/bin/sh")
    };
    let (outcome, elapsed) = run(&cfg);
    assert_eq!(outcome.exit_code, 5, "{outcome:?}");
    assert_eq!(outcome.failed_rank, Some(0));
    assert!(
        elapsed >= Duration::from_secs(2),
        "no SIGTERM grace period: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[test]
fn rank_exiting_early_fails_the_others_collective() {
    const NAME: &str = "rank_exiting_early_fails_the_others_collective";
    if as_rank(NAME) {
        let b = PwrunBootstrap::connect_from_env().expect("bootstrap");
        b.barrier().expect("barrier");
        if b.rank() == 1 {
            return; // exits 0 without joining the allgather below
        }
        let text = bootstrap_text(&b.allgather(b"never complete").unwrap_err());
        assert!(
            text.contains("rank 1 (pid") && text.contains("left the job"),
            "{text}"
        );
        // Later collectives fail at once, too.
        let text = bootstrap_text(&b.barrier().unwrap_err());
        assert!(text.contains("rank 1"), "{text}");
        return;
    }
    let (outcome, elapsed) = run(&self_job(NAME, 3));
    assert_eq!(outcome.exit_code, 0, "{outcome:?}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[test]
fn rank_that_never_connects_fails_the_others_collective() {
    const NAME: &str = "rank_that_never_connects_fails_the_others_collective";
    if as_rank(NAME) {
        if std::env::var("PAGEWIRE_RANK").as_deref() == Ok("1") {
            return;
        }
        let b = PwrunBootstrap::connect_from_env().expect("bootstrap");
        let text = bootstrap_text(&b.barrier().unwrap_err());
        assert!(text.contains("rank 1 (pid"), "{text}");
        return;
    }
    let (outcome, elapsed) = run(&self_job(NAME, 2));
    assert_eq!(outcome.exit_code, 0, "{outcome:?}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[test]
fn rank_can_reconnect_but_not_connect_twice() {
    const NAME: &str = "rank_can_reconnect_but_not_connect_twice";
    if as_rank(NAME) {
        let b = PwrunBootstrap::connect_from_env().expect("bootstrap");
        let b = if b.rank() == 0 {
            b.barrier().expect("barrier");
            drop(b);
            PwrunBootstrap::connect_from_env().expect("reconnect")
        } else {
            let text = bootstrap_text(&PwrunBootstrap::connect_from_env().unwrap_err());
            assert!(text.contains("rank 1 is already connected"), "{text}");
            b.barrier().expect("barrier");
            b
        };
        let all = b
            .allgather(format!("r{}", b.rank()).as_bytes())
            .expect("allgather");
        assert_eq!(all, vec![b"r0".to_vec(), b"r1".to_vec()]);
        return;
    }
    let (outcome, _) = run(&self_job(NAME, 2));
    assert_eq!(outcome.exit_code, 0, "{outcome:?}");
}

#[test]
fn timeout_gives_124() {
    const NAME: &str = "timeout_gives_124";
    if as_rank(NAME) {
        let b = PwrunBootstrap::connect_from_env().expect("bootstrap");
        b.barrier().expect("barrier");
        sleep_until_killed()
    }
    let cfg = LaunchConfig {
        timeout: Some(Duration::from_secs(1)),
        ..self_job(NAME, 2)
    };
    let (outcome, elapsed) = run(&cfg);
    assert_eq!(outcome.exit_code, 124, "{outcome:?}");
    assert_eq!(outcome.failed_rank, None);
    assert_eq!(
        outcome.message.as_deref(),
        Some("pwrun: job timed out after 1 s")
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn singleton_bootstrap_is_rank_0_of_1() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<PwrunBootstrap>();

    let b = SingletonBootstrap::new();
    assert_eq!((b.rank(), b.size()), (0, 1));
    assert_eq!(b.job_id().len(), 12);
    assert!(b.job_id().bytes().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(b.allgather(b"mine").unwrap(), vec![b"mine".to_vec()]);
    b.barrier().unwrap();
    if !boot::under_launcher() {
        let b = boot::from_env().unwrap();
        assert_eq!((b.rank(), b.size()), (0, 1));
    }
}

#[test]
fn bad_launch_configs_are_errors() {
    let err = boot::launch(&LaunchConfig::new(0, "/bin/true")).unwrap_err();
    assert!(matches!(err, Error::Launcher(_)), "{err:?}");

    let missing = "/nonexistent/pagewire-no-such-program";
    let err = boot::launch(&LaunchConfig::new(2, missing)).unwrap_err();
    assert!(matches!(err, Error::Launcher(_)), "{err:?}");
    assert!(err.to_string().contains(missing), "{err}");
}

/// Runs this test binary as a helper child of test `name` (not under the launcher), with
/// exactly the `PAGEWIRE_*` variables given.
fn run_helper(name: &str, vars: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(self_args(name));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PAGEWIRE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env(ROLE, name).envs(vars.iter().copied());
    let status = cmd.status().expect("spawn helper");
    assert!(status.success(), "helper with {vars:?} failed: {status}");
}

#[test]
fn bad_environment_is_reported() {
    const NAME: &str = "bad_environment_is_reported";
    if as_rank(NAME) {
        let expect = std::env::var(EXPECT).unwrap();
        let text = bootstrap_text(&PwrunBootstrap::connect_from_env().unwrap_err());
        assert!(text.contains(&expect), "expected {expect:?} in {text:?}");
        return;
    }
    let sock = "/nonexistent/pagewire.sock";
    let cases: [&[(&str, &str)]; 6] = [
        &[
            (EXPECT, "PAGEWIRE_RANK"),
            ("PAGEWIRE_JOB", "abc"),
            ("PAGEWIRE_SIZE", "2"),
            ("PAGEWIRE_RANK", "two"),
            ("PAGEWIRE_BOOT_SOCKET", sock),
        ],
        &[
            (EXPECT, "PAGEWIRE_SIZE"),
            ("PAGEWIRE_JOB", "abc"),
            ("PAGEWIRE_RANK", "0"),
            ("PAGEWIRE_BOOT_SOCKET", sock),
        ],
        &[
            (EXPECT, "PAGEWIRE_BOOT_SOCKET"),
            ("PAGEWIRE_JOB", "abc"),
            ("PAGEWIRE_SIZE", "2"),
            ("PAGEWIRE_RANK", "0"),
        ],
        &[
            (EXPECT, "PAGEWIRE_JOB"),
            ("PAGEWIRE_JOB", "Not/AnId"),
            ("PAGEWIRE_SIZE", "2"),
            ("PAGEWIRE_RANK", "0"),
            ("PAGEWIRE_BOOT_SOCKET", sock),
        ],
        &[
            (EXPECT, "PAGEWIRE_RANK=5"),
            ("PAGEWIRE_JOB", "abc"),
            ("PAGEWIRE_SIZE", "2"),
            ("PAGEWIRE_RANK", "5"),
            ("PAGEWIRE_BOOT_SOCKET", sock),
        ],
        &[
            (
                EXPECT,
                "cannot connect to the launcher at /nonexistent/pagewire.sock",
            ),
            ("PAGEWIRE_JOB", "abc"),
            ("PAGEWIRE_SIZE", "2"),
            ("PAGEWIRE_RANK", "0"),
            ("PAGEWIRE_BOOT_SOCKET", sock),
        ],
    ];
    for vars in cases {
        run_helper(NAME, vars);
    }
}

#[test]
fn launcher_going_away_is_an_error_not_a_hang() {
    const NAME: &str = "launcher_going_away_is_an_error_not_a_hang";
    if as_rank(NAME) {
        let b = PwrunBootstrap::connect_from_env().expect("bootstrap");
        assert_eq!((b.rank(), b.size(), b.job_id()), (0, 1, "fakejob"));
        let err = b.allgather(b"hello?").unwrap_err();
        assert_eq!(bootstrap_text(&err), "bootstrap: launcher went away");
        return;
    }
    // A fake launcher speaking the documented protocol: accept the hello, take the
    // gather, and hang up.
    let scratch = scratch(NAME);
    let path = scratch.path().join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let hello = read_raw_frame(&mut s);
        assert_eq!(hello[0], 0x01, "HELLO tag");
        assert_eq!(&hello[1..9], &0u64.to_le_bytes(), "rank");
        assert_eq!(&hello[9..17], &1u64.to_le_bytes(), "size");
        assert_ne!(&hello[17..25], &0u64.to_le_bytes(), "pid");
        assert_eq!(&hello[25..], b"fakejob");
        s.write_all(&[1, 0, 0, 0, 0x81]).unwrap(); // WELCOME
        assert_eq!(read_raw_frame(&mut s), b"\x02hello?", "GATHER frame");
        // Dropping `s` hangs up.
    });
    run_helper(
        NAME,
        &[
            ("PAGEWIRE_JOB", "fakejob"),
            ("PAGEWIRE_SIZE", "1"),
            ("PAGEWIRE_RANK", "0"),
            ("PAGEWIRE_BOOT_SOCKET", path.to_str().unwrap()),
        ],
    );
    server.join().unwrap();
}

/// Reads one frame (`len:u32 tag payload`) and returns `tag payload`.
fn read_raw_frame(s: &mut UnixStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    body
}

/// Names the test whose launcher this process plays (between the test and its ranks).
const LAUNCHER_ROLE: &str = "PAGEWIRE_TEST_LAUNCHER";

#[test]
fn bootstrap_socket_is_private_whatever_the_umask() {
    const NAME: &str = "bootstrap_socket_is_private_whatever_the_umask";
    if as_rank(NAME) {
        use std::os::unix::fs::PermissionsExt;
        let sock = std::env::var_os("PAGEWIRE_BOOT_SOCKET").expect("PAGEWIRE_BOOT_SOCKET");
        let mode = std::fs::metadata(&sock)
            .expect("stat the socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "socket mode {:o}", mode & 0o777);
        boot::from_env()
            .expect("bootstrap")
            .barrier()
            .expect("barrier");
        return;
    }
    if std::env::var(LAUNCHER_ROLE).as_deref() == Ok(NAME) {
        let (outcome, _) = run(&self_job(NAME, 2));
        assert!(outcome.success(), "{outcome:?}");
        return;
    }
    // The launcher runs in a child with umask 000, which would leave the socket
    // connectable by every user.
    let status = Command::new("sh")
        .args(["-c", r#"umask 000 && exec "$@""#, "sh"])
        .arg(std::env::current_exe().expect("current_exe"))
        .args(self_args(NAME))
        .env(LAUNCHER_ROLE, NAME)
        .status()
        .expect("run the launcher");
    assert!(status.success(), "{status}");
}

#[test]
fn hello_from_a_process_outside_the_job_is_refused() {
    const NAME: &str = "hello_from_a_process_outside_the_job_is_refused";
    if as_rank(NAME) {
        // Tell the test where the socket is, and connect only once it has tried.
        let dir = Scratch::of_rank();
        let rank = std::env::var("PAGEWIRE_RANK").expect("PAGEWIRE_RANK");
        let text = format!(
            "{}\n{}",
            std::env::var("PAGEWIRE_BOOT_SOCKET").expect("PAGEWIRE_BOOT_SOCKET"),
            std::env::var("PAGEWIRE_JOB").expect("PAGEWIRE_JOB")
        );
        // A temporary file per rank: with one shared name, the other rank's rename could
        // take this rank's file, and `boot-{rank}` would never appear.
        let tmp = dir.join(format!("boot-{rank}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, dir.join(format!("boot-{rank}"))).expect("rename");
        let start = Instant::now();
        while !dir.join("go").exists() {
            assert!(start.elapsed() < Duration::from_secs(30), "no go");
            std::thread::sleep(Duration::from_millis(5));
        }
        boot::from_env()
            .expect("bootstrap")
            .barrier()
            .expect("barrier");
        return;
    }
    let scratch = scratch(NAME);
    let mut cfg = self_job(NAME, 2);
    cfg.env.push((SCRATCH.into(), scratch.path().into()));
    let launcher = std::thread::spawn(move || run(&cfg).0);
    let info = scratch.path().join("boot-0");
    let start = Instant::now();
    while !info.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank 0 never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let text = std::fs::read_to_string(&info).unwrap();
    let (path, job) = text.split_once('\n').unwrap();
    // This test process runs the launcher: it is of the job's user, but neither rank 0
    // nor a process rank 0 started.
    let mut s = UnixStream::connect(path).expect("connect to the bootstrap socket");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut hello = Vec::new();
    hello.extend_from_slice(&0u64.to_le_bytes());
    hello.extend_from_slice(&2u64.to_le_bytes());
    hello.extend_from_slice(&u64::from(std::process::id()).to_le_bytes());
    hello.extend_from_slice(job.as_bytes());
    let mut frame = ((hello.len() + 1) as u32).to_le_bytes().to_vec();
    frame.push(0x01); // HELLO
    frame.extend_from_slice(&hello);
    s.write_all(&frame).unwrap();
    let reply = read_raw_frame(&mut s);
    drop(s);
    std::fs::write(scratch.path().join("go"), b"").unwrap();
    let outcome = launcher.join().expect("launcher thread");
    let text = String::from_utf8_lossy(&reply[1..]);
    assert_eq!(
        reply[0], 0xEE,
        "expected ERROR, got {:#04x} {text:?}",
        reply[0]
    );
    assert!(
        text.contains("is neither rank 0") && text.contains(&std::process::id().to_string()),
        "{text}"
    );
    assert!(
        outcome.success(),
        "the real ranks could not connect: {outcome:?}"
    );
}
