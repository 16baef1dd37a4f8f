//! `pwrun --hosts h1,h2[:slots]`: a job across hosts, started the way MPICH's
//! hydra starts one, with an agent per host (`agent.rs`) reached through `PAGEWIRE_RSH`
//! (default `ssh`).
//!
//! - **Placement.** Ranks fill the hosts in the order given, `slots` at a time (1 when a
//!   host names none), going round again if `-n` asks for more ranks than there are slots;
//!   `-n` defaults to the sum of the slots.
//! - **Start.** For each host with ranks, the frontend runs `PAGEWIRE_RSH HOST PWRUN
//!   --agent`, where `PWRUN` is this program's own path (the hosts must share it, as
//!   they share the program and the working directory), and sends it START: the job id,
//!   its ranks, the program, its arguments, the working directory and the environment
//!   (this process's, without host-specific variables, with `--env` on top).
//! - **Bootstrap.** Each agent serves its ranks' bootstrap socket and relays; the frontend
//!   completes the job's collectives (`launcher/rounds.rs`, the same code as one host's) and sends
//!   every agent the answer once. The soft NIC's addresses travel this way, so ranks on one
//!   host reach each other through shared memory and the others through the TCP wire.
//! - **Output.** Ranks' stdout comes to the frontend's stdout, their stderr (and the
//!   agents') to its stderr; the frontend's stdin goes to rank 0.
//! - **End.** Every rank exits 0: exit 0. A rank fails (non-zero, or killed): its line
//!   `pwrun: rank R (pid P on HOST) exited with status S`, the other ranks stopped, its
//!   status. An agent's channel ends before the job does (the agent or its host's
//!   connection died): `pwrun: the agent on HOST ended before the job did ...`, the other
//!   agents stopped, that host cleaned through a new `PAGEWIRE_RSH HOST PWRUN
//!   --agent-clean JOB` ([`clean_host`]: the job's processes and `/dev/shm` objects
//!   there), and status 255 (ssh's own for a lost connection). The agents clean their own
//!   hosts when stopped. Timeouts and signals as under `pwrun -n`.
//!
//! The frontend's view of a running job, and how it ends, is `frontend.rs`; its end of each
//! agent's channel (frames read and sent, stdin forwarded) is `channel.rs`.

pub(crate) mod agent;
mod channel;
mod frontend;
pub(crate) mod relay;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::launcher::rounds::Rounds;
use super::launcher::{remove_shm, JobOutcome, LaunchConfig, POLL_INTERVAL, SHM_DIR, TERM_GRACE};
use super::sys;
pub use agent::run_agent;
use channel::{forward_input, read_agent, Agent, Event};
use frontend::{End, Frontend};
use pagewire_sys::{Error, Result};
use relay::Start;

/// The environment variable naming the remote shell (`ssh` by default; words split at
/// spaces: `ssh -x`, or a stand-in such as `tools/hosts/ns-hosts`' `rsh`).
pub const ENV_RSH: &str = "PAGEWIRE_RSH";
/// How long the frontend waits for stopped agents to say BYE, beyond their ranks' grace.
const STOP_PATIENCE: Duration = Duration::from_secs(4);

/// `--hosts`: host names, each with its slots (ranks per round).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostList(Vec<(String, usize)>);

impl HostList {
    /// Parses `h1,h2:2,...`: names without spaces, each at most once, slots at least 1.
    pub fn parse(s: &str) -> std::result::Result<HostList, String> {
        let mut hosts: Vec<(String, usize)> = Vec::new();
        for item in s.split(',') {
            let (name, slots) = match item.split_once(':') {
                Some((n, k)) => {
                    let k: usize = k
                        .parse()
                        .ok()
                        .filter(|&k| k > 0)
                        .ok_or_else(|| format!("`{item}`: slots must be a positive number"))?;
                    (n, k)
                }
                None => (item, 1),
            };
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '\'') {
                return Err(format!("`{item}` is not a host name"));
            }
            if hosts.iter().any(|(h, _)| h == name) {
                return Err(format!("host {name} is named twice"));
            }
            hosts.push((name.to_string(), slots));
        }
        Ok(HostList(hosts))
    }

    /// Slots over all hosts: the default rank count.
    pub fn slots(&self) -> usize {
        self.0.iter().map(|(_, k)| k).sum()
    }

    /// The ranks of an `n`-rank job on each host (hosts without ranks left out): hosts in
    /// order, `slots` ranks each, round again while ranks remain.
    pub fn assign(&self, n: usize) -> Vec<(String, Vec<usize>)> {
        let mut per: Vec<Vec<usize>> = vec![Vec::new(); self.0.len()];
        let mut rank = 0;
        while rank < n {
            for (i, (_, slots)) in self.0.iter().enumerate() {
                for _ in 0..*slots {
                    if rank < n {
                        per[i].push(rank);
                        rank += 1;
                    }
                }
            }
        }
        self.0
            .iter()
            .zip(per)
            .filter(|(_, r)| !r.is_empty())
            .map(|((h, _), r)| (h.clone(), r))
            .collect()
    }
}

/// The remote shell command: `PAGEWIRE_RSH` split at spaces, `ssh` by default.
pub fn rsh_from_env() -> Result<Vec<OsString>> {
    let v = std::env::var_os(ENV_RSH).unwrap_or_else(|| "ssh".into());
    let words: Vec<OsString> = v
        .as_bytes()
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| OsStr::from_bytes(w).to_os_string())
        .collect();
    if words.is_empty() {
        return Err(Error::invalid_setting(
            ENV_RSH,
            "",
            "a remote shell command such as ssh",
        ));
    }
    Ok(words)
}

/// Variables not passed to other hosts: this host's and this login's own, and a launcher's
/// (each agent sets the job's).
fn host_specific(key: &OsStr) -> bool {
    let k = key.as_bytes();
    matches!(
        k,
        b"HOSTNAME" | b"HOST" | b"PWD" | b"OLDPWD" | b"SHLVL" | b"_" | b"DISPLAY" | b"XAUTHORITY"
    ) || k.starts_with(b"SSH_")
        || k.starts_with(b"PAGEWIRE_BIND")
        || [
            super::ENV_JOB,
            super::ENV_RANK,
            super::ENV_SIZE,
            super::ENV_BOOT_SOCKET,
            super::ENV_LAUNCHER,
        ]
        .iter()
        .any(|v| k == v.as_bytes())
        || super::MPI_LAUNCHER_VARS.iter().any(|v| k == v.as_bytes())
}

/// The ranks' environment: this process's without [`host_specific`] variables, `extra` on
/// top.
fn job_environment(extra: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    let mut env: BTreeMap<OsString, OsString> = std::env::vars_os()
        .filter(|(k, _)| !host_specific(k))
        .collect();
    env.extend(extra.iter().cloned());
    env.into_iter().collect()
}

/// Quotes `s` for the remote shell (`ssh` joins its words and runs them with `sh -c`).
fn shell_quote(s: &OsStr) -> OsString {
    let mut q = b"'".to_vec();
    for &b in s.as_bytes() {
        if b == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else {
            q.push(b);
        }
    }
    q.push(b'\'');
    OsStr::from_bytes(&q).to_os_string()
}

/// Runs `cfg.ranks` ranks of `cfg.program` on `hosts` through the remote shell `rsh`
/// (module documentation). `Err` only when the job could not be started at all.
pub fn launch_hosts(cfg: &LaunchConfig, hosts: &HostList, rsh: &[OsString]) -> Result<JobOutcome> {
    if cfg.ranks == 0 {
        return Err(Error::Launcher(
            "a job needs at least one rank (got 0)".into(),
        ));
    }
    let signals = sys::SignalGuard::install()
        .map_err(|e| Error::os("sigaction(SIGINT/SIGTERM/SIGHUP)", e))?;
    let started = Instant::now();
    let pwrun = std::env::current_exe()
        .map_err(|e| Error::Launcher(format!("cannot find pwrun's own path: {e}")))?;
    let cwd = std::env::current_dir()
        .map_err(|e| Error::Launcher(format!("cannot read the working directory: {e}")))?;
    let job = super::new_job_id();
    let env = job_environment(&cfg.env);
    let placement = hosts.assign(cfg.ranks);
    let mut host_of = vec![0usize; cfg.ranks];
    for (i, (_, ranks)) in placement.iter().enumerate() {
        for &r in ranks {
            host_of[r] = i;
        }
    }

    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    let mut agents: Vec<Agent> = Vec::with_capacity(placement.len());
    for (i, (host, ranks)) in placement.iter().enumerate() {
        let mut cmd = Command::new(&rsh[0]);
        cmd.args(&rsh[1..])
            .arg(host)
            .arg(shell_quote(pwrun.as_os_str()))
            .arg("--agent")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        sys::die_with_parent(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for a in &mut agents {
                    a.stop();
                }
                return Err(Error::Launcher(format!(
                    "cannot run the remote shell {} ({ENV_RSH}) for host {host}: {e}",
                    rsh[0].to_string_lossy()
                )));
            }
        };
        let out = child.stdout.take().expect("piped");
        let to = Arc::new(Mutex::new(child.stdin.take()));
        let tx = tx.clone();
        std::thread::spawn(move || read_agent(i, out, &tx));
        let agent = Agent {
            host: host.clone(),
            child,
            to,
            gone: false,
            finished: false,
            stop_sent: false,
        };
        let start = Start {
            job: job.clone(),
            size: cfg.ranks as u64,
            host: i as u32,
            ranks: ranks.iter().map(|&r| r as u64).collect(),
            program: cfg.program.clone(),
            args: cfg.args.clone(),
            env: env.clone(),
            cwd: cwd.clone(),
            bind: cfg.bind,
        };
        agent.send(relay::START, &start.encode());
        agents.push(agent);
    }
    drop(tx);
    // The frontend's stdin goes to rank 0's agent.
    {
        let to = agents[host_of[0]].to.clone();
        std::thread::spawn(move || forward_input(&to));
    }

    let mut f = Frontend {
        agents,
        ranks_of: placement.into_iter().map(|(_, r)| r).collect(),
        host_of,
        rounds: Rounds::new(cfg.ranks),
        pids: vec![0; cfg.ranks],
        exited: vec![false; cfg.ranks],
        end: None,
        lost: Vec::new(),
        removed: 0,
    };
    let mut stop_deadline: Option<Instant> = None;
    let mut stdout = io::stdout();
    while !f.agents.iter().all(|a| a.gone) && stop_deadline.is_none_or(|d| Instant::now() < d) {
        let event = rx.recv_timeout(POLL_INTERVAL);
        if let Some(sig) = signals.pending() {
            f.end_with(End::Interrupted(sig));
        } else if cfg.timeout.is_some_and(|limit| started.elapsed() >= limit) {
            f.end_with(End::TimedOut(cfg.timeout.expect("checked")));
        }
        match event {
            Ok((i, Event::Frame(tag, payload))) => f.on_frame(i, tag, &payload, &mut stdout),
            Ok((i, Event::End(why))) => f.on_end(i, why),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if f.end.is_some() && stop_deadline.is_none() {
            for a in &mut f.agents {
                a.stop();
            }
            stop_deadline = Some(Instant::now() + TERM_GRACE + STOP_PATIENCE);
        }
    }
    f.finish(rsh, &pwrun, &job);
    f.outcome()
}

/// `pwrun --agent-clean JOB`, on a host whose agent died: kills this user's processes of
/// job `JOB` on this host (those whose environment has `PAGEWIRE_JOB=JOB`: ranks, and what
/// they started) and removes the job's `/dev/shm` objects and bootstrap sockets; prints how
/// many shared-memory objects it removed.
pub fn clean_host(job: &str) -> Result<usize> {
    if job.is_empty()
        || !job
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    {
        return Err(Error::InvalidArgument(format!("{job:?} is not a job id")));
    }
    super::launcher::kill_leftovers(job);
    let tmp = std::env::temp_dir();
    remove_shm(&tmp, &format!("pagewire-{job}-h"));
    Ok(remove_shm(
        std::path::Path::new(SHM_DIR),
        &super::shm_prefix(job),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_fill_by_slots_and_go_round_again() {
        let h = HostList::parse("a:2,b,c:3").unwrap();
        assert_eq!(h.slots(), 6);
        assert_eq!(
            h.assign(8),
            vec![
                ("a".to_string(), vec![0, 1, 6, 7]),
                ("b".to_string(), vec![2]),
                ("c".to_string(), vec![3, 4, 5]),
            ]
        );
        // Hosts left without ranks are not started.
        assert_eq!(h.assign(2), vec![("a".to_string(), vec![0, 1])]);
        for bad in ["", "a,,b", "a:0", "a:x", "a:-1", "a b", "a,a", "it's"] {
            assert!(HostList::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_environment_leaves_this_host_behind() {
        for k in [
            "HOSTNAME",
            "PWD",
            "SSH_CONNECTION",
            "PAGEWIRE_JOB",
            "PAGEWIRE_BIND_CPUS",
            "PMI_FD",
        ] {
            assert!(host_specific(OsStr::new(k)), "{k}");
        }
        for k in ["PATH", "HOME", "PAGEWIRE_MODE", "LD_LIBRARY_PATH"] {
            assert!(!host_specific(OsStr::new(k)), "{k}");
        }
        assert_eq!(shell_quote(OsStr::new("/a b/it's")), "'/a b/it'\\''s'");
    }
}
