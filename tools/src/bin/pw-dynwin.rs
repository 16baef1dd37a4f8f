//! `pw-dynwin`: a dynamic window whose attached memory changes, the use implicit ODP was
//! made for. Step by step, rank 0 attaches a freshly allocated region, the other ranks put
//! into it under its lock, and rank 0 detaches it again: in `copy` and `pindown` each
//! attach registers and pins the region and each detach unpins it, in `odp` the window
//! registered the whole address space once and an attach only publishes the region (and
//! prefetches its pages). Prints, per region size, the time of each part of a step and
//! what was registered and pinned. Started without a launcher it starts itself.

use std::time::Instant;

use clap::Parser;
use pagewire::traits::*;
use pagewire::window::Window;
use pagewire::SystemOperation;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "A dynamic window whose attached regions change: attach, put, detach per step, with what each buffer mode registers and pins"
)]
struct Args {
    /// Region sizes in bytes (a list; K, M and G suffixes).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4K,64K,1M,16M")]
    sizes: Vec<usize>,
    /// Steps per size (each: attach, puts, detach); the first tenth are a warm-up.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Ranks to start when not under a launcher (rank 0 attaches, the others put).
    #[arg(long, default_value_t = 2)]
    np: usize,
}

fn parse_size(s: &str) -> Result<usize, String> {
    match pagewire::nic::soft::parse_bytes(s) {
        Some(Some(n)) if n > 0 => Ok(n as usize),
        _ => Err(format!("{s}: expected bytes like 65536 or 64K")),
    }
}

fn main() -> std::process::ExitCode {
    pagewire::environment::exit_code("pw-dynwin", run())
}

/// Per step, in microseconds: attach, the origins' locked put (the slowest origin's), detach.
#[derive(Default)]
struct Times {
    attach: Vec<f64>,
    put: Vec<f64>,
    detach: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.steps >= 2, "--steps {}: at least 2", args.steps);
    pagewire::UniverseConfig::from_env()?;
    if let Some(code) = pagewire::boot::self_launch(args.np)? {
        std::process::exit(code);
    }
    let universe = pagewire::try_initialize()?.expect("first initialisation");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    anyhow::ensure!(size >= 2, "pw-dynwin needs at least 2 ranks, got {size}");
    let root = world.process_at_rank(0);
    // In the loop an error panics (the panicking forms): the rank ends at once and the
    // launcher stops the job, where returning it would free the window collectively while
    // the other ranks wait in the step.
    let win = Window::<u8>::try_create_dynamic(&world)?;
    let created = win.counters();
    if rank == 0 {
        println!(
            "# Dynamic window: rank 0 attaches a fresh region, {} origin(s) each put it whole \
             under rank 0's lock, rank 0 detaches it; {} steps per size, medians of the last \
             {}; mode {}",
            size - 1,
            args.steps,
            args.steps - args.steps / 10,
            universe.mode_name()
        );
        println!(
            "# at creation rank 0 made {} registration(s) of {} bytes, {} bytes pinned",
            created.registrations, created.bytes_registered, created.bytes_pinned
        );
        println!(
            "{:>10} {:>6} {:>13} {:>13} {:>13} {:>13} {:>15} {:>14} {:>10} {:>10}",
            "#bytes",
            "steps",
            "attach[usec]",
            "put[usec]",
            "detach[usec]",
            "step[usec]",
            "pinned_peak[B]",
            "registrations",
            "npf",
            "prefetched"
        );
    }
    for &bytes in &args.sizes {
        let data = vec![rank as u8; bytes];
        let before = win.counters();
        let nic_before = universe.try_with_p2p(|p| p.nic_counters()).ok();
        let mut times = Times::default();
        let warm = args.steps / 10;
        world.barrier();
        let started = Instant::now();
        for step in 0..args.steps {
            if rank == 0 {
                let t = Instant::now();
                let region = win.attach(vec![0u8; bytes]);
                let attach = t.elapsed().as_secs_f64() * 1e6;
                root.broadcast_into(&mut (region.address() as u64));
                let mut slowest = 0.0f64;
                world.all_reduce_into(&0.0f64, &mut slowest, SystemOperation::max());
                let t = Instant::now();
                let back = win.detach(region);
                let detach = t.elapsed().as_secs_f64() * 1e6;
                drop(back);
                if step >= warm {
                    times.attach.push(attach);
                    times.put.push(slowest);
                    times.detach.push(detach);
                }
            } else {
                let mut at = 0u64;
                root.broadcast_into(&mut at);
                let t = Instant::now();
                win.lock_shared(0);
                win.put(0, at as usize, &data);
                win.unlock(0);
                let put = t.elapsed().as_secs_f64() * 1e6;
                let mut slowest = 0.0f64;
                world.all_reduce_into(&put, &mut slowest, SystemOperation::max());
            }
        }
        let total = started.elapsed().as_secs_f64() * 1e6 / args.steps as f64;
        if rank == 0 {
            let c = win.counters();
            let nic = universe
                .try_with_p2p(|p| p.nic_counters())
                .ok()
                .zip(nic_before);
            let (npf, prefetched) = nic.map_or((0, 0), |(now, was)| {
                (
                    now.npf_responder - was.npf_responder,
                    now.prefetch_pages - was.prefetch_pages,
                )
            });
            println!(
                "{:>10} {:>6} {:>13.2} {:>13.2} {:>13.2} {:>13.2} {:>15} {:>14} {:>10} {:>10}",
                bytes,
                args.steps,
                median(&mut times.attach),
                median(&mut times.put),
                median(&mut times.detach),
                total,
                c.peak_bytes_pinned,
                c.registrations - before.registrations,
                npf,
                prefetched
            );
        }
    }
    win.try_free()?;
    Ok(())
}
