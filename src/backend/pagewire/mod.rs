//! pagewire's own backend: the message layer (`transport::msg`) on a NIC provider, in the
//! buffer mode of `PAGEWIRE_MODE`, with the collective algorithms of `pagewire-collectives`
//! on it.
//!
//! **Groups.** Each communicator has its own group: its ranks `0..size`, each naming a world
//! rank (the message layer's rank); a split orders them by key, then by rank in the parent.
//! Its calls take and report ranks of its group ([`RankMap`] translates).
//!
//! **Context ids** keep communicators apart: each has its own, so its messages never match
//! another communicator's. They are agreed collectively, as MPICH does: every process keeps
//! the lowest context id it has never used, the parent communicator takes the maximum over
//! its ranks, and every rank moves its own past it. A process's contexts only grow, so no two
//! communicators a process belongs to share one, whatever the order in which different
//! groups created them. The sibling communicators of one split share a context: they have no
//! rank in common. Ids are not reused after a communicator is dropped; point-to-point
//! contexts stay below 2^30 (bit 31, [`COLLECTIVE_CONTEXT_BIT`], marks a communicator's
//! collective context, bit 30 its nonblocking one), so a job can create 2^30 - 1 communicators.
//!
//! Files: this one holds the universe and its communicators, `point_to_point.rs` the
//! point-to-point calls, requests and matched messages, `collective.rs` the collectives,
//! `blocking.rs` the blocking calls on borrowed buffers (this backend's only `unsafe`).

mod blocking;
mod collective;
pub(crate) mod point_to_point;

use std::cell::{Cell, RefCell};
use std::process::Command;
use std::rc::Rc;

use pagewire_collectives::Op;
use pagewire_odp::OdpMode;
use pagewire_pindown::PindownMode;
use pagewire_transport::boot::spawn::{ConnectionJob, SpawnCommand, SpawnRequest};
use pagewire_transport::boot::{self, Bootstrap, PwrunBootstrap};
use pagewire_transport::buffer_mode::copy::CopyMode;
use pagewire_transport::buffer_mode::BufferMode;
use pagewire_transport::msg::{self, PointToPoint};
use pagewire_transport::nic;

use crate::backend::traits::{CollectiveBackend, CommunicatorBackend};
use crate::config::{ModeKind, TransportKind, UniverseConfig};
use crate::error::{Error, Result};

/// The bit that turns a communicator's context into its collective context: collective
/// messages use `context | 0x8000_0000` (the world communicator's point-to-point context is
/// 0, its collective context `0x8000_0000`), so they never match point-to-point messages of
/// the same communicator, whatever their tags. Point-to-point contexts stay below 2^30.
pub const COLLECTIVE_CONTEXT_BIT: u32 = 0x8000_0000;

/// The bit that, with [`COLLECTIVE_CONTEXT_BIT`], makes a communicator's context for
/// nonblocking collectives (and the agreement of `create_from_members`): their messages are
/// point-to-point messages that neither user receives nor blocking collectives (which take
/// any tag from their source) may match. Point-to-point contexts stay below 2^30.
pub const NONBLOCKING_CONTEXT_BIT: u32 = 0x4000_0000;

/// The tag of `create_from_members`'s messages in the nonblocking context; nonblocking
/// collectives use the tags below it.
const MEMBERS_TAG: i32 = msg::TAG_UB;

/// What a rank that joins no communicator contributes to a split as its color: negative, so
/// no rank's color matches it.
const NO_COLOR: i64 = -1;

/// A universe on pagewire's stack: its message layer and context ids. A process has one
/// for its world and one for each spawn it took part in (the connection job between the
/// spawning group and the spawned processes, module `spawn`).
struct PagewireUniverse {
    /// The message layer. Declared before `boot`, so it is freed before the bootstrap.
    p2p: RefCell<PointToPoint>,
    boot: Box<dyn Bootstrap>,
    /// The lowest point-to-point context this process has not used (the world uses 0).
    next_context: Cell<u32>,
    /// By context: the tag of the next nonblocking collective.
    nonblocking_tags: RefCell<std::collections::HashMap<u32, i32>>,
    /// The settings it was started with (a spawn starts its connection's universe so).
    cfg: UniverseConfig,
    /// The intercommunicator to the processes that spawned this one (world universes of
    /// spawned processes).
    parent: Option<PagewireComm>,
    /// A connection job's universe: its drop is collective over the job, as
    /// `MPI_Comm_disconnect` is (a world's is the `Universe`'s).
    connection: bool,
}

impl PagewireUniverse {
    /// Brings up the NIC, the buffer mode of `cfg` and the message layer over `boot`.
    fn open(boot: Box<dyn Bootstrap>, cfg: UniverseConfig) -> Result<PagewireUniverse> {
        let nic = nic::open(&*boot)?;
        let mode: Box<dyn BufferMode> = match cfg.mode {
            ModeKind::Copy => Box::new(CopyMode::new(cfg.copy)),
            ModeKind::Odp => Box::new(OdpMode::new(cfg.odp)),
            ModeKind::Pindown => Box::new(PindownMode::new()),
        };
        let p2p = PointToPoint::new(nic, &*boot, mode, cfg.msg.clone())?;
        Ok(PagewireUniverse {
            p2p: RefCell::new(p2p),
            boot,
            next_context: Cell::new(1),
            nonblocking_tags: RefCell::new(std::collections::HashMap::new()),
            cfg,
            parent: None,
            connection: false,
        })
    }
}

impl Drop for PagewireUniverse {
    fn drop(&mut self) {
        // As the world's finalisation: no process tears down its NIC while its peers may
        // still need it; a process unwinding from a panic skips it.
        if self.connection && !std::thread::panicking() {
            let _ = self.boot.barrier();
        }
    }
}

/// The groups of an intercommunicator: its `ranks` are the other group's, which its
/// point-to-point calls address; this group's are here.
#[derive(Debug)]
struct InterGroups {
    /// This group's ranks in the universe, in order.
    local: Vec<usize>,
    /// The other group's size.
    remote_size: usize,
}

/// A communicator on pagewire's stack: its group and context in the message layer.
#[derive(Clone)]
pub(crate) struct PagewireComm {
    universe: Rc<PagewireUniverse>,
    context: u32,
    rank: usize,
    size: usize,
    /// The group's world ranks (on an intercommunicator the other group's, which
    /// point-to-point calls address); `None` for the world's own order.
    ranks: Option<Rc<RankMap>>,
    /// On an intercommunicator: both groups.
    inter: Option<Rc<InterGroups>>,
}

impl std::fmt::Debug for PagewireComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagewireComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("context", &self.context)
            .field("world_ranks", &self.world_ranks())
            .finish()
    }
}

impl PagewireComm {
    /// Starts pagewire's stack as `cfg` says (bootstrap, NIC, buffer mode, message layer) and
    /// returns the world communicator.
    pub(crate) fn start_world(cfg: UniverseConfig) -> Result<PagewireComm> {
        let mut universe = PagewireUniverse::open(boot::from_env()?, cfg.clone())?;
        let (p2p, boot) = (universe.p2p.get_mut(), &universe.boot);
        if std::env::var("PAGEWIRE_VERBOSE").as_deref() == Ok("1") && boot.rank() == 0 {
            eprintln!("pagewire: started by {}", boot.starter());
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
            eprintln!("pagewire: pinning: {}", p2p.pinning_description());
            crate::config::print_settings_in_force();
        }
        let (rank, size) = (p2p.rank(), p2p.size());
        if let Some((job, rank)) = ConnectionJob::from_env()? {
            universe.parent = Some(PagewireComm::connect(&job, rank, cfg)?);
        }
        Ok(PagewireComm {
            universe: Rc::new(universe),
            context: 0,
            rank,
            size,
            ranks: None,
            inter: None,
        })
    }

    /// Joins connection job `job` as its rank `rank` and returns the intercommunicator
    /// between its two groups (the spawning group, ranks `0..job.parents`, and the spawned
    /// processes): the second half of `MPI_Comm_spawn` on both sides.
    fn connect(job: &ConnectionJob, rank: usize, cfg: UniverseConfig) -> Result<PagewireComm> {
        let boot = PwrunBootstrap::connect(&job.socket, &job.job, rank, job.size())?;
        let mut universe = PagewireUniverse::open(Box::new(boot), cfg)?;
        universe.connection = true;
        // Context 0 is the whole connection job's (merge agrees through it), 1 the
        // intercommunicator's.
        universe.next_context.set(2);
        let parents: Vec<usize> = (0..job.parents).collect();
        let children: Vec<usize> = (job.parents..job.size()).collect();
        let (local, remote) = if rank < job.parents {
            (parents, children)
        } else {
            (children, parents)
        };
        let universe = Rc::new(universe);
        Ok(PagewireComm {
            universe,
            context: 1,
            rank: local.iter().position(|&r| r == rank).expect("a member"),
            size: local.len(),
            ranks: RankMap::new(remote.clone(), job.size()).map(Rc::new),
            inter: Some(Rc::new(InterGroups {
                local,
                remote_size: remote.len(),
            })),
        })
    }

    /// The error of an operation that intercommunicators do not have on this transport
    /// (valid MPI, not done here: `NotSupported`).
    fn refuse_on_intercommunicator(&self, what: &str) -> Result<()> {
        match self.inter {
            Some(_) => Err(Error::NotSupported(format!(
                "{what} on an intercommunicator: pagewire's transport has point-to-point \
                 calls and merge on intercommunicators; merge it (InterCommunicator::merge) \
                 and call {what} on the result"
            ))),
            None => Ok(()),
        }
    }

    /// The world rank (the message layer's rank) of rank `rank` of this communicator.
    fn world_rank(&self, rank: usize) -> usize {
        self.ranks.as_ref().map_or(rank, |m| m.world_rank(rank))
    }

    /// The world rank of each rank, for the collectives; `None`: the same numbers.
    fn world_ranks(&self) -> Option<&[usize]> {
        self.ranks.as_ref().map(|m| &m.world[..])
    }

    /// A new communicator of the same universe, with `context` and its group.
    fn new_comm(&self, context: u32, rank: usize, size: usize, ranks: Option<Rc<RankMap>>) -> Self {
        PagewireComm {
            universe: self.universe.clone(),
            context,
            rank,
            size,
            ranks,
            inter: None,
        }
    }

    /// Takes `agreed`, the maximum over this communicator's ranks of their lowest unused
    /// context, as a new communicator's context, and moves this process's past it.
    fn take_context(&self, agreed: u32) -> Result<u32> {
        if agreed >= NONBLOCKING_CONTEXT_BIT - 1 {
            return Err(Error::Exhausted {
                what: "communicator context ids",
                limit: u64::from(NONBLOCKING_CONTEXT_BIT - 1),
                hint: "ids are not reused: create communicators once and keep them",
            });
        }
        self.universe.next_context.set(agreed + 1);
        Ok(agreed)
    }
}

impl CommunicatorBackend for PagewireComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn duplicate(&self) -> Result<PagewireComm> {
        let mine = self.universe.next_context.get();
        let mut agreed = 0u32;
        self.all_reduce(
            std::slice::from_ref(&mine),
            std::slice::from_mut(&mut agreed),
            &Op::Max,
        )?;
        let context = self.take_context(agreed)?;
        Ok(self.new_comm(context, self.rank, self.size, self.ranks.clone()))
    }

    fn split(&self, color: Option<i32>, key: i32) -> Result<Option<PagewireComm>> {
        // One allgather of (color, key, lowest unused context) per rank.
        let mine = [
            color.map_or(NO_COLOR, i64::from),
            i64::from(key),
            i64::from(self.universe.next_context.get()),
        ];
        let mut all = vec![0i64; 3 * self.size];
        self.all_gather(&mine[..], &mut all[..])?;
        let agreed = all.chunks(3).map(|e| e[2]).max().unwrap_or(0);
        let context = self.take_context(u32::try_from(agreed).unwrap_or(u32::MAX))?;
        let Some(color) = color else {
            return Ok(None);
        };
        let mut members: Vec<(i64, usize)> = all
            .chunks(3)
            .enumerate()
            .filter(|(_, e)| e[0] == i64::from(color))
            .map(|(r, e)| (e[1], r))
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .expect("this rank passed its own color");
        let world: Vec<usize> = members.iter().map(|&(_, r)| self.world_rank(r)).collect();
        let world_size = self.universe.p2p.borrow().size();
        let size = world.len();
        let ranks = RankMap::new(world, world_size).map(Rc::new);
        Ok(Some(self.new_comm(context, rank, size, ranks)))
    }

    fn create_from_members(&self, members: &[usize], _tag: i32) -> Result<PagewireComm> {
        let tag = MEMBERS_TAG;
        // The members agree on a context: each sends its lowest unused one to the first
        // member, which answers with the maximum. Messages go in the collective context, so
        // they never match point-to-point traffic. Only members call it (the facade returns
        // `None` to the others first).
        debug_assert!(members.contains(&self.rank), "a non-member creates a group");
        let rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| {
                Error::Internal("create_from_members on a rank outside the members".into())
            })?;
        let first = members[0];
        let mine = self.universe.next_context.get();
        let mut p2p = self.universe.p2p.borrow_mut();
        let context = self.context | COLLECTIVE_CONTEXT_BIT | NONBLOCKING_CONTEXT_BIT;
        let agreed = if rank == 0 {
            let mut agreed = mine;
            for &m in &members[1..] {
                let mut theirs = [0u8; 4];
                let src = Some(self.world_rank(m));
                blocking::receive(&mut p2p, src, Some(tag), context, &mut theirs)?;
                agreed = agreed.max(u32::from_ne_bytes(theirs));
            }
            for &m in &members[1..] {
                let dest = self.world_rank(m);
                blocking::send(&mut p2p, dest, tag, context, &agreed.to_ne_bytes(), false)?;
            }
            agreed
        } else {
            let dest = self.world_rank(first);
            blocking::send(&mut p2p, dest, tag, context, &mine.to_ne_bytes(), false)?;
            let mut agreed = [0u8; 4];
            blocking::receive(&mut p2p, Some(dest), Some(tag), context, &mut agreed)?;
            u32::from_ne_bytes(agreed)
        };
        drop(p2p);
        let context = self.take_context(agreed)?;
        let world: Vec<usize> = members.iter().map(|&r| self.world_rank(r)).collect();
        let world_size = self.universe.p2p.borrow().size();
        let size = world.len();
        let ranks = RankMap::new(world, world_size).map(Rc::new);
        Ok(self.new_comm(context, rank, size, ranks))
    }

    fn same_context(&self, other: &PagewireComm) -> bool {
        Rc::ptr_eq(&self.universe, &other.universe) && self.context == other.context
    }

    fn progress(&self) -> Result<()> {
        self.universe.p2p.borrow_mut().progress()?;
        Ok(())
    }

    fn world_ranks(&self) -> Result<Vec<usize>> {
        if let Some(inter) = &self.inter {
            return Ok(inter.local.clone());
        }
        Ok((0..self.size).map(|r| self.world_rank(r)).collect())
    }

    fn nonblocking_channel(&self) -> Result<(PagewireComm, i32)> {
        self.refuse_on_intercommunicator("a nonblocking collective")?;
        let mut tags = self.universe.nonblocking_tags.borrow_mut();
        let next = tags.entry(self.context).or_insert(0);
        let tag = *next;
        *next = (*next + 1) % MEMBERS_TAG;
        let context = self.context | COLLECTIVE_CONTEXT_BIT | NONBLOCKING_CONTEXT_BIT;
        Ok((
            self.new_comm(context, self.rank, self.size, self.ranks.clone()),
            tag,
        ))
    }

    fn target_size(&self) -> usize {
        self.inter.as_ref().map_or(self.size, |i| i.remote_size)
    }

    fn spawn(&self, root: usize, commands: &[Command], maxprocs: &[i32]) -> Result<PagewireComm> {
        self.refuse_on_intercommunicator("spawn")?;
        // The root asks the launcher; every rank learns the answer (the connection job, or
        // why there is none) from it, so that all fail or all connect.
        let mut answer = Vec::new();
        if self.rank == root {
            let request = SpawnRequest {
                group: (0..self.size).map(|r| self.world_rank(r)).collect(),
                commands: commands
                    .iter()
                    .zip(maxprocs)
                    .map(|(c, &n)| SpawnCommand::from_command(c, n.max(1) as usize))
                    .collect(),
            };
            answer = match self.universe.boot.spawn(&request) {
                Ok(job) => [&[1u8][..], &job.to_bytes()].concat(),
                Err(e) => [&[0u8][..], e.launcher_text().as_bytes()].concat(),
            };
        }
        let mut len = [answer.len() as u64];
        self.broadcast(root, &mut len[..])?;
        answer.resize(len[0] as usize, 0);
        self.broadcast(root, &mut answer[..])?;
        let job = match answer.split_first() {
            // The root wrote the answer itself (`ConnectionJob::to_bytes`, never empty).
            Some((1, job)) => ConnectionJob::from_bytes(job)
                .ok_or_else(|| Error::Internal("spawn: the root's answer is garbled".into()))?,
            Some((_, why)) => return Err(Error::Launcher(String::from_utf8_lossy(why).into())),
            None => return Err(Error::Internal("spawn: no answer from the root".into())),
        };
        PagewireComm::connect(&job, self.rank, self.universe.cfg.clone())
    }

    fn parent(&self) -> Result<Option<PagewireComm>> {
        Ok(self.universe.parent.clone())
    }

    fn merge(&self, high: bool) -> Result<PagewireComm> {
        // Only an `InterCommunicator` merges, and its backend is always one.
        let Some(inter) = &self.inter else {
            return Err(Error::Internal(
                "merge of a backend that is not an intercommunicator".into(),
            ));
        };
        // Every process of the connection job is in one of the two groups: they agree on
        // the order and a context through the job's own communicator (context 0).
        let job_size = self.universe.p2p.borrow().size();
        let me = self.universe.p2p.borrow().rank();
        let whole = PagewireComm {
            universe: self.universe.clone(),
            context: 0,
            rank: me,
            size: job_size,
            ranks: None,
            inter: None,
        };
        let mine = [i64::from(high), i64::from(self.universe.next_context.get())];
        let mut all = vec![0i64; 2 * job_size];
        whole.all_gather(&mine[..], &mut all[..])?;
        let agreed = all.chunks(2).map(|e| e[1]).max().unwrap_or(0);
        let context = self.take_context(u32::try_from(agreed).unwrap_or(u32::MAX))?;
        // Low before high; with equal choices, the group holding rank 0 of the job first.
        let mut order: Vec<(i64, bool, usize)> = all
            .chunks(2)
            .enumerate()
            .map(|(r, e)| {
                (
                    e[0],
                    inter.local.contains(&r) != inter.local.contains(&0),
                    r,
                )
            })
            .collect();
        order.sort_unstable();
        let world: Vec<usize> = order.iter().map(|&(_, _, r)| r).collect();
        let rank = world.iter().position(|&r| r == me).expect("a member");
        let ranks = RankMap::new(world, job_size).map(Rc::new);
        Ok(self.new_comm(context, rank, job_size, ranks))
    }

    fn transport(&self) -> TransportKind {
        TransportKind::Pagewire
    }

    fn mode_name(&self) -> &'static str {
        self.universe.p2p.borrow().mode_name()
    }

    fn message_context(&self) -> Option<u32> {
        Some(self.context)
    }

    fn with_message_layer<R>(&self, f: impl FnOnce(&mut PointToPoint) -> R) -> Result<R> {
        Ok(f(&mut self.universe.p2p.borrow_mut()))
    }

    fn bootstrap(&self) -> &dyn Bootstrap {
        &*self.universe.boot
    }
}

/// The ranks of a communicator other than the world: the world rank of each of its ranks,
/// and back.
#[derive(Debug, PartialEq, Eq)]
struct RankMap {
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
    fn world_rank(&self, rank: usize) -> usize {
        self.world[rank]
    }

    /// The group rank of world rank `world` (a sender in this communicator's context is
    /// always a member; a non-member keeps its world rank).
    fn local_rank(&self, world: usize) -> usize {
        match self.local.get(world) {
            Some(&r) if r != usize::MAX => r,
            _ => world,
        }
    }
}

/// The message layer's status with the source as a rank of the group `ranks` (`None`: the
/// world).
fn in_group(ranks: Option<&RankMap>, mut status: msg::Status) -> msg::Status {
    if let Some(m) = ranks {
        status.source = m.local_rank(status.source);
    }
    status
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
    fn statuses_name_the_source_in_the_group() {
        let m = RankMap::new(vec![3, 1], 4).expect("a proper subgroup");
        let s = msg::Status {
            source: 3,
            tag: 7,
            count: 2,
        };
        assert_eq!(in_group(Some(&m), s).source, 0);
        assert_eq!(in_group(None, s), s);
        assert_eq!(COLLECTIVE_CONTEXT_BIT, 0x8000_0000);
    }
}
