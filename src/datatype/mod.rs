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
//! Files: this one holds the type maps and datatypes, `buffer.rs` the buffer traits, views
//! and partitions, `dyn_buffer.rs` the buffers of user reductions, `packing.rs` the packing
//! (these three are the module's `unsafe`: they read and write memory through the addresses
//! that buffers give).

mod buffer;
mod dyn_buffer;
mod packing;

use std::borrow::Cow;
use std::sync::Arc;

pub use buffer::{
    AsDatatype, Buffer, BufferMut, Collection, MutView, Partition, PartitionMut, Partitioned,
    PartitionedBuffer, PartitionedBufferMut, Pointer, PointerMut, View,
};
pub(crate) use dyn_buffer::with_user_elements;
pub use dyn_buffer::{DynBuffer, DynBufferMut};
pub(crate) use packing::{lend_gapped, packed, packed_partition, vec_from_packed, Landing};

/// A count of elements, as rsmpi types it (`int` in MPI).
pub type Count = i32;
/// A byte displacement (`MPI_Aint`).
pub type Address = isize;

/// The primitive a datatype is made of, when all its blocks hold the same one: what
/// reductions combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Primitive {
    /// `bool` (`MPI_C_BOOL`).
    Bool,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// A complex number of two `f32`.
    Complex32,
    /// A complex number of two `f64`.
    Complex64,
}

/// A run of bytes of one element: `len` bytes at `offset` from the element's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Bytes from the element's address (may be negative).
    pub offset: isize,
    /// Bytes in the run.
    pub len: usize,
}

/// What a datatype describes: the blocks of one element, in the order their bytes travel,
/// and the element's bounds (`MPI_Type_get_extent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeMap {
    blocks: Cow<'static, [Block]>,
    /// The lower bound, in bytes from the element's address.
    lb: isize,
    /// The distance between consecutive elements.
    extent: usize,
    /// The strictest alignment of the primitives inside (rounds up a struct's extent).
    align: usize,
    primitive: Option<Primitive>,
}

macro_rules! system_type_maps {
    ($($name:ident: $t:ty => $p:ident),* $(,)?) => {
        $(
            static $name: TypeMap = TypeMap {
                blocks: Cow::Borrowed(&[Block { offset: 0, len: std::mem::size_of::<$t>() }]),
                lb: 0,
                extent: std::mem::size_of::<$t>(),
                align: std::mem::align_of::<$t>(),
                primitive: Some(Primitive::$p),
            };
        )*
    };
}

system_type_maps!(
    BOOL: bool => Bool, I8: i8 => I8, I16: i16 => I16, I32: i32 => I32, I64: i64 => I64,
    U8: u8 => U8, U16: u16 => U16, U32: u32 => U32, U64: u64 => U64, F32: f32 => F32,
    F64: f64 => F64, C32: [f32; 2] => Complex32, C64: [f64; 2] => Complex64,
);

impl TypeMap {
    /// The map of a primitive.
    pub fn of_primitive(p: Primitive) -> &'static TypeMap {
        match p {
            Primitive::Bool => &BOOL,
            Primitive::I8 => &I8,
            Primitive::I16 => &I16,
            Primitive::I32 => &I32,
            Primitive::I64 => &I64,
            Primitive::U8 => &U8,
            Primitive::U16 => &U16,
            Primitive::U32 => &U32,
            Primitive::U64 => &U64,
            Primitive::F32 => &F32,
            Primitive::F64 => &F64,
            Primitive::Complex32 => &C32,
            Primitive::Complex64 => &C64,
        }
    }

    /// The blocks of one element, in the order their bytes travel.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }
    /// The lower bound in bytes.
    pub fn lower_bound(&self) -> isize {
        self.lb
    }
    /// The distance between consecutive elements in bytes.
    pub fn extent(&self) -> usize {
        self.extent
    }
    /// The bytes of one element that travel (`MPI_Type_size`).
    pub fn size(&self) -> usize {
        self.blocks.iter().map(|b| b.len).sum()
    }
    /// The primitive all blocks hold, if they hold one kind only.
    pub fn primitive(&self) -> Option<Primitive> {
        self.primitive
    }
    /// Whether `count` elements are one gap-free run starting at the buffer's address.
    pub fn is_contiguous(&self) -> bool {
        match &self.blocks[..] {
            [] => self.extent == 0,
            [b] => b.offset == 0 && b.len == self.extent,
            _ => false,
        }
    }

    /// The map of `count` copies of `old` laid out `stride` bytes apart, each a run of
    /// `blocklength` elements of `old`; bounds from the first to the end of the last run.
    fn strided(count: usize, blocklength: usize, stride: isize, old: &TypeMap) -> TypeMap {
        let starts = (0..count).map(|i| i as isize * stride);
        Self::runs(starts.map(|s| (s, blocklength)).collect(), old)
    }

    /// Runs of `old` elements: (byte displacement, elements) each.
    fn runs(runs: Vec<(isize, usize)>, old: &TypeMap) -> TypeMap {
        let ext = old.extent as isize;
        let mut blocks = Vec::new();
        let (mut lo, mut hi) = (isize::MAX, isize::MIN);
        for &(disp, n) in &runs {
            if old.is_contiguous() {
                // `n` gap-free elements are one block: no need to list them one by one (a
                // vector of a million bytes is one block per run, made in O(runs)).
                blocks.push(Block {
                    offset: disp,
                    len: n * old.extent,
                });
            } else {
                for j in 0..n as isize {
                    let base = disp + j * ext;
                    blocks.extend(old.blocks.iter().map(|b| Block {
                        offset: base + b.offset,
                        len: b.len,
                    }));
                }
            }
            lo = lo.min(disp + old.lb);
            hi = hi.max(disp + old.lb + n as isize * ext);
        }
        if lo > hi {
            (lo, hi) = (0, 0);
        }
        TypeMap {
            blocks: Cow::Owned(coalesce(blocks)),
            lb: lo,
            extent: (hi - lo) as usize,
            align: old.align,
            primitive: old.primitive,
        }
    }

    /// `MPI_Type_create_struct`: `blocklengths[i]` elements of `types[i]` at byte
    /// `displacements[i]`; the extent is rounded up to the strictest alignment inside.
    fn structured(blocklengths: &[usize], displacements: &[isize], types: &[&TypeMap]) -> TypeMap {
        let mut blocks = Vec::new();
        let (mut lo, mut hi) = (isize::MAX, isize::MIN);
        let mut align = 1;
        let mut primitive = types.first().and_then(|t| t.primitive);
        for ((&n, &disp), t) in blocklengths.iter().zip(displacements).zip(types) {
            let ext = t.extent as isize;
            for j in 0..n as isize {
                let base = disp + j * ext;
                blocks.extend(t.blocks.iter().map(|b| Block {
                    offset: base + b.offset,
                    len: b.len,
                }));
            }
            lo = lo.min(disp + t.lb);
            hi = hi.max(disp + t.lb + n as isize * ext);
            align = align.max(t.align);
            if t.primitive != primitive {
                primitive = None;
            }
        }
        if lo > hi {
            (lo, hi) = (0, 0);
        }
        let extent = ((hi - lo) as usize).div_ceil(align) * align;
        TypeMap {
            blocks: Cow::Owned(coalesce(blocks)),
            lb: lo,
            extent,
            align,
            primitive,
        }
    }
}

/// Merges blocks that continue one another, keeping their order.
fn coalesce(blocks: Vec<Block>) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::with_capacity(blocks.len());
    for b in blocks.into_iter().filter(|b| b.len > 0) {
        match out.last_mut() {
            Some(last) if last.offset + last.len as isize == b.offset => last.len += b.len,
            _ => out.push(b),
        }
    }
    out
}

/// A non-negative count as a `usize`; a negative one is a caller's error.
fn count(c: Count, what: &str) -> usize {
    usize::try_from(c).unwrap_or_else(|_| panic!("pagewire: negative {what} {c}"))
}

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

/// Constructors shared by [`UserDatatype`] and [`UncommittedUserDatatype`].
macro_rules! datatype_constructors {
    () => {
        /// `count` elements of `oldtype` one after another (`MPI_Type_contiguous`).
        pub fn contiguous<D: UncommittedDatatype>(count: Count, oldtype: &D) -> Self {
            let old = oldtype.type_map();
            let n = self::count(count, "count");
            Self::from_map(TypeMap::strided(1, n, 0, old))
        }

        /// `count` runs of `blocklength` elements of `oldtype`, `stride` elements apart
        /// (`MPI_Type_vector`).
        pub fn vector<D: UncommittedDatatype>(
            count: Count,
            blocklength: Count,
            stride: Count,
            oldtype: &D,
        ) -> Self {
            let old = oldtype.type_map();
            let stride = stride as isize * old.extent as isize;
            Self::heterogeneous_vector(count, blocklength, stride, oldtype)
        }

        /// [`Self::vector`] with the stride in bytes (`MPI_Type_create_hvector`).
        pub fn heterogeneous_vector<D: UncommittedDatatype>(
            count: Count,
            blocklength: Count,
            stride: Address,
            oldtype: &D,
        ) -> Self {
            let old = oldtype.type_map();
            let (n, b) = (
                self::count(count, "count"),
                self::count(blocklength, "blocklength"),
            );
            Self::from_map(TypeMap::strided(n, b, stride, old))
        }

        /// Runs of `blocklengths[i]` elements of `oldtype` at `displacements[i]` elements
        /// (`MPI_Type_indexed`).
        pub fn indexed<D: UncommittedDatatype>(
            blocklengths: &[Count],
            displacements: &[Count],
            oldtype: &D,
        ) -> Self {
            let ext = oldtype.type_map().extent() as isize;
            let bytes: Vec<Address> = displacements.iter().map(|&d| d as isize * ext).collect();
            Self::heterogeneous_indexed(blocklengths, &bytes, oldtype)
        }

        /// [`Self::indexed`] with the displacements in bytes (`MPI_Type_create_hindexed`).
        pub fn heterogeneous_indexed<D: UncommittedDatatype>(
            blocklengths: &[Count],
            displacements: &[Address],
            oldtype: &D,
        ) -> Self {
            assert_eq!(
                blocklengths.len(),
                displacements.len(),
                "pagewire: one displacement per block"
            );
            let runs = displacements
                .iter()
                .zip(blocklengths)
                .map(|(&d, &n)| (d, self::count(n, "blocklength")))
                .collect();
            Self::from_map(TypeMap::runs(runs, oldtype.type_map()))
        }

        /// Runs of `blocklength` elements of `oldtype` at `displacements[i]` elements
        /// (`MPI_Type_create_indexed_block`).
        pub fn indexed_block<D: UncommittedDatatype>(
            blocklength: Count,
            displacements: &[Count],
            oldtype: &D,
        ) -> Self {
            let lengths = vec![blocklength; displacements.len()];
            Self::indexed(&lengths, displacements, oldtype)
        }

        /// [`Self::indexed_block`] with the displacements in bytes
        /// (`MPI_Type_create_hindexed_block`).
        pub fn heterogeneous_indexed_block<D: UncommittedDatatype>(
            blocklength: Count,
            displacements: &[Address],
            oldtype: &D,
        ) -> Self {
            let lengths = vec![blocklength; displacements.len()];
            Self::heterogeneous_indexed(&lengths, displacements, oldtype)
        }

        /// `blocklengths[i]` elements of `types[i]` at byte `displacements[i]`
        /// (`MPI_Type_create_struct`); the extent is rounded up to the strictest alignment
        /// of the primitives inside, as MPI libraries do.
        pub fn structured<D: UncommittedDatatype>(
            blocklengths: &[Count],
            displacements: &[Address],
            types: &[D],
        ) -> Self {
            assert!(
                blocklengths.len() == displacements.len() && types.len() == displacements.len(),
                "pagewire: one block length, displacement and type per block"
            );
            let lengths: Vec<usize> = blocklengths
                .iter()
                .map(|&n| self::count(n, "blocklength"))
                .collect();
            let maps: Vec<&TypeMap> = types.iter().map(|t| t.type_map()).collect();
            Self::from_map(TypeMap::structured(&lengths, displacements, &maps))
        }

        /// The same blocks with the lower bound `lb` and the extent `extent` in bytes
        /// (`MPI_Type_create_resized`).
        pub fn resized<D: UncommittedDatatype>(oldtype: &D, lb: Address, extent: Address) -> Self {
            let mut map = oldtype.type_map().clone();
            map.lb = lb;
            map.extent = usize::try_from(extent).expect("pagewire: a negative extent");
            Self::from_map(map)
        }
    };
}

/// A datatype built from others (rsmpi's `UserDatatype`, a committed `MPI_Datatype`).
/// Cheap to clone; shared between threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDatatype(Arc<TypeMap>);

impl UserDatatype {
    datatype_constructors!();

    fn from_map(map: TypeMap) -> Self {
        UserDatatype(Arc::new(map))
    }

    /// The datatype borrowed.
    pub fn as_ref(&self) -> DatatypeRef<'_> {
        DatatypeRef(&self.0)
    }
}

impl UncommittedDatatype for UserDatatype {
    fn type_map(&self) -> &TypeMap {
        &self.0
    }
}
impl Datatype for UserDatatype {}

impl<'a> From<&'a UserDatatype> for DatatypeRef<'a> {
    fn from(d: &'a UserDatatype) -> Self {
        d.as_ref()
    }
}
impl<'a> From<&'a UserDatatype> for UncommittedDatatypeRef<'a> {
    fn from(d: &'a UserDatatype) -> Self {
        UncommittedDatatypeRef(&d.0)
    }
}

/// A datatype under construction, a part of others (rsmpi's `UncommittedUserDatatype`);
/// [`UncommittedUserDatatype::commit`] makes it usable for buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UncommittedUserDatatype(Arc<TypeMap>);

impl UncommittedUserDatatype {
    datatype_constructors!();

    fn from_map(map: TypeMap) -> Self {
        UncommittedUserDatatype(Arc::new(map))
    }

    /// The datatype, usable for buffers (`MPI_Type_commit`).
    pub fn commit(self) -> UserDatatype {
        UserDatatype(self.0)
    }

    /// The datatype borrowed.
    pub fn as_ref(&self) -> UncommittedDatatypeRef<'_> {
        UncommittedDatatypeRef(&self.0)
    }
}

impl UncommittedDatatype for UncommittedUserDatatype {
    fn type_map(&self) -> &TypeMap {
        &self.0
    }
}

impl<'a> From<&'a UncommittedUserDatatype> for UncommittedDatatypeRef<'a> {
    fn from(d: &'a UncommittedUserDatatype) -> Self {
        d.as_ref()
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

    #[test]
    fn vectors_leave_gaps_and_contiguous_runs_merge() {
        let v = UserDatatype::vector(2, 2, 3, &i32::equivalent_datatype());
        let m = v.type_map();
        assert_eq!(
            m.blocks(),
            &[Block { offset: 0, len: 8 }, Block { offset: 12, len: 8 }]
        );
        assert_eq!((m.extent(), m.size()), (20, 16));
        assert!(!m.is_contiguous());
        let c = UserDatatype::contiguous(3, &i32::equivalent_datatype());
        assert!(c.type_map().is_contiguous());
        assert_eq!(c.type_map().extent(), 12);
    }

    #[test]
    fn structs_keep_block_order_and_align_their_extent() {
        // [f32; 2] then u8: 9 bytes of data, extent rounded to 12.
        let t = UncommittedUserDatatype::structured(
            &[2, 1],
            &[0, 8],
            &[f32::equivalent_datatype(), u8::equivalent_datatype()],
        );
        assert_eq!(t.type_map().extent(), 12);
        assert_eq!(t.type_map().size(), 9);
        assert_eq!(t.type_map().primitive(), None);
        // Reversed order: the bytes travel in the order of the blocks.
        let r = UserDatatype::structured(&[1, 1], &[4, 0], &[i32::equivalent_datatype(); 2]);
        assert_eq!(
            r.type_map().blocks(),
            &[Block { offset: 4, len: 4 }, Block { offset: 0, len: 4 }]
        );
        assert_eq!(r.type_map().primitive(), Some(Primitive::I32));
    }

    #[test]
    fn indexed_and_resized() {
        let t = UserDatatype::indexed(&[1, 2], &[3, 0], &u16::equivalent_datatype());
        assert_eq!(
            t.type_map().blocks(),
            &[Block { offset: 6, len: 2 }, Block { offset: 0, len: 4 }]
        );
        assert_eq!(t.type_map().extent(), 8);
        let r = UserDatatype::resized(&t, 0, 16);
        assert_eq!(r.type_map().extent(), 16);
        assert_eq!(r.dup(), r);
    }
}
