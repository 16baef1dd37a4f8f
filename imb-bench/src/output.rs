//! IMB-MPI1's and IMB-RMA's output, line for line: the header block, each benchmark's
//! table header (`# Benchmarking NAME`, `# #processes = N`, dashed lines of 13 characters
//! per column, IMB-RMA's `MODE:` block) and rows (13 characters per column, times with 2
//! decimals), and the closing line.

use crate::bench::{Aggregation, Benchmark, Kind};

/// IMB's column width (`ow_format`).
pub const COLUMN: usize = 13;

/// The columns of a table (IMB's `OUT_*` formats of MPI-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `#bytes #repetitions t[usec] Mbytes/sec` (PingPong, PingPing).
    TimeAndBandwidth,
    /// `#bytes #repetitions t_min t_max t_avg Mbytes/sec` (Sendrecv, Exchange).
    TimeRangeAndBandwidth,
    /// `#bytes #repetitions t_min t_max t_avg` (collectives).
    TimeRange,
    /// `#repetitions t_min t_max t_avg` (Barrier).
    Sync,
    /// `#bytes #repetitions t_pure t_ovrl` (IMB-RMA's Truly_passive_put).
    PureAndOverlap,
}

impl Layout {
    /// The layout of `b`'s table.
    pub fn of(b: Benchmark) -> Layout {
        match b.kind() {
            Kind::SingleTransfer | Kind::RmaPair | Kind::RmaOneToAll => Layout::TimeAndBandwidth,
            Kind::ParallelTransfer => Layout::TimeRangeAndBandwidth,
            Kind::Collective | Kind::RmaAllToAll => Layout::TimeRange,
            Kind::Sync => Layout::Sync,
            Kind::RmaOverlap => Layout::PureAndOverlap,
        }
    }

    /// The column headings.
    pub fn headings(self) -> &'static [&'static str] {
        match self {
            Layout::TimeAndBandwidth => &["#bytes", "#repetitions", "t[usec]", "Mbytes/sec"],
            Layout::TimeRangeAndBandwidth => &[
                "#bytes",
                "#repetitions",
                "t_min[usec]",
                "t_max[usec]",
                "t_avg[usec]",
                "Mbytes/sec",
            ],
            Layout::TimeRange => &[
                "#bytes",
                "#repetitions",
                "t_min[usec]",
                "t_max[usec]",
                "t_avg[usec]",
            ],
            Layout::Sync => &["#repetitions", "t_min[usec]", "t_max[usec]", "t_avg[usec]"],
            Layout::PureAndOverlap => &["#bytes", "#repetitions", "t_pure[usec]", "t_ovrl[usec]"],
        }
    }
}

/// A dashed line as wide as `columns` columns: `#` and `13 * columns - 1` dashes.
pub fn dashes(columns: usize) -> String {
    format!("#{}", "-".repeat(COLUMN * columns - 1))
}

/// One row's numbers, in microseconds (already scaled) and MB/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowValues {
    /// Message size.
    pub bytes: usize,
    /// Timed repetitions.
    pub repetitions: usize,
    /// Fastest participating process.
    pub t_min: f64,
    /// Slowest participating process.
    pub t_max: f64,
    /// Average over the participating processes.
    pub t_avg: f64,
    /// `size * factor / t_max` in 10^6 bytes per second (0 where `t_max` is 0).
    pub mbytes_per_sec: f64,
    /// Truly_passive_put's `t_ovrl` (the slowest process's; `t_max` is its `t_pure`).
    pub t_overlap: f64,
}

/// The table header: a blank line, dashes, `# Benchmarking NAME `, `# #processes = N `,
/// the idle processes if any, dashes, and the headings (no trailing newline).
pub fn table_header(b: Benchmark, processes: usize, world: usize) -> String {
    table_header_in_mode(b, processes, world, None)
}

/// [`table_header`] of an IMB-RMA table, with its `MODE:` block before the headings when it
/// has a mode.
pub fn table_header_in_mode(
    b: Benchmark,
    processes: usize,
    world: usize,
    mode: Option<Aggregation>,
) -> String {
    let layout = Layout::of(b);
    let line = dashes(layout.headings().len());
    let mut s = format!(
        "\n{line}\n# Benchmarking {} \n# #processes = {processes} \n",
        b.name()
    );
    match world.saturating_sub(processes) {
        0 => {}
        1 => s += "# ( 1 additional process waiting in MPI_Barrier)\n",
        n => s += &format!("# ( {n} additional processes waiting in MPI_Barrier)\n"),
    }
    s += &line;
    s.push('\n');
    if let Some(m) = mode {
        s += &format!("#\n#    MODE: {} \n#\n", m.name());
    }
    for h in layout.headings() {
        s += &format!("{h:>COLUMN$}");
    }
    s
}

/// One row of `layout`'s table.
pub fn row(layout: Layout, v: &RowValues) -> String {
    let ints = |s: &mut String, n: usize| *s += &format!("{n:>COLUMN$}");
    let float = |s: &mut String, x: f64| *s += &format!("{x:>COLUMN$.2}");
    let mut s = String::new();
    match layout {
        Layout::TimeAndBandwidth => {
            ints(&mut s, v.bytes);
            ints(&mut s, v.repetitions);
            float(&mut s, v.t_max);
            float(&mut s, v.mbytes_per_sec);
        }
        Layout::TimeRangeAndBandwidth | Layout::TimeRange => {
            ints(&mut s, v.bytes);
            ints(&mut s, v.repetitions);
            float(&mut s, v.t_min);
            float(&mut s, v.t_max);
            float(&mut s, v.t_avg);
            if layout == Layout::TimeRangeAndBandwidth {
                float(&mut s, v.mbytes_per_sec);
            }
        }
        Layout::Sync => {
            ints(&mut s, v.repetitions);
            float(&mut s, v.t_min);
            float(&mut s, v.t_max);
            float(&mut s, v.t_avg);
        }
        Layout::PureAndOverlap => {
            ints(&mut s, v.bytes);
            ints(&mut s, v.repetitions);
            float(&mut s, v.t_max);
            float(&mut s, v.t_overlap);
        }
    }
    s
}

/// IMB's line for a benchmark that cannot run on this many processes.
pub fn invalid(b: Benchmark, processes: usize) -> String {
    format!(
        "\n# !! Benchmark {} invalid for {processes} processes !! \n",
        b.name()
    )
}

/// What the header block says about the run.
#[derive(Clone, Debug, PartialEq)]
pub struct HeaderInfo {
    /// `# Date`, as C's `asctime` prints it.
    pub date: String,
    /// `uname -m`.
    pub machine: String,
    /// `uname -s`.
    pub system: String,
    /// `uname -r`.
    pub release: String,
    /// `uname -v`.
    pub version: String,
    /// In place of IMB's MPI version: pagewire's version, transport and buffer mode.
    pub mpi_version: String,
    /// The command line as given.
    pub calling_sequence: Vec<String>,
    /// The largest message size.
    pub max_size: usize,
    /// The benchmarks, in the order they run.
    pub benchmarks: Vec<Benchmark>,
}

impl HeaderInfo {
    /// This machine's `uname` fields and the current time (UTC).
    pub fn of_this_machine(
        mpi_version: String,
        calling_sequence: Vec<String>,
        max_size: usize,
        benchmarks: Vec<Benchmark>,
    ) -> HeaderInfo {
        let read = |f: &str| {
            std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        HeaderInfo {
            date: pagewire_tools::timestamp::ctime_now(),
            machine: std::env::consts::ARCH.to_string(),
            system: read("ostype"),
            release: read("osrelease"),
            version: read("version"),
            mpi_version,
            calling_sequence,
            max_size,
            benchmarks,
        }
    }

    /// The header block, from the first dashed line to the blank line after the list of
    /// benchmarks (IMB-MPI1 2021's lines, trailing spaces included).
    pub fn render(&self, title: &str) -> String {
        let line = dashes(5);
        let mut s = format!("{line}\n#    {title}\n{line}\n");
        s += &format!("# Date                  : {}\n", self.date);
        s += &format!("# Machine               : {}\n", self.machine);
        s += &format!("# System                : {}\n", self.system);
        s += &format!("# Release               : {}\n", self.release);
        s += &format!("# Version               : {}\n", self.version);
        s += &format!("# MPI Version           : {}\n", self.mpi_version);
        s += "# MPI Thread Environment: \n\n\n";
        s += "# Calling sequence was: \n\n";
        s += &format!("# {} \n\n", self.calling_sequence.join(" "));
        s += "# Minimum message length in bytes:   0\n";
        s += &format!("# Maximum message length in bytes:   {}\n", self.max_size);
        s += "#\n";
        s += "# MPI_Datatype                   :   MPI_BYTE \n";
        s += "# MPI_Datatype for reductions    :   MPI_FLOAT \n";
        s += "# MPI_Op                         :   MPI_SUM  \n";
        s += "# \n# \n\n";
        s += "# List of Benchmarks to run:\n\n";
        for b in &self.benchmarks {
            s += &format!("# {}\n", b.name());
            // IMB-RMA's notes under two of its names.
            match b {
                Benchmark::CompareAndSwap => s += "#     Uses MPI_INT data type\n",
                Benchmark::TrulyPassivePut => {
                    s += "#     The benchmark measures execution time of MPI_Put for 2 cases:\n";
                    s += "#     1) The target is waiting in MPI_Barrier call (t_pure value)\n";
                    s += "#     2) The target performs computation and then enters MPI_Barrier \
                          routine (t_ovrl value)\n";
                }
                _ => {}
            }
        }
        s
    }
}

/// IMB's last lines (after the last table).
pub const FINALIZE: &str = "\n\n# All processes entering MPI_Finalize\n";
