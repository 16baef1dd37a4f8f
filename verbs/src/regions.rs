//! Memory registration on the device: the checks of `register` and `register_implicit_odp`,
//! pinned or on-demand regions, the errors a failed `ibv_reg_mr` is turned into (memlock
//! limit, unmapped range, missing ODP), deregistration, and the `IBV_ACCESS_*` bits of the
//! trait's [`Access`].
#![forbid(unsafe_code)]

use rdma_sys::ibv_access_flags as A;

use super::*;

impl VerbsNic {
    /// [`Nic::register`] for this provider.
    pub(super) fn register_region(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<RegionInfo> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a zero-length region".into(),
            ));
        }
        if addr.checked_add(len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "region {addr:#x}+{len} wraps around the address space"
            )));
        }
        check_local_write(access)?;
        if access.contains(Access::ON_DEMAND) {
            self.require_odp_for(access)?;
        }
        self.register_raw(addr, len, access, false)
    }

    /// [`Nic::register_implicit_odp`] for this provider.
    pub(super) fn register_implicit(&self, access: Access) -> Result<RegionInfo> {
        let access = access | Access::ON_DEMAND;
        self.require_odp_for(access)?;
        if !self.caps.implicit_odp {
            return Err(Error::Unsupported {
                device: self.caps.device.clone(),
                what: "implicit on-demand paging (one region for the whole address space)".into(),
                hint: "use explicit ODP regions, the copy or pindown buffer mode, or the soft \
                       provider (PAGEWIRE_TRANSPORT=soft)",
            });
        }
        check_local_write(access)?;
        // ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | ...): the region's length
        // is SIZE_MAX, so RegionInfo says u64::MAX.
        self.register_raw(0, u64::MAX, access, true)
    }

    /// [`Nic::deregister`] for this provider.
    pub(super) fn deregister_region(&self, lkey: u32) -> Result<()> {
        let t0 = pagewire_sys::monotonic_ns();
        let mut regions = self.regions.lock();
        let mut r = regions
            .remove(&lkey)
            .ok_or(Error::UnknownKey { key: lkey })?;
        if let Err(e) = r.mr.dereg() {
            let call = format!("ibv_dereg_mr(lkey={lkey:#010x})");
            regions.insert(lkey, r);
            return Err(os(call, e));
        }
        self.counters.sub_pinned(r.pinned);
        self.counters
            .record_registration(false, pagewire_sys::monotonic_ns().saturating_sub(t0));
        Ok(())
    }

    fn register_raw(
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
        let t0 = pagewire_sys::monotonic_ns();
        let mut mr = match self.pd.reg_mr(addr, pd_len, access_bits(access)) {
            Ok(mr) => mr,
            Err(e) => return Err(self.registration_error(what, addr, len, odp, e)),
        };
        let pinned = if odp {
            0
        } else {
            pagewire_sys::page_span(addr, len).1
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
            return Err(Error::Internal(format!(
                "the device returned key {:#010x}, which is already registered",
                info.lkey
            )));
        }
        regions.insert(info.lkey, Region { mr, info, pinned });
        self.counters
            .record_registration(true, pagewire_sys::monotonic_ns().saturating_sub(t0));
        self.counters.add_pinned(pinned);
        Ok(info)
    }

    fn registration_error(
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
                let requested = pagewire_sys::page_span(addr, len).1;
                let pinned = self.counters.pinned_now.load(Relaxed);
                match pagewire_sys::memlock_rlimit() {
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
    fn require_odp_for(&self, access: Access) -> Result<()> {
        let missing = caps::missing_odp_operations(&self.caps, &self.limits, access);
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

/// `Err` when `access` grants a remote right that lets peers write the region without
/// `LOCAL_WRITE`, which `ibv_reg_mr(3)` refuses: "If IBV_ACCESS_REMOTE_WRITE or
/// IBV_ACCESS_REMOTE_ATOMIC is set, then IBV_ACCESS_LOCAL_WRITE must be set too."
fn check_local_write(access: Access) -> Result<()> {
    if access.contains(Access::LOCAL_WRITE) {
        return Ok(());
    }
    for (right, name) in [
        (Access::REMOTE_WRITE, "REMOTE_WRITE"),
        (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
    ] {
        if access.contains(right) {
            return Err(Error::InvalidArgument(format!(
                "{name} requires LOCAL_WRITE (ibv_reg_mr(3))"
            )));
        }
    }
    Ok(())
}

/// The `IBV_ACCESS_*` bits of `a`. Only the first three rights have the same value in both:
/// pagewire's ON_DEMAND is 8 and REMOTE_ATOMIC 16, verbs' IBV_ACCESS_ON_DEMAND is 64 and
/// IBV_ACCESS_REMOTE_ATOMIC 8.
pub(super) fn access_bits(a: Access) -> u32 {
    let mut bits = 0;
    if a.contains(Access::LOCAL_WRITE) {
        bits |= A::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        bits |= A::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        bits |= A::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(Access::REMOTE_ATOMIC) {
        bits |= A::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
    if a.contains(Access::ON_DEMAND) {
        bits |= A::IBV_ACCESS_ON_DEMAND.0;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_use_the_verbs_values() {
        assert_eq!(access_bits(Access::NONE), 0);
        assert_eq!(
            access_bits(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ),
            1 | 2 | 4
        );
        // ON_DEMAND is 8 in pagewire but IBV_ACCESS_ON_DEMAND (64) in verbs; 8 would be
        // IBV_ACCESS_REMOTE_ATOMIC.
        assert_eq!(access_bits(Access::ON_DEMAND | Access::LOCAL_WRITE), 64 | 1);
        // REMOTE_ATOMIC is 16 in pagewire but IBV_ACCESS_REMOTE_ATOMIC (8) in verbs; 16 would
        // be IBV_ACCESS_MW_BIND.
        assert_eq!(access_bits(Access::REMOTE_ATOMIC), 8);
        assert_eq!(
            access_bits(Access::REMOTE_ATOMIC | Access::ON_DEMAND | Access::LOCAL_WRITE),
            8 | 64 | 1
        );
    }

    #[test]
    fn remote_rights_that_write_need_local_write() {
        assert!(check_local_write(Access::NONE).is_ok());
        assert!(check_local_write(Access::REMOTE_READ).is_ok());
        assert!(check_local_write(
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC
        )
        .is_ok());
        let e = check_local_write(Access::REMOTE_WRITE)
            .unwrap_err()
            .to_string();
        assert!(e.contains("REMOTE_WRITE requires LOCAL_WRITE"), "{e}");
        let e = check_local_write(Access::REMOTE_ATOMIC | Access::REMOTE_READ)
            .unwrap_err()
            .to_string();
        assert!(e.contains("REMOTE_ATOMIC requires LOCAL_WRITE"), "{e}");
    }
}
