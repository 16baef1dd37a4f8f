//! The host-MPI backend (feature `mpi`): every operation the facade needs, forwarded to the
//! host MPI library through rsmpi, so one binary can measure pagewire against the MPI library
//! it runs under (docs/architecture.md: the `mpi` transport).
//!
//! With `PAGEWIRE_TRANSPORT=mpi` every communicator of the facade is on this backend: it
//! holds one [`HostMpi`] (`communicator.rs`, the seam's side of it), and every call goes
//! there. [`HostMpi`] is also usable on its own, and tested both ways under `mpirun`
//! (`tests/mpirun.rs`).
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
//! element size). Reductions are typed: the [`Element`] type is mapped to rsmpi's datatype
//! (`u8` → `MPI_UINT8_T`, …, `f64` → `MPI_DOUBLE`; `usize`/`isize` → 64-bit) and [`Op`] to
//! the predefined `MPI_Op` (`Sum` → `MPI_SUM`, …, `BitXor` → `MPI_BXOR`). MPI defines
//! logical and bitwise reductions only for integers, and has no 128-bit integers: those
//! combinations are rejected with an [`Error::Invalid`] of class `MPI_ERR_OP` (pagewire's own collectives do
//! reduce them; so does the facade on this backend, see [`reduces_natively`]). User-defined
//! operations are not forwarded (rsmpi needs libffi for them).
//!
//! # Groups, immediate collectives, intercommunicators
//!
//! Groups name processes by world rank: [`HostMpi::world_ranks`] translates the
//! communicator's group into `MPI_COMM_WORLD`'s, and `split_by_subgroup` is
//! `MPI_Comm_create_group`. Immediate collectives run the facade's own algorithms
//! (`collective/immediate.rs`) as point-to-point messages on a third duplicate made with the
//! other two, so starting one never communicates; MPI's `MPI_Ibarrier` & co. are not used.
//! `spawn` is `MPI_Comm_spawn(_multiple)` and `parent` `MPI_Comm_get_parent`: their
//! intercommunicator carries point-to-point to the other group and `merge`
//! (`MPI_Intercomm_merge`), and has no collectives.
//!
//! # Threads and lifetime
//!
//! `HostMpi` is neither `Send` nor `Sync`: MPI runs at `MPI_THREAD_FUNNELED`, and
//! [`HostMpi::new`] checks that it is created on the thread that initialised MPI. It must be
//! dropped before the [`MpiBootstrap`] (which finalises MPI); one dropped later leaks its
//! communicators instead of freeing them after `MPI_Finalize`.
//!
//! # Files
//!
//! This one holds [`HostMpi`]'s communicators and point-to-point calls; `collective.rs` its
//! collectives, `request.rs` its requests and matched messages, `reduction.rs` which
//! reductions MPI does natively, `combine.rs` the others (moved by MPI, combined here),
//! `communicator.rs` the facade's side of the seam, and `ffi.rs` every call into rsmpi and
//! MPI (the backend's only `unsafe`).
//!
//! [`Element`]: pagewire_collectives::Element
//! [`Op`]: pagewire_collectives::Op

mod collective;
mod combine;
pub(crate) mod communicator;
mod error_class;
mod ffi;
mod reduction;
mod request;
pub(crate) mod window;

use std::cell::Cell;
use std::marker::PhantomData;
use std::process::Command;
use std::rc::Rc;

use pagewire_transport::boot::MpiBootstrap;
use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::msg::Status;

use crate::error::{Error, Result};
use crate::ErrorClass;

pub use reduction::reduces_natively;
pub use request::{HostMessage, HostRequest};

/// The host MPI library behind pagewire's operations, on one communicator.
pub struct HostMpi {
    /// Point-to-point traffic; `MPI_ERRORS_RETURN`. `None` only while dropping.
    p2p: Option<Rc<ffi::PeerComm>>,
    /// Collectives; `MPI_ERRORS_ARE_FATAL`. `None` on an intercommunicator and on the channel
    /// of immediate collectives, which have none.
    coll: Option<ffi::Comm>,
    /// The point-to-point channel of immediate collectives (`MPI_ERRORS_RETURN`): a
    /// duplicate made with the others, so that starting an immediate collective never
    /// communicates. `None` where `coll` is.
    nonblocking: Option<Rc<ffi::PeerComm>>,
    /// The tag of the next immediate collective on `nonblocking`.
    next_nonblocking_tag: Cell<i32>,
    rank: usize,
    size: usize,
    /// Ranks that point-to-point calls address: `size`, or the other group's size on an
    /// intercommunicator.
    peers: usize,
    /// Neither `Send` nor `Sync` (`MPI_THREAD_FUNNELED`).
    _funneled: PhantomData<*const ()>,
}

/// Tags of immediate collectives cycle below this (MPI guarantees tags up to 32767).
const NONBLOCKING_TAGS: i32 = 32768;

impl std::fmt::Debug for HostMpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMpi")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("peers", &self.peers)
            .finish()
    }
}

impl Drop for HostMpi {
    fn drop(&mut self) {
        let peers = [self.p2p.take(), self.nonblocking.take()];
        let coll = self.coll.take();
        if ffi::is_finalized() {
            // Freeing a communicator after MPI_Finalize is erroneous: leak the handles.
            peers.into_iter().for_each(std::mem::forget);
            std::mem::forget(coll);
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
    fn on(parent: &ffi::Comm) -> Result<HostMpi> {
        let p2p = ffi::PeerComm::Intra(ffi::duplicate(parent));
        ffi::errors_return(&p2p)?;
        let coll = ffi::duplicate(parent);
        let nonblocking = ffi::PeerComm::Intra(ffi::duplicate(parent));
        ffi::errors_return(&nonblocking)?;
        let (rank, size) = (ffi::rank(parent), ffi::size(parent));
        Ok(HostMpi {
            rank,
            size,
            peers: size,
            p2p: Some(Rc::new(p2p)),
            coll: Some(coll),
            nonblocking: Some(Rc::new(nonblocking)),
            next_nonblocking_tag: Cell::new(0),
            _funneled: PhantomData,
        })
    }

    /// The backend on an intercommunicator: point-to-point to the other group, and merge.
    fn on_intercommunicator(inter: ffi::PeerComm) -> Result<HostMpi> {
        ffi::errors_return(&inter)?;
        let (rank, size) = inter.local_rank_and_size();
        Ok(HostMpi {
            rank,
            size,
            peers: inter.target_size(),
            p2p: Some(Rc::new(inter)),
            coll: None,
            nonblocking: None,
            next_nonblocking_tag: Cell::new(0),
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

    /// Ranks that point-to-point calls address: [`HostMpi::size`], or the other group's
    /// size on an intercommunicator.
    pub fn target_size(&self) -> usize {
        self.peers
    }

    fn p2p(&self) -> &ffi::PeerComm {
        self.p2p.as_ref().expect("live until dropped")
    }

    fn coll(&self) -> Result<&ffi::Comm> {
        self.coll.as_ref().ok_or_else(|| {
            Error::NotSupported(
                "collective operations on an intercommunicator are not supported by the \
                 host-MPI backend; merge it into one communicator first (merge)"
                    .into(),
            )
        })
    }

    /// A backend on a new communicator with the same ranks (`MPI_Comm_dup`; collective).
    pub fn duplicate(&self) -> Result<HostMpi> {
        Self::on(self.coll()?)
    }

    /// Splits the communicator (`MPI_Comm_split`; collective): ranks with the same `color`
    /// form one communicator, ordered by `key`, then by their rank here. `None` as color
    /// (`MPI_UNDEFINED`) joins none and returns `None`.
    pub fn split(&self, color: Option<i32>, key: i32) -> Result<Option<HostMpi>> {
        if let Some(c) = color.filter(|&c| c < 0) {
            return Err(Error::InvalidArgument(format!(
                "color {c}: colors are non-negative (None for MPI_UNDEFINED)"
            )));
        }
        match ffi::split(self.coll()?, color, key) {
            Some(sub) => Ok(Some(Self::on(&sub)?)),
            None => Ok(None),
        }
    }

    /// The communicator of ranks `members` (ranks here, in the new order), collective over
    /// the members only (`MPI_Comm_create_group`); `tag` tells concurrent calls apart.
    pub fn create_from_members(&self, members: &[usize], tag: i32) -> Result<HostMpi> {
        let members = members
            .iter()
            .map(|&r| self.peer(r))
            .collect::<Result<Vec<_>>>()?;
        Self::on(&ffi::create_from_members(self.coll()?, &members, tag)?)
    }

    /// The rank in `MPI_COMM_WORLD` of each rank here.
    pub fn world_ranks(&self) -> Result<Vec<usize>> {
        ffi::world_ranks(self.coll()?)
            .into_iter()
            .enumerate()
            .map(|(rank, w)| {
                w.ok_or_else(|| {
                    Error::NotSupported(format!(
                        "rank {rank} of this communicator is not in this job's world (a \
                         spawned or spawning process): groups name processes by world rank"
                    ))
                })
            })
            .collect()
    }

    /// The same ranks on the channel of immediate collectives (a communicator of its own,
    /// made with this one, so this is local), and the tag of the next immediate collective.
    pub fn nonblocking_channel(&self) -> Result<(HostMpi, i32)> {
        let channel = self.nonblocking.clone().ok_or_else(|| {
            Error::NotSupported(
                "immediate collectives on an intercommunicator are not supported by the \
                 host-MPI backend; merge it into one communicator first (merge)"
                    .into(),
            )
        })?;
        let tag = self.next_nonblocking_tag.get();
        self.next_nonblocking_tag.set((tag + 1) % NONBLOCKING_TAGS);
        Ok((
            HostMpi {
                p2p: Some(channel),
                coll: None,
                nonblocking: None,
                next_nonblocking_tag: Cell::new(0),
                rank: self.rank,
                size: self.size,
                peers: self.size,
                _funneled: PhantomData,
            },
            tag,
        ))
    }

    /// Starts `maxprocs[i]` processes of `commands[i]` (`MPI_Comm_spawn`,
    /// `MPI_Comm_spawn_multiple`; collective, the commands taken from `root`) and returns the
    /// intercommunicator to them.
    pub fn spawn(&self, root: usize, commands: &[Command], maxprocs: &[i32]) -> Result<HostMpi> {
        let root = self.peer(root)?;
        // Collective over this communicator's ranks (none on an intercommunicator); the
        // point-to-point duplicate returns MPI's errors instead of aborting.
        self.coll()?;
        Self::on_intercommunicator(ffi::spawn(self.p2p(), root, commands, maxprocs)?)
    }

    /// The intercommunicator to the processes that spawned this one
    /// (`MPI_Comm_get_parent`), if they did.
    pub fn parent() -> Result<Option<HostMpi>> {
        ffi::parent().map(Self::on_intercommunicator).transpose()
    }

    /// Both groups of this intercommunicator as one communicator (`MPI_Intercomm_merge`,
    /// collective over both): this group's ranks after the other's when `high`.
    pub fn merge(&self, high: bool) -> Result<HostMpi> {
        if self.coll.is_some() || self.nonblocking.is_some() {
            return Err(Error::invalid(
                ErrorClass::Comm,
                "merge: not an intercommunicator",
            ));
        }
        Self::on(&ffi::merge(self.p2p(), high)?)
    }

    // ---- point-to-point ------------------------------------------------------------------

    /// Sends `buf` to `dest` with `tag` (`MPI_Send`, or `MPI_Ssend` when `sync`).
    pub fn send(&self, dest: usize, tag: i32, buf: &[u8], sync: bool) -> Result<()> {
        let dest = self.peer(dest)?;
        ffi::send(self.p2p(), buf, dest, tag, sync)
    }

    /// Receives into `buf` from `source` with `tag` (`None`: `MPI_ANY_SOURCE`,
    /// `MPI_ANY_TAG`) (`MPI_Recv`). A longer message is an [`Error::Mpi`] of class
    /// `MPI_ERR_TRUNCATE`; the buffer's contents are then unspecified (MPICH over UCX
    /// leaves it untouched), but nothing past its end is written.
    pub fn recv(&self, source: Option<usize>, tag: Option<i32>, buf: &mut [u8]) -> Result<Status> {
        let source = self.source(source)?;
        ffi::recv(self.p2p(), buf, source, ffi::tag_or_any(tag))
    }

    /// Sends `send` to `dest` and receives into `recv` from `source` (`None` source or tag:
    /// wildcards) in one call (`MPI_Sendrecv`); truncation as for [`HostMpi::recv`].
    pub fn sendrecv(
        &self,
        dest: usize,
        send_tag: i32,
        send: &[u8],
        source: Option<usize>,
        recv_tag: Option<i32>,
        recv: &mut [u8],
    ) -> Result<Status> {
        let dest = self.peer(dest)?;
        let source = self.source(source)?;
        ffi::sendrecv(
            self.p2p(),
            send,
            dest,
            send_tag,
            recv,
            source,
            ffi::tag_or_any(recv_tag),
        )
    }

    /// Waits for a matching message without receiving it (`MPI_Probe`); the status holds its
    /// size in bytes.
    pub fn probe(&self, source: Option<usize>, tag: Option<i32>) -> Result<Status> {
        let source = self.source(source)?;
        ffi::probe(self.p2p(), source, ffi::tag_or_any(tag))
    }

    /// [`HostMpi::probe`] without waiting (`MPI_Iprobe`).
    pub fn iprobe(&self, source: Option<usize>, tag: Option<i32>) -> Result<Option<Status>> {
        let source = self.source(source)?;
        ffi::iprobe(self.p2p(), source, ffi::tag_or_any(tag))
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
        let found = ffi::improbe(self.p2p(), source, ffi::tag_or_any(tag))?;
        Ok(found.map(|(raw, status)| (HostMessage::new(raw, status.count), status)))
    }

    /// Starts sending `buf` (`MPI_Isend`, or `MPI_Issend` when `sync`). The caller keeps
    /// the buffer alive and unwritten until the request completes, as `UserBuf::new`
    /// requires (the facade's request scope does).
    pub fn isend(&self, dest: usize, tag: i32, buf: UserBuf, sync: bool) -> Result<HostRequest> {
        let dest = self.peer(dest)?;
        let len = buf.len();
        let raw = ffi::isend(self.p2p(), buf, dest, tag, sync)?;
        Ok(HostRequest::send(raw, dest, tag, len))
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
        let len = buf.len();
        let raw = ffi::irecv(self.p2p(), buf, source, ffi::tag_or_any(tag))?;
        Ok(HostRequest::receive(raw, len))
    }

    fn peer(&self, rank: usize) -> Result<i32> {
        if rank < self.peers {
            Ok(rank as i32)
        } else {
            Err(Error::NoSuchRank {
                rank,
                size: self.peers,
            })
        }
    }

    fn source(&self, rank: Option<usize>) -> Result<i32> {
        match rank {
            Some(r) => self.peer(r),
            None => Ok(ffi::any_source()),
        }
    }
}
