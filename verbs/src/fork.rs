//! Fork safety (`PAGEWIRE_FORK_SAFE=1`): whether to call `ibv_fork_init(3)`, and what to say
//! when it is too late.
//!
//! `ibv_fork_init` marks registered pages `MADV_DONTFORK` so that a child's copy-on-write
//! cannot move a page the NIC still uses. It can only be enabled before the first
//! `ibv_dontfork_range` of the process: every memory registration calls it, and so does mlx5
//! for its own queue and completion-queue buffers (`libibverbs/memory.c`, `too_late`).
//! Beside an MPI library (or anything else) that opened a device first, `ibv_fork_init`
//! therefore fails with `EINVAL`. Two cases are not failures at all, and
//! `ibv_is_fork_initialized(3)` (rdma-core 35) tells them apart:
//!
//! - `IBV_FORK_ENABLED`: something (`RDMAV_FORK_SAFE=1` in the environment, or the other
//!   library) already enabled it;
//! - `IBV_FORK_UNNEEDED`: the kernel copies DMA-pinned pages on fork (Linux 5.13 and later),
//!   so nothing needs enabling. rdma-core 35 to 50 still let `ibv_fork_init` fail with
//!   `EINVAL` in this case once it is "too late"; rdma-core 51 returns 0
//!   (`libibverbs/memory.c`, commit "ignore IBV_FORK_SAFE et.al. when kernel has fork
//!   support").
#![forbid(unsafe_code)]

/// `enum ibv_fork_status` (`ibv_is_fork_initialized(3)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ForkStatus {
    /// `IBV_FORK_DISABLED`: not enabled (yet).
    Disabled,
    /// `IBV_FORK_ENABLED`: `ibv_fork_init` already ran.
    Enabled,
    /// `IBV_FORK_UNNEEDED`: the kernel copies DMA pages on fork.
    Unneeded,
    /// A value this build does not know.
    Other(u32),
}

impl ForkStatus {
    /// From the raw `enum ibv_fork_status`.
    pub(crate) fn from_raw(v: u32) -> ForkStatus {
        match v {
            0 => ForkStatus::Disabled,
            1 => ForkStatus::Enabled,
            2 => ForkStatus::Unneeded,
            other => ForkStatus::Other(other),
        }
    }
}

/// What `PAGEWIRE_FORK_SAFE=1` does, given `ibv_is_fork_initialized` (`None`: libibverbs
/// older than rdma-core 35 has no such call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ForkPlan {
    /// Nothing to do: fork support is on already, or the kernel makes it unnecessary.
    AlreadySafe,
    /// Call `ibv_fork_init`.
    CallForkInit,
}

/// The plan for `status`.
pub(crate) fn plan(status: Option<ForkStatus>) -> ForkPlan {
    match status {
        Some(ForkStatus::Enabled) | Some(ForkStatus::Unneeded) => ForkPlan::AlreadySafe,
        Some(ForkStatus::Disabled) | Some(ForkStatus::Other(_)) | None => ForkPlan::CallForkInit,
    }
}

/// The one-line explanation of an `ibv_fork_init` that failed with `errno`.
pub(crate) fn failure(errno: Option<i32>, status: Option<ForkStatus>) -> String {
    let checked = match status {
        Some(_) => "",
        None => " (this libibverbs predates ibv_is_fork_initialized, rdma-core 35)",
    };
    match errno {
        Some(libc::EINVAL) => format!(
            "PAGEWIRE_FORK_SAFE=1 cannot be honoured: ibv_fork_init failed with EINVAL because \
             this process already registered memory or created verbs queues without fork \
             support (another library, an MPI library say, opened an RDMA device first){checked}; \
             set RDMAV_FORK_SAFE=1 in the environment so that libibverbs enables it before \
             anything uses it, or unset PAGEWIRE_FORK_SAFE if the process does not fork while \
             RDMA is in use"
        ),
        _ => format!(
            "PAGEWIRE_FORK_SAFE=1 cannot be honoured: ibv_fork_init failed ({}){checked}",
            errno.map_or_else(
                || "no error code".to_string(),
                |e| std::io::Error::from_raw_os_error(e).to_string()
            )
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_init_is_called_only_when_fork_support_is_off_or_unknown() {
        assert_eq!(ForkStatus::from_raw(0), ForkStatus::Disabled);
        assert_eq!(ForkStatus::from_raw(1), ForkStatus::Enabled);
        assert_eq!(ForkStatus::from_raw(2), ForkStatus::Unneeded);
        assert_eq!(ForkStatus::from_raw(9), ForkStatus::Other(9));
        // The kernel copies DMA pages on fork: before rdma-core 51 ibv_fork_init would still
        // fail with EINVAL here once anything registered memory, for nothing.
        assert_eq!(plan(Some(ForkStatus::Unneeded)), ForkPlan::AlreadySafe);
        assert_eq!(plan(Some(ForkStatus::Enabled)), ForkPlan::AlreadySafe);
        assert_eq!(plan(Some(ForkStatus::Disabled)), ForkPlan::CallForkInit);
        assert_eq!(plan(Some(ForkStatus::Other(9))), ForkPlan::CallForkInit);
        assert_eq!(plan(None), ForkPlan::CallForkInit);
    }

    #[test]
    fn too_late_says_why_and_what_to_do_in_one_line() {
        let e = failure(Some(libc::EINVAL), Some(ForkStatus::Disabled));
        assert!(e.contains("already registered memory"), "{e}");
        assert!(e.contains("RDMAV_FORK_SAFE=1"), "{e}");
        assert!(!e.contains('\n') && !e.contains("rdma-core 35"), "{e}");
        let old = failure(Some(libc::EINVAL), None);
        assert!(old.contains("rdma-core 35"), "{old}");
        let other = failure(Some(libc::ENOSYS), Some(ForkStatus::Disabled));
        assert!(other.contains("ibv_fork_init failed ("), "{other}");
    }
}
