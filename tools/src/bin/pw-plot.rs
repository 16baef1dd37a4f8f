//! `pw-plot`: draws the tables the benchmark scripts keep (raw outputs of `pw-msgperf`,
//! `pw-perftest`, ...) as one log-log line plot, so that a study's script can leave its plot
//! beside its table ("its output and plot under docs/results/").
//!
//! A series is `LABEL=FILE:XCOL:YCOL[:COL=VALUE]`: from each line of FILE whose fields
//! (split on white space and `|`) include columns XCOL and YCOL (1-based) as numbers and,
//! when given, whose column COL is VALUE, one point. Or `LABEL=X:Y,X:Y,...` for points
//! written out, such as a seed's figures.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use pagewire_tools::plot::{LinePlot, Series};

/// Draws series read from benchmark tables into one log-log line plot (SVG or PNG).
#[derive(Parser, Debug)]
#[command(name = "pw-plot")]
struct Args {
    /// The plot's title.
    #[arg(long)]
    title: String,
    /// The x axis' label.
    #[arg(long, default_value = "message size [bytes]")]
    x_label: String,
    /// The y axis' label.
    #[arg(long)]
    y_label: String,
    /// Where to write it (`.svg` or `.png`).
    #[arg(long, short)]
    out: PathBuf,
    /// `LABEL=FILE:XCOL:YCOL[:COL=VALUE]` or `LABEL=X:Y,X:Y,...`.
    #[arg(required = true)]
    series: Vec<String>,
}

/// The fields of a table line: split on white space and `|`.
fn fields(line: &str) -> Vec<&str> {
    line.split(|c: char| c.is_whitespace() || c == '|')
        .filter(|f| !f.is_empty())
        .collect()
}

/// A number as tables write it (`1,024` and `12.5` both read).
fn number(field: &str) -> Option<f64> {
    field.replace(',', "").parse().ok()
}

/// The points of one series specification.
fn points(spec: &str) -> Result<Vec<(f64, f64)>> {
    // Inline points: every comma-separated item is X:Y.
    let inline: Option<Vec<(f64, f64)>> = spec
        .split(',')
        .map(|p| {
            let (x, y) = p.split_once(':')?;
            Some((x.trim().parse().ok()?, y.trim().parse().ok()?))
        })
        .collect();
    if let Some(p) = inline {
        return Ok(p);
    }
    let parts: Vec<&str> = spec.split(':').collect();
    let (file, xcol, ycol, filter) = match parts.as_slice() {
        [f, x, y] => (*f, *x, *y, None),
        [f, x, y, filter] => (*f, *x, *y, Some(*filter)),
        _ => bail!("`{spec}`: expected FILE:XCOL:YCOL[:COL=VALUE] or X:Y,X:Y,..."),
    };
    let col = |c: &str| -> Result<usize> {
        c.parse::<usize>()
            .ok()
            .filter(|&c| c >= 1)
            .with_context(|| format!("`{spec}`: column `{c}` is not a number from 1"))
    };
    let (xcol, ycol) = (col(xcol)?, col(ycol)?);
    let filter = match filter {
        None => None,
        Some(f) => {
            let (c, v) = f
                .split_once('=')
                .with_context(|| format!("`{spec}`: expected COL=VALUE, not `{f}`"))?;
            Some((col(c)?, v))
        }
    };
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let f = fields(line);
        if filter.is_some_and(|(c, v)| f.get(c - 1) != Some(&v)) {
            continue;
        }
        if let (Some(x), Some(y)) = (
            f.get(xcol - 1).and_then(|s| number(s)),
            f.get(ycol - 1).and_then(|s| number(s)),
        ) {
            if x > 0.0 && y > 0.0 {
                out.push((x, y));
            }
        }
    }
    if out.is_empty() {
        bail!("`{spec}`: no line of {file} has numbers in columns {xcol} and {ycol}");
    }
    Ok(out)
}

fn main() -> std::process::ExitCode {
    pagewire::environment::exit_code("pw-plot", run())
}

fn run() -> Result<()> {
    let args = Args::parse();
    let mut series = Vec::new();
    for s in &args.series {
        let (label, spec) = s
            .split_once('=')
            .with_context(|| format!("`{s}`: expected LABEL=..."))?;
        series.push(Series::new(label, points(spec)?));
    }
    LinePlot {
        title: args.title,
        x_label: args.x_label,
        y_label: args.y_label,
        series,
    }
    .write(&args.out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_points_and_table_columns_read() {
        assert_eq!(
            points("4096:215,4194304:352").unwrap(),
            vec![(4096.0, 215.0), (4194304.0, 352.0)]
        );
        let dir = std::env::temp_dir().join(format!("pw-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.txt");
        std::fs::write(
            &file,
            "#bytes reps t MB/s\n 4096 500 1.41 2898.17\n| 1048576 | 1,024 | 134.16 |\nnone\n 4096 client 7\n",
        )
        .unwrap();
        let spec = format!("{}:1:3", file.display());
        assert_eq!(
            points(&spec).unwrap(),
            vec![(4096.0, 1.41), (1048576.0, 134.16), (4096.0, 7.0)]
        );
        let spec = format!("{}:2:3:1=4096", file.display());
        assert_eq!(points(&spec).unwrap(), vec![(500.0, 1.41)]);
        let spec = format!("{}:1:3:2=client", file.display());
        assert_eq!(points(&spec).unwrap(), vec![(4096.0, 7.0)]);
        let e = points(&format!("{}:9:10", file.display())).unwrap_err();
        assert!(e.to_string().contains("no line"), "{e}");
        assert!(points("a:b").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
