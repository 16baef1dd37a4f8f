//! Multi-process tests of rank binding (`pwrun --bind-to`) and NUMA-local memory.
//!
//! As in `launcher.rs`, a test that needs ranks launches this very test binary filtered to
//! the one test, with `PAGEWIRE_TEST_ROLE=NAME`; the rank part writes what the kernel says
//! about it (`Cpus_allowed_list` of `/proc/self/status`, not pagewire's own reading) and
//! what the launcher told it into a scratch file, and the parent checks the files against
//! sysfs.

use std::collections::BTreeSet;
use std::time::Duration;

use pagewire_boot::binding::{
    self, BindTo, MemoryPlacement, Topology, ENV_BIND, ENV_BIND_CPUS, ENV_BIND_NODE,
};
use pagewire_boot::{self as boot, LaunchConfig};
use pagewire_sys::AnonMapping;
use pagewire_test_support::{as_rank, Scratch, ROLE, SCRATCH};

/// A job of `ranks` copies of this test binary playing test `name`'s ranks.
fn job(name: &str, ranks: usize, bind: BindTo, scratch: &Scratch) -> LaunchConfig {
    LaunchConfig {
        args: [name, "--exact", "--nocapture", "--test-threads=1"]
            .map(Into::into)
            .to_vec(),
        timeout: Some(Duration::from_secs(60)),
        env: vec![
            (ROLE.into(), name.into()),
            (SCRATCH.into(), scratch.path().into()),
        ],
        bind,
        ..LaunchConfig::new(ranks, std::env::current_exe().expect("current_exe"))
    }
}

/// The kernel's view of this process's allowed CPUs.
fn kernel_cpus_allowed() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list");
    binding::parse_cpulist(line.trim()).expect("cpulist")
}

/// What a rank saw.
#[derive(Debug)]
struct Seen {
    cpus: Vec<usize>,
    bind: String,
    bind_cpus: Option<String>,
    bind_node: Option<String>,
}

/// The rank part shared by the tests: record what the kernel and the launcher say.
fn record_rank() {
    let rank = std::env::var("PAGEWIRE_RANK").expect("rank");
    let dir = Scratch::of_rank();
    let text = format!(
        "{}\n{}\n{}\n{}\n",
        binding::format_cpulist(&kernel_cpus_allowed()),
        std::env::var(ENV_BIND).unwrap_or_default(),
        std::env::var(ENV_BIND_CPUS).unwrap_or_else(|_| "-".into()),
        std::env::var(ENV_BIND_NODE).unwrap_or_else(|_| "-".into()),
    );
    std::fs::write(dir.join(format!("rank{rank}")), text).expect("write");
}

/// Runs `ranks` ranks of test `name` with `bind` and returns what each saw.
fn run_and_collect(name: &str, ranks: usize, bind: BindTo) -> Vec<Seen> {
    let scratch = Scratch::new("binding", name);
    let outcome = boot::launch(&job(name, ranks, bind, &scratch)).expect("launch");
    assert!(outcome.success(), "{outcome:?}");
    (0..ranks)
        .map(|r| {
            let text = std::fs::read_to_string(scratch.path().join(format!("rank{r}")))
                .unwrap_or_else(|e| panic!("rank {r} wrote nothing: {e}"));
            let mut lines = text.lines();
            let mut next = || lines.next().expect("line").to_string();
            let cpus = binding::parse_cpulist(&next()).expect("cpulist");
            let bind = next();
            let opt = |s: String| (s != "-").then_some(s);
            Seen {
                cpus,
                bind,
                bind_cpus: opt(next()),
                bind_node: opt(next()),
            }
        })
        .collect()
}

/// This machine's topology from sysfs, restricted to the test's CPUs.
fn sysfs_topology() -> Topology {
    Topology::from_system_sysfs()
        .expect("sysfs topology")
        .restricted_to(&kernel_cpus_allowed())
}

#[test]
fn core_binding_gives_each_rank_its_own_core() {
    const NAME: &str = "core_binding_gives_each_rank_its_own_core";
    if as_rank(NAME) {
        return record_rank();
    }
    let topo = sysfs_topology();
    let ranks = topo.cores.len().min(4);
    for bind in [BindTo::Core, BindTo::Auto] {
        let seen = run_and_collect(NAME, ranks, bind);
        let mut used = BTreeSet::new();
        for (r, s) in seen.iter().enumerate() {
            assert_eq!(s.bind, "core", "rank {r} under {bind}: {s:?}");
            assert!(
                topo.cores.iter().any(|c| c.cpus == s.cpus),
                "rank {r} under {bind} runs on {:?}, which is not one core of {:?}",
                s.cpus,
                topo.cores
            );
            assert_eq!(
                s.bind_cpus.as_deref(),
                Some(binding::format_cpulist(&s.cpus).as_str()),
                "rank {r}: PAGEWIRE_BIND_CPUS disagrees with the kernel"
            );
            let node = topo.node_of_cpus(&s.cpus).expect("one node");
            assert_eq!(s.bind_node, Some(node.to_string()), "rank {r}");
            for cpu in &s.cpus {
                assert!(used.insert(*cpu), "CPU {cpu} given to two ranks: {seen:?}");
            }
        }
    }
}

#[test]
fn numa_binding_gives_each_rank_its_node() {
    const NAME: &str = "numa_binding_gives_each_rank_its_node";
    if as_rank(NAME) {
        return record_rank();
    }
    let topo = sysfs_topology();
    let seen = run_and_collect(NAME, 2, BindTo::Numa);
    for (r, s) in seen.iter().enumerate() {
        assert_eq!(s.bind, "numa", "rank {r}: {s:?}");
        let node: usize = s
            .bind_node
            .as_deref()
            .expect("node")
            .parse()
            .expect("number");
        let node_cpus = &topo
            .nodes
            .iter()
            .find(|n| n.os_index == node)
            .expect("node exists")
            .cpus;
        assert_eq!(&s.cpus, node_cpus, "rank {r} is not bound to node {node}");
    }
}

#[test]
fn none_leaves_ranks_unbound() {
    const NAME: &str = "none_leaves_ranks_unbound";
    if as_rank(NAME) {
        return record_rank();
    }
    let mine = kernel_cpus_allowed();
    for s in run_and_collect(NAME, 2, BindTo::None) {
        assert_eq!(s.cpus, mine, "{s:?}");
        assert_eq!(s.bind, "none");
        assert_eq!((s.bind_cpus, s.bind_node), (None, None));
    }
}

#[test]
fn more_ranks_than_cores_falls_back_to_none() {
    const NAME: &str = "more_ranks_than_cores_falls_back_to_none";
    if as_rank(NAME) {
        return record_rank();
    }
    let mine = kernel_cpus_allowed();
    let ranks = sysfs_topology().cores.len() + 1;
    let plan = binding::plan(&Topology::detect().expect("topology"), ranks, BindTo::Auto);
    assert_eq!(plan.applied, BindTo::None);
    let note = plan.note.expect("a note");
    assert!(note.contains(&format!("{ranks} ranks but")), "{note}");
    for bind in [BindTo::Auto, BindTo::Core] {
        for s in run_and_collect(NAME, ranks, bind) {
            assert_eq!(s.cpus, mine, "{bind}: {s:?}");
            assert_eq!(s.bind, "none", "{bind}");
        }
    }
}

/// The NUMA policy `/proc/self/numa_maps` shows for the mapping that starts at `addr`
/// (`default`, `bind:0`, `prefer:0`, `prefer (many):0`, ...).
fn numa_policy(addr: u64) -> String {
    let maps = std::fs::read_to_string("/proc/self/numa_maps").expect("/proc/self/numa_maps");
    let start = format!("{addr:x} ");
    let line = maps
        .lines()
        .find_map(|l| l.strip_prefix(&start))
        .unwrap_or_else(|| panic!("no numa_maps line for {addr:#x}"));
    line.split_whitespace()
        .take_while(|word| !word.contains('='))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn pools_are_placed_on_the_ranks_node() {
    const NAME: &str = "pools_are_placed_on_the_ranks_node";
    if as_rank(NAME) {
        let mem = AnonMapping::new(1 << 20).expect("mmap");
        let placement = binding::place_local(&mem);
        let node: usize = std::env::var(ENV_BIND_NODE)
            .expect("bound")
            .parse()
            .expect("node");
        if cfg!(feature = "hwloc") {
            assert_eq!(placement, MemoryPlacement::Bound { node });
            // hwloc's non-strict `bind` is MPOL_PREFERRED_MANY on recent kernels (the node
            // first, others when it is full), MPOL_BIND on older ones.
            let policy = numa_policy(mem.addr());
            assert!(
                policy.ends_with(&format!(":{node}")) && !policy.starts_with("default"),
                "the pool's policy is `{policy}`, not node {node}"
            );
        } else {
            assert!(
                matches!(&placement, MemoryPlacement::FirstTouch { reason } if reason.contains("hwloc")),
                "{placement:?}"
            );
            assert_eq!(numa_policy(mem.addr()), "default");
        }
        assert_eq!(binding::local_node(), Some(node));
        let report = binding::memory_report();
        assert!(report.contains("1.00 MiB"), "{report}");
        return;
    }
    let scratch = Scratch::new("binding", NAME);
    let outcome = boot::launch(&job(NAME, 1, BindTo::Core, &scratch)).expect("launch");
    assert!(outcome.success(), "{outcome:?}");
}

#[test]
fn detected_topology_matches_sysfs() {
    // With the `hwloc` feature `detect` asks hwloc; both must agree on cores and nodes.
    let detected = Topology::detect().expect("detect");
    let sysfs = sysfs_topology();
    let cpus = |t: &Topology| -> Vec<Vec<usize>> {
        let mut v: Vec<_> = t.cores.iter().map(|c| c.cpus.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(cpus(&detected), cpus(&sysfs), "{detected:?} vs {sysfs:?}");
    assert_eq!(detected.nodes, sysfs.nodes);
    let expected = if cfg!(feature = "hwloc") {
        "hwloc"
    } else {
        "sysfs"
    };
    assert_eq!(detected.source, expected);
}
