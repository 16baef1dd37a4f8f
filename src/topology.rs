//! The universe and communicators (rsmpi's `environment` and `topology`).

use std::cell::RefCell;
use std::rc::Rc;

use pagewire_odp::{OdpConfig, OdpMode};
use pagewire_pindown::PindownMode;
use pagewire_transport::boot::{self, Bootstrap};
use pagewire_transport::buffer_mode::copy::{CopyConfig, CopyMode};
use pagewire_transport::buffer_mode::BufferMode;
use pagewire_transport::msg::{MsgConfig, PointToPoint};
use pagewire_transport::nic;

use crate::point_to_point::{AnyProcess, Process};
use crate::{Error, Result};

/// A rank, as rsmpi types it.
pub type Rank = i32;
/// A message tag, as rsmpi types it.
pub type Tag = i32;

/// Which buffer mode moves user buffers (`PAGEWIRE_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeKind {
    /// Pinned bounce buffers, pipelined.
    Copy,
    /// On-demand paging: unpinned user buffers, network page faults, prefetch.
    Odp,
    /// Registration in place, kept in a pin-down cache.
    Pindown,
}

/// Everything [`Universe::from_config`] needs; [`UniverseConfig::from_env`] reads it from
/// the `PAGEWIRE_*` variables.
#[derive(Clone, Debug)]
pub struct UniverseConfig {
    /// The buffer mode.
    pub mode: ModeKind,
    /// The copy mode's pool.
    pub copy: CopyConfig,
    /// The ODP mode's regions and prefetch policy.
    pub odp: OdpConfig,
    /// The message layer.
    pub msg: MsgConfig,
}

impl UniverseConfig {
    /// Reads `PAGEWIRE_MODE` (`copy`, `pindown` or `odp`), the modes' and
    /// the message layer's settings.
    pub fn from_env() -> Result<UniverseConfig> {
        let mode = match std::env::var("PAGEWIRE_MODE").as_deref() {
            Err(_) | Ok("") | Ok("copy") => ModeKind::Copy,
            Ok("odp") => ModeKind::Odp,
            Ok("pindown") => ModeKind::Pindown,
            Ok(other) => {
                return Err(Error::InvalidArgument(format!(
                    "PAGEWIRE_MODE={other}: expected copy, pindown or odp"
                )))
            }
        };
        Ok(UniverseConfig {
            mode,
            copy: CopyConfig::from_env()?,
            odp: OdpConfig::from_env()?,
            msg: MsgConfig::from_env()?,
        })
    }
}

pub(crate) struct Inner {
    pub(crate) p2p: RefCell<PointToPoint>,
    pub(crate) boot: Box<dyn Bootstrap>,
}

thread_local! {
    static INITIALIZED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The running pagewire environment (`MPI_Init` .. `MPI_Finalize`). Dropping it finalises:
/// a barrier over all ranks, then the NIC and buffers are released.
pub struct Universe {
    inner: Rc<Inner>,
}

impl std::fmt::Debug for Universe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Universe")
            .field("p2p", &*self.inner.p2p.borrow())
            .finish()
    }
}

impl Universe {
    /// Starts pagewire with `cfg`; `None` if it is already running in this process.
    pub fn from_config(cfg: UniverseConfig) -> Result<Option<Universe>> {
        if INITIALIZED.with(|i| i.replace(true)) {
            return Ok(None);
        }
        let start = || -> Result<Universe> {
            let boot = boot::from_env()?;
            let nic = nic::open(&*boot)?;
            let mode: Box<dyn BufferMode> = match cfg.mode {
                ModeKind::Copy => Box::new(CopyMode::new(cfg.copy)),
                ModeKind::Odp => Box::new(OdpMode::new(cfg.odp)),
                ModeKind::Pindown => Box::new(PindownMode::new()),
            };
            let p2p = PointToPoint::new(nic, &*boot, mode, cfg.msg.clone())?;
            if std::env::var("PAGEWIRE_VERBOSE").as_deref() == Ok("1") && boot.rank() == 0 {
                eprintln!(
                    "pagewire: {} ranks, mode {}, eager limit {} B, rendezvous {:?}, copy chunk {} B x depth {} ({} slots)",
                    boot.size(),
                    p2p.mode_name(),
                    p2p.eager_limit(),
                    cfg.msg.rndv,
                    cfg.copy.chunk,
                    cfg.copy.depth,
                    cfg.copy.slots
                );
            }
            Ok(Universe {
                inner: Rc::new(Inner {
                    p2p: RefCell::new(p2p),
                    boot,
                }),
            })
        };
        match start() {
            Ok(u) => Ok(Some(u)),
            Err(e) => {
                INITIALIZED.with(|i| i.set(false));
                Err(e)
            }
        }
    }

    /// The communicator of all ranks (`MPI_COMM_WORLD`).
    pub fn world(&self) -> SimpleCommunicator {
        let p = self.inner.p2p.borrow();
        SimpleCommunicator {
            inner: self.inner.clone(),
            context: 0,
            rank: p.rank(),
            size: p.size(),
        }
    }

    /// The buffer mode in use.
    pub fn mode_name(&self) -> &'static str {
        self.inner.p2p.borrow().mode_name()
    }

    /// The message layer, for counters and reports.
    pub fn with_p2p<R>(&self, f: impl FnOnce(&PointToPoint) -> R) -> R {
        f(&self.inner.p2p.borrow())
    }
}

impl Drop for Universe {
    fn drop(&mut self) {
        // MPI_Finalize is collective: no rank tears its NIC down while others may still
        // need it. A failed barrier (a peer already gone) is not an error worth more here.
        // A rank unwinding from a panic skips it: its peers may be waiting for it in a
        // receive, and the launcher must see the failure and stop the job.
        if !std::thread::panicking() {
            let _ = self.inner.boot.barrier();
        }
        INITIALIZED.with(|i| i.set(false));
    }
}

/// What every communicator offers (rsmpi's `Communicator`).
pub trait Communicator {
    /// This process's rank in the communicator.
    fn rank(&self) -> Rank;
    /// Number of ranks.
    fn size(&self) -> Rank;
    /// The process at `rank`, to send to or receive from.
    fn process_at_rank(&self, rank: Rank) -> Process<'_>;
    /// Any process, to receive from (`MPI_ANY_SOURCE`).
    fn any_process(&self) -> AnyProcess<'_>;
}

/// A communicator (`MPI_Comm`): ranks and a context that separates its traffic.
pub struct SimpleCommunicator {
    pub(crate) inner: Rc<Inner>,
    pub(crate) context: u32,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for SimpleCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleCommunicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("context", &self.context)
            .finish()
    }
}

impl SimpleCommunicator {
    /// Makes progress on every outstanding operation (for polling loops).
    pub fn progress(&self) -> Result<()> {
        self.inner.p2p.borrow_mut().progress().map(|_| ())
    }
}

impl Communicator for SimpleCommunicator {
    fn rank(&self) -> Rank {
        self.rank as Rank
    }

    fn size(&self) -> Rank {
        self.size as Rank
    }

    fn process_at_rank(&self, rank: Rank) -> Process<'_> {
        Process { comm: self, rank }
    }

    fn any_process(&self) -> AnyProcess<'_> {
        AnyProcess { comm: self }
    }
}
