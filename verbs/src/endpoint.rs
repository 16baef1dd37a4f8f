//! The opaque [`Endpoint`] bytes of a verbs queue pair: what the peer needs to bring its
//! own queue pair to RTR (`ibv_modify_qp(3)`: `dest_qp_num`, `rq_psn`, the address vector's
//! DLID or GID, the path MTU), plus the owner's rank so a mix-up is caught, and whether the
//! owner's device may answer with page-fault RNR NAKs (so the peer retries forever).
//!
//! Layout (34 bytes, little-endian integers):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | format version (2; 1 had no bit 1 in the flags) |
//! | 1 | link layer (`IBV_LINK_LAYER_*`: 1 InfiniBand, 2 Ethernet) |
//! | 2 | active MTU of the port (`enum ibv_mtu`, 1..=5) |
//! | 3 | flags: bit 0 = a GID follows (the peer must use a GRH); bit 1 = the owner's device pages ODP regions on demand as a responder (RC ODP receive, write or read) |
//! | 4..8 | rank |
//! | 8..12 | queue pair number (24 bits used) |
//! | 12..16 | initial packet sequence number (24 bits) |
//! | 16..18 | LID (InfiniBand; 0 on RoCE) |
//! | 18..34 | GID (zero when flag bit 0 is clear) |
#![forbid(unsafe_code)]

use pagewire_nic::Endpoint;
use pagewire_sys::error::{Error, Result};

use super::config::LinkLayer;

const VERSION: u8 = 2;
const LEN: usize = 34;
const FLAG_GID: u8 = 1;
const FLAG_RESPONDER_MAY_FAULT: u8 = 2;

/// The connection data of one queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpAddress {
    pub rank: u32,
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: Option<[u8; 16]>,
    pub mtu: u32,
    pub link: LinkLayer,
    /// The owner's device may page-fault as a responder (RC ODP for receive, write or read),
    /// answering with RNR NAKs while it resolves the fault.
    pub responder_may_fault: bool,
}

impl QpAddress {
    /// The endpoint bytes.
    pub(crate) fn encode(&self) -> Endpoint {
        let mut v = Vec::with_capacity(LEN);
        v.push(VERSION);
        v.push(self.link.raw());
        v.push(self.mtu as u8);
        let mut flags = 0;
        if self.gid.is_some() {
            flags |= FLAG_GID;
        }
        if self.responder_may_fault {
            flags |= FLAG_RESPONDER_MAY_FAULT;
        }
        v.push(flags);
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.qpn.to_le_bytes());
        v.extend_from_slice(&self.psn.to_le_bytes());
        v.extend_from_slice(&self.lid.to_le_bytes());
        v.extend_from_slice(&self.gid.unwrap_or([0; 16]));
        Endpoint(v)
    }

    /// Parses endpoint bytes, rejecting anything a verbs provider of this format did not
    /// write (another provider's endpoint, a truncated blob, out-of-range fields).
    pub(crate) fn decode(e: &Endpoint) -> Result<QpAddress> {
        let b = &e.0;
        let bad = |why: &str| {
            Error::InvalidArgument(format!(
                "malformed verbs endpoint ({} bytes): {why}",
                b.len()
            ))
        };
        if b.len() != LEN {
            return Err(bad(&format!(
                "expected {LEN} bytes (was it made by another provider?)"
            )));
        }
        if b[0] != VERSION {
            return Err(bad(&format!("format version {} is not {VERSION}", b[0])));
        }
        let link = LinkLayer::from_raw(b[1]).ok_or_else(|| bad("unknown link layer"))?;
        let mtu = u32::from(b[2]);
        if !(1..=5).contains(&mtu) {
            return Err(bad("MTU code outside 1..=5"));
        }
        if b[3] & !(FLAG_GID | FLAG_RESPONDER_MAY_FAULT) != 0 {
            return Err(bad("unknown flags"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let (rank, qpn, psn) = (u32_at(4), u32_at(8), u32_at(12));
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad("queue pair number or PSN wider than 24 bits"));
        }
        let lid = u16::from_le_bytes([b[16], b[17]]);
        let gid = (b[3] & FLAG_GID != 0).then(|| b[18..34].try_into().expect("16 bytes"));
        Ok(QpAddress {
            rank,
            qpn,
            psn,
            lid,
            gid,
            mtu,
            link,
            responder_may_fault: b[3] & FLAG_RESPONDER_MAY_FAULT != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gid: Option<[u8; 16]>, link: LinkLayer) -> QpAddress {
        QpAddress {
            rank: 3,
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 0x0102,
            gid,
            mtu: 5,
            link,
            responder_may_fault: false,
        }
    }

    #[test]
    fn endpoints_round_trip() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 0, 7]);
        for a in [
            sample(None, LinkLayer::Infiniband),
            sample(Some(g), LinkLayer::Ethernet),
            QpAddress {
                responder_may_fault: true,
                ..sample(Some(g), LinkLayer::Ethernet)
            },
        ] {
            let e = a.encode();
            assert_eq!(e.0.len(), LEN);
            assert_eq!(QpAddress::decode(&e).unwrap(), a);
        }
    }

    #[test]
    fn the_layout_is_fixed() {
        let e = sample(None, LinkLayer::Infiniband).encode().0;
        assert_eq!(&e[..4], &[2, 1, 5, 0]);
        assert_eq!(&e[4..8], &3u32.to_le_bytes());
        assert_eq!(&e[8..12], &0x12_3456u32.to_le_bytes());
        assert_eq!(&e[12..16], &0xab_cdefu32.to_le_bytes());
        assert_eq!(&e[16..18], &[2, 1]);
        assert!(e[18..].iter().all(|b| *b == 0));
        let odp = QpAddress {
            responder_may_fault: true,
            ..sample(None, LinkLayer::Infiniband)
        }
        .encode()
        .0;
        assert_eq!(odp[3], 2, "flag bit 1");
    }

    #[test]
    fn foreign_or_damaged_endpoints_are_rejected() {
        // The soft provider's endpoint: rank and qpn, 8 bytes.
        assert!(QpAddress::decode(&Endpoint(vec![0; 8])).is_err());
        let good = sample(None, LinkLayer::Infiniband).encode().0;
        // Version 1 (before the fault flag), unknown flags, bad fields.
        for (i, v) in [
            (0, 1u8),
            (0, 9),
            (1, 7),
            (2, 0),
            (2, 6),
            (3, 4),
            (11, 1),
            (15, 1),
        ] {
            let mut b = good.clone();
            b[i] = v;
            assert!(QpAddress::decode(&Endpoint(b)).is_err(), "byte {i} = {v}");
        }
    }
}
