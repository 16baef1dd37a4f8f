//! Buffers (rsmpi's `Buffer`, `BufferMut` and the traits they are made of): an address, a
//! count of elements and a datatype; [`View`]s that pair memory with a datatype of the
//! caller's choice, [`Partition`]s for varcount collectives, [`DynBuffer`]s for user
//! reductions; and the packing that moves a buffer's blocks to and from a contiguous
//! message.
//!
//! This file is the `unsafe` of the datatype module: buffers hand out raw addresses, and
//! packing reads and writes through them. It is sound because every buffer stands for a
//! borrow of the memory it describes (`&B`, `&mut B`) and the trait implementations that
//! promise the datatype fits the memory are `unsafe` ([`Equivalence`], [`Pointer`],
//! [`View::with_count_and_datatype`] …), as in rsmpi.
#![allow(unsafe_code)]

use std::borrow::{Borrow, Cow};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use pagewire_transport::msg::raw::{Layout, UserBuf, UserBufMut};

use crate::error::{Error, Result};

use super::{Count, Datatype, DatatypeRef, Equivalence, TypeMap, UncommittedDatatype};

/// Where a buffer starts (rsmpi's `Pointer`).
///
/// # Safety
///
/// The address must be valid for reading everything the buffer's datatype and count
/// describe, for as long as the buffer is borrowed.
pub unsafe trait Pointer {
    /// The address.
    fn pointer(&self) -> *const c_void;
}

/// Where a buffer to write starts (rsmpi's `PointerMut`).
///
/// # Safety
///
/// As [`Pointer`], for writing too.
pub unsafe trait PointerMut {
    /// The address.
    fn pointer_mut(&mut self) -> *mut c_void;
}

/// How many elements a buffer holds (rsmpi's `Collection`).
///
/// # Safety
///
/// The count must not describe more memory than the buffer has.
pub unsafe trait Collection {
    /// Elements of the buffer's datatype.
    fn count(&self) -> Count;
}

/// The datatype of a buffer's elements (rsmpi's `AsDatatype`).
///
/// # Safety
///
/// The datatype must describe the buffer's memory (see [`Equivalence`]).
pub unsafe trait AsDatatype {
    /// The datatype's type.
    type Out: Datatype;
    /// The datatype.
    fn as_datatype(&self) -> Self::Out;
}

/// Something that can be sent (rsmpi's `Buffer`).
///
/// # Safety
///
/// As its parts.
pub unsafe trait Buffer: Pointer + Collection + AsDatatype {}

/// Something that can be received into (rsmpi's `BufferMut`).
///
/// # Safety
///
/// As its parts.
pub unsafe trait BufferMut: PointerMut + Collection + AsDatatype {}

macro_rules! equivalence_buffers {
    ($(impl<$($g:ident),*> for $t:ty where $e:ident, len $len:expr;)*) => {$(
        unsafe impl<$($g),*> Pointer for $t where $e: Equivalence {
            fn pointer(&self) -> *const c_void {
                std::ptr::from_ref(self).cast()
            }
        }
        unsafe impl<$($g),*> PointerMut for $t where $e: Equivalence {
            fn pointer_mut(&mut self) -> *mut c_void {
                std::ptr::from_mut(self).cast()
            }
        }
        unsafe impl<$($g),*> Collection for $t where $e: Equivalence {
            #[allow(clippy::redundant_closure_call)]
            fn count(&self) -> Count {
                let n: usize = ($len)(self);
                Count::try_from(n).expect("pagewire: a buffer of more than 2^31 - 1 elements")
            }
        }
        unsafe impl<$($g),*> AsDatatype for $t where $e: Equivalence {
            type Out = <$e as Equivalence>::Out;
            fn as_datatype(&self) -> Self::Out {
                <$e>::equivalent_datatype()
            }
        }
        unsafe impl<$($g),*> Buffer for $t where $e: Equivalence {}
        unsafe impl<$($g),*> BufferMut for $t where $e: Equivalence {}
    )*};
}

equivalence_buffers! {
    impl<T> for T where T, len |_: &T| 1;
    impl<T> for [T] where T, len |s: &[T]| s.len();
}

// `Vec` and arrays point at their elements, not at themselves.
unsafe impl<T: Equivalence> Pointer for Vec<T> {
    fn pointer(&self) -> *const c_void {
        self.as_ptr().cast()
    }
}
unsafe impl<T: Equivalence> PointerMut for Vec<T> {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.as_mut_ptr().cast()
    }
}
unsafe impl<T: Equivalence> Collection for Vec<T> {
    fn count(&self) -> Count {
        self[..].count()
    }
}
unsafe impl<T: Equivalence> AsDatatype for Vec<T> {
    type Out = T::Out;
    fn as_datatype(&self) -> T::Out {
        T::equivalent_datatype()
    }
}
unsafe impl<T: Equivalence> Buffer for Vec<T> {}
unsafe impl<T: Equivalence> BufferMut for Vec<T> {}

unsafe impl<T: Equivalence, const N: usize> Pointer for [T; N] {
    fn pointer(&self) -> *const c_void {
        self.as_ptr().cast()
    }
}
unsafe impl<T: Equivalence, const N: usize> PointerMut for [T; N] {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.as_mut_ptr().cast()
    }
}
unsafe impl<T: Equivalence, const N: usize> Collection for [T; N] {
    fn count(&self) -> Count {
        self[..].count()
    }
}
unsafe impl<T: Equivalence, const N: usize> AsDatatype for [T; N] {
    type Out = T::Out;
    fn as_datatype(&self) -> T::Out {
        T::equivalent_datatype()
    }
}
unsafe impl<T: Equivalence, const N: usize> Buffer for [T; N] {}
unsafe impl<T: Equivalence, const N: usize> BufferMut for [T; N] {}

/// Memory seen through a datatype of the caller's choice (rsmpi's `View`).
pub struct View<'d, 'b, D: Datatype, B: Pointer + ?Sized> {
    datatype: &'d D,
    count: Count,
    buffer: &'b B,
}

impl<'d, 'b, D: Datatype, B: Pointer + ?Sized> View<'d, 'b, D, B> {
    /// `count` elements of `datatype` at `buffer`'s address.
    ///
    /// # Safety
    ///
    /// They must lie inside `buffer`.
    pub unsafe fn with_count_and_datatype(buffer: &'b B, count: Count, datatype: &'d D) -> Self {
        View {
            datatype,
            count,
            buffer,
        }
    }
}

impl<'d, 'b, D: Datatype> View<'d, 'b, D, [u8]> {
    /// `count` elements of `datatype` over bytes, checked to lie inside them: the safe form
    /// of [`View::with_count_and_datatype`] (a pagewire extension; rsmpi has only the
    /// `unsafe` one). An error says which byte would fall outside.
    pub fn over_bytes(buffer: &'b [u8], count: Count, datatype: &'d D) -> Result<Self> {
        check_inside(buffer.len(), count, datatype.type_map())?;
        Ok(View {
            datatype,
            count,
            buffer,
        })
    }
}

/// Fails unless `count` elements of `map` from a buffer's start lie in its first `len`
/// bytes.
fn check_inside(len: usize, count: Count, map: &TypeMap) -> Result<()> {
    let count = usize::try_from(count)
        .map_err(|_| Error::InvalidArgument(format!("a count of {count} elements")))?;
    if count == 0 || map.blocks().is_empty() {
        return Ok(());
    }
    let lowest = map.blocks().iter().map(|b| b.offset).min().unwrap_or(0);
    let end = map
        .blocks()
        .iter()
        .map(|b| b.offset + b.len as isize)
        .max()
        .unwrap_or(0);
    let last = (count - 1)
        .checked_mul(map.extent())
        .and_then(|s| isize::try_from(s).ok())
        .and_then(|s| s.checked_add(end));
    match last {
        Some(last) if lowest >= 0 && last as usize <= len => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "{count} elements of a datatype spanning bytes {lowest}..{end} with extent {} do \
             not fit a buffer of {len} bytes",
            map.extent()
        ))),
    }
}

unsafe impl<D: Datatype, B: Pointer + ?Sized> Pointer for View<'_, '_, D, B> {
    fn pointer(&self) -> *const c_void {
        self.buffer.pointer()
    }
}
unsafe impl<D: Datatype, B: Pointer + ?Sized> Collection for View<'_, '_, D, B> {
    fn count(&self) -> Count {
        self.count
    }
}
unsafe impl<'d, D: Datatype, B: Pointer + ?Sized> AsDatatype for View<'d, '_, D, B> {
    type Out = &'d D;
    fn as_datatype(&self) -> &'d D {
        self.datatype
    }
}
unsafe impl<D: Datatype, B: Pointer + ?Sized> Buffer for View<'_, '_, D, B> {}

/// Memory to receive into, seen through a datatype of the caller's choice (rsmpi's
/// `MutView`).
pub struct MutView<'d, 'b, D: Datatype, B: PointerMut + ?Sized> {
    datatype: &'d D,
    count: Count,
    buffer: &'b mut B,
}

impl<'d, 'b, D: Datatype, B: PointerMut + ?Sized> MutView<'d, 'b, D, B> {
    /// `count` elements of `datatype` at `buffer`'s address.
    ///
    /// # Safety
    ///
    /// They must lie inside `buffer`, and any bytes written there must be valid for it.
    pub unsafe fn with_count_and_datatype(
        buffer: &'b mut B,
        count: Count,
        datatype: &'d D,
    ) -> Self {
        MutView {
            datatype,
            count,
            buffer,
        }
    }
}

impl<'d, 'b, D: Datatype> MutView<'d, 'b, D, [u8]> {
    /// `count` elements of `datatype` over bytes, checked to lie inside them: the safe form
    /// of [`MutView::with_count_and_datatype`] (any bytes are valid `u8`s).
    pub fn over_bytes(buffer: &'b mut [u8], count: Count, datatype: &'d D) -> Result<Self> {
        check_inside(buffer.len(), count, datatype.type_map())?;
        Ok(MutView {
            datatype,
            count,
            buffer,
        })
    }
}

unsafe impl<D: Datatype, B: PointerMut + ?Sized> PointerMut for MutView<'_, '_, D, B> {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.buffer.pointer_mut()
    }
}
unsafe impl<D: Datatype, B: PointerMut + ?Sized> Collection for MutView<'_, '_, D, B> {
    fn count(&self) -> Count {
        self.count
    }
}
unsafe impl<'d, D: Datatype, B: PointerMut + ?Sized> AsDatatype for MutView<'d, '_, D, B> {
    type Out = &'d D;
    fn as_datatype(&self) -> &'d D {
        self.datatype
    }
}
unsafe impl<D: Datatype, B: PointerMut + ?Sized> BufferMut for MutView<'_, '_, D, B> {}

/// A buffer split into blocks, one per rank, for varcount collectives (rsmpi's
/// `Partitioned`): rank `j`'s block is `counts()[j]` elements from element `displs()[j]`.
pub trait Partitioned {
    /// Elements per rank.
    fn counts(&self) -> &[Count];
    /// First element of each rank's block.
    fn displs(&self) -> &[Count];
}

/// A partitioned buffer to send from (rsmpi's `PartitionedBuffer`).
pub trait PartitionedBuffer: Partitioned + Pointer + AsDatatype {}
/// A partitioned buffer to receive into (rsmpi's `PartitionedBufferMut`).
pub trait PartitionedBufferMut: Partitioned + PointerMut + AsDatatype {}

/// A buffer to send from, in blocks per rank (rsmpi's `Partition`).
pub struct Partition<'b, B: ?Sized, C, D> {
    buf: &'b B,
    counts: C,
    displs: D,
}

impl<'b, B: Buffer + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> Partition<'b, B, C, D> {
    /// Blocks of `buf`: `counts[j]` elements from element `displs[j]`. Panics if a block
    /// goes past the end of `buf`.
    pub fn new(buf: &'b B, counts: C, displs: D) -> Self {
        check_partition(buf.count(), counts.borrow(), displs.borrow());
        Partition {
            buf,
            counts,
            displs,
        }
    }
}

/// Panics unless every block lies inside `n` elements.
fn check_partition(n: Count, counts: &[Count], displs: &[Count]) {
    assert_eq!(
        counts.len(),
        displs.len(),
        "pagewire: one count per displacement"
    );
    for (&c, &d) in counts.iter().zip(displs) {
        assert!(
            c >= 0 && d >= 0 && i64::from(c) + i64::from(d) <= i64::from(n),
            "pagewire: a block of {c} elements at {d} does not fit in {n} elements"
        );
    }
}

impl<B: ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> Partitioned for Partition<'_, B, C, D> {
    fn counts(&self) -> &[Count] {
        self.counts.borrow()
    }
    fn displs(&self) -> &[Count] {
        self.displs.borrow()
    }
}
unsafe impl<B: Buffer + ?Sized, C, D> Pointer for Partition<'_, B, C, D> {
    fn pointer(&self) -> *const c_void {
        self.buf.pointer()
    }
}
unsafe impl<B: Buffer + ?Sized, C, D> AsDatatype for Partition<'_, B, C, D> {
    type Out = B::Out;
    fn as_datatype(&self) -> B::Out {
        self.buf.as_datatype()
    }
}
impl<B: Buffer + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> PartitionedBuffer
    for Partition<'_, B, C, D>
{
}

/// A buffer to receive into, in blocks per rank (rsmpi's `PartitionMut`).
pub struct PartitionMut<'b, B: ?Sized, C, D> {
    buf: &'b mut B,
    counts: C,
    displs: D,
}

impl<'b, B: BufferMut + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> PartitionMut<'b, B, C, D> {
    /// Blocks of `buf`: `counts[j]` elements from element `displs[j]`. Panics if a block
    /// goes past the end of `buf`.
    pub fn new(buf: &'b mut B, counts: C, displs: D) -> Self {
        check_partition(buf.count(), counts.borrow(), displs.borrow());
        PartitionMut {
            buf,
            counts,
            displs,
        }
    }
}

impl<B: ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> Partitioned for PartitionMut<'_, B, C, D> {
    fn counts(&self) -> &[Count] {
        self.counts.borrow()
    }
    fn displs(&self) -> &[Count] {
        self.displs.borrow()
    }
}
unsafe impl<B: BufferMut + ?Sized, C, D> PointerMut for PartitionMut<'_, B, C, D> {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.buf.pointer_mut()
    }
}
unsafe impl<B: BufferMut + ?Sized, C, D> AsDatatype for PartitionMut<'_, B, C, D> {
    type Out = B::Out;
    fn as_datatype(&self) -> B::Out {
        self.buf.as_datatype()
    }
}
impl<B: BufferMut + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> PartitionedBufferMut
    for PartitionMut<'_, B, C, D>
{
}

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

/// Copies the blocks of `count` elements of `map` at `base` into `out`, in order.
///
/// # Safety
///
/// `base` must be valid for reading what `count` elements of `map` describe.
unsafe fn pack_into(base: *const u8, count: usize, map: &TypeMap, out: &mut Vec<u8>) {
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
unsafe fn unpack_from(base: *mut u8, map: &TypeMap, packed: &[u8]) {
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

#[cfg(test)]
mod tests {
    use super::super::UserDatatype;
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
        assert!(View::over_bytes(&bytes[..], -1, &t).is_err());
    }
}
