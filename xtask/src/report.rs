//! The complexity report as text and as JSON.

use std::fmt::Write;

use serde_json::{json, Value};

use crate::measure::RowSummary;
use crate::modes::{Row, FILE_SETS};

/// The analyser and its version, as the report names it.
pub const ANALYSER: &str = "rust-code-analysis 0.0.25";

/// The table per mode, then each mode's most cognitively complex functions.
pub fn render(rows: &[RowSummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Code each buffer mode needs beyond the shared protocols ({ANALYSER}; tests apart)"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| mode | files | fns | SLOC | PLOC | LLOC | comments | blank | cyclomatic sum | max | cognitive sum | max | cyclomatic/fn | cognitive/fn | test files | test SLOC |"
    );
    let _ = writeln!(out, "|---|{}", "---:|".repeat(15));
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} |",
            r.row,
            r.files,
            r.functions,
            r.lines.sloc,
            r.lines.ploc,
            r.lines.lloc,
            r.lines.cloc,
            r.lines.blank,
            r.cyclomatic_sum,
            r.cyclomatic_max,
            r.cognitive_sum,
            r.cognitive_max,
            r.cyclomatic_mean(),
            r.cognitive_mean(),
            r.test_files,
            r.test_lines.sloc,
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "odp-nic: the soft NIC's ODP machinery (present bitmap, invalidation watch, fault path), \
         which a real ODP NIC and its driver provide; not in odp's total."
    );
    for e in FILE_SETS.iter().filter(|e| !e.also_used_by.is_empty()) {
        let others: Vec<&str> = e.also_used_by.iter().map(|r| r.name()).collect();
        let _ = writeln!(
            out,
            "{}: counted in {}, also used by {}",
            e.path,
            e.row,
            others.join(", ")
        );
    }
    for r in rows {
        let _ = writeln!(out);
        let _ = writeln!(out, "{}: most cognitively complex functions", r.row);
        let _ = writeln!(out, "  cognitive  cyclomatic  SLOC  function");
        for f in &r.top_functions {
            let _ = writeln!(
                out,
                "  {:>9}  {:>10}  {:>4}  {} ({}:{})",
                f.cognitive, f.cyclomatic, f.lines.sloc, f.name, f.file, f.line
            );
        }
    }
    out
}

/// The results, the table of file sets they come from, and the analyser.
pub fn json(rows: &[RowSummary]) -> Value {
    json!({
        "analyser": ANALYSER,
        "rows": rows.iter().map(|r| {
            let mut v = serde_json::to_value(r).expect("a summary serialises");
            v["cyclomatic_mean"] = json!(r.cyclomatic_mean());
            v["cognitive_mean"] = json!(r.cognitive_mean());
            v
        }).collect::<Vec<_>>(),
        "file_sets": FILE_SETS,
        "not_in_mode_totals": [Row::OdpNic],
    })
}
