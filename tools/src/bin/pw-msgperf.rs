//! `pw-msgperf`: ping-pong and streaming bandwidth of pagewire's message layer in IMB
//! PingPong's format. Started without a launcher it starts itself on two ranks.

use clap::Parser;
use pagewire::traits::*;
use pagewire_tools::msgperf::{self, Kernel};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Message-layer ping-pong and streaming bandwidth (IMB PingPong columns)"
)]
struct Args {
    /// Kernels to run (default: both).
    #[arg(value_enum)]
    kernels: Vec<Kernel>,
    /// Sizes 0 and 2^MIN..2^MAX bytes.
    #[arg(long, default_value = "0:22")]
    msglog: String,
    /// Repetitions per size (default: IMB's min(1000, 40 MiB / size)).
    #[arg(long)]
    iters: Option<usize>,
    /// Messages in flight per window in the streaming test.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Rotate through buffers spanning this many bytes (IMB `-off_cache`; e.g. 32M).
    #[arg(long, value_parser = parse_size)]
    off_cache: Option<usize>,
    /// Order of the off-cache buffers: IMB's rotation, or Zipf-distributed reuse.
    #[arg(long, value_enum, default_value_t = msgperf::Pattern::Cyclic)]
    pattern: msgperf::Pattern,
    /// Discard every buffer's pages before each repetition (untimed), so each message's
    /// first touch — CPU page faults, ODP network page faults, pin-down misses — is timed.
    #[arg(long)]
    cold: bool,
    /// PingPong with a buffer with gaps: each message's bytes in runs of RUN bytes, HOLE
    /// bytes apart (an MPI vector of bytes), e.g. `16K:4K`. Not with --off-cache or --cold.
    #[arg(long, value_parser = parse_vector, value_name = "RUN:HOLE")]
    vector: Option<(usize, usize)>,
    /// The calls PingPong makes: the rsmpi-shaped API's `send`/`receive_into`, or the
    /// message layer's `send`/`recv` beneath them (what the API adds is the difference).
    #[arg(long, value_enum, default_value_t = msgperf::Layer::Api)]
    layer: msgperf::Layer,
    /// Ranks to start when not under a launcher.
    #[arg(long, default_value_t = 2)]
    np: usize,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<usize, String> {
    match pagewire::nic::soft::parse_bytes(s) {
        Some(Some(n)) => Ok(n as usize),
        _ => Err(format!("{s}: expected bytes like 33554432 or 32M")),
    }
}

fn parse_vector(s: &str) -> Result<(usize, usize), String> {
    let (run, hole) = s
        .split_once(':')
        .ok_or_else(|| format!("{s}: expected RUN:HOLE, e.g. 16K:4K"))?;
    let run = parse_size(run)?;
    if run == 0 {
        return Err(format!("{s}: a run of 0 bytes"));
    }
    Ok((run, parse_size(hole)?))
}

fn main() -> std::process::ExitCode {
    pagewire::environment::exit_code("pw-msgperf", run())
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let (min, max) = args
        .msglog
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .filter(|(a, b)| a <= b && *b <= 30)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--msglog {}: expected MIN:MAX with MIN <= MAX <= 30",
                args.msglog
            )
        })?;
    anyhow::ensure!(
        args.vector.is_none() || (args.off_cache.is_none() && !args.cold),
        "--vector runs without --off-cache and --cold"
    );
    anyhow::ensure!(
        args.layer == msgperf::Layer::Api
            || (args.vector.is_none()
                && !args.kernels.is_empty()
                && args.kernels.iter().all(|k| *k == Kernel::Pingpong)),
        "--layer message runs the pingpong kernel only (name it), without --vector"
    );
    // A bad PAGEWIRE_* setting is reported once, here, not by every rank started below.
    pagewire::UniverseConfig::from_env()?;
    if let Some(code) = pagewire::boot::self_launch(args.np)? {
        std::process::exit(code);
    }
    let universe = pagewire::try_initialize()?.expect("first initialisation");
    let world = universe.world();
    anyhow::ensure!(
        world.size() >= 2,
        "pw-msgperf needs at least 2 ranks, got {}",
        world.size()
    );
    let placement = pagewire_tools::placement::gather_world(&world);
    if world.rank() == 0 && !args.json {
        pagewire_tools::placement::print(&placement);
    }
    let kernels = if args.kernels.is_empty() {
        vec![Kernel::Pingpong, Kernel::Stream]
    } else {
        args.kernels.clone()
    };
    let sizes = msgperf::msglog_sizes(min, max);
    let mut all = Vec::new();
    for k in kernels {
        if k == Kernel::Footprint {
            if let Some([(rss0, lck0), (rss1, lck1)]) = msgperf::footprint(&world) {
                let mib = |b: u64| b as f64 / (1 << 20) as f64;
                println!(
                    "# Footprint after using 64 MiB of a 1 GiB buffer (mode {})",
                    universe.mode_name()
                );
                println!(
                    "#   rank 0: resident {:.1} MiB, pinned {:.1} MiB",
                    mib(rss0),
                    mib(lck0)
                );
                println!(
                    "#   rank 1: resident {:.1} MiB, pinned {:.1} MiB",
                    mib(rss1),
                    mib(lck1)
                );
            }
            continue;
        }
        let rows = msgperf::run(
            &universe,
            k,
            &sizes,
            msgperf::RunOptions {
                iters: args.iters,
                window: args.window,
                off_cache: args.off_cache,
                pattern: args.pattern,
                cold: args.cold,
                vector: args.vector,
                layer: args.layer,
            },
        );
        if world.rank() == 0 {
            let mut name = match (k, args.off_cache) {
                (Kernel::Pingpong, None) => "PingPong".to_string(),
                (Kernel::Pingpong, Some(s)) => match args.pattern {
                    msgperf::Pattern::Cyclic => {
                        format!("PingPong (off_cache: rotating over {s} bytes)")
                    }
                    msgperf::Pattern::Zipf => {
                        format!("PingPong (off_cache: Zipf-distributed buffers over {s} bytes)")
                    }
                },
                (_, _) => "Stream (window of nonblocking sends)".to_string(),
            };
            if args.layer == msgperf::Layer::Message {
                name.push_str(" (message layer: send and recv beneath the API)");
            }
            if args.cold && k == Kernel::Pingpong {
                name.push_str(" (cold: pages discarded before each repetition)");
            }
            if !args.json {
                msgperf::print(&name, world.size(), &rows);
                msgperf::print_counters(&rows);
            }
            all.push((k, rows));
        }
    }
    // The mpi transport has no pagewire counters: nothing more to say there.
    let report = universe.try_with_p2p(|p| {
        (
            (p.mode_name(), p.local_path()),
            p.eager_limit(),
            p.counters(),
            p.mode_counters(),
            p.nic_counters(),
        )
    });
    if let (0, Ok(((mode, path), eager, counters, mode_counters, nic))) = (world.rank(), report) {
        if args.json {
            let v = serde_json::json!({
                "mode": mode,
                "local_path": path,
                "layer": args.layer,
                "eager_limit": eager,
                "placement": placement,
                "results": all.iter().map(|(k, r)| serde_json::json!({"kernel": k, "rows": r})).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            println!(
                "# mode {mode}, ranks of one host through {path}, eager limit {eager} B; rank 0: \
                 {counters:?}"
            );
            println!("# mode counters: {mode_counters:?}");
            println!(
                "# NIC (rank 0): RNR NACKs sent {}, RNR retries {}, bytes by CMA {}, staged {}, pinned peak {}",
                nic.rnr_nacks_sent, nic.rnr_retries, nic.bytes_cma, nic.bytes_staged, nic.pinned_peak
            );
        }
    }
    Ok(())
}
