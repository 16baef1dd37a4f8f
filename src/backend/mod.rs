//! The backend seam: what carries the facade's calls, chosen once at start-up ([`start`]).
//!
//! - [`pagewire`]: pagewire's own stack, the message layer (`transport::msg`) on a NIC
//!   provider in a buffer mode, with the collective algorithms of `pagewire-collectives`;
//! - `host_mpi` (feature `mpi`, `PAGEWIRE_TRANSPORT=mpi`): the host MPI library, through
//!   rsmpi, so that one binary measures pagewire and the MPI library side by side.
//!
//! Each communicator holds a [`CommBackend`]: the world's is chosen by [`start`], and every
//! communicator made from one (duplicate, split) is on the same backend. The rsmpi-shaped
//! traits above (`topology`, `point_to_point`, `request`, `collective`) call it through the
//! traits of [`traits`] and never ask which backend they got; `cfg(feature = "mpi")` is
//! written here, in `host_mpi/`, where the crate root re-exports `host_mpi` and where
//! `PAGEWIRE_TRANSPORT=mpi` is parsed (`config.rs`).
//!
//! # Adding an operation
//!
//! 1. A method on the trait of its group in `traits.rs` ([`CollectiveBackend`] …).
//! 2. Its implementation in each backend: `pagewire/` and `host_mpi/communicator.rs` (the
//!    compiler lists the backends that lack it); an MPI call that `HostMpi` does not make
//!    yet is a `HostMpi` method and its rsmpi or MPI call in `host_mpi/ffi.rs`.
//! 3. One line here, in the [`CommBackend`] impl of that trait: `dispatch!(self, b =>
//!    b.method(..))`.
//! 4. The user-facing method on the rsmpi-shaped trait above, which calls
//!    `comm.backend().method(..)`.

mod traits;

#[cfg(feature = "mpi")]
pub mod host_mpi;
pub(crate) mod pagewire;

use std::process::Command;

use bytemuck::Pod;
use pagewire_collectives::{Element, Operation};
use pagewire_transport::boot::Bootstrap;
use pagewire_transport::msg::raw::{Layout, UserBuf, UserBufMut};
use pagewire_transport::msg::{PointToPoint, Status};

use crate::config::{TransportKind, UniverseConfig};
use crate::datatype::Count;
use crate::error::Result;

pub(crate) use traits::{
    CollectiveBackend, CommunicatorBackend, MessageBackend, PointToPointBackend, RequestBackend,
};

/// Declares an enum with one variant per backend (the host-MPI one with the feature only) and
/// `From` each backend's type.
macro_rules! per_backend {
    ($(#[$meta:meta])* $name:ident { pagewire: $pagewire:ty, host_mpi: $host:ty $(,)? }) => {
        $(#[$meta])*
        pub(crate) enum $name {
            /// pagewire's own stack.
            Pagewire($pagewire),
            /// The host MPI library.
            #[cfg(feature = "mpi")]
            HostMpi($host),
        }

        impl From<$pagewire> for $name {
            fn from(b: $pagewire) -> Self {
                $name::Pagewire(b)
            }
        }

        #[cfg(feature = "mpi")]
        impl From<$host> for $name {
            fn from(b: $host) -> Self {
                $name::HostMpi(b)
            }
        }
    };
}

/// `$call` on the backend inside `$value` (an enum of [`per_backend!`]), bound to `$b`.
macro_rules! dispatch {
    ($value:expr, $b:ident => $call:expr) => {
        match $value {
            Self::Pagewire($b) => $call,
            #[cfg(feature = "mpi")]
            Self::HostMpi($b) => $call,
        }
    };
}

per_backend! {
    /// A communicator's backend.
    #[derive(Clone, Debug)]
    CommBackend {
        pagewire: pagewire::PagewireComm,
        host_mpi: host_mpi::communicator::HostMpiComm,
    }
}

per_backend! {
    /// A nonblocking operation started on a [`CommBackend`].
    #[derive(Debug)]
    PendingRequest {
        pagewire: pagewire::point_to_point::PagewireRequest,
        host_mpi: host_mpi::communicator::HostMpiRequest,
    }
}

per_backend! {
    /// A message that a matched probe on a [`CommBackend`] took out of matching.
    #[derive(Debug)]
    MatchedMessage {
        pagewire: pagewire::point_to_point::PagewireMessage,
        host_mpi: host_mpi::communicator::HostMpiMessage,
    }
}

impl CommBackend {
    /// The host MPI library's communicator, on the mpi transport.
    #[cfg(feature = "mpi")]
    pub(crate) fn host_mpi(&self) -> Option<&host_mpi::communicator::HostMpiComm> {
        match self {
            CommBackend::HostMpi(h) => Some(h),
            CommBackend::Pagewire(_) => None,
        }
    }
}

/// Starts the backend `cfg` asks for and returns the world communicator's.
pub(crate) fn start(cfg: UniverseConfig) -> Result<CommBackend> {
    match cfg.transport {
        TransportKind::Pagewire => pagewire::PagewireComm::start_world(cfg).map(Into::into),
        TransportKind::HostMpi => start_host_mpi(),
    }
}

/// Starts the host-MPI backend on `MPI_COMM_WORLD`.
#[cfg(feature = "mpi")]
fn start_host_mpi() -> Result<CommBackend> {
    host_mpi::communicator::HostMpiComm::start_world().map(Into::into)
}

/// Without the feature there is no host MPI library to forward to.
#[cfg(not(feature = "mpi"))]
fn start_host_mpi() -> Result<CommBackend> {
    Err(crate::config::no_mpi_feature())
}

/// What a rank unwinding from a panic does before its universe goes: under mpirun it removes
/// the job's shared-memory objects (the soft NIC's rings and tables of every rank). pwrun does
/// this after a failed job; under mpirun nobody would, and the ranks that `MPI_Abort` kills
/// leave theirs behind. So the failing rank removes them all before its bootstrap aborts: the
/// others keep their mappings until they are killed, and a rank still starting up fails to
/// open a peer's, which ends it as the abort would.
#[cfg(feature = "mpi")]
pub(crate) fn clean_up_after_panic(boot: &dyn Bootstrap) {
    if boot.as_mpi().is_none() {
        return;
    }
    let prefix = pagewire_transport::boot::shm_prefix(boot.job_id());
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Without the feature, pwrun removes a failed job's shared memory.
#[cfg(not(feature = "mpi"))]
pub(crate) fn clean_up_after_panic(_boot: &dyn Bootstrap) {}

impl CommunicatorBackend for CommBackend {
    fn rank(&self) -> usize {
        dispatch!(self, b => b.rank())
    }
    fn size(&self) -> usize {
        dispatch!(self, b => b.size())
    }
    fn duplicate(&self) -> Result<Self> {
        dispatch!(self, b => b.duplicate().map(Into::into))
    }
    fn split(&self, color: Option<i32>, key: i32) -> Result<Option<Self>> {
        dispatch!(self, b => b.split(color, key).map(|c| c.map(Into::into)))
    }
    fn create_from_members(&self, members: &[usize], tag: i32) -> Result<Self> {
        dispatch!(self, b => b.create_from_members(members, tag).map(Into::into))
    }
    fn same_context(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Pagewire(a), Self::Pagewire(b)) => a.same_context(b),
            #[cfg(feature = "mpi")]
            (Self::HostMpi(a), Self::HostMpi(b)) => a.same_context(b),
            #[cfg(feature = "mpi")]
            _ => false,
        }
    }
    fn progress(&self) -> Result<()> {
        dispatch!(self, b => b.progress())
    }
    fn world_ranks(&self) -> Result<Vec<usize>> {
        dispatch!(self, b => b.world_ranks())
    }
    fn nonblocking_channel(&self) -> Result<(Self, i32)> {
        dispatch!(self, b => b.nonblocking_channel().map(|(c, t)| (c.into(), t)))
    }
    fn target_size(&self) -> usize {
        dispatch!(self, b => b.target_size())
    }
    fn spawn(&self, root: usize, commands: &[Command], maxprocs: &[i32]) -> Result<Self> {
        dispatch!(self, b => b.spawn(root, commands, maxprocs).map(Into::into))
    }
    fn parent(&self) -> Result<Option<Self>> {
        dispatch!(self, b => b.parent().map(|p| p.map(Into::into)))
    }
    fn merge(&self, high: bool) -> Result<Self> {
        dispatch!(self, b => b.merge(high).map(Into::into))
    }
    fn transport(&self) -> TransportKind {
        dispatch!(self, b => b.transport())
    }
    fn mode_name(&self) -> &'static str {
        dispatch!(self, b => b.mode_name())
    }
    fn with_message_layer<R>(&self, f: impl FnOnce(&mut PointToPoint) -> R) -> Result<R> {
        dispatch!(self, b => b.with_message_layer(f))
    }
    fn message_context(&self) -> Option<u32> {
        dispatch!(self, b => b.message_context())
    }
    fn bootstrap(&self) -> &dyn Bootstrap {
        dispatch!(self, b => b.bootstrap())
    }
}

impl PointToPointBackend for CommBackend {
    type Request = PendingRequest;
    type Message = MatchedMessage;

    fn send(&self, dest: usize, tag: i32, bytes: &[u8], sync: bool) -> Result<Status> {
        dispatch!(self, b => b.send(dest, tag, bytes, sync))
    }
    fn receive(&self, source: Option<usize>, tag: Option<i32>, bytes: &mut [u8]) -> Result<Status> {
        dispatch!(self, b => b.receive(source, tag, bytes))
    }
    fn send_receive(
        &self,
        dest: usize,
        send_tag: i32,
        send: &[u8],
        source: Option<usize>,
        recv_tag: Option<i32>,
        recv: &mut [u8],
    ) -> Result<Status> {
        dispatch!(self, b => b.send_receive(dest, send_tag, send, source, recv_tag, recv))
    }
    fn moves_in_place(&self, layout: &Layout) -> bool {
        dispatch!(self, b => b.moves_in_place(layout))
    }
    fn immediate_send(
        &self,
        dest: usize,
        tag: i32,
        buf: UserBuf,
        sync: bool,
    ) -> Result<PendingRequest> {
        dispatch!(self, b => b.immediate_send(dest, tag, buf, sync).map(Into::into))
    }
    fn immediate_receive(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
        buf: UserBufMut,
    ) -> Result<PendingRequest> {
        dispatch!(self, b => b.immediate_receive(source, tag, buf).map(Into::into))
    }
    fn immediate_probe(&self, source: Option<usize>, tag: Option<i32>) -> Result<Option<Status>> {
        dispatch!(self, b => b.immediate_probe(source, tag))
    }
    fn immediate_matched_probe(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
    ) -> Result<Option<(MatchedMessage, Status)>> {
        dispatch!(self, b => b
            .immediate_matched_probe(source, tag)
            .map(|found| found.map(|(message, status)| (message.into(), status))))
    }
    fn check_senders(&self, source: Option<usize>) -> Result<()> {
        dispatch!(self, b => b.check_senders(source))
    }
}

impl CollectiveBackend for CommBackend {
    fn barrier(&self) -> Result<()> {
        dispatch!(self, b => b.barrier())
    }
    fn broadcast<T: Pod>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        dispatch!(self, b => b.broadcast(root, buf))
    }
    fn reduce<T: Element, O: Operation<T>>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<&mut [T]>,
        op: &O,
    ) -> Result<()> {
        dispatch!(self, b => b.reduce(root, send, recv, op))
    }
    fn all_reduce<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        dispatch!(self, b => b.all_reduce(send, recv, op))
    }
    fn all_gather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        dispatch!(self, b => b.all_gather(send, recv))
    }
    fn all_gather_varcount<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
    ) -> Result<()> {
        dispatch!(self, b => b.all_gather_varcount(send, recv, counts))
    }
    fn all_to_all<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        dispatch!(self, b => b.all_to_all(send, recv))
    }
    fn all_to_all_varcount<T: Pod>(
        &self,
        send: &[T],
        send_counts: &[Count],
        recv: &mut [T],
        recv_counts: &[Count],
    ) -> Result<()> {
        dispatch!(self, b => b.all_to_all_varcount(send, send_counts, recv, recv_counts))
    }
    fn gather<T: Pod>(&self, root: usize, send: &[T], recv: Option<&mut [T]>) -> Result<()> {
        dispatch!(self, b => b.gather(root, send, recv))
    }
    fn gather_varcount<T: Pod>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<(&mut [T], &[Count])>,
    ) -> Result<()> {
        dispatch!(self, b => b.gather_varcount(root, send, recv))
    }
    fn scatter<T: Pod>(&self, root: usize, send: Option<&[T]>, recv: &mut [T]) -> Result<()> {
        dispatch!(self, b => b.scatter(root, send, recv))
    }
    fn scatter_varcount<T: Pod>(
        &self,
        root: usize,
        send: Option<(&[T], &[Count])>,
        recv: &mut [T],
    ) -> Result<()> {
        dispatch!(self, b => b.scatter_varcount(root, send, recv))
    }
    fn reduce_scatter_block<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        dispatch!(self, b => b.reduce_scatter_block(send, recv, op))
    }
    fn reduce_scatter<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
        op: &O,
    ) -> Result<()> {
        dispatch!(self, b => b.reduce_scatter(send, recv, counts, op))
    }
    fn scan<T: Element, O: Operation<T>>(&self, send: &[T], recv: &mut [T], op: &O) -> Result<()> {
        dispatch!(self, b => b.scan(send, recv, op))
    }
}

impl RequestBackend for PendingRequest {
    fn wait(&mut self) -> Result<Status> {
        dispatch!(self, r => r.wait())
    }
    fn test(&mut self) -> Result<Option<Status>> {
        dispatch!(self, r => r.test())
    }
    fn is_done(&self) -> bool {
        dispatch!(self, r => r.is_done())
    }
    fn cancel(&mut self) -> bool {
        dispatch!(self, r => r.cancel())
    }
}

impl MessageBackend for MatchedMessage {
    type Request = PendingRequest;

    fn receive(self, bytes: &mut [u8]) -> Result<Status> {
        dispatch!(self, m => m.receive(bytes))
    }
    fn moves_in_place(&self, layout: &Layout) -> bool {
        dispatch!(self, m => m.moves_in_place(layout))
    }
    fn immediate_receive(self, buf: UserBufMut) -> Result<PendingRequest> {
        dispatch!(self, m => m.immediate_receive(buf).map(Into::into))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mpi_transport_says_what_it_needs() {
        // Not under mpirun here: without the feature the build is wrong, with it the launch.
        let e = start_host_mpi().expect_err("refused").to_string();
        if cfg!(feature = "mpi") {
            assert!(e.contains("must be started by mpirun or mpiexec"), "{e}");
        } else {
            assert!(e.contains("built without the `mpi` feature"), "{e}");
        }
    }
}
