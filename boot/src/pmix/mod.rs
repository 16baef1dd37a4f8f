//! A PMIx client: the bootstrap of a rank started by a launcher that serves PMIx, as Open
//! MPI's `mpirun` and Slurm's `srun --mpi=pmix` do (they set `PMIX_NAMESPACE` and
//! `PMIX_RANK`). libpmix is loaded when such a rank starts ([`ffi`]), not linked: the default
//! build needs no system library, and a binary built anywhere runs under PMIx wherever the
//! launcher's own libpmix is installed.
//!
//! The job's size and placement are the namespace's (`pmix.job.size`, `pmix.local.size`,
//! `pmix.num.nodes`); an allgather puts a byte object, commits, fences collecting the data,
//! and gets each rank's (the pattern that needs no direct request to another node's
//! server). A failing rank calls `PMIx_Abort`, which makes the launcher end the job with
//! its code.

#[allow(unsafe_code)]
mod ffi;

use self::ffi::{PmixClient, PmixValue, RANK_WILDCARD};
use super::kvs::{count_of, job_id_of, KeyValueStore, KvsBootstrap};
use pagewire_sys::{Error, Result};

fn pmix_error(what: impl std::fmt::Display) -> Error {
    Error::Bootstrap(format!("PMIx (the launcher's process manager): {what}"))
}

/// A PMIx namespace's key-value space.
struct PmixStore {
    client: PmixClient,
}

impl KeyValueStore for PmixStore {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.client.put(key, value).map_err(pmix_error)
    }

    fn fence(&mut self) -> Result<()> {
        self.client.commit_and_fence().map_err(pmix_error)
    }

    fn get(&mut self, rank: usize, key: &str) -> Result<Vec<u8>> {
        match self.client.get(rank as u32, key).map_err(pmix_error)? {
            Some(PmixValue::Bytes(b)) => Ok(b),
            Some(other) => Err(pmix_error(format!(
                "rank {rank}'s {key} is {other:?}, not bytes"
            ))),
            None => Err(pmix_error(format!("rank {rank} put no {key}"))),
        }
    }

    fn abort(&mut self, code: i32, message: &str) {
        self.client.abort(code, message);
    }

    fn finalize(&mut self) {
        self.client.finalize();
    }
}

/// Connects to the PMIx server of the launcher that started this process.
pub(super) fn connect_from_env() -> Result<KvsBootstrap> {
    let client = PmixClient::init().map_err(|e| {
        pmix_error(format!(
            "{e}; this process was started by a PMIx launcher (PMIX_NAMESPACE and PMIX_RANK \
             are set), whose library pagewire loads at start-up: install it (Debian: \
             libpmix2) or start the program with pwrun"
        ))
    })?;
    let number = |rank: u32, key: &str| -> Result<Option<u64>> {
        match client.get(rank, key).map_err(pmix_error)? {
            Some(PmixValue::Number(n)) => Ok(Some(n)),
            None => Ok(None),
            Some(other) => Err(pmix_error(format!("{key} is {other:?}, not a number"))),
        }
    };
    let size = number(RANK_WILDCARD, "pmix.job.size")?
        .ok_or_else(|| pmix_error("the server gives no job size (pmix.job.size)"))?
        as usize;
    let rank = client.rank() as usize;
    if size == 0 || rank >= size {
        return Err(pmix_error(format!(
            "rank {rank} is not below the job size {size}"
        )));
    }
    let namespace = client.namespace();
    let nodes = number(RANK_WILDCARD, "pmix.num.nodes")?;
    let here = number(RANK_WILDCARD, "pmix.local.size")?;
    let placement = match (nodes, here) {
        (Some(n), Some(h)) => format!("{size} ranks on {}, {h} on this one", count_of(n, "node")),
        _ => format!("{size} ranks"),
    };
    let starter = format!(
        "{}, PMIx ({}), namespace {namespace}, {placement}",
        if std::env::var_os("SLURM_JOB_ID").is_some() {
            "Slurm's srun --mpi=pmix"
        } else if std::env::var_os("OMPI_COMM_WORLD_RANK").is_some() {
            "Open MPI's mpirun"
        } else {
            "a PMIx launcher"
        },
        // "OpenPMIx 4.2.2rc2 (PMIx Standard: 4.2, ...)": its first part.
        client.version().split(" (").next().unwrap_or_default()
    );
    Ok(KvsBootstrap::new(
        rank,
        size,
        job_id_of("x", &namespace),
        starter,
        Box::new(PmixStore { client }),
    ))
}
