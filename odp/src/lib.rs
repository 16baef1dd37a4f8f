//! The `odp` buffer mode: user buffers go to the NIC as they are, unpinned, through
//! on-demand paging (ODP13; Lesokhin17 sections 4 and 6). Pages reach the NIC's tables by
//! network page faults on first use, or ahead of use by prefetch; memory changes clear them.
//!
//! - `PAGEWIRE_ODP=implicit` (default): one ODP region covers the whole address space,
//!   registered once at start-up, so the data path makes no registration call at all
//!   (implicit ODP, ODP13 "Huge MR support").
//! - `PAGEWIRE_ODP=explicit`: an ODP region per transfer, registered when it begins and
//!   deregistered when it ends (cheap: nothing is pinned).
//! - `PAGEWIRE_ODP_PREFETCH=off|rendezvous|always`: `rendezvous` (default) prefetches each
//!   buffer when the protocol knows it is about to move — ODP13's "MPI rendezvous
//!   optimization": the receive buffer when the RTS matches, before any data arrives; the
//!   send buffer when a CTS arrives (RPUT) or right after the RTS of an RGET has gone out
//!   (the receiver will read it). Without it, faults on the target side are responder
//!   faults, each costing a receiver-not-ready round trip. `always` prefetches both buffers
//!   as soon as each side begins (the sender before its RTS). `off` lets every first touch
//!   fault.
//!
//! The mode refuses to start, with the device's name, on a NIC without RC ODP.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use pagewire_transport::buffer_mode::{
    BufferMode, Direction, Lease, ModeCounters, Pipeline, Transfer,
};
use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::nic::{Access, Advice, Nic};
use pagewire_transport::sys::Error as SystemError;
use pagewire_transport::{Error, Result};

/// Implicit or explicit ODP regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regions {
    /// One region for the whole address space.
    Implicit,
    /// One region per transfer.
    Explicit,
}

/// When buffers are prefetched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// Never: first touches fault.
    Off,
    /// The receive buffer, when the RTS matches.
    Rendezvous,
    /// Both buffers, as soon as each side of a transfer begins.
    Always,
}

/// Settings of the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OdpConfig {
    /// `PAGEWIRE_ODP`.
    pub regions: Regions,
    /// `PAGEWIRE_ODP_PREFETCH`.
    pub prefetch: Prefetch,
}

impl Default for OdpConfig {
    fn default() -> Self {
        OdpConfig {
            regions: Regions::Implicit,
            prefetch: Prefetch::Rendezvous,
        }
    }
}

impl OdpConfig {
    /// Reads `PAGEWIRE_ODP` and `PAGEWIRE_ODP_PREFETCH`.
    pub fn from_env() -> Result<OdpConfig> {
        let regions = match std::env::var("PAGEWIRE_ODP").as_deref() {
            Err(_) | Ok("") | Ok("implicit") => Regions::Implicit,
            Ok("explicit") => Regions::Explicit,
            Ok(o) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_ODP",
                    o,
                    "expected implicit or explicit",
                ))
            }
        };
        let prefetch = match std::env::var("PAGEWIRE_ODP_PREFETCH").as_deref() {
            Err(_) | Ok("") | Ok("rendezvous") => Prefetch::Rendezvous,
            Ok("off") => Prefetch::Off,
            Ok("always") => Prefetch::Always,
            Ok(o) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_ODP_PREFETCH",
                    o,
                    "expected off, rendezvous or always",
                ))
            }
        };
        Ok(OdpConfig { regions, prefetch })
    }
}

fn access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::ON_DEMAND
}

/// The ODP mode.
pub struct OdpMode {
    config: OdpConfig,
    /// The NIC, for the invalidations it counts (its ODP tables are the mode's state).
    nic: Option<std::sync::Arc<dyn Nic>>,
    implicit_key: Option<u32>,
    counters: ModeCounters,
    prefetched_bytes: u64,
}

impl std::fmt::Debug for OdpMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OdpMode")
            .field("config", &self.config)
            .field("implicit_key", &self.implicit_key)
            .finish_non_exhaustive()
    }
}

impl OdpMode {
    /// A mode with `config`; the implicit region is registered at `start`.
    pub fn new(config: OdpConfig) -> OdpMode {
        OdpMode {
            config,
            nic: None,
            implicit_key: None,
            counters: ModeCounters::default(),
            prefetched_bytes: 0,
        }
    }

    /// Bytes prefetched so far.
    pub fn prefetched_bytes(&self) -> u64 {
        self.prefetched_bytes
    }

    fn prefetch(&mut self, nic: &dyn Nic, key: u32, addr: u64, len: usize, dir: Direction) {
        if len == 0 {
            return;
        }
        let advice = match dir {
            Direction::Sink => Advice::PrefetchWrite,
            Direction::Source => Advice::Prefetch,
        };
        // A failed prefetch is only a missed optimisation: the access will fault instead,
        // and a fault on unmapped memory is reported by the transfer itself.
        if nic.advise(key, addr, len as u64, advice).is_ok() {
            self.prefetched_bytes += len as u64;
        }
    }
}

impl BufferMode for OdpMode {
    fn name(&self) -> &'static str {
        "odp"
    }

    fn is_zero_copy(&self) -> bool {
        true
    }

    fn exposes_on_demand(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!(
            "odp: {} regions, prefetch {}",
            match self.config.regions {
                Regions::Implicit => "implicit (one for the address space)",
                Regions::Explicit => "explicit (one per transfer)",
            },
            match self.config.prefetch {
                Prefetch::Off => "off",
                Prefetch::Rendezvous => "rendezvous",
                Prefetch::Always => "always",
            }
        )
    }

    fn start(&mut self, nic: &dyn Nic) -> Result<()> {
        nic.capabilities().require_rc_odp()?;
        if self.config.regions == Regions::Implicit {
            nic.capabilities().require_implicit_odp()?;
            self.implicit_key = Some(nic.register_implicit_odp(access())?.lkey);
        }
        Ok(())
    }

    fn begin(
        &mut self,
        nic: &dyn Nic,
        user_addr: u64,
        len: usize,
        dir: Direction,
    ) -> Result<Transfer> {
        let key = match self.implicit_key {
            Some(k) => k,
            None if len == 0 => 0,
            None => nic.register(user_addr, len as u64, access())?.lkey,
        };
        let prefetch_now = match (self.config.prefetch, dir) {
            (Prefetch::Off, _) => false,
            (Prefetch::Always, _) => true,
            // The receiver begins when the RTS matches: the moment to prefetch.
            (Prefetch::Rendezvous, Direction::Sink) => true,
            (Prefetch::Rendezvous, Direction::Source) => false,
        };
        if prefetch_now {
            self.prefetch(nic, key, user_addr, len, dir);
        }
        Ok(Transfer {
            pipeline: Pipeline {
                // One chunk, the whole buffer: `lease` bounds leases by it.
                chunk: len,
                depth: 1,
            },
            zero_copy: true,
            token: key as u64 | (self.implicit_key.is_none() as u64) << 32,
        })
    }

    /// `rendezvous`: the send buffer is prefetched when the peer is about to move it (the
    /// RGET's RTS went out, or a CTS arrived); `always` did it at `begin`.
    fn about_to_move(
        &mut self,
        nic: &dyn Nic,
        t: &Transfer,
        user_addr: u64,
        offset: usize,
        len: usize,
    ) {
        if self.config.prefetch == Prefetch::Rendezvous && len > 0 {
            let key = t.token as u32;
            self.prefetch(nic, key, user_addr + offset as u64, len, Direction::Source);
        }
    }

    /// The range of the buffer itself, under the transfer's key; a range reaching outside
    /// the buffer is refused (`Error::InvalidArgument`), since the implicit key would let the
    /// NIC reach any address.
    fn lease(
        &mut self,
        _nic: &dyn Nic,
        t: &Transfer,
        user_addr: u64,
        offset: usize,
        len: usize,
        _dir: Direction,
    ) -> Result<Option<Lease>> {
        // The implicit key covers the whole address space, so the NIC's table cannot bound
        // a lease: this does. The plan is one chunk, the whole buffer (`begin`).
        let buffer = t.pipeline.chunk;
        if offset.checked_add(len).is_none_or(|end| end > buffer) {
            return Err(SystemError::Internal(format!(
                "an odp lease of {len} bytes at offset {offset} reaches outside its {buffer}-byte buffer"
            ))
            .into());
        }
        self.counters.leases += 1;
        let key = t.token as u32;
        Ok(Some(Lease {
            addr: user_addr + offset as u64,
            len: len as u64,
            lkey: key,
            rkey: key,
            token: 0,
        }))
    }

    fn stage_out(&mut self, _lease: &Lease, _user: &UserBuf, _offset: usize) {}

    fn stage_in(&mut self, _lease: &Lease, _user: &UserBufMut, _offset: usize, _len: usize) {}

    fn release(&mut self, _nic: &dyn Nic, _lease: Lease) {}

    fn end(&mut self, nic: &dyn Nic, t: Transfer) {
        if t.token >> 32 == 1 && t.token as u32 != 0 {
            let _ = nic.deregister(t.token as u32);
        }
    }

    fn attach(&mut self, nic: &std::sync::Arc<dyn Nic>) {
        self.nic = Some(nic.clone());
    }

    /// The mode's counters; `invalidations` are the present pages the NIC cleared because
    /// memory changed under them (the NIC's counters have the faults and prefetches).
    fn counters(&self) -> ModeCounters {
        let mut c = self.counters.clone();
        if let Some(nic) = &self.nic {
            c.invalidations = nic.counters().invalidated_pages;
        }
        c
    }

    fn stop(&mut self, nic: &dyn Nic) {
        if let Some(k) = self.implicit_key.take() {
            let _ = nic.deregister(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewire_transport::boot::SingletonBootstrap;
    use pagewire_transport::nic::soft::{SoftConfig, SoftNic};

    #[test]
    fn a_lease_never_reaches_outside_its_buffer() {
        let nic =
            SoftNic::new(&SingletonBootstrap::new(), SoftConfig::from_env().unwrap()).unwrap();
        let mut mode = OdpMode::new(OdpConfig::default());
        mode.start(&nic).unwrap();
        let buf = vec![0u8; 3 * 4096];
        let addr = buf.as_ptr() as u64;
        let t = mode
            .begin(&nic, addr, buf.len(), Direction::Source)
            .unwrap();
        let whole = mode
            .lease(&nic, &t, addr, 0, buf.len(), Direction::Source)
            .unwrap()
            .unwrap();
        assert_eq!((whole.addr, whole.len), (addr, buf.len() as u64));
        // A peer's CTS with the offset at the buffer's end, or wrapping the address space.
        for (offset, len) in [
            (buf.len(), 4096),
            (usize::MAX - 4095, 4096),
            (4096, 3 * 4096),
        ] {
            assert!(
                mode.lease(&nic, &t, addr, offset, len, Direction::Source)
                    .is_err(),
                "lease of {len} bytes at {offset}"
            );
        }
        mode.end(&nic, t);
        mode.stop(&nic);
    }
}
