//! The host-MPI backend behind the facade's seam: a communicator on it ([`HostMpiComm`]) is
//! a [`HostMpi`] on MPI communicators of its own (`MPI_Comm_dup`/`MPI_Comm_split` of its
//! parent's), so MPI keeps communicators apart and its ranks are already the communicator's.
//! Its requests and matched messages ([`HostMpiRequest`], [`HostMpiMessage`]) keep MPI
//! initialised until they are gone.

use std::process::Command;
use std::rc::Rc;

use pagewire_collectives::{Element, Operation};
use pagewire_transport::boot::{self, Bootstrap};
use pagewire_transport::msg::raw::{Layout, UserBuf, UserBufMut};
use pagewire_transport::msg::{PointToPoint, Status};

use super::{combine, HostMessage, HostMpi, HostRequest};
use crate::backend::traits::{
    CollectiveBackend, CommunicatorBackend, MessageBackend, PointToPointBackend, RequestBackend,
};
use crate::config::TransportKind;
use crate::datatype::Count;
use crate::error::{Error, Result};

/// A universe on the host MPI library: the MPI bootstrap, which finalises MPI when the last
/// communicator, request and message of the universe are gone.
struct HostMpiUniverse {
    boot: Box<dyn Bootstrap>,
}

/// A communicator on the host MPI library.
#[derive(Clone)]
pub(crate) struct HostMpiComm {
    /// Declared before `universe`, so it is freed before the bootstrap that finalises MPI.
    mpi: Rc<HostMpi>,
    universe: Rc<HostMpiUniverse>,
}

impl std::fmt::Debug for HostMpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("HostMpiComm").field(&self.mpi).finish()
    }
}

impl HostMpiComm {
    /// The communicator point-to-point calls (and windows) use.
    pub(super) fn peer_comm(&self) -> &super::ffi::PeerComm {
        self.mpi.p2p()
    }

    /// Starts the mpi transport: the MPI bootstrap and a host-MPI backend on
    /// `MPI_COMM_WORLD`, whose communicator this returns.
    pub(crate) fn start_world() -> Result<HostMpiComm> {
        let launcher = boot::Launcher::detect();
        let how = match launcher {
            boot::Launcher::Mpi(_) => None,
            boot::Launcher::Pwrun => Some("was started by pwrun"),
            boot::Launcher::Slurm => Some("was started by srun without --mpi"),
            boot::Launcher::None => Some("was started without a launcher"),
        };
        if let Some(how) = how {
            return Err(Error::Bootstrap(format!(
                "PAGEWIRE_TRANSPORT=mpi forwards every call to the host MPI library, so the \
                 program must be started by mpirun or mpiexec, but this process {how}; start \
                 it with mpirun, or unset PAGEWIRE_TRANSPORT to use pagewire's own transport"
            )));
        }
        // The MPI library starts this rank, whatever PAGEWIRE_BOOT says.
        let boot: Box<dyn boot::Bootstrap> = Box::new(boot::MpiBootstrap::init()?);
        let mpi = boot.as_mpi().expect("the MPI bootstrap");
        let world = HostMpi::new(mpi)?;
        if std::env::var("PAGEWIRE_VERBOSE").as_deref() == Ok("1") && boot.rank() == 0 {
            eprintln!(
                "pagewire: {} ranks, transport mpi: every call goes to the host MPI library ({})",
                boot.size(),
                mpi.library_version()
            );
            crate::config::print_settings_in_force();
        }
        Ok(HostMpiComm {
            mpi: Rc::new(world),
            universe: Rc::new(HostMpiUniverse { boot }),
        })
    }

    /// A communicator of the same universe on `mpi`.
    fn on(&self, mpi: HostMpi) -> HostMpiComm {
        HostMpiComm {
            mpi: Rc::new(mpi),
            universe: self.universe.clone(),
        }
    }

    /// `buffer`, a root-only buffer of a rooted collective, if this rank is the root: a
    /// non-root that called the root's variant takes part as a non-root.
    fn at_root<B>(&self, root: usize, buffer: Option<B>) -> Option<B> {
        buffer.filter(|_| self.mpi.rank() == root)
    }
}

impl CommunicatorBackend for HostMpiComm {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn size(&self) -> usize {
        self.mpi.size()
    }

    fn duplicate(&self) -> Result<HostMpiComm> {
        Ok(self.on(self.mpi.duplicate()?))
    }

    fn split(&self, color: Option<i32>, key: i32) -> Result<Option<HostMpiComm>> {
        Ok(self.mpi.split(color, key)?.map(|sub| self.on(sub)))
    }

    fn create_from_members(&self, members: &[usize], tag: i32) -> Result<HostMpiComm> {
        Ok(self.on(self.mpi.create_from_members(members, tag)?))
    }

    fn same_context(&self, other: &HostMpiComm) -> bool {
        std::ptr::eq(self, other)
    }

    fn progress(&self) -> Result<()> {
        // MPI progresses inside its own calls.
        Ok(())
    }

    fn nonblocking_channel(&self) -> Result<(HostMpiComm, i32)> {
        let (channel, tag) = self.mpi.nonblocking_channel()?;
        Ok((self.on(channel), tag))
    }

    fn world_ranks(&self) -> Result<Vec<usize>> {
        self.mpi.world_ranks()
    }

    fn target_size(&self) -> usize {
        self.mpi.target_size()
    }

    fn spawn(&self, root: usize, commands: &[Command], maxprocs: &[i32]) -> Result<HostMpiComm> {
        Ok(self.on(self.mpi.spawn(root, commands, maxprocs)?))
    }

    fn parent(&self) -> Result<Option<HostMpiComm>> {
        Ok(HostMpi::parent()?.map(|p| self.on(p)))
    }

    fn merge(&self, high: bool) -> Result<HostMpiComm> {
        Ok(self.on(self.mpi.merge(high)?))
    }

    fn transport(&self) -> TransportKind {
        TransportKind::HostMpi
    }

    fn mode_name(&self) -> &'static str {
        "mpi"
    }

    fn message_context(&self) -> Option<u32> {
        None
    }

    fn with_message_layer<R>(&self, _f: impl FnOnce(&mut PointToPoint) -> R) -> Result<R> {
        Err(Error::NotSupported(
            "PAGEWIRE_TRANSPORT=mpi: the host MPI library moves the data, so pagewire's \
             message layer (its counters, buffer mode and NIC) is not running"
                .into(),
        ))
    }

    fn bootstrap(&self) -> &dyn Bootstrap {
        &*self.universe.boot
    }
}

impl PointToPointBackend for HostMpiComm {
    type Request = HostMpiRequest;
    type Message = HostMpiMessage;

    fn send(&self, dest: usize, tag: i32, bytes: &[u8], sync: bool) -> Result<Status> {
        self.mpi.send(dest, tag, bytes, sync)?;
        Ok(Status {
            source: dest,
            tag,
            count: bytes.len(),
        })
    }

    fn receive(&self, source: Option<usize>, tag: Option<i32>, bytes: &mut [u8]) -> Result<Status> {
        self.mpi.recv(source, tag, bytes)
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
        self.mpi
            .sendrecv(dest, send_tag, send, source, recv_tag, recv)
    }

    fn moves_in_place(&self, _layout: &Layout) -> bool {
        // The host MPI library is given packed bytes.
        false
    }

    fn immediate_send(
        &self,
        dest: usize,
        tag: i32,
        buf: UserBuf,
        sync: bool,
    ) -> Result<HostMpiRequest> {
        let request = self.mpi.isend(dest, tag, buf, sync)?;
        Ok(HostMpiRequest::new(request, &self.universe))
    }

    fn immediate_receive(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
        buf: UserBufMut,
    ) -> Result<HostMpiRequest> {
        let request = self.mpi.irecv(source, tag, buf)?;
        Ok(HostMpiRequest::new(request, &self.universe))
    }

    fn immediate_probe(&self, source: Option<usize>, tag: Option<i32>) -> Result<Option<Status>> {
        self.mpi.iprobe(source, tag)
    }

    fn immediate_matched_probe(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
    ) -> Result<Option<(HostMpiMessage, Status)>> {
        let found = self.mpi.improbe(source, tag)?;
        Ok(found.map(|(message, status)| {
            let message = HostMpiMessage {
                message,
                universe: self.universe.clone(),
            };
            (message, status)
        }))
    }

    fn check_senders(&self, _source: Option<usize>) -> Result<()> {
        // MPI reports its own failures.
        Ok(())
    }
}

impl CollectiveBackend for HostMpiComm {
    fn barrier(&self) -> Result<()> {
        self.mpi.barrier()
    }

    fn broadcast<T: bytemuck::Pod>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        self.mpi.broadcast(root, buf)
    }

    fn reduce<T: Element, O: Operation<T>>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<&mut [T]>,
        op: &O,
    ) -> Result<()> {
        combine::reduce(&self.mpi, root, send, self.at_root(root, recv), op)
    }

    fn all_reduce<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        combine::all_reduce(&self.mpi, send, recv, op)
    }

    fn all_gather<T: bytemuck::Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.mpi.all_gather(send, recv)
    }

    fn all_gather_varcount<T: bytemuck::Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
    ) -> Result<()> {
        self.mpi.all_gather_varcount(send, recv, counts)
    }

    fn all_to_all<T: bytemuck::Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.mpi.all_to_all(send, recv)
    }

    fn all_to_all_varcount<T: bytemuck::Pod>(
        &self,
        send: &[T],
        send_counts: &[Count],
        recv: &mut [T],
        recv_counts: &[Count],
    ) -> Result<()> {
        self.mpi
            .all_to_all_varcount(send, send_counts, recv, recv_counts)
    }

    fn gather<T: bytemuck::Pod>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<&mut [T]>,
    ) -> Result<()> {
        self.mpi.gather(root, send, self.at_root(root, recv))
    }

    fn gather_varcount<T: bytemuck::Pod>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<(&mut [T], &[Count])>,
    ) -> Result<()> {
        self.mpi
            .gather_varcount(root, send, self.at_root(root, recv))
    }

    fn scatter<T: bytemuck::Pod>(
        &self,
        root: usize,
        send: Option<&[T]>,
        recv: &mut [T],
    ) -> Result<()> {
        self.mpi.scatter(root, self.at_root(root, send), recv)
    }

    fn scatter_varcount<T: bytemuck::Pod>(
        &self,
        root: usize,
        send: Option<(&[T], &[Count])>,
        recv: &mut [T],
    ) -> Result<()> {
        self.mpi
            .scatter_varcount(root, self.at_root(root, send), recv)
    }

    fn reduce_scatter_block<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        combine::reduce_scatter_block(&self.mpi, send, recv, op)
    }

    fn reduce_scatter<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
        op: &O,
    ) -> Result<()> {
        combine::reduce_scatter(&self.mpi, send, recv, counts, op)
    }

    fn scan<T: Element, O: Operation<T>>(&self, send: &[T], recv: &mut [T], op: &O) -> Result<()> {
        combine::scan(&self.mpi, send, recv, op)
    }
}

/// A request of the host MPI library, which keeps MPI initialised until it is gone.
#[derive(Debug)]
pub(crate) struct HostMpiRequest {
    /// Declared before `_universe`: dropping it cancels or waits, while MPI still runs.
    request: HostRequest,
    _universe: Rc<HostMpiUniverse>,
}

impl HostMpiRequest {
    fn new(request: HostRequest, universe: &Rc<HostMpiUniverse>) -> HostMpiRequest {
        HostMpiRequest {
            request,
            _universe: universe.clone(),
        }
    }
}

impl RequestBackend for HostMpiRequest {
    fn wait(&mut self) -> Result<Status> {
        self.request.wait()
    }

    fn test(&mut self) -> Result<Option<Status>> {
        self.request.test()
    }

    fn is_done(&self) -> bool {
        self.request.is_done()
    }

    fn cancel(&mut self) -> bool {
        self.request.cancel()
    }
}

/// A message of the host MPI library, which keeps MPI initialised until it is gone: one
/// left unreceived is drained while MPI still runs.
#[derive(Debug)]
pub(crate) struct HostMpiMessage {
    /// Declared before `universe`, as for [`HostMpiRequest`].
    message: HostMessage,
    universe: Rc<HostMpiUniverse>,
}

impl MessageBackend for HostMpiMessage {
    type Request = HostMpiRequest;

    fn receive(self, bytes: &mut [u8]) -> Result<Status> {
        self.message.receive(bytes)
    }

    fn moves_in_place(&self, _layout: &Layout) -> bool {
        false
    }

    fn immediate_receive(self, buf: UserBufMut) -> Result<HostMpiRequest> {
        let request = self.message.immediate_receive(buf)?;
        Ok(HostMpiRequest::new(request, &self.universe))
    }
}

impl std::fmt::Debug for HostMpiUniverse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMpiUniverse")
            .field("rank", &self.boot.rank())
            .field("size", &self.boot.size())
            .finish()
    }
}
