//! The local path: ranks of one host exchange the message layer's messages through rings of
//! cells in shared memory, and large payloads with one kernel copy out of the sender's
//! memory (`process_vm_readv`, CMA; `msg/rndv_local.rs`), as MPICH's CH4 POSIX transport,
//! Open MPI's `sm` and UCX's `mm` and `cma` transports do. The NIC, and with it the buffer
//! modes, carries the traffic between hosts only (`PAGEWIRE_LOCAL=nic` sends local traffic
//! through the NIC as well, to measure the modes between ranks of one host).
//!
//! Each rank owns one segment (`/dev/shm/pagewire-JOB-local-RANK`) with a ring per sender
//! of its host (`ring.rs`). Posting and polling are plain loads and stores in it; the kernel
//! is entered only for the single copy of a large message.
//!
//! When ranks outnumber CPUs, a rank that has waited a while with nothing to do sleeps on a
//! futex in its segment instead of yielding in a loop on a CPU the ranks it waits for need;
//! a sender that publishes a message to a sleeping rank wakes it (`LocalPath::sleep`).
//!
//! Which peers are local is settled once, at start-up, and the same on both sides: the same
//! host (`HostKey`: kernel, `/dev/shm`, PID namespace), `PAGEWIRE_LOCAL=shm` on both, and
//! CMA permitted both ways. A peer is local or remote for the whole job, so MPI's order of
//! the messages of a pair holds whichever path they take.

mod ring;

use std::sync::atomic::{
    fence,
    Ordering::{Acquire, SeqCst},
};
use std::time::Duration;

use crate::boot::{self, Bootstrap};
use crate::error::{Error, Result};
use crate::sys::Error as SystemError;
use crate::sys::{self, HostKey, SharedSegment, HOST_KEY_BYTES};
pub(crate) use ring::Geometry;

/// How ranks of one host reach each other (`PAGEWIRE_LOCAL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocalSetting {
    /// Through shared memory and CMA (the default).
    #[default]
    Shm,
    /// Through the NIC, like ranks of other hosts: the buffer modes then govern local
    /// traffic too (the mode-comparison benchmarks use it).
    Nic,
}

impl LocalSetting {
    /// `PAGEWIRE_LOCAL`: `shm` (default) or `nic`.
    pub fn from_env() -> Result<LocalSetting> {
        match std::env::var("PAGEWIRE_LOCAL").as_deref() {
            Err(_) | Ok("") | Ok("shm") => Ok(LocalSetting::Shm),
            Ok("nic") => Ok(LocalSetting::Nic),
            Ok(other) => Err(Error::invalid_setting(
                "PAGEWIRE_LOCAL",
                other,
                "expected shm or nic",
            )),
        }
    }

    /// The name, as `PAGEWIRE_LOCAL` spells it.
    pub fn name(self) -> &'static str {
        match self {
            LocalSetting::Shm => "shm",
            LocalSetting::Nic => "nic",
        }
    }
}

/// What a peer reads through CMA at start-up to find out whether the kernel lets it.
static CMA_PROBE: u64 = ring::MAGIC;

/// One local peer.
#[derive(Debug)]
struct LocalPeer {
    pid: u32,
    /// The peer's segment (`None` for this rank itself, whose segment is `own`).
    seg: Option<SharedSegment>,
    /// This rank's ring in the peer's segment.
    outbound: usize,
    /// The peer's ring in this rank's segment.
    inbound: usize,
    /// Sender side: the next position to write, and the first one the ring has no room
    /// for as last seen.
    head: u64,
    room_until: u64,
    /// Receiver side: the next position to read.
    next: u64,
    /// Barriers this rank entered with the peer (`LocalPath::enter_barrier`), and whether
    /// it waits for the peer to enter the last one (a sleep then wakes for it).
    barriers: u64,
    awaited: bool,
}

/// The local path of one rank: its rings and its local peers'.
#[derive(Debug)]
pub struct LocalPath {
    own: SharedSegment,
    geometry: Geometry,
    peers: Vec<Option<LocalPeer>>,
    /// The local ranks, this one included, in rank order: what progress polls.
    local: Vec<usize>,
    /// Ranks may sleep (`LocalPath::sleep`): a send checks whether its receiver does.
    wake_sleepers: bool,
}

/// What a rank tells the others at start-up: whether it takes the local path, its pid,
/// where its CMA probe is, and its host.
fn encode_hello(shm: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(13 + HOST_KEY_BYTES);
    v.push(shm as u8);
    v.extend_from_slice(&std::process::id().to_le_bytes());
    v.extend_from_slice(&(std::ptr::from_ref(&CMA_PROBE) as u64).to_le_bytes());
    HostKey::here().encode(&mut v);
    v
}

struct Hello {
    shm: bool,
    pid: u32,
    probe: u64,
    host: HostKey,
}

fn decode_hello(rank: usize, b: &[u8]) -> Result<Hello> {
    if b.len() != 13 + HOST_KEY_BYTES {
        return Err(SystemError::Bootstrap(format!(
            "rank {rank} sent a malformed local-path address"
        ))
        .into());
    }
    Ok(Hello {
        shm: b[0] == 1,
        pid: u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")),
        probe: u64::from_le_bytes(b[5..13].try_into().expect("8 bytes")),
        host: HostKey::decode(&b[13..]),
    })
}

/// Whether this process may read process `pid`'s memory with CMA: reads its probe word.
fn cma_permitted(pid: u32, probe: u64) -> bool {
    sys::cma_read_word(pid, probe) == Some(ring::MAGIC)
}

impl LocalPath {
    /// Sets up the local path (collective: every rank calls it, whatever its setting):
    /// finds the ranks that share this host and permit CMA both ways, creates this rank's
    /// rings, one per sender of its host, and maps the local peers' (whose cells carry
    /// messages of up to `message_bytes`). `None` when this rank takes no local path.
    pub fn new(
        boot: &dyn Bootstrap,
        setting: LocalSetting,
        message_bytes: usize,
    ) -> Result<Option<LocalPath>> {
        let (rank, size) = (boot.rank(), boot.size());
        let shm = setting == LocalSetting::Shm;
        if shm {
            // Under Yama's ptrace scope 1 siblings must name their launcher (as the soft
            // NIC does); should the kernel refuse, the probe below finds CMA forbidden.
            sys::admit_cma_from_siblings(size);
        }
        let hellos = boot
            .allgather(&encode_hello(shm))?
            .iter()
            .enumerate()
            .map(|(r, b)| decode_hello(r, b))
            .collect::<Result<Vec<Hello>>>()?;
        let me = &hellos[rank];
        // The ranks of this host that take the local path: every one of them computes the
        // same list, so a sender's ring has the same index in every receiver's segment.
        let host: Vec<usize> = (0..size)
            .filter(|&r| hellos[r].shm && hellos[r].host == me.host)
            .collect();
        let candidate: Vec<bool> = (0..size)
            .map(|r| {
                shm && host.contains(&r)
                    && (r == rank || cma_permitted(hellos[r].pid, hellos[r].probe))
            })
            .collect();
        let geometry = Geometry::new(message_bytes, host.len());
        let own = if shm {
            let name = format!("{}local-{rank}", boot::shm_prefix(boot.job_id()));
            Some(SharedSegment::create(&name, geometry.segment_bytes())?)
        } else {
            None
        };
        if let Some(own) = &own {
            geometry.write_header(own);
        }
        // Local: a candidate both ways (CMA may be permitted in one direction only).
        let verdicts = boot.allgather(&bitmap(&candidate))?;
        let Some(own) = own else {
            return Ok(None);
        };
        let mut peers: Vec<Option<LocalPeer>> = (0..size).map(|_| None).collect();
        let mut local = Vec::new();
        let index_of = |r: usize| {
            host.iter()
                .position(|&h| h == r)
                .expect("a rank of this host")
        };
        for r in 0..size {
            if !(candidate[r] && bit(&verdicts[r], rank)) {
                continue;
            }
            let seg = if r == rank {
                None
            } else {
                let name = format!("{}local-{r}", boot::shm_prefix(boot.job_id()));
                let seg = SharedSegment::open(&name)?;
                geometry.check_header(&seg, &name)?;
                Some(seg)
            };
            peers[r] = Some(LocalPeer {
                pid: hellos[r].pid,
                seg,
                outbound: index_of(rank),
                inbound: index_of(r),
                head: 0,
                room_until: geometry.cells(),
                next: 0,
                barriers: 0,
                awaited: false,
            });
            local.push(r);
        }
        Ok(Some(LocalPath {
            own,
            geometry,
            peers,
            local,
            wake_sleepers: false,
        }))
    }

    /// Removes this rank's segment's name: called once every local peer has mapped it (after
    /// the start-up's last barrier), so that nothing is left in `/dev/shm` however the job
    /// ends.
    pub fn unlink(&self) {
        self.own.unlink_name();
    }

    /// Whether `peer` is reached through the local path.
    pub fn is_local(&self, peer: usize) -> bool {
        self.peers.get(peer).is_some_and(Option::is_some)
    }

    /// The local ranks, this one included, in rank order.
    pub fn local_ranks(&self) -> &[usize] {
        &self.local
    }

    /// The process id of local peer `peer` (for CMA).
    pub fn pid_of(&self, peer: usize) -> Option<u32> {
        self.peers.get(peer)?.as_ref().map(|p| p.pid)
    }

    /// Bytes a message may have (header included).
    pub fn capacity(&self) -> usize {
        self.geometry.capacity()
    }

    /// Cells per ring.
    pub fn cells(&self) -> u64 {
        self.geometry.cells()
    }

    /// Writes a message of `len` bytes (`short`: in the short form) into the next cell of
    /// this rank's ring at `peer` (`fill` gets the cell's bytes) and publishes it; false when
    /// the ring is full (the peer has not read enough yet: try again after progress).
    pub fn try_send(
        &mut self,
        peer: usize,
        len: usize,
        short: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        let g = self.geometry;
        assert!(len <= g.capacity(), "a local message larger than a cell");
        let p = self.peers[peer].as_mut().expect("a local peer");
        let seg = match p.seg.as_mut() {
            Some(s) => s,
            None => &mut self.own,
        };
        if p.head >= p.room_until {
            p.room_until = g.consumed(seg, p.outbound) + g.cells();
            if p.head >= p.room_until {
                return false;
            }
        }
        g.publish(seg, p.outbound, p.head, len, short, fill);
        p.head += 1;
        if self.wake_sleepers {
            wake(&g, seg);
        }
        true
    }

    /// This rank enters a barrier with local peer `peer` (a blocking barrier of a
    /// communicator whose ranks are all local: every pair of its ranks enters it, in the
    /// same order, as MPI orders blocking collectives): one store into the peer's segment.
    pub fn enter_barrier(&mut self, peer: usize) {
        let g = self.geometry;
        let p = self.peers[peer].as_mut().expect("a local peer");
        p.barriers += 1;
        p.awaited = true;
        let seg = match p.seg.as_ref() {
            Some(s) => s,
            None => &self.own,
        };
        g.barriers(seg, p.outbound).store(p.barriers, SeqCst);
        if self.wake_sleepers {
            wake(&g, seg);
        }
    }

    /// Whether local peer `peer` has entered the barrier this rank last entered with it;
    /// once it has, this rank no longer waits for it.
    pub fn peer_entered_barrier(&mut self, peer: usize) -> bool {
        let entered = self.barrier_reached(peer);
        if entered {
            self.peers[peer].as_mut().expect("a local peer").awaited = false;
        }
        entered
    }

    fn barrier_reached(&self, peer: usize) -> bool {
        let p = self.peers[peer].as_ref().expect("a local peer");
        self.geometry.barriers(&self.own, p.inbound).load(Acquire) >= p.barriers
    }

    /// Lets ranks sleep in [`LocalPath::sleep`] (every rank of the job sets the same: when
    /// ranks outnumber CPUs), and so makes every send check whether its receiver sleeps.
    pub fn allow_sleep(&mut self, on: bool) {
        self.wake_sleepers = on;
    }

    /// Sleeps until a local peer publishes a message for this rank (or at most `timeout`):
    /// returns at once if one is already there. Only with [`LocalPath::allow_sleep`].
    pub fn sleep(&self, timeout: Duration) {
        let g = &self.geometry;
        let (asleep, bell) = (g.asleep(&self.own), g.bell(&self.own));
        asleep.store(1, SeqCst);
        fence(SeqCst);
        // The bell is read before the rings: a message published after the check bumps it,
        // and the futex then does not sleep.
        let seen = bell.load(SeqCst);
        let nothing_new = self.local.iter().all(|&peer| {
            let awaited = self.peers[peer].as_ref().is_some_and(|p| p.awaited);
            self.peek(peer).is_none() && !(awaited && self.barrier_reached(peer))
        });
        if nothing_new {
            sys::futex_wait(bell, seen, timeout);
        }
        asleep.store(0, SeqCst);
    }

    /// The oldest message from `peer` that this rank has not released: where its bytes are
    /// in this rank's segment ([`LocalPath::message`]), how many there are, and whether it
    /// is in the short form.
    pub fn peek(&self, peer: usize) -> Option<(usize, usize, bool)> {
        let p = self.peers[peer].as_ref()?;
        self.geometry.published(&self.own, p.inbound, p.next)
    }

    /// The bytes of a cell's message area at `offset` (from [`LocalPath::peek`]), all of it.
    pub fn message(&self, offset: usize) -> &[u8] {
        self.own.bytes(offset, self.geometry.capacity())
    }

    /// Gives the oldest message from `peer` back to it: its cell may be written again.
    pub fn release(&mut self, peer: usize) {
        let p = self.peers[peer].as_mut().expect("a local peer");
        p.next += 1;
        self.geometry.consume(&self.own, p.inbound, p.next);
    }
}

/// Wakes the owner of `seg` if it sleeps. Pairs with the fence in `sleep`: either the owner
/// sees what was just published before it sleeps, or this sees it asleep.
fn wake(g: &Geometry, seg: &SharedSegment) {
    fence(SeqCst);
    if g.asleep(seg).load(SeqCst) != 0 {
        g.bell(seg).fetch_add(1, SeqCst);
        sys::futex_wake(g.bell(seg));
    }
}

fn bitmap(bits: &[bool]) -> Vec<u8> {
    let mut v = vec![0u8; bits.len().div_ceil(8)];
    for (i, &b) in bits.iter().enumerate() {
        if b {
            v[i / 8] |= 1 << (i % 8);
        }
    }
    v
}

fn bit(map: &[u8], i: usize) -> bool {
    map.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps_round_trip() {
        let bits = [true, false, false, true, false, false, false, false, true];
        let m = bitmap(&bits);
        assert_eq!(m.len(), 2);
        for (i, &b) in bits.iter().enumerate() {
            assert_eq!(bit(&m, i), b);
        }
        assert!(!bit(&m, 100));
    }

    #[test]
    fn this_process_may_read_its_own_probe() {
        assert!(cma_permitted(
            std::process::id(),
            std::ptr::from_ref(&CMA_PROBE) as u64
        ));
        assert!(!cma_permitted(std::process::id(), 8));
    }

    #[test]
    fn the_setting_is_shm_unless_told_nic() {
        assert_eq!(LocalSetting::default(), LocalSetting::Shm);
        assert_eq!(LocalSetting::Nic.name(), "nic");
    }
}
