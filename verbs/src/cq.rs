//! Completion-queue depth accounting: a completion queue must hold every completion the
//! queue pairs it serves can have outstanding, or a burst overruns it. An overrun is not a
//! full queue the caller can poll its way out of: the device raises `IBV_EVENT_CQ_ERR`
//! (`ibv_get_async_event(3)`: "CQ is in error (CQ overrun)") and the queue is unusable from
//! then on, every later completion of every queue pair on it lost.
//!
//! What a queue pair can have outstanding on a completion queue is bounded by its work
//! request rings (`wr_ring::WrRing`): a request's slot is freed only when its completion is
//! polled, so at most `send depth` completions of its send queue and `recv depth` of its
//! receive queue are in the completion queues at any time, whether signaled or not (every error
//! completes, and a queue pair in ERROR flushes everything it holds). `create_qp` reserves
//! that much of each completion queue it uses, against the size `ibv_create_cq` granted
//! (`cq->cqe`, which may exceed the size asked for), and refuses a queue pair that does not
//! fit.
#![forbid(unsafe_code)]

/// The completions one queue pair can have outstanding on one completion queue: its send
/// depth if that is its send queue's, plus its receive depth if that is its receive queue's.
pub(crate) fn demand(send_depth: u32, recv_depth: u32, for_sends: bool, for_recvs: bool) -> u64 {
    let mut d = 0;
    if for_sends {
        d += u64::from(send_depth);
    }
    if for_recvs {
        d += u64::from(recv_depth);
    }
    d
}

/// The part of one completion queue promised to the queue pairs on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CqBudget {
    capacity: u64,
    committed: u64,
    queue_pairs: u32,
}

/// Why a queue pair does not fit a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Overcommit {
    /// Entries of the completion queue.
    pub capacity: u64,
    /// Entries already promised.
    pub committed: u64,
    /// To this many queue pairs.
    pub queue_pairs: u32,
    /// What the new queue pair needs.
    pub demand: u64,
}

impl Overcommit {
    /// One line for the caller: the numbers and what to change.
    pub(crate) fn message(&self, cq: u32, peer: usize, send_depth: u32, recv_depth: u32) -> String {
        format!(
            "completion queue {cq} has {} entries, {} of them promised to {} queue pairs; the \
             queue pair towards rank {peer} ({send_depth} send and {recv_depth} receive \
             requests) could add {} completions, so a burst could overrun the queue \
             (IBV_EVENT_CQ_ERR, after which it is unusable): create the completion queue with \
             at least {} entries (the send plus receive depths of every queue pair it serves), \
             or give this queue pair a completion queue of its own",
            self.capacity,
            self.committed,
            self.queue_pairs,
            self.demand,
            self.committed + self.demand
        )
    }
}

impl CqBudget {
    /// A completion queue of `capacity` entries (what `ibv_create_cq` granted) with nothing
    /// promised yet.
    pub(crate) fn new(capacity: u32) -> CqBudget {
        CqBudget {
            capacity: u64::from(capacity),
            committed: 0,
            queue_pairs: 0,
        }
    }

    /// Its entries.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Promises `demand` entries to one more queue pair, or says why they are not there.
    pub(crate) fn reserve(&mut self, demand: u64) -> Result<(), Overcommit> {
        if self.committed + demand > self.capacity {
            return Err(Overcommit {
                capacity: self.capacity,
                committed: self.committed,
                queue_pairs: self.queue_pairs,
                demand,
            });
        }
        self.committed += demand;
        self.queue_pairs += 1;
        Ok(())
    }

    /// Takes back a promise of [`CqBudget::reserve`] (the queue pair was not made after all).
    pub(crate) fn release(&mut self, demand: u64) {
        self.committed = self.committed.saturating_sub(demand);
        self.queue_pairs = self.queue_pairs.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message layer's set-up today (`msg/mod.rs`): one 65,536-entry completion queue for
    /// every queue pair, each with 4,096 send requests and `credits + control_slots` = 16 + 8
    /// receive requests.
    #[test]
    fn a_shared_completion_queue_fits_only_the_queue_pairs_it_can_hold() {
        let (send, recv) = (4096, 16 + 8);
        let per_qp = demand(send, recv, true, true);
        assert_eq!(per_qp, 4120);
        let mut cq = CqBudget::new(65_536);
        for _ in 0..15 {
            cq.reserve(per_qp).unwrap();
        }
        // The 16th queue pair (a job of 16 ranks, counting the loopback one) could overrun it.
        let e = cq.reserve(per_qp).unwrap_err();
        assert_eq!(
            e,
            Overcommit {
                capacity: 65_536,
                committed: 15 * 4120,
                queue_pairs: 15,
                demand: 4120
            }
        );
        let m = e.message(0, 15, send, recv);
        assert!(m.contains("at least 65920 entries"), "{m}");
        assert!(m.contains("IBV_EVENT_CQ_ERR") && !m.contains('\n'), "{m}");
        // Refused promises take nothing.
        assert_eq!(cq.reserve(65_536 - 15 * 4120), Ok(()));
        assert!(cq.reserve(1).is_err());
        // Sized for 16 ranks, it holds 16 queue pairs.
        let mut sized = CqBudget::new(16 * 4120);
        for _ in 0..16 {
            sized.reserve(per_qp).unwrap();
        }
        assert!(sized.reserve(1).is_err());
    }

    #[test]
    fn separate_send_and_receive_queues_each_take_their_own_side() {
        assert_eq!(demand(100, 7, true, false), 100);
        assert_eq!(demand(100, 7, false, true), 7);
        assert_eq!(demand(100, 7, false, false), 0);
        let mut sends = CqBudget::new(200);
        let mut recvs = CqBudget::new(14);
        for _ in 0..2 {
            sends.reserve(demand(100, 7, true, false)).unwrap();
            recvs.reserve(demand(100, 7, false, true)).unwrap();
        }
        assert!(sends.reserve(100).is_err() && recvs.reserve(7).is_err());
        // A queue pair whose creation failed gives its share back.
        sends.release(100);
        assert_eq!(sends.reserve(100), Ok(()));
        assert_eq!(sends.capacity(), 200);
    }
}
