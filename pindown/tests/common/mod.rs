//! What the pindown crate's integration tests share: a soft NIC in one rank.

use pagewire_transport::boot::SingletonBootstrap;
use pagewire_transport::nic::soft::{
    DmaMode, MemlockLimit, OdpCheck, PinMethod, SoftConfig, SoftNic, SoftProfile,
};

/// A one-rank soft NIC that enforces a locked-memory limit of `memlock` bytes and pins with
/// `pin`.
pub fn soft_nic(memlock: u64, pin: PinMethod) -> SoftNic {
    SoftNic::new(
        &SingletonBootstrap::new(),
        SoftConfig {
            dma: DmaMode::Auto,
            memlock: MemlockLimit {
                bytes: Some(memlock),
                source: "test",
            },
            odp_check: OdpCheck::Monitor,
            pin,
            profile: SoftProfile::Real,
            tpt_cache: 0,
            receive_fault: Default::default(),
            wire: Default::default(),
        },
    )
    .expect("soft NIC")
}
