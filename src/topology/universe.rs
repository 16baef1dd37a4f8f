//! The running environment ([`Universe`], rsmpi's `environment::Universe`): `MPI_Init` ..
//! `MPI_Finalize`, on the backend that the configuration chose.

use pagewire_transport::msg::PointToPoint;

use crate::backend::{self, CommBackend, CommunicatorBackend};
use crate::config::{TransportKind, UniverseConfig};
use crate::error::{fatal, Result};
use crate::topology::communicator::SimpleCommunicator;

thread_local! {
    static INITIALIZED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

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
        if INITIALIZED.with(|i| i.replace(true)) {
            return Ok(None);
        }
        match backend::start(cfg) {
            Ok(world) => Ok(Some(Universe { world })),
            Err(e) => {
                INITIALIZED.with(|i| i.set(false));
                Err(e)
            }
        }
    }

    /// The communicator of all ranks (`MPI_COMM_WORLD`).
    pub fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::new(self.world.clone())
    }

    /// The buffer mode in use; `"mpi"` on the mpi transport, where the host MPI library
    /// moves the data.
    pub fn mode_name(&self) -> &'static str {
        self.world.mode_name()
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
        self.world.with_message_layer(f)
    }
}

impl Drop for Universe {
    fn drop(&mut self) {
        // MPI_Finalize is collective: no rank tears its NIC down while others may still
        // need it. A failed barrier (a peer already gone) is not an error worth more here.
        // A rank unwinding from a panic skips it: its peers may be waiting for it in a
        // receive, and the launcher must see the failure and stop the job.
        if !std::thread::panicking() {
            let _ = self.world.bootstrap().barrier();
        } else {
            backend::clean_up_after_panic(self.world.bootstrap());
        }
        INITIALIZED.with(|i| i.set(false));
    }
}
