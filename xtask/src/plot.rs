//! The complexity chart: per metric (SLOC, cyclomatic sum, cognitive sum) a group of bars,
//! one per mode, as SVG.
//!
//! Laid out by hand on plotters' drawing area instead of its chart builder: the builder
//! measures label text with a font backend, and text here must not need font files (the
//! SVG backend writes text as `<text>` elements, which the viewer sets).

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::measure::RowSummary;
use crate::modes::Row;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 440;

/// The bar colour of a row; `odp-nic` pale, as it is not in a mode's total.
fn colour(row: Row) -> RGBColor {
    match row {
        Row::Copy => RGBColor(0x4c, 0x72, 0xb0),
        Row::Pindown => RGBColor(0xdd, 0x84, 0x52),
        Row::Odp => RGBColor(0x55, 0xa8, 0x68),
        Row::OdpNic => RGBColor(0xb8, 0xdd, 0xc0),
    }
}

/// A round axis maximum at or above `v`: 1, 2 or 5 times a power of ten.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * p)
}

/// A panel of the chart: its title and the value it shows of a row.
type Metric = (&'static str, fn(&RowSummary) -> f64);

/// The chart as an SVG document.
pub fn svg(rows: &[RowSummary]) -> Result<String> {
    let metrics: [Metric; 3] = [
        ("SLOC", |r| r.lines.sloc),
        ("cyclomatic complexity (sum)", |r| r.cyclomatic_sum),
        ("cognitive complexity (sum)", |r| r.cognitive_sum),
    ];
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        let err = |e| anyhow!("drawing the chart: {e:?}");
        root.fill(&WHITE).map_err(err)?;
        let text = |size: u32, h: HPos, v: VPos| {
            ("sans-serif", size)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(h, v))
        };
        root.draw(&Text::new(
            "Code each buffer mode needs beyond the shared protocols (Lesokhin17 section 6.3)",
            (WIDTH as i32 / 2, 10),
            text(20, HPos::Center, VPos::Top),
        ))
        .map_err(err)?;
        let (top, bottom) = (70, HEIGHT as i32 - 80);
        let panel = WIDTH as i32 / metrics.len() as i32;
        for (p, (title, value)) in metrics.iter().enumerate() {
            let left = p as i32 * panel + 55;
            let right = (p as i32 + 1) * panel - 15;
            root.draw(&Text::new(
                *title,
                ((left + right) / 2, 42),
                text(17, HPos::Center, VPos::Top),
            ))
            .map_err(err)?;
            let max = nice_max(rows.iter().map(value).fold(0.0, f64::max));
            let y = |v: f64| bottom - ((v / max) * (bottom - top) as f64).round() as i32;
            // Axis, ticks and grid.
            for i in 0..=5 {
                let v = max * i as f64 / 5.0;
                root.draw(&PathElement::new(
                    vec![(left, y(v)), (right, y(v))],
                    RGBColor(0xe0, 0xe0, 0xe0),
                ))
                .map_err(err)?;
                root.draw(&Text::new(
                    format!("{v}"),
                    (left - 6, y(v)),
                    text(13, HPos::Right, VPos::Center),
                ))
                .map_err(err)?;
            }
            root.draw(&PathElement::new(
                vec![(left, top), (left, bottom), (right, bottom)],
                BLACK,
            ))
            .map_err(err)?;
            let slot = (right - left) / rows.len().max(1) as i32;
            for (i, r) in rows.iter().enumerate() {
                let x0 = left + i as i32 * slot + slot / 6;
                let x1 = left + (i as i32 + 1) * slot - slot / 6;
                let v = value(r);
                root.draw(&Rectangle::new(
                    [(x0, y(v)), (x1, bottom)],
                    colour(r.row).filled(),
                ))
                .map_err(err)?;
                root.draw(&Text::new(
                    format!("{v}"),
                    ((x0 + x1) / 2, y(v) - 3),
                    text(13, HPos::Center, VPos::Bottom),
                ))
                .map_err(err)?;
                root.draw(&Text::new(
                    r.row.name(),
                    ((x0 + x1) / 2, bottom + 6),
                    text(15, HPos::Center, VPos::Top),
                ))
                .map_err(err)?;
            }
        }
        for (i, line) in [
            "pindown includes the memory-change monitor (memmon/src); tests are not counted.",
            "odp-nic (pale): the soft NIC's ODP machinery, which a real ODP NIC and its driver provide; not in odp's total.",
        ]
        .iter()
        .enumerate()
        {
            root.draw(&Text::new(
                *line,
                (20, HEIGHT as i32 - 44 + 18 * i as i32),
                text(14, HPos::Left, VPos::Top),
            ))
            .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_maxima_are_round() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(1234.0), 2000.0);
        assert_eq!(nice_max(500.0), 500.0);
    }
}
