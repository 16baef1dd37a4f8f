//! Output in b_eff 3.6's layout: the head section and the summary file (`b_eff.sum`), the
//! per-length table of its protocol file (`SECTION-BY-MSGLNG`), and the one-line summary
//! it prints to stderr; plus the JSON form of a run.
//!
//! Bandwidths are printed in MByte/s = 10^6 bytes/s and memory in MB = 2^20 bytes, as b_eff
//! does.

use serde::{Deserialize, Serialize};

use crate::analysis::{Analysis, METHODS};
use crate::lengths::MESSAGE_LENGTHS;
use crate::measure::Method;
use crate::patterns::{Pattern, PatternKind};

/// The b_eff revision whose definition this follows.
pub const REVISION: &str = "3.6.0.1";
/// Its date.
pub const REVISION_DATE: &str = "Feb 02, 2016";

/// What `uname` says, for the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemInfo {
    /// Kernel name (`Linux`).
    pub sysname: String,
    /// Host name.
    pub nodename: String,
    /// Kernel release.
    pub release: String,
    /// Kernel version string.
    pub version: String,
    /// Machine architecture.
    pub machine: String,
}

impl SystemInfo {
    /// Reads `/proc/sys/kernel/{ostype,hostname,osrelease,version}` (what `uname(2)`
    /// returns) and the architecture this was built for.
    pub fn read() -> SystemInfo {
        let read = |name: &str| {
            std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
                .map(|s| s.trim_end().to_string())
                .unwrap_or_else(|_| "?".into())
        };
        SystemInfo {
            sysname: read("ostype"),
            nodename: read("hostname"),
            release: read("osrelease"),
            version: read("version"),
            machine: std::env::consts::ARCH.into(),
        }
    }
}

/// b_eff's name for how it was built: `SHORT`, `TEST`, `SHORT&TEST` or nothing.
pub fn variant(short: bool, test: bool) -> &'static str {
    match (short, test) {
        (true, true) => "SHORT&TEST",
        (true, false) => "SHORT",
        (false, true) => "TEST",
        (false, false) => "",
    }
}

/// One row of the per-length table, MByte/s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LengthRow {
    /// Message length, bytes.
    pub length: usize,
    /// b_eff at this length, accumulated over processes.
    pub accumulated: f64,
    /// The same per process.
    pub per_process: f64,
    /// Ring patterns only, per process.
    pub rings_per_process: f64,
    /// Random patterns only, per process.
    pub random_per_process: f64,
    /// Per method (Sendrecv, Alltoallv, Irecv+Isend+Waitall), per process.
    pub methods_per_process: [f64; METHODS],
}

/// The summary table's values (MByte/s, microseconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// b_eff, accumulated.
    pub b_eff: f64,
    /// b_eff per process.
    pub b_eff_per_process: f64,
    /// Lmax in bytes.
    pub lmax: usize,
    /// b_eff at Lmax, rings and random.
    pub at_lmax: f64,
    /// The same per process.
    pub at_lmax_per_process: f64,
    /// b_eff at Lmax, rings only.
    pub at_lmax_rings: f64,
    /// The same per process.
    pub at_lmax_rings_per_process: f64,
    /// Latency from rings and random patterns, us.
    pub latency_us: f64,
    /// Latency from ring patterns only, us.
    pub latency_rings_us: f64,
    /// Ping-pong latency of ranks 0 and 1, us (0 with one process).
    pub pingpong_latency_us: f64,
    /// Ping-pong bandwidth at Lmax, MByte/s (0 with one process).
    pub pingpong_bandwidth: f64,
}

/// Everything a run reports: what `--json` writes and `--mode all` reads back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The buffer mode (`copy`, `pindown`, `odp`), or `mpi` on the mpi transport.
    pub mode: String,
    /// `soft` (pagewire's transport) or `mpi` (the host MPI library).
    pub transport: String,
    /// Processes.
    pub processes: usize,
    /// `--memory-per-process`, MB.
    pub memory_per_process_mb: u64,
    /// `SHORT`, `TEST`, `SHORT&TEST` or empty.
    pub variant: String,
    /// The srand48 seed of the random patterns.
    pub seed: i64,
    /// Pattern names, in order.
    pub patterns: Vec<String>,
    /// The per-length table.
    pub lengths: Vec<LengthRow>,
    /// The summary table.
    pub summary: Summary,
    /// Whether the two largest lengths were measured with the best method only.
    pub shortened: bool,
    /// Seconds of the measurement loop.
    pub measurement_seconds: f64,
    /// Messages whose content was checked (every byte with `--verify`, else first and last).
    pub messages_checked: u64,
    /// Whether every byte was checked.
    pub verified: bool,
    /// Per length, what the buffer mode and the NIC did, summed over processes (pagewire's
    /// transport only; not read back).
    #[serde(default, skip_deserializing)]
    pub counters: Option<Vec<pagewire_tools::msgperf::RowCounters>>,
}

/// A value for JSON (which has no NaN): non-finite values become 0.
fn finite(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

/// The per-length rows of `a` (MByte/s).
pub fn length_rows(a: &Analysis, lengths: &[usize; MESSAGE_LENGTHS]) -> Vec<LengthRow> {
    let per = |v: f64| finite(v / 1e6 / a.processes as f64);
    lengths
        .iter()
        .enumerate()
        .map(|(msg, &length)| LengthRow {
            length,
            accumulated: finite(a.per_length[msg].both / 1e6),
            per_process: per(a.per_length[msg].both),
            rings_per_process: per(a.per_length[msg].rings),
            random_per_process: per(a.per_length[msg].random),
            methods_per_process: std::array::from_fn(|m| per(a.per_method_length[m][msg].both)),
        })
        .collect()
}

/// The summary values of `a` with largest message `lmax`.
pub fn summary(a: &Analysis, lmax: usize) -> Summary {
    let n = a.processes as f64;
    Summary {
        b_eff: finite(a.b_eff() / 1e6),
        b_eff_per_process: finite(a.b_eff() / 1e6 / n),
        lmax,
        at_lmax: finite(a.at_lmax() / 1e6),
        at_lmax_per_process: finite(a.at_lmax() / 1e6 / n),
        at_lmax_rings: finite(a.at_lmax_rings() / 1e6),
        at_lmax_rings_per_process: finite(a.at_lmax_rings() / 1e6 / n),
        latency_us: finite(a.latency() * 1e6),
        latency_rings_us: finite(a.latency_rings() * 1e6),
        pingpong_latency_us: a.pingpong_latency * 1e6,
        pingpong_bandwidth: a.pingpong_bandwidth / 1e6,
    }
}

/// The head section: revision, memory, lengths, methods and patterns.
pub fn head(memory_mb: u64, lengths: &[usize; MESSAGE_LENGTHS], patterns: &[Pattern]) -> String {
    let mut s = String::from("\nSECTION-HEAD-BEGIN\n\n");
    s += &format!(
        "beff (pagewire {}), after b_eff.c, Revision {REVISION} from {REVISION_DATE}\n\n",
        env!("CARGO_PKG_VERSION")
    );
    s += &format!("MEMORY_PER_PROCESSOR = {memory_mb} MBytes  [1M = 1024*1024]\n");
    s += "Used message lengths:\nmsglng=";
    for l in lengths {
        s += &format!(" {l}");
    }
    s += "\nUsed methods:";
    for (i, m) in Method::ALL.iter().enumerate() {
        s += &format!("  {i}={}", m.label());
    }
    s += "\nUsed patterns:";
    for (i, p) in patterns.iter().enumerate() {
        if i % 4 == 0 && i > 0 {
            s += "\n              ";
        }
        s += &format!(" {i:2}={:<17}", p.description);
    }
    s += "\n\n";
    let range = |kind: PatternKind| {
        let idx: Vec<usize> = (0..patterns.len())
            .filter(|&i| patterns[i].kind == kind)
            .collect();
        match (idx.first(), idx.last()) {
            (Some(a), Some(b)) if a == b => format!("{a}"),
            (Some(a), Some(b)) => format!("{a}-{b}"),
            _ => "-".into(),
        }
    };
    s += &format!(
        "               {:<6}used for ring pattern average of b_eff\n",
        range(PatternKind::Ring)
    );
    s += &format!(
        "               {:<6}used for random pattern average of b_eff\n",
        range(PatternKind::Random)
    );
    s += &format!(
        "               {:<6}only reported, not used for b_eff average\n",
        range(PatternKind::PingPongPair)
    );
    s += "\nSECTION-HEAD-END\n\n";
    s
}

/// The per-length table of b_eff's protocol file (its 5th analysis path).
pub fn length_table(rows: &[LengthRow], shortened: bool) -> String {
    let mut s = String::from("\nSECTION-BY-MSGLNG-BEGIN\n\n");
    s += "\n5th analysis path only as information:\n\
          logavg_pat ( max_mthd ( max_rep ( b(L) ) ) )\n\
          and for all methods: logavg_pat ( max_rep ( b(L) ) )\n";
    s += "\nmsg length|accumulated| effective bandwidth per process:\n";
    s += "          |  effective| average    rings   random";
    for m in 0..METHODS {
        s += &format!(" method_{m}");
    }
    s += "\n          |  bandwidth| crt,rnd     only     only";
    for m in Method::ALL {
        s += &format!("  {:>7}", m.label());
    }
    s += "\n";
    for r in rows {
        s += &format!(
            " {:9}  {:10.3} {:8.3} {:8.3} {:8.3}",
            r.length, r.accumulated, r.per_process, r.rings_per_process, r.random_per_process
        );
        for v in r.methods_per_process {
            s += &format!(" {v:8.3}");
        }
        s += "\n";
    }
    if shortened {
        s += CAUTION;
    }
    s += "\nSECTION-BY-MSGLNG-END\n\n";
    s
}

/// b_eff's note when the two largest lengths were measured with one method only.
const CAUTION: &str =
    "\n CAUTION! Due to performance reasons the two largest messages are shortened.\n \
In detail that means: Only the best method is used and only two repetitions are performed.\n \
The values are copied to the other methods. This behavior has no effect to the b_eff value,\n \
but a comparison between the methods makes no sense. If you need these tables because you want\n \
to compare the methods please use --no-short-last-two.\n";

/// The summary section of b_eff's `.sum` file, from `system parameters` to
/// `SECTION-BEFF-END`.
pub fn summary_section(r: &RunReport, info: &SystemInfo, date: &str, total_seconds: f64) -> String {
    let s = &r.summary;
    let mut out = format!(
        "system parameters  : {} nodes, {} MB/node\n",
        r.processes, r.memory_per_process_mb
    );
    out += &format!("       system name : {}\n", info.sysname);
    out += &format!("       hostname    : {}\n", info.nodename);
    out += &format!("       OS release  : {}\n", info.release);
    out += &format!("       OS version  : {}\n", info.version);
    out += &format!("       machine     : {}\n\n", info.machine);
    out += &format!("Date of measurement: {date}\n\n");
    out += &format!("Total execution wall clock time = {total_seconds:5.0} seconds\n\n");
    out += "            | number  |   b_eff   |  Lmax  |   b_eff   |   b_eff   | Latency | Latency | Latency | ping-pong  \n";
    out += "            | of pro  |           |        |  at Lmax  |  at Lmax  | rings & |  rings  |  ping-  | bandwith   \n";
    out += "            | cessors |           |        |  rings &  |   rings   | random  |  only   |  pong   |            \n";
    out += "            |         |           |        |  random   |   only    | micro-  | micro-  | micro-  |            \n";
    out += "            |         |  MByte/s  |        |  MByte/s  |  MByte/s  |  sec    |  sec    |  sec    |  MByte/s   \n";
    out += &"-".repeat(110);
    out += "\n";
    let blank = format!("            |{}\n", " ".repeat(97));
    out += &blank;
    out += &format!(
        "accumulated |  {:5}    {:9.0}   {:3.0} MB  {:9.0}    {:9.0}    {:6.3}    {:6.3}    {:6.3}    {:9.0}                    \n",
        r.processes,
        s.b_eff,
        s.lmax as f64 / (1024.0 * 1024.0),
        s.at_lmax,
        s.at_lmax_rings,
        s.latency_us,
        s.latency_rings_us,
        s.pingpong_latency_us,
        s.pingpong_bandwidth
    );
    out += &blank;
    out += &format!(
        "per process |           {:9.0}           {:9.0}    {:9.0}                                                      \n\n",
        s.b_eff_per_process, s.at_lmax_per_process, s.at_lmax_rings_per_process
    );
    out += "\nSECTION-BEFF-END\n\n";
    out
}

/// b_eff's one-line summary (`b_eff = ... MB/s = ... * N PEs with M MB/PE on ...`).
pub fn summary_line(r: &RunReport, info: &SystemInfo) -> String {
    format!(
        "b_eff{} = {:10.3} MB/s = {:7.3} * {:3} PEs with {:3} MB/PE on {} {} {} {} {}",
        r.variant,
        r.summary.b_eff,
        r.summary.b_eff_per_process,
        r.processes,
        r.memory_per_process_mb,
        info.sysname,
        info.nodename,
        info.release,
        info.version,
        info.machine
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference run's summary values, to compare the layout line by line.
    fn reference_report() -> RunReport {
        RunReport {
            mode: "copy".into(),
            transport: "soft".into(),
            processes: 2,
            memory_per_process_mb: 128,
            variant: "SHORT&TEST".into(),
            seed: 0,
            patterns: Vec::new(),
            lengths: Vec::new(),
            summary: Summary {
                b_eff: 3831.865,
                b_eff_per_process: 1915.933,
                lmax: 1 << 20,
                at_lmax: 10325.0,
                at_lmax_per_process: 5162.4,
                at_lmax_rings: 10382.0,
                at_lmax_rings_per_process: 5191.0,
                latency_us: 0.279,
                latency_rings_us: 0.277,
                pingpong_latency_us: 0.225,
                pingpong_bandwidth: 5947.0,
            },
            shortened: false,
            measurement_seconds: 0.0,
            messages_checked: 0,
            verified: false,
            counters: None,
        }
    }

    fn reference_info() -> SystemInfo {
        SystemInfo {
            sysname: "Linux".into(),
            nodename: "vm".into(),
            release: "6.18.44-fc-v669".into(),
            version: "#1 SMP PREEMPT_DYNAMIC @0".into(),
            machine: "x86_64".into(),
        }
    }

    /// `b_eff.sum` of the reference run (shared/reference/beff-mpich-2ranks-short-test.sum:
    /// b_eff 3.6.0.1 with -DSHORT -DTEST, 128 MB, 2 ranks of MPICH 4.0.2).
    const REFERENCE_SUM: &str = r#"
SECTION-HEAD-BEGIN

b_eff.c, Revision 3.6.0.1 from Feb 02, 2016

MEMORY_PER_PROCESSOR = 128 MBytes  [1M = 1024*1024]
2-dim-patterns: size = 2 * 1
3-dim-patterns: size = 2 * 1 * 1
Used message lengths:
msglng= 1 2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536 131072 262144 524288 1048576
Used methods:  0=Sndrcv  1=Alltoal  2=non-blk
Used patterns:  0=ring-1*2fix        1=ring-1*2fix        2=ring-1*2fix        3=ring-1*2fix      
                4=ring-1*2fix        5=ring-1*2fix        6=random-cyc-1dim    7=random-cyc-1dim  
                8=worst-cyc-1dim     9=best  bi-section  10=worst bi-section  11=one PingPong Pair
               12=acyclic-2dim-all  13=acyclic-3dim-all  14=cyclic-2dim-x     15=cyclic-2dim-all  
               16=cyclic-3dim-x     17=cyclic-3dim-all  

               0-5   used for ring pattern average of b_eff
               6-35  used for random pattern average of b_eff
               36-47 only reported, not used for b_eff average

SECTION-HEAD-END

system parameters  : 2 nodes, 128 MB/node
       system name : Linux
       hostname    : vm
       OS release  : 6.18.44-fc-v669
       OS version  : #1 SMP PREEMPT_DYNAMIC @0
       machine     : x86_64

Date of measurement: Sun Nov 22 05:34:38 2026

Total execution wall clock time =     0 seconds

            | number  |   b_eff   |  Lmax  |   b_eff   |   b_eff   | Latency | Latency | Latency | ping-pong  
            | of pro  |           |        |  at Lmax  |  at Lmax  | rings & |  rings  |  ping-  | bandwith   
            | cessors |           |        |  rings &  |   rings   | random  |  only   |  pong   |            
            |         |           |        |  random   |   only    | micro-  | micro-  | micro-  |            
            |         |  MByte/s  |        |  MByte/s  |  MByte/s  |  sec    |  sec    |  sec    |  MByte/s   
--------------------------------------------------------------------------------------------------------------
            |                                                                                                 
accumulated |      2         3832     1 MB      10325        10382     0.279     0.277     0.225         5947                    
            |                                                                                                 
per process |                1916                5162         5191                                                      


SECTION-BEFF-END

b_effSHORT&TEST =   3831.865 MB/s = 1915.933 *   2 PEs with 128 MB/PE on Linux vm 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0 x86_64
"#;

    #[test]
    fn summary_matches_the_reference_file_line_by_line() {
        let text = summary_section(
            &reference_report(),
            &reference_info(),
            "Sun Nov 22 05:34:38 2026",
            0.0,
        ) + &summary_line(&reference_report(), &reference_info())
            + "\n";
        let start = REFERENCE_SUM.find("system parameters").unwrap();
        assert_eq!(text, &REFERENCE_SUM[start..]);
    }

    #[test]
    fn head_lays_out_patterns_as_b_eff() {
        let patterns = crate::patterns::all_patterns(2, 2, 1);
        let (lengths, _) = crate::lengths::message_lengths(1 << 20);
        let text = head(128, &lengths, &patterns);
        let reference: Vec<&str> = REFERENCE_SUM.lines().collect();
        let ours: Vec<&str> = text.lines().collect();
        // Identical: the memory, lengths and methods lines, and the first pattern line.
        for line in [5, 8, 9, 10, 11] {
            assert!(
                ours.contains(&reference[line]),
                "{}\n{text}",
                reference[line]
            );
        }
        assert!(ours.contains(&"               0-5   used for ring pattern average of b_eff"));
        assert!(ours.contains(&"               6-7   used for random pattern average of b_eff"));
        assert!(ours.contains(&"               8     only reported, not used for b_eff average"));
        assert!(
            ours.contains(&"                8=one PingPong Pair"),
            "{text}"
        );
    }

    #[test]
    fn length_table_has_b_eff_columns() {
        let row = LengthRow {
            length: 1048576,
            accumulated: 10325.123,
            per_process: 5162.5616,
            rings_per_process: 5191.0,
            random_per_process: 5134.2,
            methods_per_process: [5000.0, 4000.0, 5100.0],
        };
        let t = length_table(&[row], false);
        assert!(
            t.contains(
                "\n   1048576   10325.123 5162.562 5191.000 5134.200 5000.000 4000.000 5100.000\n"
            ),
            "{t}"
        );
        assert!(t.contains(
            "          |  bandwidth| crt,rnd     only     only   Sndrcv  Alltoal  non-blk\n"
        ));
    }
}
