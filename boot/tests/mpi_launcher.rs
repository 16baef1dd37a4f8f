//! A program started by an MPI launcher but built without the `mpi` feature: with `PMI_FD`
//! set (hydra, `srun --mpi=pmi2`) it bootstraps through the PMI client, and a `PMI_FD` that
//! is no connection is a clear error; half a PMIx launch, or an MPI launcher's variable with
//! neither PMI's nor PMIx's, fails at bootstrap with a message that says what is missing,
//! instead of running as N one-rank jobs (docs/launching.md, "Running on a cluster").
//! `.ci/mpi.sh` and `.ci/slurm.sh` check the working cases under real launchers.
#![cfg(not(feature = "mpi"))]

use pagewire_boot::{self as boot, Launcher};

/// The only test of this binary: it changes the process environment.
#[test]
fn mpi_launcher_without_the_feature_is_a_clear_error() {
    std::env::remove_var(boot::ENV_BOOT_SOCKET);
    assert_eq!(Launcher::detect(), Launcher::None);
    // What MPICH's hydra sets in each rank, with a descriptor that is not open here.
    std::env::set_var("PMI_RANK", "1");
    std::env::set_var("PMI_SIZE", "2");
    std::env::set_var("PMI_FD", "987");
    assert_eq!(Launcher::detect(), Launcher::Mpi("PMI_RANK"));
    assert!(
        boot::under_launcher(),
        "a binary must not start itself under mpirun"
    );
    assert_eq!(boot::self_launch(2).unwrap(), None);
    let e = boot::from_env().err().expect("no bootstrap").to_string();
    assert!(e.contains("PMI (") && e.contains("PMI_FD=987"), "{e}");
    // A PMIx launcher's rank without its namespace: half a launch.
    for v in ["PMI_RANK", "PMI_SIZE", "PMI_FD"] {
        std::env::remove_var(v);
    }
    std::env::set_var("PMIX_RANK", "0");
    let e = boot::from_env().err().expect("no bootstrap").to_string();
    assert!(
        e.contains("PMIX_RANK is set but PMIX_NAMESPACE is not"),
        "{e}"
    );
    // Open MPI's variable alone: no server to reach without the feature.
    std::env::remove_var("PMIX_RANK");
    std::env::set_var("OMPI_COMM_WORLD_RANK", "0");
    let e = boot::from_env().err().expect("no bootstrap").to_string();
    assert!(e.contains("OMPI_COMM_WORLD_RANK is set"), "{e}");
    assert!(e.contains("rebuild with `--features mpi`"), "{e}");
}
