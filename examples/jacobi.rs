//! A 2-D Jacobi solver for Laplace's equation on an N×N grid: the top edge held at 1, the
//! other edges at 0, the interior relaxed to the average of its four neighbours until the
//! largest change of a sweep falls below a tolerance.
//!
//! The interior rows are split into blocks, one per rank (1-D row decomposition). Every
//! sweep, each rank exchanges its first and last rows with its neighbours' halo rows
//! (immediate sends and receives in a request scope); every CHECK sweeps an allreduce (max)
//! of the sweep's largest change decides whether to stop.
//!
//! Every grid point is computed with the same operations in the same order whatever the
//! decomposition, and the residual is a maximum, whose reduction does not depend on the
//! order of its operands; so the iterations and the residual printed are bit-for-bit the
//! same for every rank count, buffer mode and launcher.
//!
//! ```sh
//! cargo build --release --bin pwrun --example jacobi
//! target/release/pwrun -n 4 target/release/examples/jacobi [N [MAX_ITERS [TOLERANCE [CHECK]]]]
//! ```
//!
//! Written against the rsmpi-shaped API: with rsmpi, only the first line changes.

use pagewire as mpi;

use mpi::collective::SystemOperation;
use mpi::traits::*;

/// Value of the top edge; the other edges are 0.
const TOP: f64 = 1.0;

/// Command-line settings: `jacobi [N [MAX_ITERS [TOLERANCE [CHECK]]]]`.
struct Settings {
    /// Grid points per side, boundary included.
    n: usize,
    /// Stop after this many sweeps at the latest.
    max_iterations: usize,
    /// Stop when no point changed by more than this in a sweep.
    tolerance: f64,
    /// Sweeps between two residual checks.
    check_every: usize,
}

fn settings() -> Settings {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.to_string());
    let usage = "usage: jacobi [N [MAX_ITERS [TOLERANCE [CHECK]]]]";
    let s = Settings {
        n: arg(0, "64").parse().expect(usage),
        max_iterations: arg(1, "20000").parse().expect(usage),
        tolerance: arg(2, "1e-4").parse().expect(usage),
        check_every: arg(3, "10").parse().expect(usage),
    };
    assert!(
        s.n >= 3 && s.check_every >= 1,
        "{usage}: N >= 3, CHECK >= 1"
    );
    s
}

fn main() {
    let cfg = settings();
    let universe = mpi::initialize().unwrap();
    let world = universe.world();
    let rank = world.rank() as usize;
    let size = world.size() as usize;
    let n = cfg.n;

    // Interior rows 1..n-1, in blocks; this rank owns global rows first..first + rows.
    let interior = n - 2;
    assert!(
        interior >= size,
        "a {n}x{n} grid has {interior} interior rows, fewer than the {size} ranks"
    );
    let rows = interior / size + usize::from(rank < interior % size);
    let first = 1 + rank * (interior / size) + rank.min(interior % size);
    let up = (rank > 0).then(|| world.process_at_rank(rank as i32 - 1));
    let down = (rank + 1 < size).then(|| world.process_at_rank(rank as i32 + 1));

    // Local rows: a halo row, the owned rows, a halo row. A halo row that is the grid's
    // boundary keeps its fixed value; the others are filled by the exchange.
    let width = n;
    let mut u = vec![0.0f64; (rows + 2) * width];
    if first == 1 {
        u[..width].fill(TOP);
    }
    let mut next = u.clone();

    let mut iterations = 0;
    let mut residual = f64::INFINITY;
    let t0 = mpi::time();
    while iterations < cfg.max_iterations {
        exchange_halos(&mut u, width, rows, up.as_ref(), down.as_ref());
        let mut largest_change = 0.0f64;
        for i in 1..=rows {
            for j in 1..width - 1 {
                let here = i * width + j;
                let new =
                    0.25 * ((u[here - width] + u[here + width]) + (u[here - 1] + u[here + 1]));
                largest_change = largest_change.max((new - u[here]).abs());
                next[here] = new;
            }
        }
        std::mem::swap(&mut u, &mut next);
        iterations += 1;
        if iterations % cfg.check_every == 0 || iterations == cfg.max_iterations {
            world.all_reduce_into(&largest_change, &mut residual, SystemOperation::max());
            if residual < cfg.tolerance {
                break;
            }
        }
    }
    let seconds = mpi::time() - t0;

    // The value at the grid's centre, from the rank that owns it.
    let centre_row = n / 2;
    let owner = (0..size)
        .find(|&r| {
            let rows_r = interior / size + usize::from(r < interior % size);
            let first_r = 1 + r * (interior / size) + r.min(interior % size);
            (first_r..first_r + rows_r).contains(&centre_row)
        })
        .expect("some rank owns the centre row");
    let mine = if owner == rank {
        u[(centre_row - first + 1) * width + n / 2]
    } else {
        0.0
    };
    let mut centre = mine;
    if owner != 0 {
        if rank == owner {
            world.process_at_rank(0).send(&mine);
        } else if rank == 0 {
            centre = world.process_at_rank(owner as i32).receive::<f64>().0;
        }
    }

    if rank == 0 {
        let how = if residual < cfg.tolerance {
            "converged"
        } else {
            "stopped at the iteration limit"
        };
        // `{:e}` prints the shortest digits that read back as the same f64, so equal lines
        // mean bit-for-bit equal results.
        println!(
            "jacobi: grid {n}x{n}, ranks {size}, iterations {iterations}, residual {residual:e}, centre {centre:e}, {how} ({seconds:.3} s)"
        );
    }
}

/// Sends this rank's first and last owned rows to its neighbours and receives theirs into
/// its halo rows, all at once in one request scope.
fn exchange_halos<P: Source + Destination>(
    u: &mut [f64],
    width: usize,
    rows: usize,
    up: Option<&P>,
    down: Option<&P>,
) {
    let (top_halo, rest) = u.split_at_mut(width);
    let (owned, bottom_halo) = rest.split_at_mut(rows * width);
    let first_row = &owned[..width];
    let last_row = &owned[(rows - 1) * width..];
    mpi::request::scope(|scope| {
        let mut requests = Vec::new();
        if let Some(up) = up {
            requests.push(up.immediate_receive_into(scope, top_halo));
            requests.push(up.immediate_send(scope, first_row));
        }
        if let Some(down) = down {
            requests.push(down.immediate_receive_into(scope, bottom_halo));
            requests.push(down.immediate_send(scope, last_row));
        }
        for request in requests {
            request.wait();
        }
    });
}
