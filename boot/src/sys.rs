//! The launcher's few system calls that need `unsafe`, each behind a safe function.
//!
//! Nothing else in `boot` uses `unsafe`; every block here carries its `SAFETY` argument.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The Unix stream socket this process inherited as descriptor `fd` (the PMI-1 server's
/// connection, `PMI_FD`), taken over: the caller owns it from now on. Fails if `fd` is not
/// open or not a socket.
pub(super) fn inherited_stream(fd: i32) -> io::Result<std::os::unix::net::UnixStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: fstat on a descriptor number only reads the kernel's table into `st`; an
    // unopened number is EBADF.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a socket"));
    }
    // Not inherited by programs this rank starts.
    // SAFETY: F_SETFD on an open descriptor changes only its close-on-exec flag.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the launcher handed this descriptor to this process for the PMI connection,
    // and nothing else in it uses it: ownership moves to the stream, which closes it.
    Ok(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
}

/// Makes the child started by `cmd` receive `SIGKILL` when the launcher goes away.
///
/// Linux delivers the parent-death signal when the *thread* that forked the child exits,
/// so the caller must spawn and reap its children from one thread (as `launch` does).
/// If the launcher died between `fork` and `prctl`, the child gives up before `exec`.
pub(super) fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    let hook = move || -> io::Result<()> {
        // SAFETY: prctl(PR_SET_PDEATHSIG, sig) only sets a flag of the calling process;
        // the extra variadic arguments are plain integers and it touches no memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: getppid has no preconditions and cannot fail.
        if unsafe { libc::getppid() } != parent {
            // The launcher already died: do not run the program orphaned.
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before `exec`. It only calls prctl and
    // getppid, both async-signal-safe, and allocates nothing (errors are built from raw
    // errno values), so it is sound even though the parent is multi-threaded.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Sends `sig` to `child`.
///
/// The caller must not have reaped `child` yet (no `wait`/`try_wait` has returned its
/// status), so its pid cannot have been reused by an unrelated process.
pub(super) fn signal_child(child: &Child, sig: libc::c_int) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(child.id()).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: kill takes two integers and touches no memory; per the contract above the
    // pid still names our own unreaped child (at worst a zombie, which ignores signals).
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Who is at the other end of a connected Unix socket, as the kernel recorded it when the
/// connection was made (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PeerCredentials {
    /// The connecting process, in this process's pid namespace; 0 when it is not visible
    /// from here (another pid namespace).
    pub(super) pid: u32,
    /// Its effective user id.
    pub(super) uid: u32,
}

/// The credentials of the peer of the connected Unix socket `fd`.
pub(super) fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a valid, exclusively
    // borrowed ucred of that size, and updates `len`; the fd is kept open by the borrow.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCredentials {
        pid: u32::try_from(cred.pid).unwrap_or(0),
        uid: cred.uid,
    })
}

/// This process's effective user id.
pub(super) fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Waits up to `timeout` for `fd` to become readable; `Ok(false)` on timeout or `EINTR`.
pub(super) fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is a valid, exclusively borrowed pollfd array of length 1 for the
    // duration of the call, and the fd is kept open by the `BorrowedFd` borrow.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(n > 0)
}

/// Termination signals the launcher catches while a job runs, so it can tear the job down
/// and clean up instead of dying on the spot.
const CAUGHT: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Last termination signal received while a [`SignalGuard`] was alive (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

/// Number of live guards and the dispositions they replaced.
static INSTALLED: Mutex<(usize, Vec<(libc::c_int, libc::sigaction)>)> = Mutex::new((0, Vec::new()));

extern "C" fn record_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    PENDING.store(sig, Ordering::SeqCst);
}

/// While alive, SIGINT, SIGTERM and SIGHUP are recorded instead of killing the process
/// (signals the process ignored stay ignored). Guards nest across threads: the previous
/// dispositions come back when the last one is dropped.
#[derive(Debug)]
pub(super) struct SignalGuard(());

impl SignalGuard {
    /// Installs the recording handlers (or joins the ones already installed).
    pub(super) fn install() -> io::Result<SignalGuard> {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if installed.0 == 0 {
            PENDING.store(0, Ordering::SeqCst);
            let mut saved = Vec::new();
            for sig in CAUGHT {
                // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask,
                // no flags); sigaction only writes through the valid `old` pointer.
                let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
                if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
                    let e = io::Error::last_os_error();
                    restore(&saved);
                    return Err(e);
                }
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                // SAFETY: as above for the zeroed value; sigemptyset initialises the mask
                // it is given. The handler is an `extern "C" fn(c_int)` that only stores
                // to an atomic, which is async-signal-safe; both pointers are valid.
                let rc = unsafe {
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = record_signal as extern "C" fn(libc::c_int) as usize;
                    new.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut new.sa_mask);
                    libc::sigaction(sig, &new, std::ptr::null_mut())
                };
                if rc != 0 {
                    let e = io::Error::last_os_error();
                    restore(&saved);
                    return Err(e);
                }
                saved.push((sig, old));
            }
            installed.1 = saved;
        }
        installed.0 += 1;
        Ok(SignalGuard(()))
    }

    /// The termination signal received since the handlers were installed, if any.
    pub(super) fn pending(&self) -> Option<libc::c_int> {
        match PENDING.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        installed.0 -= 1;
        if installed.0 == 0 {
            let saved = std::mem::take(&mut installed.1);
            restore(&saved);
        }
    }
}

/// Puts back dispositions saved by [`SignalGuard::install`].
fn restore(saved: &[(libc::c_int, libc::sigaction)]) {
    for (sig, old) in saved {
        // SAFETY: `old` is a disposition the kernel returned for this very signal, so it
        // is valid to reinstall; the pointer is valid for the call.
        unsafe {
            libc::sigaction(*sig, old, std::ptr::null_mut());
        }
    }
}

/// Largest CPU number a `cpu_set_t` can name.
const CPU_SET_CAPACITY: usize = libc::CPU_SETSIZE as usize;

/// A `cpu_set_t` holding `cpus`; `EINVAL` if one is beyond what the type can hold.
fn cpu_set_of(cpus: &[usize]) -> io::Result<libc::cpu_set_t> {
    // SAFETY: `cpu_set_t` is a plain bit array, for which all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= CPU_SET_CAPACITY {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so CPU_SET writes inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    Ok(set)
}

/// The CPUs the calling thread may run on (`sched_getaffinity`), in increasing order.
pub(super) fn cpu_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: all-zero is a valid (empty) `cpu_set_t`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most `size_of::<cpu_set_t>()` bytes into `set`, which is
    // a valid, exclusively borrowed value of that size.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every index is below CPU_SETSIZE, so CPU_ISSET reads inside `set`.
    Ok((0..CPU_SET_CAPACITY)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Makes the child started by `cmd` run only on `cpus`: `sched_setaffinity` between fork
/// and exec, so the program is bound from its first instruction and its first allocations
/// are already touched on the right CPU. Fails at once if a CPU cannot be represented; the
/// spawn fails if the kernel refuses the set (e.g. none of the CPUs is online).
pub(super) fn bind_child_cpus(cmd: &mut Command, cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set_of(cpus)?;
    let hook = move || -> io::Result<()> {
        // SAFETY: `set` is a fully initialised cpu_set_t owned by the closure and passed
        // with its exact size; sched_setaffinity only reads it.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before `exec`; it makes one system call
    // (async-signal-safe) on a value built before the fork and allocates nothing, so it is
    // sound in a child of a multi-threaded parent.
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}

/// Sends `SIGKILL` to process `pid` (a job's leftover, by `pwrun --agent-clean`); a
/// process already gone is no error.
pub(super) fn kill_process(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a positive pid and a valid signal number touches no memory.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}
