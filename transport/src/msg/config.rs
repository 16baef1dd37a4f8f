//! The message layer's settings: protocol choice, limits and how a wait waits, with their
//! defaults and environment variables (docs/configuration.md).

use crate::error::{Error, Result};
use crate::local::LocalSetting;

/// Default eager limit in bytes. Chosen by measurement (docs/results.md, "Choosing the defaults"):
/// at 16 KiB an eager message (two copies through slots) beats a rendezvous in copy mode;
/// 32 KiB was faster still for 32 KiB messages but doubles the pinned slots per peer.
pub const DEFAULT_EAGER_LIMIT: usize = 16 << 10;

/// Default of [`MsgConfig::local_eager_limit`] (at most the eager limit). Measured
/// (docs/results.md, "The local path next to MPICH"): a message of 16 KiB between two cores
/// moves faster by one kernel copy (CMA) than by two copies through a cell, whose lines
/// each cross between the cores twice; at 8 KiB and below the cell is faster.
pub const DEFAULT_LOCAL_EAGER_LIMIT: usize = 8 << 10;

/// Default of [`MsgConfig::split_min`]: measured (docs/results.md, "Choosing the defaults").
pub const DEFAULT_SPLIT_MIN: usize = 64 << 10;

/// Default of [`MsgConfig::sg_min_run`]: measured (docs/results.md, "Choosing the defaults").
/// On the soft NIC every run costs a kernel copy of its own (about 2 µs beyond its bytes)
/// and a scatter-gather rendezvous is not split, so packing wins below runs of this size.
pub const DEFAULT_SG_MIN_RUN: usize = 256 << 10;

/// Default of [`MsgConfig::sg_min_bytes`]: measured (docs/results.md, "Choosing the defaults"); below
/// it packing stays in the CPU caches and wins.
pub const DEFAULT_SG_MIN_BYTES: usize = 4 << 20;

/// Which rendezvous protocol large messages use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RndvProtocol {
    /// The receiver RDMA-READs from the sender (RGET).
    Get,
    /// The receiver returns CTS and the sender RDMA-WRITEs (RPUT).
    Put,
    /// RGET for zero-copy modes, RPUT for copying ones (measured faster there).
    Auto,
}

/// Settings of the message layer.
#[derive(Clone, Debug)]
pub struct MsgConfig {
    /// Largest message sent eagerly (`PAGEWIRE_EAGER_LIMIT`).
    pub eager_limit: usize,
    /// Largest message to a rank of this host copied through the local path's cells
    /// (`PAGEWIRE_LOCAL_EAGER_LIMIT`; by default [`DEFAULT_LOCAL_EAGER_LIMIT`], or the eager
    /// limit if that is lower); larger ones go by the local rendezvous, one kernel copy.
    pub local_eager_limit: usize,
    /// Rendezvous protocol (`PAGEWIRE_RNDV=get|put|auto`).
    pub rndv: RndvProtocol,
    /// Zero-copy messages of at least this many bytes are moved by both sides at once
    /// (`auto` only; `msg/rndv_split.rs`); `PAGEWIRE_RNDV_SPLIT_MIN`, `off` = never.
    pub split_min: usize,
    /// Data messages in flight per peer before the sender waits (`PAGEWIRE_EAGER_CREDITS`).
    pub credits: u32,
    /// Extra receive slots per peer for control messages.
    pub control_slots: u32,
    /// Eager send slots (shared by all peers).
    pub send_slots: u32,
    /// Bytes of unexpected eager data kept per peer before its slots are held
    /// (`PAGEWIRE_UNEXPECTED_BUDGET`).
    pub unexpected_budget: usize,
    /// What a rank does while it waits with nothing to do (`PAGEWIRE_WAIT=auto|spin|yield`).
    pub wait: WaitPolicy,
    /// In zero-copy modes, a buffer with gaps moves in place (scatter-gather rendezvous)
    /// when its runs average at least this many bytes, and is packed otherwise
    /// (`PAGEWIRE_SG_MIN_RUN`, `off` = always pack; see [`super::PointToPoint::moves_in_place`]).
    pub sg_min_run: usize,
    /// ... and when it holds at least this many bytes (`PAGEWIRE_SG_MIN_BYTES`).
    pub sg_min_bytes: usize,
    /// How ranks of one host reach each other (`PAGEWIRE_LOCAL=shm|nic`): the local path
    /// (`crate::local`) or the NIC.
    pub local: LocalSetting,
}

/// What a blocked rank does between polls that found nothing (`PAGEWIRE_WAIT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaitPolicy {
    /// `yield` when the soft NIC's ranks outnumber this host's online CPUs, else `spin`.
    #[default]
    Auto,
    /// Poll without pause: the lowest latency when every rank has a CPU of its own.
    Spin,
    /// `sched_yield` after each empty poll from the 65th in a row, so that with more ranks
    /// than CPUs the rank a waiter waits for gets the CPU (as MPICH does when
    /// oversubscribed); a wait with every rank on the local path sleeps after 512.
    Yield,
}

impl Default for MsgConfig {
    fn default() -> Self {
        MsgConfig {
            eager_limit: DEFAULT_EAGER_LIMIT,
            local_eager_limit: DEFAULT_LOCAL_EAGER_LIMIT,
            rndv: RndvProtocol::Auto,
            split_min: DEFAULT_SPLIT_MIN,
            credits: 16,
            control_slots: 8,
            send_slots: 32,
            unexpected_budget: 4 << 20,
            wait: WaitPolicy::Auto,
            sg_min_run: DEFAULT_SG_MIN_RUN,
            sg_min_bytes: DEFAULT_SG_MIN_BYTES,
            local: LocalSetting::Shm,
        }
    }
}

impl MsgConfig {
    /// Defaults overridden by `PAGEWIRE_EAGER_LIMIT`, `PAGEWIRE_LOCAL_EAGER_LIMIT`,
    /// `PAGEWIRE_RNDV`,
    /// `PAGEWIRE_RNDV_SPLIT_MIN`, `PAGEWIRE_SG_MIN_RUN`, `PAGEWIRE_SG_MIN_BYTES`, `PAGEWIRE_WAIT`,
    /// `PAGEWIRE_EAGER_CREDITS`, `PAGEWIRE_UNEXPECTED_BUDGET` and `PAGEWIRE_LOCAL`.
    pub fn from_env() -> Result<MsgConfig> {
        use crate::env::bytes as env_usize;
        let mut c = MsgConfig::default();
        if let Some(v) = env_usize("PAGEWIRE_EAGER_LIMIT")? {
            c.eager_limit = v;
        }
        // A lowered eager limit lowers the local one too: tests that lower it to reach the
        // rendezvous reach the local rendezvous as well.
        c.local_eager_limit = env_usize("PAGEWIRE_LOCAL_EAGER_LIMIT")?
            .unwrap_or(DEFAULT_LOCAL_EAGER_LIMIT.min(c.eager_limit));
        if let Some(v) = env_usize("PAGEWIRE_EAGER_CREDITS")? {
            c.credits = v as u32;
        }
        if let Some(v) = env_usize("PAGEWIRE_UNEXPECTED_BUDGET")? {
            c.unexpected_budget = v;
        }
        match std::env::var("PAGEWIRE_RNDV_SPLIT_MIN").as_deref() {
            Ok("off") => c.split_min = usize::MAX,
            Ok(_) => {
                if let Some(v) = env_usize("PAGEWIRE_RNDV_SPLIT_MIN")? {
                    c.split_min = v.max(8192);
                }
            }
            Err(_) => {}
        }
        match std::env::var("PAGEWIRE_SG_MIN_RUN").as_deref() {
            Ok("off") => c.sg_min_run = usize::MAX,
            Ok(_) => {
                if let Some(v) = env_usize("PAGEWIRE_SG_MIN_RUN")? {
                    c.sg_min_run = v;
                }
            }
            Err(_) => {}
        }
        if let Some(v) = env_usize("PAGEWIRE_SG_MIN_BYTES")? {
            c.sg_min_bytes = v;
        }
        c.local = LocalSetting::from_env()?;
        c.wait = match std::env::var("PAGEWIRE_WAIT").as_deref() {
            Err(_) | Ok("") | Ok("auto") => WaitPolicy::Auto,
            Ok("spin") => WaitPolicy::Spin,
            Ok("yield") => WaitPolicy::Yield,
            Ok(other) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_WAIT",
                    other,
                    "expected auto, spin or yield",
                ))
            }
        };
        c.rndv = match std::env::var("PAGEWIRE_RNDV").as_deref() {
            Err(_) | Ok("") | Ok("auto") => RndvProtocol::Auto,
            Ok("get") => RndvProtocol::Get,
            Ok("put") => RndvProtocol::Put,
            Ok(other) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_RNDV",
                    other,
                    "expected get, put or auto",
                ))
            }
        };
        if c.credits < 2 || c.credits > 4096 {
            return Err(Error::invalid_setting(
                "PAGEWIRE_EAGER_CREDITS",
                c.credits,
                "expected 2..=4096",
            ));
        }
        if c.eager_limit > 1 << 20 {
            return Err(Error::invalid_setting(
                "PAGEWIRE_EAGER_LIMIT",
                c.eager_limit,
                "at most 1 MiB (larger messages go by rendezvous)",
            ));
        }
        if c.local_eager_limit > 1 << 20 {
            return Err(Error::invalid_setting(
                "PAGEWIRE_LOCAL_EAGER_LIMIT",
                c.local_eager_limit,
                "at most 1 MiB (larger messages go by the local rendezvous)",
            ));
        }
        Ok(c)
    }
}

/// This host's online CPUs (all of them, whatever this process's affinity).
pub(super) fn online_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| crate::boot::binding::parse_cpulist(s.trim()))
        .map(|cpus| cpus.len())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}
