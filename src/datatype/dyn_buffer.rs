//! Buffers whose element type is known at run time only ([`DynBuffer`], [`DynBufferMut`],
//! rsmpi's): what user reductions receive, laid out as the user's elements need (aligned for
//! them, packed when the datatype has gaps).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;

use super::{Count, DatatypeRef, Equivalence, TypeMap, UncommittedDatatype};

use super::buffer::{AsDatatype, Buffer, BufferMut, Collection, Pointer, PointerMut};
use super::packing::{pack_into, unpack_from};

/// A buffer whose element type is known at run time only (rsmpi's `DynBuffer`): what user
/// reductions receive.
#[derive(Clone, Copy)]
pub struct DynBuffer<'a> {
    ptr: *const c_void,
    len: Count,
    datatype: DatatypeRef<'a>,
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> DynBuffer<'a> {
    /// The elements of `buf`.
    pub fn new<T: Equivalence>(buf: &'a [T]) -> DynBuffer<'a>
    where
        T::Out: Into<DatatypeRef<'static>>,
    {
        DynBuffer {
            ptr: buf.as_ptr().cast(),
            len: buf.count(),
            datatype: T::equivalent_datatype().into(),
            _borrow: PhantomData,
        }
    }

    /// `len` elements of `datatype` at `ptr`.
    ///
    /// # Safety
    ///
    /// They must be valid for reading for `'a`.
    pub unsafe fn from_raw<T>(ptr: *const T, len: Count, datatype: DatatypeRef<'a>) -> Self {
        DynBuffer {
            ptr: ptr.cast(),
            len,
            datatype,
            _borrow: PhantomData,
        }
    }

    /// Whether the elements are `T`s.
    pub fn is<T: Equivalence>(&self) -> bool {
        is_of::<T>(self.datatype, self.ptr)
    }

    /// The elements as `T`s, if they are.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a [T]> {
        if !self.is::<T>() {
            return None;
        }
        // SAFETY: the memory holds `len` elements whose datatype is `T`'s, aligned for `T`.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len as usize) })
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr
    }
}

unsafe impl Pointer for DynBuffer<'_> {
    fn pointer(&self) -> *const c_void {
        self.ptr
    }
}
unsafe impl Collection for DynBuffer<'_> {
    fn count(&self) -> Count {
        self.len
    }
}
unsafe impl<'a> AsDatatype for DynBuffer<'a> {
    type Out = DatatypeRef<'a>;
    fn as_datatype(&self) -> DatatypeRef<'a> {
        self.datatype
    }
}
unsafe impl Buffer for DynBuffer<'_> {}

/// A buffer to write whose element type is known at run time only (rsmpi's
/// `DynBufferMut`).
pub struct DynBufferMut<'a> {
    ptr: *mut c_void,
    len: Count,
    datatype: DatatypeRef<'a>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> DynBufferMut<'a> {
    /// The elements of `buf`.
    pub fn new<T: Equivalence>(buf: &'a mut [T]) -> DynBufferMut<'a>
    where
        T::Out: Into<DatatypeRef<'static>>,
    {
        DynBufferMut {
            len: buf.count(),
            ptr: buf.as_mut_ptr().cast(),
            datatype: T::equivalent_datatype().into(),
            _borrow: PhantomData,
        }
    }

    /// `len` elements of `datatype` at `ptr`.
    ///
    /// # Safety
    ///
    /// They must be valid for reading and writing for `'a`, and not otherwise accessed.
    pub unsafe fn from_raw<T>(ptr: *mut T, len: Count, datatype: DatatypeRef<'a>) -> Self {
        DynBufferMut {
            ptr: ptr.cast(),
            len,
            datatype,
            _borrow: PhantomData,
        }
    }

    /// Whether the elements are `T`s.
    pub fn is<T: Equivalence>(&self) -> bool {
        is_of::<T>(self.datatype, self.ptr)
    }

    /// The elements as `T`s, if they are.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a mut [T]> {
        if !self.is::<T>() {
            return None;
        }
        // SAFETY: as for `DynBuffer::downcast`, and the borrow is exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast(), self.len as usize) })
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr
    }
    /// The address, to write.
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        self.ptr
    }
    /// A shorter shared borrow.
    pub fn reborrow(&self) -> DynBuffer<'_> {
        DynBuffer {
            ptr: self.ptr,
            len: self.len,
            datatype: self.datatype,
            _borrow: PhantomData,
        }
    }
    /// A shorter exclusive borrow.
    pub fn reborrow_mut(&mut self) -> DynBufferMut<'_> {
        DynBufferMut {
            ptr: self.ptr,
            len: self.len,
            datatype: self.datatype,
            _borrow: PhantomData,
        }
    }
    /// The buffer, read-only.
    pub fn downgrade(self) -> DynBuffer<'a> {
        DynBuffer {
            ptr: self.ptr,
            len: self.len,
            datatype: self.datatype,
            _borrow: PhantomData,
        }
    }
}

unsafe impl PointerMut for DynBufferMut<'_> {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.ptr
    }
}
unsafe impl Collection for DynBufferMut<'_> {
    fn count(&self) -> Count {
        self.len
    }
}
unsafe impl<'a> AsDatatype for DynBufferMut<'a> {
    type Out = DatatypeRef<'a>;
    fn as_datatype(&self) -> DatatypeRef<'a> {
        self.datatype
    }
}
unsafe impl BufferMut for DynBufferMut<'_> {}

/// Alignment at which elements of `map` may be handed to a user operation in place: the
/// strictest of its primitives, and that of any Rust type whose size is its extent (the
/// largest power of two dividing it, up to 16), so that `downcast` to the user's type works.
fn user_alignment(map: &TypeMap) -> usize {
    let extent_align = match map.extent() {
        0 => 1,
        e => 1 << e.trailing_zeros().min(4),
    };
    map.align.max(extent_align)
}

/// Memory holding `count` elements of a type map laid out as it describes them (blocks at
/// their offsets, gaps zeroed), 16-byte aligned: where a user reduction's operands live
/// while the collectives hold them packed.
struct LaidOut {
    storage: Vec<u128>,
    /// Bytes from the storage's start to element 0's address.
    origin: usize,
}

impl LaidOut {
    /// `packed` (whole elements of `map`) unpacked into new memory.
    fn unpack(map: &TypeMap, count: usize, packed: &[u8]) -> LaidOut {
        let lowest = map
            .blocks()
            .iter()
            .map(|b| b.offset)
            .min()
            .unwrap_or(0)
            .min(0);
        let highest = map
            .blocks()
            .iter()
            .map(|b| b.offset + b.len as isize)
            .max()
            .unwrap_or(0)
            .max(0);
        // Element 0's address, aligned to 16, with room below it for negative offsets.
        let origin = (lowest.unsigned_abs()).div_ceil(16) * 16;
        let span = origin + count.saturating_sub(1) * map.extent() + highest as usize;
        let mut out = LaidOut {
            storage: vec![0u128; span.div_ceil(16)],
            origin,
        };
        // SAFETY: the storage covers every block of `count` elements from `origin`, and
        // `packed` holds at most `count` elements.
        unsafe { unpack_from(out.base(), map, packed) };
        out
    }

    fn base(&mut self) -> *mut u8 {
        bytemuck::cast_slice_mut::<u128, u8>(&mut self.storage)[self.origin..].as_mut_ptr()
    }

    /// The blocks of `count` elements of `map`, packed into `out`.
    fn pack(&mut self, map: &TypeMap, count: usize, out: &mut [u8]) {
        let mut v = Vec::with_capacity(out.len());
        // SAFETY: the storage holds `count` elements of `map` from `base`.
        unsafe { pack_into(self.base(), count, map, &mut v) };
        out.copy_from_slice(&v);
    }
}

/// Calls a user reduction `f` on `left` and `right`, each a whole number of elements of
/// `datatype` packed (how the collectives carry them), as buffers of that datatype laid out
/// as it describes them (MPI's `MPI_User_function` contract: `len` elements of the
/// reduction's datatype). A gap-free datatype whose operands are aligned for it is handed
/// over in place; otherwise both are unpacked into aligned memory, and the blocks of the
/// right-hand one packed back after `f` (gaps are never read from or written to `right`).
pub(crate) fn with_user_elements(
    datatype: DatatypeRef<'_>,
    left: &[u8],
    right: &mut [u8],
    f: impl FnOnce(DynBuffer<'_>, DynBufferMut<'_>),
) {
    let map = datatype.type_map();
    let size = map.size();
    let count = left.len().min(right.len()).checked_div(size).unwrap_or(0);
    let len = count.count_of();
    let align = user_alignment(map);
    let aligned = |p: *const u8| (p as usize) % align == 0;
    if map.is_contiguous() && aligned(left.as_ptr()) && aligned(right.as_ptr()) {
        let l = DynBuffer {
            ptr: left.as_ptr().cast(),
            len,
            datatype,
            _borrow: PhantomData,
        };
        let r = DynBufferMut {
            ptr: right.as_mut_ptr().cast(),
            len,
            datatype,
            _borrow: PhantomData,
        };
        return f(l, r);
    }
    let mut l = LaidOut::unpack(map, count, &left[..count * size]);
    let mut r = LaidOut::unpack(map, count, &right[..count * size]);
    f(
        DynBuffer {
            ptr: l.base().cast_const().cast(),
            len,
            datatype,
            _borrow: PhantomData,
        },
        DynBufferMut {
            ptr: r.base().cast(),
            len,
            datatype,
            _borrow: PhantomData,
        },
    );
    r.pack(map, count, &mut right[..count * size]);
}

/// A slice's length as a [`Count`].
trait CountOf {
    fn count_of(&self) -> Count;
}
impl<T> CountOf for [T] {
    fn count_of(&self) -> Count {
        self.len().count_of()
    }
}
impl CountOf for usize {
    fn count_of(&self) -> Count {
        Count::try_from(*self).expect("pagewire: more than 2^31 - 1 elements")
    }
}

/// Whether elements of `datatype` at `ptr` can be seen as `T`s: the same type map, and
/// `ptr` aligned for `T`.
fn is_of<T: Equivalence>(datatype: DatatypeRef<'_>, ptr: *const c_void) -> bool {
    let theirs = T::equivalent_datatype();
    datatype.type_map() == theirs.type_map()
        && datatype.type_map().extent() == std::mem::size_of::<T>()
        && (ptr as usize) % std::mem::align_of::<T>() == 0
}

#[cfg(test)]
mod tests {
    use super::super::packing::vec_from_packed;
    use super::super::UserDatatype;
    use super::*;

    #[test]
    fn dyn_buffers_downcast_to_their_type_only() {
        let x = [1i32, 2];
        let d = DynBuffer::new(&x[..]);
        assert!(d.is::<i32>() && !d.is::<u32>());
        assert_eq!(d.downcast::<i32>(), Some(&x[..]));
        assert!(d.downcast::<f32>().is_none());
        let bools = vec_from_packed::<bool>(&[1, 0, 1]);
        assert_eq!(bools, vec![true, false, true]);
    }

    #[test]
    fn user_operations_get_elements_laid_out_and_write_back_blocks_only() {
        // Two runs of two i32s, three apart: 16 of 20 bytes travel.
        let t = UserDatatype::vector(2, 2, 3, &i32::equivalent_datatype());
        let left: Vec<u8> = [1i32, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut right: Vec<u8> = [10i32, 20, 30, 40]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        with_user_elements(t.as_ref(), &left, &mut right, |l, mut r| {
            assert_eq!((l.len(), r.len()), (1, 1));
            assert_eq!(l.as_datatype().type_map(), t.type_map());
            // SAFETY: one element of the vector: five i32s, the third a zeroed gap.
            let (l, r) = unsafe {
                (
                    std::slice::from_raw_parts(l.as_ptr().cast::<i32>(), 5),
                    std::slice::from_raw_parts_mut(r.as_mut_ptr().cast::<i32>(), 5),
                )
            };
            assert_eq!(
                (l, &r[..]),
                (&[1, 2, 0, 3, 4][..], &[10, 20, 0, 30, 40][..])
            );
            for (y, x) in r.iter_mut().zip(l) {
                *y += x + 100;
            }
        });
        let got: Vec<i32> = right
            .chunks(4)
            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, [111, 122, 133, 144], "the blocks, the gap left out");

        // Gap-free elements in misaligned memory: handed over as an aligned copy, so that
        // they downcast.
        let words = [5u64, 6, 7];
        let mut storage = [0u64; 4];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut storage);
        bytes[1..25].copy_from_slice(bytemuck::cast_slice(&words));
        // From byte 9 of 8-aligned memory: not aligned for a u64.
        let (left, right) = (bytes[1..9].to_vec(), &mut bytes[9..25]);
        let d = u64::equivalent_datatype();
        with_user_elements(d, &left, right, |l, r| {
            let (l, r) = (l.downcast::<u64>().unwrap(), r.downcast::<u64>().unwrap());
            assert_eq!((l, &r[..]), (&[5u64][..], &[6u64][..]));
            r[0] += l[0];
        });
        assert_eq!(&bytes[9..17], &11u64.to_ne_bytes(), "written back");
        assert_eq!(
            &bytes[17..25],
            &7u64.to_ne_bytes(),
            "only whole elements of the shorter"
        );
    }
}
