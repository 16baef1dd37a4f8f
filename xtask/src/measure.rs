//! Measuring Rust sources with rust-code-analysis, and adding the results up per row.
//!
//! Definitions (rust-code-analysis's, with two choices of ours):
//! - **Lines**: SLOC (source lines, blank and comment lines included, as the analyser counts
//!   them), PLOC (physical lines of code), LLOC (logical lines: statements), comment lines
//!   (CLOC) and blank lines, of the unit space of a whole file, or of the function spaces of
//!   a partial entry.
//! - **Functions** are `fn` items. The analyser makes every closure a function space of its
//!   own with a base complexity of 1; we fold closures into the `fn` that contains them
//!   instead: the closure's decision points count toward the `fn` (cyclomatic: closure's
//!   value − 1; cognitive: the closure's value, which the analyser already raises for the
//!   closure's nesting), as clippy's `cognitive_complexity` does.
//! - **Cyclomatic** per function: 1 + `if`, `for`, `while`, `loop`, each `match` arm, `?`,
//!   `&&`, `||`. **Cognitive** per function: SonarSource's rules as the analyser implements
//!   them for Rust (`if`, `for`, `while` and `match` +1 and +nesting, `else` +1, boolean
//!   operator sequences, labelled `break`/`continue`).
//! - **Tests**: `#[cfg(test)]` items are cut out of a source file before it is measured (the
//!   lines are removed, so the file's line counts shrink by exactly them) and measured
//!   apart, as test code.

use std::path::Path;

use anyhow::{bail, Context, Result};
use rust_code_analysis::{
    action, get_function_spaces, AstCallback, AstCfg, AstNode, FuncSpace, SpaceKind, LANG,
};
use serde::Serialize;

use crate::modes::{Entry, Role, Row};

/// Line counts, as rust-code-analysis counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Lines {
    /// Source lines of code.
    pub sloc: f64,
    /// Physical lines of code (instructions and comments, no blank lines).
    pub ploc: f64,
    /// Logical lines of code (statements).
    pub lloc: f64,
    /// Comment lines.
    pub cloc: f64,
    /// Blank lines.
    pub blank: f64,
}

impl Lines {
    fn of(space: &FuncSpace) -> Lines {
        let loc = &space.metrics.loc;
        Lines {
            sloc: loc.sloc(),
            ploc: loc.ploc(),
            lloc: loc.lloc(),
            cloc: loc.cloc(),
            blank: loc.blank(),
        }
    }

    fn add(&mut self, other: Lines) {
        self.sloc += other.sloc;
        self.ploc += other.ploc;
        self.lloc += other.lloc;
        self.cloc += other.cloc;
        self.blank += other.blank;
    }
}

/// One `fn` item and its complexity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Function {
    /// `Type::name` for a method, else the function's name.
    pub name: String,
    /// Path of its file from the workspace root.
    pub file: String,
    /// First line, in the file as it is on disk.
    pub line: usize,
    /// Lines of the function (closures inside it included).
    pub lines: Lines,
    /// Cyclomatic complexity, closures folded in.
    pub cyclomatic: f64,
    /// Cognitive complexity, closures folded in.
    pub cognitive: f64,
}

/// What one source measures to.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// Lines of the whole source.
    pub lines: Lines,
    /// Its `fn` items.
    pub functions: Vec<Function>,
}

/// Measures Rust `source` (named `file` in the results; `line_map[i]` is the line on disk of
/// the source's line `i + 1`).
pub fn measure_source(source: &str, file: &str, line_map: &[usize]) -> Result<Measured> {
    let root = get_function_spaces(
        &LANG::Rust,
        source.as_bytes().to_vec(),
        Path::new(file),
        None,
    )
    .with_context(|| format!("rust-code-analysis could not parse {file}"))?;
    let mut functions = Vec::new();
    collect_functions(&root, None, file, line_map, &mut functions);
    Ok(Measured {
        lines: Lines::of(&root),
        functions,
    })
}

fn is_closure(space: &FuncSpace) -> bool {
    space.kind == SpaceKind::Function && space.name.as_deref() == Some("<anonymous>")
}

/// The `fn` items under `space`, each with the closures inside it folded in.
fn collect_functions(
    space: &FuncSpace,
    owner: Option<&str>,
    file: &str,
    line_map: &[usize],
    out: &mut Vec<Function>,
) {
    for child in &space.spaces {
        match child.kind {
            SpaceKind::Function if !is_closure(child) => {
                let name = child.name.as_deref().unwrap_or("?");
                let (mut cyclomatic, mut cognitive) = (
                    child.metrics.cyclomatic.cyclomatic(),
                    child.metrics.cognitive.cognitive(),
                );
                fold_closures(child, &mut cyclomatic, &mut cognitive);
                out.push(Function {
                    name: match owner {
                        Some(owner) => format!("{owner}::{name}"),
                        None => name.to_string(),
                    },
                    file: file.to_string(),
                    line: line_map
                        .get(child.start_line.saturating_sub(1))
                        .copied()
                        .unwrap_or(child.start_line),
                    lines: Lines::of(child),
                    cyclomatic,
                    cognitive,
                });
                // A `fn` inside a `fn` is a function of its own.
                collect_functions(child, Some(name), file, line_map, out);
            }
            SpaceKind::Impl | SpaceKind::Trait => {
                collect_functions(child, child.name.as_deref(), file, line_map, out)
            }
            // A closure outside any `fn` (in a `const`, a `static`): its `fn`s, if any.
            _ => collect_functions(child, owner, file, line_map, out),
        }
    }
}

fn fold_closures(space: &FuncSpace, cyclomatic: &mut f64, cognitive: &mut f64) {
    for child in space.spaces.iter().filter(|c| is_closure(c)) {
        *cyclomatic += child.metrics.cyclomatic.cyclomatic() - 1.0;
        *cognitive += child.metrics.cognitive.cognitive();
        fold_closures(child, cyclomatic, cognitive);
    }
}

/// A source split into what the mode runs and its `#[cfg(test)]` items.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Split {
    /// The source without its test items.
    pub code: String,
    /// Line on disk (1-based) of each line of `code`.
    pub code_lines: Vec<usize>,
    /// The test items, one after the other.
    pub tests: String,
}

/// Cuts every `#[cfg(test)]` item (with its attributes and the lines it spans) out of
/// `source`, using the analyser's syntax tree to find where each item ends.
pub fn split_tests(source: &str, file: &str) -> Result<Split> {
    let ast = action::<AstCallback>(
        &LANG::Rust,
        source.as_bytes().to_vec(),
        Path::new(file),
        None,
        AstCfg {
            id: file.to_string(),
            comment: false,
            span: true,
        },
    );
    let Some(root) = ast.root else {
        bail!("rust-code-analysis could not parse {file}");
    };
    let lines: Vec<&str> = source.lines().collect();
    let mut cut = Vec::new();
    test_item_ranges(&root, &lines, &mut cut);
    let mut in_test = vec![false; lines.len()];
    for (first, last) in cut {
        for flag in &mut in_test[first - 1..last.min(lines.len())] {
            *flag = true;
        }
    }
    let mut split = Split::default();
    for (i, line) in lines.iter().enumerate() {
        let to = if in_test[i] {
            &mut split.tests
        } else {
            split.code_lines.push(i + 1);
            &mut split.code
        };
        to.push_str(line);
        to.push('\n');
    }
    Ok(split)
}

/// The source text a node covers (its span is 1-based rows and byte columns).
fn node_text(node: &AstNode, lines: &[&str]) -> String {
    let Some((r0, c0, r1, c1)) = node.span else {
        return String::new();
    };
    let mut text = String::new();
    for row in r0..=r1 {
        let line = lines.get(row - 1).copied().unwrap_or("");
        let from = if row == r0 { c0 - 1 } else { 0 };
        let to = if row == r1 { c1 - 1 } else { line.len() };
        text.push_str(
            line.get(from.min(line.len())..to.min(line.len()))
                .unwrap_or(""),
        );
    }
    text
}

fn is_cfg_test(node: &AstNode, lines: &[&str]) -> bool {
    node.r#type == "attribute_item"
        && node_text(node, lines)
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            == "#[cfg(test)]"
}

/// Line ranges (1-based, inclusive) of the items under `node` marked `#[cfg(test)]`.
fn test_item_ranges(node: &AstNode, lines: &[&str], out: &mut Vec<(usize, usize)>) {
    let mut i = 0;
    while i < node.children.len() {
        let child = &node.children[i];
        if is_cfg_test(child, lines) {
            // The item is the next sibling that is neither an attribute nor a comment.
            let item = node.children[i + 1..].iter().position(|n| {
                !matches!(
                    n.r#type,
                    "attribute_item" | "line_comment" | "block_comment"
                )
            });
            if let (Some((first, ..)), Some(offset)) = (child.span, item) {
                let item_index = i + 1 + offset;
                if let Some((.., last, _)) = node.children[item_index].span {
                    out.push((first, last));
                }
                i = item_index + 1;
                continue;
            }
        }
        test_item_ranges(child, lines, out);
        i += 1;
    }
}

/// What one table entry measures to.
#[derive(Clone, Debug)]
pub struct EntryMeasure {
    /// The mode's code.
    pub code: Measured,
    /// Its tests (the `#[cfg(test)]` items of a source file, or all of a test file).
    pub tests: Lines,
}

/// Measures one table entry read from under `root`.
pub fn measure_entry(root: &Path, entry: &Entry) -> Result<EntryMeasure> {
    let text = std::fs::read_to_string(root.join(entry.path))
        .with_context(|| format!("reading {}", entry.path))?;
    if entry.role == Role::Test {
        let all = measure_source(&text, entry.path, &[])?;
        return Ok(EntryMeasure {
            code: Measured::default(),
            tests: all.lines,
        });
    }
    let split = split_tests(&text, entry.path)?;
    let mut code = measure_source(&split.code, entry.path, &split.code_lines)?;
    // A partial entry's file belongs to the shared code, and so do its tests.
    let tests = if split.tests.is_empty() || entry.functions.is_some() {
        Lines::default()
    } else {
        measure_source(&split.tests, entry.path, &[])?.lines
    };
    if let Some(names) = entry.functions {
        let mut kept = Vec::new();
        let mut lines = Lines::default();
        for name in names {
            let found: Vec<&Function> = code
                .functions
                .iter()
                .filter(|f| f.name == *name || f.name.ends_with(&format!("::{name}")))
                .collect();
            if found.len() != 1 {
                bail!(
                    "{}: the table names function `{name}`, which matches {} functions",
                    entry.path,
                    found.len()
                );
            }
            kept.push(found[0].clone());
        }
        for f in &kept {
            lines.add(f.lines);
        }
        code = Measured {
            lines,
            functions: kept,
        };
    }
    Ok(EntryMeasure { code, tests })
}

/// One entry's share of a row.
#[derive(Clone, Debug, Serialize)]
pub struct FileShare {
    /// Path from the workspace root.
    pub path: String,
    /// Source or test.
    pub role: Role,
    /// Lines of the mode's code (of a test file: its lines).
    pub lines: Lines,
    /// `fn` items counted.
    pub functions: usize,
    /// Sum of their cyclomatic complexity.
    pub cyclomatic_sum: f64,
    /// Sum of their cognitive complexity.
    pub cognitive_sum: f64,
}

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
pub struct RowSummary {
    /// The row.
    pub row: Row,
    /// Files of the mode's code (a partial entry counts as one).
    pub files: usize,
    /// `fn` items.
    pub functions: usize,
    /// Lines of the mode's code.
    pub lines: Lines,
    /// Sum of the functions' cyclomatic complexity.
    pub cyclomatic_sum: f64,
    /// Largest cyclomatic complexity of a function.
    pub cyclomatic_max: f64,
    /// Sum of the functions' cognitive complexity.
    pub cognitive_sum: f64,
    /// Largest cognitive complexity of a function.
    pub cognitive_max: f64,
    /// Test files of the row.
    pub test_files: usize,
    /// Lines of the row's tests.
    pub test_lines: Lines,
    /// The row's functions, most cognitively complex first.
    pub top_functions: Vec<Function>,
    /// Each entry's share.
    pub per_file: Vec<FileShare>,
}

impl RowSummary {
    /// Mean cyclomatic complexity per function.
    pub fn cyclomatic_mean(&self) -> f64 {
        mean(self.cyclomatic_sum, self.functions)
    }

    /// Mean cognitive complexity per function.
    pub fn cognitive_mean(&self) -> f64 {
        mean(self.cognitive_sum, self.functions)
    }
}

fn mean(sum: f64, n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Adds up the measured entries of one row; keeps its `top` most cognitively complex
/// functions.
pub fn summarise(row: Row, measured: &[(&Entry, EntryMeasure)], top: usize) -> RowSummary {
    let mut s = RowSummary {
        row,
        files: 0,
        functions: 0,
        lines: Lines::default(),
        cyclomatic_sum: 0.0,
        cyclomatic_max: 0.0,
        cognitive_sum: 0.0,
        cognitive_max: 0.0,
        test_files: 0,
        test_lines: Lines::default(),
        top_functions: Vec::new(),
        per_file: Vec::new(),
    };
    let mut all = Vec::new();
    for (entry, m) in measured.iter().filter(|(e, _)| e.row == row) {
        match entry.role {
            Role::Source => s.files += 1,
            Role::Test => s.test_files += 1,
        }
        s.per_file.push(FileShare {
            path: entry.path.to_string(),
            role: entry.role,
            lines: match entry.role {
                Role::Source => m.code.lines,
                Role::Test => m.tests,
            },
            functions: m.code.functions.len(),
            cyclomatic_sum: m.code.functions.iter().fold(0.0, |a, f| a + f.cyclomatic),
            cognitive_sum: m.code.functions.iter().fold(0.0, |a, f| a + f.cognitive),
        });
        s.lines.add(m.code.lines);
        s.test_lines.add(m.tests);
        for f in &m.code.functions {
            s.functions += 1;
            s.cyclomatic_sum += f.cyclomatic;
            s.cyclomatic_max = s.cyclomatic_max.max(f.cyclomatic);
            s.cognitive_sum += f.cognitive;
            s.cognitive_max = s.cognitive_max.max(f.cognitive);
            all.push(f.clone());
        }
    }
    all.sort_by(|a, b| {
        b.cognitive
            .total_cmp(&a.cognitive)
            .then(b.cyclomatic.total_cmp(&a.cyclomatic))
            .then(a.name.cmp(&b.name))
    });
    all.truncate(top);
    s.top_functions = all;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed snippet whose complexities are counted by hand below.
    const SNIPPET: &str = r#"//! A module.

/// Adds one.
fn straight(x: u32) -> u32 {
    x + 1
}

fn branches(x: u32) -> u32 {
    if x > 10 && x < 20 {
        1
    } else if x == 0 {
        2
    } else {
        match x {
            1 => 3,
            _ => 4,
        }
    }
}

struct Counter;

impl Counter {
    fn nested(&self, v: &[u32]) -> u32 {
        let mut n = 0;
        if !v.is_empty() {
            for x in v {
                n += x;
            }
        }
        n
    }

    fn with_closure(&self, v: &[u32]) -> usize {
        v.iter().filter(|x| **x > 3 || **x == 0).count()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn not_counted() {
        if true {
            assert!(true);
        }
    }
}
"#;

    fn by_name<'a>(m: &'a Measured, name: &str) -> &'a Function {
        m.functions.iter().find(|f| f.name == name).unwrap()
    }

    #[test]
    fn test_items_are_cut_out_with_their_lines() {
        let split = split_tests(SNIPPET, "snippet.rs").unwrap();
        assert!(!split.code.contains("mod tests"));
        assert!(split.tests.starts_with("#[cfg(test)]\nmod tests {"));
        assert_eq!(
            split.code.lines().count() + split.tests.lines().count(),
            SNIPPET.lines().count()
        );
        // Lines before the cut keep their numbers.
        assert_eq!(split.code_lines[..4], [1, 2, 3, 4]);
    }

    #[test]
    fn functions_and_cyclomatic_match_a_hand_count() {
        let split = split_tests(SNIPPET, "snippet.rs").unwrap();
        let m = measure_source(&split.code, "snippet.rs", &split.code_lines).unwrap();
        let names: Vec<&str> = m.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "straight",
                "branches",
                "Counter::nested",
                "Counter::with_closure"
            ]
        );
        // 1, no decision.
        assert_eq!(by_name(&m, "straight").cyclomatic, 1.0);
        // 1 + if + && + else-if + two match arms.
        assert_eq!(by_name(&m, "branches").cyclomatic, 6.0);
        // 1 + if + for.
        assert_eq!(by_name(&m, "Counter::nested").cyclomatic, 3.0);
        // 1 + the closure's || (the closure's own base 1 is not added).
        assert_eq!(by_name(&m, "Counter::with_closure").cyclomatic, 2.0);
        // Cognitive: nothing; if +1 then for nested once +2.
        assert_eq!(by_name(&m, "straight").cognitive, 0.0);
        assert_eq!(by_name(&m, "Counter::nested").cognitive, 3.0);
        // The line on disk, not in the cut source.
        assert_eq!(by_name(&m, "straight").line, 4);
        assert_eq!(by_name(&m, "Counter::nested").line, 24);
    }

    #[test]
    fn rows_add_up_functions_and_keep_the_most_complex_first() {
        let split = split_tests(SNIPPET, "snippet.rs").unwrap();
        let code = measure_source(&split.code, "snippet.rs", &split.code_lines).unwrap();
        let tests = measure_source(&split.tests, "snippet.rs", &[])
            .unwrap()
            .lines;
        let entry = Entry {
            row: Row::Odp,
            path: "snippet.rs",
            role: Role::Source,
            functions: None,
            also_used_by: &[],
            note: "",
        };
        let s = summarise(Row::Odp, &[(&entry, EntryMeasure { code, tests })], 2);
        assert_eq!(s.files, 1);
        assert_eq!(s.functions, 4);
        assert_eq!(s.cyclomatic_sum, 1.0 + 6.0 + 3.0 + 2.0);
        assert_eq!(s.cyclomatic_max, 6.0);
        assert_eq!(s.cyclomatic_mean(), 3.0);
        assert_eq!(s.top_functions.len(), 2);
        assert!(s.top_functions[0].cognitive >= s.top_functions[1].cognitive);
        // The test module's 9 lines are tests, not code.
        assert_eq!(s.test_lines.sloc, 9.0);
        assert_eq!(
            s.lines.sloc,
            (SNIPPET.lines().count() - 9) as f64,
            "code lines: the snippet less its test module"
        );
    }
}
