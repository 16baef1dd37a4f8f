//! Packing: a buffer's blocks to and from a contiguous message ([`packed`],
//! [`packed_partition`], [`Landing`]), and lending a buffer with gaps to the message layer
//! in place ([`lend_gapped`]). It reads and writes user memory through the addresses
//! buffers give, so it is `unsafe`, sound for the reasons `buffer.rs` gives.
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;

use pagewire_transport::msg::raw::{Layout, UserBuf, UserBufMut};

use super::{Equivalence, TypeMap, UncommittedDatatype};

use super::buffer::{Buffer, BufferMut, PartitionedBuffer, PartitionedBufferMut};

/// Where `count` elements of `map` at `base` lie, as the message layer takes a buffer with
/// gaps in place: the lowest byte the blocks touch, and the blocks from there. `None` for a
/// buffer without gaps or with nothing to move.
fn gapped_layout(base: *const u8, count: usize, map: &TypeMap) -> Option<(*const u8, Layout)> {
    if map.is_contiguous() || count == 0 || map.size() == 0 {
        return None;
    }
    // The extent is not negative, so element 0 holds the lowest byte.
    let lowest = map.blocks().iter().map(|b| b.offset).min()?;
    let runs = map
        .blocks()
        .iter()
        .map(|b| ((b.offset - lowest) as u64, b.len as u64));
    Some((
        base.wrapping_offset(lowest),
        Layout::new(runs, map.extent() as u64, count as u64),
    ))
}

/// `buf` lent to the message layer as it is, gaps and all, when it has gaps and `takes`
/// accepts their layout (`PointToPoint::moves_in_place`): the layer then gathers its blocks
/// itself (scatter-gather rendezvous, or the copy into a slot) instead of the caller
/// packing them first.
///
/// # Safety
///
/// The operation given the result must finish before the borrow of `buf` ends.
pub(crate) unsafe fn lend_gapped<B: Buffer + ?Sized>(
    buf: &B,
    takes: impl FnOnce(&Layout) -> bool,
) -> Option<UserBuf> {
    let datatype = buf.as_datatype();
    let count = buf.count().max(0) as usize;
    let (lowest, layout) = gapped_layout(buf.pointer().cast(), count, datatype.type_map())?;
    // SAFETY: `Pointer` and `Collection` promise `count` elements at the buffer's address,
    // so every block of the layout is readable; the caller keeps `buf` borrowed until the
    // operation ends.
    takes(&layout).then(|| unsafe { UserBuf::gapped(lowest, Arc::new(layout)) })
}

/// A buffer's elements as one contiguous run of bytes: borrowed where its datatype has no
/// gaps, packed otherwise.
pub(crate) fn packed<B: Buffer + ?Sized>(buf: &B) -> Cow<'_, [u8]> {
    let datatype = buf.as_datatype();
    let map = datatype.type_map();
    let count = buf.count().max(0) as usize;
    let base: *const u8 = buf.pointer().cast();
    if map.is_contiguous() {
        // SAFETY: `Pointer` and `Collection` promise `count` elements at `base`; without
        // gaps they are `count · size` bytes.
        return Cow::Borrowed(unsafe { std::slice::from_raw_parts(base, count * map.size()) });
    }
    let mut out = Vec::new();
    // SAFETY: as above.
    unsafe { pack_into(base, count, map, &mut out) };
    Cow::Owned(out)
}

/// The blocks of a partitioned buffer, one per rank, packed in rank order; and each
/// block's length in bytes.
pub(crate) fn packed_partition<P: PartitionedBuffer + ?Sized>(
    p: &P,
) -> (Cow<'_, [u8]>, Vec<usize>) {
    let datatype = p.as_datatype();
    let map = datatype.type_map();
    let base: *const u8 = p.pointer().cast();
    let blocks: Vec<(usize, usize)> = p
        .displs()
        .iter()
        .zip(p.counts())
        .map(|(&d, &c)| (d.max(0) as usize, c.max(0) as usize))
        .collect();
    if map.is_contiguous() && in_rank_order(&blocks) {
        let lens: Vec<usize> = blocks.iter().map(|&(_, c)| c * map.size()).collect();
        // SAFETY: `Partition::new` checked that the blocks lie in the buffer; in rank order
        // and without gaps they are one run from its start.
        let bytes = unsafe { std::slice::from_raw_parts(base, lens.iter().sum()) };
        return (Cow::Borrowed(bytes), lens);
    }
    let mut out = Vec::new();
    let mut lens = Vec::with_capacity(p.counts().len());
    for (&c, &d) in p.counts().iter().zip(p.displs()) {
        let start = base.wrapping_offset(d as isize * map.extent() as isize);
        let before = out.len();
        // SAFETY: `Partition::new` checked that each block lies in the buffer.
        unsafe { pack_into(start, c.max(0) as usize, map, &mut out) };
        lens.push(out.len() - before);
    }
    (Cow::Owned(out), lens)
}

/// Whether blocks (first element, elements) follow one another from element 0, so that a
/// partitioned buffer is its blocks packed in rank order.
fn in_rank_order(blocks: &[(usize, usize)]) -> bool {
    let mut next = 0;
    blocks.iter().all(|&(first, n)| {
        let ok = first == next;
        next += n;
        ok
    })
}

/// Memory that receives a message: a buffer's address, count and type map, borrowed for
/// `'b`.
pub(crate) struct Landing<'b> {
    base: *mut u8,
    count: usize,
    map: TypeMap,
    /// Per rank: (first element, elements), for a partitioned buffer.
    blocks: Option<Vec<(usize, usize)>>,
    _borrow: PhantomData<&'b mut [u8]>,
}

impl<'b> Landing<'b> {
    /// The memory of `buf`.
    pub(crate) fn new<B: BufferMut + ?Sized>(buf: &'b mut B) -> Landing<'b> {
        let map = buf.as_datatype().type_map().clone();
        Landing {
            count: buf.count().max(0) as usize,
            base: buf.pointer_mut().cast(),
            map,
            blocks: None,
            _borrow: PhantomData,
        }
    }

    /// The memory of a partitioned buffer, whose blocks receive one rank's data each.
    pub(crate) fn partitioned<P: PartitionedBufferMut + ?Sized>(p: &'b mut P) -> Landing<'b> {
        let map = p.as_datatype().type_map().clone();
        let blocks: Vec<(usize, usize)> = p
            .displs()
            .iter()
            .zip(p.counts())
            .map(|(&d, &c)| (d.max(0) as usize, c.max(0) as usize))
            .collect();
        let count = blocks.iter().map(|&(d, c)| d + c).max().unwrap_or(0);
        Landing {
            base: p.pointer_mut().cast(),
            count,
            map,
            blocks: Some(blocks),
            _borrow: PhantomData,
        }
    }

    /// Bytes a full message carries: count times the datatype's size (the sum of the
    /// blocks' for a partitioned buffer).
    pub(crate) fn packed_len(&self) -> usize {
        match &self.blocks {
            Some(b) => b.iter().map(|&(_, c)| c).sum::<usize>() * self.map.size(),
            None => self.count * self.map.size(),
        }
    }

    /// Packed bytes per rank, for a partitioned buffer.
    pub(crate) fn block_lens(&self) -> Option<Vec<usize>> {
        let size = self.map.size();
        self.blocks
            .as_ref()
            .map(|b| b.iter().map(|&(_, c)| c * size).collect())
    }

    /// The memory itself, when a message can land there as it is (no gaps, not
    /// partitioned).
    pub(crate) fn contiguous(&mut self) -> Option<&mut [u8]> {
        if !self.map.is_contiguous() || !self.blocks.as_deref().is_none_or(in_rank_order) {
            return None;
        }
        let len = self.packed_len();
        // SAFETY: the buffer this was made from is exclusively borrowed for `'b` and holds
        // `count` gap-free elements.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base, len) })
    }

    /// The memory lent to the message layer as it is, gaps and all, when it has gaps, is not
    /// partitioned, and `takes` accepts its layout (see [`lend_gapped`]).
    ///
    /// # Safety
    ///
    /// The operation given the result must finish before `'b` ends.
    pub(crate) unsafe fn lend_gapped(
        &mut self,
        takes: impl FnOnce(&Layout) -> bool,
    ) -> Option<UserBufMut> {
        if self.blocks.is_some() {
            return None;
        }
        let (lowest, layout) = gapped_layout(self.base, self.count, &self.map)?;
        // SAFETY: the memory is exclusively borrowed for `'b` and holds `count` elements of
        // the map (whose blocks do not overlap: MPI forbids that in a receive datatype);
        // the caller finishes the operation before `'b` ends.
        takes(&layout).then(|| unsafe { UserBufMut::gapped(lowest.cast_mut(), Arc::new(layout)) })
    }

    /// Packs the memory's current content into `out` (as long as [`Landing::packed_len`]).
    pub(crate) fn read_into(&self, out: &mut [u8]) {
        let mut v = Vec::with_capacity(out.len());
        // SAFETY: the memory holds `count` elements of the map, borrowed for `'b`.
        unsafe { pack_into(self.base, self.count, &self.map, &mut v) };
        let n = v.len().min(out.len());
        out[..n].copy_from_slice(&v[..n]);
    }

    /// Writes a packed message into the blocks, in order (a partitioned buffer's blocks one
    /// after another); bytes between blocks are untouched. A message longer than the memory
    /// is cut to it.
    pub(crate) fn unpack(&mut self, packed: &[u8]) {
        let packed = &packed[..packed.len().min(self.packed_len())];
        match &self.blocks {
            // SAFETY: the memory holds `count` elements and `packed` is no longer than they.
            None => unsafe { unpack_from(self.base, &self.map, packed) },
            Some(blocks) => {
                let size = self.map.size();
                let mut at = 0;
                for &(first, n) in blocks {
                    let len = (n * size).min(packed.len() - at);
                    let start = self
                        .base
                        .wrapping_offset(first as isize * self.map.extent() as isize);
                    // SAFETY: `PartitionMut::new` checked that each block lies in the buffer.
                    unsafe { unpack_from(start, &self.map, &packed[at..at + len]) };
                    at += len;
                }
            }
        }
    }
}

/// `count` values of `T` from a packed message: new memory, zeroed, then unpacked into.
pub(crate) fn vec_from_packed<T: Equivalence>(packed: &[u8]) -> Vec<T> {
    let datatype = T::equivalent_datatype();
    let map = datatype.type_map();
    let size = map.size();
    let n = packed.len().checked_div(size).unwrap_or(0);
    let mut v: Vec<T> = Vec::with_capacity(n);
    let base: *mut u8 = v.as_mut_ptr().cast();
    // SAFETY: the capacity holds `n` values of `T`; zeroing, then writing the blocks that
    // `T`'s datatype describes, makes them valid values (`Equivalence`'s contract).
    unsafe {
        std::ptr::write_bytes(base, 0, n * std::mem::size_of::<T>());
        unpack_from(base, map, &packed[..n * size]);
        v.set_len(n);
    }
    v
}

/// Copies the blocks of `count` elements of `map` at `base` into `out`, in order.
///
/// # Safety
///
/// `base` must be valid for reading what `count` elements of `map` describe.
pub(super) unsafe fn pack_into(base: *const u8, count: usize, map: &TypeMap, out: &mut Vec<u8>) {
    out.reserve(count * map.size());
    for i in 0..count {
        let element = base.wrapping_offset(i as isize * map.extent() as isize);
        for b in map.blocks() {
            // SAFETY: the block lies in the buffer, by the caller's guarantee.
            let bytes = unsafe { std::slice::from_raw_parts(element.offset(b.offset), b.len) };
            out.extend_from_slice(bytes);
        }
    }
}

/// Copies `packed` into the blocks of elements of `map` at `base`, in order; returns the
/// bytes used. Bytes between blocks are not written.
///
/// # Safety
///
/// `base` must be valid for writing what `packed.len() / map.size()` elements of `map`
/// describe.
pub(super) unsafe fn unpack_from(base: *mut u8, map: &TypeMap, packed: &[u8]) {
    let size = map.size();
    if size == 0 {
        return;
    }
    let mut at = 0;
    let mut i = 0isize;
    while at < packed.len() {
        let element = base.wrapping_offset(i * map.extent() as isize);
        for b in map.blocks() {
            let n = b.len.min(packed.len() - at);
            // SAFETY: the block lies in the buffer, by the caller's guarantee.
            unsafe {
                std::ptr::copy_nonoverlapping(packed[at..].as_ptr(), element.offset(b.offset), n)
            };
            at += n;
            if at == packed.len() {
                return;
            }
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Collection, MutView, Partition, PartitionMut, UserDatatype, View};
    use super::*;

    #[test]
    fn a_vector_packs_its_blocks_and_unpacks_without_touching_the_gaps() {
        let t = UserDatatype::vector(2, 2, 3, &i32::equivalent_datatype());
        let src = [1i32, 2, 3, 4, 5, 6];
        let view = unsafe { View::with_count_and_datatype(&src[..], 1, &t) };
        let bytes = packed(&view).into_owned();
        assert_eq!(bytes.len(), 16);
        let mut dst = [-1i32; 6];
        {
            let mut into = unsafe { MutView::with_count_and_datatype(&mut dst[..], 1, &t) };
            let mut landing = Landing::new(&mut into);
            assert!(landing.contiguous().is_none());
            assert_eq!(landing.packed_len(), 16);
            landing.unpack(&bytes);
        }
        assert_eq!(dst, [1, 2, -1, 4, 5, -1]);
    }

    #[test]
    fn plain_buffers_borrow_and_partitions_pack_per_rank() {
        let v = vec![1u16, 2, 3, 4];
        assert!(matches!(packed(&v), Cow::Borrowed(_)));
        assert_eq!(v.count(), 4);
        let p = Partition::new(&v[..], vec![1, 2], &[3, 0][..]);
        let (bytes, lens) = packed_partition(&p);
        assert_eq!(lens, vec![2, 4]);
        assert_eq!(vec_from_packed::<u16>(&bytes), vec![4, 1, 2]);
        let mut r = [0u16; 4];
        {
            let mut into = PartitionMut::new(&mut r[..], vec![1, 2], vec![3, 0]);
            let mut landing = Landing::partitioned(&mut into);
            assert_eq!(landing.block_lens(), Some(vec![2, 4]));
            landing.unpack(&bytes);
        }
        assert_eq!(r, [1, 2, 0, 4]);
    }

    #[test]
    fn a_view_over_bytes_is_checked_to_lie_inside_them() {
        use crate::datatype::UserDatatype;
        // 3 runs of 4 bytes, 6 apart: bytes 0..16 of each element.
        let t = UserDatatype::vector(3, 4, 6, &u8::equivalent_datatype());
        let mut bytes = [0u8; 16];
        assert!(View::over_bytes(&bytes[..], 1, &t).is_ok());
        assert!(MutView::over_bytes(&mut bytes[..15], 1, &t).is_err());
        let e = View::over_bytes(&bytes[..], 2, &t)
            .err()
            .expect("too small")
            .to_string();
        assert!(e.contains("do not fit a buffer of 16 bytes"), "{e}");
        assert!(View::over_bytes(&bytes[..], 0, &t).is_ok());
        let negative = View::over_bytes(&bytes[..], -1, &t)
            .err()
            .expect("negative");
        assert_eq!(negative.class(), crate::ErrorClass::Count, "{negative}");
    }
}
