//! The soft NIC's DMA engine: how its bytes move (docs/architecture.md).
//!
//! - **Inside this process** (inline sends, packets into and out of the rings, staged
//!   payloads): a CPU copy through [`sys::guarded_copy`], no system call; a page that is not
//!   mapped fails the copy (`EFAULT`) and the work request, not the process.
//! - **Between processes** (RDMA WRITE and READ, large SENDs pulled by the receiver): one
//!   kernel copy, `process_vm_readv`/`writev` ([`sys::cma_copy`]).
//!
//! Every address handed here was named by a posted work request (whose `post_*` contract
//! gives the NIC the memory until the completion is polled) and checked against the TPT, or
//! is NIC-owned memory (a ring slot, an op's inline copy).

use std::io;

use pagewire_sys::{self as sys, Extent};

/// Copies `len` bytes from `src` to `dst`, both in this process.
pub(crate) fn copy(dst: u64, src: u64, len: u64) -> io::Result<()> {
    // SAFETY: per the module's contract, `dst` is a posted receive buffer, a READ target, a
    // ring slot this engine owns until it publishes it, or the engine's own buffer; no Rust
    // reference into it is live while the NIC owns it. Unmapped memory fails with EFAULT.
    unsafe { sys::guarded_copy(dst, src, len as usize) }
}

/// Adds `add` to the 8-byte word at `word` in this process, atomically; its old value.
pub(crate) fn fetch_add(word: u64, add: u64) -> io::Result<u64> {
    // SAFETY: per the module's contract, `word` lies in a region registered with remote
    // atomic rights and checked against the TPT by the caller, aligned (checked at
    // acceptance); the window's owner accesses it only atomically while peers may update
    // it. Unmapped memory fails with EFAULT.
    unsafe { sys::guarded_fetch_add(word, add) }
}

/// Writes `swap` into the 8-byte word at `word` in this process if it holds `compare`,
/// atomically; its old value.
pub(crate) fn cmp_swap(word: u64, compare: u64, swap: u64) -> io::Result<u64> {
    // SAFETY: as for `fetch_add`.
    unsafe { sys::guarded_cmp_swap(word, compare, swap) }
}

/// Whether every page of the `(address, length)` pieces can be read now: one guarded
/// byte per page (a probe before the kernel reads them for a socket, where a fault would
/// leave a frame half-sent).
pub(crate) fn readable(pieces: &[(u64, u64)]) -> bool {
    let mut probe = 0u8;
    let at = std::ptr::addr_of_mut!(probe) as u64;
    pieces.iter().all(|&(addr, len)| {
        let end = addr + len;
        let mut page = addr;
        while page < end {
            if copy(at, page, 1).is_err() {
                return false;
            }
            page = (page & !(pagewire_nic::PAGE_SIZE - 1)) + pagewire_nic::PAGE_SIZE;
        }
        true
    })
}

/// Copies the `len` bytes that start `offset` bytes into the stream `src` describes to `dst`
/// (one contiguous range).
pub(crate) fn gather(dst: u64, src: &[Extent], offset: u64, len: u64) -> io::Result<()> {
    let mut at = dst;
    for (addr, n) in pieces(src, offset, len) {
        copy(at, addr, n)?;
        at += n;
    }
    Ok(())
}

/// Copies `len` bytes from `src` (one contiguous range) into the stream `dst` describes,
/// starting `offset` bytes into it.
pub(crate) fn scatter(dst: &[Extent], offset: u64, src: u64, len: u64) -> io::Result<()> {
    let mut at = src;
    for (addr, n) in pieces(dst, offset, len) {
        copy(addr, at, n)?;
        at += n;
    }
    Ok(())
}

/// The `(address, length)` pieces of `[offset, offset+len)` of the byte stream `extents`
/// describe (stopping at the stream's end).
pub(crate) fn pieces(
    extents: &[Extent],
    mut offset: u64,
    mut len: u64,
) -> impl Iterator<Item = (u64, u64)> + '_ {
    extents.iter().filter_map(move |e| {
        if len == 0 {
            return None;
        }
        if offset >= e.len {
            offset -= e.len;
            return None;
        }
        let take = (e.len - offset).min(len);
        let piece = (e.addr + offset, take);
        len -= take;
        offset = 0;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cross_extent_boundaries() {
        let e = [
            Extent { addr: 100, len: 10 },
            Extent { addr: 1000, len: 5 },
            Extent {
                addr: 5000,
                len: 20,
            },
        ];
        assert_eq!(
            pieces(&e, 8, 10).collect::<Vec<_>>(),
            vec![(108, 2), (1000, 5), (5000, 3)]
        );
        assert_eq!(pieces(&e, 15, 2).collect::<Vec<_>>(), vec![(5000, 2)]);
        assert_eq!(pieces(&e, 0, 0).count(), 0);
        assert_eq!(pieces(&e, 30, 100).collect::<Vec<_>>(), vec![(5015, 5)]);
    }

    #[test]
    fn gather_and_scatter_round_trip() {
        let src: Vec<u8> = (0..64u8).collect();
        let ext = [
            Extent {
                addr: src.as_ptr() as u64,
                len: 10,
            },
            Extent {
                addr: src.as_ptr() as u64 + 20,
                len: 30,
            },
        ];
        let mut flat = [0u8; 16];
        gather(flat.as_mut_ptr() as u64, &ext, 5, 16).unwrap();
        let want: Vec<u8> = (5..10).chain(20..31).collect();
        assert_eq!(&flat[..], &want[..]);
        let mut out = vec![0u8; 64];
        let dst = [
            Extent {
                addr: out.as_mut_ptr() as u64,
                len: 4,
            },
            Extent {
                addr: out.as_mut_ptr() as u64 + 32,
                len: 32,
            },
        ];
        scatter(&dst, 2, flat.as_ptr() as u64, 16).unwrap();
        assert_eq!(&out[2..4], &want[..2]);
        assert_eq!(&out[32..46], &want[2..]);
        assert!(out[..2].iter().chain(&out[4..32]).all(|&b| b == 0));
    }
}
