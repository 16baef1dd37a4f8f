//! Buffers (rsmpi's `Buffer`, `BufferMut` and the traits they are made of): an address, a
//! count of elements and a datatype; [`View`]s that pair memory with a datatype of the
//! caller's choice, [`Partition`]s for varcount collectives. Buffers of user reductions are
//! in `dyn_buffer.rs`, the packing in `packing.rs`.
//!
//! These three files are the `unsafe` of the datatype module: buffers hand out raw
//! addresses, and packing reads and writes through them. It is sound because every buffer stands for a
//! borrow of the memory it describes (`&B`, `&mut B`) and the trait implementations that
//! promise the datatype fits the memory are `unsafe` ([`Equivalence`], [`Pointer`],
//! [`View::with_count_and_datatype`] …), as in rsmpi.
#![allow(unsafe_code)]

use std::borrow::Borrow;
use std::ffi::c_void;

use crate::error::{Error, ErrorClass, Result};

use super::{Count, Datatype, Equivalence, TypeMap};

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
        .map_err(|_| Error::invalid(ErrorClass::Count, format!("a count of {count} elements")))?;
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
