//! Every `PAGEWIRE_*` environment variable in one table: its name, the kind of value, the
//! default, the values accepted, the layer that reads it and what it does. The layers parse
//! their own variables where they use them (their errors name the variable and what it
//! accepts); this table is what the rest is checked against:
//!
//! - [`check_environment`] reports a `PAGEWIRE_*` variable that is not in the table, with the
//!   nearest known name ("did you mean PAGEWIRE_MODE?"), so a misspelt setting is an error
//!   instead of being ignored;
//! - `cargo run -p xtask -- settings` writes `docs/configuration.md` from it (CI checks that
//!   the page is current);
//! - a unit test below checks that every name the code, the CI scripts and the benchmark
//!   scripts use is in the table, and that every entry is still used.

use crate::error::{Error, Result};

/// The kind of value a setting takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One of a fixed set of words.
    Choice,
    /// A byte count (`65536`, `64K`, `8M`, `1G`; some accept `unlimited`).
    Bytes,
    /// A plain integer.
    Count,
    /// A time (its unit in [`Setting::values`]).
    Duration,
    /// On or off.
    Flag,
    /// Free text: a name, a list, a command.
    Text,
    /// Set by a launcher for the ranks it starts; not for users.
    Internal,
}

impl Kind {
    /// The kind as the configuration page names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Choice => "choice",
            Kind::Bytes => "bytes",
            Kind::Count => "count",
            Kind::Duration => "duration",
            Kind::Flag => "flag",
            Kind::Text => "text",
            Kind::Internal => "set by the launcher",
        }
    }
}

/// The layer that reads a setting (the layers of docs/architecture.md, plus the tools and the tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layer {
    /// `pwrun`, rank discovery, binding, PMI, several hosts, the MPI bootstrap.
    Launcher,
    /// Which NIC, and the soft NIC with its wires.
    Nic,
    /// The verbs provider.
    Verbs,
    /// Eager, rendezvous, the local path, matching, waiting.
    MessageLayer,
    /// The buffer modes (copy, pindown, odp) and the memory monitor.
    BufferMode,
    /// The collective algorithms.
    Collectives,
    /// The rsmpi-shaped API: which transport carries it.
    Facade,
    /// Benchmarks and plots.
    Tools,
    /// Read only by test harnesses.
    Tests,
}

impl Layer {
    /// Every layer, in the order the configuration page lists them.
    pub const ALL: [Layer; 9] = [
        Layer::Facade,
        Layer::Launcher,
        Layer::Nic,
        Layer::Verbs,
        Layer::MessageLayer,
        Layer::BufferMode,
        Layer::Collectives,
        Layer::Tools,
        Layer::Tests,
    ];

    /// The layer as the configuration page names it.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Launcher => "Launching",
            Layer::Nic => "The NIC",
            Layer::Verbs => "The verbs provider",
            Layer::MessageLayer => "The message layer",
            Layer::BufferMode => "Buffer modes",
            Layer::Collectives => "Collectives",
            Layer::Facade => "The API and its transport",
            Layer::Tools => "Benchmarks and tools",
            Layer::Tests => "Tests",
        }
    }
}

/// One `PAGEWIRE_*` variable.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The variable's name.
    pub name: &'static str,
    /// The kind of value.
    pub kind: Kind,
    /// What applies when it is unset.
    pub default: &'static str,
    /// The values accepted.
    pub values: &'static str,
    /// The layer that reads it.
    pub layer: Layer,
    /// What it does, in one sentence.
    pub meaning: &'static str,
}

/// The setting named `name`, if there is one.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// The known setting nearest to `name` by edit distance, if one is near enough to be what
/// was meant (at most a third of the name's letters differ).
pub fn nearest(name: &str) -> Option<&'static str> {
    SETTINGS
        .iter()
        .filter(|s| s.kind != Kind::Internal)
        .map(|s| (strsim::damerau_levenshtein(name, s.name), s.name))
        .filter(|&(d, _)| d <= name.len().saturating_sub("PAGEWIRE_".len()).div_ceil(3))
        .min()
        .map(|(_, n)| n)
}

/// The `PAGEWIRE_*` variables among `vars` that are not settings, each with the nearest
/// known name.
pub fn unknown<'a>(
    vars: impl IntoIterator<Item = &'a str>,
) -> Vec<(&'a str, Option<&'static str>)> {
    vars.into_iter()
        .filter(|v| v.starts_with("PAGEWIRE_") && find(v).is_none())
        .map(|v| (v, nearest(v)))
        .collect()
}

/// Fails with [`Error::UnknownSetting`] for the first `PAGEWIRE_*` variable of this process's
/// environment that is not a setting: a misspelt setting would otherwise be ignored.
pub fn check_environment() -> Result<()> {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    check_names(names.iter().map(String::as_str))
}

/// [`check_environment`] for the variable names `vars` (a launcher's `--env` list).
pub fn check_names<'a>(vars: impl IntoIterator<Item = &'a str>) -> Result<()> {
    match unknown(vars).first() {
        None => Ok(()),
        Some(&(variable, nearest)) => Err(Error::UnknownSetting {
            variable: variable.to_string(),
            nearest,
        }),
    }
}

/// The settings a user sets (not those launchers set or only tests read), each with its
/// value and where it came from: `NAME=VALUE (environment)` or `NAME=DEFAULT (default)`,
/// one per line, as `PAGEWIRE_VERBOSE=1` prints them.
pub fn in_force() -> String {
    SETTINGS
        .iter()
        .filter(|s| s.kind != Kind::Internal && s.layer != Layer::Tests)
        .map(|s| match std::env::var(s.name) {
            Ok(v) => format!("{}={v} (environment)", s.name),
            Err(_) => format!("{}: {} (default)", s.name, s.default),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

include!("settings_table.rs");

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    #[test]
    fn names_are_unique_sorted_and_described() {
        for pair in SETTINGS.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} before {}",
                pair[0].name,
                pair[1].name
            );
        }
        for s in SETTINGS {
            assert!(s.name.starts_with("PAGEWIRE_"), "{}", s.name);
            assert!(!s.meaning.is_empty() && !s.default.is_empty(), "{}", s.name);
            assert!(!s.meaning.contains("seed 0") && !s.meaning.contains("issue "));
        }
    }

    #[test]
    fn the_settings_in_force_say_where_each_came_from() {
        let text = in_force();
        assert!(text.lines().any(|l| l.starts_with("PAGEWIRE_EAGER_LIMIT")));
        assert!(text
            .lines()
            .all(|l| l.ends_with("(environment)") || l.ends_with("(default)")));
        assert!(!text.contains("PAGEWIRE_RANK") && !text.contains("PAGEWIRE_TEST_"));
    }

    #[test]
    fn a_misspelt_setting_is_reported_with_the_name_meant() {
        assert_eq!(nearest("PAGEWIRE_MDOE"), Some("PAGEWIRE_MODE"));
        assert_eq!(nearest("PAGEWIRE_EAGER_LIMT"), Some("PAGEWIRE_EAGER_LIMIT"));
        assert_eq!(nearest("PAGEWIRE_COMPLETELY_DIFFERENT"), None);
        let e = check_names(["PATH", "PAGEWIRE_MODE", "PAGEWIRE_MDOE"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "PAGEWIRE_MDOE is not a pagewire setting; did you mean PAGEWIRE_MODE? \
             (docs/configuration.md lists them all)"
        );
        assert!(check_names(["PAGEWIRE_MODE", "HOME", "PAGEWIRE_LOCAL"]).is_ok());
    }

    /// The workspace's files a setting may be named in: Rust sources, the CI scripts and the
    /// benchmark scripts (not `target`, not recorded results).
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | "results" | ".git") {
                    files(&path, out);
                }
            } else if name.ends_with(".rs")
                || name.ends_with(".sh")
                || name.ends_with(".py")
                || path.parent().and_then(Path::file_name) == Some(".ci".as_ref())
            {
                out.push(path);
            }
        }
    }

    /// Every `PAGEWIRE_[A-Z0-9_]*` word in `text` that is a whole name (not followed by `*`
    /// or `{`, which name a family in prose or build one at run time).
    fn names_in(text: &str, out: &mut BTreeSet<String>) {
        let b = text.as_bytes();
        let mut at = 0;
        while let Some(i) = text[at..].find("PAGEWIRE_") {
            let start = at + i;
            let mut end = start + "PAGEWIRE_".len();
            while end < b.len()
                && (b[end].is_ascii_uppercase() || b[end].is_ascii_digit() || b[end] == b'_')
            {
                end += 1;
            }
            let before_ok =
                start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
            let after = b.get(end).copied();
            let name = &text[start..end];
            if before_ok && !name.ends_with('_') && !matches!(after, Some(b'*' | b'{')) {
                out.insert(name.to_string());
            }
            at = end;
        }
    }

    #[test]
    fn every_name_the_workspace_uses_is_in_the_table_and_every_entry_is_used() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut paths = Vec::new();
        files(root, &mut paths);
        let mut used = BTreeSet::new();
        for p in &paths {
            if p.ends_with("env/settings_table.rs") || p.ends_with("env/settings.rs") {
                continue;
            }
            names_in(&std::fs::read_to_string(p).unwrap_or_default(), &mut used);
        }
        // Rust identifiers that merely start like a setting (test-suite constants), and the
        // misspellings the configuration page and pwrun's tests show.
        for not_a_setting in ["PAGEWIRE_ONLY", "PAGEWIRE_MDOE", "PAGEWIRE_EAGER_LIMT"] {
            used.remove(not_a_setting);
        }
        let missing: Vec<_> = used.iter().filter(|n| find(n).is_none()).collect();
        assert!(missing.is_empty(), "used but not in the table: {missing:?}");
        let unused: Vec<_> = SETTINGS
            .iter()
            .map(|s| s.name)
            .filter(|n| !used.contains(*n))
            .collect();
        assert!(
            unused.is_empty(),
            "in the table but used nowhere: {unused:?}"
        );
    }
}
