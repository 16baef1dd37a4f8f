//! Fault suite under pwrun: a rank killed by SIGKILL in each protocol phase, a
//! rank that panics with requests outstanding, SIGINT, SIGTERM and SIGKILL to pwrun itself.
//!
//! Every test starts the `pwrun` binary on copies of this test binary (each filtered to the
//! one test and told by `PAGEWIRE_TEST_ROLE` to play a rank), and checks what a user would:
//! the job ends within 10 s of the fault with a non-zero status, pwrun's line names the
//! rank (or the signal pwrun got), no process of the job is left, and `/dev/shm` holds no
//! object of the job.
//!
//! The faults happen at points the rank program chooses, not by timing from outside: the
//! victim rank writes a `fault` file and sends itself SIGKILL right there. Mid-transfer
//! points are found by watching the copy mode's byte counter between `test` calls.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pagewire::request;
use pagewire::traits::*;
use pagewire::SystemOperation;
use pagewire_test_support::{build_examples, profile_dir, OUT, ROLE};

/// How soon after a fault the job must be over and cleaned up.
const BOUND: Duration = Duration::from_secs(10);
/// How long a job may take to reach its fault (start-up on a busy machine).
const START_PATIENCE: Duration = Duration::from_secs(60);
/// The rendezvous message of the mid-transfer tests: 64 chunks of the copy mode's 512 KiB.
const BIG: usize = 32 << 20;

// ---------------------------------------------------------------------------------------
// The rank side.

/// In a rank of test `name`: starts pagewire, records the job id and this rank's pid in the
/// test's directory, runs `body`, and leaves with status 101 if it panics (a peer of the
/// victim fails once the victim is gone; that must not wait in the universe's teardown).
/// Returns false in the parent.
fn as_rank(name: &str, body: fn(&pagewire::Universe)) -> bool {
    if std::env::var(ROLE).as_deref() != Ok(name) {
        return false;
    }
    let universe = pagewire::initialize().expect("first initialisation");
    let rank = universe.world().rank();
    let job = std::env::var("PAGEWIRE_JOB").expect("PAGEWIRE_JOB");
    write_file(&out_dir().join("job"), &job);
    write_file(
        &out_dir().join(format!("ready-{rank}")),
        &std::process::id().to_string(),
    );
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&universe)));
    if ran.is_err() {
        std::process::exit(101);
    }
    true
}

fn out_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(OUT).expect("PAGEWIRE_TEST_OUT"))
}

/// Writes `text` to `path` at once (through a rename), so a reader never sees half of it.
fn write_file(path: &Path, text: &str) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The fault: says so in the test's directory, then SIGKILL to this process.
fn die_here() -> ! {
    write_file(&out_dir().join("fault"), &std::process::id().to_string());
    // SAFETY: kill(2) with our own pid touches no memory; SIGKILL ends the process here.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The other rank of a two-rank job.
fn peer_of(world: &pagewire::SimpleCommunicator) -> pagewire::Process<'_> {
    world.process_at_rank(1 - world.rank())
}

/// Bytes this rank's copy mode has copied between user buffers and its bounce pool.
fn copied(u: &pagewire::Universe) -> u64 {
    u.with_p2p(|p| p.mode_counters().bytes_copied)
}

/// The rank that blocks on the victim: a receive of `len` bytes that cannot complete.
fn receive_forever(world: &pagewire::SimpleCommunicator, len: usize) {
    let mut buf = vec![0u8; len];
    loop {
        peer_of(world).receive_into(&mut buf[..]);
    }
}

// ---------------------------------------------------------------------------------------
// The parent side.

/// A running `pwrun` job of this test binary.
struct Job {
    name: &'static str,
    dir: PathBuf,
    pwrun: Child,
}

impl Job {
    /// Starts `pwrun -n RANKS` on test `name`'s rank part with `env`.
    fn start(name: &'static str, ranks: usize, env: &[(&str, &str)]) -> Job {
        build_examples(&[]);
        let dir =
            std::env::temp_dir().join(format!("pagewire-fault-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test's directory");
        let log = |what: &str| {
            Stdio::from(std::fs::File::create(dir.join(what)).expect("create a log file"))
        };
        let mut pwrun = Command::new(profile_dir().join("pwrun"));
        pwrun
            .args([
                "-n",
                &ranks.to_string(),
                "--bind-to",
                "none",
                "--timeout",
                "120",
            ])
            .arg("--")
            .arg(std::env::current_exe().expect("current_exe"))
            // A rank runs its test even where the parent's is ignored (and run on request).
            .args([
                name,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .arg("-q")
            .env(ROLE, name)
            .env(OUT, &dir)
            .env("PAGEWIRE_MODE", "copy")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log("stdout"))
            .stderr(log("stderr"));
        // pwrun keeps ignoring the termination signals it inherits ignored (as a shell's
        // background job inherits SIGINT): start it with their defaults, whatever this
        // test process was started with, so the signal tests see pwrun's own handling.
        // SAFETY: between fork and exec the closure calls only signal(2), which is
        // async-signal-safe, and touches no memory of the parent.
        unsafe {
            pwrun.pre_exec(|| {
                for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let pwrun = pwrun.spawn().expect("start pwrun");
        Job { name, dir, pwrun }
    }

    /// Waits until file `what` appears in the test's directory (or pwrun ends: then fails).
    fn wait_for(&mut self, what: &str) {
        let path = self.dir.join(what);
        let start = Instant::now();
        while !path.exists() {
            if let Ok(Some(status)) = self.pwrun.try_wait() {
                panic!(
                    "{}: the job ended ({status}) before {what}; stderr:\n{}",
                    self.name,
                    self.stderr()
                );
            }
            assert!(
                start.elapsed() < START_PATIENCE,
                "{}: no {what} after {START_PATIENCE:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until every one of `ranks` ranks has started.
    fn wait_ready(&mut self, ranks: usize) {
        for r in 0..ranks {
            self.wait_for(&format!("ready-{r}"));
        }
    }

    /// Waits for the victim's fault; returns when it happened.
    fn wait_fault(&mut self) -> Instant {
        self.wait_for("fault");
        Instant::now()
    }

    fn job_id(&self) -> String {
        std::fs::read_to_string(self.dir.join("job")).expect("the job id")
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// Sends `sig` to pwrun (our child, not yet reaped).
    fn signal_pwrun(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pwrun.id()).expect("pid");
        // SAFETY: kill(2) touches no memory; pid is our own unreaped child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill pwrun");
    }

    /// Stops a job that overran: SIGTERM to pwrun, which stops its ranks and cleans up,
    /// then SIGKILL if it has not ended within 5 s; removes the test's directory.
    fn stop(&mut self) {
        self.signal_pwrun(libc::SIGTERM);
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.pwrun.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.pwrun.kill();
        let _ = self.pwrun.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Waits for pwrun to end, at most until `fault` + [`BOUND`]; then checks that no
    /// process of the job is left and `/dev/shm` holds nothing of it (allowing the same
    /// bound). Returns pwrun's status and stderr.
    fn end(mut self, fault: Instant) -> (ExitStatus, String) {
        let deadline = fault + BOUND;
        let status = loop {
            if let Some(status) = self.pwrun.try_wait().expect("waitpid pwrun") {
                break status;
            }
            if Instant::now() >= deadline {
                let stderr = self.stderr();
                self.stop();
                panic!(
                    "{}: the job was still running {BOUND:?} after the fault; stderr:\n{stderr}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let job = self.job_id();
        loop {
            let procs = job_processes(&job);
            let shm = job_shm(&job);
            if procs.is_empty() && shm.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {BOUND:?} after the fault, processes of job {job} left: {procs:?}, \
                 /dev/shm objects left: {shm:?}; stderr:\n{}",
                self.name,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let stderr = self.stderr();
        let _ = std::fs::remove_dir_all(&self.dir);
        (status, stderr)
    }
}

/// Processes whose environment says they belong to job `job` (the ranks and anything they
/// started; zombies have no environment left and do not count).
fn job_processes(job: &str) -> Vec<u32> {
    let marker = format!("PAGEWIRE_JOB={job}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == marker.as_bytes()))
        })
        .collect()
}

/// Names in `/dev/shm` of job `job`.
fn job_shm(job: &str) -> Vec<String> {
    let prefix = pagewire::boot::shm_prefix(job);
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs test `name` on `ranks` ranks, in which rank 0 dies at a point of its choosing, and
/// checks the job's end: status 137 and pwrun's line naming rank 0 within 10 s, nothing
/// left behind.
fn rank_0_killed(name: &'static str, ranks: usize, env: &[(&str, &str)]) {
    let mut job = Job::start(name, ranks, env);
    job.wait_ready(ranks);
    let fault = job.wait_fault();
    let (status, stderr) = job.end(fault);
    assert_eq!(
        status.code(),
        Some(137),
        "{name}: {status}; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("pwrun: rank 0 (pid ") && stderr.contains("killed by signal SIGKILL"),
        "{name}: pwrun does not name rank 0; stderr:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------------------
// A rank killed in each protocol phase.

fn eager_body(u: &pagewire::Universe) {
    let world = u.world();
    world.barrier();
    if world.rank() == 0 {
        peer_of(&world).send(&[7u8; 1024][..]);
        die_here();
    }
    let (first, _) = peer_of(&world).receive_vec::<u8>();
    assert_eq!(first.len(), 1024);
    receive_forever(&world, 1024);
}

#[test]
fn rank_killed_after_an_eager_send() {
    const NAME: &str = "rank_killed_after_an_eager_send";
    if !as_rank(NAME, eager_body) {
        rank_0_killed(NAME, 2, &[]);
    }
}

/// Rank 0 dies with its rendezvous send posted (the RTS is out); rank 1 then receives.
fn rts_body(u: &pagewire::Universe) {
    let world = u.world();
    world.barrier();
    if world.rank() == 0 {
        let data = vec![1u8; 4 << 20];
        request::scope(|scope| {
            let _send = peer_of(&world).immediate_send(scope, &data[..]);
            die_here()
        });
    }
    receive_forever(&world, 4 << 20);
}

#[test]
fn rank_killed_with_its_rts_sent() {
    const NAME: &str = "rank_killed_with_its_rts_sent";
    if !as_rank(NAME, rts_body) {
        rank_0_killed(NAME, 2, &[]);
    }
}

/// RPUT: rank 1 posts a rendezvous send and stops progressing (so the data cannot move);
/// rank 0 receives, polls long enough to match the RTS and answer with its CTS, and dies.
fn cts_body(u: &pagewire::Universe) {
    let world = u.world();
    world.barrier();
    let data = vec![2u8; 4 << 20];
    if world.rank() == 1 {
        request::scope(|scope| {
            let send = peer_of(&world).immediate_send(scope, &data[..]);
            std::thread::sleep(Duration::from_secs(120));
            send.wait();
        });
        return;
    }
    let mut buf = vec![0u8; 4 << 20];
    request::scope(|scope| {
        let mut recv = peer_of(&world).immediate_receive_into(scope, &mut buf[..]);
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            recv = match recv.test() {
                Ok(_) => panic!("the receive completed though the sender never progressed"),
                Err(pending) => pending,
            };
        }
        die_here()
    });
}

#[test]
fn rank_killed_with_its_cts_sent() {
    const NAME: &str = "rank_killed_with_its_cts_sent";
    if !as_rank(NAME, cts_body) {
        rank_0_killed(
            NAME,
            2,
            &[("PAGEWIRE_RNDV", "put"), ("PAGEWIRE_LOCAL", "nic")],
        );
    }
}

/// Whether `moved` bytes of a [`BIG`] transfer are well inside it.
fn mid_transfer(moved: u64) -> bool {
    let total = BIG as u64;
    moved >= total / 8 && moved <= total / 2
}

/// RGET: rank 0 receives [`BIG`] messages and dies once one of them is between an eighth
/// and half way in (its bounce copies say how far); rank 1 keeps sending.
fn rget_body(u: &pagewire::Universe) {
    let world = u.world();
    world.barrier();
    if world.rank() == 1 {
        let data = vec![3u8; BIG];
        loop {
            peer_of(&world).send(&data[..]);
        }
    }
    let mut buf = vec![0u8; BIG];
    for _ in 0..16 {
        let before = copied(u);
        request::scope(|scope| {
            let mut recv = peer_of(&world).immediate_receive_into(scope, &mut buf[..]);
            loop {
                if mid_transfer(copied(u) - before) {
                    die_here();
                }
                recv = match recv.test() {
                    Ok(_) => break,
                    Err(pending) => pending,
                };
            }
        });
    }
    panic!("no receive of 16 was ever caught in the middle");
}

#[test]
fn rank_killed_in_the_middle_of_an_rget() {
    const NAME: &str = "rank_killed_in_the_middle_of_an_rget";
    if !as_rank(NAME, rget_body) {
        rank_0_killed(
            NAME,
            2,
            &[("PAGEWIRE_RNDV", "get"), ("PAGEWIRE_LOCAL", "nic")],
        );
    }
}

/// RPUT: rank 0 sends [`BIG`] messages and dies once one of them is between an eighth and
/// half way out; rank 1 keeps receiving.
fn rput_body(u: &pagewire::Universe) {
    let world = u.world();
    world.barrier();
    if world.rank() == 1 {
        receive_forever(&world, BIG);
    }
    let data = vec![4u8; BIG];
    for _ in 0..16 {
        let before = copied(u);
        request::scope(|scope| {
            let mut send = peer_of(&world).immediate_send(scope, &data[..]);
            loop {
                if mid_transfer(copied(u) - before) {
                    die_here();
                }
                send = match send.test() {
                    Ok(_) => break,
                    Err(pending) => pending,
                };
            }
        });
    }
    panic!("no send of 16 was ever caught in the middle");
}

#[test]
fn rank_killed_in_the_middle_of_an_rput() {
    const NAME: &str = "rank_killed_in_the_middle_of_an_rput";
    if !as_rank(NAME, rput_body) {
        rank_0_killed(
            NAME,
            2,
            &[("PAGEWIRE_RNDV", "put"), ("PAGEWIRE_LOCAL", "nic")],
        );
    }
}

/// Three ranks in an allreduce of 4 MiB (rendezvous inside); rank 0 dies once its part is
/// under way.
fn collective_body(u: &pagewire::Universe) {
    let world = u.world();
    let mine = vec![world.rank() as u64; 512 << 10];
    let mut sum = vec![0u64; 512 << 10];
    world.all_reduce_into(&mine[..], &mut sum[..], SystemOperation::sum());
    assert_eq!(sum[0], 3);
    if world.rank() == 0 {
        request::scope(|scope| {
            let reduce = world.immediate_all_reduce_into(
                scope,
                &mine[..],
                &mut sum[..],
                SystemOperation::sum(),
            );
            let _pending = match reduce.test() {
                Ok(_) => panic!("a 4 MiB allreduce completed at its first test"),
                Err(pending) => pending,
            };
            die_here()
        });
    }
    loop {
        world.all_reduce_into(&mine[..], &mut sum[..], SystemOperation::sum());
    }
}

#[test]
fn rank_killed_inside_a_collective() {
    const NAME: &str = "rank_killed_inside_a_collective";
    if !as_rank(NAME, collective_body) {
        rank_0_killed(NAME, 3, &[]);
    }
}

// ---------------------------------------------------------------------------------------
// A rank that panics with requests outstanding (it gives them 1 s, then exits 101).

/// Rank 0 panics inside a scope holding a 4 MiB `immediate_send` (rendezvous: it cannot
/// complete, rank 1 never receives) while rank 1 waits in a barrier. The panic unwinds
/// through the scope as in any program: no `catch_unwind` here.
fn panic_body(u: &pagewire::Universe) {
    let world = u.world();
    world.barrier();
    if world.rank() == 0 {
        let data = vec![5u8; 4 << 20];
        request::scope(|scope| {
            let _send = peer_of(&world).immediate_send(scope, &data[..]);
            write_file(&out_dir().join("fault"), "panic");
            panic!("rank 0 fails with a rendezvous send outstanding");
        });
    }
    world.barrier();
}

#[test]
fn rank_panicking_with_requests_outstanding_ends_the_job() {
    const NAME: &str = "rank_panicking_with_requests_outstanding_ends_the_job";
    if std::env::var(ROLE).as_deref() == Ok(NAME) {
        let universe = pagewire::initialize().expect("first initialisation");
        let rank = universe.world().rank();
        write_file(
            &out_dir().join("job"),
            &std::env::var("PAGEWIRE_JOB").expect("PAGEWIRE_JOB"),
        );
        write_file(
            &out_dir().join(format!("ready-{rank}")),
            &std::process::id().to_string(),
        );
        panic_body(&universe);
        return;
    }
    let mut job = Job::start(NAME, 2, &[]);
    job.wait_ready(2);
    let fault = job.wait_fault();
    let (status, stderr) = job.end(fault);
    assert_eq!(status.code(), Some(101), "{status}; stderr:\n{stderr}");
    assert!(
        stderr.contains("pwrun: rank 0 (pid ") && stderr.contains("exited with status 101"),
        "pwrun does not name rank 0; stderr:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------------------
// Signals to pwrun.

/// Both ranks wait in a receive that never completes.
fn waiting_body(u: &pagewire::Universe) {
    let world = u.world();
    world.barrier();
    receive_forever(&world, 64);
}

/// pwrun gets `sig` while its ranks wait: it stops them and exits with 128 + `sig`.
fn pwrun_signalled(name: &'static str, sig: libc::c_int, line: &str) {
    let mut job = Job::start(name, 2, &[]);
    job.wait_ready(2);
    let fault = Instant::now();
    job.signal_pwrun(sig);
    let (status, stderr) = job.end(fault);
    assert_eq!(
        status.code(),
        Some(128 + sig),
        "{status}; stderr:\n{stderr}"
    );
    assert!(stderr.contains(line), "{stderr}");
}

#[test]
fn sigint_to_pwrun_stops_the_job_cleanly() {
    const NAME: &str = "sigint_to_pwrun_stops_the_job_cleanly";
    if !as_rank(NAME, waiting_body) {
        pwrun_signalled(NAME, libc::SIGINT, "pwrun: received SIGINT, job stopped");
    }
}

#[test]
fn sigterm_to_pwrun_stops_the_job_cleanly() {
    const NAME: &str = "sigterm_to_pwrun_stops_the_job_cleanly";
    if !as_rank(NAME, waiting_body) {
        pwrun_signalled(NAME, libc::SIGTERM, "pwrun: received SIGTERM, job stopped");
    }
}

/// `kill -9` of pwrun: nobody is left to clean up, yet the ranks die with it
/// (`PR_SET_PDEATHSIG`) and `/dev/shm` is clean, because every rank removed its objects'
/// names as soon as all peers had mapped them.
#[test]
fn sigkill_to_pwrun_leaves_nothing_behind() {
    const NAME: &str = "sigkill_to_pwrun_leaves_nothing_behind";
    if as_rank(NAME, waiting_body) {
        return;
    }
    let mut job = Job::start(NAME, 4, &[]);
    job.wait_ready(4);
    let socket = std::env::temp_dir().join(format!("pagewire-{}.sock", job.job_id()));
    let fault = Instant::now();
    job.signal_pwrun(libc::SIGKILL);
    let (status, _) = job.end(fault);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    // The bootstrap socket is the one thing a killed launcher leaves (in the temporary
    // directory, not /dev/shm); nobody can use it, and the test removes it.
    let _ = std::fs::remove_file(socket);
}
