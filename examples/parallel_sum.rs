//! A parallel sum of 1..=N: each rank sums its own block of the range, then the partial
//! sums are combined twice, with a reduce to rank 0 and with an allreduce, and both are
//! checked against the closed form N(N+1)/2.
//!
//! ```sh
//! cargo build --release --bin pwrun --example parallel_sum
//! target/release/pwrun -n 4 target/release/examples/parallel_sum [N]
//! ```
//!
//! Written against the rsmpi-shaped API: with rsmpi, only the first line changes.

use pagewire as mpi;

use mpi::collective::SystemOperation;
use mpi::traits::*;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(10_000_000, |a| a.parse().expect("usage: parallel_sum [N]"));
    let universe = mpi::initialize().unwrap();
    let world = universe.world();
    let rank = world.rank() as u64;
    let size = world.size() as u64;

    // Rank r sums the r-th of `size` nearly equal blocks of 1..=n.
    let block = |r: u64| 1 + r * (n / size) + r.min(n % size);
    let (first, end) = (block(rank), block(rank + 1));
    let partial: u64 = (first..end).sum();

    let expected = n * (n + 1) / 2;
    let root = world.process_at_rank(0);
    if rank == 0 {
        let mut total = 0u64;
        root.reduce_into_root(&partial, &mut total, SystemOperation::sum());
        assert_eq!(total, expected, "reduce gave {total}, expected {expected}");
    } else {
        root.reduce_into(&partial, SystemOperation::sum());
    }

    let mut everywhere = 0u64;
    world.all_reduce_into(&partial, &mut everywhere, SystemOperation::sum());
    assert_eq!(
        everywhere, expected,
        "rank {rank}: allreduce gave {everywhere}, expected {expected}"
    );

    if rank == 0 {
        println!("parallel_sum: ranks={size} n={n} sum={everywhere} expected={expected} ok");
    }
}
