//! `pw-collbench`: collective latencies (and a ping-pong) in IMB's columns
//! (`#bytes #repetitions t_min[usec] t_max[usec] t_avg[usec]`: each rank's mean time per
//! call, then the minimum, maximum and mean over the ranks).
//!
//! ```text
//! cargo run --release -p pagewire-collectives --example pw-collbench -- \
//!     [--np N] [--sizes 8,64K,1M,4M] [--iters N] [allreduce] [bcast] [allgather] [reduce]
//!     [alltoall] [reduce_scatter] [pingpong]
//! ```
//!
//! It runs on the rsmpi-shaped facade, so it measures whatever carries the facade's calls:
//! pagewire's message layer in the buffer mode of `PAGEWIRE_MODE` (`copy`, `pindown` or
//! `odp`; the algorithms from the `PAGEWIRE_*_ALGO` variables, see
//! [`pagewire_collectives::tuning`]), or, built with `--features pagewire/mpi` and started
//! by `mpirun` with `PAGEWIRE_TRANSPORT=mpi`, the host MPI library. Started without a
//! launcher it starts itself on `--np` ranks (default 2); under `mpirun` it takes mpirun's
//! ranks.
//!
//! Allreduce, reduce and reduce_scatter (`reduce_scatter_block`) sum `f32`s; sizes are bytes
//! (rounded down to whole elements): the whole vector for the reductions and bcast, each
//! rank's contribution for allgather, each block for alltoall, the message for pingpong.
//! `pingpong` is IMB's PingPong between ranks 0 and 1 (half the round trip of a blocking
//! send and receive; the other ranks wait): its three time columns are rank 0's time.

use std::time::Instant;

use pagewire::nic::soft::parse_bytes;
use pagewire::traits::*;
use pagewire::{SimpleCommunicator, SystemOperation};

/// The kernels, in the order they run when none is named.
const KERNELS: [&str; 7] = [
    "allreduce",
    "bcast",
    "allgather",
    "reduce",
    "alltoall",
    "reduce_scatter",
    "pingpong",
];

struct Args {
    np: usize,
    sizes: Vec<usize>,
    iters: Option<usize>,
    kernels: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        np: 2,
        sizes: vec![8, 64 << 10, 1 << 20, 4 << 20],
        iters: None,
        kernels: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--np" => a.np = value()?.parse().map_err(|e| format!("--np: {e}"))?,
            "--iters" => a.iters = Some(value()?.parse().map_err(|e| format!("--iters: {e}"))?),
            "--sizes" => {
                a.sizes = value()?
                    .split(',')
                    .map(|s| match parse_bytes(s) {
                        Some(Some(n)) => Ok(n as usize),
                        _ => Err(format!("--sizes: {s} is not a size")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!(
                    "pw-collbench [--np N] [--sizes 8,64K,1M,4M] [--iters N] [{}]",
                    KERNELS.join("] [")
                );
                std::process::exit(0);
            }
            k if KERNELS.contains(&k) => a.kernels.push(k.to_string()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.kernels.is_empty() {
        a.kernels = vec!["allreduce".into(), "bcast".into()];
    }
    Ok(a)
}

/// IMB's repetition rule: `min(1000, 40 MiB / size)`.
fn repetitions(size: usize) -> usize {
    match (40usize << 20).checked_div(size) {
        None => 1000,
        Some(r) => r.clamp(1, 1000),
    }
}

/// This rank's mean microseconds per call of `kernel` over `reps` calls, after a warm-up.
fn run(world: &SimpleCommunicator, kernel: &str, size: usize, reps: usize) -> f64 {
    let (me, p) = (world.rank(), world.size() as usize);
    let n = size / 4;
    let send: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let mut recv = vec![0f32; n];
    let bytes = vec![1u8; size];
    let mut bbuf = vec![0u8; size];
    let mut gathered = vec![0u8; size * p];
    let mut a2a_in = vec![1u8; size * p];
    let mut a2a_out = vec![0u8; size * p];
    let root = world.process_at_rank(0);
    let sum = SystemOperation::sum();
    let mut once = || match kernel {
        "allreduce" => world.all_reduce_into(&send[..], &mut recv[..], sum),
        "reduce" => {
            if me == 0 {
                root.reduce_into_root(&send[..], &mut recv[..], sum)
            } else {
                root.reduce_into(&send[..], sum)
            }
        }
        "bcast" => {
            if me == 0 {
                bbuf.copy_from_slice(&bytes);
            }
            root.broadcast_into(&mut bbuf[..])
        }
        "allgather" => world.all_gather_into(&bytes[..], &mut gathered[..]),
        "alltoall" => {
            a2a_in[0] = 1;
            world.all_to_all_into(&a2a_in[..], &mut a2a_out[..])
        }
        "reduce_scatter" => {
            let m = n / p;
            world.reduce_scatter_block_into(&send[..m * p], &mut recv[..m], sum)
        }
        "pingpong" => {
            if me < 2 {
                let peer = world.process_at_rank(1 - me);
                if me == 0 {
                    peer.send(&bbuf[..]);
                    peer.receive_into(&mut bbuf[..]);
                } else {
                    peer.receive_into(&mut bbuf[..]);
                    peer.send(&bbuf[..]);
                }
            }
        }
        _ => unreachable!(),
    };
    for _ in 0..reps.clamp(1, 10) {
        once();
    }
    world.barrier();
    let t0 = Instant::now();
    for _ in 0..reps {
        once();
    }
    let per_call = t0.elapsed().as_secs_f64() / reps as f64 * 1e6;
    if kernel == "pingpong" {
        per_call / 2.0
    } else {
        per_call
    }
}

fn main() {
    let args = parse().unwrap_or_else(|e| {
        eprintln!("pw-collbench: {e}");
        std::process::exit(2)
    });
    match pagewire::boot::self_launch(args.np) {
        Ok(Some(code)) => std::process::exit(code),
        Ok(None) => {}
        Err(e) => {
            eprintln!("pw-collbench: {e}");
            std::process::exit(1)
        }
    }
    let universe = match pagewire::try_initialize() {
        Ok(u) => u.expect("first initialisation"),
        Err(e) => {
            eprintln!("pw-collbench: {e}");
            std::process::exit(1)
        }
    };
    let world = universe.world();
    let p = world.size();
    if args.kernels.iter().any(|k| k == "pingpong") && p < 2 {
        eprintln!("pw-collbench: pingpong needs at least 2 ranks");
        std::process::exit(2);
    }
    let carrier = match universe.transport() {
        pagewire::TransportKind::HostMpi => "mpi transport: the host MPI library".to_string(),
        pagewire::TransportKind::Pagewire => format!(
            "{} mode, pagewire, ranks of one host through {}",
            universe.mode_name(),
            universe.local_path()
        ),
    };
    for kernel in &args.kernels {
        if world.rank() == 0 {
            println!("#----------------------------------------------------------------");
            println!("# Benchmarking {kernel} ({carrier})");
            println!("# #processes = {p}");
            println!("#----------------------------------------------------------------");
            println!(
                "{:>12} {:>12} {:>12} {:>12} {:>12}",
                "#bytes", "#repetitions", "t_min[usec]", "t_max[usec]", "t_avg[usec]"
            );
        }
        for &size in &args.sizes {
            let reps = args.iters.unwrap_or_else(|| repetitions(size));
            let t = run(&world, kernel, size, reps);
            let (mut tmin, mut tmax, mut tsum) = (0f64, 0f64, 0f64);
            world.all_reduce_into(&t, &mut tmin, SystemOperation::min());
            world.all_reduce_into(&t, &mut tmax, SystemOperation::max());
            world.all_reduce_into(&t, &mut tsum, SystemOperation::sum());
            if world.rank() == 0 {
                let (lo, hi, avg) = if kernel == "pingpong" {
                    (t, t, t)
                } else {
                    (tmin, tmax, tsum / f64::from(p))
                };
                println!("{size:>12} {reps:>12} {lo:>12.2} {hi:>12.2} {avg:>12.2}");
            }
        }
    }
    world.barrier();
}
