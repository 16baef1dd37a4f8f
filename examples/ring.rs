//! A token passed once around a ring of ranks: rank 0 starts it at 0, every rank adds its
//! rank and passes it on, and rank 0 checks that it comes back as 0 + 1 + ... + (size - 1).
//!
//! ```sh
//! cargo build --release --bin pwrun --example ring
//! target/release/pwrun -n 4 target/release/examples/ring
//! ```
//!
//! Written against the rsmpi-shaped API: with rsmpi, only the first line changes.

use pagewire as mpi;

use mpi::traits::*;

fn main() {
    let universe = mpi::initialize().unwrap();
    let world = universe.world();
    let rank = world.rank();
    let size = world.size();
    let next = world.process_at_rank((rank + 1) % size);
    let previous = world.process_at_rank((rank + size - 1) % size);

    if rank == 0 {
        let token: u64 = 0;
        next.send(&token);
        let (token, status) = previous.receive::<u64>();
        assert_eq!(status.source_rank(), (size - 1) % size);
        let size = size as u64;
        let expected = size * (size - 1) / 2;
        assert_eq!(
            token, expected,
            "the token came back as {token}, expected {expected}"
        );
        println!("ring: ranks={size} token={token} expected={expected} ok");
    } else {
        let (token, _) = previous.receive::<u64>();
        next.send(&(token + rank as u64));
    }
}
