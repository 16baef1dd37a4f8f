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
//!
//! Its files: `cpulist.rs` (the Linux cpulist notation), `topology.rs` (the machine's cores
//! and NUMA nodes), `bind_plan.rs` (`--bind-to` and what the launcher does for each rank),
//! `placement.rs` (where this process and its pinned pools are) and, with the `hwloc`
//! feature, `hwloc.rs` (hwloc's topology and memory binding).

mod bind_plan;
mod cpulist;
#[cfg(feature = "hwloc")]
mod hwloc;
mod placement;
mod topology;

pub(super) use bind_plan::{bind_child, rank_env};
pub use bind_plan::{plan, BindPlan, BindTo, RankBinding, ENV_BIND, ENV_BIND_CPUS, ENV_BIND_NODE};
pub use cpulist::{format_cpulist, parse_cpulist};
pub use placement::{local_node, memory_report, place_local, MemoryPlacement, Placement};
pub use topology::{Core, NumaNode, Topology};

#[cfg(test)]
mod tests;
