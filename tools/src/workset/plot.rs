//! The study's figure, laid out as Lesokhin17's Fig. 7: hits per second over time (a) per job
//! with on-demand paging, (b) per job with pinning, (c) both jobs combined, per mode. An
//! SVG drawn with plotters on linear axes (the shared [`crate::plot`] draws log-log plots
//! against message size).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::driver::{ModeRun, StudyMode};
use super::report::Window;
use super::schedule::JobKind;
use crate::error::{Error, Result};

const WIDTH: u32 = 960;
const PANEL_HEIGHT: u32 = 300;
const FAMILY: &str = "sans-serif";

/// One panel's lines: a label and `(seconds, hits/s)` points.
type Lines = Vec<(String, Vec<(f64, f64)>)>;

/// `(time, hits/s)` of `job`'s windows (at each window's middle), or of both jobs summed
/// (`None`) where both have the window.
pub fn hits_series(windows: &[Window], window_secs: f64, job: Option<JobKind>) -> Vec<(f64, f64)> {
    let last = windows.iter().map(|w| w.t).max();
    let Some(last) = last else {
        return Vec::new();
    };
    (0..=last)
        .filter_map(|t| {
            let of = |j: JobKind| {
                windows
                    .iter()
                    .find(|w| w.job == j && w.t == t)
                    .map(|w| w.hits)
            };
            let hits = match job {
                Some(j) => of(j)?,
                None => of(JobKind::Growing)? + of(JobKind::Shrinking)?,
            };
            Some(((t as f64 + 0.5) * window_secs, hits as f64 / window_secs))
        })
        .collect()
}

/// Writes the three panels to `path` (SVG). `switch_at` marks the switch on each panel.
pub fn write(
    path: &Path,
    runs: &[ModeRun],
    window_secs: f64,
    switch_at: f64,
    title: &str,
) -> Result<()> {
    if path.extension().and_then(|e| e.to_str()) != Some("svg") {
        return Err(Error::PlotFormat(path.to_path_buf()));
    }
    let run_of = |m: StudyMode| runs.iter().find(|r| r.mode == m);
    let per_job = |m: StudyMode| -> Lines {
        run_of(m).map_or_else(Vec::new, |r| {
            let w = r.windows();
            JobKind::BOTH
                .iter()
                .map(|&j| (j.name().to_string(), hits_series(&w, window_secs, Some(j))))
                .collect()
        })
    };
    let combined: Lines = runs
        .iter()
        .map(|r| {
            let label = match r.mode {
                StudyMode::Odp => "odp (unpinned)",
                StudyMode::Pindown => "pindown (pinned)",
            };
            (
                label.to_string(),
                hits_series(&r.windows(), window_secs, None),
            )
        })
        .collect();
    let panels: [(String, Lines); 3] = [
        (
            "(a) on-demand paging (odp): per job".into(),
            per_job(StudyMode::Odp),
        ),
        (
            "(b) pinning (pindown): per job".into(),
            per_job(StudyMode::Pindown),
        ),
        ("(c) both jobs combined".into(), combined),
    ];
    let x_max = panels
        .iter()
        .flat_map(|(_, l)| l.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)))
        .fold(0.0f64, f64::max)
        + window_secs / 2.0;
    let y_max = panels
        .iter()
        .flat_map(|(_, l)| l.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)))
        .fold(0.0f64, f64::max);
    if x_max <= 0.0 || y_max <= 0.0 {
        return Err(Error::PlotEmpty(path.to_path_buf()));
    }
    let draw_error = |e: &dyn std::fmt::Display| Error::PlotDraw {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let root = SVGBackend::new(path, (WIDTH, 40 + 3 * PANEL_HEIGHT)).into_drawing_area();
    draw(&root, title, &panels, x_max, y_max * 1.1, switch_at).map_err(|e| draw_error(&e))?;
    root.present().map_err(|e| draw_error(&e))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    panels: &[(String, Lines); 3],
    x_max: f64,
    y_max: f64,
    switch_at: f64,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let title_style =
        TextStyle::from((FAMILY, 20).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(
        title.to_string(),
        ((WIDTH / 2) as i32, 8),
        title_style,
    ))?;
    let (_, body) = root.split_vertically(40);
    let areas = body.split_evenly((3, 1));
    let legend_font =
        TextStyle::from((FAMILY, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (area, (name, lines)) in areas.iter().zip(panels) {
        let (chart_area, legend_area) = area.split_horizontally(WIDTH - 190);
        let mut chart = ChartBuilder::on(&chart_area.margin(24, 5, 5, 10))
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("time [s]")
            .y_desc("hits/s")
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 14))
            .draw()?;
        chart_area.draw(&Text::new(
            name.clone(),
            (90, 4),
            TextStyle::from((FAMILY, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Top)),
        ))?;
        chart.draw_series(LineSeries::new(
            [(switch_at, 0.0), (switch_at, y_max)],
            BLACK.mix(0.4).stroke_width(1),
        ))?;
        for (i, (label, points)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart.draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?;
            let y = 60 + 24 * i as i32;
            legend_area.draw(&PathElement::new(
                vec![(8, y), (34, y)],
                color.stroke_width(3),
            ))?;
            legend_area.draw(&Text::new(label.clone(), (40, y), legend_font.clone()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_per_job_or_summed_where_both_have_the_window() {
        let w = |job, t, hits| Window {
            job,
            t,
            hits,
            misses: 0,
        };
        let ws = vec![
            w(JobKind::Growing, 0, 10),
            w(JobKind::Shrinking, 0, 30),
            w(JobKind::Growing, 1, 20),
        ];
        assert_eq!(
            hits_series(&ws, 0.5, Some(JobKind::Growing)),
            vec![(0.25, 20.0), (0.75, 40.0)]
        );
        assert_eq!(hits_series(&ws, 0.5, None), vec![(0.25, 80.0)]);
        assert!(hits_series(&[], 1.0, None).is_empty());
    }
}
