//! Prefetching on-demand-paging regions ([`Nic::advise`]): the checks, then `ibv_advise_mr`
//! over the range cut into scatter-gather lists one call can carry.
#![forbid(unsafe_code)]

use rdma_sys::ibv_sge;

use super::*;

impl VerbsNic {
    /// [`Nic::advise`] for this provider.
    pub(super) fn advise_region(
        &self,
        lkey: u32,
        addr: u64,
        len: u64,
        advice: Advice,
    ) -> Result<()> {
        let info = self
            .regions
            .lock()
            .get(&lkey)
            .map(|r| r.info)
            .ok_or(Error::UnknownKey { key: lkey })?;
        if !info.access.contains(Access::ON_DEMAND) {
            return Err(Error::InvalidArgument(format!(
                "advise needs an ODP region; key {lkey:#010x} is pinned"
            )));
        }
        let end = addr.checked_add(len);
        if addr < info.addr || end.is_none_or(|e| e - info.addr > info.len) {
            return Err(Error::InvalidArgument(format!(
                "advise range {addr:#x}+{len} is outside region {:#x}+{}",
                info.addr, info.len
            )));
        }
        if len == 0 {
            return Ok(());
        }
        if advice == Advice::PrefetchWrite && !info.access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(format!(
                "PrefetchWrite needs a writable region; key {lkey:#010x} lacks LOCAL_WRITE"
            )));
        }
        let code = match advice {
            Advice::Prefetch => {
                rdma_sys::ib_uverbs_advise_mr_advice::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH
            }
            Advice::PrefetchWrite => {
                rdma_sys::ib_uverbs_advise_mr_advice::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE
            }
        };
        // In batches: one call takes at most `ADVISE_MAX_SGES` entries of 1 GiB, about
        // 4 TiB (the ioctl attribute carrying the list has a 16-bit length).
        let batches = advise_batch_count(len);
        let mut advised = 0u64;
        let mut result = Ok(());
        for (i, mut sges) in advise_batches(lkey, addr, len).enumerate() {
            let batch_len: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
            if let Err(e) = self
                .pd
                .advise_mr(code, ffi::ADVISE_MR_FLAG_FLUSH, &mut sges)
            {
                result = Err(match e.raw_os_error() {
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Error::Unsupported {
                        device: self.caps.device.clone(),
                        what: "prefetch (ibv_advise_mr)".into(),
                        hint: "run without prefetch",
                    },
                    Some(libc::EFAULT) => Error::UnmappedRange { addr, len },
                    _ => os(
                        format!(
                            "ibv_advise_mr(lkey={lkey:#010x}, {addr:#x}+{len}, {advice:?}, \
                             batch {} of {batches})",
                            i + 1
                        ),
                        e,
                    ),
                });
                break;
            }
            advised += batch_len;
        }
        // Pages asked for by the calls that succeeded (the earlier batches of a failed advice
        // did prefetch).
        if advised > 0 {
            let pages = pagewire_sys::page_span(addr, advised).1 / PAGE_SIZE;
            self.counters.prefetch_pages.fetch_add(pages, Relaxed);
        }
        result
    }
}

/// Largest span of one `ibv_sge` given to `ibv_advise_mr` (its length field is 32 bits).
const ADVISE_CHUNK: u64 = 1 << 30;

/// Most scatter-gather entries one `ibv_advise_mr` call takes: 4095. libibverbs passes the
/// list to the kernel as one ioctl attribute whose length field is 16 bits
/// (`struct ib_uverbs_attr::len`); `fill_attr_in` marks a longer one as a buffer error and
/// `execute_ioctl` then fails the call with `EINVAL` (rdma-core `libibverbs/cmd_ioctl.h`,
/// `cmd_ioctl.c`; `ibv_cmd_advise_mr` in `cmd_mr.c`, which mlx5's `advise_mr` calls).
const ADVISE_MAX_SGES: usize = u16::MAX as usize / std::mem::size_of::<ibv_sge>();

/// The batches of [`advise_batches`] for `len` bytes.
fn advise_batch_count(len: u64) -> u64 {
    len.div_ceil(ADVISE_CHUNK).div_ceil(ADVISE_MAX_SGES as u64)
}

/// The scatter-gather lists `ibv_advise_mr` gets for `[addr, addr+len)` of region `lkey`:
/// pieces of at most [`ADVISE_CHUNK`] bytes, at most [`ADVISE_MAX_SGES`] of them per call
/// (one call covers up to about 4 TiB). Made one batch at a time, so a huge range (an
/// implicit ODP region is `u64::MAX` long) costs no more memory than one batch.
fn advise_batches(lkey: u32, addr: u64, len: u64) -> AdviseBatches {
    AdviseBatches {
        lkey,
        at: addr,
        end: addr.saturating_add(len),
    }
}

/// Iterator of [`advise_batches`].
#[derive(Clone, Debug)]
struct AdviseBatches {
    lkey: u32,
    at: u64,
    end: u64,
}

impl Iterator for AdviseBatches {
    type Item = Vec<ibv_sge>;

    fn next(&mut self) -> Option<Vec<ibv_sge>> {
        if self.at >= self.end {
            return None;
        }
        let pieces = (self.end - self.at).div_ceil(ADVISE_CHUNK);
        let mut batch = Vec::with_capacity(pieces.min(ADVISE_MAX_SGES as u64) as usize);
        while self.at < self.end && batch.len() < ADVISE_MAX_SGES {
            let n = (self.end - self.at).min(ADVISE_CHUNK);
            batch.push(ibv_sge {
                addr: self.at,
                length: n as u32,
                lkey: self.lkey,
            });
            self.at += n;
        }
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advise_ranges_split_into_32_bit_pieces() {
        assert!(advise_batches(1, 0x1000, 0).next().is_none());
        assert_eq!(advise_batch_count(0), 0);
        let v: Vec<ibv_sge> = advise_batches(7, 0x1000, 3 * ADVISE_CHUNK + 5)
            .flatten()
            .collect();
        assert_eq!(v.len(), 4);
        assert_eq!((v[0].addr, v[0].length, v[0].lkey), (0x1000, 1 << 30, 7));
        assert_eq!((v[3].addr, v[3].length), (0x1000 + 3 * ADVISE_CHUNK, 5));
    }

    #[test]
    fn advice_above_4_tib_is_given_in_batches_the_ioctl_can_carry() {
        // The SGE list travels in an ioctl attribute with a 16-bit length.
        assert_eq!(ADVISE_MAX_SGES, 4095);
        assert!(ADVISE_MAX_SGES * std::mem::size_of::<ibv_sge>() <= u16::MAX as usize);
        assert!((ADVISE_MAX_SGES + 1) * std::mem::size_of::<ibv_sge>() > u16::MAX as usize);
        // 5 TiB and a bit, from an address that is not 1 GiB-aligned.
        let (addr, len) = (0x7f00_0000_1000u64, (5u64 << 40) + 12345);
        let batches: Vec<Vec<ibv_sge>> = advise_batches(9, addr, len).collect();
        assert_eq!(batches.len() as u64, advise_batch_count(len));
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [4095, 5120 - 4095 + 1]
        );
        // Together they cover the range exactly, in order, without gaps or overlaps.
        let mut at = addr;
        for s in batches.iter().flatten() {
            assert_eq!((s.addr, s.lkey), (at, 9));
            assert!(s.length > 0 && u64::from(s.length) <= ADVISE_CHUNK);
            at += u64::from(s.length);
        }
        assert_eq!(at, addr + len);
        // An implicit ODP region's whole length is not materialised: one batch at a time.
        let mut all = advise_batches(1, 0, u64::MAX);
        assert_eq!(all.next().map(|b| b.len()), Some(ADVISE_MAX_SGES));
    }
}
