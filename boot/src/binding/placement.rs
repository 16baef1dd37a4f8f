//! Where this process and its pinned pools are: its CPUs and NUMA nodes ([`Placement`]),
//! and NUMA-local placement of a fresh mapping ([`place_local`]) with a count of how the
//! pools ended up placed ([`memory_report`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use super::bind_plan::ENV_BIND;
use super::cpulist::format_cpulist;
#[cfg(feature = "hwloc")]
use super::hwloc;
use super::topology::Topology;
use crate::sys;
use pagewire_sys::AnonMapping;
use pagewire_sys::{Error, Result};

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
