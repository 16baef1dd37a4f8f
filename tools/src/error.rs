//! The error of the tools library's shared benchmark infrastructure ([`crate::plot`],
//! [`crate::mode_all`]) and of the working-set study ([`crate::workset`]).

use std::path::PathBuf;

/// What went wrong while plotting or while running a benchmark once per buffer mode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The plot file's name does not end in `.svg` or `.png`.
    #[error("{0}: a plot is written as .svg or .png; give a file name with one of these endings")]
    PlotFormat(PathBuf),
    /// A PNG needs a TrueType font for its text and none was found.
    #[error(
        "{path}: a PNG plot needs a TrueType font for its text, and none was found (looked for \
         {tried}); install one (Debian: fonts-dejavu-core, which provides DejaVuSans.ttf), point \
         PAGEWIRE_PLOT_FONT at a .ttf file, or write the plot as .svg, which needs no font"
    )]
    FontMissing {
        /// The PNG that was asked for.
        path: PathBuf,
        /// The font files looked for, comma-separated.
        tried: String,
    },
    /// Nothing to plot: no series has a point with positive coordinates (log axes).
    #[error("{0}: nothing to plot (no point with a positive size and value)")]
    PlotEmpty(PathBuf),
    /// plotters failed while drawing or writing the file.
    #[error("{path}: drawing the plot failed: {message}")]
    PlotDraw {
        /// The plot file.
        path: PathBuf,
        /// plotters' error.
        message: String,
    },
    /// The job of one buffer mode could not be started or failed.
    #[error("the {mode} run failed: {message}")]
    ModeRun {
        /// The buffer mode.
        mode: &'static str,
        /// Why.
        message: String,
    },
    /// `--mode all` cannot relaunch the job under this launcher.
    #[error("{0}")]
    ModeAllUnsupported(String),
    /// Reading or writing a result file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A result file that is not the JSON the benchmark writes.
    #[error("{path}: not a result file of this benchmark: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
    /// The working-set study (`pw-workset`) failed.
    #[error("{0}")]
    Workset(String),
    /// A memory cgroup could not be set up or read.
    #[error("memory cgroup: {0}")]
    Cgroup(String),
    /// There is no cgroup v1 memory controller, or it may not be used here: the study is
    /// skipped.
    #[error("cgroup v1 memory controller not available or not permitted: {0}")]
    CgroupUnavailable(String),
    /// pagewire's configuration or launcher.
    #[error(transparent)]
    Pagewire(#[from] pagewire::Error),
}

/// The tools library's result.
pub type Result<T> = std::result::Result<T, Error>;
