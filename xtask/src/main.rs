//! pagewire's developer tasks, run as `cargo run -p xtask -- TASK`.
//!
//! `complexity`: the code each buffer mode costs beyond the shared protocols — lines and
//! cyclomatic/cognitive complexity per function, measured with rust-code-analysis — as a
//! table, JSON and an SVG bar chart (Lesokhin17, section 6.3). The
//! files each mode counts are in [`modes::FILE_SETS`].
//!
//! `settings`: writes `docs/configuration.md` from the table of `PAGEWIRE_*` settings
//! (`--check`: fails if the committed page differs).
//!
//! `crates`: writes the crate graph into `docs/architecture.md`, from `cargo metadata`
//! (`--check`: fails if the committed table differs).

#![forbid(unsafe_code)]

mod crates;
mod measure;
mod modes;
mod plot;
mod report;
mod settings;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use crate::measure::{measure_entry, summarise, RowSummary};
use crate::modes::{Row, FILE_SETS};

#[derive(Parser)]
#[command(about = "pagewire's developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Lines of code and cyclomatic/cognitive complexity of the code each buffer mode needs
    /// beyond the shared protocols (Lesokhin17 section 6.3).
    Complexity {
        /// Also write the results as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Also draw a grouped bar chart (SLOC, cyclomatic and cognitive sums per mode) to
        /// this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// Functions listed per mode, most cognitively complex first.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// The workspace to measure (default: the one this xtask belongs to).
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
    },
    /// Writes docs/configuration.md from the table of PAGEWIRE_* settings.
    Settings {
        /// Only check that the committed page is current (exit status 1 if not).
        #[arg(long)]
        check: bool,
    },
    /// Writes the crate graph (cargo metadata) into docs/architecture.md.
    Crates {
        /// Only check that the committed table is current (exit status 1 if not).
        #[arg(long)]
        check: bool,
    },
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Measures every entry of the table under `root` and adds them up per row.
fn measure_rows(root: &Path, top: usize) -> Result<Vec<RowSummary>> {
    let mut measured = Vec::new();
    for entry in FILE_SETS {
        measured.push((entry, measure_entry(root, entry)?));
    }
    Ok(Row::ALL
        .iter()
        .map(|&row| summarise(row, &measured, top))
        .collect())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Complexity {
            json,
            plot,
            top,
            root,
        } => {
            let root = root.unwrap_or_else(workspace_root);
            let rows = measure_rows(&root, top)?;
            print!("{}", report::render(&rows));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&report::json(&rows))?;
                std::fs::write(&path, text + "\n")
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            if let Some(path) = plot {
                std::fs::write(&path, plot::svg(&rows)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
        Task::Crates { check } => {
            let root = workspace_root();
            let path = root.join("docs/architecture.md");
            let committed = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let page = crates::splice(&committed, &crates::table(&root)?)?;
            if check {
                anyhow::ensure!(
                    committed == page,
                    "the crate graph in {} is out of date: run `cargo run -p xtask -- crates`",
                    path.display()
                );
            } else {
                std::fs::write(&path, page)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
        Task::Settings { check } => {
            let path = workspace_root().join("docs/configuration.md");
            let page = settings::page();
            if check {
                let committed = std::fs::read_to_string(&path).unwrap_or_default();
                anyhow::ensure!(
                    committed == page,
                    "{} is out of date: run `cargo run -p xtask -- settings`",
                    path.display()
                );
            } else {
                std::fs::write(&path, page)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_tree_measures_to_nonempty_rows() {
        let rows = measure_rows(&workspace_root(), 3).unwrap();
        assert_eq!(rows.len(), Row::ALL.len());
        for r in &rows {
            assert!(r.functions > 0, "{}: no functions", r.row);
            assert!(r.lines.sloc > 0.0, "{}: no lines", r.row);
            assert!(r.cyclomatic_sum >= r.functions as f64, "{}", r.row);
            assert!(r.top_functions.len() <= 3);
        }
        let pindown = rows.iter().find(|r| r.row == Row::Pindown).unwrap();
        let odp = rows.iter().find(|r| r.row == Row::Odp).unwrap();
        assert!(pindown.test_lines.sloc > 0.0);
        // Lesokhin17 section 6.3's point, on this tree: the pin-down cache costs more code.
        assert!(pindown.lines.sloc > odp.lines.sloc);
    }
}
