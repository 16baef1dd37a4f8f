//! Cross-memory attach (CMA): one kernel copy between this process's memory and another's
//! (`process_vm_readv`/`writev`), and who may use it with whom under the Yama LSM.

use std::io;

use crate::count_syscall;

/// A contiguous range of some process's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

pub(crate) fn iovecs(extents: &[Extent]) -> Vec<libc::iovec> {
    extents
        .iter()
        .filter(|e| e.len > 0)
        .map(|e| libc::iovec {
            iov_base: e.addr as *mut libc::c_void,
            iov_len: e.len as usize,
        })
        .collect()
}

/// Which way [`cma_copy`] moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmaDirection {
    /// From `pid`'s `remote` extents into this process's `local` extents.
    Read,
    /// From this process's `local` extents into `pid`'s `remote` extents.
    Write,
}

/// Copies between this process's `local` extents and process `pid`'s `remote` extents with
/// one kernel copy, looping over partial transfers and the kernel's IOV_MAX. Both lists must
/// describe the same number of bytes. Returns `EFAULT` if any address is unmapped (nothing is
/// written past the fault), `EPERM` if the kernel forbids access to `pid`, `ESRCH` if it is
/// gone.
///
/// The caller guarantees that the `local` extents, when written, belong to memory the user
/// handed to the NIC (a registered region named in a posted work request, whose `post_*`
/// contract forbids conflicting Rust accesses) or to a buffer the caller owns.
pub fn cma_copy(
    pid: u32,
    dir: CmaDirection,
    local: &[Extent],
    remote: &[Extent],
) -> io::Result<u64> {
    let total: u64 = local.iter().map(|e| e.len).sum();
    debug_assert_eq!(total, remote.iter().map(|e| e.len).sum::<u64>());
    let (mut l, mut r) = (iovecs(local), iovecs(remote));
    let (mut li, mut ri) = (0usize, 0usize);
    let mut done = 0u64;
    while done < total {
        let ln = (l.len() - li).min(1024);
        let rn = (r.len() - ri).min(1024);
        // SAFETY: the iovec arrays are valid for ln/rn entries. The kernel checks every
        // remote and local address against the target's and our page tables and fails with
        // EFAULT instead of touching unmapped memory; local extents are written only for
        // Read, under the caller's guarantee above.
        count_syscall();
        let n = unsafe {
            match dir {
                CmaDirection::Read => libc::process_vm_readv(
                    pid as libc::pid_t,
                    l.as_ptr().add(li),
                    ln as libc::c_ulong,
                    r.as_ptr().add(ri),
                    rn as libc::c_ulong,
                    0,
                ),
                CmaDirection::Write => libc::process_vm_writev(
                    pid as libc::pid_t,
                    l.as_ptr().add(li),
                    ln as libc::c_ulong,
                    r.as_ptr().add(ri),
                    rn as libc::c_ulong,
                    0,
                ),
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n as u64;
        advance(&mut l, &mut li, n as usize);
        advance(&mut r, &mut ri, n as usize);
    }
    Ok(total)
}

fn advance(v: &mut [libc::iovec], idx: &mut usize, mut n: usize) {
    while n > 0 && *idx < v.len() {
        let cur = &mut v[*idx];
        if n >= cur.iov_len {
            n -= cur.iov_len;
            *idx += 1;
        } else {
            cur.iov_base = (cur.iov_base as usize + n) as *mut libc::c_void;
            cur.iov_len -= n;
            n = 0;
        }
    }
}

/// The Yama LSM's `kernel.yama.ptrace_scope` (0 classic, 1 restricted to descendants and
/// named ptracers, 2 admin only, 3 none), or `None` where Yama is not in the kernel.
pub fn yama_ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The process whose descendants may read and write this rank's memory with CMA, when this
/// rank must name one: under Yama's `ptrace_scope` 1, a process may only trace its own
/// descendants or processes that named it (or one of its ancestors) their ptracer, so ranks
/// that are siblings cannot use `process_vm_readv` on each other unless each names their
/// common parent. That parent is `pwrun` (or the test or benchmark that launched the job),
/// or under `mpirun` the launcher's local proxy (MPICH's `hydra_pmi_proxy`, Open MPI's
/// `prted`): its descendants are this host's processes of the job, not other programs of
/// the same user (`PR_SET_PTRACER_ANY` would admit those too).
///
/// `None` when nothing needs naming or naming would not help: a single-rank job (no peer
/// reads its memory); no Yama, or scope 0 (siblings may already), 2 or 3 (only
/// `CAP_SYS_PTRACE`, or nobody, whatever is named); a rank whose parent is gone or is
/// `init` (pid 1, whose descendants are every process). Peers then find CMA forbidden at
/// start-up (the soft NIC then stages payloads through its rings, the local path leaves
/// the peer to the NIC).
pub fn cma_ptracer(ranks: usize, yama_scope: Option<u32>, parent: u32) -> Option<u32> {
    (ranks > 1 && yama_scope == Some(1) && parent > 1).then_some(parent)
}

/// Names this process's parent its CMA tracer where Yama needs that for the `ranks` ranks
/// of a job to read each other's memory ([`cma_ptracer`]); a refusal is left for the
/// callers' probes ([`cma_read_word`]) to find.
pub fn admit_cma_from_siblings(ranks: usize) {
    if let Some(tracer) = cma_ptracer(
        ranks,
        yama_ptrace_scope(),
        std::os::unix::process::parent_id(),
    ) {
        let _ = allow_cma_from_descendants_of(tracer);
    }
}

/// The 8-byte word at `addr` in process `pid`, read with CMA: `None` where the kernel does
/// not let this process read it (the start-up probes of who may use CMA with whom).
pub fn cma_read_word(pid: u32, addr: u64) -> Option<u64> {
    let mut word = [0u8; 8];
    let local = [Extent {
        addr: word.as_mut_ptr() as u64,
        len: 8,
    }];
    let remote = [Extent { addr, len: 8 }];
    cma_copy(pid, CmaDirection::Read, &local, &remote).ok()?;
    Some(u64::from_le_bytes(word))
}

/// Lets process `tracer` and its descendants read and write this process's memory with CMA
/// when Yama restricts ptrace to descendants (`prctl(PR_SET_PTRACER, tracer)`, replacing
/// any earlier exception). Sibling processes, such as the ranks of one job, need it to use
/// `process_vm_readv`/`writev` between each other; naming their common parent admits them
/// and nothing outside that process tree.
pub fn allow_cma_from_descendants_of(tracer: u32) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PTRACER, pid) only changes this process's Yama exception; the
    // variadic arguments are plain integers and no memory of ours is touched.
    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, tracer as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cma_ptracer_is_the_parent_only_where_yama_needs_one() {
        // Siblings under Yama scope 1 name their parent (pwrun, mpirun's proxy).
        assert_eq!(cma_ptracer(4, Some(1), 4242), Some(4242));
        // A single rank has no peer to admit.
        assert_eq!(cma_ptracer(1, Some(1), 4242), None);
        // No Yama, classic scope, admin-only or no ptrace at all: naming changes nothing.
        for scope in [None, Some(0), Some(2), Some(3)] {
            assert_eq!(cma_ptracer(4, scope, 4242), None, "{scope:?}");
        }
        // An orphan would admit every process by naming init.
        assert_eq!(cma_ptracer(4, Some(1), 1), None);
        assert_eq!(cma_ptracer(4, Some(1), 0), None);
    }
}
