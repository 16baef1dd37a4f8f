//! The topology and memory binding through hwloc (`hwlocality`).

use hwlocality::memory::binding::{MemoryBindingFlags, MemoryBindingPolicy};
use hwlocality::memory::nodeset::NodeSet;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::Topology as HwTopology;
use std::sync::OnceLock;

use super::topology::{Core, NumaNode, Topology};
use pagewire_sys::{Error, Result};

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
