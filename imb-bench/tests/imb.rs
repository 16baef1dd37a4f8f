//! imb-bench against IMB-MPI1: the output layout checked with lines of a real IMB-MPI1
//! 2021.11 run (shared/reference/imb-mpi1-mpich-2ranks.txt), the off_cache rotation, and
//! every benchmark on 1 to 4 ranks in every buffer mode through the built-in launcher.

use std::collections::HashSet;
use std::process::Command;

use imb_bench::bench::Benchmark;
use imb_bench::output::{self, Layout, RowValues};
use imb_bench::run::Buffers;
use imb_bench::settings::{Iterations, OffCache};

/// Lines of the reference IMB-MPI1 output, verbatim (trailing spaces included).
const REF_PINGPONG_HEADER: &str = "
#---------------------------------------------------
# Benchmarking PingPong 
# #processes = 2 
#---------------------------------------------------
       #bytes #repetitions      t[usec]   Mbytes/sec";
const REF_PINGPONG_ROW: &str = "        65536          640         9.50      6898.36";
const REF_SENDRECV_HEADER: &str = "
#-----------------------------------------------------------------------------
# Benchmarking Sendrecv 
# #processes = 2 
#-----------------------------------------------------------------------------
       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]   Mbytes/sec";
const REF_SENDRECV_ROW: &str =
    "      4194304           10       439.65       439.68       439.67     19078.76";
const REF_ALLREDUCE_HEADER: &str = "
#----------------------------------------------------------------
# Benchmarking Allreduce 
# #processes = 2 
#----------------------------------------------------------------
       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]";
const REF_ALLREDUCE_ROW: &str = "      2097152           20      1379.10      1379.78      1379.44";
const REF_BARRIER: &str = "
#---------------------------------------------------
# Benchmarking Barrier 
# #processes = 2 
#---------------------------------------------------
 #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]
         1000         1.52         1.52         1.52";

#[test]
fn table_layout_matches_imb_byte_for_byte() {
    assert_eq!(
        output::table_header(Benchmark::PingPong, 2, 2),
        REF_PINGPONG_HEADER
    );
    let pingpong = RowValues {
        bytes: 65536,
        repetitions: 640,
        t_min: 9.4,
        t_max: 9.5,
        t_avg: 9.45,
        mbytes_per_sec: 6898.36,
        t_overlap: 0.0,
    };
    assert_eq!(
        output::row(Layout::TimeAndBandwidth, &pingpong),
        REF_PINGPONG_ROW
    );
    assert_eq!(
        output::table_header(Benchmark::Sendrecv, 2, 2),
        REF_SENDRECV_HEADER
    );
    let sendrecv = RowValues {
        bytes: 4194304,
        repetitions: 10,
        t_min: 439.65,
        t_max: 439.68,
        t_avg: 439.67,
        mbytes_per_sec: 19078.76,
        t_overlap: 0.0,
    };
    assert_eq!(
        output::row(Layout::TimeRangeAndBandwidth, &sendrecv),
        REF_SENDRECV_ROW
    );
    assert_eq!(
        output::table_header(Benchmark::Allreduce, 2, 2),
        REF_ALLREDUCE_HEADER
    );
    let allreduce = RowValues {
        bytes: 2097152,
        repetitions: 20,
        t_min: 1379.1,
        t_max: 1379.78,
        t_avg: 1379.44,
        mbytes_per_sec: 0.0,
        t_overlap: 0.0,
    };
    assert_eq!(
        output::row(Layout::TimeRange, &allreduce),
        REF_ALLREDUCE_ROW
    );
    let barrier = RowValues {
        bytes: 0,
        repetitions: 1000,
        t_min: 1.52,
        t_max: 1.52,
        t_avg: 1.52,
        mbytes_per_sec: 0.0,
        t_overlap: 0.0,
    };
    assert_eq!(
        format!(
            "{}\n{}",
            output::table_header(Benchmark::Barrier, 2, 2),
            output::row(Layout::Sync, &barrier)
        ),
        REF_BARRIER
    );
    // Idle processes, as IMB prints them.
    let h = output::table_header(Benchmark::PingPong, 2, 4);
    assert!(
        h.contains("# #processes = 2 \n# ( 2 additional processes waiting in MPI_Barrier)\n#---")
    );
}

#[test]
fn header_block_has_imbs_lines() {
    let info = output::HeaderInfo {
        date: "Sun Nov 22 05:58:31 2026".into(),
        machine: "x86_64".into(),
        system: "Linux".into(),
        release: "6.18.44-fc-v669".into(),
        version: "#1 SMP PREEMPT_DYNAMIC @0".into(),
        mpi_version: "4.0".into(),
        calling_sequence:
            "./IMB-MPI1 PingPong Sendrecv Exchange Allreduce Bcast Barrier -msglog 0:22"
                .split(' ')
                .map(String::from)
                .collect(),
        max_size: 4194304,
        benchmarks: [
            Benchmark::PingPong,
            Benchmark::Sendrecv,
            Benchmark::Exchange,
            Benchmark::Allreduce,
            Benchmark::Bcast,
            Benchmark::Barrier,
        ]
        .to_vec(),
    };
    let rendered = info.render("Intel(R) MPI Benchmarks 2021.11, MPI-1 part");
    // The reference file from its first line to the list of benchmarks, verbatim.
    let reference = "#----------------------------------------------------------------
#    Intel(R) MPI Benchmarks 2021.11, MPI-1 part
#----------------------------------------------------------------
# Date                  : Sun Nov 22 05:58:31 2026
# Machine               : x86_64
# System                : Linux
# Release               : 6.18.44-fc-v669
# Version               : #1 SMP PREEMPT_DYNAMIC @0
# MPI Version           : 4.0
# MPI Thread Environment: 


# Calling sequence was: 

# ./IMB-MPI1 PingPong Sendrecv Exchange Allreduce Bcast Barrier -msglog 0:22 

# Minimum message length in bytes:   0
# Maximum message length in bytes:   4194304
#
# MPI_Datatype                   :   MPI_BYTE 
# MPI_Datatype for reductions    :   MPI_FLOAT 
# MPI_Op                         :   MPI_SUM  
# 
# 

# List of Benchmarks to run:

# PingPong
# Sendrecv
# Exchange
# Allreduce
# Bcast
# Barrier
";
    assert_eq!(rendered, reference);
}

#[test]
fn repetitions_for_given_sizes() {
    let it = Iterations::default();
    // The reference's #repetitions column from 32 KiB to 4 MiB.
    let sizes = [
        32768,
        65536,
        131072,
        262144,
        524288,
        1 << 20,
        2 << 20,
        4 << 20,
    ];
    let reps: Vec<usize> = sizes.iter().map(|&s| it.repetitions(s)).collect();
    assert_eq!(reps, [1000, 640, 320, 160, 80, 40, 20, 10]);
    assert_eq!(it.repetitions(0), 1000);
}

#[test]
fn off_cache_rotates_through_distinct_buffers() {
    let oc = OffCache::parse("-1").unwrap();
    for (b, size, np, n) in [
        (Benchmark::PingPong, 65536, 2, 640),
        (Benchmark::Allreduce, 4096, 2, 1000),
        (Benchmark::Alltoall, 1024, 4, 1000),
        (Benchmark::Exchange, 1 << 20, 2, 40),
    ] {
        let bufs = Buffers::new(b, size, np, n, Some(oc));
        let (s_len, r_len) = b.buffer_lengths(size, np);
        let rot = bufs.send_rotation;
        // IMB's span: positions one cache line beyond the message, covering 2 x 8 MiB
        // unless there are fewer repetitions than positions.
        assert_eq!(rot.offset, (s_len.div_ceil(64) + 1) * 64, "{b}");
        assert_eq!(
            rot.buffers,
            (16usize << 20).div_ceil(rot.offset).min(n),
            "{b}"
        );
        assert!(
            rot.buffers == n || rot.buffers * rot.offset >= 16 << 20,
            "{b}"
        );
        assert!(bufs.allocated().0 >= rot.buffers * rot.offset);
        assert_eq!(bufs.recv_rotation.offset, (r_len.div_ceil(64) + 1) * 64);
        let sends: HashSet<usize> = (0..rot.buffers).map(|i| bufs.addresses(i).0).collect();
        let recvs: HashSet<usize> = (0..rot.buffers).map(|i| bufs.addresses(i).1).collect();
        assert_eq!(
            sends.len(),
            rot.buffers,
            "{b}: every repetition of a cycle its own buffer"
        );
        assert_eq!(recvs.len(), bufs.recv_rotation.buffers.min(rot.buffers));
        assert_eq!(
            bufs.addresses(rot.buffers).0,
            bufs.addresses(0).0,
            "{b}: then again"
        );
    }
    // Without -off_cache (and for Barrier) every repetition uses the same buffer.
    let bufs = Buffers::new(Benchmark::PingPong, 1024, 2, 1000, None);
    assert_eq!(bufs.addresses(0), bufs.addresses(7));
    let bufs = Buffers::new(Benchmark::Barrier, 0, 2, 1000, Some(oc));
    assert_eq!(bufs.addresses(0), bufs.addresses(7));
}

/// Runs imb-bench (which starts itself on `np` ranks) and returns its stdout.
fn imb(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_imb-bench"))
        .args(args)
        .args(["--no-progress"])
        .env_remove("PAGEWIRE_MODE")
        .env_remove("PAGEWIRE_TRANSPORT")
        .output()
        .expect("run imb-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "imb-bench {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn every_benchmark_runs_on_one_to_four_ranks_in_every_mode() {
    for mode in ["copy", "pindown", "odp"] {
        for np in 1..=4usize {
            let n = np.to_string();
            let out = imb(&[
                "--np",
                &n,
                "--mode",
                mode,
                "-msglog",
                "0:3",
                "-iter",
                "20",
                "-iter_policy",
                "off",
                "-npmin",
                "1",
            ]);
            let ctx = format!("{mode} on {np} ranks:\n{out}");
            assert!(out.contains(&format!("buffer mode {mode}, ")), "{ctx}");
            for b in Benchmark::ALL {
                let pair = b.kind() == imb_bench::bench::Kind::SingleTransfer;
                if pair && np == 1 {
                    assert!(
                        out.contains(&format!(
                            "# !! Benchmark {} invalid for 1 processes !! ",
                            b.name()
                        )),
                        "{ctx}"
                    );
                    continue;
                }
                // The job's size, and with -npmin 1 also one process for the others.
                let last = if pair { 2 } else { np };
                let header = format!("# Benchmarking {} \n# #processes = {last} \n", b.name());
                assert!(out.contains(&header), "{b} missing: {ctx}");
            }
            // Every table row: reductions 0,4,8; others 0,1,2,4,8; Barrier one row.
            let rows = out
                .lines()
                .filter(|l| {
                    !l.starts_with('#') && !l.trim().is_empty() && !l.contains("#repetitions")
                })
                .count();
            let tables_per = |pair: bool| {
                if pair {
                    usize::from(np >= 2)
                } else {
                    imb_bench::settings::process_counts(np, 1, false).len()
                }
            };
            let expected: usize = Benchmark::ALL
                .iter()
                .map(|b| {
                    let per_table = match b.kind() {
                        imb_bench::bench::Kind::Sync => 1,
                        _ if b.is_reduction() => 3,
                        _ => 5,
                    };
                    per_table * tables_per(b.kind() == imb_bench::bench::Kind::SingleTransfer)
                })
                .sum();
            assert_eq!(rows, expected, "{ctx}");
            assert!(
                out.ends_with("# All processes entering MPI_Finalize\n\n"),
                "{ctx}"
            );
        }
    }
}

/// IMB-RMA's 17 benchmarks in IMB-RMA's format: two tables (non-aggregate, then aggregate)
/// for the pair benchmarks, one per process count for the others, the atomics at 4 bytes
/// only, Truly_passive_put's two times; on 2 and 3 ranks in the three modes.
#[test]
fn every_rma_benchmark_runs_in_imb_rmas_format_in_every_mode() {
    for (mode, np) in [("copy", 3usize), ("pindown", 2), ("odp", 3)] {
        let n = np.to_string();
        let out = imb(&[
            "--np",
            &n,
            "--mode",
            mode,
            "--suite",
            "rma",
            "-msglog",
            "0:3",
            "-iter",
            "20",
            "-iter_policy",
            "off",
        ]);
        let ctx = format!("{mode} on {np} ranks:\n{out}");
        assert!(out.contains("IMB-RMA 2021's MPI-RMA part"), "{ctx}");
        let mut expected_rows = 0;
        for b in Benchmark::RMA {
            let counts = imb_bench::settings::process_counts(np, 2, b.kind().is_pair());
            for p in &counts {
                let header = format!("# Benchmarking {} \n# #processes = {p} \n", b.name());
                assert!(out.contains(&header), "{b} on {p}: {ctx}");
            }
            let sizes = if b.single_element().is_some() {
                1
            } else if b.is_reduction() {
                3 // 0, 4, 8
            } else {
                5 // 0, 1, 2, 4, 8
            };
            expected_rows += sizes * counts.len() * b.aggregations().len();
        }
        assert_eq!(
            out.matches("#    MODE: NON-AGGREGATE \n").count(),
            9,
            "{ctx}"
        );
        assert_eq!(out.matches("#    MODE: AGGREGATE \n").count(), 9, "{ctx}");
        assert!(
            out.contains("       #bytes #repetitions t_pure[usec] t_ovrl[usec]"),
            "{ctx}"
        );
        assert!(
            out.contains("       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]"),
            "{ctx}"
        );
        let rows = out
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty() && !l.contains("#repetitions"))
            .count();
        assert_eq!(rows, expected_rows, "{ctx}");
        // Every row of a timed benchmark has a time: nothing came out as -1 or NaN.
        assert!(!out.contains("-1.00") && !out.contains("NaN"), "{ctx}");
    }
}

#[test]
fn mode_all_prints_the_modes_side_by_side() {
    let dir = std::env::temp_dir().join(format!("imb-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("all.json");
    let plot = dir.join("all.svg");
    let out = imb(&[
        "PingPong",
        "allreduce",
        "-msglog",
        "2:4",
        "-iter",
        "50",
        "-off_cache",
        "1",
        "--mode",
        "all",
        "--memlock",
        "8M",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    for mode in ["copy", "pindown", "odp"] {
        let through_nic = format!("buffer mode {mode}, ranks of one host through nic)");
        assert!(out.contains(&through_nic), "{out}");
    }
    // The local path beside the modes.
    assert!(
        out.contains("buffer mode copy, ranks of one host through shm)"),
        "{out}"
    );
    assert!(
        out.contains("the buffer modes side by side (2 ranks"),
        "{out}"
    );
    // pindown in both memlock worlds: lifted, and the --memlock given.
    assert!(
        out.contains("pindown-hpc/copy")
            && out.contains("pindown-8M/copy")
            && out.contains("odp/copy"),
        "{out}"
    );
    assert!(
        out.contains("# PingPong #processes = 2 (Mbytes/sec"),
        "{out}"
    );
    assert!(
        out.contains("# Allreduce #processes = 2 (t_avg[usec]"),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let modes: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["copy", "pindown-hpc", "pindown-8M", "odp", "local"]);
    let rows = &v[1]["result"]["tables"][0]["rows"];
    assert_eq!(rows.as_array().unwrap().len(), 4, "{rows}");
    let summary = &v[1]["result"]["tables"][0]["summary"];
    assert!(summary["pinned_peak"].as_u64().is_some(), "{summary}");
    for name in ["all-PingPong-np2.svg", "all-Allreduce-np2.svg"] {
        let svg = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(svg.contains("pindown") && svg.contains("odp"), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_setting_is_reported_once_before_any_rank_starts() {
    for (name, value, expected) in [
        (
            "PAGEWIRE_SOFT_TPT_CACHE",
            "6",
            "PAGEWIRE_SOFT_TPT_CACHE=6: expected off",
        ),
        (
            "PAGEWIRE_SG_MIN_RUN",
            "lots",
            "PAGEWIRE_SG_MIN_RUN=lots: expected a number of bytes",
        ),
        (
            "PAGEWIRE_PINDOWN_STRATEGY",
            "fmr",
            "PAGEWIRE_PINDOWN_STRATEGY",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_imb-bench"))
            .args(["PingPong", "-msglog", "0:2", "--no-progress"])
            .env(name, value)
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .expect("run imb-bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}={value}: {stderr}");
        assert_eq!(
            stderr.matches(expected).count(),
            1,
            "{name}={value}: {stderr}"
        );
        assert!(
            !stderr.contains("pwrun:"),
            "{name}={value}: a rank was started: {stderr}"
        );
    }
}
