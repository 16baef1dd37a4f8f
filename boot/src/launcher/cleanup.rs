//! What the launcher does after a job, and how it names what happened to a process: the
//! processes a job left running, its shared-memory objects, exit statuses and signals.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use super::super::sys;
use super::super::ENV_JOB;

/// Kills (`SIGKILL`) every process of this user on this host that belongs to job `job`:
/// whose environment has `PAGEWIRE_JOB=job`, which every rank has and passes on to what it
/// starts. Returns how many.
pub(crate) fn kill_leftovers(job: &str) -> usize {
    let marker = format!("{ENV_JOB}={job}");
    let me = std::process::id();
    let uid = sys::effective_uid();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let path = e.path();
        let owned = std::fs::metadata(&path).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.uid() == uid
        });
        let ours = owned
            && std::fs::read(path.join("environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == marker.as_bytes()));
        if ours {
            sys::kill_process(pid);
            killed += 1;
        }
    }
    killed
}

/// Removes every entry of `dir` whose name starts with `prefix`; returns how many.
pub(crate) fn remove_shm(dir: &Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(prefix.as_bytes())
        {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if gone.is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The exit code a failed rank gives the job, and how to say it.
pub(crate) fn describe(status: ExitStatus) -> (i32, String) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, format!("exited with status {code}")),
        (None, Some(sig)) => (128 + sig, format!("killed by signal {}", signal_name(sig))),
        (None, None) => (1, format!("ended with {status}")),
    }
}

/// The conventional name of signal `sig` (`SIGKILL`), or `signal N` for others.
pub(crate) fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}
