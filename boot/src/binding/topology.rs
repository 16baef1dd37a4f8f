//! The machine's cores and NUMA nodes ([`Topology`]): read from sysfs, or from hwloc with
//! the `hwloc` feature, and restricted to the CPUs this process may use.

use std::path::Path;

use super::cpulist::parse_cpulist;
#[cfg(feature = "hwloc")]
use super::hwloc;
use crate::sys;
use pagewire_sys::{Error, Result};

/// Where `sysfs` describes the NUMA nodes.
const SYSFS_NODES: &str = "/sys/devices/system/node";
/// Where `sysfs` describes the CPUs.
const SYSFS_CPUS: &str = "/sys/devices/system/cpu";

/// One core: its hardware threads and the NUMA node they belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Core {
    /// Operating-system CPU numbers of the core's hardware threads, increasing.
    pub cpus: Vec<usize>,
    /// Operating-system index of its NUMA node.
    pub node: usize,
}

/// One NUMA node and its CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaNode {
    /// Operating-system index (`nodeN`).
    pub os_index: usize,
    /// Its CPUs, increasing.
    pub cpus: Vec<usize>,
}

/// The cores and NUMA nodes of the machine, in topology order (nodes by index, cores by
/// node, then package and core number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// The cores.
    pub cores: Vec<Core>,
    /// The NUMA nodes that have CPUs.
    pub nodes: Vec<NumaNode>,
    /// Where it was read from: `hwloc` or `sysfs`.
    pub source: &'static str,
}

impl Topology {
    /// The topology of this machine restricted to the CPUs this process may use: from hwloc
    /// with the `hwloc` feature, else from sysfs.
    pub fn detect() -> Result<Topology> {
        #[cfg(feature = "hwloc")]
        let full = hwloc::topology()?;
        #[cfg(not(feature = "hwloc"))]
        let full = Topology::from_system_sysfs()?;
        let allowed = sys::cpu_affinity().map_err(|e| Error::os("sched_getaffinity", e))?;
        Ok(full.restricted_to(&allowed))
    }

    /// This machine's topology as sysfs describes it (all online CPUs, unrestricted).
    pub fn from_system_sysfs() -> Result<Topology> {
        Topology::from_sysfs(Path::new(SYSFS_NODES), Path::new(SYSFS_CPUS))
    }

    /// The topology described by a sysfs tree: `nodes_dir` as `/sys/devices/system/node`
    /// (`nodeN/cpulist`), `cpus_dir` as `/sys/devices/system/cpu` (`online`,
    /// `cpuN/topology/{physical_package_id,core_id}`). A kernel without NUMA support has no
    /// `nodes_dir`: then every CPU is on node 0. Missing core numbers make every CPU a core.
    pub fn from_sysfs(nodes_dir: &Path, cpus_dir: &Path) -> Result<Topology> {
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .map_err(|e| Error::os(format!("reading {}", path.display()), e))
        };
        let online_path = cpus_dir.join("online");
        let online = parse_cpulist(read(&online_path)?.trim())
            .ok_or_else(|| Error::Launcher(format!("cannot parse {}", online_path.display())))?;
        let mut nodes = Vec::new();
        if let Ok(entries) = std::fs::read_dir(nodes_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(index) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("node"))
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                let path = entry.path().join("cpulist");
                let cpus = parse_cpulist(read(&path)?.trim())
                    .ok_or_else(|| Error::Launcher(format!("cannot parse {}", path.display())))?;
                let cpus: Vec<usize> = cpus.into_iter().filter(|c| online.contains(c)).collect();
                if !cpus.is_empty() {
                    nodes.push(NumaNode {
                        os_index: index,
                        cpus,
                    });
                }
            }
        }
        if nodes.is_empty() {
            nodes.push(NumaNode {
                os_index: 0,
                cpus: online.clone(),
            });
        }
        nodes.sort_by_key(|n| n.os_index);
        let node_of = |cpu: usize| {
            nodes
                .iter()
                .find(|n| n.cpus.contains(&cpu))
                .map_or(0, |n| n.os_index)
        };
        // (node, package, core id) -> hardware threads.
        let mut keyed: Vec<((usize, i64, i64), Vec<usize>)> = Vec::new();
        for &cpu in &online {
            let topo = cpus_dir.join(format!("cpu{cpu}/topology"));
            let number = |file: &str| -> Option<i64> {
                std::fs::read_to_string(topo.join(file))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            let key = match (number("physical_package_id"), number("core_id")) {
                (Some(package), Some(core)) => (node_of(cpu), package, core),
                // No core information: a core per CPU, keyed so that it stays unique.
                _ => (node_of(cpu), -1, -1 - cpu as i64),
            };
            match keyed.iter_mut().find(|(k, _)| *k == key) {
                Some((_, cpus)) => cpus.push(cpu),
                None => keyed.push((key, vec![cpu])),
            }
        }
        keyed.sort_by_key(|(key, cpus)| (key.0, key.1, key.2, cpus[0]));
        let cores = keyed
            .into_iter()
            .map(|((node, _, _), cpus)| Core { cpus, node })
            .collect();
        Ok(Topology {
            cores,
            nodes,
            source: "sysfs",
        })
    }

    /// The same topology with only `allowed` CPUs left; cores and nodes left without CPUs
    /// are dropped.
    pub fn restricted_to(&self, allowed: &[usize]) -> Topology {
        let keep = |cpus: &[usize]| -> Vec<usize> {
            cpus.iter()
                .copied()
                .filter(|c| allowed.contains(c))
                .collect()
        };
        Topology {
            cores: self
                .cores
                .iter()
                .map(|c| Core {
                    cpus: keep(&c.cpus),
                    node: c.node,
                })
                .filter(|c| !c.cpus.is_empty())
                .collect(),
            nodes: self
                .nodes
                .iter()
                .map(|n| NumaNode {
                    os_index: n.os_index,
                    cpus: keep(&n.cpus),
                })
                .filter(|n| !n.cpus.is_empty())
                .collect(),
            source: self.source,
        }
    }

    /// The one NUMA node that holds all of `cpus`, if there is one.
    pub fn node_of_cpus(&self, cpus: &[usize]) -> Option<usize> {
        if cpus.is_empty() {
            return None;
        }
        self.nodes
            .iter()
            .find(|n| cpus.iter().all(|c| n.cpus.contains(c)))
            .map(|n| n.os_index)
    }

    /// The NUMA nodes any of `cpus` belongs to, increasing.
    pub fn nodes_of_cpus(&self, cpus: &[usize]) -> Vec<usize> {
        self.nodes
            .iter()
            .filter(|n| cpus.iter().any(|c| n.cpus.contains(c)))
            .map(|n| n.os_index)
            .collect()
    }

    /// The CPUs of NUMA node `os_index`.
    pub(super) fn node_cpus(&self, os_index: usize) -> &[usize] {
        self.nodes
            .iter()
            .find(|n| n.os_index == os_index)
            .map_or(&[], |n| &n.cpus)
    }
}
