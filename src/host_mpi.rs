//! The host-MPI backend (feature `mpi`): every operation the facade needs, forwarded to the
//! host MPI library through rsmpi, so one binary can measure pagewire against the MPI library
//! it runs under (DESIGN.md "Launching": the `mpi` transport).
//!
//! With `PAGEWIRE_TRANSPORT=mpi` the facade routes every call of a communicator here
//! (`crate::topology` holds one [`HostMpi`] per communicator); it is also usable on its own,
//! and tested both ways under `mpirun` (`tests/mpirun.rs`).
//!
//! # Shape
//!
//! [`HostMpi`] wraps two duplicates of a parent communicator (the world communicator
//! borrowed from [`MpiBootstrap`], or a sub-communicator from [`HostMpi::split`]):
//!
//! - one for point-to-point, with `MPI_ERRORS_RETURN`, so that every failure (a truncated
//!   receive, a bad rank or tag) comes back as [`Error`] as the facade's `try_` calls
//!   promise: [`Error::Mpi`] with MPI's error code (a truncated receive too: MPI does not
//!   report the message's length, so it cannot be an [`Error::Truncated`]; nor does MPI
//!   promise the prefix that pagewire delivers); the receive buffer is never written past
//!   its end;
//! - one for collectives, which keeps MPI's default `MPI_ERRORS_ARE_FATAL`: rsmpi's
//!   collectives do not return MPI's error codes, so an error there must not pass silently.
//!   Arguments are checked before the call (lengths against counts and the communicator
//!   size), so what is checkable on one rank is an [`Error::InvalidArgument`], not an abort.
//!   Counts that disagree *across* ranks are not detected: MPI truncates (fatal) or hangs,
//!   as it does for any MPI program.
//!
//! The separate duplicates also keep this backend's traffic apart from the bootstrap's (and
//! from the user's own use of `MPI_COMM_WORLD`), as pagewire's contexts do.
//!
//! # Types and operations
//!
//! Data movement (send, receive, bcast, gather, scatter, allgather, alltoall and their
//! v-variants) moves the bytes of any plain-old-data type (`MPI_BYTE`, counts scaled by the
//! element size). Reductions are
//! typed: the [`Element`] type is mapped to rsmpi's datatype (`u8` → `MPI_UINT8_T`, …, `f64`
//! → `MPI_DOUBLE`; `usize`/`isize` → 64-bit) and [`Op`] to the predefined `MPI_Op` (`Sum` →
//! `MPI_SUM`, …, `BitXor` → `MPI_BXOR`). MPI defines logical and bitwise reductions only
//! for integers, and has no 128-bit integers: those combinations are rejected with
//! [`Error::InvalidArgument`] (pagewire's own collectives do reduce them). User-defined
//! operations are not forwarded (rsmpi needs libffi for them).
//!
//! # Threads and lifetime
//!
//! `HostMpi` is neither `Send` nor `Sync`: MPI runs at `MPI_THREAD_FUNNELED`, and
//! [`HostMpi::new`] checks that it is created on the thread that initialised MPI. It must be
//! dropped before the [`MpiBootstrap`] (which finalises MPI); one dropped later leaks its
//! communicators instead of freeing them after `MPI_Finalize`.

// `typed!` wraps unit-valued rsmpi calls in `Ok(..)`.
#![allow(clippy::unit_arg)]

use std::any::TypeId;
use std::marker::PhantomData;

use bytemuck::Pod;
use mpi::collective::{CommunicatorCollectives as _, Root as _, SystemOperation as MpiOp};
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use pagewire_collectives::{Element, Op};
use pagewire_transport::boot::MpiBootstrap;
use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::msg::Status;

use crate::datatype::Count;
use crate::error::{Error, Result};

/// Runs `$body` with `$u` the concrete primitive type that the generic `$t` is, so that
/// rsmpi's typed calls see the right MPI datatype; `Err` for a type MPI has no datatype for.
macro_rules! typed {
    ($t:ty, |$u:ident| $body:expr) => {{
        let id = TypeId::of::<$t>();
        typed!(@chain id, $t, $u, $body; u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64)
    }};
    (@chain $id:ident, $t:ty, $u:ident, $body:expr; $($p:ident),*) => {
        $(
            if $id == TypeId::of::<$p>() {
                #[allow(dead_code)]
                type $u = $p;
                Ok($body)
            } else
        )* {
            Err(no_datatype::<$t>())
        }
    };
}

/// The host MPI library behind pagewire's operations, on one communicator.
pub struct HostMpi {
    /// Point-to-point traffic; `MPI_ERRORS_RETURN`. `None` only while dropping.
    p2p: Option<SimpleCommunicator>,
    /// Collectives; `MPI_ERRORS_ARE_FATAL`. `None` only while dropping.
    coll: Option<SimpleCommunicator>,
    rank: usize,
    size: usize,
    /// Neither `Send` nor `Sync` (`MPI_THREAD_FUNNELED`).
    _funneled: PhantomData<*const ()>,
}

impl std::fmt::Debug for HostMpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMpi")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for HostMpi {
    fn drop(&mut self) {
        let comms = [self.p2p.take(), self.coll.take()];
        if mpi::environment::is_finalized() {
            // Freeing a communicator after MPI_Finalize is erroneous: leak the handles.
            comms.into_iter().for_each(std::mem::forget);
        }
    }
}

impl HostMpi {
    /// The backend on the world communicator of `boot` (collective over all ranks: it
    /// duplicates `MPI_COMM_WORLD`). Must run on the thread that initialised MPI.
    pub fn new(boot: &MpiBootstrap) -> Result<HostMpi> {
        boot.check_thread("the host-MPI backend")?;
        let world = boot.world();
        Self::on(&world)
    }

    /// The backend on duplicates of `parent` (collective over `parent`).
    fn on(parent: &SimpleCommunicator) -> Result<HostMpi> {
        let p2p = parent.duplicate();
        raw::errors_return(&p2p)?;
        let coll = parent.duplicate();
        Ok(HostMpi {
            rank: usize::try_from(parent.rank()).expect("MPI ranks are non-negative"),
            size: usize::try_from(parent.size()).expect("MPI sizes are positive"),
            p2p: Some(p2p),
            coll: Some(coll),
            _funneled: PhantomData,
        })
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.size
    }

    fn p2p(&self) -> &SimpleCommunicator {
        self.p2p.as_ref().expect("live until dropped")
    }

    fn coll(&self) -> &SimpleCommunicator {
        self.coll.as_ref().expect("live until dropped")
    }

    /// A backend on a new communicator with the same ranks (`MPI_Comm_dup`; collective).
    pub fn duplicate(&self) -> Result<HostMpi> {
        Self::on(self.coll())
    }

    /// Splits the communicator (`MPI_Comm_split`; collective): ranks with the same `color`
    /// form one communicator, ordered by `key`, then by their rank here. `None` as color
    /// (`MPI_UNDEFINED`) joins none and returns `None`.
    pub fn split(&self, color: Option<i32>, key: i32) -> Result<Option<HostMpi>> {
        let c = match color {
            Some(c) if c < 0 => {
                return Err(Error::InvalidArgument(format!(
                    "color {c}: colors are non-negative (None for MPI_UNDEFINED)"
                )))
            }
            Some(c) => Color::with_value(c),
            None => Color::undefined(),
        };
        match self.coll().split_by_color_with_key(c, key) {
            Some(sub) => Ok(Some(Self::on(&sub)?)),
            None => Ok(None),
        }
    }

    // ---- point-to-point ------------------------------------------------------------------

    /// Sends `buf` to `dest` with `tag` (`MPI_Send`, or `MPI_Ssend` when `sync`).
    pub fn send(&self, dest: usize, tag: i32, buf: &[u8], sync: bool) -> Result<()> {
        let dest = self.peer(dest)?;
        raw::send(self.p2p(), buf, dest, tag, sync)
    }

    /// Receives into `buf` from `source` with `tag` (`None`: `MPI_ANY_SOURCE`,
    /// `MPI_ANY_TAG`) (`MPI_Recv`). A longer message is an [`Error::Mpi`] of class
    /// `MPI_ERR_TRUNCATE`; the buffer's contents are then unspecified (MPICH over UCX
    /// leaves it untouched), but nothing past its end is written.
    pub fn recv(&self, source: Option<usize>, tag: Option<i32>, buf: &mut [u8]) -> Result<Status> {
        let source = self.source(source)?;
        raw::recv(self.p2p(), buf, source, raw::tag_or_any(tag))
    }

    /// Waits for a matching message without receiving it (`MPI_Probe`); the status holds its
    /// size in bytes.
    pub fn probe(&self, source: Option<usize>, tag: Option<i32>) -> Result<Status> {
        let source = self.source(source)?;
        raw::probe(self.p2p(), source, raw::tag_or_any(tag))
    }

    /// [`HostMpi::probe`] without waiting (`MPI_Iprobe`).
    pub fn iprobe(&self, source: Option<usize>, tag: Option<i32>) -> Result<Option<Status>> {
        let source = self.source(source)?;
        raw::iprobe(self.p2p(), source, raw::tag_or_any(tag))
    }

    /// Takes a matching message out of matching if one has arrived (`MPI_Improbe`): no
    /// other receive or probe can match it, and only the returned [`HostMessage`] receives
    /// it. `None` source or tag are wildcards.
    pub fn improbe(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
    ) -> Result<Option<(HostMessage, Status)>> {
        let source = self.source(source)?;
        let found = raw::improbe(self.p2p(), source, raw::tag_or_any(tag))?;
        Ok(found.map(|(raw, status)| {
            (
                HostMessage {
                    raw,
                    len: status.count,
                },
                status,
            )
        }))
    }

    /// Starts sending `buf` (`MPI_Isend`, or `MPI_Issend` when `sync`). The caller keeps
    /// the buffer alive and unwritten until the request completes, as `UserBuf::new`
    /// requires (the facade's request scope does).
    pub fn isend(&self, dest: usize, tag: i32, buf: UserBuf, sync: bool) -> Result<HostRequest> {
        let dest = self.peer(dest)?;
        let raw = raw::isend(self.p2p(), buf, dest, tag, sync)?;
        Ok(HostRequest {
            raw,
            kind: Kind::Send {
                dest,
                tag,
                len: buf.len(),
            },
        })
    }

    /// Starts receiving into `buf` (`MPI_Irecv`); `None` source or tag are wildcards. The
    /// caller keeps the buffer alive and untouched until the request completes, as
    /// `UserBufMut::new` requires.
    pub fn irecv(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
        buf: UserBufMut,
    ) -> Result<HostRequest> {
        let source = self.source(source)?;
        let raw = raw::irecv(self.p2p(), buf, source, raw::tag_or_any(tag))?;
        Ok(HostRequest {
            raw,
            kind: Kind::Recv { cap: buf.len() },
        })
    }

    fn peer(&self, rank: usize) -> Result<i32> {
        if rank < self.size {
            Ok(rank as i32)
        } else {
            Err(Error::NoSuchRank {
                rank,
                size: self.size,
            })
        }
    }

    fn source(&self, rank: Option<usize>) -> Result<i32> {
        match rank {
            Some(r) => self.peer(r),
            None => Ok(raw::any_source()),
        }
    }

    // ---- collectives: data movement (bytes) -------------------------------------------------

    /// `MPI_Barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.coll().barrier();
        Ok(())
    }

    /// `MPI_Bcast` of `buf` from `root`.
    pub fn broadcast<T: Pod>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        let root = self.peer(root)?;
        self.coll()
            .process_at_rank(root)
            .broadcast_into(bytemuck::cast_slice_mut::<T, u8>(buf));
        Ok(())
    }

    /// `MPI_Allgather`: `recv` holds `size · send.len()` elements, rank `j`'s block at `j`.
    pub fn all_gather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.expect_len("all_gather: recv", recv.len(), send.len() * self.size)?;
        self.coll()
            .all_gather_into(bytes(send), bytemuck::cast_slice_mut::<T, u8>(recv));
        Ok(())
    }

    /// `MPI_Allgatherv`: rank `j` contributes `counts[j]` elements, packed in rank order.
    pub fn all_gather_varcount<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
    ) -> Result<()> {
        let layout = self.layout::<T>("all_gather_varcount", counts)?;
        self.expect_len(
            "all_gather_varcount: send",
            send.len(),
            layout.elems[self.rank],
        )?;
        self.expect_len("all_gather_varcount: recv", recv.len(), layout.total)?;
        let mut part = PartitionMut::new(
            bytemuck::cast_slice_mut::<T, u8>(recv),
            &layout.counts[..],
            &layout.displs[..],
        );
        self.coll().all_gather_varcount_into(bytes(send), &mut part);
        Ok(())
    }

    /// `MPI_Alltoall`: block `j` of `send` goes to rank `j`; `recv` gets rank `j`'s block
    /// for this rank at `j`. Both hold `size` equal blocks.
    pub fn all_to_all<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.expect_len("all_to_all: recv", recv.len(), send.len())?;
        if send.len() % self.size != 0 {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: {} elements do not split into {} equal blocks",
                send.len(),
                self.size
            )));
        }
        self.coll()
            .all_to_all_into(bytes(send), bytemuck::cast_slice_mut::<T, u8>(recv));
        Ok(())
    }

    /// `MPI_Alltoallv`: `send_counts[j]` elements to rank `j`, `recv_counts[j]` from it,
    /// packed in rank order.
    pub fn all_to_all_varcount<T: Pod>(
        &self,
        send: &[T],
        send_counts: &[Count],
        recv: &mut [T],
        recv_counts: &[Count],
    ) -> Result<()> {
        let s = self.layout::<T>("all_to_all_varcount (send)", send_counts)?;
        let r = self.layout::<T>("all_to_all_varcount (recv)", recv_counts)?;
        self.expect_len("all_to_all_varcount: send", send.len(), s.total)?;
        self.expect_len("all_to_all_varcount: recv", recv.len(), r.total)?;
        let sp = Partition::new(bytes(send), &s.counts[..], &s.displs[..]);
        let mut rp = PartitionMut::new(
            bytemuck::cast_slice_mut::<T, u8>(recv),
            &r.counts[..],
            &r.displs[..],
        );
        self.coll().all_to_all_varcount_into(&sp, &mut rp);
        Ok(())
    }

    /// `MPI_Gather` to `root`: `recv` (`Some` at the root only) holds `size · send.len()`
    /// elements.
    pub fn gather<T: Pod>(&self, root: usize, send: &[T], recv: Option<&mut [T]>) -> Result<()> {
        let root = self.root(root, "gather", recv.is_some())?;
        let p = self.coll().process_at_rank(root);
        match recv {
            Some(recv) => {
                self.expect_len("gather: recv", recv.len(), send.len() * self.size)?;
                p.gather_into_root(bytes(send), bytemuck::cast_slice_mut::<T, u8>(recv));
            }
            None => p.gather_into(bytes(send)),
        }
        Ok(())
    }

    /// `MPI_Gatherv` to `root`: rank `j` sends `counts[j]` elements; `recv` (`Some` at the
    /// root only, with the counts of every rank) gets them packed in rank order.
    pub fn gather_varcount<T: Pod>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<(&mut [T], &[Count])>,
    ) -> Result<()> {
        let root = self.root(root, "gather_varcount", recv.is_some())?;
        let p = self.coll().process_at_rank(root);
        match recv {
            Some((recv, counts)) => {
                let layout = self.layout::<T>("gather_varcount", counts)?;
                self.expect_len("gather_varcount: send", send.len(), layout.elems[self.rank])?;
                self.expect_len("gather_varcount: recv", recv.len(), layout.total)?;
                let mut part = PartitionMut::new(
                    bytemuck::cast_slice_mut::<T, u8>(recv),
                    &layout.counts[..],
                    &layout.displs[..],
                );
                p.gather_varcount_into_root(bytes(send), &mut part);
            }
            None => p.gather_varcount_into(bytes(send)),
        }
        Ok(())
    }

    /// `MPI_Scatter` from `root`: `send` (`Some` at the root only) holds `size · recv.len()`
    /// elements, block `j` for rank `j`.
    pub fn scatter<T: Pod>(&self, root: usize, send: Option<&[T]>, recv: &mut [T]) -> Result<()> {
        let root = self.root(root, "scatter", send.is_some())?;
        let p = self.coll().process_at_rank(root);
        let recv = bytemuck::cast_slice_mut::<T, u8>(recv);
        match send {
            Some(send) => {
                self.expect_len(
                    "scatter: send",
                    std::mem::size_of_val(send),
                    recv.len() * self.size,
                )?;
                p.scatter_into_root(bytes(send), recv);
            }
            None => p.scatter_into(recv),
        }
        Ok(())
    }

    /// `MPI_Scatterv` from `root`: `send` (`Some` at the root only, with the counts of every
    /// rank) holds `counts[j]` elements for rank `j`, packed in rank order.
    pub fn scatter_varcount<T: Pod>(
        &self,
        root: usize,
        send: Option<(&[T], &[Count])>,
        recv: &mut [T],
    ) -> Result<()> {
        let root = self.root(root, "scatter_varcount", send.is_some())?;
        let p = self.coll().process_at_rank(root);
        match send {
            Some((send, counts)) => {
                let layout = self.layout::<T>("scatter_varcount", counts)?;
                self.expect_len("scatter_varcount: send", send.len(), layout.total)?;
                self.expect_len(
                    "scatter_varcount: recv",
                    recv.len(),
                    layout.elems[self.rank],
                )?;
                let part = Partition::new(bytes(send), &layout.counts[..], &layout.displs[..]);
                p.scatter_varcount_into_root(&part, bytemuck::cast_slice_mut::<T, u8>(recv));
            }
            None => p.scatter_varcount_into(bytemuck::cast_slice_mut::<T, u8>(recv)),
        }
        Ok(())
    }

    // ---- collectives: reductions (typed) ------------------------------------------------------

    /// `MPI_Reduce` to `root`: `recv` (`Some` at the root only) gets the element-wise `op`
    /// of every rank's `send`.
    pub fn reduce<T: Element>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<&mut [T]>,
        op: Op,
    ) -> Result<()> {
        let root = self.root(root, "reduce", recv.is_some())?;
        let mpi_op = reduction::<T>(op)?;
        let p = self.coll().process_at_rank(root);
        match recv {
            Some(recv) => {
                self.expect_len("reduce: recv", recv.len(), send.len())?;
                typed!(T, |U| p.reduce_into_root(
                    cast::<T, U>(send),
                    cast_mut::<T, U>(recv),
                    mpi_op
                ))
            }
            None => typed!(T, |U| p.reduce_into(cast::<T, U>(send), mpi_op)),
        }
    }

    /// `MPI_Allreduce`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        self.expect_len("all_reduce: recv", recv.len(), send.len())?;
        let mpi_op = reduction::<T>(op)?;
        let c = self.coll();
        typed!(T, |U| c.all_reduce_into(
            cast::<T, U>(send),
            cast_mut::<T, U>(recv),
            mpi_op
        ))
    }

    /// `MPI_Reduce_scatter_block`: `send` holds `size · recv.len()` elements; block `j` of
    /// the reduction lands in `recv` of rank `j`.
    pub fn reduce_scatter_block<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Op,
    ) -> Result<()> {
        self.expect_len(
            "reduce_scatter_block: send",
            send.len(),
            recv.len() * self.size,
        )?;
        let mpi_op = reduction::<T>(op)?;
        let c = self.coll();
        typed!(T, |U| c.reduce_scatter_block_into(
            cast::<T, U>(send),
            cast_mut::<T, U>(recv),
            mpi_op
        ))
    }

    /// `MPI_Reduce_scatter`: `send` holds `Σ counts` elements; block `j` (`counts[j]`
    /// elements, packed in rank order) of the reduction lands in `recv` of rank `j`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
        op: Op,
    ) -> Result<()> {
        let layout = self.layout::<T>("reduce_scatter", counts)?;
        self.expect_len("reduce_scatter: send", send.len(), layout.total)?;
        self.expect_len("reduce_scatter: recv", recv.len(), layout.elems[self.rank])?;
        let mpi_op = reduction::<T>(op)?;
        let c = self.coll();
        typed!(T, |U| raw::reduce_scatter(
            c,
            cast::<T, U>(send),
            cast_mut::<T, U>(recv),
            counts,
            &mpi_op
        )?)
    }

    /// `MPI_Scan`: rank `r` gets the reduction of ranks `0..=r`.
    pub fn scan<T: Element>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        self.expect_len("scan: recv", recv.len(), send.len())?;
        let mpi_op = reduction::<T>(op)?;
        let c = self.coll();
        typed!(T, |U| c.scan_into(
            cast::<T, U>(send),
            cast_mut::<T, U>(recv),
            mpi_op
        ))
    }

    // ---- argument checks -------------------------------------------------------------------

    /// `root` as an MPI rank, checking that exactly the root passed its root-only buffer.
    fn root(&self, root: usize, what: &str, has_root_buffer: bool) -> Result<i32> {
        let r = self.peer(root)?;
        let is_root = root == self.rank;
        if is_root != has_root_buffer {
            return Err(Error::InvalidArgument(format!(
                "{what}: rank {} {} the root ({root}) but {} the root's buffer",
                self.rank,
                if is_root { "is" } else { "is not" },
                if has_root_buffer {
                    "passed"
                } else {
                    "did not pass"
                },
            )));
        }
        Ok(r)
    }

    fn expect_len(&self, what: &str, got: usize, want: usize) -> Result<()> {
        if got == want {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what} has {got} elements, expected {want} (rank {} of {})",
                self.rank, self.size
            )))
        }
    }

    /// Byte counts and displacements of `counts` elements of `T` per rank, packed.
    fn layout<T>(&self, what: &str, counts: &[Count]) -> Result<Layout> {
        layout(what, counts, self.size, size_of::<T>())
    }
}

/// Per-rank blocks packed in rank order, in bytes for MPI and in elements for the checks.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    counts: Vec<Count>,
    displs: Vec<Count>,
    elems: Vec<usize>,
    total: usize,
}

fn layout(what: &str, counts: &[Count], size: usize, elem: usize) -> Result<Layout> {
    if counts.len() != size {
        return Err(Error::InvalidArgument(format!(
            "{what}: {} counts for {size} ranks",
            counts.len()
        )));
    }
    let too_big = || {
        Error::InvalidArgument(format!(
            "{what}: counts {counts:?} of {elem}-byte elements exceed MPI's int range in bytes"
        ))
    };
    let mut out = Layout {
        counts: Vec::with_capacity(size),
        displs: Vec::with_capacity(size),
        elems: Vec::with_capacity(size),
        total: 0,
    };
    let mut at = 0usize;
    for &c in counts {
        let n = usize::try_from(c).map_err(|_| {
            Error::InvalidArgument(format!("{what}: negative count {c} in {counts:?}"))
        })?;
        let b = n.checked_mul(elem).ok_or_else(too_big)?;
        out.displs.push(Count::try_from(at).map_err(|_| too_big())?);
        out.counts.push(Count::try_from(b).map_err(|_| too_big())?);
        out.elems.push(n);
        out.total += n;
        at = at.checked_add(b).ok_or_else(too_big)?;
    }
    Count::try_from(at).map_err(|_| too_big())?;
    Ok(out)
}

fn bytes<T: Pod>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// `s` as `U`, which [`typed!`] has found to be `T` itself.
fn cast<T: Element, U: bytemuck::Pod>(s: &[T]) -> &[U] {
    bytemuck::cast_slice(s)
}

/// `s` as `U`, which [`typed!`] has found to be `T` itself.
fn cast_mut<T: Element, U: bytemuck::Pod>(s: &mut [T]) -> &mut [U] {
    bytemuck::cast_slice_mut(s)
}

fn no_datatype<T: Element>() -> Error {
    Error::InvalidArgument(format!(
        "{}: MPI has no datatype for it; the host-MPI backend cannot reduce it",
        T::RUST_NAME
    ))
}

/// The predefined `MPI_Op` for `op` on `T`, if MPI defines it for `T`'s type class.
fn reduction<T: Element>(op: Op) -> Result<MpiOp> {
    let integer_only = !matches!(op, Op::Sum | Op::Product | Op::Min | Op::Max);
    if integer_only && !T::IS_INTEGER {
        return Err(Error::InvalidArgument(format!(
            "{} on {}: MPI defines logical and bitwise reductions for integers only",
            op.mpi_name(),
            T::RUST_NAME
        )));
    }
    Ok(match op {
        Op::Sum => MpiOp::sum(),
        Op::Product => MpiOp::product(),
        Op::Min => MpiOp::min(),
        Op::Max => MpiOp::max(),
        Op::LogicalAnd => MpiOp::logical_and(),
        Op::LogicalOr => MpiOp::logical_or(),
        Op::LogicalXor => MpiOp::logical_xor(),
        Op::BitAnd => MpiOp::bitwise_and(),
        Op::BitOr => MpiOp::bitwise_or(),
        Op::BitXor => MpiOp::bitwise_xor(),
    })
}

/// Whether [`HostMpi`]'s reductions take `op` on `T`s: MPI has a datatype for `T` and
/// defines `op` for its type class. Otherwise they return [`Error::InvalidArgument`], and
/// a caller that needs the reduction anyway moves the data with MPI and combines it itself
/// (as the facade does).
///
/// Minimum and maximum of unsigned integers are not handed to MPI either: MPICH 4.0.2 as
/// Debian packages it (ch4:ucx) compares `MPI_UINT8_T` … `MPI_UINT64_T` and
/// `MPI_UNSIGNED_CHAR` as if they were signed (`MPI_MIN` of 100 and 200 as `MPI_UINT8_T`
/// gives 200), which the collective suite caught under `mpirun`.
pub fn reduces_natively<T: Element>(op: Op) -> bool {
    let unsigned_order = matches!(op, Op::Min | Op::Max) && T::IS_INTEGER && !is_signed::<T>();
    !unsigned_order && reduction::<T>(op).is_ok() && typed!(T, |U| ()).is_ok()
}

/// Whether the integer type `T` is signed: its all-ones bit pattern is -1, below zero
/// (an unsigned type's is its maximum). `Element` has no arithmetic to ask otherwise.
fn is_signed<T: Element>() -> bool {
    let mut all_ones = T::zeroed();
    bytemuck::bytes_of_mut(&mut all_ones).fill(0xff);
    all_ones < T::zeroed()
}

/// A message that [`HostMpi::improbe`] took out of matching (`MPI_Message`).
///
/// Dropping one that was not received receives it into a scratch buffer and discards it
/// (unless MPI is already finalised), so its sender is never left waiting.
#[derive(Debug)]
pub struct HostMessage {
    raw: raw::Message,
    len: usize,
}

impl HostMessage {
    /// Receives the message into `buf` (`MPI_Mrecv`). A longer message is an
    /// [`Error::Mpi`] of class `MPI_ERR_TRUNCATE`, as for [`HostMpi::recv`].
    pub fn receive(mut self, buf: &mut [u8]) -> Result<Status> {
        raw::mrecv(&mut self.raw, buf)
    }

    /// Starts receiving the message into `buf` (`MPI_Imrecv`). The caller keeps the buffer
    /// alive and untouched until the request completes, as `UserBufMut::new` requires.
    pub fn immediate_receive(mut self, buf: UserBufMut) -> Result<HostRequest> {
        let raw = raw::imrecv(&mut self.raw, buf)?;
        Ok(HostRequest {
            raw,
            kind: Kind::Recv { cap: buf.len() },
        })
    }
}

impl Drop for HostMessage {
    fn drop(&mut self) {
        if raw::is_null_message(&self.raw) || mpi::environment::is_finalized() {
            return;
        }
        let mut scratch = vec![0u8; self.len];
        // Nobody wants the message; a failure leaves nothing more to do with it.
        let _ = raw::mrecv(&mut self.raw, &mut scratch);
    }
}

/// What a [`HostRequest`] does.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Send { dest: i32, tag: i32, len: usize },
    Recv { cap: usize },
}

/// A nonblocking send or receive in the host MPI library (`MPI_Request`).
///
/// Dropping one that has not completed cancels a receive (`MPI_Cancel`, then waits for the
/// cancellation) and waits for a send, as the facade's requests do, so MPI never touches
/// the buffer after the request is gone.
#[derive(Debug)]
pub struct HostRequest {
    raw: raw::Request,
    kind: Kind,
}

impl HostRequest {
    /// Waits for completion (`MPI_Wait`). A send's status names its destination, tag and
    /// size.
    pub fn wait(&mut self) -> Result<Status> {
        let cap = self.cap();
        let r = raw::wait(&mut self.raw, cap);
        self.finish(r)
    }

    /// `Some` once complete (`MPI_Test`).
    pub fn test(&mut self) -> Result<Option<Status>> {
        let cap = self.cap();
        match raw::test(&mut self.raw, cap) {
            Ok(None) => Ok(None),
            Ok(Some(s)) => self.finish(Ok(s)).map(Some),
            Err(e) => Err(e),
        }
    }

    /// Whether the operation has finished, without completing the request
    /// (`MPI_Request_get_status`): a later [`HostRequest::wait`] or [`HostRequest::test`]
    /// returns at once. An error counts as finished; completing reports it.
    pub fn is_done(&self) -> bool {
        self.is_complete() || raw::is_done(&self.raw)
    }

    /// True once the request has completed (or failed) and freed its `MPI_Request`.
    pub fn is_complete(&self) -> bool {
        raw::is_null(&self.raw)
    }

    fn cap(&self) -> usize {
        match self.kind {
            Kind::Send { .. } => 0,
            Kind::Recv { cap } => cap,
        }
    }

    fn finish(&self, r: Result<Status>) -> Result<Status> {
        match (self.kind, r) {
            (Kind::Send { dest, tag, len }, Ok(_)) => Ok(Status {
                source: dest as usize,
                tag,
                count: len,
            }),
            (_, r) => r,
        }
    }
}

impl Drop for HostRequest {
    fn drop(&mut self) {
        if raw::is_null(&self.raw) || mpi::environment::is_finalized() {
            return;
        }
        if matches!(self.kind, Kind::Recv { .. }) {
            raw::cancel(&mut self.raw);
        }
        let cap = self.cap();
        let _ = raw::wait(&mut self.raw, cap);
    }
}

/// The calls rsmpi does not offer with MPI's error codes, or at all (`MPI_Reduce_scatter`),
/// made through its `ffi` module: the only `unsafe` of the backend.
#[allow(unsafe_code)]
mod raw {
    use std::ffi::{c_int, c_void};

    use mpi::datatype::Equivalence;
    use mpi::ffi;
    use mpi::raw::AsRaw;
    use mpi::topology::SimpleCommunicator;
    use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
    use pagewire_transport::msg::Status;

    use super::MpiOp;
    use crate::error::{Error, Result};

    /// An `MPI_Request` handle.
    pub(super) type Request = ffi::MPI_Request;

    pub(super) fn any_source() -> i32 {
        // SAFETY: reads a constant that rsmpi's C shim defines.
        unsafe { ffi::RSMPI_ANY_SOURCE }
    }

    pub(super) fn tag_or_any(tag: Option<i32>) -> i32 {
        // SAFETY: reads a constant that rsmpi's C shim defines.
        tag.unwrap_or(unsafe { ffi::RSMPI_ANY_TAG })
    }

    pub(super) fn is_null(r: &Request) -> bool {
        // SAFETY: reads a constant that rsmpi's C shim defines.
        *r == unsafe { ffi::RSMPI_REQUEST_NULL }
    }

    fn byte() -> ffi::MPI_Datatype {
        u8::equivalent_datatype().as_raw()
    }

    fn empty_status() -> ffi::MPI_Status {
        // SAFETY: MPI_Status is a C struct of integers, for which all zeroes is valid.
        unsafe { std::mem::zeroed() }
    }

    /// MPI's text for `code`.
    fn error_string(code: c_int) -> String {
        let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
        let mut len: c_int = 0;
        // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as the call requires.
        let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
        if rc != ffi::MPI_SUCCESS as c_int {
            return format!("MPI error {code}");
        }
        buf.truncate(len.clamp(0, ffi::MPI_MAX_ERROR_STRING as c_int) as usize);
        String::from_utf8_lossy(&buf).trim().to_string()
    }

    fn error_class(code: c_int) -> c_int {
        let mut class: c_int = code;
        // SAFETY: writes one int.
        unsafe { ffi::MPI_Error_class(code, &mut class) };
        class
    }

    fn check(call: &'static str, code: c_int) -> Result<()> {
        if code == ffi::MPI_SUCCESS as c_int {
            Ok(())
        } else {
            Err(Error::Mpi {
                call,
                code,
                message: error_string(code),
            })
        }
    }

    /// The status of a completed receive of at most `cap` bytes, or its error. A truncation
    /// is [`Error::Mpi`] with the class `MPI_ERR_TRUNCATE` and a message naming the sender,
    /// tag and buffer: not [`Error::Truncated`], which carries the message's length, since
    /// MPI does not report it (MPICH 4.0 leaves a meaningless count in the status).
    fn received(
        call: &'static str,
        code: c_int,
        st: &ffi::MPI_Status,
        cap: usize,
    ) -> Result<Status> {
        let s = mpi::point_to_point::Status::from_raw(*st);
        if code != ffi::MPI_SUCCESS as c_int {
            if error_class(code) == ffi::MPI_ERR_TRUNCATE as c_int {
                return Err(Error::Mpi {
                    call,
                    code,
                    message: format!(
                        "message truncated: rank {} sent more than the {cap}-byte receive \
                         buffer holds with tag {} (MPI does not say how much more)",
                        s.source_rank(),
                        s.tag()
                    ),
                });
            }
            check(call, code)?;
        }
        Ok(status(&s))
    }

    fn status(s: &mpi::point_to_point::Status) -> Status {
        Status {
            source: s.source_rank().max(0) as usize,
            tag: s.tag(),
            count: s.count(u8::equivalent_datatype()).max(0) as usize,
        }
    }

    fn count(len: usize) -> Result<c_int> {
        c_int::try_from(len).map_err(|_| {
            Error::InvalidArgument(format!(
                "{len} bytes exceed MPI's int count; split the message"
            ))
        })
    }

    pub(super) fn errors_return(comm: &SimpleCommunicator) -> Result<()> {
        // SAFETY: a live communicator and a predefined error handler.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
        check("MPI_Comm_set_errhandler", rc)
    }

    pub(super) fn send(
        comm: &SimpleCommunicator,
        buf: &[u8],
        dest: i32,
        tag: i32,
        sync: bool,
    ) -> Result<()> {
        let n = count(buf.len())?;
        let p = buf.as_ptr().cast::<c_void>();
        // SAFETY: MPI reads `n` bytes of `buf`, which is borrowed for the whole (blocking) call.
        let rc = unsafe {
            if sync {
                ffi::MPI_Ssend(p, n, byte(), dest, tag, comm.as_raw())
            } else {
                ffi::MPI_Send(p, n, byte(), dest, tag, comm.as_raw())
            }
        };
        check(if sync { "MPI_Ssend" } else { "MPI_Send" }, rc)
    }

    pub(super) fn recv(
        comm: &SimpleCommunicator,
        buf: &mut [u8],
        source: i32,
        tag: i32,
    ) -> Result<Status> {
        let n = count(buf.len())?;
        let mut st = empty_status();
        // SAFETY: MPI writes at most `n` bytes into `buf`, borrowed mutably for the whole
        // (blocking) call, and one status.
        let rc = unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr().cast(),
                n,
                byte(),
                source,
                tag,
                comm.as_raw(),
                &mut st,
            )
        };
        received("MPI_Recv", rc, &st, buf.len())
    }

    pub(super) fn probe(comm: &SimpleCommunicator, source: i32, tag: i32) -> Result<Status> {
        let mut st = empty_status();
        // SAFETY: writes one status.
        let rc = unsafe { ffi::MPI_Probe(source, tag, comm.as_raw(), &mut st) };
        check("MPI_Probe", rc)?;
        Ok(status(&mpi::point_to_point::Status::from_raw(st)))
    }

    pub(super) fn iprobe(
        comm: &SimpleCommunicator,
        source: i32,
        tag: i32,
    ) -> Result<Option<Status>> {
        let mut st = empty_status();
        let mut flag: c_int = 0;
        // SAFETY: writes one flag and one status.
        let rc = unsafe { ffi::MPI_Iprobe(source, tag, comm.as_raw(), &mut flag, &mut st) };
        check("MPI_Iprobe", rc)?;
        Ok((flag != 0).then(|| status(&mpi::point_to_point::Status::from_raw(st))))
    }

    /// An `MPI_Message` handle.
    pub(super) type Message = ffi::MPI_Message;

    pub(super) fn is_null_message(m: &Message) -> bool {
        // SAFETY: reads a constant that rsmpi's C shim defines.
        *m == unsafe { ffi::RSMPI_MESSAGE_NULL }
    }

    pub(super) fn improbe(
        comm: &SimpleCommunicator,
        source: i32,
        tag: i32,
    ) -> Result<Option<(Message, Status)>> {
        let mut st = empty_status();
        let mut flag: c_int = 0;
        // SAFETY: reads a constant that rsmpi's C shim defines.
        let mut msg = unsafe { ffi::RSMPI_MESSAGE_NULL };
        // SAFETY: writes one flag, one message handle and one status.
        let rc =
            unsafe { ffi::MPI_Improbe(source, tag, comm.as_raw(), &mut flag, &mut msg, &mut st) };
        check("MPI_Improbe", rc)?;
        Ok((flag != 0).then(|| (msg, status(&mpi::point_to_point::Status::from_raw(st)))))
    }

    pub(super) fn mrecv(msg: &mut Message, buf: &mut [u8]) -> Result<Status> {
        let n = count(buf.len())?;
        let mut st = empty_status();
        // SAFETY: a matched message (MPI sets the handle to MPI_MESSAGE_NULL); MPI writes at
        // most `n` bytes into `buf`, borrowed mutably for the whole (blocking) call.
        let rc = unsafe { ffi::MPI_Mrecv(buf.as_mut_ptr().cast(), n, byte(), msg, &mut st) };
        received("MPI_Mrecv", rc, &st, buf.len())
    }

    pub(super) fn imrecv(msg: &mut Message, buf: UserBufMut) -> Result<Request> {
        let n = count(buf.len())?;
        let p = buf.addr() as usize as *mut c_void;
        // SAFETY: reads a constant that rsmpi's C shim defines.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: a matched message; the range is writable and used by nobody else until
        // the request completes (the contract of `UserBufMut::new`); MPI writes at most `n`
        // bytes.
        let rc = unsafe { ffi::MPI_Imrecv(p, n, byte(), msg, &mut req) };
        check("MPI_Imrecv", rc)?;
        Ok(req)
    }

    pub(super) fn isend(
        comm: &SimpleCommunicator,
        buf: UserBuf,
        dest: i32,
        tag: i32,
        sync: bool,
    ) -> Result<Request> {
        let n = count(buf.len())?;
        let p = buf.addr() as usize as *const c_void;
        // SAFETY: the range is readable and unwritten until the request completes: the
        // contract of `UserBuf::new`, upheld by its creator; the HostRequest that owns the
        // MPI_Request waits for it before it goes away.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = unsafe {
            if sync {
                ffi::MPI_Issend(p, n, byte(), dest, tag, comm.as_raw(), &mut req)
            } else {
                ffi::MPI_Isend(p, n, byte(), dest, tag, comm.as_raw(), &mut req)
            }
        };
        check(if sync { "MPI_Issend" } else { "MPI_Isend" }, rc)?;
        Ok(req)
    }

    pub(super) fn irecv(
        comm: &SimpleCommunicator,
        buf: UserBufMut,
        source: i32,
        tag: i32,
    ) -> Result<Request> {
        let n = count(buf.len())?;
        let p = buf.addr() as usize as *mut c_void;
        // SAFETY: the range is writable and used by nobody else until the request
        // completes: the contract of `UserBufMut::new`; MPI writes at most `n` bytes.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = unsafe { ffi::MPI_Irecv(p, n, byte(), source, tag, comm.as_raw(), &mut req) };
        check("MPI_Irecv", rc)?;
        Ok(req)
    }

    pub(super) fn wait(req: &mut Request, cap: usize) -> Result<Status> {
        let mut st = empty_status();
        // SAFETY: a live request (or MPI_REQUEST_NULL, which completes at once); MPI sets
        // it to MPI_REQUEST_NULL.
        let rc = unsafe { ffi::MPI_Wait(req, &mut st) };
        received("MPI_Wait", rc, &st, cap)
    }

    pub(super) fn test(req: &mut Request, cap: usize) -> Result<Option<Status>> {
        let mut st = empty_status();
        let mut flag: c_int = 0;
        // SAFETY: as `wait`; writes one flag and one status.
        let rc = unsafe { ffi::MPI_Test(req, &mut flag, &mut st) };
        if flag == 0 && rc == ffi::MPI_SUCCESS as c_int {
            return Ok(None);
        }
        received("MPI_Test", rc, &st, cap).map(Some)
    }

    pub(super) fn is_done(req: &Request) -> bool {
        let mut st = empty_status();
        let mut flag: c_int = 0;
        // SAFETY: a live request, which MPI_Request_get_status leaves live; writes one flag
        // and one status.
        let rc = unsafe { ffi::MPI_Request_get_status(*req, &mut flag, &mut st) };
        rc != ffi::MPI_SUCCESS as c_int || flag != 0
    }

    pub(super) fn cancel(req: &mut Request) {
        // SAFETY: a live request; the caller waits for it afterwards.
        unsafe { ffi::MPI_Cancel(req) };
    }

    /// `MPI_Reduce_scatter` (rsmpi has only the block variant). Checks the lengths itself,
    /// since MPI trusts them.
    pub(super) fn reduce_scatter<U: Equivalence>(
        comm: &SimpleCommunicator,
        send: &[U],
        recv: &mut [U],
        counts: &[c_int],
        op: &MpiOp,
    ) -> Result<()> {
        let n = usize::try_from(mpi::topology::Communicator::size(comm)).unwrap_or(0);
        let rank = usize::try_from(mpi::topology::Communicator::rank(comm)).unwrap_or(0);
        let total: i64 = counts.iter().map(|&c| i64::from(c)).sum();
        assert!(
            counts.len() == n
                && counts.iter().all(|&c| c >= 0)
                && total == send.len() as i64
                && counts[rank] as usize == recv.len(),
            "reduce_scatter: buffers do not match the counts"
        );
        // SAFETY: MPI reads Σ counts = send.len() elements of `send` and writes
        // counts[rank] = recv.len() elements of `recv` (checked above); both are borrowed for
        // the whole call; the datatype is U's.
        let rc = unsafe {
            ffi::MPI_Reduce_scatter(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                counts.as_ptr(),
                U::equivalent_datatype().as_raw(),
                op.as_raw(),
                comm.as_raw(),
            )
        };
        check("MPI_Reduce_scatter", rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_scale_counts_to_bytes() {
        let l = layout("t", &[1, 0, 3], 3, 8).unwrap();
        assert_eq!(l.counts, vec![8, 0, 24]);
        assert_eq!(l.displs, vec![0, 8, 8]);
        assert_eq!(l.elems, vec![1, 0, 3]);
        assert_eq!(l.total, 4);
    }

    #[test]
    fn layouts_reject_bad_counts() {
        let e = layout("gatherv", &[1, 2], 3, 4).unwrap_err().to_string();
        assert!(e.contains("2 counts for 3 ranks"), "{e}");
        let e = layout("gatherv", &[1, -2], 2, 4).unwrap_err().to_string();
        assert!(e.contains("negative count -2"), "{e}");
        let e = layout("gatherv", &[i32::MAX / 4, i32::MAX / 4], 2, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("int range"), "{e}");
    }

    #[test]
    fn reductions_follow_mpis_type_classes() {
        for op in Op::ALL {
            assert!(reduction::<i32>(op).is_ok(), "{op:?} on i32");
        }
        assert!(reduction::<f64>(Op::Sum).is_ok());
        assert!(reduction::<f32>(Op::Max).is_ok());
        let e = reduction::<f64>(Op::LogicalAnd)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("MPI_LAND on f64"), "{e}");
        assert!(reduction::<f32>(Op::BitXor).is_err());
    }

    #[test]
    fn unsigned_order_and_what_mpi_lacks_are_combined_by_the_caller() {
        assert!(reduces_natively::<f32>(Op::Sum));
        assert!(reduces_natively::<i8>(Op::Min));
        assert!(reduces_natively::<u32>(Op::Sum));
        assert!(reduces_natively::<u64>(Op::BitXor));
        assert!(
            !reduces_natively::<u8>(Op::Min),
            "MPICH 4.0.2 orders it as signed"
        );
        assert!(!reduces_natively::<usize>(Op::Max));
        assert!(!reduces_natively::<f64>(Op::LogicalAnd));
        assert!(is_signed::<i64>() && is_signed::<isize>() && !is_signed::<u16>());
    }

    #[test]
    fn typed_dispatch_finds_the_primitive_or_refuses() {
        fn name<T: Element>() -> Result<&'static str> {
            typed!(T, |U| std::any::type_name::<U>())
        }
        assert_eq!(name::<u16>().unwrap(), "u16");
        assert_eq!(name::<isize>().unwrap(), "isize");
        assert_eq!(name::<f32>().unwrap(), "f32");
        let e = name::<u128>().unwrap_err().to_string();
        assert!(e.contains("u128: MPI has no datatype"), "{e}");
    }
}
