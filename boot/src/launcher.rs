//! The built-in launcher behind `pwrun` (docs/architecture.md).
//!
//! [`launch`] starts N local ranks of a program, serves their bootstrap over a Unix socket
//! (protocol in the `pwrun_client` module), supervises them, and cleans up after the job:
//!
//! - every rank gets `PAGEWIRE_JOB`, `PAGEWIRE_RANK`, `PAGEWIRE_SIZE`, `PAGEWIRE_BOOT_SOCKET`
//!   (the socket) and `PAGEWIRE_LAUNCHER=pwrun`; stdout and stderr are inherited, stdin
//!   goes to rank 0 only (the others read `/dev/null`);
//! - every rank dies with `SIGKILL` if the launcher dies (`PR_SET_PDEATHSIG`);
//! - ranks are bound to cores or NUMA nodes as [`LaunchConfig::bind`] asks (module
//!   `binding`), before they exec, and told so in `PAGEWIRE_BIND`, `PAGEWIRE_BIND_CPUS`
//!   and `PAGEWIRE_BIND_NODE`;
//! - the first rank to exit non-zero or by a signal is reported on stderr and the others
//!   are stopped (`SIGTERM`, then `SIGKILL` after 2 s); the job's exit code is that rank's;
//! - the socket is private: mode 0600 whatever the umask, and a hello is accepted only from
//!   a process of the launcher's user that is the rank's process or a descendant of it
//!   (`SO_PEERCRED`);
//! - a rank may spawn processes (`boot::spawn`): they run as a job of their own, connected
//!   to the spawning group by a second job of both; every job is supervised as the first
//!   (module `family`);
//! - at the end, what the ranks left running (a shell's child, a daemon: every process of
//!   this user whose environment has the job's `PAGEWIRE_JOB`) is killed, and the socket
//!   and every `/dev/shm/pagewire-<job>-*` object are removed (the soft NIC already
//!   removes its names once every rank has mapped them, so that a killed launcher leaves
//!   nothing there either).

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::binding::{self, BindPlan, BindTo, Topology};
use super::pwrun_client::wire;
use super::sys;
use pagewire_sys::{Error, Result};

mod cleanup;
mod family;
mod job;
pub(crate) mod rounds;
mod server;

pub(crate) use cleanup::{describe, kill_leftovers, remove_shm, signal_name};
use family::JobFamily;
pub(crate) use job::{Job, RankCommand};

use server::serve_connection;
pub(crate) use server::{Relay, Server};

/// How often the supervisor looks at its children (it wakes earlier for connections).
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Time between `SIGTERM` and `SIGKILL` when stopping a job.
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(2);
/// Longest the launcher blocks writing to one rank before dropping its connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a rank's hello waits for its previous connection to be seen closed.
const RECONNECT_PATIENCE: Duration = Duration::from_secs(2);
/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Exit code of a job that ran out of time (as `timeout(1)`).
const EXIT_TIMED_OUT: i32 = 124;
/// Where POSIX shared-memory objects live.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// Writes `line` and a newline to stderr in one `write` call. `eprintln!` writes each piece
/// of its format separately, so the launcher's line and a rank's panic message, both going
/// to the same pipe, could interleave mid-line (seen in CI: "pwrun: rank " + a rank's
/// backtrace + "0 (pid ..."); a single write of up to `PIPE_BUF` (4 KiB) bytes to a pipe is
/// atomic.
pub fn report_line(line: &str) {
    use std::io::Write;
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    let _ = std::io::stderr().lock().write_all(&bytes);
}

/// What to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Number of ranks (at least 1).
    pub ranks: usize,
    /// The program every rank runs; looked up in `PATH` if it has no slash.
    pub program: PathBuf,
    /// Arguments passed to every rank.
    pub args: Vec<OsString>,
    /// Stop the job (exit code 124) if it runs longer than this.
    pub timeout: Option<Duration>,
    /// Extra environment for every rank, on top of the launcher's own. The `PAGEWIRE_*`
    /// bootstrap variables are set after these and cannot be overridden.
    pub env: Vec<(OsString, OsString)>,
    /// How ranks are bound to CPUs (`pwrun --bind-to`).
    pub bind: BindTo,
}

impl LaunchConfig {
    /// `ranks` copies of `program` with no arguments, no timeout, no extra environment and
    /// pwrun's default binding ([`BindTo::Auto`]: a core per rank when they fit).
    pub fn new(ranks: usize, program: impl Into<PathBuf>) -> Self {
        LaunchConfig {
            ranks,
            program: program.into(),
            args: Vec::new(),
            timeout: None,
            env: Vec::new(),
            bind: BindTo::Auto,
        }
    }

    /// For multi-process tests: `ranks` copies of the running test binary, each filtered to
    /// test `name` (`NAME --exact --test-threads=1`) and told by `role_var=NAME` to play a
    /// rank's part, with `env` added, each started through `wrapper` if given (e.g.
    /// `["prlimit", "--memlock=65536"]`), stopped after `timeout`. Ranks are not bound
    /// ([`BindTo::None`]), so concurrent tests do not pile onto the same cores; set
    /// [`LaunchConfig::bind`] to test binding.
    pub fn current_test(
        name: &str,
        ranks: usize,
        role_var: &str,
        env: &[(&str, &str)],
        wrapper: Option<&[&str]>,
        timeout: std::time::Duration,
    ) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut args: Vec<OsString> = Vec::new();
        let program = match wrapper {
            Some(w) if !w.is_empty() => {
                args.extend(w[1..].iter().map(OsString::from));
                args.push(exe.into_os_string());
                PathBuf::from(w[0])
            }
            _ => exe,
        };
        args.extend(["--exact", "--nocapture", "--test-threads=1", "-q"].map(OsString::from));
        args.insert(args.len() - 4, OsString::from(name));
        let mut vars: Vec<(OsString, OsString)> = vec![(role_var.into(), name.into())];
        vars.extend(
            env.iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        Ok(LaunchConfig {
            ranks,
            program,
            args,
            timeout: Some(timeout),
            env: vars,
            bind: BindTo::None,
        })
    }
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    /// The job's exit code: 0 when every rank exited 0; else the first failing rank's
    /// status (128 + signal number if it was killed), 124 on timeout, 128 + signal number
    /// if the launcher itself was interrupted.
    pub exit_code: i32,
    /// The first rank that exited non-zero or was killed, if any.
    pub failed_rank: Option<usize>,
    /// A summary not yet printed (timeout, interruption, shared memory removed after a
    /// failure). The failing rank's line, `pwrun: rank R (pid P) exited with status S`,
    /// is printed to stderr by [`launch`] itself as soon as the failure is seen.
    pub message: Option<String>,
}

impl JobOutcome {
    /// True when every rank exited 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }
}

/// Runs a job to completion: starts `cfg.ranks` ranks, serves their bootstrap, supervises
/// them and cleans up (see the module documentation).
///
/// Returns `Err` only when the job could not be started or supervised (no ranks, program
/// not found, socket not creatable); a job whose ranks fail is an `Ok` outcome with a
/// non-zero exit code. While it runs, SIGINT, SIGTERM and SIGHUP of this process stop
/// the job (cleanly) instead of killing the launcher. Must be called from a thread that
/// stays alive for the call (it is: the call blocks until every rank is reaped), because
/// the ranks' parent-death signal is tied to the spawning thread.
pub fn launch(cfg: &LaunchConfig) -> Result<JobOutcome> {
    if cfg.ranks == 0 {
        return Err(Error::Launcher(
            "a job needs at least one rank (got 0)".into(),
        ));
    }
    if cfg.program.as_os_str().is_empty() {
        return Err(Error::Launcher("no program given".into()));
    }
    let signals = sys::SignalGuard::install()
        .map_err(|e| Error::os("sigaction(SIGINT/SIGTERM/SIGHUP)", e))?;
    let start = Instant::now();
    let mut jobs = JobFamily::new(Job::start(cfg, Placement::local(cfg.ranks))?, cfg);
    let end = jobs.supervise(start, cfg.timeout, &signals);
    let removed = jobs.finish(true);
    let removed_note =
        (removed > 0).then(|| format!("removed {removed} shared-memory objects left by the job"));
    let outcome = match end? {
        End::Success => JobOutcome {
            exit_code: 0,
            failed_rank: None,
            message: None,
        },
        End::RankFailed { rank, exit_code } => JobOutcome {
            exit_code,
            failed_rank: rank,
            message: removed_note.map(|n| format!("pwrun: {n}")),
        },
        End::TimedOut(after) => JobOutcome {
            exit_code: EXIT_TIMED_OUT,
            failed_rank: None,
            message: Some(with_note(
                format!("pwrun: job timed out after {} s", after.as_secs_f64()),
                removed_note,
            )),
        },
        End::Interrupted(sig) => JobOutcome {
            exit_code: 128 + sig,
            failed_rank: None,
            message: Some(with_note(
                format!("pwrun: received {}, job stopped", signal_name(sig)),
                removed_note,
            )),
        },
    };
    Ok(outcome)
}

/// For benchmark binaries: when this process is not under a launcher (no
/// `PAGEWIRE_BOOT_SOCKET`), runs `np` copies of the current executable, with this process's
/// arguments, under [`launch`], prints the outcome's message if any, and returns
/// `Ok(Some(exit_code))` (the caller should exit with it). When this process already is
/// a rank, returns `Ok(None)`.
pub fn self_launch(np: usize) -> Result<Option<i32>> {
    if super::under_launcher() {
        return Ok(None);
    }
    let program = std::env::current_exe()
        .map_err(|e| Error::Launcher(format!("cannot find the current executable: {e}")))?;
    let cfg = LaunchConfig {
        args: std::env::args_os().skip(1).collect(),
        ..LaunchConfig::new(np, program)
    };
    let outcome = launch(&cfg)?;
    if let Some(message) = &outcome.message {
        report_line(message);
    }
    Ok(Some(outcome.exit_code))
}

/// How `count` ranks on this host are bound under `bind`. `none` needs no topology; with
/// `auto`, a topology that cannot be read leaves the ranks unbound with a note, while an
/// explicit `core` or `numa` fails the launch.
fn plan_binding(bind: BindTo, count: usize) -> Result<BindPlan> {
    if bind == BindTo::None {
        return Ok(binding::plan(
            &Topology {
                cores: Vec::new(),
                nodes: Vec::new(),
                source: "none",
            },
            count,
            BindTo::None,
        ));
    }
    match Topology::detect() {
        Ok(topo) => Ok(binding::plan(&topo, count, bind)),
        Err(e) if bind == BindTo::Auto => Ok(BindPlan {
            applied: BindTo::None,
            ranks: Vec::new(),
            note: Some(format!(
                "pwrun: cannot read the machine's topology ({e}); ranks are not bound"
            )),
        }),
        Err(e) => Err(Error::Launcher(format!(
            "--bind-to {bind}: cannot read the machine's topology: {e}"
        ))),
    }
}

/// Why supervision stopped.
enum End {
    Success,
    /// A process failed: `rank` of the first job, `None` for a spawned process.
    RankFailed {
        rank: Option<usize>,
        exit_code: i32,
    },
    TimedOut(Duration),
    Interrupted(i32),
}

fn with_note(line: String, note: Option<String>) -> String {
    match note {
        Some(note) => format!("{line}; {note}"),
        None => line,
    }
}

/// Which of a job's ranks a launcher starts, and how they are wired: all of them under
/// `pwrun -n` ([`Placement::local`]), one host's under an agent of `pwrun --hosts`.
pub(crate) struct Placement {
    pub(crate) job_id: String,
    /// Ranks in the job.
    pub(crate) size: usize,
    /// The ranks started here, in local order.
    pub(crate) ranks: Vec<usize>,
    /// The bootstrap socket's path.
    pub(crate) socket_path: PathBuf,
    /// Who completes the bootstrap's collectives when not this launcher.
    pub(crate) relay: Option<Arc<dyn Relay>>,
    /// The ranks' stdout goes to a pipe each (taken by the caller) instead of this
    /// process's stdout; rank 0's stdin likewise.
    pub(crate) piped: bool,
    /// The ranks' environment is [`LaunchConfig::env`] alone, not this process's with it
    /// (an agent's: the frontend sends the whole environment).
    pub(crate) clear_env: bool,
}

impl Placement {
    /// Every rank of a `ranks`-rank job, on this host, with a fresh job id.
    fn local(ranks: usize) -> Placement {
        let job_id = super::new_job_id();
        Placement {
            socket_path: std::env::temp_dir().join(format!("pagewire-{job_id}.sock")),
            job_id,
            size: ranks,
            ranks: (0..ranks).collect(),
            relay: None,
            piped: false,
            clear_env: false,
        }
    }
}
