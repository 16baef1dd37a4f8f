//! pagewire's collective operations (docs/architecture.md), built on the message layer's safe
//! blocking primitives ([`PointToPoint::send`], `recv` and `sendrecv`), so they run on
//! every buffer mode the job runs.
//!
//! A [`Group`] is the set of ranks a collective runs over, with the context its traffic
//! uses; its methods are the collectives. Algorithms are chosen per call by message size
//! and rank count ([`Tuning`], overridable with `PAGEWIRE_*_ALGO` variables); each is
//! documented in its module with its cost in the α-β(-γ) model (α: per-message latency,
//! β: per-byte transfer time, γ: per-byte reduction time, `p` ranks, `n` bytes):
//!
//! | collective | algorithms |
//! |---|---|
//! | barrier | dissemination |
//! | bcast | binomial tree; scatter + ring allgather (van de Geijn) for long messages |
//! | reduce | binomial tree; rank-ordered binomial tree for non-commutative operations |
//! | allreduce | recursive doubling; Rabenseifner (recursive halving + doubling); ring |
//! | allgather | short: recursive doubling (powers of two), Bruck (5 ranks on), ring; long: ring |
//! | allgatherv | count check, then recursive doubling or ring |
//! | alltoall, alltoallv | pairwise exchange (Bruck's alltoall is not implemented) |
//! | gather, scatter | binomial tree |
//! | gatherv, scatterv | linear |
//! | reduce_scatter(_block) | recursive halving; ring; reduce + scatterv (non-commutative) |
//! | scan | recursive doubling (Hillis-Steele), in rank order |
//!
//! Rank counts that are not powers of two are handled by every algorithm (the fold of
//! [`partition::Fold`] where the algorithm needs a power of two).
//!
//! # Data and operations
//!
//! Data collectives move any `bytemuck::Pod` type. Reductions take [`Element`]s (the
//! primitive integers and floats; other types do not compile) and an [`Operation`]: the
//! predefined [`Op`]s, [`BitOp`] (bitwise, integers only, checked at compile time), or a
//! [`UserOp`] closure. Operations must be associative; non-commutative ones are combined in
//! rank order (the [`op`] module says which algorithms that selects).
//!
//! # Contexts and tags
//!
//! The caller gives the group a context of its own for collective traffic (the facade uses
//! the communicator's point-to-point context with bit 31 set), so collective messages never
//! match point-to-point ones. Tags are internal: the collective and the algorithm (layout in
//! the private module `call`).
//!
//! # Errors
//!
//! Errors are the message layer's [`pagewire_transport::Error`], which the facade converts
//! into its own variant by variant: transport failures as they are, and arguments that do
//! not match across ranks as an invalid argument
//! ([`pagewire_transport::sys::Error::InvalidArgument`]) with the ranks and counts. A mismatch does not hang the
//! job when every rank runs the same algorithm: the rank that sees it finishes the
//! schedule sending error messages instead of data, so every rank whose result depends on
//! the bad data (and every rank that hears from a rank after it saw the mismatch) reports
//! an error too (details in the module `call`). Rooted collectives (the broadcast's
//! non-roots follow the root's choice of algorithm), allgatherv (whose count check makes
//! every rank agree first), gatherv, scatterv, alltoall(v), scan and the barrier always run
//! one schedule whatever the counts, so a count mismatch that changes a message's length
//! ends in an error, never a hang. For allreduce, allgather and reduce-scatter the algorithm depends on the count: if
//! two ranks' counts fall on different sides of a threshold the mismatch is still reported
//! (the tags name the algorithm), but ranks whose partners took the other schedule may wait
//! for ever, as in MPI (the facade's default fatal error handler ends the job instead).
//! An argument that is wrong on one rank only (a receive buffer of the wrong length) is
//! reported the same way: the rank runs the schedule on a scratch buffer, poisoned.
//!
//! # Empty calls
//!
//! A broadcast, reduce, allreduce, allgather or alltoall whose buffers are all empty on
//! this rank returns at once without a message, as MPICH's and MVAPICH's do (an empty
//! collective is then as cheap as a function call, not a round of messages). The price: a
//! rank that passes a non-zero count while another passes zero waits for a message that
//! never comes; this mismatch is not reported.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod allgather;
mod allreduce;
mod alltoall;
mod barrier;
mod bcast;
mod call;
mod element;
mod gather_scatter;
pub mod op;
pub mod partition;
mod reduce;
mod reduce_scatter;
mod scan;
mod scratch;
pub mod tuning;

use bytemuck::Pod;
use pagewire_transport::msg::PointToPoint;

pub use element::{Element, Integer};
pub use op::{BitOp, Op, Operation, UserOp};
pub use pagewire_transport::{Error, Result};
pub use tuning::{AllgatherAlgo, AllreduceAlgo, BcastAlgo, ReduceScatterAlgo, Tuning};

use call::{bytes, bytes_mut, Call, Coll};
use partition::offsets;

/// The ranks a collective runs over and the context of its traffic.
///
/// Ranks are group ranks `0..size`; [`Group::world_rank`] maps them to the message
/// layer's ranks (the identity for the world group, a table for sub-communicators).
#[derive(Debug)]
pub struct Group<'a> {
    /// The message layer.
    pub p2p: &'a mut PointToPoint,
    /// The context every message of the group's collectives uses; it must be used by
    /// nothing else.
    pub context: u32,
    /// This process's rank in the group.
    pub rank: usize,
    /// Ranks in the group.
    pub size: usize,
    /// Algorithm selection.
    pub tuning: Tuning,
    /// Message-layer rank of each group rank; `None`: the same numbers.
    pub world_ranks: Option<&'a [usize]>,
    /// Every rank of the group is reached through the local path (shared memory and CMA):
    /// some switch points differ there.
    pub local: bool,
}

impl<'a> Group<'a> {
    /// The group of every rank of `p2p`, with collective traffic in `context`.
    pub fn world(p2p: &'a mut PointToPoint, context: u32, tuning: Tuning) -> Group<'a> {
        let (rank, size) = (p2p.rank(), p2p.size());
        let local = p2p.all_local_among(0..size);
        Group {
            p2p,
            context,
            rank,
            size,
            tuning,
            world_ranks: None,
            local,
        }
    }

    /// The message-layer rank of group rank `rank` (the rank-translation hook).
    pub fn world_rank(&self, rank: usize) -> usize {
        self.world_ranks.map_or(rank, |m| m[rank])
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(Error::NoSuchRank {
                rank: root,
                size: self.size,
            });
        }
        Ok(())
    }

    /// Returns once every rank has entered the barrier (`MPI_Barrier`).
    pub fn barrier(&mut self) -> Result<()> {
        // Ranks that all share a host meet through shared memory (`msg/local_barrier.rs`).
        if self.local {
            let ranks = self.world_ranks;
            if self
                .p2p
                .local_barrier(self.size, |r| ranks.map_or(r, |m| m[r]))?
            {
                return Ok(());
            }
        }
        let mut c = Call::new::<u8>(self, Coll::Barrier);
        barrier::dissemination(&mut c)?;
        c.finish()
    }

    /// Copies `buf` of `root` into `buf` of every rank (`MPI_Bcast`).
    pub fn bcast<T: Pod>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_root(root)?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut c = Call::new::<T>(self, Coll::Bcast);
        bcast::bcast(&mut c, bytes_mut(buf), root)?;
        c.finish()
    }

    /// Combines `send` of every rank into `recv` of `root` (`MPI_Reduce`); `recv` is
    /// needed at the root only and ignored elsewhere.
    pub fn reduce<T: Element, O: Operation<T> + ?Sized>(
        &mut self,
        send: &[T],
        recv: Option<&mut [T]>,
        op: &O,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        op.check()?;
        if send.is_empty() && recv.as_ref().is_none_or(|r| r.is_empty()) {
            return Ok(());
        }
        let mut c = Call::new::<T>(self, Coll::Reduce);
        let mut scratch = Vec::new();
        let out = if c.rank() == root {
            Some(root_out(&mut c, recv, send.len(), &mut scratch, "recv"))
        } else {
            None
        };
        reduce::reduce(&mut c, send, out, op, root)?;
        c.finish()
    }

    /// Combines `send` of every rank into `recv` of every rank (`MPI_Allreduce`).
    pub fn allreduce<T: Element, O: Operation<T> + ?Sized>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        if send.is_empty() && recv.is_empty() {
            return Ok(());
        }
        let mut c = Call::new::<T>(self, Coll::Allreduce);
        let mut scratch = Vec::new();
        let out = out_buf(&mut c, recv, send.len(), &mut scratch, "recv", "send");
        allreduce::allreduce(&mut c, send, out, op)?;
        c.finish()
    }

    /// Every rank's `send`, in rank order, into `recv` (`size` times as long) of every rank
    /// (`MPI_Allgather`).
    pub fn allgather<T: Pod>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        let p = self.size;
        if send.is_empty() && recv.is_empty() {
            return Ok(());
        }
        let mut c = Call::new::<T>(self, Coll::Allgather);
        let mut scratch = Vec::new();
        let out = out_buf(
            &mut c,
            recv,
            p * send.len(),
            &mut scratch,
            "recv",
            "size × send",
        );
        allgather::allgather(&mut c, bytes(send), bytes_mut(out))?;
        c.finish()
    }

    /// Rank `j`'s `send` (`counts[j]` elements) into `recv` of every rank, the blocks
    /// packed in rank order (`MPI_Allgatherv` with displacements that are the prefix sums
    /// of the counts). Every rank passes the same `counts`; a rank whose `send` length or
    /// counts differ makes every rank return the same error, before any data moves.
    pub fn allgatherv<T: Pod>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        let mut c = Call::new::<T>(self, Coll::Allgatherv);
        let counts = counts_of(&mut c, counts, "counts");
        let total = counts.iter().sum();
        let mut scratch = Vec::new();
        let out = out_buf(
            &mut c,
            recv,
            total,
            &mut scratch,
            "recv",
            "the sum of the counts",
        );
        allgather::allgatherv(&mut c, bytes(send), bytes_mut(out), &counts, size_of::<T>())?;
        c.finish()
    }

    /// Block `j` of `send` (`send.len() / size` elements) to rank `j`, whose block from
    /// this rank lands at the same place of its `recv` (`MPI_Alltoall`).
    pub fn alltoall<T: Pod>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        let p = self.size;
        if send.is_empty() && recv.is_empty() {
            return Ok(());
        }
        let mut c = Call::new::<T>(self, Coll::Alltoall);
        let m = send.len() / p;
        if send.len() != m * p {
            let n = send.len();
            c.mismatch(format!(
                "send holds {n} elements, not a multiple of the {p} ranks"
            ));
        }
        let send = &send[..m * p];
        let mut scratch = Vec::new();
        let out = out_buf(&mut c, recv, m * p, &mut scratch, "recv", "send");
        let offs = offsets(&vec![m; p], size_of::<T>());
        alltoall::pairwise(&mut c, bytes(send), &offs, bytes_mut(out), &offs, false)?;
        c.finish()
    }

    /// `send_counts[j]` elements of `send` to rank `j`, `recv_counts[j]` from it, packed in
    /// rank order (`MPI_Alltoallv` with prefix-sum displacements). The receiver of a block
    /// whose length differs from its `recv_counts` entry reports it.
    pub fn alltoallv<T: Pod>(
        &mut self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let mut c = Call::new::<T>(self, Coll::Alltoallv);
        let sc = counts_of(&mut c, send_counts, "send_counts");
        let rc = counts_of(&mut c, recv_counts, "recv_counts");
        let (mut s_scratch, mut r_scratch) = (Vec::new(), Vec::new());
        let send = in_buf(&mut c, send, sc.iter().sum(), &mut s_scratch, "send_counts");
        let out = out_buf(
            &mut c,
            recv,
            rc.iter().sum(),
            &mut r_scratch,
            "recv",
            "the sum of recv_counts",
        );
        let unit = size_of::<T>();
        alltoall::pairwise(
            &mut c,
            bytes(send),
            &offsets(&sc, unit),
            bytes_mut(out),
            &offsets(&rc, unit),
            true,
        )?;
        c.finish()
    }

    /// Every rank's `send` into `recv` (`size` times as long) of `root`, in rank order
    /// (`MPI_Gather`); `recv` is needed at the root only.
    pub fn gather<T: Pod>(
        &mut self,
        send: &[T],
        recv: Option<&mut [T]>,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        let p = self.size;
        let mut c = Call::new::<T>(self, Coll::Gather);
        let mut scratch = Vec::new();
        let out = if c.rank() == root {
            Some(root_out(&mut c, recv, p * send.len(), &mut scratch, "recv"))
        } else {
            None
        };
        gather_scatter::gather(&mut c, bytes(send), out.map(bytes_mut), root)?;
        c.finish()
    }

    /// Rank `j`'s `send` into `recv[Σ counts[..j] ..][..counts[j]]` of `root`
    /// (`MPI_Gatherv`); the root passes `(recv, counts)`, the others `None`.
    pub fn gatherv<T: Pod>(
        &mut self,
        send: &[T],
        recv: Option<(&mut [T], &[usize])>,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        let mut c = Call::new::<T>(self, Coll::Gatherv);
        let unit = size_of::<T>();
        let mut scratch = Vec::new();
        let offs;
        let root_part = if c.rank() == root {
            let (buf, counts) = match recv {
                Some((b, k)) => (Some(b), k),
                None => (None, &[][..]),
            };
            let counts = counts_of(&mut c, counts, "counts");
            let out = root_out(&mut c, buf, counts.iter().sum(), &mut scratch, "recv");
            offs = offsets(&counts, unit);
            Some((bytes_mut(out), &offs[..]))
        } else {
            None
        };
        gather_scatter::gatherv(&mut c, bytes(send), root_part, root, call::algo::LINEAR)?;
        c.finish()
    }

    /// Block `j` of `root`'s `send` (`size · recv.len()` elements) into `recv` of rank `j`
    /// (`MPI_Scatter`); `send` is needed at the root only.
    pub fn scatter<T: Pod>(
        &mut self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        let p = self.size;
        let mut c = Call::new::<T>(self, Coll::Scatter);
        let mut scratch = Vec::new();
        let data = if c.rank() == root {
            Some(root_in(&mut c, send, p * recv.len(), &mut scratch, "send"))
        } else {
            None
        };
        gather_scatter::scatter(&mut c, data.map(bytes), bytes_mut(recv), root)?;
        c.finish()
    }

    /// `send[Σ counts[..j] ..][..counts[j]]` of `root` into `recv` of rank `j`
    /// (`MPI_Scatterv`); the root passes `(send, counts)`, the others `None`.
    pub fn scatterv<T: Pod>(
        &mut self,
        send: Option<(&[T], &[usize])>,
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        let mut c = Call::new::<T>(self, Coll::Scatterv);
        let unit = size_of::<T>();
        let mut scratch = Vec::new();
        let offs;
        let root_part = if c.rank() == root {
            let (buf, counts) = match send {
                Some((b, k)) => (Some(b), k),
                None => (None, &[][..]),
            };
            let counts = counts_of(&mut c, counts, "counts");
            let data = root_in(&mut c, buf, counts.iter().sum(), &mut scratch, "send");
            offs = offsets(&counts, unit);
            Some((bytes(data), &offs[..]))
        } else {
            None
        };
        gather_scatter::scatterv(&mut c, root_part, bytes_mut(recv), root, call::algo::LINEAR)?;
        c.finish()
    }

    /// Combines `send` (`Σ counts` elements) of every rank and leaves block `j`
    /// (`counts[j]` elements, packed in rank order) in `recv` of rank `j`
    /// (`MPI_Reduce_scatter`).
    pub fn reduce_scatter<T: Element, O: Operation<T> + ?Sized>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        let mut c = Call::new::<T>(self, Coll::ReduceScatter);
        let counts = counts_of(&mut c, counts, "counts");
        run_reduce_scatter(&mut c, send, recv, &counts, op)
    }

    /// [`Group::reduce_scatter`] with every block `recv.len()` elements
    /// (`MPI_Reduce_scatter_block`): `send` holds `size · recv.len()`.
    pub fn reduce_scatter_block<T: Element, O: Operation<T> + ?Sized>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        let counts = vec![recv.len(); self.size];
        let mut c = Call::new::<T>(self, Coll::ReduceScatterBlock);
        run_reduce_scatter(&mut c, send, recv, &counts, op)
    }

    /// Inclusive prefix reduction: rank `r`'s `recv` gets `send` of ranks `0..=r` combined
    /// in rank order (`MPI_Scan`).
    pub fn scan<T: Element, O: Operation<T> + ?Sized>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        op.check()?;
        let mut c = Call::new::<T>(self, Coll::Scan);
        let mut scratch = Vec::new();
        let out = out_buf(&mut c, recv, send.len(), &mut scratch, "recv", "send");
        scan::scan(&mut c, send, out, op)?;
        c.finish()
    }
}

fn run_reduce_scatter<T: Element, O: Operation<T> + ?Sized>(
    c: &mut Call,
    send: &[T],
    recv: &mut [T],
    counts: &[usize],
    op: &O,
) -> Result<()> {
    let (mut s_scratch, mut r_scratch) = (Vec::new(), Vec::new());
    let send = in_buf(c, send, counts.iter().sum(), &mut s_scratch, "the counts");
    let mine = counts[c.rank()];
    let out = out_buf(c, recv, mine, &mut r_scratch, "recv", "this rank's count");
    reduce_scatter::reduce_scatter(c, send, out, counts, op)?;
    Ok(())
}

fn size_of<T>() -> usize {
    std::mem::size_of::<T>()
}

/// `buf` if it holds `want` elements; else a mismatch and a scratch buffer, so the rank
/// still runs the schedule.
fn out_buf<'b, T: Pod>(
    c: &mut Call,
    buf: &'b mut [T],
    want: usize,
    scratch: &'b mut Vec<T>,
    name: &str,
    of: &str,
) -> &'b mut [T] {
    if buf.len() == want {
        return buf;
    }
    c.mismatch(format!(
        "{name} holds {} elements on rank {} but {of} makes {want}",
        buf.len(),
        c.rank()
    ));
    scratch.resize(want, T::zeroed());
    scratch
}

/// The root's output buffer (which it must pass), checked like [`out_buf`].
fn root_out<'b, T: Pod>(
    c: &mut Call,
    buf: Option<&'b mut [T]>,
    want: usize,
    scratch: &'b mut Vec<T>,
    name: &str,
) -> &'b mut [T] {
    match buf {
        Some(b) => out_buf(c, b, want, scratch, name, "the count"),
        None => {
            c.mismatch(format!(
                "the root (rank {}) passed no {name} buffer",
                c.rank()
            ));
            scratch.resize(want, T::zeroed());
            scratch
        }
    }
}

/// An input of `want` elements, checked like [`out_buf`] (zeros stand in).
fn in_buf<'b, T: Pod>(
    c: &mut Call,
    buf: &'b [T],
    want: usize,
    scratch: &'b mut Vec<T>,
    of: &str,
) -> &'b [T] {
    if buf.len() == want {
        return buf;
    }
    c.mismatch(format!(
        "send holds {} elements on rank {} but {of} make {want}",
        buf.len(),
        c.rank()
    ));
    scratch.resize(want, T::zeroed());
    scratch
}

/// The root's input (which it must pass), checked like [`in_buf`].
fn root_in<'b, T: Pod>(
    c: &mut Call,
    buf: Option<&'b [T]>,
    want: usize,
    scratch: &'b mut Vec<T>,
    name: &str,
) -> &'b [T] {
    match buf {
        Some(b) => in_buf(c, b, want, scratch, "the count"),
        None => {
            c.mismatch(format!(
                "the root (rank {}) passed no {name} buffer",
                c.rank()
            ));
            scratch.resize(want, T::zeroed());
            scratch
        }
    }
}

/// A counts slice of one entry per rank (a wrong length is a mismatch; zeros stand in).
fn counts_of(c: &mut Call, counts: &[usize], name: &str) -> Vec<usize> {
    let p = c.size();
    if counts.len() != p {
        c.mismatch(format!(
            "{name} has {} entries on rank {} but the group has {p} ranks",
            counts.len(),
            c.rank()
        ));
    }
    (0..p)
        .map(|j| counts.get(j).copied().unwrap_or(0))
        .collect()
}
