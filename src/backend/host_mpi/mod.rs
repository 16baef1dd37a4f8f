//! The host-MPI backend (feature `mpi`): every operation the facade needs, forwarded to the
//! host MPI library through rsmpi, so one binary can measure pagewire against the MPI library
//! it runs under (DESIGN.md "Launching": the `mpi` transport).
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
//! combinations are rejected with [`Error::InvalidArgument`] (pagewire's own collectives do
//! reduce them; so does the facade on this backend, see [`reduces_natively`]). User-defined
//! operations are not forwarded (rsmpi needs libffi for them).
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
mod ffi;
mod reduction;
mod request;

use std::marker::PhantomData;

use pagewire_transport::boot::MpiBootstrap;
use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::msg::Status;

use crate::error::{Error, Result};

pub use reduction::reduces_natively;
pub use request::{HostMessage, HostRequest};

/// The host MPI library behind pagewire's operations, on one communicator.
pub struct HostMpi {
    /// Point-to-point traffic; `MPI_ERRORS_RETURN`. `None` only while dropping.
    p2p: Option<ffi::Comm>,
    /// Collectives; `MPI_ERRORS_ARE_FATAL`. `None` only while dropping.
    coll: Option<ffi::Comm>,
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
        if ffi::is_finalized() {
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
    fn on(parent: &ffi::Comm) -> Result<HostMpi> {
        let p2p = ffi::duplicate(parent);
        ffi::errors_return(&p2p)?;
        let coll = ffi::duplicate(parent);
        Ok(HostMpi {
            rank: ffi::rank(parent),
            size: ffi::size(parent),
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

    fn p2p(&self) -> &ffi::Comm {
        self.p2p.as_ref().expect("live until dropped")
    }

    fn coll(&self) -> &ffi::Comm {
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
        if let Some(c) = color.filter(|&c| c < 0) {
            return Err(Error::InvalidArgument(format!(
                "color {c}: colors are non-negative (None for MPI_UNDEFINED)"
            )));
        }
        match ffi::split(self.coll(), color, key) {
            Some(sub) => Ok(Some(Self::on(&sub)?)),
            None => Ok(None),
        }
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
        let raw = ffi::isend(self.p2p(), buf, dest, tag, sync)?;
        Ok(HostRequest::send(raw, dest, tag, buf.len()))
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
        let raw = ffi::irecv(self.p2p(), buf, source, ffi::tag_or_any(tag))?;
        Ok(HostRequest::receive(raw, buf.len()))
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
            None => Ok(ffi::any_source()),
        }
    }
}
