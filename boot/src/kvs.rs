//! The bootstrap of a rank started by a process manager that keeps a key-value space for
//! its job: PMI-1 (MPICH's hydra; Slurm's `srun --mpi=pmi2` serves it too), PMI-2 (Slurm,
//! hydra) and PMIx (Open MPI's `mpirun`, `srun --mpi=pmix`). Each is a [`KeyValueStore`];
//! an allgather is the same on all three: every rank puts its bytes under a key of the
//! round, the job passes a fence, and every rank gets the others'.

use parking_lot::Mutex;

use super::Bootstrap;
use pagewire_sys::Result;

/// What a rank asks of its process manager's key-value space.
pub(super) trait KeyValueStore: Send {
    /// Stores `value` under `key` for this rank (visible to the others after [`fence`]).
    ///
    /// [`fence`]: KeyValueStore::fence
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()>;
    /// Makes every rank's puts before it visible to the gets after it (a server may answer
    /// at once and have the gets wait instead).
    fn fence(&mut self) -> Result<()>;
    /// Returns once every rank has called it. Default: the fence, where it is a
    /// collective.
    fn barrier(&mut self) -> Result<()> {
        self.fence()
    }
    /// The value rank `rank` put under `key` before the last fence.
    fn get(&mut self, rank: usize, key: &str) -> Result<Vec<u8>>;
    /// Asks the process manager to end the whole job with `code`, saying `message`.
    fn abort(&mut self, code: i32, message: &str);
    /// Tells the process manager this rank ends in order.
    fn finalize(&mut self);
}

/// A [`Bootstrap`] over a process manager's key-value space.
pub(super) struct KvsBootstrap {
    rank: usize,
    size: usize,
    job: String,
    starter: String,
    store: Mutex<Store>,
}

struct Store {
    kvs: Box<dyn KeyValueStore>,
    /// Collectives completed, naming the keys of the next.
    round: u64,
    finalized: bool,
}

impl KvsBootstrap {
    /// Rank `rank` of `size` in job `job` (`[0-9a-z]`), started by `starter` (one line for
    /// `PAGEWIRE_VERBOSE=1`).
    pub(super) fn new(
        rank: usize,
        size: usize,
        job: String,
        starter: String,
        kvs: Box<dyn KeyValueStore>,
    ) -> KvsBootstrap {
        KvsBootstrap {
            rank,
            size,
            job,
            starter,
            store: Mutex::new(Store {
                kvs,
                round: 0,
                finalized: false,
            }),
        }
    }
}

impl Bootstrap for KvsBootstrap {
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
        self.starter.clone()
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut s = self.store.lock();
        let key = format!("pw{}", s.round);
        s.round += 1;
        s.kvs.put(&key, mine)?;
        s.kvs.fence()?;
        (0..self.size)
            .map(|r| {
                if r == self.rank {
                    Ok(mine.to_vec())
                } else {
                    s.kvs.get(r, &key)
                }
            })
            .collect()
    }

    fn barrier(&self) -> Result<()> {
        self.store.lock().kvs.barrier()
    }

    fn abort(&self, code: i32, message: &str) {
        let mut s = self.store.lock();
        s.finalized = true;
        s.kvs.abort(code, message);
    }
}

impl Drop for KvsBootstrap {
    fn drop(&mut self) {
        let s = self.store.get_mut();
        if s.finalized {
            return;
        }
        if std::thread::panicking() && self.size > 1 {
            // Unwinding: the others may be waiting for this rank; have the process manager
            // end the job, as pwrun does when a rank fails.
            s.kvs
                .abort(1, &format!("pagewire: rank {} failed", self.rank));
        } else {
            s.kvs.finalize();
        }
    }
}

/// Lowercase hex of `bytes`: how the text protocols (PMI-1, PMI-2) carry bytes.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of hex text `s`, or `None` if it is not hex.
pub(super) fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A job id (`[0-9a-z]`, at most 24 characters after `prefix`) from a name every rank of the
/// job shares and no other job has (a key-value space's, a namespace's).
pub(super) fn job_id_of(prefix: &str, name: &str) -> String {
    let mut id: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    id.truncate(24);
    if id.is_empty() {
        id.push_str("job");
    }
    format!("{prefix}{id}")
}

/// `n` `thing`s in words: "1 node", "2 nodes".
pub(super) fn count_of(n: u64, thing: &str) -> String {
    match n {
        1 => format!("1 {thing}"),
        n => format!("{n} {thing}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    #[test]
    fn hex_and_job_ids() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&bytes)).unwrap(), bytes);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(job_id_of("p", "kvs_1234_0"), "pkvs12340");
        assert_eq!(job_id_of("x", "slurm.pmix.12.0"), "xslurmpmix120");
        assert_eq!(job_id_of("p", "__"), "pjob");
    }

    type Map = HashMap<(usize, String), Vec<u8>>;

    /// Two ranks' stores over one shared map; a fence waits for both.
    struct SharedStore {
        rank: usize,
        map: Arc<(std::sync::Mutex<Map>, std::sync::Barrier)>,
        log: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl KeyValueStore for SharedStore {
        fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
            self.map
                .0
                .lock()
                .unwrap()
                .insert((self.rank, key.into()), value.into());
            Ok(())
        }
        fn fence(&mut self) -> Result<()> {
            self.map.1.wait();
            Ok(())
        }
        fn get(&mut self, rank: usize, key: &str) -> Result<Vec<u8>> {
            Ok(self.map.0.lock().unwrap()[&(rank, key.to_string())].clone())
        }
        fn abort(&mut self, code: i32, message: &str) {
            self.log
                .lock()
                .unwrap()
                .push(format!("abort {code} {message}"));
        }
        fn finalize(&mut self) {
            self.log
                .lock()
                .unwrap()
                .push(format!("finalize {}", self.rank));
        }
    }

    #[test]
    fn allgathers_go_through_put_fence_get_and_the_end_is_told() {
        let map = Arc::new((Default::default(), std::sync::Barrier::new(2)));
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (map, log) = (map.clone(), log.clone());
                std::thread::spawn(move || {
                    let b = KvsBootstrap::new(
                        rank,
                        2,
                        "pjob".into(),
                        "test".into(),
                        Box::new(SharedStore { rank, map, log }),
                    );
                    let first = b.allgather(format!("rank {rank}").as_bytes()).unwrap();
                    let second = b.allgather(&[rank as u8; 3]).unwrap();
                    b.barrier().unwrap();
                    (first, second)
                })
            })
            .collect();
        for h in handles {
            let (first, second) = h.join().unwrap();
            assert_eq!(first, vec![b"rank 0".to_vec(), b"rank 1".to_vec()]);
            assert_eq!(second, vec![vec![0u8; 3], vec![1u8; 3]]);
        }
        let mut log = log.lock().unwrap().clone();
        log.sort();
        assert_eq!(log, ["finalize 0", "finalize 1"]);
    }

    #[test]
    fn an_abort_replaces_the_finalize() {
        let map = Arc::new((Default::default(), std::sync::Barrier::new(1)));
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let b = KvsBootstrap::new(
            0,
            1,
            "pjob".into(),
            "test".into(),
            Box::new(SharedStore {
                rank: 0,
                map,
                log: log.clone(),
            }),
        );
        b.abort(3, "stop");
        drop(b);
        assert_eq!(*log.lock().unwrap(), ["abort 3 stop"]);
    }
}
