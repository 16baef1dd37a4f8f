//! The universe and communicators (rsmpi's `environment` and `topology`).
//!
//! **Communicators.** [`Universe::world`] is `MPI_COMM_WORLD`; [`Communicator::duplicate`]
//! (`MPI_Comm_dup`) and [`Communicator::split_by_color_with_key`] (`MPI_Comm_split`) make new
//! ones. Each has its own group (its ranks `0..size`, each naming a world rank; a split
//! orders them by key, then by rank in the parent) and its own context id, so its messages
//! never match another communicator's, and every point-to-point call and collective on it
//! takes and reports ranks of its own group.
//!
//! **Context ids** are agreed collectively, as MPICH does: every process keeps the lowest
//! context id it has never used, the parent communicator takes the maximum over its ranks,
//! and every rank moves its own past it. A process's contexts only grow, so no two
//! communicators a process belongs to share one, whatever the order in which different
//! groups created them. The sibling communicators of one split share a context: they have no
//! rank in common. Ids are not reused after a communicator is dropped; point-to-point
//! contexts stay below 2^31 (bit 31 marks the collective context, see
//! [`crate::collective`]), so a job can create 2^31 - 1 communicators.
//!
//! **Transports.** A universe runs on pagewire's own message layer ([`PointToPoint`] on a
//! NIC provider), or, with `PAGEWIRE_TRANSPORT=mpi` (feature `mpi`, under `mpirun`), on the
//! host MPI library: then each communicator holds a `host_mpi::HostMpi` on its own MPI
//! communicator (`MPI_Comm_dup`/`MPI_Comm_split` of its parent's), and every point-to-point
//! call, request, probe and collective of the facade is forwarded to it (the `host` branches of
//! `point_to_point`, `request` and `collective`). Context ids and rank maps then play no
//! part: MPI keeps communicators apart, and its ranks are already the communicator's.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use pagewire_odp::{OdpConfig, OdpMode};
use pagewire_pindown::PindownMode;
use pagewire_transport::boot::{self, Bootstrap};
use pagewire_transport::buffer_mode::copy::{CopyConfig, CopyMode};
use pagewire_transport::buffer_mode::BufferMode;
use pagewire_transport::msg::{MsgConfig, PointToPoint};
use pagewire_transport::nic;

use crate::collective::{CommunicatorCollectives, SystemOperation, COLLECTIVE_CONTEXT_BIT};
use crate::error::{fatal, Error, Result};
#[cfg(feature = "mpi")]
use crate::host_mpi::HostMpi;
use crate::point_to_point::{AnyProcess, Process};

/// A rank, as rsmpi types it.
pub type Rank = i32;
/// A message tag, as rsmpi types it.
pub type Tag = i32;
/// The key that orders the ranks of a split (`MPI_Comm_split`'s `key`), as rsmpi types it.
pub type Key = i32;

/// Which new communicator a rank joins in [`Communicator::split_by_color`] (rsmpi's
/// `Color`): ranks that pass the same color join the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Color(i32);

impl Color {
    /// The value standing for `MPI_UNDEFINED` (MPICH's).
    const UNDEFINED: i32 = -32766;

    /// `MPI_UNDEFINED`: the rank takes part in the split but joins no communicator, and
    /// gets `None`.
    pub fn undefined() -> Color {
        Color(Self::UNDEFINED)
    }

    /// A color; panics if `value` is negative (MPI requires colors to be non-negative;
    /// rsmpi panics the same way).
    pub fn with_value(value: i32) -> Color {
        assert!(value >= 0, "Value of color must be non-negative.");
        Color(value)
    }

    /// Whether this is [`Color::undefined`].
    pub fn is_undefined(&self) -> bool {
        self.0 < 0
    }
}

/// The ranks of a communicator other than the world: the world rank of each of its ranks,
/// and back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RankMap {
    world: Vec<usize>,
    /// By world rank: its rank here, or `usize::MAX` for a non-member.
    local: Vec<usize>,
}

impl RankMap {
    /// The group whose rank `i` is world rank `world[i]`; `None` when that is the world
    /// itself (`world_size` ranks in order).
    fn new(world: Vec<usize>, world_size: usize) -> Option<RankMap> {
        if world.len() == world_size && world.iter().enumerate().all(|(i, &w)| i == w) {
            return None;
        }
        let mut local = vec![usize::MAX; world_size];
        for (i, &w) in world.iter().enumerate() {
            local[w] = i;
        }
        Some(RankMap { world, local })
    }

    /// The world rank of rank `rank` of the group.
    pub(crate) fn world_rank(&self, rank: usize) -> usize {
        self.world[rank]
    }

    /// The group rank of world rank `world` (a sender in this communicator's context is
    /// always a member; a non-member keeps its world rank).
    pub(crate) fn local_rank(&self, world: usize) -> usize {
        match self.local.get(world) {
            Some(&r) if r != usize::MAX => r,
            _ => world,
        }
    }
}

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

/// What carries the facade's calls (`PAGEWIRE_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// pagewire's message layer on one of its NIC providers (`PAGEWIRE_TRANSPORT=soft`, the
    /// default, or `verbs`) in the buffer mode of `PAGEWIRE_MODE`.
    Pagewire,
    /// The host MPI library (`PAGEWIRE_TRANSPORT=mpi`; feature `mpi`, under `mpirun`):
    /// every point-to-point and collective call is forwarded to it, so one binary measures
    /// pagewire and the MPI library side by side.
    HostMpi,
}

/// Everything [`Universe::from_config`] needs; [`UniverseConfig::from_env`] reads it from
/// the `PAGEWIRE_*` variables.
#[derive(Clone, Debug)]
pub struct UniverseConfig {
    /// What carries the calls.
    pub transport: TransportKind,
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
    /// Reads `PAGEWIRE_TRANSPORT` (`mpi`, or a NIC provider that [`nic::open`] checks),
    /// `PAGEWIRE_MODE` (`copy`, `pindown` or `odp`), the modes' and the message layer's
    /// settings.
    pub fn from_env() -> Result<UniverseConfig> {
        let transport = match std::env::var("PAGEWIRE_TRANSPORT").as_deref() {
            Ok("mpi") if cfg!(feature = "mpi") => TransportKind::HostMpi,
            Ok("mpi") => return Err(no_mpi_feature()),
            _ => TransportKind::Pagewire,
        };
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
            transport,
            mode,
            copy: CopyConfig::from_env()?,
            odp: OdpConfig::from_env()?,
            msg: MsgConfig::from_env()?,
        })
    }
}

pub(crate) struct Inner {
    /// pagewire's message layer; `None` on the mpi transport.
    p2p: Option<RefCell<PointToPoint>>,
    /// The world communicator's host-MPI backend on the mpi transport. Declared before
    /// `boot`, so it is freed before the bootstrap finalises MPI.
    #[cfg(feature = "mpi")]
    host: Option<Rc<HostMpi>>,
    pub(crate) boot: Box<dyn Bootstrap>,
    /// The lowest point-to-point context this process has not used (the world uses 0).
    next_context: Cell<u32>,
}

impl Inner {
    /// pagewire's message layer. The facade calls it only on pagewire's transport: the
    /// functions that reach it route the mpi transport's communicators away first.
    pub(crate) fn p2p(&self) -> &RefCell<PointToPoint> {
        self.p2p
            .as_ref()
            .expect("pagewire's message layer is not running: this universe uses the mpi transport")
    }

    /// The message layer, or the error that says why there is none.
    fn try_p2p(&self) -> Result<&RefCell<PointToPoint>> {
        self.p2p.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "PAGEWIRE_TRANSPORT=mpi: the host MPI library moves the data, so pagewire's \
                 message layer (its counters, buffer mode and NIC) is not running"
                    .into(),
            )
        })
    }
}

/// Starts the mpi transport: the MPI bootstrap and a host-MPI backend on `MPI_COMM_WORLD`.
#[cfg(feature = "mpi")]
fn start_host_mpi() -> Result<Inner> {
    let launcher = boot::Launcher::detect();
    let how = match launcher {
        boot::Launcher::Mpi(_) => None,
        boot::Launcher::Pwrun => Some("was started by pwrun"),
        boot::Launcher::None => Some("was started without a launcher"),
    };
    if let Some(how) = how {
        return Err(Error::Bootstrap(format!(
            "PAGEWIRE_TRANSPORT=mpi forwards every call to the host MPI library, so the program \
             must be started by mpirun or mpiexec, but this process {how}; start it with \
             mpirun, or unset PAGEWIRE_TRANSPORT to use pagewire's own transport"
        )));
    }
    let boot = boot::from_env()?;
    let mpi = boot.as_mpi().ok_or_else(|| {
        Error::Bootstrap("PAGEWIRE_TRANSPORT=mpi: the bootstrap is not MPI's".into())
    })?;
    let host = HostMpi::new(mpi)?;
    if std::env::var("PAGEWIRE_VERBOSE").as_deref() == Ok("1") && boot.rank() == 0 {
        eprintln!(
            "pagewire: {} ranks, transport mpi: every call goes to the host MPI library ({})",
            boot.size(),
            mpi.library_version()
        );
    }
    Ok(Inner {
        p2p: None,
        host: Some(Rc::new(host)),
        boot,
        next_context: Cell::new(1),
    })
}

/// Without the feature there is no host MPI library to forward to.
#[cfg(not(feature = "mpi"))]
fn start_host_mpi() -> Result<Inner> {
    Err(no_mpi_feature())
}

/// What `PAGEWIRE_TRANSPORT=mpi` gives in a build without the `mpi` feature.
fn no_mpi_feature() -> Error {
    Error::InvalidArgument(
        "PAGEWIRE_TRANSPORT=mpi, but pagewire was built without the `mpi` feature; rebuild \
         with `--features mpi` (it needs an MPI library: Debian's libmpich-dev, libclang-dev \
         and pkg-config) and start the program with mpirun, or use pagewire's own transport \
         (PAGEWIRE_TRANSPORT=soft)"
            .into(),
    )
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
        match &self.inner.p2p {
            Some(p2p) => f
                .debug_struct("Universe")
                .field("p2p", &*p2p.borrow())
                .finish(),
            None => f
                .debug_struct("Universe")
                .field("transport", &"mpi")
                .finish(),
        }
    }
}

impl Universe {
    /// Starts pagewire with `cfg`; `None` if it is already running in this process.
    pub fn from_config(cfg: UniverseConfig) -> Result<Option<Universe>> {
        if INITIALIZED.with(|i| i.replace(true)) {
            return Ok(None);
        }
        let start = || -> Result<Universe> {
            if cfg.transport == TransportKind::HostMpi {
                return Ok(Universe {
                    inner: Rc::new(start_host_mpi()?),
                });
            }
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
                eprintln!("pagewire: {}", p2p.mode_description());
            }
            Ok(Universe {
                inner: Rc::new(Inner {
                    p2p: Some(RefCell::new(p2p)),
                    #[cfg(feature = "mpi")]
                    host: None,
                    boot,
                    next_context: Cell::new(1),
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
        #[cfg(feature = "mpi")]
        if let Some(host) = &self.inner.host {
            return SimpleCommunicator::on_host(self.inner.clone(), host.clone());
        }
        let p = self.inner.p2p().borrow();
        SimpleCommunicator {
            #[cfg(feature = "mpi")]
            host: None,
            inner: self.inner.clone(),
            context: 0,
            rank: p.rank(),
            size: p.size(),
            ranks: None,
        }
    }

    /// The buffer mode in use; `"mpi"` on the mpi transport, where the host MPI library
    /// moves the data.
    pub fn mode_name(&self) -> &'static str {
        match &self.inner.p2p {
            Some(p2p) => p2p.borrow().mode_name(),
            None => "mpi",
        }
    }

    /// What carries this universe's calls.
    pub fn transport(&self) -> TransportKind {
        match self.inner.p2p {
            Some(_) => TransportKind::Pagewire,
            None => TransportKind::HostMpi,
        }
    }

    /// The message layer, for counters and reports. Panics on the mpi transport, which has
    /// none; [`Universe::try_with_p2p`] returns that as an error.
    pub fn with_p2p<R>(&self, f: impl FnOnce(&PointToPoint) -> R) -> R {
        fatal(self.try_with_p2p(f))
    }

    /// [`Universe::with_p2p`], or an error on the mpi transport.
    pub fn try_with_p2p<R>(&self, f: impl FnOnce(&PointToPoint) -> R) -> Result<R> {
        Ok(f(&self.inner.try_p2p()?.borrow()))
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
        } else {
            #[cfg(feature = "mpi")]
            if self.inner.boot.as_mpi().is_some() {
                remove_job_shm(self.inner.boot.job_id());
            }
        }
        INITIALIZED.with(|i| i.set(false));
    }
}

/// Removes job `job`'s shared-memory objects (the soft NIC's rings and tables of every
/// rank). pwrun does this after a failed job; under mpirun nobody would, and the ranks that
/// `MPI_Abort` kills leave theirs behind. So the failing rank removes them all before its
/// bootstrap aborts: the others keep their mappings until they are killed, and a rank
/// still starting up fails to open a peer's, which ends it as the abort would.
#[cfg(feature = "mpi")]
fn remove_job_shm(job: &str) {
    let prefix = boot::shm_prefix(job);
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
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

    /// A new communicator with the same ranks and a context of its own (`MPI_Comm_dup`):
    /// its messages never match this one's. Collective: every rank calls it. Panics on
    /// error.
    fn duplicate(&self) -> SimpleCommunicator {
        fatal(self.try_duplicate())
    }
    /// [`Communicator::split_by_color_with_key`] with key 0: the ranks keep their order.
    fn split_by_color(&self, color: Color) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_color_with_key(color, 0))
    }
    /// Splits the communicator (`MPI_Comm_split`): the ranks that pass the same `color`
    /// form a new communicator, ranked by `key`, then by their rank here. Collective:
    /// every rank calls it; a rank passing [`Color::undefined`] joins none and gets
    /// `None`. Panics on error.
    fn split_by_color_with_key(&self, color: Color, key: Key) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_color_with_key(color, key))
    }

    /// [`Communicator::duplicate`], returning errors.
    fn try_duplicate(&self) -> Result<SimpleCommunicator>;
    /// [`Communicator::split_by_color_with_key`], returning errors.
    fn try_split_by_color_with_key(
        &self,
        color: Color,
        key: Key,
    ) -> Result<Option<SimpleCommunicator>>;
}

/// A communicator (`MPI_Comm`): ranks and a context that separates its traffic.
pub struct SimpleCommunicator {
    /// On the mpi transport, the host MPI library on this communicator (every call goes
    /// there); `None` on pagewire's. Declared before `inner`, so it is freed before the last
    /// reference to the bootstrap that finalises MPI.
    #[cfg(feature = "mpi")]
    pub(crate) host: Option<Rc<HostMpi>>,
    pub(crate) inner: Rc<Inner>,
    pub(crate) context: u32,
    rank: usize,
    size: usize,
    /// The group's world ranks; `None` for the world's own order.
    pub(crate) ranks: Option<Rc<RankMap>>,
}

impl std::fmt::Debug for SimpleCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleCommunicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("context", &self.context)
            .field("world_ranks", &self.ranks.as_ref().map(|m| &m.world))
            .finish()
    }
}

impl SimpleCommunicator {
    /// A communicator of the mpi transport, on `host`.
    #[cfg(feature = "mpi")]
    fn on_host(inner: Rc<Inner>, host: Rc<HostMpi>) -> SimpleCommunicator {
        SimpleCommunicator {
            rank: host.rank(),
            size: host.size(),
            host: Some(host),
            inner,
            context: 0,
            ranks: None,
        }
    }

    /// The host MPI library behind this communicator, on the mpi transport.
    #[cfg(feature = "mpi")]
    pub(crate) fn host(&self) -> Option<&HostMpi> {
        self.host.as_deref()
    }

    /// Makes progress on every outstanding operation (for polling loops). On the mpi
    /// transport, MPI progresses inside its own calls, and this does nothing.
    pub fn progress(&self) -> Result<()> {
        #[cfg(feature = "mpi")]
        if self.host.is_some() {
            return Ok(());
        }
        self.inner.p2p().borrow_mut().progress().map(|_| ())
    }

    /// The world rank (the message layer's rank) of rank `rank` of this communicator.
    pub(crate) fn world_rank(&self, rank: usize) -> usize {
        self.ranks.as_ref().map_or(rank, |m| m.world_rank(rank))
    }

    /// The world rank of each rank, for the collectives; `None`: the same numbers.
    pub(crate) fn world_ranks(&self) -> Option<&[usize]> {
        self.ranks.as_ref().map(|m| &m.world[..])
    }

    /// Takes `agreed`, the maximum over this communicator's ranks of their lowest unused
    /// context, as a new communicator's context, and moves this process's past it.
    fn take_context(&self, agreed: u32) -> Result<u32> {
        if agreed >= COLLECTIVE_CONTEXT_BIT - 1 {
            return Err(Error::Exhausted {
                what: "communicator context ids",
                limit: u64::from(COLLECTIVE_CONTEXT_BIT - 1),
                hint: "ids are not reused: create communicators once and keep them",
            });
        }
        self.inner.next_context.set(agreed + 1);
        Ok(agreed)
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

    fn try_duplicate(&self) -> Result<SimpleCommunicator> {
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            let dup = Rc::new(h.duplicate()?);
            return Ok(SimpleCommunicator::on_host(self.inner.clone(), dup));
        }
        let mine = self.inner.next_context.get();
        let mut agreed = 0u32;
        self.try_all_reduce_into(&mine, &mut agreed, SystemOperation::max())?;
        Ok(SimpleCommunicator {
            #[cfg(feature = "mpi")]
            host: None,
            inner: self.inner.clone(),
            context: self.take_context(agreed)?,
            rank: self.rank,
            size: self.size,
            ranks: self.ranks.clone(),
        })
    }

    fn try_split_by_color_with_key(
        &self,
        color: Color,
        key: Key,
    ) -> Result<Option<SimpleCommunicator>> {
        #[cfg(feature = "mpi")]
        if let Some(h) = self.host() {
            let color = (!color.is_undefined()).then_some(color.0);
            let sub = h.split(color, key)?;
            return Ok(sub.map(|sub| SimpleCommunicator::on_host(self.inner.clone(), Rc::new(sub))));
        }
        // One allgather of (color, key, lowest unused context) per rank.
        let mine = [
            i64::from(color.0),
            i64::from(key),
            i64::from(self.inner.next_context.get()),
        ];
        let mut all = vec![0i64; 3 * self.size];
        self.try_all_gather_into(&mine[..], &mut all[..])?;
        let agreed = all.chunks(3).map(|e| e[2]).max().unwrap_or(0);
        let context = self.take_context(u32::try_from(agreed).unwrap_or(u32::MAX))?;
        if color.is_undefined() {
            return Ok(None);
        }
        let mut members: Vec<(i64, usize)> = all
            .chunks(3)
            .enumerate()
            .filter(|(_, e)| e[0] == i64::from(color.0))
            .map(|(r, e)| (e[1], r))
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .expect("this rank passed its own color");
        let world: Vec<usize> = members.iter().map(|&(_, r)| self.world_rank(r)).collect();
        let world_size = self.inner.p2p().borrow().size();
        Ok(Some(SimpleCommunicator {
            #[cfg(feature = "mpi")]
            host: None,
            inner: self.inner.clone(),
            context,
            rank,
            size: world.len(),
            ranks: RankMap::new(world, world_size).map(Rc::new),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_maps_translate_both_ways_and_the_world_needs_none() {
        assert!(RankMap::new(vec![0, 1, 2], 3).is_none());
        let m = RankMap::new(vec![3, 1], 4).expect("a proper subgroup");
        assert_eq!((m.world_rank(0), m.world_rank(1)), (3, 1));
        assert_eq!((m.local_rank(3), m.local_rank(1)), (0, 1));
        assert_eq!(m.local_rank(2), 2, "a non-member keeps its world rank");
        assert!(RankMap::new(vec![1, 0], 2).is_some(), "a reordered world");
    }

    #[test]
    fn the_mpi_transport_says_what_it_needs() {
        // Not under mpirun here: without the feature the build is wrong, with it the launch.
        let e = start_host_mpi().err().expect("refused").to_string();
        if cfg!(feature = "mpi") {
            assert!(e.contains("must be started by mpirun or mpiexec"), "{e}");
        } else {
            assert!(e.contains("built without the `mpi` feature"), "{e}");
        }
    }

    #[test]
    fn colors() {
        assert!(Color::undefined().is_undefined());
        assert!(!Color::with_value(0).is_undefined());
        assert!(std::panic::catch_unwind(|| Color::with_value(-1)).is_err());
    }
}
