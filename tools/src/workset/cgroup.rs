//! A cgroup v1 memory cgroup for one run: made with a limit, read for its statistics, and
//! removed when dropped (Lesokhin17 §6.1: "Using cgroups, we constrain the aggregated size of
//! both instances to 1GB").

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Where the cgroup v1 memory controller is mounted.
pub const MEMORY_CONTROLLER: &str = "/sys/fs/cgroup/memory";

/// A memory cgroup this process made; removed on drop (after its processes are gone).
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
}

/// What a memory cgroup says about a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// `memory.limit_in_bytes`.
    pub limit: u64,
    /// `memory.max_usage_in_bytes`: the peak charge.
    pub max_usage: u64,
    /// `memory.failcnt`: how often a charge hit the limit (and reclaim ran).
    pub failcnt: u64,
    /// `total_pgmajfault` of `memory.stat`: major faults of the cgroup's processes.
    pub pgmajfault: u64,
    /// `total_pgpgin`, pages charged.
    pub pgpgin: u64,
    /// `oom_kill` of `memory.oom_control`: processes the cgroup's OOM killer ended.
    pub oom_kills: u64,
}

impl MemoryCgroup {
    /// Makes `MEMORY_CONTROLLER/name` with `memory.limit_in_bytes` = `limit`.
    /// [`Error::CgroupUnavailable`] when there is no cgroup v1 memory controller or it may
    /// not be used here (the caller skips the study).
    pub fn create(name: &str, limit: u64) -> Result<MemoryCgroup> {
        let root = Path::new(MEMORY_CONTROLLER);
        if !root.join("memory.limit_in_bytes").exists() {
            return Err(Error::CgroupUnavailable(format!(
                "no cgroup v1 memory controller at {MEMORY_CONTROLLER}"
            )));
        }
        let dir = root.join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| Error::CgroupUnavailable(format!("cannot make {}: {e}", dir.display())))?;
        let cg = MemoryCgroup { dir };
        cg.write("memory.limit_in_bytes", &limit.to_string())
            .map_err(|e| Error::CgroupUnavailable(e.to_string()))?;
        let set = cg.read_u64("memory.limit_in_bytes")?;
        if set != limit {
            return Err(Error::Cgroup(format!(
                "{}: asked for a limit of {limit} bytes, the kernel set {set}",
                cg.dir.display()
            )));
        }
        Ok(cg)
    }

    /// The cgroup's directory (write a pid to its `cgroup.procs` to move that process in).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| Error::Io { path, source: e })
    }

    fn read(&self, file: &str) -> Result<String> {
        let path = self.dir.join(file);
        std::fs::read_to_string(&path).map_err(|e| Error::Io { path, source: e })
    }

    fn read_u64(&self, file: &str) -> Result<u64> {
        let text = self.read(file)?;
        text.trim().parse().map_err(|_| {
            Error::Cgroup(format!(
                "{}/{file}: not a number: {text:?}",
                self.dir.display()
            ))
        })
    }

    /// The statistics so far.
    pub fn stats(&self) -> Result<CgroupStats> {
        let stat = self.read("memory.stat")?;
        let oom = self.read("memory.oom_control").unwrap_or_default();
        Ok(CgroupStats {
            limit: self.read_u64("memory.limit_in_bytes")?,
            max_usage: self.read_u64("memory.max_usage_in_bytes")?,
            failcnt: self.read_u64("memory.failcnt")?,
            pgmajfault: stat_field(&stat, "total_pgmajfault"),
            pgpgin: stat_field(&stat, "total_pgpgin"),
            oom_kills: stat_field(&oom, "oom_kill"),
        })
    }
}

/// The value of `key` in a `key value` per line file (0 when absent).
pub fn stat_field(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Processes that just exited may take a moment to leave; a cgroup with processes
        // cannot be removed.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => {
                    eprintln!(
                        "pw-workset: could not remove the cgroup {}: {e}",
                        self.dir.display()
                    );
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_by_key() {
        let stat = "cache 4096\npgmajfault 3\ntotal_pgmajfault 17\n";
        assert_eq!(stat_field(stat, "total_pgmajfault"), 17);
        assert_eq!(stat_field(stat, "pgmajfault"), 3);
        assert_eq!(stat_field(stat, "absent"), 0);
        assert_eq!(
            stat_field("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "oom_kill"),
            2
        );
    }
}
