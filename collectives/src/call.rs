//! One collective call in progress: its messages, their tags, and what happens when ranks'
//! arguments do not match.
//!
//! # Tags
//!
//! Collective traffic runs in its own context, so it never matches point-to-point messages.
//! Within it, a message's tag names the collective and the algorithm:
//! `collective << 8 | algorithm`. MPI requires every rank to call a communicator's
//! collectives in the same order, and the message layer keeps messages between a pair in
//! order, so receives name their source and accept any tag; the tag is then checked.
//!
//! # Mismatched arguments
//!
//! A receive whose message is shorter or longer than expected (the sender's count differs)
//! or comes from another collective or algorithm is a *mismatch*. The rank that sees one
//! does not stop: it runs the rest of the algorithm's fixed schedule (same peers, same
//! number of messages, whatever the data), but every message it sends from then on is an
//! empty *error message*: tag `ERROR | detector << 8 | algorithm`. A rank that receives an
//! error message is poisoned the same way. So every rank whose result depends on the bad
//! data learns about it (and so may a rank that merely hears from a poisoned one later in
//! the schedule), nobody waits for a message that will not come, and every message sent
//! is received: the next collective starts clean. At the end the call returns
//! [`crate::Error::InvalidArgument`]: at the detecting rank with the ranks and counts, at
//! the others naming the detecting rank. A rank that returns `Ok` received every message at
//! the length it expected, from ranks that had seen nothing wrong (counts that differ but
//! happen to give equal message lengths on every path to a rank cannot be seen).

use pagewire_transport::msg::Status;

use crate::{Error, Group, Result};

/// Bit 30 of a tag: an error message.
const ERROR: i32 = 1 << 30;

/// The collectives, as tags name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Coll {
    Barrier = 1,
    Bcast,
    Reduce,
    Allreduce,
    Allgather,
    Allgatherv,
    Alltoall,
    Alltoallv,
    Gather,
    Gatherv,
    Scatter,
    Scatterv,
    ReduceScatter,
    ReduceScatterBlock,
    Scan,
}

impl Coll {
    const ALL: [Coll; 15] = [
        Coll::Barrier,
        Coll::Bcast,
        Coll::Reduce,
        Coll::Allreduce,
        Coll::Allgather,
        Coll::Allgatherv,
        Coll::Alltoall,
        Coll::Alltoallv,
        Coll::Gather,
        Coll::Gatherv,
        Coll::Scatter,
        Coll::Scatterv,
        Coll::ReduceScatter,
        Coll::ReduceScatterBlock,
        Coll::Scan,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Coll::Barrier => "barrier",
            Coll::Bcast => "bcast",
            Coll::Reduce => "reduce",
            Coll::Allreduce => "allreduce",
            Coll::Allgather => "allgather",
            Coll::Allgatherv => "allgatherv",
            Coll::Alltoall => "alltoall",
            Coll::Alltoallv => "alltoallv",
            Coll::Gather => "gather",
            Coll::Gatherv => "gatherv",
            Coll::Scatter => "scatter",
            Coll::Scatterv => "scatterv",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::ReduceScatterBlock => "reduce_scatter_block",
            Coll::Scan => "scan",
        }
    }

    fn from_id(id: i32) -> Option<Coll> {
        Coll::ALL.iter().copied().find(|c| *c as i32 == id)
    }
}

/// Algorithm ids (the low byte of a tag).
pub(crate) mod algo {
    pub const DISSEMINATION: u8 = 1;
    pub const BCAST_BINOMIAL: u8 = 2;
    pub const BCAST_SCATTER_ALLGATHER: u8 = 3;
    pub const REDUCE_BINOMIAL: u8 = 4;
    pub const REDUCE_ORDERED: u8 = 5;
    pub const RECURSIVE_DOUBLING: u8 = 6;
    pub const RABENSEIFNER: u8 = 7;
    pub const RING: u8 = 8;
    pub const ALLGATHER_RECURSIVE_DOUBLING: u8 = 9;
    pub const BRUCK: u8 = 10;
    pub const ALLGATHER_RING: u8 = 11;
    pub const PAIRWISE: u8 = 12;
    pub const GATHER_BINOMIAL: u8 = 13;
    pub const SCATTER_BINOMIAL: u8 = 14;
    pub const LINEAR: u8 = 15;
    pub const RECURSIVE_HALVING: u8 = 16;
    pub const REDUCE_SCATTER_RING: u8 = 17;
    pub const REDUCE_THEN_SCATTER: u8 = 18;
    pub const SCAN_RECURSIVE_DOUBLING: u8 = 19;
    pub const COUNT_CHECK: u8 = 20;

    pub fn name(id: u8) -> &'static str {
        match id {
            DISSEMINATION => "the dissemination barrier",
            BCAST_BINOMIAL => "the binomial broadcast",
            BCAST_SCATTER_ALLGATHER => "the scatter+allgather broadcast",
            REDUCE_BINOMIAL => "the binomial reduce",
            REDUCE_ORDERED => "the rank-ordered binomial reduce",
            RECURSIVE_DOUBLING => "recursive doubling",
            RABENSEIFNER => "Rabenseifner's algorithm",
            RING => "the ring allreduce",
            ALLGATHER_RECURSIVE_DOUBLING => "the recursive-doubling allgather",
            BRUCK => "Bruck's allgather",
            ALLGATHER_RING => "the ring allgather",
            PAIRWISE => "the pairwise exchange",
            GATHER_BINOMIAL => "the binomial gather",
            SCATTER_BINOMIAL => "the binomial scatter",
            LINEAR => "the linear algorithm",
            RECURSIVE_HALVING => "recursive halving",
            REDUCE_SCATTER_RING => "the ring reduce-scatter",
            REDUCE_THEN_SCATTER => "reduce then scatter",
            SCAN_RECURSIVE_DOUBLING => "the recursive-doubling scan",
            COUNT_CHECK => "the count check",
            _ => "an unknown algorithm",
        }
    }
}

enum Poison {
    /// This rank saw the mismatch.
    Here(String),
    /// An error message from another rank: `detector` saw it.
    Remote { detector: usize },
}

/// Words a count mismatch: `describe(got, want)` with both amounts already formatted.
pub(crate) type Describe<'d> = &'d dyn Fn(&str, &str) -> String;

/// How a received message compared with the receive.
pub(crate) struct Received {
    /// The sender's algorithm id.
    pub algo: u8,
}

/// The state of one collective call.
pub(crate) struct Call<'g, 'a> {
    pub(crate) g: &'g mut Group<'a>,
    pub(crate) coll: Coll,
    poison: Option<Poison>,
    /// Bytes per element and the element's type, for messages.
    unit: usize,
    type_name: &'static str,
}

impl<'g, 'a> Call<'g, 'a> {
    pub(crate) fn new<T>(g: &'g mut Group<'a>, coll: Coll) -> Self {
        Call {
            g,
            coll,
            poison: None,
            unit: std::mem::size_of::<T>().max(1),
            type_name: std::any::type_name::<T>(),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.g.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.g.size
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poison.is_some()
    }

    /// `bytes` as "N elements" (or "N bytes" when not a whole number of elements).
    pub(crate) fn amount(&self, bytes: usize) -> String {
        if bytes % self.unit == 0 {
            let n = bytes / self.unit;
            // The path is cut only here, on the way to an error message.
            let name = self.type_name.rsplit("::").next().unwrap_or(self.type_name);
            format!("{n} element{} ({})", if n == 1 { "" } else { "s" }, name)
        } else {
            format!("{bytes} bytes")
        }
    }

    /// Records a mismatch seen here (the first one wins).
    pub(crate) fn mismatch(&mut self, msg: String) {
        if !matches!(self.poison, Some(Poison::Here(_))) {
            self.poison = Some(Poison::Here(format!("{}: {msg}", self.coll.name())));
        }
    }

    fn tag(&self, algo: u8) -> i32 {
        match self.poison {
            None => (self.coll as i32) << 8 | algo as i32,
            Some(Poison::Here(_)) => ERROR | ((self.g.rank as i32 & 0x3f_ffff) << 8) | algo as i32,
            Some(Poison::Remote { detector }) => {
                ERROR | ((detector as i32 & 0x3f_ffff) << 8) | algo as i32
            }
        }
    }

    /// Sends `data` to group rank `to` (an empty error message once poisoned).
    pub(crate) fn send(&mut self, to: usize, algo: u8, data: &[u8]) -> Result<()> {
        let tag = self.tag(algo);
        let data = if self.is_poisoned() { &[][..] } else { data };
        let dest = self.g.world_rank(to);
        self.g.p2p.send(dest, tag, self.g.context, data).map(|_| ())
    }

    /// Receives into `buf` from group rank `from`; any count or algorithm mismatch poisons.
    pub(crate) fn recv(&mut self, from: usize, algo: u8, buf: &mut [u8]) -> Result<()> {
        self.recv_with(from, Some(algo), buf, None).map(|_| ())
    }

    /// [`Call::recv`] with control: `expect` `None` accepts any algorithm of this
    /// collective (and reports the sender's); `describe(got, want)` words a count mismatch.
    pub(crate) fn recv_with(
        &mut self,
        from: usize,
        expect: Option<u8>,
        buf: &mut [u8],
        describe: Option<Describe>,
    ) -> Result<Received> {
        let src = self.g.world_rank(from);
        let ctx = self.g.context;
        let want = buf.len();
        let r = self.g.p2p.recv(Some(src), None, ctx, buf);
        self.absorb(from, expect, r, want, describe)
    }

    /// Sends `data` to `to` while receiving into `buf` from `from`.
    pub(crate) fn sendrecv(
        &mut self,
        to: usize,
        data: &[u8],
        from: usize,
        buf: &mut [u8],
        algo: u8,
    ) -> Result<()> {
        self.sendrecv_with(to, data, from, buf, algo, None)
    }

    /// [`Call::sendrecv`] with a wording for a count mismatch (see [`Call::recv_with`]).
    pub(crate) fn sendrecv_with(
        &mut self,
        to: usize,
        data: &[u8],
        from: usize,
        buf: &mut [u8],
        algo: u8,
        describe: Option<Describe>,
    ) -> Result<()> {
        let tag = self.tag(algo);
        let data = if self.is_poisoned() { &[][..] } else { data };
        let (dest, src) = (self.g.world_rank(to), self.g.world_rank(from));
        let ctx = self.g.context;
        let want = buf.len();
        let r = self
            .g
            .p2p
            .sendrecv(dest, tag, data, Some(src), None, buf, ctx);
        self.absorb(from, Some(algo), r, want, describe).map(|_| ())
    }

    fn absorb(
        &mut self,
        from: usize,
        expect: Option<u8>,
        r: Result<Status>,
        want: usize,
        describe: Option<Describe>,
    ) -> Result<Received> {
        let (tag, got) = match r {
            Ok(s) => (s.tag, s.count),
            Err(Error::Truncated {
                tag, message_bytes, ..
            }) => (tag, message_bytes),
            Err(e) => return Err(e),
        };
        let their_algo = (tag & 0xff) as u8;
        let me = self.g.rank;
        if tag & ERROR != 0 {
            if self.poison.is_none() {
                self.poison = Some(Poison::Remote {
                    detector: ((tag >> 8) & 0x3f_ffff) as usize,
                });
            }
            return Ok(Received { algo: their_algo });
        }
        if tag >> 8 != self.coll as i32 {
            let theirs = Coll::from_id(tag >> 8).map_or("an unknown collective", |c| c.name());
            self.mismatch(format!(
                "rank {from} sent a message of {theirs} while rank {me} is in {}: every rank \
                 must call the same collectives in the same order",
                self.coll.name()
            ));
            return Ok(Received { algo: their_algo });
        }
        if let Some(mine) = expect {
            if mine != their_algo {
                self.mismatch(format!(
                    "rank {from} runs {} but rank {me} runs {}: the ranks' counts (or their \
                     PAGEWIRE_* algorithm settings) differ",
                    algo::name(their_algo),
                    algo::name(mine)
                ));
                return Ok(Received { algo: their_algo });
            }
        }
        if got != want {
            let (g, w) = (self.amount(got), self.amount(want));
            let msg = match describe {
                Some(d) => d(&g, &w),
                None => format!(
                    "rank {from} sent {g} where rank {me} expects {w}: every rank must pass \
                     matching counts"
                ),
            };
            self.mismatch(msg);
        }
        Ok(Received { algo: their_algo })
    }

    /// Ends the call: `Ok` unless a mismatch was seen here or reported by another rank.
    pub(crate) fn finish(self) -> Result<()> {
        match self.poison {
            None => Ok(()),
            Some(Poison::Here(msg)) => Err(Error::invalid_argument(msg)),
            Some(Poison::Remote { detector }) => Err(Error::invalid_argument(format!(
                "{}: the ranks' arguments do not match: rank {detector} found the mismatch \
                 (its error names the ranks and counts); the result on rank {} is not valid",
                self.coll.name(),
                self.g.rank
            ))),
        }
    }
}

/// The bytes of a slice of plain data.
pub(crate) fn bytes<T: bytemuck::Pod>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// The bytes of a mutable slice of plain data.
pub(crate) fn bytes_mut<T: bytemuck::Pod>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_ids_round_trip_and_fit_a_tag() {
        for c in Coll::ALL {
            assert_eq!(Coll::from_id(c as i32), Some(c));
            let tag = (c as i32) << 8 | 0xff;
            assert!(tag & ERROR == 0 && tag > 0);
        }
        assert_eq!(Coll::from_id(0), None);
        let err = ERROR | (0x3f_ffff << 8) | 0xff;
        assert!(err > 0, "error tags stay within MPI_TAG_UB");
        for id in 1..=algo::COUNT_CHECK {
            assert_ne!(algo::name(id), "an unknown algorithm");
        }
    }
}
