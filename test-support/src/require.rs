//! What a test does when something it needs is missing here: skip with one line, or, when
//! [`REQUIRE`] names the prerequisite, fail. `.ci/run` sets it to what CI provides, so a CI
//! machine that lost a prerequisite fails instead of passing tests that never ran.

use std::fmt::Display;

/// The switch: `PAGEWIRE_REQUIRE=mpirun,hugepages,...` (comma-separated
/// [`Prerequisite::name`]s, or `all`).
pub const REQUIRE: &str = "PAGEWIRE_REQUIRE";

/// The older switch for long-term pins only (any value): kept as `longterm-pin`.
const REQUIRE_LONGTERM_PIN: &str = "PAGEWIRE_REQUIRE_LONGTERM_PIN";

/// Something a test needs from the machine and may not find.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Prerequisite {
    /// An MPI launcher (`mpirun`, or `PAGEWIRE_MPIRUN`): the `mpi` feature's tests.
    Mpirun,
    /// Reserved huge pages (`vm.nr_hugepages`): `MAP_HUGETLB` and `SHM_HUGETLB` memory.
    HugePages,
    /// io_uring fixed-buffer registration: the kernel's long-term pin.
    LongtermPin,
    /// A private mount namespace with a tmpfs mount (`unshare -m`, `mount -t tmpfs`).
    PrivateMounts,
    /// No RDMA device: the verbs provider's no-device path.
    NoRdmaDevice,
    /// An RDMA device with on-demand paging (RC ODP, and implicit ODP where asked for).
    RdmaOdp,
    /// A cgroup v1 memory controller this process may make cgroups in (`pw-workset`).
    MemoryCgroup,
    /// Two hosts made of namespaces on this machine (`tools/hosts/ns-hosts`): network,
    /// PID, mount, UTS and IPC namespaces with a private `/dev/shm`.
    NamespacedHosts,
    /// A Slurm (slurm-wlm, munge) that `tools/hosts/slurm` can start on the namespaced hosts:
    /// `.ci/slurm.sh`.
    Slurm,
    /// Open MPI's `mpirun` (`mpirun.openmpi`), for jobs started through its PMIx server:
    /// `.ci/slurm.sh`.
    OpenMpi,
}

impl Prerequisite {
    /// Every prerequisite, what `all` names.
    pub const ALL: [Prerequisite; 10] = [
        Prerequisite::Mpirun,
        Prerequisite::HugePages,
        Prerequisite::LongtermPin,
        Prerequisite::PrivateMounts,
        Prerequisite::NoRdmaDevice,
        Prerequisite::RdmaOdp,
        Prerequisite::MemoryCgroup,
        Prerequisite::NamespacedHosts,
        Prerequisite::Slurm,
        Prerequisite::OpenMpi,
    ];

    /// Its name in [`REQUIRE`].
    pub fn name(self) -> &'static str {
        match self {
            Prerequisite::Mpirun => "mpirun",
            Prerequisite::HugePages => "hugepages",
            Prerequisite::LongtermPin => "longterm-pin",
            Prerequisite::PrivateMounts => "private-mounts",
            Prerequisite::NoRdmaDevice => "no-rdma-device",
            Prerequisite::RdmaOdp => "rdma-odp",
            Prerequisite::MemoryCgroup => "memory-cgroup",
            Prerequisite::NamespacedHosts => "namespaced-hosts",
            Prerequisite::Slurm => "slurm",
            Prerequisite::OpenMpi => "openmpi",
        }
    }

    /// How to provide it.
    pub fn how(self) -> &'static str {
        match self {
            Prerequisite::Mpirun => {
                "install MPICH (Debian: mpich libmpich-dev, as .ci/mpi.sh does) or set \
                 PAGEWIRE_MPIRUN to the launcher command"
            }
            Prerequisite::HugePages => {
                "reserve some as root: `sysctl vm.nr_hugepages=4` (as .ci/run does)"
            }
            Prerequisite::LongtermPin => {
                "a kernel with io_uring enabled (sysctl kernel.io_uring_disabled=0) and not \
                 blocked by a seccomp filter"
            }
            Prerequisite::PrivateMounts => {
                "run as root (or with CAP_SYS_ADMIN) where `unshare -m` may mount a tmpfs"
            }
            Prerequisite::NoRdmaDevice => {
                "run where libibverbs finds no RDMA device (the no-device path is only seen \
                 there)"
            }
            Prerequisite::RdmaOdp => {
                "an RDMA device whose driver supports on-demand paging (e.g. mlx5); \
                 PAGEWIRE_DEVICE chooses it"
            }
            Prerequisite::MemoryCgroup => {
                "a kernel with the cgroup v1 memory controller mounted at \
                 /sys/fs/cgroup/memory, and root (to make a cgroup and set its limit)"
            }
            Prerequisite::NamespacedHosts => {
                "run as root with iproute2, util-linux and python3 (`tools/hosts/ns-hosts \
                 check` says what is missing)"
            }
            Prerequisite::Slurm => {
                "install Debian's slurm-wlm, munge and libpmix-dev (as .ci/slurm.sh does) and \
                 run as root where namespaced hosts can be made"
            }
            Prerequisite::OpenMpi => "install Debian's openmpi-bin (as .ci/slurm.sh does)",
        }
    }

    /// The prerequisite called `name`.
    pub fn from_name(name: &str) -> Option<Prerequisite> {
        Prerequisite::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The prerequisites a [`REQUIRE`] value names: comma-separated names or `all`; spaces
/// and empty items are ignored. An unknown name is an error naming the known ones.
pub fn parse(list: &str) -> Result<Vec<Prerequisite>, String> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item == "all" {
            out.extend(Prerequisite::ALL);
        } else if let Some(p) = Prerequisite::from_name(item) {
            out.push(p);
        } else {
            let known: Vec<&str> = Prerequisite::ALL.iter().map(|p| p.name()).collect();
            return Err(format!(
                "{REQUIRE}: unknown prerequisite `{item}` (known: {}, or all)",
                known.join(", ")
            ));
        }
    }
    Ok(out)
}

/// Whether this run requires `p`: [`REQUIRE`] names it (or `all`), or, for
/// [`Prerequisite::LongtermPin`], the older `PAGEWIRE_REQUIRE_LONGTERM_PIN` is set. Panics
/// on a [`REQUIRE`] value that names an unknown prerequisite.
pub fn required(p: Prerequisite) -> bool {
    if p == Prerequisite::LongtermPin && std::env::var_os(REQUIRE_LONGTERM_PIN).is_some() {
        return true;
    }
    match std::env::var(REQUIRE) {
        Ok(list) => parse(&list).unwrap_or_else(|e| panic!("{e}")).contains(&p),
        Err(_) => false,
    }
}

/// The value of `available`, or, when it is an error (prerequisite `p` is missing here,
/// for the reason it gives): a failure of the test if this run [`required`] `p`, else one
/// line saying the test is skipped and `None`, upon which the test returns:
///
/// ```ignore
/// let Some(launcher) = require(Prerequisite::Mpirun, mpirun::launcher()) else { return };
/// ```
pub fn require<T, E: Display>(p: Prerequisite, available: Result<T, E>) -> Option<T> {
    match available {
        Ok(v) => Some(v),
        Err(why) => {
            let name = p.name();
            let how = p.how();
            if required(p) {
                panic!("missing prerequisite `{name}` ({REQUIRE} requires it): {why}; to provide it: {how}");
            }
            eprintln!(
                "skipped: missing prerequisite `{name}`: {why}; to provide it: {how} \
                 ({REQUIRE}={name} makes this a failure)"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_name_prerequisites_or_all() {
        assert_eq!(
            parse("mpirun, hugepages,,longterm-pin").unwrap(),
            [
                Prerequisite::Mpirun,
                Prerequisite::HugePages,
                Prerequisite::LongtermPin
            ]
        );
        assert_eq!(parse("all").unwrap(), Prerequisite::ALL);
        assert_eq!(parse("").unwrap(), []);
        let e = parse("mpirun,hugepage").unwrap_err();
        assert!(e.contains("`hugepage`") && e.contains("hugepages"), "{e}");
    }

    #[test]
    fn every_name_parses_back() {
        for p in Prerequisite::ALL {
            assert_eq!(Prerequisite::from_name(p.name()), Some(p));
            assert!(!p.how().is_empty());
        }
    }

    #[test]
    fn an_available_prerequisite_is_its_value() {
        assert_eq!(require(Prerequisite::RdmaOdp, Ok::<_, String>(3)), Some(3));
    }
}
