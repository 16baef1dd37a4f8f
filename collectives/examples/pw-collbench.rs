//! `pw-collbench`: collective latencies in IMB's columns
//! (`#bytes #repetitions t_min[usec] t_max[usec] t_avg[usec]`: each rank's mean time per
//! call, then the minimum, maximum and mean over the ranks).
//!
//! ```text
//! cargo run --release -p pagewire-collectives --example pw-collbench -- \
//!     [--np N] [--sizes 8,64K,1M,4M] [--iters N] [allreduce] [bcast] [allgather] [reduce]
//!     [alltoall] [reduce_scatter]
//! ```
//!
//! Started without a launcher it starts itself on `--np` ranks (default 2). The buffer mode
//! comes from `PAGEWIRE_MODE` (`copy` or `odp`), the algorithms from the `PAGEWIRE_*_ALGO`
//! variables ([`pagewire_collectives::tuning`]). Allreduce, reduce and reduce_scatter
//! (`reduce_scatter_block`) sum `f32`s; sizes are bytes (rounded down to whole elements):
//! the whole vector for the reductions and bcast, each rank's contribution for allgather,
//! each block for alltoall.

use std::time::Instant;

use pagewire_collectives::{Group, Op, Tuning};
use pagewire_odp::{OdpConfig, OdpMode};
use pagewire_transport::boot;
use pagewire_transport::buffer_mode::copy::{CopyConfig, CopyMode};
use pagewire_transport::buffer_mode::BufferMode;
use pagewire_transport::msg::{MsgConfig, PointToPoint};
use pagewire_transport::nic;
use pagewire_transport::nic::soft::parse_bytes;

/// The collective context: the facade's world communicator uses 0 | bit 31.
const CONTEXT: u32 = 0x8000_0000;

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
                    "pw-collbench [--np N] [--sizes 8,64K,1M,4M] [--iters N] \
                     [allreduce] [bcast] [allgather] [reduce] [alltoall] [reduce_scatter]"
                );
                std::process::exit(0);
            }
            k
            @ ("allreduce" | "bcast" | "allgather" | "reduce" | "alltoall" | "reduce_scatter") => {
                a.kernels.push(k.to_string())
            }
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

fn run(g: &mut Group, kernel: &str, size: usize, reps: usize) -> f64 {
    let p = g.size;
    let n = size / 4;
    let send: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let mut recv = vec![0f32; n];
    let bytes = vec![1u8; size];
    let mut bbuf = vec![0u8; size];
    let mut gathered = vec![0u8; size * p];
    let mut a2a_in = vec![1u8; size * p];
    let mut a2a_out = vec![0u8; size * p];
    let mut once = |g: &mut Group| match kernel {
        "allreduce" => g.allreduce(&send, &mut recv, &Op::Sum),
        "reduce" => {
            let out = (g.rank == 0).then_some(&mut recv[..]);
            g.reduce(&send, out, &Op::Sum, 0)
        }
        "bcast" => {
            if g.rank == 0 {
                bbuf.copy_from_slice(&bytes);
            }
            g.bcast(&mut bbuf, 0)
        }
        "allgather" => g.allgather(&bytes, &mut gathered),
        "alltoall" => {
            a2a_in[0] = 1;
            g.alltoall(&a2a_in, &mut a2a_out)
        }
        "reduce_scatter" => {
            let m = n / p;
            g.reduce_scatter_block(&send[..m * p], &mut recv[..m], &Op::Sum)
        }
        _ => unreachable!(),
    };
    for _ in 0..reps.clamp(1, 10) {
        once(g).expect("warm-up");
    }
    g.barrier().expect("barrier");
    let t0 = Instant::now();
    for _ in 0..reps {
        once(g).expect("collective");
    }
    t0.elapsed().as_secs_f64() / reps as f64 * 1e6
}

fn main() {
    let args = parse().unwrap_or_else(|e| {
        eprintln!("pw-collbench: {e}");
        std::process::exit(2)
    });
    match boot::self_launch(args.np) {
        Ok(Some(code)) => std::process::exit(code),
        Ok(None) => {}
        Err(e) => {
            eprintln!("pw-collbench: {e}");
            std::process::exit(1)
        }
    }
    let start = || -> pagewire_collectives::Result<(PointToPoint, Box<dyn boot::Bootstrap>)> {
        let b = boot::from_env()?;
        let nic = nic::open(&*b)?;
        let mode: Box<dyn BufferMode> = match std::env::var("PAGEWIRE_MODE").as_deref() {
            Ok("odp") => Box::new(OdpMode::new(OdpConfig::from_env()?)),
            Err(_) | Ok("") | Ok("copy") => Box::new(CopyMode::new(CopyConfig::from_env()?)),
            Ok(other) => {
                return Err(pagewire_collectives::Error::InvalidArgument(format!(
                    "PAGEWIRE_MODE={other}: pw-collbench runs copy or odp"
                )))
            }
        };
        let p2p = PointToPoint::new(nic, &*b, mode, MsgConfig::from_env()?)?;
        Ok((p2p, b))
    };
    let (mut p2p, b) = start().unwrap_or_else(|e| {
        eprintln!("pw-collbench: {e}");
        std::process::exit(1)
    });
    let tuning = Tuning::from_env().unwrap_or_else(|e| {
        eprintln!("pw-collbench: {e}");
        std::process::exit(2)
    });
    let mode = p2p.mode_name();
    {
        let mut g = Group::world(&mut p2p, CONTEXT, tuning);
        let p = g.size;
        for kernel in &args.kernels {
            if g.rank == 0 {
                println!("#----------------------------------------------------------------");
                println!("# Benchmarking {kernel} ({mode} mode, soft NIC)");
                println!("# #processes = {p}");
                println!("#----------------------------------------------------------------");
                println!(
                    "{:>12} {:>12} {:>12} {:>12} {:>12}",
                    "#bytes", "#repetitions", "t_min[usec]", "t_max[usec]", "t_avg[usec]"
                );
            }
            for &size in &args.sizes {
                let reps = args.iters.unwrap_or_else(|| repetitions(size));
                let t = run(&mut g, kernel, size, reps);
                let (mut tmin, mut tmax, mut tsum) = ([0f64], [0f64], [0f64]);
                g.allreduce(&[t], &mut tmin, &Op::Min).expect("min");
                g.allreduce(&[t], &mut tmax, &Op::Max).expect("max");
                g.allreduce(&[t], &mut tsum, &Op::Sum).expect("sum");
                if g.rank == 0 {
                    println!(
                        "{:>12} {:>12} {:>12.2} {:>12.2} {:>12.2}",
                        size,
                        reps,
                        tmin[0],
                        tmax[0],
                        tsum[0] / p as f64
                    );
                }
            }
        }
        g.barrier().expect("final barrier");
    }
    let _ = b.barrier();
    p2p.shutdown();
}
