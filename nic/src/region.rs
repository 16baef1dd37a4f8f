//! A registered memory region that deregisters itself when dropped, as rust-ibverbs'
//! `MemoryRegion` does (`../shared/STYLE.md`): the owning handle over the [`Nic`] trait's
//! plain keys. The trait keeps plain keys because its long-lived owners — the pin-down
//! cache, which decides when each registration ends, and the message layer's and the copy
//! mode's pools — already release them in one place; code that registers a buffer for a
//! scope (tools, tests, applications of the raw NIC) holds a [`Region`] instead and cannot
//! forget to deregister, or deregister twice.

use std::ops::Deref;

use super::{Access, Advice, Nic, RegionInfo};
use pagewire_sys::Result;

/// A memory region registered through `N` (`&SoftNic`, `&dyn Nic`, `Arc<dyn Nic>`, ...),
/// deregistered when dropped (deregistration waits for DMA in flight to it, as
/// `ibv_dereg_mr` does; its error, which only a NIC already torn down returns, is
/// ignored there — call [`Region::deregister`] to see it).
pub struct Region<N>
where
    N: Deref,
    N::Target: Nic,
{
    nic: N,
    info: RegionInfo,
}

impl<N> Region<N>
where
    N: Deref,
    N::Target: Nic,
{
    /// Registers `[addr, addr+len)` with `access` ([`Nic::register`]).
    pub fn register(nic: N, addr: u64, len: u64, access: Access) -> Result<Region<N>> {
        let info = nic.register(addr, len, access)?;
        Ok(Region { nic, info })
    }

    /// Registers the whole address space on demand ([`Nic::register_implicit_odp`]).
    pub fn implicit_odp(nic: N, access: Access) -> Result<Region<N>> {
        let info = nic.register_implicit_odp(access)?;
        Ok(Region { nic, info })
    }

    /// Where it is, its keys and rights.
    pub fn info(&self) -> RegionInfo {
        self.info
    }

    /// The key for local scatter-gather entries.
    pub fn lkey(&self) -> u32 {
        self.info.lkey
    }

    /// The key peers name in RDMA operations.
    pub fn rkey(&self) -> u32 {
        self.info.rkey
    }

    /// Maps `[addr, addr+len)` of an ODP region ahead of use ([`Nic::advise`]).
    pub fn advise(&self, addr: u64, len: u64, advice: Advice) -> Result<()> {
        self.nic.advise(self.info.lkey, addr, len, advice)
    }

    /// Deregisters now and returns the NIC's answer.
    pub fn deregister(self) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        this.nic.deregister(this.info.lkey)
    }
}

impl<N> Drop for Region<N>
where
    N: Deref,
    N::Target: Nic,
{
    fn drop(&mut self) {
        let _ = self.nic.deregister(self.info.lkey);
    }
}

impl<N> std::fmt::Debug for Region<N>
where
    N: Deref,
    N::Target: Nic,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("info", &self.info).finish()
    }
}
