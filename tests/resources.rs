//! Resources suite: a job that needs more than the host gives ends with one line
//! that says what is missing and what to do, not with a signal.
//!
//! `/dev/shm` too small: the job runs in a private mount namespace (`unshare -m`) with a
//! 2 MiB tmpfs on `/dev/shm`, which the soft NIC's segments of a 4-rank job do not fit in.

use std::process::{Command, Stdio};

use pagewire::traits::*;
use pagewire_test_support::{build_examples, profile_dir, require, Prerequisite, ROLE};

/// Whether this process may make a private mount namespace and mount a tmpfs in it (root,
/// or a user namespace that allows it); the reason if not.
fn private_mounts_permitted() -> Result<(), String> {
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=2m tmpfs /dev/shm"])
        .output()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`unshare -m` + `mount -t tmpfs` not permitted here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn dev_shm_too_small_is_one_clear_line_not_sigbus() {
    const NAME: &str = "dev_shm_too_small_is_one_clear_line_not_sigbus";
    if std::env::var(ROLE).as_deref() == Ok(NAME) {
        // Enough traffic to touch every slot of every ring: what a sparse, unreserved
        // segment pays for with SIGBUS once /dev/shm is full.
        let universe = pagewire::initialize().expect("first initialisation");
        let world = universe.world();
        let (me, n) = (world.rank(), world.size());
        let message = vec![me as u8; 12 << 10];
        let mut got = vec![0u8; 12 << 10];
        for _round in 0..128 {
            for k in 1..n {
                world.process_at_rank((me + k) % n).send(&message[..]);
                world
                    .process_at_rank((me + n - k) % n)
                    .receive_into(&mut got[..]);
            }
        }
        world.barrier();
        return;
    }
    if require(Prerequisite::PrivateMounts, private_mounts_permitted()).is_none() {
        return;
    }
    build_examples(&[]);
    let pwrun = profile_dir().join("pwrun");
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o size=2m tmpfs /dev/shm && exec "$@""#)
        .arg("sh")
        .arg(&pwrun)
        .args(["-n", "4", "--bind-to", "none", "--timeout", "60", "--"])
        .arg(&exe)
        .args([NAME, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, NAME)
        .env("PAGEWIRE_MODE", "copy")
        .stdin(Stdio::null())
        .output()
        .expect("run pwrun under unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("SIGBUS"),
        "a rank died of SIGBUS:\n{stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(101),
        "{}; stderr:\n{stderr}",
        out.status
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("/dev/shm is too small for this job"))
        .unwrap_or_else(|| panic!("no line says /dev/shm is too small:\n{stderr}"));
    for part in [
        "/dev/shm/pagewire-",
        "MiB",
        "for all 4 ranks",
        "free",
        "run fewer ranks",
    ] {
        assert!(line.contains(part), "{part:?} missing from: {line}");
    }
}
