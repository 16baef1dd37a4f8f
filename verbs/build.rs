//! Build script of `pagewire-verbs`. Without the `rdma-core` feature it does nothing.
//!
//! With the feature it asks pkg-config (as rdma-sys's build script does) which rdma-core
//! `libibverbs` is installed and stops the build with one line when it is older than the
//! provider supports (`rdma_core_version.rs`); otherwise the build would fail later with a
//! missing type inside the binding. It also hands the release to the unit tests
//! (`PAGEWIRE_RDMA_CORE_RELEASE`), which check that the symbols looked up at run time are
//! found exactly where that release has them.

#[path = "src/rdma_core_version.rs"]
mod rdma_core_version;

use std::process::{Command, ExitCode};

use rdma_core_version::{rdma_core_release, MIN_RDMA_CORE};

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/rdma_core_version.rs");
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_RDMA_CORE").is_none() {
        return ExitCode::SUCCESS;
    }
    let pkg_config = std::env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let found = Command::new(&pkg_config)
        .args(["--modversion", "libibverbs"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string());
    let Some(version) = found else {
        // rdma-sys's build script, which runs first, already says what is missing.
        println!("cargo:rustc-env=PAGEWIRE_RDMA_CORE_RELEASE=unknown");
        return ExitCode::SUCCESS;
    };
    match rdma_core_release(&version) {
        Some(release) if release >= MIN_RDMA_CORE => {
            println!("cargo:rustc-env=PAGEWIRE_RDMA_CORE_RELEASE={release}");
            ExitCode::SUCCESS
        }
        release => {
            eprintln!(
                "error: the verbs feature needs rdma-core {MIN_RDMA_CORE} or later \
                 (libibverbs-dev with ibv_query_gid_ex); {pkg_config} finds libibverbs {version}{}; \
                 install a newer rdma-core or build without the verbs feature (docs/verbs.md)",
                release.map_or_else(String::new, |r| format!(", rdma-core {r}"))
            );
            ExitCode::FAILURE
        }
    }
}
