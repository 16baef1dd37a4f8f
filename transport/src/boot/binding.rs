//! Where ranks run: the machine's cores and NUMA nodes, how the built-in launcher binds
//! ranks to them (`pwrun --bind-to core|numa|none`), and NUMA-local placement of the pinned
//! pools a rank allocates (the copy mode's bounce pool, the eager slots).
//!
//! - **Topology.** [`Topology::detect`] reads the cores and NUMA nodes: from hwloc with the
//!   cargo feature `hwloc` (crate `hwlocality` over the system libhwloc), otherwise from
//!   `/sys/devices/system/node` and `/sys/devices/system/cpu/cpuN/topology`. Either way
//!   only the CPUs the launcher itself may use (`sched_getaffinity`) are considered.
//! - **Placement.** [`plan`] maps ranks onto it, cores first, then NUMA nodes: rank `r`
//!   gets the `r`-th core in topology order (so neighbouring ranks share a node), bound to
//!   that core (`core`) or to all CPUs of its node (`numa`). When there are more ranks than
//!   cores, `core` falls back to leaving the ranks unbound, with a one-line note; `numa`
//!   wraps around the cores, so nodes are shared evenly.
//! - **Binding** is a plain `sched_setaffinity` in the child between fork and exec, with
//!   or without hwloc (hwloc's own call is not async-signal-safe there). The launcher tells
//!   each rank what it did in [`ENV_BIND`], [`ENV_BIND_CPUS`] and [`ENV_BIND_NODE`].
//! - **Memory.** [`place_local`] binds a fresh mapping to the NUMA node of the CPUs this
//!   rank runs on, before anything touches it (hwloc's `set_area_membind`, policy `bind`,
//!   not strict: on recent kernels hwloc makes that `MPOL_PREFERRED_MANY`, so the node is
//!   used first and a full node slows allocations down instead of failing them).
//!   Without the `hwloc` feature it records that placement is left to the kernel's first
//!   touch, which is local too once the rank is bound to a core or node, because the pools
//!   are touched (zeroed or pinned) by the rank right after they are mapped. On a machine
//!   with one node the binding is a no-op, but it still runs, so the path is exercised.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use super::sys;
use crate::error::{Error, Result};
use crate::sys::AnonMapping;

/// What the launcher did for this rank: `core`, `numa` or `none`.
pub const ENV_BIND: &str = "PAGEWIRE_BIND";
/// The CPUs the launcher bound this rank to, as a cpulist (`0-3,8`); unset when unbound.
pub const ENV_BIND_CPUS: &str = "PAGEWIRE_BIND_CPUS";
/// The NUMA node of the CPUs this rank was bound to; unset when unbound.
pub const ENV_BIND_NODE: &str = "PAGEWIRE_BIND_NODE";

/// Where `sysfs` describes the NUMA nodes.
const SYSFS_NODES: &str = "/sys/devices/system/node";
/// Where `sysfs` describes the CPUs.
const SYSFS_CPUS: &str = "/sys/devices/system/cpu";

/// How the launcher binds ranks (`pwrun --bind-to`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BindTo {
    /// `core` when every rank gets a core of its own, else `none` with a note (pwrun's
    /// default).
    #[default]
    Auto,
    /// Each rank to one core (all its hardware threads).
    Core,
    /// Each rank to all CPUs of one NUMA node.
    Numa,
    /// No binding: ranks inherit the launcher's affinity.
    None,
}

impl BindTo {
    /// The name `pwrun --bind-to` and [`ENV_BIND`] use.
    pub fn name(self) -> &'static str {
        match self {
            BindTo::Auto => "auto",
            BindTo::Core => "core",
            BindTo::Numa => "numa",
            BindTo::None => "none",
        }
    }
}

impl fmt::Display for BindTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BindTo {
    type Err = Error;

    fn from_str(s: &str) -> Result<BindTo> {
        match s {
            "auto" => Ok(BindTo::Auto),
            "core" => Ok(BindTo::Core),
            "numa" => Ok(BindTo::Numa),
            "none" => Ok(BindTo::None),
            other => Err(Error::InvalidArgument(format!(
                "binding `{other}`: expected core, numa or none"
            ))),
        }
    }
}

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
    fn node_cpus(&self, os_index: usize) -> &[usize] {
        self.nodes
            .iter()
            .find(|n| n.os_index == os_index)
            .map_or(&[], |n| &n.cpus)
    }
}

/// Where the launcher puts one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankBinding {
    /// The CPUs it may run on.
    pub cpus: Vec<usize>,
    /// Their NUMA node.
    pub node: usize,
}

/// How a job's ranks are bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindPlan {
    /// What is done: [`BindTo::Core`], [`BindTo::Numa`] or [`BindTo::None`] (never `Auto`).
    pub applied: BindTo,
    /// Per rank; empty when `applied` is `None`.
    pub ranks: Vec<RankBinding>,
    /// A line for the user when the request could not be met as asked.
    pub note: Option<String>,
}

/// Maps `ranks` ranks onto `topo` as `bind_to` asks (see the module documentation).
pub fn plan(topo: &Topology, ranks: usize, bind_to: BindTo) -> BindPlan {
    let unbound = |note: Option<String>| BindPlan {
        applied: BindTo::None,
        ranks: Vec::new(),
        note,
    };
    let cores = topo.cores.len();
    match bind_to {
        BindTo::None => unbound(None),
        _ if cores == 0 => unbound(Some(
            "pwrun: no cores found in the machine's topology; ranks are not bound".into(),
        )),
        BindTo::Auto | BindTo::Core if ranks > cores => {
            let asked = if bind_to == BindTo::Core {
                "--bind-to core: "
            } else {
                ""
            };
            unbound(Some(format!(
                "pwrun: {asked}{ranks} ranks but {cores} cores; ranks are not bound (--bind-to none)"
            )))
        }
        BindTo::Auto | BindTo::Core => BindPlan {
            applied: BindTo::Core,
            ranks: topo.cores[..ranks]
                .iter()
                .map(|c| RankBinding {
                    cpus: c.cpus.clone(),
                    node: c.node,
                })
                .collect(),
            note: None,
        },
        BindTo::Numa => BindPlan {
            applied: BindTo::Numa,
            ranks: (0..ranks)
                .map(|r| {
                    let node = topo.cores[r % cores].node;
                    RankBinding {
                        cpus: topo.node_cpus(node).to_vec(),
                        node,
                    }
                })
                .collect(),
            note: None,
        },
    }
}

/// Formats CPU numbers as a Linux cpulist: `0-3,8,10-11`.
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// Parses a Linux cpulist (`0-3,8`; empty is the empty set) into increasing CPU numbers.
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The environment the launcher gives rank `rank` under `plan`.
pub(super) fn rank_env(plan: &BindPlan, rank: usize) -> Vec<(&'static str, String)> {
    let mut env = vec![(ENV_BIND, plan.applied.name().to_string())];
    if let Some(b) = plan.ranks.get(rank) {
        env.push((ENV_BIND_CPUS, format_cpulist(&b.cpus)));
        env.push((ENV_BIND_NODE, b.node.to_string()));
    }
    env
}

/// Makes the child started by `cmd` run on rank `rank`'s CPUs under `plan` (nothing when
/// the plan binds nothing).
pub(super) fn bind_child(
    cmd: &mut std::process::Command,
    plan: &BindPlan,
    rank: usize,
) -> Result<()> {
    if let Some(b) = plan.ranks.get(rank) {
        sys::bind_child_cpus(cmd, &b.cpus).map_err(|e| {
            Error::os(
                format!("binding rank {rank} to CPUs {}", format_cpulist(&b.cpus)),
                e,
            )
        })?;
    }
    Ok(())
}

/// Where this process runs, as a benchmark header reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The CPUs it may run on now (`sched_getaffinity`).
    pub cpus: Vec<usize>,
    /// The NUMA nodes of those CPUs.
    pub nodes: Vec<usize>,
    /// What the launcher did ([`ENV_BIND`]), if it said.
    pub bound_by_launcher: Option<String>,
}

impl Placement {
    /// This process's placement.
    pub fn of_this_process() -> Result<Placement> {
        let cpus = sys::cpu_affinity().map_err(|e| Error::os("sched_getaffinity", e))?;
        let nodes = cached_topology()
            .map(|t| t.nodes_of_cpus(&cpus))
            .unwrap_or_default();
        Ok(Placement {
            cpus,
            nodes,
            bound_by_launcher: std::env::var(ENV_BIND).ok(),
        })
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(usize::to_string).collect();
        let (word, list) = match nodes.len() {
            0 => ("NUMA node", "?".to_string()),
            1 => ("NUMA node", nodes[0].clone()),
            _ => ("NUMA nodes", nodes.join(",")),
        };
        write!(f, "cpus {} ({word} {list})", format_cpulist(&self.cpus))?;
        match self.bound_by_launcher.as_deref() {
            Some("none") | None => write!(f, ", not bound"),
            Some(how) => write!(f, ", bound by pwrun --bind-to {how}"),
        }
    }
}

/// The machine's topology restricted to this process's CPUs, read once per process;
/// `None` if it cannot be read.
fn cached_topology() -> Option<&'static Topology> {
    static TOPOLOGY: OnceLock<Option<Topology>> = OnceLock::new();
    TOPOLOGY.get_or_init(|| Topology::detect().ok()).as_ref()
}

/// How a pool ended up placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryPlacement {
    /// Bound to this NUMA node (feature `hwloc`).
    Bound {
        /// The node.
        node: usize,
    },
    /// Left to the kernel's first-touch policy, for the reason given.
    FirstTouch {
        /// Why it was not bound.
        reason: String,
    },
}

/// Bytes [`place_local`] bound to a node in this process.
static BOUND_BYTES: AtomicU64 = AtomicU64::new(0);
/// Bytes [`place_local`] left to first touch in this process.
static FIRST_TOUCH_BYTES: AtomicU64 = AtomicU64::new(0);

/// Binds `mem` (freshly mapped, not yet touched) to the NUMA node of the CPUs this process
/// runs on: with the `hwloc` feature through hwloc's area binding, policy `bind`; without
/// it, or when this process's CPUs span several nodes, placement is left to first touch.
/// Never fails: a placement that cannot be made is reported in the result, and a binding
/// that hwloc refuses is said once on stderr.
pub fn place_local(mem: &AnonMapping) -> MemoryPlacement {
    let placement = place_local_impl(mem);
    let counter = match placement {
        MemoryPlacement::Bound { .. } => &BOUND_BYTES,
        MemoryPlacement::FirstTouch { .. } => &FIRST_TOUCH_BYTES,
    };
    counter.fetch_add(mem.len() as u64, Relaxed);
    placement
}

#[cfg(feature = "hwloc")]
fn place_local_impl(mem: &AnonMapping) -> MemoryPlacement {
    let Some(node) = local_node() else {
        return MemoryPlacement::FirstTouch {
            reason: "this rank's CPUs span several NUMA nodes".into(),
        };
    };
    match hwloc::bind_area(mem.as_slice(), node) {
        Ok(()) => MemoryPlacement::Bound { node },
        Err(why) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!("pagewire: cannot bind pinned pools to NUMA node {node} ({why}); they are placed by first touch");
            });
            MemoryPlacement::FirstTouch { reason: why }
        }
    }
}

#[cfg(not(feature = "hwloc"))]
fn place_local_impl(_mem: &AnonMapping) -> MemoryPlacement {
    MemoryPlacement::FirstTouch {
        reason: "built without the hwloc feature".into(),
    }
}

/// The NUMA node of the CPUs this process runs on, if they are all on one.
pub fn local_node() -> Option<usize> {
    let cpus = sys::cpu_affinity().ok()?;
    cached_topology()?.node_of_cpus(&cpus)
}

/// One line on how this process's pinned pools were placed, for benchmark headers.
pub fn memory_report() -> String {
    let bound = BOUND_BYTES.load(Relaxed);
    let touched = FIRST_TOUCH_BYTES.load(Relaxed);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let how = if cfg!(feature = "hwloc") {
        "hwloc"
    } else {
        "no hwloc feature"
    };
    match (bound, touched) {
        (0, 0) => format!("no pinned pools placed ({how})"),
        (b, 0) => format!(
            "pinned pools {:.2} MiB bound to NUMA node {} ({how})",
            mib(b),
            local_node().map_or("?".to_string(), |n| n.to_string())
        ),
        (0, t) => format!(
            "pinned pools {:.2} MiB placed by first touch ({how})",
            mib(t)
        ),
        (b, t) => format!(
            "pinned pools {:.2} MiB bound, {:.2} MiB by first touch ({how})",
            mib(b),
            mib(t)
        ),
    }
}

#[cfg(feature = "hwloc")]
mod hwloc {
    //! The topology and memory binding through hwloc (`hwlocality`).

    use hwlocality::memory::binding::{MemoryBindingFlags, MemoryBindingPolicy};
    use hwlocality::memory::nodeset::NodeSet;
    use hwlocality::object::types::ObjectType;
    use hwlocality::object::TopologyObject;
    use hwlocality::topology::Topology as HwTopology;
    use std::sync::OnceLock;

    use super::{Core, NumaNode, Topology};
    use crate::error::{Error, Result};

    /// hwloc's topology of this machine, loaded once per process.
    fn loaded() -> std::result::Result<&'static HwTopology, String> {
        static HW: OnceLock<std::result::Result<HwTopology, String>> = OnceLock::new();
        HW.get_or_init(|| HwTopology::new().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn cpus_of(obj: &TopologyObject) -> Vec<usize> {
        obj.cpuset()
            .map(|set| set.iter_set().map(usize::from).collect())
            .unwrap_or_default()
    }

    /// The cores and NUMA nodes as hwloc sees them, in hwloc's logical order.
    pub(super) fn topology() -> Result<Topology> {
        let hw = loaded().map_err(|e| Error::Launcher(format!("hwloc topology: {e}")))?;
        let nodes: Vec<NumaNode> = hw
            .objects_with_type(ObjectType::NUMANode)
            .map(|n| NumaNode {
                os_index: n.os_index().unwrap_or(n.logical_index()),
                cpus: cpus_of(n),
            })
            .filter(|n| !n.cpus.is_empty())
            .collect();
        let cores = hw
            .objects_with_type(ObjectType::Core)
            .map(|c| {
                let cpus = cpus_of(c);
                let node = nodes
                    .iter()
                    .find(|n| cpus.iter().all(|x| n.cpus.contains(x)))
                    .map_or(0, |n| n.os_index);
                Core { cpus, node }
            })
            .filter(|c| !c.cpus.is_empty())
            .collect();
        Ok(Topology {
            cores,
            nodes,
            source: "hwloc",
        })
    }

    /// Binds `area` to NUMA node `node` (policy `bind`, by node set).
    pub(super) fn bind_area(area: &[u8], node: usize) -> std::result::Result<(), String> {
        let hw = loaded()?;
        let mut set = NodeSet::new();
        set.set(node);
        hw.bind_memory_area::<[u8], _>(
            area,
            &set,
            MemoryBindingPolicy::Bind,
            MemoryBindingFlags::empty(),
        )
        .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
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
}
