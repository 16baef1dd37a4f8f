//! Unit tests of the cpulists, the topology and the binding plan.

use super::*;

/// Two nodes of two cores with two hardware threads each, numbered as Linux does on
/// many two-socket machines (siblings are `n` and `n + 4`).
fn two_nodes() -> Topology {
    let core = |cpus: [usize; 2], node| Core {
        cpus: cpus.to_vec(),
        node,
    };
    Topology {
        cores: vec![
            core([0, 4], 0),
            core([1, 5], 0),
            core([2, 6], 1),
            core([3, 7], 1),
        ],
        nodes: vec![
            NumaNode {
                os_index: 0,
                cpus: vec![0, 1, 4, 5],
            },
            NumaNode {
                os_index: 1,
                cpus: vec![2, 3, 6, 7],
            },
        ],
        source: "test",
    }
}

#[test]
fn cpulists_round_trip() {
    assert_eq!(
        parse_cpulist("0-3,8,10-11"),
        Some(vec![0, 1, 2, 3, 8, 10, 11])
    );
    assert_eq!(parse_cpulist(""), Some(vec![]));
    assert_eq!(parse_cpulist("3-1"), None);
    assert_eq!(parse_cpulist("x"), None);
    assert_eq!(format_cpulist(&[11, 0, 1, 2, 3, 8, 10]), "0-3,8,10-11");
    assert_eq!(format_cpulist(&[]), "");
}

#[test]
fn core_binding_fills_cores_in_topology_order() {
    let p = plan(&two_nodes(), 3, BindTo::Auto);
    assert_eq!(p.applied, BindTo::Core);
    assert_eq!(p.note, None);
    let cpus: Vec<_> = p.ranks.iter().map(|r| r.cpus.clone()).collect();
    assert_eq!(cpus, vec![vec![0, 4], vec![1, 5], vec![2, 6]]);
    let nodes: Vec<_> = p.ranks.iter().map(|r| r.node).collect();
    assert_eq!(nodes, vec![0, 0, 1]);
}

#[test]
fn more_ranks_than_cores_falls_back_with_a_note() {
    for asked in [BindTo::Auto, BindTo::Core] {
        let p = plan(&two_nodes(), 5, asked);
        assert_eq!(p.applied, BindTo::None);
        assert!(p.ranks.is_empty());
        let note = p.note.expect("a note");
        assert!(note.contains("5 ranks but 4 cores"), "{note}");
        assert_eq!(note.lines().count(), 1);
    }
}

#[test]
fn numa_binding_gives_whole_nodes_and_wraps() {
    let p = plan(&two_nodes(), 6, BindTo::Numa);
    assert_eq!(p.applied, BindTo::Numa);
    let nodes: Vec<_> = p.ranks.iter().map(|r| r.node).collect();
    assert_eq!(nodes, vec![0, 0, 1, 1, 0, 0]);
    assert_eq!(p.ranks[2].cpus, vec![2, 3, 6, 7]);
}

#[test]
fn none_binds_nothing() {
    let p = plan(&two_nodes(), 2, BindTo::None);
    assert_eq!(p.applied, BindTo::None);
    assert!(p.ranks.is_empty());
    assert_eq!(p.note, None);
    assert_eq!(rank_env(&p, 0), vec![(ENV_BIND, "none".to_string())]);
}

#[test]
fn restriction_drops_foreign_cpus() {
    let t = two_nodes().restricted_to(&[1, 2, 5]);
    assert_eq!(t.cores.len(), 2);
    assert_eq!(t.cores[0].cpus, vec![1, 5]);
    assert_eq!(t.cores[1].cpus, vec![2]);
    assert_eq!(t.node_of_cpus(&[1, 5]), Some(0));
    assert_eq!(t.node_of_cpus(&[1, 2]), None);
    assert_eq!(t.nodes_of_cpus(&[1, 2]), vec![0, 1]);
}

#[test]
fn sysfs_tree_is_read() {
    let root = std::env::temp_dir().join(format!("pagewire-sysfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (nodes, cpus) = (root.join("node"), root.join("cpu"));
    for (n, list) in [(0, "0,2"), (1, "1,3")] {
        std::fs::create_dir_all(nodes.join(format!("node{n}"))).unwrap();
        std::fs::write(nodes.join(format!("node{n}/cpulist")), format!("{list}\n")).unwrap();
    }
    std::fs::create_dir_all(&cpus).unwrap();
    std::fs::write(cpus.join("online"), "0-3\n").unwrap();
    // CPUs 0 and 2 are the two threads of one core; 1 and 3 are cores of their own.
    for (cpu, package, core) in [(0, 0, 0), (1, 1, 0), (2, 0, 0), (3, 1, 1)] {
        let dir = cpus.join(format!("cpu{cpu}/topology"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("physical_package_id"), format!("{package}\n")).unwrap();
        std::fs::write(dir.join("core_id"), format!("{core}\n")).unwrap();
    }
    let t = Topology::from_sysfs(&nodes, &cpus).unwrap();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(t.nodes.len(), 2);
    let cores: Vec<_> = t.cores.iter().map(|c| (c.cpus.clone(), c.node)).collect();
    assert_eq!(cores, vec![(vec![0, 2], 0), (vec![1], 1), (vec![3], 1)]);
}

#[test]
fn bind_to_parses() {
    assert_eq!("core".parse::<BindTo>().unwrap(), BindTo::Core);
    assert_eq!("numa".parse::<BindTo>().unwrap(), BindTo::Numa);
    assert_eq!("none".parse::<BindTo>().unwrap(), BindTo::None);
    assert!("socket".parse::<BindTo>().is_err());
}
