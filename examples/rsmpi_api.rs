//! One program written against rsmpi's API, run on rsmpi over the host MPI and on pagewire:
//! what a Rust code that switches from rsmpi to pagewire sees. Three kernels, each timed per
//! message size and printed as IMB-MPI1 prints them (so `tools/bench/local_path.sh` reads
//! them beside imb-bench's tables):
//!
//! - `PingPong`: ranks 0 and 1, blocking `send` and `receive_into`; `t[usec]` is half a
//!   round trip (IMB PingPong);
//! - `Sendrecv`: every rank `send_receive_into` to its right neighbour from its left one;
//!   `t_avg[usec]` per call over the ranks, bandwidth counts both directions (IMB Sendrecv);
//! - `Allreduce`: `all_reduce_into` of `f32`s, sum (IMB Allreduce).
//!
//! The program's text is written once (the `program!` macro below) and instantiated for each
//! library, whose crate it names `mpi`, as a code that switches does (`use pagewire as
//! mpi;`); nothing of pagewire's own API is used.
//!
//! ```sh
//! cargo build --release --bin pwrun --example rsmpi_api
//! target/release/pwrun -n 2 --bind-to core target/release/examples/rsmpi_api
//! # rsmpi over MPICH (Debian's mpich and libmpich-dev):
//! cargo build --release --features mpi --example rsmpi_api --target-dir target/mpi
//! mpirun -np 2 -bind-to core target/mpi/release/examples/rsmpi_api --api rsmpi
//! ```

use clap::{Parser, ValueEnum};

/// The library the program runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Api {
    /// pagewire (under pwrun, or under mpirun with `--features mpi`).
    Pagewire,
    /// rsmpi over the host MPI (built with `--features mpi`, under mpirun).
    Rsmpi,
}

/// Ping-pong, send_receive and all_reduce through rsmpi's API.
#[derive(Parser, Debug)]
#[command(name = "rsmpi_api")]
struct Flags {
    /// Which library runs the program.
    #[arg(long, value_enum, default_value = "pagewire")]
    api: Api,
    /// Message sizes 0 and 2^MIN .. 2^MAX bytes (IMB `-msglog`).
    #[arg(long, default_value = "0:22", value_parser = parse_msglog)]
    msglog: (u32, u32),
    /// Repetitions per size at most; fewer from 40 KiB on, so that no size moves more than
    /// 40 MiB (IMB's default `-iter 1000,40`).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    iter: u64,
    /// Kernels to run (default: all three).
    #[arg(value_enum)]
    kernels: Vec<Kernel>,
}

/// A kernel, by IMB's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kernel {
    #[value(name = "PingPong", alias = "pingpong")]
    PingPong,
    #[value(name = "Sendrecv", alias = "sendrecv")]
    Sendrecv,
    #[value(name = "Allreduce", alias = "allreduce")]
    Allreduce,
}

fn parse_msglog(s: &str) -> Result<(u32, u32), String> {
    let (lo, hi) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}`: expected MIN:MAX, e.g. 0:22"))?;
    let parse = |v: &str| v.parse::<u32>().map_err(|e| format!("`{v}` in `{s}`: {e}"));
    let (lo, hi) = (parse(lo)?, parse(hi)?);
    if lo > hi || hi > 30 {
        return Err(format!("`{s}`: need MIN <= MAX <= 30"));
    }
    Ok((lo, hi))
}

/// The sizes of `-msglog MIN:MAX`: 0, then 2^MIN .. 2^MAX.
fn sizes(msglog: (u32, u32)) -> Vec<usize> {
    let mut v = vec![0];
    v.extend((msglog.0..=msglog.1).map(|k| 1usize << k));
    v
}

/// Repetitions of a size: `iter`, and no more than 40 MiB moved (IMB's rule).
fn repetitions(bytes: usize, iter: u64) -> u64 {
    const VOLUME: u64 = 40 << 20;
    if bytes == 0 {
        iter
    } else {
        iter.min(VOLUME / bytes as u64).max(1)
    }
}

/// The program, written once against rsmpi's API; `$lib` is the crate it runs on.
macro_rules! program {
    ($module:ident, $lib:ident) => {
        mod $module {
            use ::$lib as mpi;
            use mpi::collective::SystemOperation;
            use mpi::traits::*;

            use super::{repetitions, Flags, Kernel};

            /// Per-call times of one rank over `reps` calls, reduced over the ranks: (min,
            /// max, avg) in µs.
            fn spread<C: Communicator>(world: &C, seconds: f64, calls: u64) -> (f64, f64, f64) {
                let t = seconds / calls as f64 * 1e6;
                let (mut lo, mut hi, mut sum) = (0.0f64, 0.0f64, 0.0f64);
                world.all_reduce_into(&t, &mut lo, SystemOperation::min());
                world.all_reduce_into(&t, &mut hi, SystemOperation::max());
                world.all_reduce_into(&t, &mut sum, SystemOperation::sum());
                (lo, hi, sum / world.size() as f64)
            }

            /// Runs `once` a tenth of `reps` times untimed, then, from a barrier, `reps` times:
            /// the seconds those took on this rank.
            fn timed<C: Communicator>(world: &C, reps: u64, mut once: impl FnMut()) -> f64 {
                for _ in 0..(reps / 10).max(1) {
                    once();
                }
                world.barrier();
                let t0 = mpi::time();
                for _ in 0..reps {
                    once();
                }
                mpi::time() - t0
            }

            fn banner(rank: i32, name: &str, procs: i32, columns: &str) {
                if rank == 0 {
                    println!("#----------------------------------------------------------------");
                    println!("# Benchmarking {name}");
                    println!("# #processes = {procs}");
                    println!("#----------------------------------------------------------------");
                    println!("{columns}");
                }
            }

            pub fn run(flags: &Flags, sizes: &[usize], library: &str) {
                let universe = mpi::initialize().expect("MPI initialised once");
                let world = universe.world();
                let (rank, size) = (world.rank(), world.size());
                if size < 2 {
                    eprintln!("rsmpi_api: run on 2 ranks or more (PingPong uses ranks 0 and 1)");
                    std::process::exit(2);
                }
                if rank == 0 {
                    println!("# rsmpi_api: rsmpi's API on {library}, {size} ranks");
                }
                let right = world.process_at_rank((rank + 1) % size);
                let left = world.process_at_rank((rank + size - 1) % size);
                let kernels: &[Kernel] = if flags.kernels.is_empty() {
                    &[Kernel::PingPong, Kernel::Sendrecv, Kernel::Allreduce]
                } else {
                    &flags.kernels
                };
                for &kernel in kernels {
                    match kernel {
                        Kernel::PingPong => {
                            banner(rank, "PingPong", 2, "       #bytes #repetitions      t[usec]   Mbytes/sec");
                            let peer = world.process_at_rank(1 - rank.min(1));
                            for &n in sizes {
                                let reps = repetitions(n, flags.iter);
                                let send = vec![1u8; n];
                                let mut recv = vec![0u8; n];
                                let once = |recv: &mut [u8]| match rank {
                                    0 => {
                                        peer.send(&send[..]);
                                        peer.receive_into(recv);
                                    }
                                    1 => {
                                        peer.receive_into(recv);
                                        peer.send(&send[..]);
                                    }
                                    _ => {}
                                };
                                let elapsed = timed(&world, reps, || once(&mut recv));
                                assert!(rank > 1 || recv.iter().all(|&b| b == 1), "ping-pong data");
                                let t = elapsed / (2 * reps) as f64 * 1e6;
                                if rank == 0 {
                                    let mb = if t > 0.0 { n as f64 / t } else { 0.0 };
                                    println!("{n:>13} {reps:>12} {t:>12.2} {mb:>12.2}");
                                }
                                world.barrier();
                            }
                        }
                        Kernel::Sendrecv => {
                            banner(
                                rank,
                                "Sendrecv",
                                size,
                                "       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]   Mbytes/sec",
                            );
                            for &n in sizes {
                                let reps = repetitions(n, flags.iter);
                                let send = vec![rank as u8; n];
                                let mut recv = vec![0u8; n];
                                let once = |recv: &mut [u8]| {
                                    mpi::point_to_point::send_receive_into(&send[..], &right, recv, &left);
                                };
                                let elapsed = timed(&world, reps, || once(&mut recv));
                                let from = ((rank + size - 1) % size) as u8;
                                assert!(recv.iter().all(|&b| b == from), "send_receive data");
                                let (lo, hi, avg) = spread(&world, elapsed, reps);
                                if rank == 0 {
                                    let mb = if hi > 0.0 { 2.0 * n as f64 / hi } else { 0.0 };
                                    println!("{n:>13} {reps:>12} {lo:>12.2} {hi:>12.2} {avg:>12.2} {mb:>12.2}");
                                }
                            }
                        }
                        Kernel::Allreduce => {
                            banner(
                                rank,
                                "Allreduce",
                                size,
                                "       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]",
                            );
                            for &n in sizes {
                                let count = n / std::mem::size_of::<f32>();
                                let bytes = count * std::mem::size_of::<f32>();
                                if bytes != n {
                                    continue; // not whole f32s (IMB's sizes: 0, 4, 8, ...)
                                }
                                let reps = repetitions(bytes, flags.iter);
                                let send = vec![1.0f32; count];
                                let mut recv = vec![0.0f32; count];
                                let once = |recv: &mut [f32]| {
                                    world.all_reduce_into(&send[..], recv, SystemOperation::sum());
                                };
                                let elapsed = timed(&world, reps, || once(&mut recv));
                                assert!(recv.iter().all(|&x| x == size as f32), "all_reduce sums");
                                let (lo, hi, avg) = spread(&world, elapsed, reps);
                                if rank == 0 {
                                    println!("{bytes:>13} {reps:>12} {lo:>12.2} {hi:>12.2} {avg:>12.2}");
                                }
                            }
                        }
                    }
                }
            }
        }
    };
}

program!(on_pagewire, pagewire);
#[cfg(feature = "mpi")]
program!(on_rsmpi, mpi);

fn main() {
    let flags = Flags::parse();
    let sizes = sizes(flags.msglog);
    match flags.api {
        Api::Pagewire => on_pagewire::run(&flags, &sizes, "pagewire"),
        #[cfg(feature = "mpi")]
        Api::Rsmpi => on_rsmpi::run(&flags, &sizes, "rsmpi over the host MPI"),
        #[cfg(not(feature = "mpi"))]
        Api::Rsmpi => {
            eprintln!("rsmpi_api: --api rsmpi needs a build with `--features mpi`");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_repetitions_follow_imb() {
        assert_eq!(sizes((0, 3)), vec![0, 1, 2, 4, 8]);
        assert_eq!(repetitions(0, 1000), 1000);
        assert_eq!(repetitions(4 << 20, 1000), 10);
        assert_eq!(repetitions(1 << 30, 1000), 1);
        assert!(parse_msglog("3:2").is_err());
        assert!(parse_msglog("0-22").is_err());
    }
}
