//! The smallest pagewire program: every rank starts, says who it is and where it runs, and
//! ends. What a launcher's start-up costs is the time of this job (`tools/bench/starters.sh`
//! measures it next to MPICH's C hello world under the same `srun`).
//!
//! ```sh
//! cargo build --release --bin pwrun --example hello
//! target/release/pwrun -n 4 target/release/examples/hello
//! srun -N 2 -n 4 --mpi=pmi2 target/release/examples/hello
//! ```
//!
//! Written against the rsmpi-shaped API: with rsmpi, only the first line changes.

use pagewire as mpi;

use mpi::traits::*;

fn main() {
    let universe = mpi::initialize().unwrap();
    let world = universe.world();
    println!(
        "hello from rank {} of {} on {}",
        world.rank(),
        world.size(),
        mpi::environment::processor_name().unwrap_or_else(|_| "?".into())
    );
}
