//! What imb-bench prints and writes beyond IMB's tables: the counters of each table (after
//! the last table, so IMB's tables stay comparable line by line), the side-by-side of the
//! three buffer modes for `--mode all`, and plots.

use std::path::{Path, PathBuf};

use pagewire_tools::mode_all::{ModeRun, ModeVariant, SideBySide};
use pagewire_tools::plot::{LinePlot, Series};

use crate::run::{RunResult, Table};

/// The counters of every table, one `#` line each, headed by the mode.
pub fn counters_section(result: &RunResult) -> String {
    let mut s = format!(
        "\n# pagewire: transport {}, buffer mode {}; counters of the participating processes \
         over the timed repetitions\n",
        result.transport, result.mode
    );
    if result.tables.iter().all(|t| t.summary.is_none()) {
        s += "# (none: the host MPI library moved the data)\n";
        return s;
    }
    s += &format!(
        "# {:<21} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>14}\n",
        "benchmark",
        "#procs",
        "hit%",
        "misses",
        "evictions",
        "fallbacks",
        "invalid.",
        "NPFs",
        "prefetched",
        "pinned peak[B]"
    );
    for t in &result.tables {
        let Some(c) = t.summary else { continue };
        let hit = c
            .hit_rate
            .map_or_else(|| "-".to_string(), |h| format!("{h:.1}"));
        s += &format!(
            "# {:<21} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>14}\n",
            t.benchmark.name(),
            t.processes,
            hit,
            c.misses,
            c.evictions,
            c.fallbacks,
            c.invalidations,
            c.npfs,
            c.prefetch_pages,
            c.pinned_peak
        );
    }
    s
}

/// What a table's side-by-side and plot show: IMB's bandwidth where the table has it, else
/// the average time.
fn metric(t: &Table) -> (&'static str, fn(&crate::run::Row) -> f64) {
    if t.rows.iter().any(|r| r.mbytes_per_sec.is_some()) {
        ("Mbytes/sec", |r| r.mbytes_per_sec.unwrap_or(0.0))
    } else {
        ("t_avg[usec]", |r| r.t_avg_usec)
    }
}

/// The side-by-side of `runs` (one per mode): for every benchmark and process count, each
/// mode's value per size and the ratio of each zero-copy mode to `copy`.
pub fn side_by_side(runs: &[ModeRun<RunResult>]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    let modes: Vec<ModeVariant> = runs.iter().map(|r| r.mode).collect();
    let mut s = format!(
        "\n#----------------------------------------------------------------\n\
         # pagewire: the buffer modes side by side ({} ranks; ratio = mode / {}; the modes\n\
         # through the NIC, `local`: the default path between ranks of one host)\n\
         #----------------------------------------------------------------\n",
        first.result.ranks, modes[0]
    );
    for (k, table) in first.result.tables.iter().enumerate() {
        if table.invalid {
            continue;
        }
        let (what, value) = metric(table);
        let same = |r: &ModeRun<RunResult>| {
            r.result
                .tables
                .get(k)
                .filter(|t| t.benchmark == table.benchmark && t.processes == table.processes)
                .cloned()
        };
        let tables: Vec<Option<Table>> = runs.iter().map(same).collect();
        let rows = table
            .rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let values = tables
                    .iter()
                    .map(|t| t.as_ref().and_then(|t| t.rows.get(i)).map(value))
                    .collect();
                (row.bytes.to_string(), values)
            })
            .collect();
        s += &format!(
            "\n# {} #processes = {} ({what}{})\n",
            table.benchmark.name(),
            table.processes,
            if what == "Mbytes/sec" {
                ": ratios above 1 are faster than copy"
            } else {
                ": ratios below 1 are faster than copy"
            }
        );
        s += &SideBySide {
            key_heading: "#bytes".into(),
            value_heading: what.into(),
            modes: modes.clone(),
            rows,
        }
        .render();
        let summaries: Vec<String> = tables
            .iter()
            .zip(&modes)
            .filter_map(|(t, m)| {
                let c = t.as_ref()?.summary?;
                Some(format!(
                    "{m}: hit {} evictions {} NPFs {} pinned peak {} B",
                    c.hit_rate
                        .map_or_else(|| "-".to_string(), |h| format!("{h:.1}%")),
                    c.evictions,
                    c.npfs,
                    c.pinned_peak
                ))
            })
            .collect();
        if !summaries.is_empty() {
            s += &format!("# counters: {}\n", summaries.join("; "));
        }
    }
    s
}

/// Writes one plot per benchmark table of `runs` (one line per mode): bandwidth where IMB
/// shows it, else the average time, against size. With one table the file is `path`
/// itself; with several, `path` with `-NAME-npN` before the extension. Returns the files.
pub fn plot(
    runs: &[(String, &RunResult)],
    path: &Path,
) -> Result<Vec<PathBuf>, pagewire_tools::Error> {
    let Some((_, first)) = runs.first() else {
        return Ok(Vec::new());
    };
    let tables: Vec<&Table> = first.tables.iter().filter(|t| !t.invalid).collect();
    let mut files = Vec::new();
    for table in &tables {
        let file = if tables.len() == 1 {
            path.to_path_buf()
        } else {
            let stem = path
                .file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into());
            let ext = path
                .extension()
                .map_or_else(String::new, |s| s.to_string_lossy().into());
            path.with_file_name(format!(
                "{stem}-{}-np{}.{ext}",
                table.benchmark.name(),
                table.processes
            ))
        };
        let (what, value) = metric(table);
        let series =
            runs.iter()
                .filter_map(|(label, r)| {
                    let t = r.tables.iter().find(|t| {
                        t.benchmark == table.benchmark && t.processes == table.processes
                    })?;
                    Some(Series::new(
                        label.clone(),
                        t.rows
                            .iter()
                            .map(|row| (row.bytes as f64, value(row)))
                            .collect(),
                    ))
                })
                .collect();
        let off_cache = if first.off_cache.is_some() {
            ", off_cache"
        } else {
            ""
        };
        LinePlot {
            title: format!(
                "imb-bench {}, {} processes{off_cache}",
                table.benchmark.name(),
                table.processes
            ),
            x_label: "message size [bytes]".into(),
            y_label: if what == "Mbytes/sec" {
                "bandwidth [MB/s, 10^6 B/s]".into()
            } else {
                "t_avg [usec]".into()
            },
            series,
        }
        .write(&file)?;
        files.push(file);
    }
    Ok(files)
}
