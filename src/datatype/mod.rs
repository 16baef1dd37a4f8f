//! Datatypes (rsmpi's `datatype` module, MPI chapter 4): which Rust types travel as messages
//! ([`Equivalence`]), the datatypes that describe their memory ([`SystemDatatype`],
//! [`UserDatatype`]: contiguous, vector, indexed, structured), and the buffers built on
//! them ([`Buffer`], [`View`], [`Partition`], [`DynBuffer`]).
//!
//! A datatype is a [`TypeMap`]: the byte blocks that one element covers, relative to the
//! element's address, and the element's extent (its stride in an array). A buffer is an
//! address, a count of elements and a datatype. Buffers whose datatype is one gap-free
//! block move as they are; any other (a vector with a stride, a struct with padding) is
//! packed into a contiguous message on the sending side and unpacked on the receiving side,
//! so the bytes between blocks are never read nor written.
//!
//! Files: this one holds the datatype traits, the borrowed datatypes and [`Equivalence`],
//! `type_map.rs` the type maps, `user_datatype.rs` the datatypes built from others,
//! `buffer.rs` the buffer traits, views and partitions, `dyn_buffer.rs` the buffers of user
//! reductions, `packing.rs` the packing (these three are the module's `unsafe`: they read and
//! write memory through the addresses that buffers give).

mod buffer;
mod dyn_buffer;
mod packing;
mod type_map;
mod user_datatype;

use std::sync::Arc;

pub use buffer::{
    AsDatatype, Buffer, BufferMut, Collection, MutView, Partition, PartitionMut, Partitioned,
    PartitionedBuffer, PartitionedBufferMut, Pointer, PointerMut, View,
};
pub(crate) use dyn_buffer::with_user_elements;
pub use dyn_buffer::{DynBuffer, DynBufferMut};
pub(crate) use packing::{lend_gapped, packed, packed_partition, vec_from_packed, Landing};
pub use type_map::{Block, Primitive, TypeMap};
pub use user_datatype::{UncommittedUserDatatype, UserDatatype};

/// A count of elements, as rsmpi types it (`int` in MPI).
pub type Count = i32;
/// A byte displacement (`MPI_Aint`).
pub type Address = isize;

/// Something that describes memory and may be the parts of a new datatype (rsmpi's
/// `UncommittedDatatype`).
pub trait UncommittedDatatype {
    /// Its type map.
    fn type_map(&self) -> &TypeMap;
    /// A datatype of its own with the same map (`MPI_Type_dup`).
    fn dup(&self) -> UserDatatype {
        UserDatatype(Arc::new(self.type_map().clone()))
    }
}

/// A datatype that buffers can use (rsmpi's `Datatype`, a committed `MPI_Datatype`).
pub trait Datatype: UncommittedDatatype {}

impl<D: UncommittedDatatype + ?Sized> UncommittedDatatype for &D {
    fn type_map(&self) -> &TypeMap {
        (**self).type_map()
    }
}
impl<D: Datatype + ?Sized> Datatype for &D {}

/// A borrowed datatype (rsmpi's `DatatypeRef`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatatypeRef<'a>(&'a TypeMap);

/// A predefined datatype, the one of a primitive (`MPI_INT32_T` …).
pub type SystemDatatype = DatatypeRef<'static>;

impl DatatypeRef<'static> {
    /// The predefined datatype of a primitive.
    pub fn of_primitive(p: Primitive) -> SystemDatatype {
        DatatypeRef(TypeMap::of_primitive(p))
    }
}

impl<'a> DatatypeRef<'a> {
    /// The datatype whose map is `map`.
    pub(crate) fn of_map(map: &'a TypeMap) -> DatatypeRef<'a> {
        DatatypeRef(map)
    }
}

impl UncommittedDatatype for DatatypeRef<'_> {
    fn type_map(&self) -> &TypeMap {
        self.0
    }
}
impl Datatype for DatatypeRef<'_> {}

/// A borrowed datatype to build others from (rsmpi's `UncommittedDatatypeRef`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UncommittedDatatypeRef<'a>(&'a TypeMap);

impl UncommittedDatatype for UncommittedDatatypeRef<'_> {
    fn type_map(&self) -> &TypeMap {
        self.0
    }
}

impl<'a> From<DatatypeRef<'a>> for UncommittedDatatypeRef<'a> {
    fn from(d: DatatypeRef<'a>) -> Self {
        UncommittedDatatypeRef(d.0)
    }
}
/// A Rust type whose values travel as messages, with the datatype that describes its memory
/// (rsmpi's `Equivalence`).
///
/// # Safety
///
/// The datatype must describe memory inside a value of `Self` only, and any bytes it
/// describes must be valid for `Self` whatever a peer sends (every primitive number is; a
/// `bool` holds 0 or 1 when the sender sent a `bool`). Bytes of `Self` outside its blocks
/// are zero in values received into new memory (`receive`, `receive_vec`).
#[allow(unsafe_code)]
pub unsafe trait Equivalence {
    /// The datatype's type.
    type Out: Datatype;
    /// The datatype (`#[derive(Equivalence)]` builds it once per type).
    fn equivalent_datatype() -> Self::Out;
}

macro_rules! equivalent_system_datatype {
    ($($t:ty => $p:ident),* $(,)?) => {$(
        // SAFETY: a primitive's map is one block of its size.
        #[allow(unsafe_code)]
        unsafe impl Equivalence for $t {
            type Out = SystemDatatype;
            fn equivalent_datatype() -> SystemDatatype {
                DatatypeRef(TypeMap::of_primitive(Primitive::$p))
            }
        }
    )*};
}

equivalent_system_datatype!(
    bool => Bool, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16,
    u32 => U32, u64 => U64, f32 => F32, f64 => F64,
);
#[cfg(target_pointer_width = "64")]
equivalent_system_datatype!(usize => U64, isize => I64);
#[cfg(target_pointer_width = "32")]
equivalent_system_datatype!(usize => U32, isize => I32);

/// Complex numbers (feature `complex`, as rsmpi's): `num_complex::Complex32` and
/// `Complex64`, two floats each.
#[cfg(feature = "complex")]
mod complex {
    use super::{DatatypeRef, Equivalence, Primitive, SystemDatatype, TypeMap};
    use num_complex::{Complex32, Complex64};

    equivalent_system_datatype!(Complex32 => Complex32, Complex64 => Complex64);
}

/// What `#[derive(Equivalence)]` expands to calls; not for direct use.
#[doc(hidden)]
pub mod internal {
    use super::{TypeMap, UncommittedDatatype, UserDatatype};

    /// Checks that a derived datatype may be built now, as rsmpi does: after
    /// initialisation, before finalisation, and on the thread that initialised unless the
    /// threading level is `Multiple`. Panics otherwise.
    pub fn check_derive_equivalence_universe_state(type_name: &str) {
        crate::environment::check_datatype_creation(type_name);
    }

    /// The datatype of `D` as a [`UserDatatype`], to be one part of a struct's.
    pub fn user<D: UncommittedDatatype>(d: &D) -> UserDatatype {
        d.dup()
    }

    /// `d` with the extent of its Rust type (`size_of`), so arrays of it line up.
    pub fn with_extent(d: UserDatatype, extent: usize) -> UserDatatype {
        let mut map: TypeMap = d.type_map().clone();
        map.extent = extent;
        map.lb = 0;
        UserDatatype(std::sync::Arc::new(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_are_one_block() {
        let d = f64::equivalent_datatype();
        assert!(d.type_map().is_contiguous());
        assert_eq!(d.type_map().size(), 8);
        assert_eq!(d.type_map().primitive(), Some(Primitive::F64));
    }
}
