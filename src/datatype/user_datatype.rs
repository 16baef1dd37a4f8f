//! The datatypes built from others (`MPI_Type_contiguous`, `vector`, `indexed`,
//! `create_struct`, `create_resized` …): [`UserDatatype`] and [`UncommittedUserDatatype`],
//! which share their constructors.

use std::sync::Arc;

use super::{
    Address, Count, Datatype, DatatypeRef, TypeMap, UncommittedDatatype, UncommittedDatatypeRef,
};

/// A non-negative count as a `usize`; a negative one is a caller's error.
fn count(c: Count, what: &str) -> usize {
    usize::try_from(c).unwrap_or_else(|_| panic!("pagewire: negative {what} {c}"))
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
pub struct UserDatatype(pub(super) Arc<TypeMap>);

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

#[cfg(test)]
mod tests {
    use super::{UncommittedUserDatatype, UserDatatype};
    use crate::datatype::{Block, Equivalence, Primitive, UncommittedDatatype};

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
