//! The bootstrap under an MPI launcher (feature `mpi`): `mpirun -np N program` of MPICH
//! (hydra) or Open MPI starts the ranks, and rank, size and the address exchange go through
//! the host MPI library by rsmpi. After start-up, data moves on pagewire's own NIC; MPI stays
//! initialised for the bootstrap's barriers and for a host-MPI backend that borrows its
//! world communicator ([`MpiBootstrap::world`]).
//!
//! # Ownership and finalisation
//!
//! [`MpiBootstrap`] is the only owner of rsmpi's `Universe`: `MPI_Init_thread` runs in
//! [`MpiBootstrap::init`] and `MPI_Finalize` when the bootstrap is dropped. The facade drops
//! its bootstrap last, after its final barrier and after the NIC, so finalisation comes
//! after pagewire's last use of MPI. Borrowed communicators ([`MpiWorld`]) cannot outlive it.
//! A rank that drops the bootstrap while unwinding from a panic calls `MPI_Abort` instead:
//! finalising is collective in practice, and the other ranks may be waiting for this one in
//! a receive; the launcher then takes the job down with a non-zero exit.
//!
//! # Threads
//!
//! MPI is initialised with `MPI_THREAD_FUNNELED`: the soft NIC's driver thread never calls
//! MPI, and every MPI call comes from the thread that initialised it. That is checked: a
//! call from another thread returns [`Error::Bootstrap`] instead of breaking MPI's rules
//! (`Bootstrap` is `Sync`, so the compiler cannot check it). `FUNNELED` rather than
//! `MULTIPLE` keeps MPICH off its global lock, which would slow the host-MPI baseline.
//!
//! # Failures
//!
//! MPI's default error handler (`MPI_ERRORS_ARE_FATAL`) stays on the world communicator: a
//! rank that dies makes the launcher kill the job, so a collective fails the job rather
//! than hanging.

use std::marker::PhantomData;
use std::thread::ThreadId;

use mpi::collective::{CommunicatorCollectives, Root};
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;

use super::{new_job_id, Bootstrap};
use pagewire_sys::{Error, Result};

/// Length of a job id ([`new_job_id`]).
const JOB_ID_LEN: usize = 12;

/// Rank discovery and address exchange through the host MPI library (`MPI_COMM_WORLD`).
pub struct MpiBootstrap {
    /// Finalises MPI when dropped; never touched otherwise.
    universe: Option<Universe>,
    rank: usize,
    size: usize,
    job: String,
    threading: Threading,
    main_thread: ThreadId,
}

impl std::fmt::Debug for MpiBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiBootstrap")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("job", &self.job)
            .field("threading", &self.threading)
            .finish()
    }
}

/// `MPI_COMM_WORLD`, borrowed from the [`MpiBootstrap`] that keeps MPI initialised.
/// Dereferences to rsmpi's communicator.
pub struct MpiWorld<'boot> {
    comm: SimpleCommunicator,
    _boot: PhantomData<&'boot MpiBootstrap>,
}

impl std::fmt::Debug for MpiWorld<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MpiWorld(MPI_COMM_WORLD)")
    }
}

impl std::ops::Deref for MpiWorld<'_> {
    type Target = SimpleCommunicator;
    fn deref(&self) -> &SimpleCommunicator {
        &self.comm
    }
}

impl MpiBootstrap {
    /// Initialises MPI (`MPI_Init_thread`, `MPI_THREAD_FUNNELED`) and agrees on a job id:
    /// rank 0 draws one and broadcasts it. Collective over `MPI_COMM_WORLD`. Fails if MPI is
    /// already initialised in this process or cannot give `FUNNELED`.
    pub fn init() -> Result<MpiBootstrap> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| {
                Error::Bootstrap(
                    "MPI is already initialised in this process; pagewire's MPI bootstrap must \
                     be the one to initialise it (it owns MPI until the universe is dropped)"
                        .into(),
                )
            })?;
        let mut boot = MpiBootstrap {
            universe: Some(universe),
            rank: 0,
            size: 1,
            job: String::new(),
            threading,
            main_thread: std::thread::current().id(),
        };
        if threading < Threading::Funneled {
            // Dropping `boot` finalises MPI: the error is the same on every rank.
            return Err(Error::Bootstrap(format!(
                "the MPI library gives thread level {threading:?}, but pagewire needs \
                 MPI_THREAD_FUNNELED (its NIC driver thread runs beside the MPI thread)"
            )));
        }
        let world = SimpleCommunicator::world();
        boot.rank = usize::try_from(world.rank()).expect("MPI ranks are non-negative");
        boot.size = usize::try_from(world.size()).expect("MPI sizes are positive");
        let mut id = [0u8; JOB_ID_LEN];
        if boot.rank == 0 {
            let mine = new_job_id();
            id.copy_from_slice(&mine.as_bytes()[..JOB_ID_LEN]);
        }
        world.process_at_rank(0).broadcast_into(&mut id[..]);
        boot.job = parse_job_id(&id)?;
        Ok(boot)
    }

    /// `MPI_COMM_WORLD`, for a layer that routes calls to the host MPI library. It borrows
    /// the bootstrap, so it cannot be used after MPI is finalised. Calls on it must come
    /// from the thread that created the bootstrap ([`MpiBootstrap::check_thread`]).
    pub fn world(&self) -> MpiWorld<'_> {
        MpiWorld {
            comm: SimpleCommunicator::world(),
            _boot: PhantomData,
        }
    }

    /// The thread level MPI gave (at least `Funneled`).
    pub fn threading(&self) -> Threading {
        self.threading
    }

    /// The MPI library's version string (`MPI_Get_library_version`), first line.
    pub fn library_version(&self) -> String {
        mpi::environment::library_version()
            .ok()
            .and_then(|v| v.lines().next().map(|l| l.trim().to_string()))
            .unwrap_or_else(|| "unknown MPI library".into())
    }

    /// Fails unless called from the thread that initialised MPI (`MPI_THREAD_FUNNELED`).
    pub fn check_thread(&self, what: &str) -> Result<()> {
        if std::thread::current().id() == self.main_thread {
            Ok(())
        } else {
            Err(Error::Bootstrap(format!(
                "{what}: MPI was initialised with MPI_THREAD_FUNNELED by another thread; call \
                 MPI only from the thread that started pagewire"
            )))
        }
    }
}

impl Bootstrap for MpiBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn job_id(&self) -> &str {
        &self.job
    }

    fn starter(&self) -> String {
        format!(
            "an MPI launcher, through the MPI library ({})",
            self.library_version()
        )
    }

    fn abort(&self, code: i32, _message: &str) {
        MpiBootstrap::abort(self, code)
    }

    /// `MPI_Allgather` of the lengths, then `MPI_Allgatherv` of the bytes.
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.check_thread("allgather")?;
        let world = self.world();
        let len = i32::try_from(mine.len()).map_err(|_| {
            Error::InvalidArgument(format!(
                "an allgather contribution of {} bytes exceeds MPI's count limit",
                mine.len()
            ))
        })?;
        let mut counts = vec![0i32; self.size];
        world.all_gather_into(&len, &mut counts[..]);
        let displs = displacements(&counts)?;
        let total = displs.last().copied().unwrap_or(0) as usize
            + counts.last().copied().unwrap_or(0) as usize;
        let mut all = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            world.all_gather_varcount_into(mine, &mut part);
        }
        Ok(split(&all, &counts))
    }

    /// `MPI_Barrier` on `MPI_COMM_WORLD`.
    fn barrier(&self) -> Result<()> {
        self.check_thread("barrier")?;
        self.world().barrier();
        Ok(())
    }

    fn as_mpi(&self) -> Option<&MpiBootstrap> {
        Some(self)
    }
}

impl MpiBootstrap {
    /// Ends the whole MPI job with `code` (`MPI_Abort` on `MPI_COMM_WORLD`), after a short
    /// pause that lets the launcher forward what this rank wrote last.
    pub fn abort(&self, code: i32) -> ! {
        std::thread::sleep(std::time::Duration::from_millis(100));
        SimpleCommunicator::world().abort(code)
    }
}

impl Drop for MpiBootstrap {
    fn drop(&mut self) {
        if std::thread::panicking() && self.size > 1 {
            // Unwinding: do not finalise (it would wait for ranks that may be waiting for
            // us); take the job down, as pwrun does when a rank fails.
            eprintln!("pagewire: rank {} failed; aborting the MPI job", self.rank);
            // Hydra's proxies may drop what a rank wrote just before MPI_Abort (they kill
            // the job on the abort message, racing the output pipes); a short pause on this
            // failure path gives the line above, and the panic message, time to be forwarded.
            std::thread::sleep(std::time::Duration::from_millis(100));
            SimpleCommunicator::world().abort(1);
        }
        // MPI_Finalize (rsmpi's Universe drop).
        drop(self.universe.take());
    }
}

/// Checks a broadcast job id: `[0-9a-z]`, as [`Bootstrap::job_id`] promises.
fn parse_job_id(id: &[u8]) -> Result<String> {
    if id
        .iter()
        .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    {
        Ok(String::from_utf8(id.to_vec()).expect("ASCII"))
    } else {
        Err(Error::Bootstrap(format!(
            "rank 0 broadcast a malformed job id {id:?}"
        )))
    }
}

/// Displacements of the blocks packed in rank order; fails past MPI's `int` range.
fn displacements(counts: &[i32]) -> Result<Vec<i32>> {
    let mut displs = Vec::with_capacity(counts.len());
    let mut at: i64 = 0;
    for (rank, &c) in counts.iter().enumerate() {
        if c < 0 {
            return Err(Error::Bootstrap(format!(
                "rank {rank} announced a negative contribution of {c} bytes"
            )));
        }
        displs.push(i32::try_from(at).map_err(|_| too_big(counts))?);
        at += i64::from(c);
    }
    i32::try_from(at).map_err(|_| too_big(counts))?;
    Ok(displs)
}

fn too_big(counts: &[i32]) -> Error {
    let total: i64 = counts.iter().map(|&c| i64::from(c)).sum();
    Error::InvalidArgument(format!(
        "an allgather of {total} bytes in all exceeds MPI's count limit ({} bytes)",
        i32::MAX
    ))
}

/// Cuts the packed blocks apart.
fn split(all: &[u8], counts: &[i32]) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for &c in counts {
        let c = c as usize;
        out.push(all[at..at + c].to_vec());
        at += c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displacements_are_prefix_sums() {
        assert_eq!(displacements(&[3, 0, 5, 1]).unwrap(), vec![0, 3, 3, 8]);
        assert_eq!(displacements(&[]).unwrap(), Vec::<i32>::new());
        assert!(displacements(&[1, -1]).is_err());
        let e = displacements(&[i32::MAX, 1]).unwrap_err().to_string();
        assert!(e.contains("count limit"), "{e}");
    }

    #[test]
    fn split_cuts_in_rank_order() {
        let all = b"abcdefgh";
        assert_eq!(
            split(all, &[3, 0, 5]),
            vec![b"abc".to_vec(), Vec::new(), b"defgh".to_vec()]
        );
    }

    #[test]
    fn job_ids_are_checked() {
        assert_eq!(parse_job_id(b"0123456789ab").unwrap(), "0123456789ab");
        assert!(parse_job_id(b"01234567/9ab").is_err());
        let fresh = new_job_id();
        assert_eq!(fresh.len(), JOB_ID_LEN);
        assert!(parse_job_id(fresh.as_bytes()).is_ok());
    }
}
