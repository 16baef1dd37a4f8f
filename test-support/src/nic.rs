//! Ranks on the soft NIC, for pagewire-transport's multi-process tests: [`ranks`] runs a
//! test's body on `n` copies of the test binary, each with a bootstrap, a [`SoftNic`] and a
//! completion queue ([`Rank`]).

use std::time::{Duration, Instant};

use pagewire_transport::boot::{self, Bootstrap, JobOutcome, LaunchConfig};
use pagewire_transport::nic::soft::{SoftConfig, SoftNic};
use pagewire_transport::nic::{Completion, Endpoint, Nic, QpCaps, RegionInfo};

use crate::ROLE;

/// What a rank body gets.
pub struct Rank {
    /// The job's bootstrap (rank, size, allgather, barrier).
    pub boot: Box<dyn Bootstrap>,
    /// This rank's soft NIC.
    pub nic: SoftNic,
    /// A completion queue deep enough for every queue pair a test creates.
    pub cq: u32,
}

impl Rank {
    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.boot.rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.boot.size()
    }

    /// Creates a queue pair to every other rank (and to itself when `loopback`) and connects
    /// them; collective. Returns, per rank, the local queue pair number.
    pub fn connect_all(&self, loopback: bool) -> Vec<Option<u32>> {
        let (me, n) = (self.rank(), self.size());
        let mut qps = vec![None; n];
        let mut mine = Vec::new();
        for (peer, qp) in qps.iter_mut().enumerate() {
            if peer != me || loopback {
                let q = self
                    .nic
                    .create_qp(peer, self.cq, self.cq, QpCaps::default())
                    .unwrap();
                *qp = Some(q);
                mine.extend_from_slice(&(peer as u32).to_le_bytes());
                mine.extend_from_slice(&self.nic.endpoint(q).unwrap().0);
            }
        }
        let all = self.boot.allgather(&mine).unwrap();
        for (peer, blob) in all.iter().enumerate() {
            for rec in blob.chunks_exact(12) {
                let target = u32::from_le_bytes(rec[0..4].try_into().unwrap()) as usize;
                if target == me {
                    let q = qps[peer].expect("qp to peer");
                    self.nic.connect(q, &Endpoint(rec[4..12].to_vec())).unwrap();
                }
            }
        }
        self.boot.barrier().unwrap();
        qps
    }

    /// The queue pair to `peer` on a fresh connection between exactly two ranks `a` and `b`
    /// (collective for both); for error tests, where a failed request puts the pair in the
    /// error state.
    pub fn fresh_pair(&self, a: usize, b: usize) -> u32 {
        let peer = if self.rank() == a { b } else { a };
        let q = self
            .nic
            .create_qp(peer, self.cq, self.cq, QpCaps::default())
            .unwrap();
        let ep = self.nic.endpoint(q).unwrap();
        let all = self.boot.allgather(&ep.0).unwrap();
        self.nic.connect(q, &Endpoint(all[peer].clone())).unwrap();
        self.boot.barrier().unwrap();
        q
    }

    /// Waits for the next completion (fails the test after 60 s).
    pub fn wait(&self) -> Completion {
        let start = Instant::now();
        let mut out = Vec::with_capacity(1);
        loop {
            if self.nic.poll_cq(self.cq, &mut out, 1).unwrap() == 1 {
                return out[0];
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no completion within 60 s"
            );
            std::thread::yield_now();
        }
    }

    /// Every rank's (addr, rkey, len) of `region`.
    pub fn exchange(&self, region: &RegionInfo) -> Vec<(u64, u32, u64)> {
        let mut b = region.addr.to_le_bytes().to_vec();
        b.extend_from_slice(&region.rkey.to_le_bytes());
        b.extend_from_slice(&region.len.to_le_bytes());
        self.boot
            .allgather(&b)
            .unwrap()
            .iter()
            .map(|v| {
                (
                    u64::from_le_bytes(v[0..8].try_into().unwrap()),
                    u32::from_le_bytes(v[8..12].try_into().unwrap()),
                    u64::from_le_bytes(v[12..20].try_into().unwrap()),
                )
            })
            .collect()
    }
}

/// Runs `body` on `n` ranks of test `name` with extra environment `env`; in the parent,
/// asserts the job succeeded. Returns the outcome in the parent, `None` in a rank.
pub fn ranks(name: &str, n: usize, env: &[(&str, &str)], body: fn(&Rank)) -> Option<JobOutcome> {
    if std::env::var(ROLE).as_deref() == Ok(name) {
        let boot = boot::from_env().expect("bootstrap");
        let nic = SoftNic::new(&*boot, SoftConfig::from_env().expect("config")).expect("NIC up");
        // Deep enough for every queue pair a test creates (default caps: 2048 each).
        let cq = nic.create_cq(1 << 20).unwrap();
        let r = Rank { boot, nic, cq };
        body(&r);
        return None;
    }
    let outcome = launch(name, n, env, None);
    assert!(outcome.success(), "job of test {name} failed: {outcome:?}");
    Some(outcome)
}

/// Launches `n` ranks of test `name` (optionally each through a `wrapper` such as
/// `prlimit`) and returns the outcome, without judging it.
pub fn launch(name: &str, n: usize, env: &[(&str, &str)], wrapper: Option<&[&str]>) -> JobOutcome {
    let cfg = LaunchConfig::current_test(name, n, ROLE, env, wrapper, Duration::from_secs(120))
        .expect("current_exe");
    boot::launch(&cfg).expect("launch")
}

/// Asserts that a start-up error of the verbs provider on a machine without an RDMA device is
/// one line that says what is missing and names the soft provider (`PAGEWIRE_TRANSPORT=soft`).
pub fn assert_one_line_naming_the_soft_provider(msg: &str) {
    assert!(!msg.contains('\n'), "not one line: {msg:?}");
    assert!(
        msg.contains("RDMA device"),
        "does not say what is missing: {msg}"
    );
    assert!(
        msg.contains("soft provider") && msg.contains("PAGEWIRE_TRANSPORT=soft"),
        "does not name the soft provider: {msg}"
    );
}
