//! Settings of the verbs provider (`PAGEWIRE_DEVICE`, `PAGEWIRE_PORT`,
//! `PAGEWIRE_GID_INDEX`, `PAGEWIRE_FORK_SAFE`) and the pure part of device, port and GID
//! selection: the FFI layer gathers what libibverbs reports, these functions choose.
#![forbid(unsafe_code)]

use pagewire_sys::error::{Error, Result};

/// `enum ibv_port_state` value of an active port (`IBV_PORT_ACTIVE`).
pub(crate) const PORT_ACTIVE: u32 = rdma_sys::ibv_port_state::IBV_PORT_ACTIVE;

/// Settings of the verbs provider, from the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device to use by name, as `ibv_devices` lists it (`PAGEWIRE_DEVICE`, e.g. `mlx5_0`);
    /// default: the first device with an active port.
    pub device: Option<String>,
    /// Port number, from 1 (`PAGEWIRE_PORT`); default: the device's first active port.
    pub port: Option<u8>,
    /// GID table index (`PAGEWIRE_GID_INDEX`); default: on RoCE the first RoCE v2 GID
    /// (IPv4-mapped preferred), on InfiniBand none (LID routing) unless the port requires a
    /// GRH.
    pub gid_index: Option<u32>,
    /// Call `ibv_fork_init` before anything else (`PAGEWIRE_FORK_SAFE=1`), so that pages
    /// registered by this process are not shared copy-on-write with a forked child.
    pub fork_safe: bool,
}

impl VerbsConfig {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<VerbsConfig> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the settings through `get` (the environment in [`VerbsConfig::from_env`]);
    /// unset and empty values mean the default.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<VerbsConfig> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let port =
            match get("PAGEWIRE_PORT") {
                None => None,
                Some(v) => Some(v.trim().parse::<u8>().ok().filter(|p| *p >= 1).ok_or_else(
                    || {
                        Error::invalid_setting(
                            "PAGEWIRE_PORT",
                            v,
                            "expected a port number from 1 to 255",
                        )
                    },
                )?),
            };
        let gid_index = match get("PAGEWIRE_GID_INDEX") {
            None => None,
            Some(v) => Some(v.trim().parse::<u32>().map_err(|_| {
                Error::invalid_setting(
                    "PAGEWIRE_GID_INDEX",
                    v,
                    "expected a GID table index (0, 1, ...)",
                )
            })?),
        };
        let fork_safe = match get("PAGEWIRE_FORK_SAFE").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_FORK_SAFE",
                    other,
                    "expected 1 or 0",
                ))
            }
        };
        Ok(VerbsConfig {
            device: get("PAGEWIRE_DEVICE").map(|d| d.trim().to_string()),
            port,
            gid_index,
            fork_safe,
        })
    }
}

/// Indices into `names` of the devices to try, in order: the one `wanted` names, or all.
/// `Err` is the detail of a no-device error.
pub(crate) fn candidates(names: &[String], wanted: Option<&str>) -> Result<Vec<usize>, String> {
    if names.is_empty() {
        return Err("no RDMA device found: libibverbs lists none".into());
    }
    match wanted {
        None => Ok((0..names.len()).collect()),
        Some(w) => match names.iter().position(|n| n == w) {
            Some(i) => Ok(vec![i]),
            None => Err(format!(
                "no RDMA device named {w} (PAGEWIRE_DEVICE) found; libibverbs lists {}",
                names.join(", ")
            )),
        },
    }
}

/// One port as `ibv_query_port` reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PortProbe {
    /// Port number (from 1).
    pub num: u8,
    /// `enum ibv_port_state`.
    pub state: u32,
}

/// `ibv_port_state_str` for the states a port reports.
pub(crate) fn port_state_name(state: u32) -> &'static str {
    match state {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "unknown state",
    }
}

/// The port to use among a device's `ports`: `wanted`, which must be active, or the first
/// active one. `Err` says why the device is not usable.
pub(crate) fn pick_port(ports: &[PortProbe], wanted: Option<u8>) -> Result<u8, String> {
    let listing = || {
        ports
            .iter()
            .map(|p| format!("port {} {}", p.num, port_state_name(p.state)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match wanted {
        Some(w) => match ports.iter().find(|p| p.num == w) {
            Some(p) if p.state == PORT_ACTIVE => Ok(w),
            Some(p) => Err(format!(
                "port {w} (PAGEWIRE_PORT) is {}",
                port_state_name(p.state)
            )),
            None => Err(format!(
                "has no port {w} (PAGEWIRE_PORT); it has {}",
                if ports.is_empty() {
                    "no ports".to_string()
                } else {
                    listing()
                }
            )),
        },
        None => ports
            .iter()
            .find(|p| p.state == PORT_ACTIVE)
            .map(|p| p.num)
            .ok_or_else(|| {
                if ports.is_empty() {
                    "has no ports".to_string()
                } else {
                    format!("has no active port ({})", listing())
                }
            }),
    }
}

/// The link layer of a port (`ibv_port_attr::link_layer`, `IBV_LINK_LAYER_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand (also what `IBV_LINK_LAYER_UNSPECIFIED` means, as in `ibv_devinfo`).
    Infiniband,
    /// Ethernet: RoCE, addressed by GID only.
    Ethernet,
}

impl LinkLayer {
    /// From `IBV_LINK_LAYER_*` (0 unspecified, 1 InfiniBand, 2 Ethernet).
    pub(crate) fn from_raw(v: u8) -> Option<LinkLayer> {
        match v {
            0 | 1 => Some(LinkLayer::Infiniband),
            2 => Some(LinkLayer::Ethernet),
            _ => None,
        }
    }

    /// The `IBV_LINK_LAYER_*` value.
    pub(crate) fn raw(self) -> u8 {
        match self {
            LinkLayer::Infiniband => 1,
            LinkLayer::Ethernet => 2,
        }
    }
}

/// `enum ibv_gid_type` of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GidKind {
    /// `IBV_GID_TYPE_IB`.
    Ib,
    /// `IBV_GID_TYPE_ROCE_V1` (RoCE over Ethernet frames; not routable).
    RoceV1,
    /// `IBV_GID_TYPE_ROCE_V2` (RoCE over UDP/IP; routable).
    RoceV2,
    /// A value this build does not know.
    Other(u32),
}

impl GidKind {
    pub(crate) fn from_raw(v: u32) -> GidKind {
        match v {
            rdma_sys::IBV_GID_TYPE_IB => GidKind::Ib,
            rdma_sys::IBV_GID_TYPE_ROCE_V1 => GidKind::RoceV1,
            rdma_sys::IBV_GID_TYPE_ROCE_V2 => GidKind::RoceV2,
            other => GidKind::Other(other),
        }
    }
}

/// One valid GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GidProbe {
    pub index: u32,
    pub kind: GidKind,
    pub gid: [u8; 16],
}

/// An IPv4-mapped GID (`::ffff:a.b.c.d`), what RoCE v2 uses for an IPv4 address.
pub(crate) fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Whether the GID table must be read at all.
pub(crate) fn needs_gid(link: LinkLayer, grh_required: bool, forced: Option<u32>) -> bool {
    forced.is_some() || grh_required || link == LinkLayer::Ethernet
}

/// The GID index to put in the address vector (`None`: LID routing, no GRH).
///
/// - `forced` (`PAGEWIRE_GID_INDEX`) must name a valid entry.
/// - Ethernet (RoCE): the first RoCE v2 entry with an IPv4-mapped GID, else the first RoCE
///   v2 entry, else the first RoCE v1 entry.
/// - InfiniBand: none, unless the port sets `IBV_QPF_GRH_REQUIRED`; then the first entry.
pub(crate) fn pick_gid(
    link: LinkLayer,
    grh_required: bool,
    forced: Option<u32>,
    table: &[GidProbe],
) -> Result<Option<u32>, String> {
    if let Some(i) = forced {
        return match table.iter().find(|g| g.index == i) {
            Some(_) => Ok(Some(i)),
            None => Err(format!(
                "GID index {i} (PAGEWIRE_GID_INDEX) is empty or beyond the port's GID table"
            )),
        };
    }
    match link {
        LinkLayer::Ethernet => table
            .iter()
            .find(|g| g.kind == GidKind::RoceV2 && is_ipv4_mapped(&g.gid))
            .or_else(|| table.iter().find(|g| g.kind == GidKind::RoceV2))
            .or_else(|| table.iter().find(|g| g.kind == GidKind::RoceV1))
            .map(|g| Some(g.index))
            .ok_or_else(|| {
                "is a RoCE port without a RoCE GID: give its network interface an IP address, \
                 or set PAGEWIRE_GID_INDEX"
                    .to_string()
            }),
        LinkLayer::Infiniband if grh_required => table
            .first()
            .map(|g| Some(g.index))
            .ok_or_else(|| "requires a GRH but its GID table is empty".to_string()),
        LinkLayer::Infiniband => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn config_defaults_when_unset_or_empty() {
        assert_eq!(
            VerbsConfig::from_lookup(lookup(&[])).unwrap(),
            VerbsConfig::default()
        );
        assert_eq!(
            VerbsConfig::from_lookup(lookup(&[("PAGEWIRE_PORT", ""), ("PAGEWIRE_DEVICE", " ")]))
                .unwrap(),
            VerbsConfig::default()
        );
    }

    #[test]
    fn config_reads_every_variable() {
        let c = VerbsConfig::from_lookup(lookup(&[
            ("PAGEWIRE_DEVICE", "mlx5_1"),
            ("PAGEWIRE_PORT", "2"),
            ("PAGEWIRE_GID_INDEX", "3"),
            ("PAGEWIRE_FORK_SAFE", "1"),
        ]))
        .unwrap();
        assert_eq!(
            c,
            VerbsConfig {
                device: Some("mlx5_1".into()),
                port: Some(2),
                gid_index: Some(3),
                fork_safe: true,
            }
        );
    }

    #[test]
    fn config_rejects_bad_values_naming_the_variable() {
        for (k, v) in [
            ("PAGEWIRE_PORT", "0"),
            ("PAGEWIRE_PORT", "256"),
            ("PAGEWIRE_PORT", "one"),
            ("PAGEWIRE_GID_INDEX", "-1"),
            ("PAGEWIRE_FORK_SAFE", "yes"),
        ] {
            let e = VerbsConfig::from_lookup(lookup(&[(k, v)])).unwrap_err();
            assert!(e.to_string().contains(k), "{e}");
        }
    }

    #[test]
    fn candidates_follow_pagewire_device() {
        let names = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
        assert_eq!(candidates(&names, None).unwrap(), vec![0, 1]);
        assert_eq!(candidates(&names, Some("mlx5_1")).unwrap(), vec![1]);
        let e = candidates(&names, Some("rxe0")).unwrap_err();
        assert!(e.contains("rxe0") && e.contains("mlx5_0, mlx5_1"), "{e}");
        assert!(candidates(&[], None)
            .unwrap_err()
            .contains("no RDMA device found"));
    }

    #[test]
    fn ports_default_to_the_first_active_one() {
        let ports = [
            PortProbe { num: 1, state: 1 },
            PortProbe {
                num: 2,
                state: PORT_ACTIVE,
            },
        ];
        assert_eq!(pick_port(&ports, None), Ok(2));
        assert_eq!(pick_port(&ports, Some(2)), Ok(2));
        assert!(pick_port(&ports, Some(1)).unwrap_err().contains("DOWN"));
        assert!(pick_port(&ports, Some(3))
            .unwrap_err()
            .contains("no port 3"));
        let down = [PortProbe { num: 1, state: 1 }];
        let e = pick_port(&down, None).unwrap_err();
        assert!(
            e.contains("no active port") && e.contains("port 1 DOWN"),
            "{e}"
        );
    }

    fn gid(index: u32, kind: GidKind, last: u8, v4: bool) -> GidProbe {
        let mut g = [0u8; 16];
        if v4 {
            g[10] = 0xff;
            g[11] = 0xff;
        } else {
            g[0] = 0xfe;
            g[1] = 0x80;
        }
        g[15] = last;
        GidProbe {
            index,
            kind,
            gid: g,
        }
    }

    #[test]
    fn roce_prefers_v2_with_an_ipv4_address() {
        let table = [
            gid(0, GidKind::RoceV1, 1, false),
            gid(1, GidKind::RoceV2, 1, false),
            gid(2, GidKind::RoceV1, 2, true),
            gid(3, GidKind::RoceV2, 2, true),
        ];
        assert_eq!(
            pick_gid(LinkLayer::Ethernet, false, None, &table),
            Ok(Some(3))
        );
        assert_eq!(
            pick_gid(LinkLayer::Ethernet, false, None, &table[..3]),
            Ok(Some(1))
        );
        assert_eq!(
            pick_gid(LinkLayer::Ethernet, false, None, &table[..1]),
            Ok(Some(0))
        );
        assert!(pick_gid(LinkLayer::Ethernet, false, None, &[]).is_err());
    }

    #[test]
    fn infiniband_uses_lids_unless_a_grh_is_required_or_forced() {
        let table = [gid(0, GidKind::Ib, 1, false)];
        assert!(!needs_gid(LinkLayer::Infiniband, false, None));
        assert!(needs_gid(LinkLayer::Infiniband, true, None));
        assert!(needs_gid(LinkLayer::Ethernet, false, None));
        assert_eq!(
            pick_gid(LinkLayer::Infiniband, false, None, &table),
            Ok(None)
        );
        assert_eq!(
            pick_gid(LinkLayer::Infiniband, true, None, &table),
            Ok(Some(0))
        );
        assert_eq!(
            pick_gid(LinkLayer::Infiniband, false, Some(0), &table),
            Ok(Some(0))
        );
        assert!(pick_gid(LinkLayer::Infiniband, false, Some(5), &table).is_err());
    }

    #[test]
    fn link_layers_and_gid_kinds_map_from_raw_values() {
        assert_eq!(LinkLayer::from_raw(0), Some(LinkLayer::Infiniband));
        assert_eq!(LinkLayer::from_raw(2), Some(LinkLayer::Ethernet));
        assert_eq!(LinkLayer::from_raw(9), None);
        assert_eq!(LinkLayer::Ethernet.raw(), 2);
        assert_eq!(GidKind::from_raw(2), GidKind::RoceV2);
        assert_eq!(GidKind::from_raw(0), GidKind::Ib);
        assert_eq!(GidKind::from_raw(7), GidKind::Other(7));
    }
}
