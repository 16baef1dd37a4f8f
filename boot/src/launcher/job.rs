//! One job the launcher runs: its ranks' commands, their processes and bootstrap socket,
//! the supervision that reports the first failure and stops the rest, and the end of the job.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::super::binding::{self, BindTo};
use super::super::sys;
use super::super::{ENV_BOOT_SOCKET, ENV_JOB, ENV_LAUNCHER, ENV_RANK, ENV_SIZE};
use super::{
    kill_leftovers, plan_binding, remove_shm, report_line, serve_connection, LaunchConfig,
    Placement, Server, POLL_INTERVAL, SHM_DIR, TERM_GRACE,
};
use pagewire_sys::{Error, Result};

/// What one rank runs: program, arguments, changes to the launcher's environment (`None`
/// removes a variable) and working directory (`None`: the launcher's).
#[derive(Clone, Debug)]
pub(crate) struct RankCommand {
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
    pub(crate) env: Vec<(OsString, Option<OsString>)>,
    pub(crate) dir: Option<PathBuf>,
}

/// A running job: its socket, its children and the connection threads.
/// Dropping it kills and reaps the children and cleans up.
pub(crate) struct Job {
    pub(super) job_id: String,
    socket_path: PathBuf,
    listener: UnixListener,
    pub(crate) server: Arc<Server>,
    /// By local index; `None` once reaped.
    pub(crate) children: Vec<Option<Child>>,
    /// A handle on every accepted connection, to unblock its thread at the end.
    conns: Vec<UnixStream>,
    threads: Vec<JoinHandle<()>>,
    finished: bool,
}

impl Job {
    /// Creates the socket and spawns every rank of `placement`, each running `cfg`'s
    /// program.
    pub(crate) fn start(cfg: &LaunchConfig, placement: Placement) -> Result<Job> {
        let command = RankCommand {
            program: cfg.program.clone().into_os_string(),
            args: cfg.args.clone(),
            env: cfg
                .env
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect(),
            dir: None,
        };
        let commands = vec![command; placement.ranks.len()];
        Job::start_commands(placement, commands, cfg.bind)
    }

    /// A job whose processes run elsewhere: the connection job of a spawn, whose ranks are
    /// processes of other jobs (`pids`, by rank). It has a socket and a server, no children.
    pub(crate) fn connection(placement: Placement, pids: &[u32]) -> Result<Job> {
        let job = Job::start_commands(placement, Vec::new(), BindTo::None)?;
        for (rank, &pid) in pids.iter().enumerate() {
            job.server.set_pid(rank, pid);
        }
        Ok(job)
    }

    /// Creates the socket and spawns the first `commands.len()` ranks of `placement`, local
    /// rank `i` running `commands[i]` (bootstrap variables set after its environment).
    pub(crate) fn start_commands(
        placement: Placement,
        commands: Vec<RankCommand>,
        bind: BindTo,
    ) -> Result<Job> {
        let Placement {
            job_id,
            size,
            ranks,
            socket_path,
            relay,
            piped,
            clear_env,
        } = placement;
        let listener = UnixListener::bind(&socket_path)
            .map_err(|e| Error::os(format!("bind({})", socket_path.display()), e))?;
        // Only this user may connect, whatever the umask made of the socket's mode. A
        // connection made before this takes effect still has to pass the credential check
        // of its hello (`Server::hello`).
        std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::os(format!("chmod(0600, {})", socket_path.display()), e))?;
        let mut job = Job {
            server: Arc::new(Server::new(size, ranks.clone(), job_id.clone(), relay)),
            job_id,
            socket_path,
            listener,
            children: Vec::with_capacity(ranks.len()),
            conns: Vec::new(),
            threads: Vec::new(),
            finished: false,
        };
        job.listener
            .set_nonblocking(true)
            .map_err(|e| Error::os("fcntl(O_NONBLOCK) on the bootstrap socket", e))?;
        let bind_plan = plan_binding(bind, commands.len())?;
        if let Some(note) = &bind_plan.note {
            report_line(note);
        }
        let size = size.to_string();
        for (local, (&rank, command)) in ranks.iter().zip(commands).enumerate() {
            let program = PathBuf::from(&command.program);
            let mut cmd = Command::new(&program);
            if clear_env {
                cmd.env_clear();
            }
            for (key, value) in &command.env {
                match value {
                    Some(value) => cmd.env(key, value),
                    None => cmd.env_remove(key),
                };
            }
            if let Some(dir) = &command.dir {
                cmd.current_dir(dir);
            }
            cmd.args(&command.args)
                .env(ENV_JOB, &job.job_id)
                .env(ENV_RANK, rank.to_string())
                .env(ENV_SIZE, &size)
                .env(ENV_BOOT_SOCKET, &job.socket_path)
                .env(ENV_LAUNCHER, "pwrun")
                .envs(binding::rank_env(&bind_plan, local))
                .stdin(match (rank, piped) {
                    (0, false) => Stdio::inherit(),
                    (0, true) => Stdio::piped(),
                    _ => Stdio::null(),
                })
                .stdout(if piped {
                    Stdio::piped()
                } else {
                    Stdio::inherit()
                })
                .stderr(Stdio::inherit());
            sys::die_with_parent(&mut cmd);
            binding::bind_child(&mut cmd, &bind_plan, local)?;
            let child = cmd.spawn().map_err(|e| {
                let which = if rank == 0 {
                    String::new()
                } else {
                    format!(" for rank {rank}")
                };
                Error::Launcher(format!("cannot start {}{which}: {e}", program.display()))
            })?;
            job.server.set_pid(local, child.id());
            job.children.push(Some(child));
        }
        Ok(job)
    }

    /// Waits up to `timeout` for bootstrap connections and accepts them.
    pub(crate) fn serve_for(&mut self, timeout: Duration) -> Result<()> {
        let readable = sys::wait_readable(self.listener.as_fd(), timeout)
            .map_err(|e| Error::os("poll on the bootstrap socket", e))?;
        if readable {
            self.accept_pending()?;
        }
        Ok(())
    }

    /// Reaps the rank of local index `rank` if it has exited, telling the bootstrap
    /// server.
    pub(crate) fn try_reap(&mut self, rank: usize) -> Result<Option<ExitStatus>> {
        let Some(child) = self.children[rank].as_mut() else {
            return Ok(None);
        };
        let status = child
            .try_wait()
            .map_err(|e| Error::os(format!("waitpid({})", child.id()), e))?;
        if let Some(status) = status {
            self.children[rank] = None;
            // Connections the rank made before exiting are in the listen backlog now;
            // take them first so the server sees the rank's last frames before its exit.
            let accepted = self.accept_pending();
            self.server.rank_exited(rank);
            accepted?;
            return Ok(Some(status));
        }
        Ok(None)
    }

    /// Accepts every queued connection and starts a thread serving each.
    fn accept_pending(&mut self) -> Result<()> {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::os("accept on the bootstrap socket", e)),
            };
            stream
                .set_nonblocking(false)
                .map_err(|e| Error::os("fcntl(~O_NONBLOCK) on a bootstrap connection", e))?;
            let handle = stream
                .try_clone()
                .map_err(|e| Error::os("dup of a bootstrap connection", e))?;
            let id = self.server.accepted();
            let server = Arc::clone(&self.server);
            let thread = std::thread::Builder::new()
                .name(format!("pwrun-conn-{id}"))
                .spawn(move || serve_connection(&server, stream, id));
            match thread {
                Ok(thread) => {
                    self.conns.push(handle);
                    self.threads.push(thread);
                }
                Err(e) => {
                    self.server.unidentified_closed();
                    return Err(Error::os("spawning a bootstrap connection thread", e));
                }
            }
        }
    }

    /// Stops the ranks still running (gracefully: SIGTERM, then SIGKILL after
    /// [`TERM_GRACE`]; else SIGKILL at once), reaps them, stops the connection threads,
    /// and removes the socket and the job's shared memory. Returns how many
    /// shared-memory objects were removed. Idempotent.
    pub(crate) fn finish(&mut self, graceful: bool) -> usize {
        if self.finished {
            return 0;
        }
        self.finished = true;
        if graceful && self.children.iter().any(Option::is_some) {
            for child in self.children.iter().flatten() {
                let _ = sys::signal_child(child, libc::SIGTERM);
            }
            let deadline = Instant::now() + TERM_GRACE;
            while Instant::now() < deadline && self.children.iter().any(Option::is_some) {
                std::thread::sleep(POLL_INTERVAL);
                for rank in 0..self.children.len() {
                    if self.try_reap(rank).is_err() {
                        break;
                    }
                }
            }
        }
        for rank in 0..self.children.len() {
            if let Some(mut child) = self.children[rank].take() {
                let _ = child.kill();
                let _ = child.wait();
                self.server.rank_exited(rank);
            }
        }
        // What the ranks started and left behind (a shell's child, a daemon): the parent-
        // death signal reaches only the ranks themselves.
        kill_leftovers(&self.job_id);
        for conn in &self.conns {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket_path);
        remove_shm(Path::new(SHM_DIR), &super::super::shm_prefix(&self.job_id))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.finish(false);
    }
}
