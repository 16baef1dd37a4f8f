//! The network page faults of each size, side by side with Lesokhin17's:
//! where their time went (waiting for the driver thread, the OS's work, the modelled
//! firmware time of the `npf-model` profile) and their tail (50/95/99 %/max, Table 4's
//! columns).

use pagewire_transport::nic::CountersSnapshot;
use serde::Serialize;

/// The faults one side took while one size ran.
#[derive(Clone, Debug, Serialize)]
pub struct NpfRow {
    /// Message size.
    pub bytes: usize,
    /// `client` (the initiator: requester faults, resolved inline) or `server` (responder
    /// faults, resolved by its driver thread).
    pub side: &'static str,
    /// Faults resolved.
    pub faults: u64,
    /// Pages mapped per fault.
    pub pages_per_fault: f64,
    /// Mean time from filing the fault to the driver thread taking it up (µs).
    pub wait_us: f64,
    /// Mean OS work: mapping the pages and marking them present (µs).
    pub os_us: f64,
    /// Mean modelled firmware time (µs; 0 on the `real` profile).
    pub model_us: f64,
    /// Mean time from the fault to its resolution (µs).
    pub mean_us: f64,
    /// Percentiles of that time (µs): 50, 95, 99 and the maximum.
    pub p50_us: f64,
    /// 95th percentile (µs).
    pub p95_us: f64,
    /// 99th percentile (µs).
    pub p99_us: f64,
    /// Longest (µs).
    pub max_us: f64,
}

/// The rows of one size: one per side that took a fault.
pub fn rows(bytes: usize, client: &CountersSnapshot, server: &CountersSnapshot) -> Vec<NpfRow> {
    [("client", client), ("server", server)]
        .into_iter()
        .filter(|(_, c)| c.npf_count() > 0)
        .map(|(side, c)| NpfRow {
            bytes,
            side,
            faults: c.npf_count(),
            pages_per_fault: c.npf_pages as f64 / c.npf_count() as f64,
            wait_us: c.npf_part_mean_us(c.npf_wait_ns),
            os_us: c.npf_part_mean_us(c.npf_os_ns),
            model_us: c.npf_part_mean_us(c.npf_model_ns),
            mean_us: c.npf_part_mean_us(c.npf_resolve_ns),
            p50_us: c.npf_percentile_us(50.0),
            p95_us: c.npf_percentile_us(95.0),
            p99_us: c.npf_percentile_us(99.0),
            max_us: c.npf_max_ns as f64 / 1000.0,
        })
        .collect()
}

/// Prints the rows and Lesokhin17's figures under them.
pub fn print(rows: &[NpfRow], profile: &str, dash: &str) {
    if rows.is_empty() {
        return;
    }
    println!(" Network page faults per size; profile {profile}");
    println!(
        " {:<8} {:<7} {:>7} {:>11} {:>11} {:>9} {:>12} {:>11} {:>8} {:>8} {:>8} {:>8}",
        "#bytes",
        "side",
        "faults",
        "pages/fault",
        "wait[usec]",
        "OS[usec]",
        "model[usec]",
        "mean[usec]",
        "50%",
        "95%",
        "99%",
        "max"
    );
    for r in rows {
        println!(
            " {:<8} {:<7} {:>7} {:>11.1} {:>11.1} {:>9.1} {:>12.1} {:>11.1} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
            r.bytes,
            r.side,
            r.faults,
            r.pages_per_fault,
            r.wait_us,
            r.os_us,
            r.model_us,
            r.mean_us,
            r.p50_us,
            r.p95_us,
            r.p99_us,
            r.max_us
        );
    }
    println!(" wait: filed -> driver thread (responder faults); OS: map + mark present (real);");
    println!(
        " model: NIC firmware time added by the npf-model profile (Lesokhin17 Table 4 less 10 %)."
    );
    println!(
        " Lesokhin17 (Connect-IB, minor NPFs; Table 4, 50/95/99 %/max): 4 KB 215/250/261/464,"
    );
    println!(" 4 MB 352/431/440/687 usec; Fig. 3(a): 220 usec at 4 KB, 90 % hardware (firmware).");
    println!(" ODP13: a 4 KiB fault ~135 usec, a 4 MiB fault ~1 ms.");
    println!("{dash}");
}
