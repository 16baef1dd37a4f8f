//! Two hosts on this machine for tests that must cross a network: a pair made
//! by `tools/hosts/ns-hosts` (each host its own network namespace on a veth pair, its own
//! `/dev/shm`, PID, mount, UTS and IPC namespaces), with its stand-in for ssh, removed
//! when dropped. Where namespaces are not permitted a test skips with the reason, unless
//! `PAGEWIRE_REQUIRE` names `namespaced-hosts`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{require, Prerequisite};

/// The script that makes and removes the hosts.
pub fn ns_hosts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/hosts/ns-hosts")
}

/// A pair of namespaced hosts, `pwID-0` and `pwID-1`; removed (every process on them
/// killed) on drop.
pub struct TwoHosts {
    id: String,
    dir: PathBuf,
    /// The two hosts' names.
    pub names: [String; 2],
}

impl TwoHosts {
    /// Makes a pair, or `None` after [`require`] said the test is skipped.
    pub fn up() -> Option<TwoHosts> {
        require(Prerequisite::NamespacedHosts, Self::try_up())
    }

    fn try_up() -> Result<TwoHosts, String> {
        let script = ns_hosts();
        let check = run(Command::new(&script).arg("check"))?;
        if !check.status.success() {
            return Err(String::from_utf8_lossy(&check.stderr).trim().to_string());
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "t{}{}",
            std::process::id() % 100_000,
            NEXT.fetch_add(1, Ordering::Relaxed) % 100
        );
        let up = run(Command::new(&script).args(["up", &id]))?;
        if !up.status.success() {
            return Err(format!(
                "ns-hosts up {id}: {}",
                String::from_utf8_lossy(&up.stderr).trim()
            ));
        }
        let dir = PathBuf::from(String::from_utf8_lossy(&up.stdout).trim());
        Ok(TwoHosts {
            names: [format!("pw{id}-0"), format!("pw{id}-1")],
            id,
            dir,
        })
    }

    /// The stand-in for ssh (`PAGEWIRE_RSH`): runs a command on a host, from `$HOME`, with
    /// a clean environment.
    pub fn rsh(&self) -> PathBuf {
        self.dir.join("rsh")
    }

    /// Runs `sh -c SCRIPT` on host `host` (0 or 1); what it printed on stdout.
    pub fn on(&self, host: usize, script: &str) -> String {
        let out =
            run(Command::new(self.dir.join("enter")).args([&self.names[host], "sh", "-c", script]))
                .unwrap_or_else(|e| panic!("running {script:?} on {}: {e}", self.names[host]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What is left on host `host`: its processes other than its init, and the entries of
    /// its `/dev/shm`. Waits up to `patience` for them to go (an orphan is reaped by the
    /// host's init a moment after it dies).
    pub fn leftovers(&self, host: usize, patience: Duration) -> (Vec<String>, Vec<String>) {
        let deadline = Instant::now() + patience;
        loop {
            // `ps` itself, its shell and `enter`'s are this look's own.
            let procs: Vec<String> = self
                .on(host, "ps -e -o pid=,ppid=,stat=,args=")
                .lines()
                .map(str::trim)
                .filter(|l| {
                    let pid = l.split_whitespace().next().unwrap_or("");
                    pid != "1" && !l.contains("ps -e -o") && !l.contains("sh -c ps")
                })
                .map(String::from)
                .collect();
            let shm: Vec<String> = self
                .on(host, "ls -A /dev/shm")
                .lines()
                .map(String::from)
                .collect();
            if (procs.is_empty() && shm.is_empty()) || Instant::now() > deadline {
                return (procs, shm);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        let _ = Command::new(ns_hosts()).args(["down", &self.id]).output();
    }
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    cmd.output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))
}
