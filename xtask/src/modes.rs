//! Which code each buffer mode costs: the one table the complexity measurement reads.
//!
//! Lesokhin17 (000_888b45e1079982d9.txt) section 6.3 weighs the buffer strategies by the lines
//! of code each needs beyond the shared protocols. [`FILE_SETS`] lists, per row of the
//! report, the files (or, for files the modes share with the rest of the NIC, the functions)
//! that exist only because of that mode. The shared protocols — the message layer
//! (`transport/src/msg/`), the `BufferMode` trait (`transport/src/buffer_mode/mod.rs`), the
//! NIC boundary and the rest of the soft NIC — are in no row.
//!
//! Rules:
//! - **One owner per file.** A path appears in the table once. Code that two modes use
//!   counts toward the mode whose design needs it, and the entry names the others in
//!   [`Entry::also_used_by`] (shown in the report, not counted twice):
//!   - the memory-change monitor (`memmon/src/`) counts toward `pindown`: a
//!     pin-down cache is only correct with it (Wyckoff05). The soft NIC's ODP invalidation
//!     uses it too, standing in for the kernel's MMU notifier that a real ODP NIC gets for
//!     free;
//!   - the copy mode (`copy.rs`) counts toward `copy`, although `pindown` falls back to it
//!     when a registration cannot be made.
//! - **The NIC's ODP machinery is its own row, `odp-nic`, not part of `odp`.** The present
//!   bitmap, the ODP invalidation watch and the network-page-fault path of the soft NIC are
//!   what an ODP-capable NIC and its kernel driver do in firmware and kernel; the `odp` mode
//!   only registers and prefetches. Lesokhin17's argument is about the middleware's code, so
//!   the mode's total is `odp`; the `odp-nic` row shows what the soft NIC had to emulate, so
//!   a reader can add it if they see it otherwise. Of the soft NIC's shared files only whole
//!   functions that exist for ODP are listed; ODP branches inside shared functions (the
//!   responder's RNR-NACK-on-fault path in `accept_request`, the requester's fault wait in
//!   `transmit`) are not, so the row is a lower bound.
//! - **Tests are counted apart.** `#[cfg(test)]` items are cut out of source files before
//!   they are measured, and test files are listed with [`Role::Test`]; both go to the
//!   report's test column, not to the mode's code (a partial entry's file keeps its tests
//!   with the shared code). Only tests that exercise one mode alone
//!   are listed: the multi-mode suites (`tests/`, `soft/tests/soft_nic.rs`) are in no
//!   row.

use std::fmt;

use serde::Serialize;

/// A row of the report: a buffer mode, or the NIC-side ODP machinery shown apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Row {
    /// Copying through a pinned bounce pool.
    Copy,
    /// The pin-down (registration) cache and the memory-change monitor it needs.
    Pindown,
    /// On-demand paging: the middleware's side.
    Odp,
    /// On-demand paging: what the soft NIC emulates of an ODP NIC (not in `odp`'s total).
    OdpNic,
}

impl Row {
    /// Every row, in report order.
    pub const ALL: [Row; 4] = [Row::Copy, Row::Pindown, Row::Odp, Row::OdpNic];

    /// The row's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Row::Copy => "copy",
            Row::Pindown => "pindown",
            Row::Odp => "odp",
            Row::OdpNic => "odp-nic",
        }
    }
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a file is the mode's code or its tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Code the mode runs (its `#[cfg(test)]` items are cut out and counted as tests).
    Source,
    /// A test file: all of it counts as the mode's tests.
    Test,
}

/// One line of the table: a file, or some functions of a file, and the row it counts in.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Entry {
    /// The row the entry counts in.
    pub row: Row,
    /// Path from the workspace root.
    pub path: &'static str,
    /// Source or test.
    pub role: Role,
    /// `None`: the whole file. `Some(names)`: only the `fn` items of these names (each must
    /// name exactly one function of the file); their lines are the functions' own lines.
    pub functions: Option<&'static [&'static str]>,
    /// Other rows that use this code without counting it.
    pub also_used_by: &'static [Row],
    /// Why the entry is in its row, when that is not obvious.
    pub note: &'static str,
}

const fn file(row: Row, path: &'static str) -> Entry {
    Entry {
        row,
        path,
        role: Role::Source,
        functions: None,
        also_used_by: &[],
        note: "",
    }
}

const fn test_file(row: Row, path: &'static str) -> Entry {
    Entry {
        role: Role::Test,
        ..file(row, path)
    }
}

/// The file sets of the three modes (and the NIC-side ODP row); see the module's rules.
pub const FILE_SETS: &[Entry] = &[
    // copy: the pinned bounce pool and the staging copies.
    Entry {
        also_used_by: &[Row::Pindown],
        note: "pindown's fallback when a registration cannot be made",
        ..file(Row::Copy, "transport/src/buffer_mode/copy.rs")
    },
    // pindown: the cache crate...
    file(Row::Pindown, "pindown/src/lib.rs"),
    file(Row::Pindown, "pindown/src/cache.rs"),
    file(Row::Pindown, "pindown/src/error.rs"),
    file(Row::Pindown, "pindown/src/interval.rs"),
    file(Row::Pindown, "pindown/src/limits.rs"),
    file(Row::Pindown, "pindown/src/mode.rs"),
    file(Row::Pindown, "pindown/src/monitored.rs"),
    file(Row::Pindown, "pindown/src/policy.rs"),
    file(Row::Pindown, "pindown/src/registrar.rs"),
    file(Row::Pindown, "pindown/src/shared.rs"),
    test_file(Row::Pindown, "pindown/src/cache_tests.rs"),
    test_file(Row::Pindown, "pindown/src/fake.rs"),
    test_file(Row::Pindown, "pindown/tests/soft_nic_invalidate.rs"),
    test_file(Row::Pindown, "pindown/tests/soft_nic_vmlck.rs"),
    // ...and the memory-change monitor it needs (Wyckoff05).
    Entry {
        also_used_by: &[Row::OdpNic],
        note: "the monitor; the soft NIC's ODP invalidation uses it as a real NIC uses the MMU notifier",
        ..file(Row::Pindown, "memmon/src/lib.rs")
    },
    Entry {
        also_used_by: &[Row::OdpNic],
        ..file(Row::Pindown, "memmon/src/uffd.rs")
    },
    Entry {
        also_used_by: &[Row::OdpNic],
        ..file(Row::Pindown, "memmon/src/uffd/ring.rs")
    },
    Entry {
        also_used_by: &[Row::OdpNic],
        ..file(Row::Pindown, "memmon/src/uffd/threads.rs")
    },
    Entry {
        also_used_by: &[Row::OdpNic],
        ..file(Row::Pindown, "memmon/src/uffd/subs.rs")
    },
    Entry {
        also_used_by: &[Row::OdpNic],
        ..file(Row::Pindown, "memmon/src/uffd_sys.rs")
    },
    test_file(Row::Pindown, "memmon/tests/memmon.rs"),
    // odp: registration of ODP regions and the prefetch policy.
    file(Row::Odp, "odp/src/lib.rs"),
    // odp-nic: the soft NIC's present bitmap, invalidation watch and fault path.
    file(Row::OdpNic, "soft/src/present.rs"),
    file(Row::OdpNic, "soft/src/odp_watch.rs"),
    Entry {
        functions: Some(&["npf_slot", "odp_monitored", "faults_filed", "file", "outcome"]),
        note: "the responder-fault slots",
        ..file(Row::OdpNic, "soft/src/layout.rs")
    },
    Entry {
        functions: Some(&["serve_faults", "resolve_fault"]),
        note: "the driver's fault handler",
        ..file(Row::OdpNic, "soft/src/driver.rs")
    },
    Entry {
        functions: Some(&["register_implicit_odp", "advise"]),
        note: "implicit ODP, prefetch",
        ..file(Row::OdpNic, "soft/src/lib.rs")
    },
    Entry {
        functions: Some(&["missing_span"]),
        note: "which pages of a DMA are not present",
        ..file(Row::OdpNic, "soft/src/engine/translate.rs")
    },
    Entry {
        functions: Some(&["fault_extent"]),
        note: "the batch to fault in",
        ..file(Row::OdpNic, "soft/src/engine/mod.rs")
    },
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    fn entries(row: Row) -> impl Iterator<Item = &'static Entry> {
        FILE_SETS.iter().filter(move |e| e.row == row)
    }

    fn workspace_root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
    }

    #[test]
    fn every_listed_file_exists() {
        for e in FILE_SETS {
            let p = workspace_root().join(e.path);
            assert!(p.is_file(), "{} (row {}) does not exist", e.path, e.row);
        }
    }

    #[test]
    fn no_file_is_in_two_rows_or_listed_twice() {
        let mut seen: BTreeMap<&str, Row> = BTreeMap::new();
        for e in FILE_SETS {
            if let Some(first) = seen.insert(e.path, e.row) {
                panic!(
                    "{} is listed twice (rows {first} and {}); list it once and name the \
                     other row in also_used_by",
                    e.path, e.row
                );
            }
            assert!(
                !e.also_used_by.contains(&e.row),
                "{}: also_used_by names its own row",
                e.path
            );
        }
    }

    #[test]
    fn tests_are_whole_files_and_every_row_has_code() {
        for e in FILE_SETS {
            if e.role == Role::Test {
                assert!(
                    e.functions.is_none(),
                    "{}: a test entry is a whole file",
                    e.path
                );
            }
        }
        for row in Row::ALL {
            assert!(
                entries(row).any(|e| e.role == Role::Source),
                "row {row} has no source"
            );
        }
    }

    #[test]
    fn the_shared_protocols_are_in_no_row() {
        for shared in [
            "transport/src/buffer_mode/mod.rs",
            "transport/src/msg/",
            "nic/src/lib.rs",
        ] {
            assert!(
                FILE_SETS.iter().all(|e| !e.path.starts_with(shared)),
                "{shared} is shared by every mode"
            );
        }
    }
}
