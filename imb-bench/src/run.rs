//! Running the benchmarks on a universe: for each benchmark and process count, a
//! communicator of the first N processes (the others wait in a barrier, as IMB's do); for
//! each size, IMB's preparatory runs (dynamic repetitions), its warm-up, two barriers, the
//! timed loop; then every process's time goes to rank 0, which prints the row.

mod buffers;
mod kernels;
mod rma_kernels;

use std::io::Write;

use pagewire::traits::*;
use pagewire::{Color, SimpleCommunicator, SystemOperation, Universe};
use pagewire_tools::msgperf::RowCounters;
use serde::{Deserialize, Serialize};

use crate::bench::{Aggregation, Benchmark, Kind};
use crate::output::{self, Layout, RowValues};
use crate::settings::{
    process_counts, warmup_repetitions, IterPolicy, Iterations, OffCache, WindowKind,
};

pub use buffers::Buffers;
use kernels::kernel;
use rma_kernels::{rma_kernel, RmaWindow};

/// IMB-RMA's repetitions in non-aggregate mode at most (its `MSGS_NONAGGR`).
const MSGS_NONAGGREGATE: usize = 100;

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// The benchmarks, in the order to run them.
    pub benchmarks: Vec<Benchmark>,
    /// Message sizes.
    pub sizes: Vec<usize>,
    /// Repetition control.
    pub iterations: Iterations,
    /// `-off_cache`, if given.
    pub off_cache: Option<OffCache>,
    /// `-npmin`.
    pub npmin: usize,
    /// The memory of IMB-RMA's windows.
    pub window: WindowKind,
    /// Show a progress bar on stderr (rank 0, when stderr is a terminal).
    pub progress: bool,
}

/// One row of a table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Message size.
    pub bytes: usize,
    /// Timed repetitions.
    pub repetitions: usize,
    /// Fastest process, microseconds per repetition (PingPong: half a round trip).
    pub t_min_usec: f64,
    /// Slowest process.
    pub t_max_usec: f64,
    /// Average over the participating processes.
    pub t_avg_usec: f64,
    /// IMB's bandwidth (MB = 10^6 B) where its table has the column.
    pub mbytes_per_sec: Option<f64>,
    /// Truly_passive_put's `t_ovrl` (its `t_pure` is `t_max_usec`).
    #[serde(default)]
    pub t_ovrl_usec: Option<f64>,
    /// What the buffer mode and the NIC did during the timed repetitions, summed over the
    /// participating processes (`None` on the mpi transport). Not read back from JSON.
    #[serde(skip_deserializing)]
    pub counters: Option<RowCounters>,
}

/// The counters of one table, summed over its rows, that explain its results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Pin-down cache hit rate in percent (`None` without lookups).
    pub hit_rate: Option<f64>,
    /// Pin-down cache misses.
    pub misses: u64,
    /// Pin-down cache evictions.
    pub evictions: u64,
    /// Transfers that fell back to copying.
    pub fallbacks: u64,
    /// Invalidated registrations or ODP pages.
    pub invalidations: u64,
    /// Network page faults, both sides.
    pub npfs: u64,
    /// Pages made present by faults.
    pub npf_pages: u64,
    /// Pages made present by prefetch.
    pub prefetch_pages: u64,
    /// Highest number of bytes pinned at once by any process so far (cumulative over the
    /// run: the NIC counts peaks over its life).
    pub pinned_peak: u64,
}

/// One benchmark on one process count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// The benchmark.
    pub benchmark: Benchmark,
    /// Processes taking part.
    pub processes: usize,
    /// IMB would not run it on this many processes (PingPong and PingPing on one).
    pub invalid: bool,
    /// IMB-RMA's aggregation mode of the table, if it has one.
    #[serde(default)]
    pub aggregation: Option<Aggregation>,
    /// The rows.
    pub rows: Vec<Row>,
    /// The counters (`None` on the mpi transport).
    pub summary: Option<Summary>,
}

/// A whole run, as `--json` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The buffer mode (`mpi` on the mpi transport).
    pub mode: String,
    /// The transport.
    pub transport: String,
    /// Processes in the job.
    pub ranks: usize,
    /// Repetition control.
    pub iterations: Iterations,
    /// `-off_cache`.
    pub off_cache: Option<OffCache>,
    /// The tables, in the order they ran.
    pub tables: Vec<Table>,
}

/// Runs `opts` on `universe`, printing IMB's tables on rank 0 as they complete (after
/// `header`, which rank 0 prints first). Returns the tables on rank 0, nothing elsewhere.
pub fn run(universe: &Universe, opts: &Options, header: &str) -> Vec<Table> {
    let world = universe.world();
    let me = world.rank();
    let world_size = world.size() as usize;
    let counters = universe.try_with_p2p(|_| ()).is_ok();
    let out = |s: &str, bar: &Option<indicatif::ProgressBar>| {
        let print = || {
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{s}");
            let _ = stdout.flush();
        };
        match bar {
            Some(b) => b.suspend(print),
            None => print(),
        }
    };
    let plan: Vec<(Benchmark, Vec<usize>)> = opts
        .benchmarks
        .iter()
        .map(|&b| {
            (
                b,
                process_counts(world_size, opts.npmin, b.kind().is_pair()),
            )
        })
        .collect();
    let bar = (me == 0 && opts.progress).then(|| progress_bar(&plan, &opts.sizes));
    if me == 0 {
        // The table header starts with IMB's blank line.
        out(header.trim_end_matches('\n'), &bar);
    }
    let mut tables = Vec::new();
    for (b, counts) in plan {
        for np in counts {
            if (b.kind().is_pair() || b.kind().is_rma()) && np < 2 {
                if me == 0 {
                    out(&output::invalid(b, np), &bar);
                }
                tables.push(Table {
                    benchmark: b,
                    processes: np,
                    invalid: true,
                    aggregation: None,
                    rows: Vec::new(),
                    summary: None,
                });
                continue;
            }
            for &mode in b.aggregations() {
                let table = run_table(universe, &world, (b, mode), np, opts, counters, &|s| {
                    out(s, &bar)
                });
                tables.push(table);
            }
            if let Some(bar) = &bar {
                bar.inc(1);
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if me == 0 {
        tables
    } else {
        Vec::new()
    }
}

fn progress_bar(plan: &[(Benchmark, Vec<usize>)], sizes: &[usize]) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    let steps: usize = plan.iter().map(|(_, c)| c.len()).sum();
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} tables  {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{} sizes each", sizes.len()));
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// One table: benchmark `b` (in IMB-RMA aggregation `mode`, if it has modes) on the first
/// `np` processes of `world`.
fn run_table(
    universe: &Universe,
    world: &SimpleCommunicator,
    (b, mode): (Benchmark, Option<Aggregation>),
    np: usize,
    opts: &Options,
    counters: bool,
    out: &dyn Fn(&str),
) -> Table {
    let me = world.rank() as usize;
    let world_size = world.size() as usize;
    let color = if me < np {
        Color::with_value(0)
    } else {
        Color::undefined()
    };
    let comm = world.split_by_color(color);
    if me == 0 {
        out(&output::table_header_in_mode(b, np, world_size, mode));
    }
    let layout = Layout::of(b);
    // IMB's Barrier has one row: it runs with the last size only, which it does not use.
    let sizes: Vec<usize> = match (b.kind(), b.single_element()) {
        (Kind::Sync, _) => vec![0],
        (_, Some(size)) => vec![size],
        _ => opts
            .sizes
            .iter()
            .copied()
            .filter(|&s| b.runs_size(s))
            .collect(),
    };
    let mut rows = Vec::new();
    let mut previous_repetitions = opts.iterations.msgs_per_sample;
    let mut summed = RowCounters::default();
    for size in sizes {
        let (seconds, repetitions, delta) = match &comm {
            Some(comm) => {
                let before = || counters.then(|| RowCounters::now(universe));
                let m = measure(
                    (b, mode),
                    comm,
                    size,
                    opts,
                    &mut previous_repetitions,
                    before,
                );
                let delta = match (m.before, counters.then(|| RowCounters::now(universe))) {
                    (Some(a), Some(z)) => z.zip(a, u64::wrapping_sub),
                    _ => RowCounters::default(),
                };
                (m.seconds, m.repetitions, delta)
            }
            None => ([-1.0; 2], 0, RowCounters::default()),
        };
        // The others wait here, as IMB's wait in MPI_Barrier.
        world.barrier();
        let times = gather(world, seconds[0]);
        let overlaps = gather(world, seconds[1]);
        let all_counters = gather_counters(world, &delta.to_array());
        if me == 0 {
            let scale = 1e6 * b.time_scale();
            let ts: Vec<f64> = times
                .iter()
                .filter(|&&t| t >= 0.0)
                .map(|t| t * scale)
                .collect();
            let t_min = ts.iter().copied().fold(f64::MAX, f64::min);
            let t_max = ts.iter().copied().fold(0.0, f64::max);
            let t_avg = ts.iter().sum::<f64>() / ts.len().max(1) as f64;
            let bw = b.bandwidth_scale().map(|f| {
                if t_max > 0.0 {
                    f * size as f64 / t_max
                } else {
                    0.0
                }
            });
            let t_ovrl = (b.kind() == Kind::RmaOverlap).then(|| {
                overlaps
                    .iter()
                    .filter(|&&t| t >= 0.0)
                    .map(|t| t * scale)
                    .fold(0.0, f64::max)
            });
            let values = RowValues {
                bytes: size,
                repetitions,
                t_min: if ts.is_empty() { 0.0 } else { t_min },
                t_max,
                t_avg,
                mbytes_per_sec: bw.unwrap_or(0.0),
                t_overlap: t_ovrl.unwrap_or(0.0),
            };
            out(&output::row(layout, &values));
            let row_counters = counters.then(|| {
                let c = all_counters
                    .chunks(RowCounters::N)
                    .map(|rank| {
                        RowCounters::from_array(rank.try_into().expect("one rank's counters"))
                    })
                    .fold(RowCounters::default(), |a, b| a.zip(b, u64::wrapping_add));
                summed = summed.zip(c, u64::wrapping_add);
                c
            });
            rows.push(Row {
                bytes: size,
                repetitions,
                t_min_usec: values.t_min,
                t_max_usec: t_max,
                t_avg_usec: t_avg,
                mbytes_per_sec: bw,
                t_ovrl_usec: t_ovrl,
                counters: row_counters,
            });
        }
    }
    let pinned_peak = if counters {
        universe.with_p2p(|p| p.nic_counters().pinned_peak)
    } else {
        0
    };
    let peaks = gather_counters(world, &[pinned_peak]);
    let summary = counters.then(|| Summary {
        hit_rate: summed.hit_rate(),
        misses: summed.misses,
        evictions: summed.evictions,
        fallbacks: summed.fallbacks,
        invalidations: summed.invalidations,
        npfs: summed.npf_requester + summed.npf_responder,
        npf_pages: summed.npf_pages,
        prefetch_pages: summed.prefetch_pages,
        pinned_peak: peaks.iter().copied().max().unwrap_or(0),
    });
    Table {
        benchmark: b,
        processes: np,
        invalid: false,
        aggregation: mode,
        rows,
        summary,
    }
}

/// Every process's `value` on rank 0 of `world` (IMB gathers its times over the world).
fn gather(world: &SimpleCommunicator, value: f64) -> Vec<f64> {
    let root = world.process_at_rank(0);
    if world.rank() == 0 {
        let mut all = vec![0.0f64; world.size() as usize];
        root.gather_into_root(&[value][..], &mut all[..]);
        all
    } else {
        root.gather_into(&[value][..]);
        Vec::new()
    }
}

fn gather_counters(world: &SimpleCommunicator, values: &[u64]) -> Vec<u64> {
    let root = world.process_at_rank(0);
    if world.rank() == 0 {
        let mut all = vec![0u64; values.len() * world.size() as usize];
        root.gather_into_root(values, &mut all[..]);
        all
    } else {
        root.gather_into(values);
        Vec::new()
    }
}

/// One size's measurement on one process.
struct Measurement {
    /// Seconds per repetition (unscaled; Truly_passive_put's `t_pure` and `t_ovrl`, -1 for
    /// the second otherwise).
    seconds: [f64; 2],
    /// Timed repetitions.
    repetitions: usize,
    /// The counters just before the timed loop.
    before: Option<RowCounters>,
}

/// IMB's sequence for one size on `comm`: buffers (rotated with `-off_cache`), preparatory
/// runs that set the repetitions (dynamic policy), warm-up, the timed run.
fn measure(
    (b, mode): (Benchmark, Option<Aggregation>),
    comm: &SimpleCommunicator,
    size: usize,
    opts: &Options,
    previous_repetitions: &mut usize,
    counters_now: impl Fn() -> Option<RowCounters>,
) -> Measurement {
    let np = comm.size() as usize;
    let mut selected = opts.iterations.repetitions(size);
    if mode == Some(Aggregation::NonAggregate) {
        selected = selected.min(MSGS_NONAGGREGATE);
    }
    let mut bufs = Buffers::new(b, size, np, selected, opts.off_cache);
    // IMB-RMA creates the window of each size on the benchmark's processes.
    let window = b
        .kind()
        .is_rma()
        .then(|| RmaWindow::new(b, comm, size, opts.window));
    let kernel = |bufs: &mut Buffers, n: usize, mode: Option<Aggregation>| match &window {
        Some(w) => rma_kernel(b, comm, w, bufs, size, n, mode),
        None => [kernel(b, comm, bufs, size, n), -1.0],
    };
    let mut n = selected;
    if opts.iterations.policy == IterPolicy::Dynamic {
        let t1 = max_over(comm, kernel(&mut bufs, 1, mode)[0]);
        let rep_test = if t1 < 1.0 / opts.iterations.msgs_per_sample as f64 {
            opts.iterations.msgs_per_sample
        } else if t1 < 1.0 {
            (1.0 / t1 + 0.5) as usize
        } else {
            1
        };
        let rep_test = max_over(comm, rep_test as f64) as usize;
        let tried = selected.min(rep_test).max(1);
        let t = if tried > 1 {
            max_over(comm, kernel(&mut bufs, tried, mode)[0])
        } else {
            t1
        };
        let t_sample = if t > 1e-8 {
            ((1.0 + opts.iterations.secs / t) as usize).min(i32::MAX as usize)
        } else {
            selected
        };
        n = selected.min((*previous_repetitions).min(t_sample)).max(1);
        let mut shared = [n as u64];
        comm.process_at_rank(0).broadcast_into(&mut shared[..]);
        n = shared[0] as usize;
        *previous_repetitions = n;
    }
    // IMB-RMA warms up in its first mode (non-aggregate where there are two).
    let warm_mode = b.aggregations()[0];
    kernel(&mut bufs, warmup_repetitions(n), warm_mode);
    let before = counters_now();
    let seconds = kernel(&mut bufs, n, mode);
    Measurement {
        seconds,
        repetitions: n,
        before,
    }
}

fn max_over(comm: &SimpleCommunicator, value: f64) -> f64 {
    let mut out = [0.0f64];
    comm.all_reduce_into(&[value][..], &mut out[..], SystemOperation::max());
    out[0]
}
