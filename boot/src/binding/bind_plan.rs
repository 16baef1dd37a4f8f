//! How the launcher binds ranks: the `--bind-to` request ([`BindTo`]), the plan that maps
//! ranks onto the topology ([`plan`]), and what it does for each rank (the environment that
//! tells the rank, the CPU affinity set in the child).

use std::fmt;
use std::str::FromStr;

use super::cpulist::format_cpulist;
use super::topology::Topology;
use crate::sys;
use pagewire_sys::{Error, Result};

/// What the launcher did for this rank: `core`, `numa` or `none`.
pub const ENV_BIND: &str = "PAGEWIRE_BIND";
/// The CPUs the launcher bound this rank to, as a cpulist (`0-3,8`); unset when unbound.
pub const ENV_BIND_CPUS: &str = "PAGEWIRE_BIND_CPUS";
/// The NUMA node of the CPUs this rank was bound to; unset when unbound.
pub const ENV_BIND_NODE: &str = "PAGEWIRE_BIND_NODE";

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

/// Maps `ranks` ranks onto `topo` as `bind_to` asks (see the [`binding`](super) module's
/// documentation).
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

/// The environment the launcher gives rank `rank` under `plan`.
pub(crate) fn rank_env(plan: &BindPlan, rank: usize) -> Vec<(&'static str, String)> {
    let mut env = vec![(ENV_BIND, plan.applied.name().to_string())];
    if let Some(b) = plan.ranks.get(rank) {
        env.push((ENV_BIND_CPUS, format_cpulist(&b.cpus)));
        env.push((ENV_BIND_NODE, b.node.to_string()));
    }
    env
}

/// Makes the child started by `cmd` run on rank `rank`'s CPUs under `plan` (nothing when
/// the plan binds nothing).
pub(crate) fn bind_child(
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
