//! The trait's [`Capabilities`] from what `ibv_query_device_ex(3)` reports.
//!
//! - `max_mr_size`, `max_mr`, `max_qp`, `max_sge`, `max_qp_wr`: `orig_attr` (the legacy
//!   `struct ibv_device_attr`); negative `int`s (never seen, but the type allows them) read
//!   as 0.
//! - ODP: `odp_caps.general_caps & IBV_ODP_SUPPORT` gates everything;
//!   `odp_caps.per_transport_caps.rc_odp_caps` gives the RC operations
//!   (`IBV_ODP_SUPPORT_SEND/RECV/WRITE/READ`, and `ATOMIC`, which [`Capabilities`] has no
//!   field for and [`DeviceLimits::odp_rc_atomic`] carries); `IBV_ODP_SUPPORT_IMPLICIT` is
//!   implicit ODP. A provider without `query_device_ex` leaves them zero: no ODP.
//! - Atomics: `orig_attr.atomic_cap`. `IBV_ATOMIC_HCA` (atomic with respect to other atomics
//!   through this device) sets `atomics`; `IBV_ATOMIC_GLOB` (also with respect to the target
//!   CPU's own accesses) sets `atomics` and `atomics_global`; `IBV_ATOMIC_NONE` and values
//!   this build does not know set neither.
//! - An ODP registration needs the RC operations its rights allow ([`missing_odp_operations`]),
//!   as rdma-core's `tests/test_odp.py` gates each test on the bits of the operations it runs.
//! - `prefetch`: there is no capability bit for `ibv_advise_mr`; it applies to ODP regions
//!   only and the providers that implement ODP implement it (mlx5), so it is reported as
//!   "ODP supported". A device that lacks it answers `EOPNOTSUPP`, which `advise` reports.
//! - `max_inline`: not in `ibv_device_attr_ex` at all. It is what `ibv_create_qp` grants
//!   (`cap.max_inline_data` after the call, `ibv_create_qp(3)`), so the provider probes it
//!   once at start-up by creating a throwaway RC queue pair per size in [`INLINE_PROBES`],
//!   largest first. A queue pair with more scatter-gather entries may get less.
#![forbid(unsafe_code)]

use rdma_sys::{
    ibv_atomic_cap as C, ibv_device_attr_ex, ibv_odp_general_caps as G,
    ibv_odp_transport_cap_bits as T,
};

use pagewire_nic::{Access, Capabilities};

/// Inline sizes tried at start-up, largest first; the first queue pair created tells.
pub(crate) const INLINE_PROBES: [u32; 7] = [1024, 512, 256, 128, 64, 32, 0];

/// Device limits the provider needs beyond [`Capabilities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceLimits {
    /// Incoming RDMA READs and atomics a queue pair may have outstanding (`max_qp_rd_atom`).
    pub max_qp_rd_atom: u8,
    /// Outgoing RDMA READs and atomics a queue pair may have outstanding
    /// (`max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: u8,
    /// Entries per completion queue (`max_cqe`).
    pub max_cqe: u32,
    /// Physical ports (`phys_port_cnt`).
    pub ports: u8,
    /// RC supports ODP for atomics (`IBV_ODP_SUPPORT_ATOMIC` in `rc_odp_caps`, under
    /// `IBV_ODP_SUPPORT`). Not a limit: it is here because [`Capabilities`] has no field for
    /// it (it would be `odp_rc_atomic`, beside `odp_rc_read`).
    pub odp_rc_atomic: bool,
}

fn nonneg(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// `rc_odp_caps` when the device supports ODP at all (`IBV_ODP_SUPPORT`), else 0.
fn rc_odp_caps(attr: &ibv_device_attr_ex) -> u32 {
    if attr.odp_caps.general_caps & u64::from(G::IBV_ODP_SUPPORT.0) != 0 {
        attr.odp_caps.per_transport_caps.rc_odp_caps
    } else {
        0
    }
}

/// `(atomics, atomics_global)` of an `ibv_atomic_cap` value.
fn atomic_support(cap: u32) -> (bool, bool) {
    match cap {
        C::IBV_ATOMIC_HCA => (true, false),
        C::IBV_ATOMIC_GLOB => (true, true),
        // IBV_ATOMIC_NONE and values this build does not know.
        _ => (false, false),
    }
}

/// What `attr` says the device can do, with `max_inline` from the probe.
pub(crate) fn capabilities(
    attr: &ibv_device_attr_ex,
    device: &str,
    max_inline: u32,
) -> Capabilities {
    let o = &attr.orig_attr;
    let general = attr.odp_caps.general_caps;
    let odp = general & u64::from(G::IBV_ODP_SUPPORT.0) != 0;
    let rc = rc_odp_caps(attr);
    let (atomics, atomics_global) = atomic_support(o.atomic_cap);
    let has = |bit: T| rc & bit.0 != 0;
    let (send, recv, write, read) = (
        has(T::IBV_ODP_SUPPORT_SEND),
        has(T::IBV_ODP_SUPPORT_RECV),
        has(T::IBV_ODP_SUPPORT_WRITE),
        has(T::IBV_ODP_SUPPORT_READ),
    );
    Capabilities {
        provider: "verbs",
        max_mr_size: o.max_mr_size,
        max_mr: nonneg(o.max_mr),
        max_qp: nonneg(o.max_qp),
        max_sge: nonneg(o.max_sge),
        max_inline,
        max_qp_wr: nonneg(o.max_qp_wr),
        device: device.to_string(),
        odp_rc: send && recv && write && read,
        odp_rc_send: send,
        odp_rc_recv: recv,
        odp_rc_write: write,
        odp_rc_read: read,
        implicit_odp: odp && general & u64::from(G::IBV_ODP_SUPPORT_IMPLICIT.0) != 0,
        prefetch: odp,
        atomics,
        atomics_global,
    }
}

/// The RC operations that a region registered with `access` and `IBV_ACCESS_ON_DEMAND` may
/// take part in and for which the device reports no ODP support (empty: the registration
/// may go ahead).
///
/// Which operation each right allows, and so which `IBV_ODP_SUPPORT_*` bit of
/// `rc_odp_caps` it needs:
///
/// | right | operation on the region | bit |
/// |---|---|---|
/// | (any region: local read is always allowed) | source of a SEND | `SEND` |
/// | `LOCAL_WRITE` | target of a receive | `RECV` |
/// | `REMOTE_WRITE` | target of a peer's RDMA WRITE | `WRITE` |
/// | `REMOTE_READ` | source of a peer's RDMA READ | `READ` |
/// | `REMOTE_ATOMIC` | target of a peer's atomic | `ATOMIC` ([`DeviceLimits::odp_rc_atomic`]) |
///
/// rdma-core's own tests gate the same way (`tests/test_odp.py`: send/receive traffic on a
/// `LOCAL_WRITE` region requires `SEND | RECV`, the RDMA read test `READ`, the write test
/// `WRITE`; perftest's ODP check likewise refuses atomics without `ATOMIC`). Any one bit is
/// not enough: the NIC would fault on an operation it cannot resolve and fail the work
/// request.
pub(crate) fn missing_odp_operations(
    caps: &Capabilities,
    limits: &DeviceLimits,
    access: Access,
) -> Vec<&'static str> {
    let needs = [
        ("send", true, caps.odp_rc_send),
        (
            "receive",
            access.contains(Access::LOCAL_WRITE),
            caps.odp_rc_recv,
        ),
        (
            "RDMA write",
            access.contains(Access::REMOTE_WRITE),
            caps.odp_rc_write,
        ),
        (
            "RDMA read",
            access.contains(Access::REMOTE_READ),
            caps.odp_rc_read,
        ),
        (
            "atomic",
            access.contains(Access::REMOTE_ATOMIC),
            limits.odp_rc_atomic,
        ),
    ];
    needs
        .iter()
        .filter(|(_, needed, supported)| *needed && !supported)
        .map(|(op, _, _)| *op)
        .collect()
}

/// `access` as its rights' names (`LOCAL_WRITE | REMOTE_READ`), for messages.
pub(crate) fn access_names(access: Access) -> String {
    let names: Vec<&str> = [
        (Access::LOCAL_WRITE, "LOCAL_WRITE"),
        (Access::REMOTE_WRITE, "REMOTE_WRITE"),
        (Access::REMOTE_READ, "REMOTE_READ"),
        (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        (Access::ON_DEMAND, "ON_DEMAND"),
    ]
    .iter()
    .filter(|(bit, _)| access.contains(*bit))
    .map(|(_, name)| *name)
    .collect();
    if names.is_empty() {
        "local read only".into()
    } else {
        names.join(" | ")
    }
}

/// The limits of [`DeviceLimits`] from `attr`.
pub(crate) fn limits(attr: &ibv_device_attr_ex) -> DeviceLimits {
    let o = &attr.orig_attr;
    let byte = |v: i32| u8::try_from(nonneg(v)).unwrap_or(u8::MAX);
    DeviceLimits {
        max_qp_rd_atom: byte(o.max_qp_rd_atom),
        max_qp_init_rd_atom: byte(o.max_qp_init_rd_atom),
        max_cqe: nonneg(o.max_cqe),
        ports: o.phys_port_cnt,
        odp_rc_atomic: rc_odp_caps(attr) & T::IBV_ODP_SUPPORT_ATOMIC.0 != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::zeroed;

    /// A constructed `ibv_device_attr_ex` with values of the kind `ibv_devinfo -v` prints for
    /// an mlx5 device (the fields pagewire reads; the rest zero). Not captured from hardware:
    /// none was available.
    fn connectx5_like() -> ibv_device_attr_ex {
        let mut a: ibv_device_attr_ex = zeroed();
        a.orig_attr.max_mr_size = u64::MAX;
        a.orig_attr.max_mr = 16_777_216;
        a.orig_attr.max_qp = 262_144;
        a.orig_attr.max_sge = 30;
        a.orig_attr.max_qp_wr = 32_768;
        a.orig_attr.max_cqe = 4_194_303;
        a.orig_attr.max_qp_rd_atom = 16;
        a.orig_attr.max_qp_init_rd_atom = 16;
        a.orig_attr.phys_port_cnt = 1;
        a.orig_attr.atomic_cap = C::IBV_ATOMIC_HCA;
        a.odp_caps.general_caps = u64::from(G::IBV_ODP_SUPPORT.0 | G::IBV_ODP_SUPPORT_IMPLICIT.0);
        a.odp_caps.per_transport_caps.rc_odp_caps = T::IBV_ODP_SUPPORT_SEND.0
            | T::IBV_ODP_SUPPORT_RECV.0
            | T::IBV_ODP_SUPPORT_WRITE.0
            | T::IBV_ODP_SUPPORT_READ.0
            | T::IBV_ODP_SUPPORT_ATOMIC.0
            | T::IBV_ODP_SUPPORT_SRQ_RECV.0;
        a
    }

    #[test]
    fn a_full_odp_device_passes_the_odp_checks() {
        let c = capabilities(&connectx5_like(), "mlx5_0 port 1", 220);
        assert_eq!(c.provider, "verbs");
        assert_eq!(
            (c.max_mr_size, c.max_mr, c.max_qp),
            (u64::MAX, 16_777_216, 262_144)
        );
        assert_eq!((c.max_sge, c.max_qp_wr, c.max_inline), (30, 32_768, 220));
        assert!(c.odp_rc && c.implicit_odp && c.prefetch);
        assert!(c.atomics && !c.atomics_global);
        assert!(c.require_rc_odp().is_ok());
        assert!(c.require_implicit_odp().is_ok());
        let l = limits(&connectx5_like());
        assert_eq!(
            l,
            DeviceLimits {
                max_qp_rd_atom: 16,
                max_qp_init_rd_atom: 16,
                max_cqe: 4_194_303,
                ports: 1,
                odp_rc_atomic: true,
            }
        );
    }

    #[test]
    fn missing_rc_operations_are_named_with_the_device_and_the_soft_provider() {
        let mut a = connectx5_like();
        a.odp_caps.per_transport_caps.rc_odp_caps =
            T::IBV_ODP_SUPPORT_SEND.0 | T::IBV_ODP_SUPPORT_RECV.0;
        let c = capabilities(&a, "mlx5_0 port 1", 0);
        assert!(!c.odp_rc && c.odp_rc_send && !c.odp_rc_read);
        let e = c.require_rc_odp().unwrap_err().to_string();
        assert!(e.contains("mlx5_0 port 1"), "{e}");
        assert!(
            e.contains("RDMA write, RDMA read") && !e.contains("send,"),
            "{e}"
        );
        assert!(e.contains("PAGEWIRE_TRANSPORT=soft"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn without_general_odp_support_the_transport_bits_are_ignored() {
        let mut a = connectx5_like();
        a.odp_caps.general_caps = 0;
        let c = capabilities(&a, "rxe0 port 1", 0);
        assert!(!c.odp_rc && !c.odp_rc_send && !c.implicit_odp && !c.prefetch);
        assert!(!limits(&a).odp_rc_atomic);
        assert!(c.require_rc_odp().is_err());
    }

    #[test]
    fn explicit_odp_without_implicit_fails_only_the_implicit_check() {
        let mut a = connectx5_like();
        a.odp_caps.general_caps = u64::from(G::IBV_ODP_SUPPORT.0);
        let c = capabilities(&a, "mlx5_0 port 1", 0);
        assert!(c.require_rc_odp().is_ok());
        let e = c.require_implicit_odp().unwrap_err().to_string();
        assert!(e.contains("implicit"), "{e}");
    }

    #[test]
    fn a_legacy_query_reports_no_odp_and_clamps_negative_limits() {
        let mut a: ibv_device_attr_ex = zeroed();
        a.orig_attr.max_qp = -1;
        a.orig_attr.max_qp_rd_atom = 1000;
        let c = capabilities(&a, "dev", 0);
        assert_eq!(c.max_qp, 0);
        assert!(!c.odp_rc && !c.implicit_odp);
        assert!(!c.atomics && !c.atomics_global);
        assert_eq!(limits(&a).max_qp_rd_atom, u8::MAX);
        assert!(!limits(&a).odp_rc_atomic);
    }

    #[test]
    fn odp_registrations_need_the_bits_of_the_operations_their_rights_allow() {
        let full = capabilities(&connectx5_like(), "mlx5_0 port 1", 0);
        let full_limits = limits(&connectx5_like());
        let every = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        assert!(missing_odp_operations(&full, &full_limits, every).is_empty());
        assert!(missing_odp_operations(&full, &full_limits, Access::NONE).is_empty());

        // Send and receive only (rdma-core's test_odp_rc_traffic would run).
        let mut a = connectx5_like();
        a.odp_caps.per_transport_caps.rc_odp_caps =
            T::IBV_ODP_SUPPORT_SEND.0 | T::IBV_ODP_SUPPORT_RECV.0;
        let (two_sided, l) = (capabilities(&a, "dev", 0), limits(&a));
        assert!(missing_odp_operations(&two_sided, &l, Access::LOCAL_WRITE).is_empty());
        assert_eq!(
            missing_odp_operations(&two_sided, &l, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
            ["RDMA write"]
        );
        assert_eq!(
            missing_odp_operations(&two_sided, &l, Access::REMOTE_READ),
            ["RDMA read"]
        );

        // One-sided only: any RC bit used to be enough for ON_DEMAND; a receive or send
        // buffer on this device would fault with nothing to resolve it.
        a.odp_caps.per_transport_caps.rc_odp_caps =
            T::IBV_ODP_SUPPORT_WRITE.0 | T::IBV_ODP_SUPPORT_READ.0;
        let (one_sided, l) = (capabilities(&a, "dev", 0), limits(&a));
        assert_eq!(
            missing_odp_operations(&one_sided, &l, every),
            ["send", "receive", "atomic"]
        );
        assert_eq!(
            missing_odp_operations(&one_sided, &l, Access::REMOTE_READ),
            ["send"]
        );

        assert_eq!(
            access_names(Access::ON_DEMAND | Access::LOCAL_WRITE),
            "LOCAL_WRITE | ON_DEMAND"
        );

        // No general ODP support: the transport bits are ignored, everything is missing.
        a.odp_caps.general_caps = 0;
        let (none, l) = (capabilities(&a, "dev", 0), limits(&a));
        assert_eq!(
            missing_odp_operations(&none, &l, every),
            ["send", "receive", "RDMA write", "RDMA read", "atomic"]
        );
    }

    #[test]
    fn the_soft_provider_passes_the_odp_checks() {
        // The soft provider's literal sets every ODP field; keep it in step with the checks.
        let soft = Capabilities {
            provider: "soft",
            max_mr_size: 1,
            max_mr: 1,
            max_qp: 1,
            max_sge: 1,
            max_inline: 1,
            max_qp_wr: 1,
            device: "soft".into(),
            odp_rc: true,
            odp_rc_send: true,
            odp_rc_recv: true,
            odp_rc_write: true,
            odp_rc_read: true,
            implicit_odp: true,
            prefetch: true,
            atomics: true,
            atomics_global: true,
        };
        assert!(soft.require_implicit_odp().is_ok());
    }

    #[test]
    fn atomic_cap_sets_the_atomics_fields() {
        let mut a = connectx5_like();
        for (cap, want) in [
            (C::IBV_ATOMIC_NONE, (false, false)),
            (C::IBV_ATOMIC_HCA, (true, false)),
            (C::IBV_ATOMIC_GLOB, (true, true)),
            (7, (false, false)),
        ] {
            a.orig_attr.atomic_cap = cap;
            let c = capabilities(&a, "dev", 0);
            assert_eq!((c.atomics, c.atomics_global), want, "atomic_cap {cap}");
        }
    }

    #[test]
    fn odp_atomics_need_the_atomic_bit() {
        let every_but_atomic = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mut a = connectx5_like();
        a.odp_caps.per_transport_caps.rc_odp_caps &= !T::IBV_ODP_SUPPORT_ATOMIC.0;
        let (c, l) = (capabilities(&a, "mlx5_0 port 1", 0), limits(&a));
        // Every other operation is there: the RC check the odp buffer mode makes passes.
        assert!(c.require_rc_odp().is_ok() && !l.odp_rc_atomic);
        assert!(missing_odp_operations(&c, &l, every_but_atomic).is_empty());
        assert_eq!(
            missing_odp_operations(&c, &l, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC),
            ["atomic"]
        );
        // The bit alone, without general ODP support, is ignored.
        a.odp_caps.per_transport_caps.rc_odp_caps = T::IBV_ODP_SUPPORT_ATOMIC.0;
        a.odp_caps.general_caps = 0;
        assert!(!limits(&a).odp_rc_atomic);
        a.odp_caps.general_caps = u64::from(G::IBV_ODP_SUPPORT.0);
        assert!(limits(&a).odp_rc_atomic);
        assert_eq!(
            access_names(Access::REMOTE_ATOMIC | Access::LOCAL_WRITE | Access::ON_DEMAND),
            "LOCAL_WRITE | REMOTE_ATOMIC | ON_DEMAND"
        );
    }
}
