//! The bootstrap's collectives, one at a time: who has joined the incomplete one, who has
//! left the job, and what the ranks are answered. Shared by the local launcher's server
//! (every rank on this host) and by `pwrun --hosts`'s frontend (ranks on every host, their
//! contributions relayed by the hosts' agents), so both fail and complete collectives the
//! same way (protocol in the `pwrun_client` module).

use super::super::pwrun_client::wire;

/// What the ranks are told after a step of [`Rounds`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing yet.
    Wait,
    /// The collective completed: every rank receives this RESULT payload.
    Complete(Vec<u8>),
    /// These ranks receive an ERROR with this text (their collective failed, or they
    /// broke the protocol).
    Fail { ranks: Vec<usize>, text: String },
}

/// The incomplete collective of a job of `size` ranks, and the ranks that have left.
#[derive(Debug)]
pub(crate) struct Rounds {
    contrib: Vec<Option<Vec<u8>>>,
    left: Vec<bool>,
    /// Completed collectives; the incomplete one (if any) has this index.
    round: u64,
}

impl Rounds {
    pub(crate) fn new(size: usize) -> Rounds {
        Rounds {
            contrib: vec![None; size],
            left: vec![false; size],
            round: 0,
        }
    }

    /// Rank `rank` joins the incomplete collective with `data`. `who(r)` describes rank
    /// `r` in an error (its pid, its host).
    pub(crate) fn join(
        &mut self,
        rank: usize,
        data: Vec<u8>,
        who: impl Fn(usize) -> String,
    ) -> Answer {
        if self.contrib[rank].is_some() {
            return Answer::Fail {
                ranks: vec![rank],
                text: format!("rank {rank} joined collective #{} twice", self.round),
            };
        }
        self.contrib[rank] = Some(data);
        self.progress(who)
    }

    /// Rank `rank` has left the job (its process exited and its connection closed).
    pub(crate) fn leave(&mut self, rank: usize, who: impl Fn(usize) -> String) -> Answer {
        self.left[rank] = true;
        self.progress(who)
    }

    /// Completes the incomplete collective if every rank joined; fails it for the ranks
    /// waiting in it if a rank that has not joined has left.
    fn progress(&mut self, who: impl Fn(usize) -> String) -> Answer {
        if !self.contrib.iter().any(Option::is_some) {
            return Answer::Wait;
        }
        if self.contrib.iter().all(Option::is_some) {
            let parts = self
                .contrib
                .iter()
                .map(|c| c.as_deref().unwrap_or_default());
            let payload = wire::encode_result(parts);
            let total: usize = self
                .contrib
                .iter()
                .map(|c| c.as_ref().map_or(0, Vec::len))
                .sum();
            self.contrib.iter_mut().for_each(|c| *c = None);
            let round = self.round;
            self.round += 1;
            return match payload {
                Some(p) => Answer::Complete(p),
                None => Answer::Fail {
                    ranks: (0..self.contrib.len()).collect(),
                    text: format!(
                        "collective #{round}: the {total} gathered bytes exceed the {} MiB frame limit",
                        wire::MAX_FRAME >> 20
                    ),
                },
            };
        }
        let gone = (0..self.contrib.len()).find(|&r| self.left[r] && self.contrib[r].is_none());
        match gone {
            Some(gone) => {
                let text = format!(
                    "rank {gone} ({}) left the job before joining collective #{}",
                    who(gone),
                    self.round
                );
                let ranks = (0..self.contrib.len())
                    .filter(|&r| self.contrib[r].take().is_some())
                    .collect();
                Answer::Fail { ranks, text }
            }
            None => Answer::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(r: usize) -> String {
        format!("pid {}", 100 + r)
    }

    #[test]
    fn a_collective_completes_when_every_rank_joined() {
        let mut r = Rounds::new(3);
        assert_eq!(r.join(2, b"c".to_vec(), who), Answer::Wait);
        assert_eq!(r.join(0, b"a".to_vec(), who), Answer::Wait);
        let Answer::Complete(p) = r.join(1, b"bb".to_vec(), who) else {
            panic!("complete")
        };
        assert_eq!(
            wire::decode_result(&p).unwrap(),
            vec![b"a".to_vec(), b"bb".to_vec(), b"c".to_vec()]
        );
        // The next one starts empty.
        assert_eq!(r.join(1, Vec::new(), who), Answer::Wait);
    }

    #[test]
    fn a_rank_that_left_fails_the_waiting_ranks_and_later_joins() {
        let mut r = Rounds::new(3);
        assert_eq!(r.join(0, Vec::new(), who), Answer::Wait);
        let Answer::Fail { ranks, text } = r.leave(2, who) else {
            panic!("fail")
        };
        assert_eq!(ranks, vec![0]);
        assert_eq!(
            text,
            "rank 2 (pid 102) left the job before joining collective #0"
        );
        let Answer::Fail { ranks, .. } = r.join(1, Vec::new(), who) else {
            panic!("a later join fails too")
        };
        assert_eq!(ranks, vec![1]);
    }

    #[test]
    fn joining_twice_is_refused_to_that_rank() {
        let mut r = Rounds::new(2);
        assert_eq!(r.join(0, Vec::new(), who), Answer::Wait);
        assert_eq!(
            r.join(0, Vec::new(), who),
            Answer::Fail {
                ranks: vec![0],
                text: "rank 0 joined collective #0 twice".into()
            }
        );
    }
}
