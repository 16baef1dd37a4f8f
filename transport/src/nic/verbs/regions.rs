//! Memory registration on the device: pinned or on-demand regions, and the errors a
//! failed `ibv_reg_mr` is turned into (memlock limit, unmapped range, missing ODP).
#![forbid(unsafe_code)]

use super::*;

impl VerbsNic {
    pub(super) fn register_raw(
        &self,
        addr: u64,
        len: u64,
        access: Access,
        implicit: bool,
    ) -> Result<RegionInfo> {
        let odp = access.contains(Access::ON_DEMAND);
        let what = if implicit {
            "implicit ODP registration".to_string()
        } else {
            format!("ibv_reg_mr(addr={addr:#x}, len={len}, access={access:?})")
        };
        let pd_len = if implicit {
            usize::MAX
        } else {
            usize::try_from(len).map_err(|_| Error::InvalidArgument(format!("{what}: too long")))?
        };
        let t0 = crate::sys::monotonic_ns();
        let mut mr = match self.pd.reg_mr(addr, pd_len, wr::access_bits(access)) {
            Ok(mr) => mr,
            Err(e) => return Err(self.registration_error(what, addr, len, odp, e)),
        };
        let pinned = if odp {
            0
        } else {
            crate::sys::page_span(addr, len).1
        };
        let info = RegionInfo {
            addr,
            len,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            access,
        };
        let mut regions = self.regions.lock();
        if regions.contains_key(&info.lkey) {
            // Cannot happen (the kernel hands out unique keys); refuse rather than lose a handle.
            let _ = mr.dereg();
            return Err(Error::InvalidArgument(format!(
                "the device returned key {:#010x}, which is already registered",
                info.lkey
            )));
        }
        regions.insert(info.lkey, Region { mr, info, pinned });
        self.counters
            .record_registration(true, crate::sys::monotonic_ns().saturating_sub(t0));
        self.counters.add_pinned(pinned);
        Ok(info)
    }

    pub(super) fn registration_error(
        &self,
        call: String,
        addr: u64,
        len: u64,
        odp: bool,
        e: io::Error,
    ) -> Error {
        match e.raw_os_error() {
            Some(libc::EFAULT) => Error::UnmappedRange { addr, len },
            Some(libc::ENOMEM) if !odp => {
                let requested = crate::sys::page_span(addr, len).1;
                let pinned = self.counters.pinned_now.load(Relaxed);
                match crate::sys::memlock_rlimit() {
                    Some(limit) if pinned.saturating_add(requested) > limit => {
                        Error::MemlockLimit {
                            requested,
                            pinned,
                            limit,
                            source_of_limit: "RLIMIT_MEMLOCK",
                        }
                    }
                    _ => os(call, e),
                }
            }
            Some(libc::EOPNOTSUPP) if odp => Error::Unsupported {
                device: self.caps.device.clone(),
                what: format!("this on-demand-paging registration ({call}: {e})"),
                hint:
                    "check the device's ODP capabilities (ibv_devinfo -v), or use a pinned region",
            },
            _ => os(call, e),
        }
    }

    /// `Ok` when the device pages on demand for every RC operation a region with `access`
    /// may take part in ([`caps::missing_odp_operations`]).
    pub(super) fn require_odp_for(&self, access: Access) -> Result<()> {
        let missing = caps::missing_odp_operations(&self.caps, access);
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::Unsupported {
            device: self.caps.device.clone(),
            what: format!(
                "on-demand paging on RC queue pairs for {}, which an ODP region with {} may be \
                 used for",
                missing.join(", "),
                caps::access_names(access)
            ),
            hint: "register without ON_DEMAND (or with fewer rights), or use the soft provider \
                   (PAGEWIRE_TRANSPORT=soft)",
        })
    }
}
