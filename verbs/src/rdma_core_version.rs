//! The oldest rdma-core the verbs provider supports. Shared by the library and the crate's
//! build script (`build.rs` in this directory), which stops a build against an older
//! rdma-core with one line instead of a missing-type error from deep inside the binding.
//!
//! **rdma-core 32** is the first release with `ibv_query_gid_ex` (`_ibv_query_gid_ex`,
//! symbol version IBVERBS_1.11, and `struct ibv_gid_entry` with the GID's type), which the
//! provider needs to find a RoCE v2 GID (`libibverbs/libibverbs.map.in`: IBVERBS_1.11 appears
//! in v32.0). rdma-sys itself accepts rdma-core 28.
//!
//! Only the build needs the headers of 32 or later. The binary links nothing newer than
//! IBVERBS_1.1 (`ffi::LateSymbols`), so a binary built with the `verbs` feature starts
//! against any libibverbs; the verbs provider itself refuses to open on one older than 32,
//! saying so.
#![forbid(unsafe_code)]

/// Oldest rdma-core release the verbs provider builds and runs with.
pub(crate) const MIN_RDMA_CORE: u32 = 32;

/// The rdma-core release of the `libibverbs` pkg-config version, which rdma-core's CMake
/// sets to `1.<ABI minor>.<release>` (`libibverbs/CMakeLists.txt`: `1 1.14.${PACKAGE_VERSION}`
/// gives `1.14.44.0` for rdma-core 44.0, `1.8.28.0` for 28.0). `None` when it is not of that
/// form.
// Used by the build script; in the library only by the tests.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn rdma_core_release(libibverbs_version: &str) -> Option<u32> {
    let mut parts = libibverbs_version.trim().split('.');
    if parts.next()? != "1" {
        return None;
    }
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_come_from_the_third_component() {
        assert_eq!(rdma_core_release("1.14.44.0"), Some(44));
        assert_eq!(rdma_core_release("1.11.32.0\n"), Some(32));
        assert_eq!(rdma_core_release("1.8.28.0"), Some(28));
        // libibverbs before rdma-core (1.2.1) and anything else unparsable.
        assert!(rdma_core_release("1.2.1").is_some_and(|r| r < MIN_RDMA_CORE));
        assert_eq!(rdma_core_release("1.1"), None);
        assert_eq!(rdma_core_release("2.0.44.0"), None);
        assert_eq!(rdma_core_release("garbage"), None);
    }
}
