//! Line plots of benchmark results against message size, for `imb-bench --plot` and
//! `beff --plot`: one line per series (usually one per buffer mode), both axes
//! logarithmic, written as SVG or PNG with `plotters`.
//!
//! ```no_run
//! use pagewire_tools::plot::{LinePlot, Series};
//!
//! let plot = LinePlot {
//!     title: "PingPong, 2 ranks".into(),
//!     x_label: "message size [bytes]".into(),
//!     y_label: "bandwidth [MB/s]".into(),
//!     series: vec![Series::new("copy", vec![(1.0, 1.3), (1024.0, 900.0)])],
//! };
//! plot.write("pingpong.svg".as_ref())?;
//! # Ok::<(), pagewire_tools::Error>(())
//! ```
//!
//! Text: an SVG names its font family (`sans-serif`) and leaves the drawing to the viewer,
//! so it needs no font here. A PNG is rasterised here, so its text needs a TrueType font at
//! run time: `PAGEWIRE_PLOT_FONT` if set, else DejaVu Sans or Liberation Sans from the
//! usual system directories. No font is bundled; without one, writing a PNG fails with
//! [`Error::FontMissing`], which says so and suggests `.svg`. (The title and legend are
//! drawn as plain text elements, not with plotters' caption and legend boxes, because
//! those measure text with the font and would make SVG need one too.)

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::{Error, Result};

/// The variable naming a TrueType font for PNG plots.
pub const FONT_ENV: &str = "PAGEWIRE_PLOT_FONT";

/// Where system TrueType fonts usually are (Debian/Ubuntu, Fedora, Arch).
const FONT_CANDIDATES: [&str; 6] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// The family name under which the font is registered with plotters.
const FAMILY: &str = "sans-serif";

/// Canvas size in pixels.
const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;
/// Narrowest legend column at the right; wider for long labels.
const LEGEND_WIDTH: u32 = 170;

/// The legend column's width for these labels: the line sample (46 px) and about 9 px per
/// character of the 16 px font, so no label is cut at the picture's edge.
fn legend_width(series: &[Series]) -> u32 {
    let longest = series
        .iter()
        .map(|s| s.label.chars().count())
        .max()
        .unwrap_or(0) as u32;
    (46 + 9 * longest + 12).clamp(LEGEND_WIDTH, WIDTH / 2)
}

/// One line of a plot: `(x, y)` points, drawn in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's text (e.g. the buffer mode).
    pub label: String,
    /// The points; those with `x <= 0` or `y <= 0` cannot be shown on log axes and are left
    /// out.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series named `label`.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.into(),
            points,
        }
    }
}

/// A line plot with logarithmic axes.
#[derive(Clone, Debug, PartialEq)]
pub struct LinePlot {
    /// Drawn above the chart.
    pub title: String,
    /// The x axis' description.
    pub x_label: String,
    /// The y axis' description.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

/// The file formats [`LinePlot::write`] produces, chosen by the file name's ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics; needs no font.
    Svg,
    /// A bitmap; needs a TrueType font (see the module documentation).
    Png,
}

impl Format {
    /// The format of `path` by its ending (case-insensitive), or [`Error::PlotFormat`].
    pub fn of(path: &Path) -> Result<Format> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(Error::PlotFormat(path.to_path_buf())),
        }
    }
}

impl LinePlot {
    /// Writes the plot to `path`, as SVG or PNG by its ending.
    pub fn write(&self, path: &Path) -> Result<()> {
        let format = Format::of(path)?;
        let font = register_font();
        if format == Format::Png {
            if let Err(tried) = font {
                return Err(Error::FontMissing {
                    path: path.to_path_buf(),
                    tried: tried.clone(),
                });
            }
        }
        let series: Vec<Series> = self
            .series
            .iter()
            .map(|s| Series {
                label: s.label.clone(),
                points: s
                    .points
                    .iter()
                    .copied()
                    .filter(|&(x, y)| x > 0.0 && y > 0.0 && x.is_finite() && y.is_finite())
                    .collect(),
            })
            .collect();
        let (x_range, y_range) =
            log_ranges(&series).ok_or_else(|| Error::PlotEmpty(path.to_path_buf()))?;
        let draw_error = |e: &dyn std::fmt::Display| Error::PlotDraw {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        match format {
            Format::Svg => {
                let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
                self.draw(&root, &series, x_range, y_range)
                    .map_err(|e| draw_error(&e))?;
                root.present().map_err(|e| draw_error(&e))
            }
            Format::Png => {
                let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
                self.draw(&root, &series, x_range, y_range)
                    .map_err(|e| draw_error(&e))?;
                root.present().map_err(|e| draw_error(&e))
            }
        }
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        series: &[Series],
        x_range: (f64, f64),
        y_range: (f64, f64),
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let legend = legend_width(series);
        let title_style =
            TextStyle::from((FAMILY, 22).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(
            self.title.clone(),
            (((WIDTH - legend) / 2) as i32, 10),
            title_style,
        ))?;
        let (chart_area, legend_area) = root.split_horizontally(WIDTH - legend);
        let chart_area = chart_area.margin(45, 10, 10, 20);
        let mut chart = ChartBuilder::on(&chart_area)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (x_range.0..x_range.1).log_scale(),
                (y_range.0..y_range.1).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&|x| format_size(*x))
            .y_label_formatter(&|y| format_value(*y))
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 16))
            .draw()?;
        let legend_font =
            TextStyle::from((FAMILY, 16).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart.draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?;
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            let y = 70 + 28 * i as i32;
            legend_area.draw(&PathElement::new(
                vec![(8, y), (38, y)],
                color.stroke_width(3),
            ))?;
            legend_area.draw(&Text::new(s.label.clone(), (46, y), legend_font.clone()))?;
        }
        Ok(())
    }
}

/// The ranges of both axes over every series' points, widened a little so that no point
/// sits on the frame; `None` without points.
fn log_ranges(series: &[Series]) -> Option<((f64, f64), (f64, f64))> {
    let points = series.iter().flat_map(|s| s.points.iter().copied());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    let mut any = false;
    for (x, y) in points {
        any = true;
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    any.then(|| ((x0 / 1.5, x1 * 1.5), (y0 / 1.5, y1 * 1.5)))
}

/// `4096` as `4K`, `1048576` as `1M`: powers of two read better that way.
fn format_size(x: f64) -> String {
    let v = x.round() as u64;
    match v {
        0 => "0".into(),
        v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{}G", v >> 30),
        v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}M", v >> 20),
        v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}K", v >> 10),
        v if (x - v as f64).abs() < 1e-9 => v.to_string(),
        _ => format!("{x:.3}"),
    }
}

/// Tick labels of the value axis: no more digits than the magnitude needs.
fn format_value(y: f64) -> String {
    if y >= 100.0 {
        format!("{y:.0}")
    } else if y >= 1.0 {
        format!("{y:.1}")
    } else {
        format!("{y:.3}")
    }
}

/// Registers the first TrueType font found with plotters, once per process. `Err` lists the
/// files looked for.
fn register_font() -> &'static std::result::Result<PathBuf, String> {
    static FONT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let mut tried = Vec::new();
        let from_env = std::env::var_os(FONT_ENV).map(PathBuf::from);
        let candidates = from_env
            .into_iter()
            .chain(FONT_CANDIDATES.iter().map(PathBuf::from));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // plotters keeps fonts for the life of the process; so does this one, loaded
                // at most once.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
                    return Ok(path);
                }
                tried.push(format!("{} (not a usable TrueType font)", path.display()));
            } else {
                tried.push(path.display().to_string());
            }
        }
        Err(tried.join(", "))
    })
}

/// The font PNG plots use, or the files looked for when there is none.
pub fn font() -> std::result::Result<&'static Path, &'static str> {
    match register_font() {
        Ok(p) => Ok(p.as_path()),
        Err(tried) => Err(tried.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LinePlot {
        LinePlot {
            title: "PingPong".into(),
            x_label: "message size [bytes]".into(),
            y_label: "t [usec]".into(),
            series: vec![
                Series::new("copy", vec![(0.0, 1.0), (1.0, 0.8), (1024.0, 1.5)]),
                Series::new("odp", vec![(1.0, 0.9), (1024.0, 2.0), (4096.0, 0.0)]),
            ],
        }
    }

    #[test]
    fn svg_is_written_with_every_series() {
        let path = std::env::temp_dir().join(format!("pw-plot-test-{}.svg", std::process::id()));
        sample().write(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(100)]);
        for text in ["PingPong", "copy", "odp", "message size [bytes]", "<text"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn png_is_written_or_names_the_missing_font() {
        let path = std::env::temp_dir().join(format!("pw-plot-test-{}.png", std::process::id()));
        match (font(), sample().write(&path)) {
            (Ok(_), Ok(())) => {
                let png = std::fs::read(&path).unwrap();
                std::fs::remove_file(&path).unwrap();
                assert_eq!(&png[1..4], b"PNG");
            }
            (Err(_), Err(e @ Error::FontMissing { .. })) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("DejaVuSans.ttf") && msg.contains(".svg"),
                    "{msg}"
                );
            }
            (f, r) => panic!("font {f:?}, write {r:?}"),
        }
    }

    #[test]
    fn formats_and_ranges() {
        assert!(matches!(
            Format::of(Path::new("a.jpg")),
            Err(Error::PlotFormat(_))
        ));
        assert_eq!(Format::of(Path::new("a.SVG")).unwrap(), Format::Svg);
        assert_eq!(format_size(4096.0), "4K");
        assert_eq!(format_size(3.0), "3");
        assert_eq!(format_size(4194304.0), "4M");
        assert!(log_ranges(&[Series::new("x", vec![])]).is_none());
        let empty = LinePlot {
            series: vec![Series::new("x", vec![(0.0, 1.0)])],
            ..sample()
        };
        assert!(matches!(
            empty.write(Path::new("/nonexistent/x.svg")),
            Err(Error::PlotEmpty(_))
        ));
    }
}
