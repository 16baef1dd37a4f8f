//! The shared harness of pagewire's tests: a dev-dependency of every crate whose tests
//! launch ranks, compare byte patterns, run under `mpirun` or need something the machine
//! may lack. Not published.
//!
//! - **Ranks from the test binary.** A multi-process test launches its own test binary
//!   under the built-in launcher, filtered to the one test (`NAME --exact`), with
//!   [`ROLE`]`=NAME` set; in those processes the test function plays a rank's part
//!   ([`as_rank`]). [`nic`] gives such a rank the soft NIC (pagewire-transport's tests);
//!   `facade` (feature `facade`) gives it a `pagewire::Universe` (the facade's tests).
//! - **Under mpirun** ([`mpirun`]): the same test binary started by a real `mpirun`, for the
//!   `mpi` feature's tests.
//! - **Prerequisites** ([`require`]): a test whose prerequisite is missing (an MPI launcher,
//!   huge pages, io_uring's long-term pins, ...) skips with one line, or fails when
//!   [`REQUIRE`] (`PAGEWIRE_REQUIRE=mpirun,hugepages,...` or `all`) names it, as `.ci/run`
//!   does.
//! - **Two hosts** ([`hosts`]): a pair of namespaced hosts and their stand-in for ssh.
//! - [`pattern`] (deterministic bytes), [`Scratch`] (a directory shared with the ranks),
//!   [`profile_dir`], [`build_pwrun`] and [`build_examples`] (the binaries a test starts).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "facade")]
pub mod facade;
pub mod fuzz;
pub mod hosts;
pub mod mpirun;
pub mod nic;
mod require;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub use require::{require, required, Prerequisite, REQUIRE};

/// Names the test whose rank part this process plays.
pub const ROLE: &str = "PAGEWIRE_TEST_ROLE";
/// A directory the parent gives its ranks for files it checks afterwards.
pub const OUT: &str = "PAGEWIRE_TEST_OUT";
/// A scratch directory shared by the parent and its ranks ([`Scratch`]).
pub const SCRATCH: &str = "PAGEWIRE_TEST_SCRATCH";

/// True when this process is a rank (or helper child) of test `name`: [`ROLE`] names it.
pub fn as_rank(name: &str) -> bool {
    std::env::var(ROLE).as_deref() == Ok(name)
}

/// Deterministic test bytes: the first `len` bytes of stream `seed` (xorshift).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A fresh scratch directory for one test, removed on drop; ranks find it through
/// [`SCRATCH`] ([`Scratch::of_rank`]) when the parent passes it on.
pub struct Scratch(PathBuf);

impl Scratch {
    /// `$TMPDIR/pagewire-KIND-test-NAME-PID`, emptied.
    pub fn new(kind: &str, name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "pagewire-{kind}-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The scratch directory, as seen by a rank ([`SCRATCH`] in its environment).
    pub fn of_rank() -> PathBuf {
        PathBuf::from(std::env::var_os(SCRATCH).expect("scratch dir in the environment"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `target/<profile>`, where the running test binary, the examples and `pwrun` live.
pub fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        // target/<profile>/deps/NAME-HASH
        exe.parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf()
    })
}

/// Builds `pwrun` once per test process (with the cargo that runs the tests, in this test
/// binary's profile and target directory) and returns its path. `cargo test -p CRATE` alone
/// does not build another package's binaries.
pub fn build_pwrun() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| cargo_build(PWRUN, &[]));
    profile_dir().join("pwrun")
}

/// Builds the facade's examples and `pwrun` once per test process, as [`build_pwrun`], with
/// `features` (e.g. `pagewire/mpi`); `pagewire/hwloc` is added when this build's transport
/// has hwloc. `cargo test --test NAME` alone does not build examples.
pub fn build_examples(features: &[&str]) {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut features = features.to_vec();
        if transport_has_hwloc() {
            features.push("pagewire/hwloc");
        }
        cargo_build(
            &[&["-p", "pagewire", "--examples"], PWRUN].concat(),
            &features,
        );
    });
}

/// What `cargo build` selects for `pwrun`.
const PWRUN: &[&str] = &["-p", "pagewire-tools", "--bin", "pwrun"];

/// Whether the linked pagewire-transport was built with its `hwloc` feature (its topology
/// then comes from hwloc).
fn transport_has_hwloc() -> bool {
    pagewire_transport::boot::binding::Topology::detect().is_ok_and(|t| t.source == "hwloc")
}

/// `cargo build --quiet SELECTION --features F...` in this test binary's profile and target
/// directory; panics with the last 40 lines cargo printed if it fails.
fn cargo_build(selection: &[&str], features: &[&str]) {
    let profile = profile_dir();
    let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet"])
        .args(selection)
        .arg("--target-dir")
        .arg(profile.parent().expect("target dir"));
    for f in features {
        cmd.args(["--features", f]);
    }
    if profile.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    // Cargo's messages go into the panic, not to the test's stderr: a failing test's panic
    // is what a CI log keeps (a full disk or a compile error, not only the exit status).
    let out = cmd.output().expect("run cargo build");
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        panic!(
            "building {selection:?} with {features:?} failed: {}; cargo's last words:\n{tail}",
            out.status
        );
    }
}

/// `env`, with `PAGEWIRE_LOCAL=nic` added where it names a buffer mode and no path: the
/// modes govern the NIC path only, so a job that asks for one means its traffic to go
/// through the NIC even between ranks of this host. A job that names no mode runs on the
/// default path (shared memory between ranks of this host); CI runs every suite once more
/// with `PAGEWIRE_LOCAL=nic` set for all.
pub fn with_path_of_mode<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = env.to_vec();
    let names = |k: &str| env.iter().any(|(name, _)| *name == k);
    if names("PAGEWIRE_MODE") && !names("PAGEWIRE_LOCAL") {
        env.push(("PAGEWIRE_LOCAL", "nic"));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_deterministic_and_differ_by_seed() {
        assert_eq!(pattern(7, 64), pattern(7, 64));
        assert_ne!(pattern(7, 64), pattern(8, 64));
        assert_eq!(pattern(7, 100)[..64], pattern(7, 64)[..]);
    }
}
