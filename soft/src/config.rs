//! The soft provider's settings: how payload bytes move, the memlock limit it enforces,
//! how ODP pages are checked and how regions are pinned (docs/configuration.md).

use pagewire_sys as sys;
use pagewire_sys::error::{Error, Result};

use crate::npf_model::SoftProfile;
use crate::odp_watch::OdpCheck;
use crate::pin::{MemlockLimit, PinMethod};
use crate::receive_fault::ReceiveFaultSettings;
use crate::tcp::WireSettings;

/// How payload bytes move between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaMode {
    /// CMA where the kernel permits it, staged otherwise (detected per peer at start-up).
    Auto,
    /// CMA, or fail at start-up.
    Cma,
    /// Always staged through the ring (the fallback, forced).
    Staged,
}

/// Settings of the soft provider.
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Payload path (`PAGEWIRE_SOFT_DMA=auto|cma|staged`).
    pub dma: DmaMode,
    /// Locked-memory limit (`PAGEWIRE_MEMLOCK_LIMIT`, else RLIMIT_MEMLOCK).
    pub memlock: MemlockLimit,
    /// How ODP present bits learn of address-space changes (`PAGEWIRE_SOFT_ODP_CHECK`).
    pub odp_check: OdpCheck,
    /// How registrations pin (`PAGEWIRE_PIN=auto|longterm|mlock`).
    pub pin: PinMethod,
    /// Which costs the NIC charges beyond the real ones
    /// (`PAGEWIRE_SOFT_PROFILE=real|npf-model`; see [`SoftProfile`]).
    pub profile: SoftProfile,
    /// Entries of the NIC's bounded translation cache, 0 for none: the NIC reads its table
    /// directly (`PAGEWIRE_SOFT_TPT_CACHE`, Azimi03; see `tpt_cache.rs`).
    pub tpt_cache: usize,
    /// What the NIC does on a receive-side network page fault (`PAGEWIRE_SOFT_RNPF`,
    /// `PAGEWIRE_SOFT_ACK_TIMEOUT`, `PAGEWIRE_SOFT_BACKUP_RING`, Lesokhin17
    /// §4-5; see [`ReceiveFaultSettings`]).
    pub receive_fault: ReceiveFaultSettings,
    /// Which wire reaches each peer, and the interface TCP listens on
    /// (`PAGEWIRE_SOFT_WIRE=auto|shm|tcp`, `PAGEWIRE_SOFT_IFACE`, see [`WireSettings`]).
    pub wire: WireSettings,
}

impl SoftConfig {
    /// Reads `PAGEWIRE_SOFT_DMA`, `PAGEWIRE_MEMLOCK_LIMIT` (bytes, with an optional
    /// K/M/G suffix, or `unlimited`), `PAGEWIRE_SOFT_ODP_CHECK` (`monitor`, `pagemap`) and
    /// `PAGEWIRE_PIN` (`auto`, `longterm`, `mlock`), `PAGEWIRE_SOFT_PROFILE` (`real`,
    /// `npf-model`), `PAGEWIRE_SOFT_TPT_CACHE` (`off`, or a number of entries), the
    /// receive-fault settings ([`ReceiveFaultSettings::from_env`]) and the wire's
    /// ([`WireSettings::from_env`]).
    pub fn from_env() -> Result<SoftConfig> {
        let dma = match std::env::var("PAGEWIRE_SOFT_DMA").as_deref() {
            Err(_) | Ok("") | Ok("auto") => DmaMode::Auto,
            Ok("cma") => DmaMode::Cma,
            Ok("staged") => DmaMode::Staged,
            Ok(other) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_SOFT_DMA",
                    other,
                    "expected auto, cma or staged",
                ))
            }
        };
        let memlock = match std::env::var("PAGEWIRE_MEMLOCK_LIMIT") {
            Ok(v) => MemlockLimit {
                bytes: parse_bytes(&v).ok_or_else(|| {
                    Error::invalid_setting(
                        "PAGEWIRE_MEMLOCK_LIMIT",
                        v,
                        "expected bytes like 65536, 64K, 8M, 1G or `unlimited`",
                    )
                })?,
                source: "PAGEWIRE_MEMLOCK_LIMIT",
            },
            Err(_) => MemlockLimit {
                bytes: sys::memlock_rlimit(),
                source: "RLIMIT_MEMLOCK",
            },
        };
        let odp_check = OdpCheck::parse(std::env::var("PAGEWIRE_SOFT_ODP_CHECK").ok().as_deref())?;
        let pin = PinMethod::parse(std::env::var("PAGEWIRE_PIN").ok().as_deref())?;
        let profile = SoftProfile::parse(std::env::var("PAGEWIRE_SOFT_PROFILE").ok().as_deref())?;
        let tpt_cache = super::tpt_cache::parse_entries(
            std::env::var("PAGEWIRE_SOFT_TPT_CACHE").ok().as_deref(),
        )?;
        let receive_fault = ReceiveFaultSettings::from_env()?;
        let wire = WireSettings::from_env()?;
        Ok(SoftConfig {
            dma,
            memlock,
            odp_check,
            pin,
            profile,
            tpt_cache,
            receive_fault,
            wire,
        })
    }
}

pub use pagewire_sys::env::parse_bytes;
