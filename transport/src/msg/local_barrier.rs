//! The barrier of ranks that all share this host: each rank stores, in every other
//! member's segment, how many barriers it has entered with it, and waits until every other
//! member's count has reached its own (`local::LocalPath::enter_barrier`), as MPICH's CH4
//! POSIX and Open MPI's `coll/sm` barriers do with flags in shared memory.
//!
//! A barrier of messages lets the ranks go one message's latency apart: the last to arrive
//! leaves at once and the first only when that rank's message reaches it. Here the first
//! leaves when one cache line reaches it, so the ranks leave a barrier together, which the
//! collectives timed after one (IMB's `-sync 1`) see too.
//!
//! The counts are per pair of ranks, not per communicator: a correct program enters the
//! blocking barriers of any two ranks in the same order on both (otherwise it deadlocks), so
//! the n-th barrier one rank enters with another is the other's n-th with it.

use super::PointToPoint;
use crate::error::{Error, Result};

impl PointToPoint {
    /// A barrier of the `size` ranks `world_rank(0..size)` if all of them are reached
    /// through the local path; false (nothing done) if not. Progress goes on while it waits;
    /// a member that died fails it with the status its death left.
    pub fn local_barrier(
        &mut self,
        size: usize,
        world_rank: impl Fn(usize) -> usize,
    ) -> Result<bool> {
        let me = self.rank;
        let others = || (0..size).map(&world_rank).filter(|&r| r != me);
        if size < 2 || !self.all_local_among(others()) {
            return Ok(false);
        }
        let local = self.local.as_mut().expect("a local path");
        for r in others() {
            local.enter_barrier(r);
        }
        let mut idle = super::liveness::IdleWait::default();
        loop {
            let local = self.local.as_mut().expect("a local path");
            let mut waiting = false;
            for r in others() {
                waiting |= !local.peer_entered_barrier(r);
            }
            if !waiting {
                return Ok(true);
            }
            if let Some((peer, status)) = others().find_map(|r| Some((r, self.peers[r].dead?))) {
                return Err(Error::Communication {
                    peer,
                    status,
                    what: "waiting in a barrier",
                });
            }
            self.progress()?;
            if idle.after_pass(self) {
                for r in others() {
                    self.send_liveness_probe(r);
                }
            }
        }
    }
}
