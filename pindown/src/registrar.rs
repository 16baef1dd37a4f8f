//! What the cache needs from whoever pins memory: register a range, deregister it.
//!
//! The cache is generic over this trait, the way UCX's registration cache is generic over
//! its memory-region callbacks (`src/ucs/memory/rcache.h`), so it is tested with a fake
//! registrar that records every call (STYLE.md, "UCX"). [`NicRegistrar`] is the real one: a
//! thin adapter over [`Nic::register`] / [`Nic::deregister`].

use std::error::Error as StdError;
use std::ops::Deref;

use pagewire_transport::nic::{Access, Nic, RegionInfo};

/// A boxed error from a registrar, kept as the source of a [`RegisterError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A registration the registrar made: the range it pins and its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Registration {
    /// First byte covered.
    pub addr: u64,
    /// Bytes covered.
    pub len: u64,
    /// Key for local scatter-gather entries.
    pub lkey: u32,
    /// Key peers name in RDMA operations.
    pub rkey: u32,
}

impl From<RegionInfo> for Registration {
    fn from(r: RegionInfo) -> Self {
        Registration {
            addr: r.addr,
            len: r.len,
            lkey: r.lkey,
            rkey: r.rkey,
        }
    }
}

/// Why a registrar could not register a range. The cache acts on the kind:
/// [`RegisterError::NoResources`] makes it evict an unused registration and retry (and fall
/// back to copying when nothing is left to evict); the other kinds are not retried.
///
/// This is a second error type in the crate on purpose (STYLE.md asks for one per crate):
/// it is the registrar's half of the contract, and its variants are exactly the decisions
/// the cache makes, while [`crate::Error`] is what the cache reports to its caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// Pinning would exceed the locked-memory limit, or a table (memory regions) is full:
    /// deregistering something may make room.
    #[error("out of registration resources: {0}")]
    NoResources(#[source] BoxError),

    /// The range is not (entirely) mapped in this process; retrying cannot help.
    #[error("{len} bytes at {addr:#x} are not mapped in this process")]
    NotMapped {
        /// Start of the range asked for.
        addr: u64,
        /// Length of the range asked for.
        len: u64,
    },

    /// Any other failure.
    #[error("{0}")]
    Other(#[source] BoxError),
}

/// Registers and deregisters ranges for the cache.
///
/// The cache calls `register` with page-aligned ranges and calls `deregister` exactly once
/// for every registration `register` returned, never for anything else.
pub trait Registrar {
    /// Registers (pins) exactly `[addr, addr+len)` (the cache accounts that many bytes and
    /// reports the registration as covering them).
    fn register(&mut self, addr: u64, len: u64) -> Result<Registration, RegisterError>;

    /// Deregisters (unpins) `reg`. An error is counted by the cache
    /// ([`crate::CacheCounters::deregister_failures`]); the registration is gone for the
    /// cache either way.
    fn deregister(&mut self, reg: &Registration) -> Result<(), RegisterError>;
}

/// The rights a user buffer's registration takes in the pindown mode, whatever the
/// strategy: it may be sent from, received into, and read or written by a peer.
pub const REGISTRATION_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_WRITE);

/// The real registrar: registers through a [`Nic`], with one access set for every
/// registration.
///
/// The cache finds registrations by address only, so every registration must carry all
/// the rights any lease may need: by default LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE, which
/// serves both the sending (the NIC or the peer reads) and the receiving side (the NIC or the
/// peer writes).
///
/// `P` is anything that reaches the NIC: `&dyn Nic` (see [`NicRef`]) for a cache that lives
/// inside a borrow of the NIC, `Arc<dyn Nic>` for one that must outlive the caller's borrow
/// (a buffer mode, or a cache a monitor thread also reaches).
#[derive(Clone)]
pub struct NicRegistrar<P> {
    nic: P,
    access: Access,
}

impl<P> std::fmt::Debug for NicRegistrar<P>
where
    P: Deref,
    P::Target: Nic,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicRegistrar")
            .field("device", &self.nic.capabilities().device)
            .field("access", &self.access)
            .finish()
    }
}

/// [`NicRegistrar`] over a borrowed NIC.
pub type NicRef<'a> = NicRegistrar<&'a dyn Nic>;

impl<P> NicRegistrar<P>
where
    P: Deref,
    P::Target: Nic,
{
    /// Registers with [`REGISTRATION_ACCESS`].
    pub fn new(nic: P) -> Self {
        Self::with_access(nic, REGISTRATION_ACCESS)
    }

    /// Registers with `access` (which must not contain ON_DEMAND: an ODP region pins
    /// nothing and needs no cache).
    pub fn with_access(nic: P, access: Access) -> Self {
        debug_assert!(!access.contains(Access::ON_DEMAND));
        NicRegistrar { nic, access }
    }

    /// The access rights of every registration.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The NIC.
    pub fn nic(&self) -> &P::Target {
        &self.nic
    }
}

impl<P> Registrar for NicRegistrar<P>
where
    P: Deref,
    P::Target: Nic,
{
    fn register(&mut self, addr: u64, len: u64) -> Result<Registration, RegisterError> {
        use pagewire_transport::sys::Error as E;
        match self.nic.register(addr, len, self.access) {
            Ok(info) => Ok(info.into()),
            Err(e @ (E::MemlockLimit { .. } | E::Exhausted { .. })) => {
                Err(RegisterError::NoResources(Box::new(e)))
            }
            Err(E::UnmappedRange { addr, len }) => Err(RegisterError::NotMapped { addr, len }),
            Err(e) => Err(RegisterError::Other(Box::new(e))),
        }
    }

    fn deregister(&mut self, reg: &Registration) -> Result<(), RegisterError> {
        self.nic
            .deregister(reg.lkey)
            .map_err(|e| RegisterError::Other(Box::new(e)))
    }
}
