//! `pw-perftest`: the NIC-level perftest of pagewire (after `ib_write_bw`, `ib_write_lat`,
//! `ib_read_bw`, `ib_read_lat`, `ib_send_lat`). Started without a launcher it starts itself
//! on two ranks through the built-in one.

use clap::Parser;
use pagewire_tools::perftest::{self, FaultKind, InjectedFaults, MrMode, PerftestConfig, TestKind};
use pagewire_transport::boot;
use pagewire_transport::nic::soft::{SoftConfig, SoftNic};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "RDMA perftest of pagewire's NIC (two ranks; starts itself under pwrun)"
)]
struct Args {
    /// The test to run.
    #[arg(value_enum)]
    test: TestKind,
    /// Message size in bytes; a comma-separated list runs several sizes.
    #[arg(
        long,
        short = 's',
        conflicts_with = "all",
        value_delimiter = ',',
        default_value = "65536"
    )]
    size: Vec<usize>,
    /// Every size from 2 B to 8 MiB, doubling.
    #[arg(long, short = 'a')]
    all: bool,
    /// Iterations per size (default 5000 for bandwidth, 1000 for latency, capped per size).
    #[arg(long, short = 'n')]
    iters: Option<usize>,
    /// How buffers are registered.
    #[arg(long, value_enum, default_value_t = MrMode::Pinned)]
    mr: MrMode,
    /// Fresh buffers every iteration (ODP faults every time; pinned registers every time).
    #[arg(long)]
    cold: bool,
    /// With --cold: the CPU writes every fresh buffer before the NIC sees it, so a network
    /// page fault finds its pages in memory and only maps them for the NIC (Lesokhin17's
    /// "minor" NPF, Table 4); without it the fault also allocates and zeroes them.
    #[arg(long, requires = "cold")]
    resident: bool,
    /// Outstanding work requests in bandwidth tests.
    #[arg(long, short = 't', default_value_t = 128)]
    tx_depth: usize,
    /// send_bw: receives posted at once (perftest's rx_depth).
    #[arg(long, default_value_t = 512)]
    rx_depth: usize,
    /// send_bw: one receive in N lands on memory the NIC has never mapped, a receive-side
    /// network page fault (handled as PAGEWIRE_SOFT_RNPF says).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    rnpf_every: Option<u64>,
    /// send_bw: the kind of injected fault.
    #[arg(long, value_enum, default_value_t = FaultKind::Minor, requires = "rnpf_every")]
    rnpf_kind: FaultKind,
    /// send_bw: where the file of major faults is made (a directory on a disk, not tmpfs).
    #[arg(long, default_value = ".", requires = "rnpf_every")]
    rnpf_dir: std::path::PathBuf,
    /// send_bw: the receive ring starts unmapped, without the warm-up pass (Lesokhin17
    /// Fig. 4's cold ring); prints the receiver's throughput over time.
    #[arg(long)]
    cold_ring: bool,
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn main() -> std::process::ExitCode {
    pagewire::environment::exit_code("pw-perftest", run())
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    // A bad PAGEWIRE_* setting is reported once, here, not by both ranks started below.
    SoftConfig::from_env()?;
    if let Some(code) = boot::self_launch(2)? {
        std::process::exit(code);
    }
    let boot = boot::from_env()?;
    let nic = SoftNic::new(&*boot, SoftConfig::from_env()?)?;
    let cfg = PerftestConfig {
        test: args.test,
        sizes: if args.all {
            perftest::all_sizes()
        } else {
            args.size.clone()
        },
        iters: args.iters,
        mr: args.mr,
        cold: args.cold,
        resident: args.resident,
        tx_depth: args.tx_depth,
        rx_depth: args.rx_depth,
        rnpf: args.rnpf_every.map(|every| InjectedFaults {
            every: every as usize,
            kind: args.rnpf_kind,
            dir: args.rnpf_dir.clone(),
        }),
        cold_ring: args.cold_ring,
    };
    let placement = pagewire_tools::placement::gather_boot(&*boot)?;
    if let Some(mut report) = perftest::run(&*boot, &nic, &cfg)? {
        report.placement = placement;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            perftest::print(&report, args.iters.is_none());
        }
    }
    Ok(())
}
