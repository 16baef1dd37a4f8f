//! What a program sees when it asks for the verbs provider on a machine without an RDMA
//! device: `PAGEWIRE_TRANSPORT=verbs` through [`nic::open`], in a child process that prints
//! the start-up error and exits as a program's `main` would. One line, naming the soft
//! provider. (The provider's own tests are in the `pagewire-verbs` crate.)
#![cfg(feature = "verbs")]

use std::process::Command;

use pagewire_test_support::nic::assert_one_line_naming_the_soft_provider;
use pagewire_test_support::{require, Prerequisite};
use pagewire_transport::boot::SingletonBootstrap;
use pagewire_transport::nic;

/// Set in the child process of [`transport_verbs_stops_at_start_up_with_one_line`].
const CHILD: &str = "PAGEWIRE_VERBS_TEST_CHILD";

#[test]
fn transport_verbs_stops_at_start_up_with_one_line() {
    if std::env::var_os(CHILD).is_some() {
        match nic::open(&SingletonBootstrap::new()) {
            Ok(_) => std::process::exit(0),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
    let out = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "transport_verbs_stops_at_start_up_with_one_line",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("PAGEWIRE_TRANSPORT", "verbs")
        .output()
        .expect("running the test binary as a child");
    let no_device = if out.status.success() {
        Err("an RDMA device is present: the no-device path is not exercised here")
    } else {
        Ok(())
    };
    if require(Prerequisite::NoRdmaDevice, no_device).is_none() {
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "start-up printed more than one line: {stderr}"
    );
    assert_one_line_naming_the_soft_provider(lines[0]);
}
