//! The running environment ([`Universe`], rsmpi's `environment::Universe`): `MPI_Init` ..
//! `MPI_Finalize`, on the backend that the configuration chose.

use pagewire_transport::msg::PointToPoint;

use crate::backend::{self, CommBackend, CommunicatorBackend};
use crate::config::{TransportKind, UniverseConfig};
use crate::environment::{self, Threading};
use crate::error::{fatal, Result};
use crate::topology::communicator::SimpleCommunicator;

/// The running pagewire environment (`MPI_Init` .. `MPI_Finalize`). Dropping it finalises:
/// a barrier over all ranks, then the NIC and buffers are released.
pub struct Universe {
    /// The world communicator's backend.
    world: CommBackend,
}

impl std::fmt::Debug for Universe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on_message_layer = self
            .world
            .with_message_layer(|p2p| f.debug_struct("Universe").field("p2p", p2p).finish());
        on_message_layer.unwrap_or_else(|_| {
            f.debug_struct("Universe")
                .field("transport", &self.world.mode_name())
                .finish()
        })
    }
}

impl Universe {
    /// Starts pagewire with `cfg`; `None` if it is already running in this process.
    pub fn from_config(cfg: UniverseConfig) -> Result<Option<Universe>> {
        Self::with_threading(cfg, Threading::Single)
    }

    /// [`Universe::from_config`] at the threading level `threading` (the provided level is
    /// [`crate::environment::threading_support`]).
    pub fn with_threading(cfg: UniverseConfig, threading: Threading) -> Result<Option<Universe>> {
        if !environment::start(threading.min(environment::PROVIDED)) {
            return Ok(None);
        }
        match backend::start(cfg) {
            Ok(world) => Ok(Some(Universe { world })),
            Err(e) => {
                environment::abandon();
                Err(e)
            }
        }
    }

    /// The number of processes the job may grow to (`MPI_UNIVERSE_SIZE`): the ranks the
    /// launcher started, as pagewire does not spawn processes.
    pub fn size(&self) -> Option<usize> {
        Some(self.world.bootstrap().size())
    }

    /// The number of the program among those started together (`MPI_APPNUM`): in a process
    /// that `spawn_multiple` started under pwrun, the index of its command; `None` otherwise,
    /// as the launchers start one program.
    pub fn appnum(&self) -> Option<i32> {
        pagewire_transport::boot::spawn::appnum()
    }

    /// Attaches a buffer of `size` bytes for buffered sends (`MPI_Buffer_attach`), detaching
    /// (and so waiting for) any attached before.
    pub fn set_buffer_size(&mut self, size: usize) {
        crate::point_to_point::attach_buffer(size);
    }

    /// The size of the buffer for buffered sends; 0 if none is attached.
    pub fn buffer_size(&self) -> usize {
        crate::point_to_point::attached_buffer_size()
    }

    /// Waits for every buffered send to leave, then detaches the buffer
    /// (`MPI_Buffer_detach`).
    pub fn detach_buffer(&mut self) {
        crate::error::fatal(crate::point_to_point::detach_buffer());
    }

    /// The communicator of all ranks (`MPI_COMM_WORLD`).
    pub fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::world(self.world.clone())
    }

    /// The buffer mode in use; `"mpi"` on the mpi transport, where the host MPI library
    /// moves the data.
    pub fn mode_name(&self) -> &'static str {
        self.world.mode_name()
    }

    /// How ranks of one host reach each other: `"shm"` (shared memory and CMA, the
    /// default), `"nic"` (through the NIC, where the buffer modes apply) or `"mpi"` (the
    /// host MPI library's choice, on the mpi transport).
    pub fn local_path(&self) -> &'static str {
        self.try_with_p2p(|p| p.local_path()).unwrap_or("mpi")
    }

    /// What carries this universe's calls.
    pub fn transport(&self) -> TransportKind {
        self.world.transport()
    }

    /// The message layer, for counters and reports. Panics on the mpi transport, which has
    /// none; [`Universe::try_with_p2p`] returns that as an error.
    pub fn with_p2p<R>(&self, f: impl FnOnce(&PointToPoint) -> R) -> R {
        fatal(self.try_with_p2p(f))
    }

    /// [`Universe::with_p2p`], or an error on the mpi transport.
    pub fn try_with_p2p<R>(&self, f: impl FnOnce(&PointToPoint) -> R) -> Result<R> {
        self.world.with_message_layer(|p2p| f(p2p))
    }

    /// The message layer to call directly, as a benchmark does to measure what the facade
    /// adds to its calls (the world communicator's point-to-point context is 0). Panics on
    /// the mpi transport, and if called from inside a pagewire call.
    pub fn with_p2p_mut<R>(&self, f: impl FnOnce(&mut PointToPoint) -> R) -> R {
        fatal(self.world.with_message_layer(f))
    }
}

impl Drop for Universe {
    fn drop(&mut self) {
        // MPI_Finalize is collective: no rank tears its NIC down while others may still
        // need it. A failed barrier (a peer already gone) is not an error worth more here.
        // A rank unwinding from a panic skips it: its peers may be waiting for it in a
        // receive, and the launcher must see the failure and stop the job.
        if !std::thread::panicking() {
            let _ = crate::point_to_point::detach_buffer();
            // What this rank still owes its peers (a FIN queued by its last receive) leaves
            // before it stops making progress in the barrier.
            let _ = self.world.with_message_layer(|p2p| p2p.finish_outgoing());
            let _ = self.world.bootstrap().barrier();
        } else {
            backend::clean_up_after_panic(self.world.bootstrap());
        }
        environment::finish();
    }
}
