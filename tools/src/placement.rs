//! Where each rank runs, for the benchmarks' headers: its CPU set and NUMA node (read with
//! `sched_getaffinity` in the rank itself), whether the launcher bound it, and how its
//! pinned pools were placed.

use pagewire::traits::*;
use pagewire::SimpleCommunicator;
use pagewire_transport::boot::binding::{self, Placement};
use pagewire_transport::boot::Bootstrap;

/// Bytes a rank's line may take on the wire (longer lines are cut).
const LINE_BYTES: usize = 200;

/// This rank's description: `cpus 0 (NUMA node 0), bound by pwrun --bind-to core`, and with
/// `pools` how the message layer's pinned pools were placed.
pub fn this_rank(pools: bool) -> String {
    let mut line = match Placement::of_this_process() {
        Ok(p) => p.to_string(),
        Err(e) => format!("placement unknown ({e})"),
    };
    if pools {
        line.push_str("; ");
        line.push_str(&binding::memory_report());
    }
    line
}

fn encode(line: &str) -> [u8; LINE_BYTES] {
    let mut buf = [0u8; LINE_BYTES];
    let mut n = line.len().min(LINE_BYTES);
    while !line.is_char_boundary(n) {
        n -= 1;
    }
    buf[..n].copy_from_slice(&line.as_bytes()[..n]);
    buf
}

fn decode(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Every rank's line, in rank order, gathered over `world` (collective: every rank calls it).
pub fn gather_world(world: &SimpleCommunicator) -> Vec<String> {
    let mine = encode(&this_rank(true));
    let mut all = vec![0u8; LINE_BYTES * world.size() as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    all.chunks(LINE_BYTES).map(decode).collect()
}

/// Every rank's line, in rank order, gathered through the bootstrap (collective).
pub fn gather_boot(boot: &dyn Bootstrap) -> pagewire_transport::Result<Vec<String>> {
    let mine = this_rank(false);
    Ok(boot
        .allgather(mine.as_bytes())?
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect())
}

/// Prints the lines as a header: `# rank R: ...`.
pub fn print(lines: &[String]) {
    for (rank, line) in lines.iter().enumerate() {
        println!("# rank {rank}: {line}");
    }
}
