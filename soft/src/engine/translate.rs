//! Local translation: a scatter-gather list checked against this NIC's table, with the
//! requester's network page faults resolved, and which pages of a DMA are not present.

use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use super::{fault_extent, Held, MissWait};
use crate::{Inner, Peer};
use pagewire_nic::counters::NpfTiming;
use pagewire_nic::{Access, Sge, WcStatus, PAGE_SIZE};
use pagewire_sys::{self as sys, Extent};

/// Why a local scatter-gather list was not translated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Untranslated {
    /// It fails its checks: the request ends with this status.
    Refused(WcStatus),
    /// A key missed this NIC's translation cache: the request waits for the fill.
    Missed(MissWait),
}

impl Inner {
    /// Checks a local scatter-gather list against this NIC's table (through its translation
    /// cache, if it has one: each entry of request `translated` once, a miss filed on queue
    /// pair `qpn`) and resolves requester network page faults on its ODP parts in one batch.
    /// Returns the extents, and the holds that keep their regions registered while the
    /// caller moves their bytes.
    pub(super) fn local_extents(
        &self,
        sgl: &[Sge],
        need: Access,
        qpn: u32,
        translated: &mut u32,
    ) -> Result<(Held<'_>, SmallVec<[Extent; 2]>), Untranslated> {
        let tpt = self.own.tpt();
        let (mut held, mut out) = (Held::new(), SmallVec::new());
        let refused = Untranslated::Refused(WcStatus::LocalProtectionError);
        for (i, s) in sgl.iter().enumerate() {
            if s.len == 0 {
                continue;
            }
            let guard = tpt
                .acquire(s.lkey, s.addr, s.len as u64, need)
                .map_err(|_| refused)?;
            self.translate_local(qpn, s.lkey, 1 << i, translated)
                .map_err(Untranslated::Missed)?;
            let e = Extent {
                addr: guard.translation.dma_addr(s.addr),
                len: s.len as u64,
            };
            if guard.translation.detached() {
                self.counters.detached_bytes.fetch_add(e.len, Relaxed);
            }
            if guard.translation.on_demand() {
                if let Some(span) = self.missing_span(&self.peers[self.rank], e) {
                    let range = fault_extent(span);
                    let t0 = sys::monotonic_ns();
                    if !self.resolve_fault(
                        range.addr,
                        range.len,
                        need.contains(Access::LOCAL_WRITE),
                    ) {
                        return Err(refused);
                    }
                    let os_ns = sys::monotonic_ns() - t0;
                    let model_ns = self.profile.charge_npf_hardware();
                    self.counters.record_npf(
                        true,
                        range.len / PAGE_SIZE,
                        NpfTiming {
                            total_ns: sys::monotonic_ns() - t0,
                            wait_ns: 0,
                            os_ns,
                            model_ns,
                        },
                    );
                }
            }
            out.push(e);
            held.push(guard);
        }
        Ok((held, out))
    }

    /// The first and last page of `e` (in `owner`'s address space) that the NIC may not
    /// use: not present in its bitmap, or — where the owner has no memory monitor keeping
    /// the bits true — present there but no longer mapped in the owner's page tables (which
    /// clears their bit).
    pub(super) fn missing_span(&self, owner: &Peer, e: Extent) -> Option<(u64, u64)> {
        let bits = owner.mem.present();
        let missing = bits.missing_span(e.addr, e.len);
        if owner.mem.odp_monitored() {
            return missing;
        }
        let Some(pm) = &owner.pagemap else {
            return missing;
        };
        let pages = sys::page_span(e.addr, e.len).1 / PAGE_SIZE;
        let mut mapped = Vec::with_capacity(pages as usize);
        if sys::pages_mapped(pm, e.addr, e.len, &mut mapped).is_err() {
            return missing;
        }
        let first = e.addr / PAGE_SIZE;
        let mut span = missing;
        for (i, m) in mapped.iter().enumerate() {
            let page = first + i as u64;
            if !m && bits.clear_page(page) {
                self.counters.invalidated_pages.fetch_add(1, Relaxed);
                span = Some(match span {
                    Some((a, b)) => (a.min(page), b.max(page)),
                    None => (page, page),
                });
            }
        }
        span
    }
}
