//! The facade's multi-process suites under a real `mpirun` (feature `mpi`): the collective
//! suite of `tests/collectives.rs` and point-to-point and communicator tests of
//! `tests/point_to_point.rs` and `tests/communicators.rs`, each run
//!
//! - on the mpi transport (`PAGEWIRE_TRANSPORT=mpi`: every call goes to the host MPI
//!   library), and
//! - on pagewire's transport bootstrapped by MPI, in the copy, pindown and odp modes,
//!
//! on the rank counts of `PAGEWIRE_MPI_NP` (CI: 2, 3 and 4).
//!
//! The suites are compiled into this binary as modules (`#[path]`), not copied: one source
//! of truth. Their rank side is chosen by `PAGEWIRE_TEST_ROLE`, which `pwrun` sets in their
//! own binaries and `mpirun` passes on here. Their `#[test]`s would also launch themselves
//! through `pwrun` when this binary runs unfiltered: CI runs it with
//! `-- --skip collectives:: --skip point_to_point:: --skip communicators::`, leaving those to
//! their own binaries.
//!
//! Only transport-neutral tests run on the mpi transport: those that read pagewire's
//! counters, expect `Error::Truncated` (MPI does not report a truncated message's length)
//! or check pagewire's mismatch detection are pagewire's own.
#![cfg(feature = "mpi")]
// Each suite declares `mod util;`, so this binary holds three copies of tests/util/mod.rs.
#![allow(clippy::duplicate_mod)]

#[path = "collectives.rs"]
mod collectives;
#[path = "communicators.rs"]
mod communicators;
mod mpirun_harness;
#[path = "point_to_point.rs"]
mod point_to_point;

use mpirun_harness::expect_pass;

/// The buffer modes of pagewire's transport.
const MODES: [&str; 3] = ["copy", "pindown", "odp"];

/// The collective suite's default-threshold job: every collective against sequential
/// references, sizes to several MiB at up to 4 ranks, every operation on every type, user
/// operations.
const COLLECTIVE_SUITE: &str = "collectives_match_sequential_references_on_1_to_8_ranks";

/// Point-to-point and communicator tests whose checks hold on any MPI-like transport:
/// (module, test, rank counts it runs on; `None`: all).
const NEUTRAL: &[(&str, &str, Option<&[usize]>)] = &[
    ("point_to_point", "all_pairs_on_3_ranks", None),
    (
        "point_to_point",
        "wildcard_receives_keep_each_senders_order",
        None,
    ),
    ("point_to_point", "messages_to_oneself", None),
    (
        "point_to_point",
        "dropping_an_unfinished_request_cancels_or_completes_it",
        Some(&[2]),
    ),
    ("communicators", "split_even_odd_on_1_to_6_ranks", None),
    (
        "communicators",
        "split_by_key_orders_ranks_on_1_to_6_ranks",
        None,
    ),
    (
        "communicators",
        "undefined_color_gives_none_on_1_to_5_ranks",
        None,
    ),
    (
        "communicators",
        "a_duplicate_never_matches_its_parents_messages_on_1_to_5_ranks",
        None,
    ),
    (
        "communicators",
        "matched_probe_takes_the_message_out_of_matching_on_3_and_4_ranks",
        Some(&[3, 4]),
    ),
];

/// Tests that check pagewire's own behaviour (counters, `Error::Truncated`), run on its
/// transport only.
const PAGEWIRE_ONLY: &[(&str, &str, Option<&[usize]>)] = &[
    (
        "point_to_point",
        "synchronous_send_completes_only_once_matched",
        Some(&[2]),
    ),
    (
        "point_to_point",
        "probe_reports_and_truncation_never_overruns",
        Some(&[2]),
    ),
    (
        "communicators",
        "a_matched_receive_into_a_short_buffer_is_truncated_without_overrun",
        Some(&[2, 3]),
    ),
];

fn collective_suite(label: &str, env: &[(&str, &str)]) {
    let mut env = env.to_vec();
    env.extend([
        ("PAGEWIRE_TEST_ROLE", COLLECTIVE_SUITE),
        ("COLLTEST_SIZES", "full"),
        ("COLLTEST_OPERATIONS", "1"),
    ]);
    expect_pass(
        label,
        &format!("collectives::{COLLECTIVE_SUITE}"),
        &env,
        None,
    );
}

fn p2p_tests(label: &str, tests: &[(&str, &str, Option<&[usize]>)], env: &[(&str, &str)]) {
    for &(module, test, only) in tests {
        let mut env = env.to_vec();
        env.push(("PAGEWIRE_TEST_ROLE", test));
        expect_pass(label, &format!("{module}::{test}"), &env, only);
    }
}

#[test]
fn mpirun_collective_suite_on_the_mpi_transport() {
    collective_suite("mpi transport", &[("PAGEWIRE_TRANSPORT", "mpi")]);
}

#[test]
fn mpirun_collective_suite_on_pagewire_bootstrapped_by_mpi() {
    for mode in MODES {
        collective_suite(&format!("pagewire, {mode}"), &[("PAGEWIRE_MODE", mode)]);
    }
}

#[test]
fn mpirun_point_to_point_on_the_mpi_transport() {
    p2p_tests("mpi transport", NEUTRAL, &[("PAGEWIRE_TRANSPORT", "mpi")]);
}

#[test]
fn mpirun_point_to_point_on_pagewire_bootstrapped_by_mpi() {
    for mode in MODES {
        let label = format!("pagewire, {mode}");
        p2p_tests(&label, NEUTRAL, &[("PAGEWIRE_MODE", mode)]);
        p2p_tests(&label, PAGEWIRE_ONLY, &[("PAGEWIRE_MODE", mode)]);
    }
}
