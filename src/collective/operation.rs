//! The reduction operations of the collectives (rsmpi's `Operation`): the predefined ones
//! ([`SystemOperation`], `MPI_SUM` …), user closures on [`DynBuffer`]s ([`UserOperation`])
//! and C functions ([`UnsafeUserOperation`]).
//!
//! Reductions combine the elements of a buffer whose datatype is made of one primitive (a
//! number, or `bool`); the element type is found at run time from the datatype, as MPI does,
//! and the combining runs typed on it ([`Adapter`]). A predefined operation that MPI does
//! not define for the type (bitwise on floats) is an error on every rank before any message.

use std::ffi::c_int;
use std::marker::PhantomData;

use pagewire_collectives::{self as coll, Element, Op};

use crate::datatype::{
    with_user_elements, AsDatatype, Buffer, BufferMut, DatatypeRef, DynBuffer, DynBufferMut,
    Landing, Primitive, TypeMap, UncommittedDatatype,
};
use crate::error::{fatal, Error, Result};
use crate::ffi::{MPI_Datatype, MPI_User_function};
use crate::ErrorClass;

/// A reduction operation (rsmpi's `Operation`).
pub trait Operation {
    /// What the operation is.
    fn reduction(&self) -> Reduction<'_>;
    /// Whether `a ∘ b == b ∘ a`.
    fn is_commutative(&self) -> bool {
        match self.reduction() {
            Reduction::System(_) => true,
            Reduction::User(u) => u.commutative,
            Reduction::Unsafe(u) => u.commutative,
        }
    }
}

/// What an [`Operation`] is.
#[derive(Clone, Copy, Debug)]
pub enum Reduction<'o> {
    /// A predefined operation.
    System(Op),
    /// A closure.
    User(&'o UserOperation<'o>),
    /// A C function.
    Unsafe(&'o UnsafeUserOperation),
}

/// A predefined reduction (rsmpi's `SystemOperation`: `MPI_SUM` …). The bitwise ones are
/// defined for integers only: on floats they are an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemOperation(Op);

impl SystemOperation {
    /// `MPI_MAX`.
    pub const fn max() -> Self {
        SystemOperation(Op::Max)
    }
    /// `MPI_MIN`.
    pub const fn min() -> Self {
        SystemOperation(Op::Min)
    }
    /// `MPI_SUM`.
    pub const fn sum() -> Self {
        SystemOperation(Op::Sum)
    }
    /// `MPI_PROD`.
    pub const fn product() -> Self {
        SystemOperation(Op::Product)
    }
    /// `MPI_LAND`.
    pub const fn logical_and() -> Self {
        SystemOperation(Op::LogicalAnd)
    }
    /// `MPI_LOR`.
    pub const fn logical_or() -> Self {
        SystemOperation(Op::LogicalOr)
    }
    /// `MPI_LXOR`.
    pub const fn logical_xor() -> Self {
        SystemOperation(Op::LogicalXor)
    }
    /// `MPI_BAND`.
    pub const fn bitwise_and() -> Self {
        SystemOperation(Op::BitAnd)
    }
    /// `MPI_BOR`.
    pub const fn bitwise_or() -> Self {
        SystemOperation(Op::BitOr)
    }
    /// `MPI_BXOR`.
    pub const fn bitwise_xor() -> Self {
        SystemOperation(Op::BitXor)
    }
    /// `MPI_REPLACE`: in a window's accumulate, the origin's value replaces the target's
    /// (an atomic put). Refused by the collectives.
    pub const fn replace() -> Self {
        SystemOperation(Op::Replace)
    }
    /// `MPI_NO_OP`: in a window's fetching accumulate, the target's value stays (an atomic
    /// get). Refused by the collectives.
    pub const fn no_op() -> Self {
        SystemOperation(Op::NoOp)
    }
    /// The operation as `pagewire_collectives` names it.
    pub fn op(&self) -> Op {
        self.0
    }
}

impl Operation for SystemOperation {
    fn reduction(&self) -> Reduction<'_> {
        Reduction::System(self.0)
    }
}
impl Operation for &SystemOperation {
    fn reduction(&self) -> Reduction<'_> {
        Reduction::System(self.0)
    }
}

/// The closure of a [`UserOperation`]: `f(invec, inoutvec)` sets `inoutvec[i] = invec[i] ∘
/// inoutvec[i]`, `invec` holding the lower ranks' contribution.
type UserFunction<'f> = dyn Fn(DynBuffer, DynBufferMut) + 'f;

/// A user-defined reduction (rsmpi's `UserOperation`): a closure on [`DynBuffer`]s, which
/// it downcasts to the element type.
pub struct UserOperation<'f> {
    function: Box<UserFunction<'f>>,
    commutative: bool,
}

impl std::fmt::Debug for UserOperation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserOperation")
            .field("commutative", &self.commutative)
            .finish()
    }
}

impl<'f> UserOperation<'f> {
    /// An associative operation that may not commute: contributions are combined in rank
    /// order.
    pub fn associative<F: Fn(DynBuffer, DynBufferMut) + 'f>(function: F) -> Self {
        UserOperation {
            function: Box::new(function),
            commutative: false,
        }
    }
    /// A commutative and associative operation.
    pub fn commutative<F: Fn(DynBuffer, DynBufferMut) + 'f>(function: F) -> Self {
        UserOperation {
            function: Box::new(function),
            commutative: true,
        }
    }
}

impl<'f> Operation for &'f UserOperation<'f> {
    fn reduction(&self) -> Reduction<'_> {
        Reduction::User(self)
    }
}

/// A user-defined reduction that is a C function (rsmpi's `UnsafeUserOperation`,
/// `MPI_User_function`).
#[derive(Debug)]
pub struct UnsafeUserOperation {
    function: MPI_User_function,
    commutative: bool,
}

impl UnsafeUserOperation {
    /// An associative operation that may not commute.
    ///
    /// # Safety
    ///
    /// `function` must combine `*len` elements of the datatype it is given, reading
    /// `invec` and writing `inoutvec` only.
    #[allow(unsafe_code)]
    pub unsafe fn associative(function: MPI_User_function) -> Self {
        UnsafeUserOperation {
            function,
            commutative: false,
        }
    }
    /// A commutative and associative operation.
    ///
    /// # Safety
    ///
    /// As [`UnsafeUserOperation::associative`].
    #[allow(unsafe_code)]
    pub unsafe fn commutative(function: MPI_User_function) -> Self {
        UnsafeUserOperation {
            function,
            commutative: true,
        }
    }
}

impl Operation for &UnsafeUserOperation {
    fn reduction(&self) -> Reduction<'_> {
        Reduction::Unsafe(self)
    }
}

/// An [`Operation`] as the collective algorithms take it: on the packed bytes of a buffer of
/// `datatype` (the one the user passed), cut into elements of type `T`. A predefined
/// operation combines the `T`s one by one; a user operation sees whole elements of
/// `datatype`, laid out as it describes them, `granularity` `T`s each.
pub(crate) struct Adapter<'o, T> {
    reduction: Reduction<'o>,
    datatype: DatatypeRef<'o>,
    /// `T`s per element of `datatype`.
    granularity: usize,
    _type: PhantomData<T>,
}

impl<'o, T: Element> Adapter<'o, T> {
    /// `reduction` on buffers of `datatype`, whose packed bytes travel as `T`s
    /// ([`unit_of`] chose `T`).
    pub(crate) fn new(reduction: Reduction<'o>, datatype: DatatypeRef<'o>) -> Self {
        let size = datatype.type_map().size();
        Adapter {
            reduction,
            datatype,
            granularity: (size / std::mem::size_of::<T>()).max(1),
            _type: PhantomData,
        }
    }
}

impl<T: Element> coll::Operation<T> for Adapter<'_, T> {
    fn apply(&self, left: &[T], right: &mut [T]) {
        debug_assert_eq!(left.len() % self.granularity, 0, "whole elements");
        let (l, r) = (bytemuck::cast_slice(left), bytemuck::cast_slice_mut(right));
        match self.reduction {
            Reduction::System(op) => coll::Operation::<T>::apply(&op, left, right),
            Reduction::User(u) => {
                with_user_elements(self.datatype, l, r, |l, r| (u.function)(l, r))
            }
            Reduction::Unsafe(u) => {
                with_user_elements(self.datatype, l, r, |l, r| call_c(u.function, l, r))
            }
        }
    }
    fn is_commutative(&self) -> bool {
        match self.reduction {
            Reduction::System(_) => true,
            Reduction::User(u) => u.commutative,
            Reduction::Unsafe(u) => u.commutative,
        }
    }
    fn check(&self) -> pagewire_transport::Result<()> {
        match self.reduction {
            Reduction::System(op) => match self.datatype.type_map().primitive() {
                Some(Primitive::Bool) if !is_logical(op) => {
                    Err(pagewire_transport::Error::invalid(
                        ErrorClass::Op,
                        format!(
                            "{} is not defined for bool; the logical operations are",
                            op.mpi_name()
                        ),
                    ))
                }
                _ => coll::Operation::<T>::check(&op),
            },
            _ => Ok(()),
        }
    }
    fn describe(&self) -> String {
        match self.reduction {
            Reduction::System(op) => op.mpi_name().into(),
            Reduction::User(_) => "a user operation".into(),
            Reduction::Unsafe(_) => "a user C function".into(),
        }
    }
    fn predefined(&self) -> Option<Op> {
        match self.reduction {
            Reduction::System(op) => Some(op),
            _ => None,
        }
    }
    fn granularity(&self) -> usize {
        self.granularity
    }
}

fn is_logical(op: Op) -> bool {
    matches!(op, Op::LogicalAnd | Op::LogicalOr | Op::LogicalXor)
}

/// Calls a C reduction function on `left` and `right`, with their length and datatype.
#[allow(unsafe_code)]
fn call_c(f: MPI_User_function, left: DynBuffer<'_>, mut right: DynBufferMut<'_>) {
    let mut len = c_int::try_from(left.len().min(right.len())).expect("a count below 2^31");
    let datatype = left.as_datatype();
    let map: &TypeMap = datatype.type_map();
    let mut handle = MPI_Datatype(std::ptr::from_ref(map).cast());
    // SAFETY: `UnsafeUserOperation`'s constructors are `unsafe`: their callers promised that
    // `f` reads `len` elements of the datatype at `invec` and writes `len` at `inoutvec`,
    // which both hold.
    unsafe {
        f(
            left.as_ptr().cast_mut(),
            right.as_mut_ptr(),
            &mut len,
            &mut handle,
        )
    }
}

/// Which element type the collective algorithms run a reduction on, for a primitive.
macro_rules! with_element {
    ($p:expr, $t:ident => $body:expr) => {
        match $p {
            Primitive::Bool | Primitive::U8 => {
                type $t = u8;
                $body
            }
            Primitive::I8 => {
                type $t = i8;
                $body
            }
            Primitive::I16 => {
                type $t = i16;
                $body
            }
            Primitive::U16 => {
                type $t = u16;
                $body
            }
            Primitive::I32 => {
                type $t = i32;
                $body
            }
            Primitive::U32 => {
                type $t = u32;
                $body
            }
            Primitive::I64 => {
                type $t = i64;
                $body
            }
            Primitive::U64 => {
                type $t = u64;
                $body
            }
            Primitive::F32 => {
                type $t = f32;
                $body
            }
            Primitive::F64 => {
                type $t = f64;
                $body
            }
            Primitive::Complex32 | Primitive::Complex64 => {
                return Err(Error::NotSupported(
                    "reductions of complex numbers are not supported".into(),
                ))
            }
        }
    };
}
pub(crate) use with_element;

/// The primitive whose type the collective algorithms cut a reduction's packed bytes into
/// ([`with_element`]). A predefined operation combines primitives, so its datatype must be
/// made of one (a number or `bool`, as MPI requires); a user operation combines whole
/// elements of any datatype, which travel as their primitive where they have one (complex
/// numbers as their parts), else as bytes.
pub(crate) fn unit_of(map: &TypeMap, reduction: Reduction<'_>) -> Result<Primitive> {
    match (reduction, map.primitive()) {
        (Reduction::System(_), Some(p)) => Ok(p),
        (Reduction::System(op), None) => Err(Error::invalid(
            ErrorClass::Type,
            format!(
                "{} needs a datatype made of one primitive type (a number or bool); this one \
             mixes several (a user operation can combine it)",
                op.mpi_name()
            ),
        )),
        (_, Some(Primitive::Complex32)) => Ok(Primitive::F32),
        (_, Some(Primitive::Complex64)) => Ok(Primitive::F64),
        (_, Some(p)) => Ok(p),
        (_, None) => Ok(Primitive::U8),
    }
}

/// Combines `input` into `inout` with `op` locally (`MPI_Reduce_local`): `inout[i] =
/// input[i] ∘ inout[i]`. Panics on error.
pub fn reduce_local_into<S, R, O>(input: &S, inout: &mut R, op: O)
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    fatal(try_reduce_local_into(input, inout, op))
}

/// [`reduce_local_into`], returning errors.
pub fn try_reduce_local_into<S, R, O>(input: &S, inout: &mut R, op: O) -> Result<()>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let left = crate::datatype::packed(input);
    let datatype = input.as_datatype();
    let mut landing = Landing::new(inout);
    let mut right = vec![0u8; landing.packed_len()];
    // The current value of `inout`, packed: its blocks' bytes.
    landing.read_into(&mut right);
    let combined = combine_bytes(datatype.type_map(), op.reduction(), &[&left, &right])?;
    landing.unpack(&combined);
    Ok(())
}

/// `bytes` as elements of `T` (copied: the bytes need not be aligned for `T`).
pub(crate) fn elements_of<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>().max(1);
    let mut v = vec![T::zeroed(); n];
    bytemuck::cast_slice_mut::<T, u8>(&mut v)
        .copy_from_slice(&bytes[..n * std::mem::size_of::<T>()]);
    v
}

/// The reduction of `parts` (packed contributions of elements of `map`, in rank order) with
/// `reduction`, as bytes: `parts[0] ∘ parts[1] ∘ …`.
pub(crate) fn combine_bytes(
    map: &TypeMap,
    reduction: Reduction<'_>,
    parts: &[&[u8]],
) -> Result<Vec<u8>> {
    with_element!(unit_of(map, reduction)?, T => {
        let op = Adapter::<T>::new(reduction, DatatypeRef::of_map(map));
        coll::Operation::<T>::check(&op)?;
        let Some((last, lower)) = parts.split_last() else {
            return Ok(Vec::new());
        };
        let mut acc: Vec<T> = elements_of(last);
        for part in lower.iter().rev() {
            let left: Vec<T> = elements_of(part);
            if left.len() != acc.len() {
                return Err(Error::invalid(ErrorClass::Count, format!(
                    "reduction contributions of {} and {} elements",
                    left.len(),
                    acc.len()
                )));
            }
            coll::Operation::<T>::apply(&op, &left, &mut acc);
        }
        Ok(bytemuck::cast_slice(&acc).to_vec())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;

    #[test]
    // `&SystemOperation` is passed on purpose: rsmpi programs do.
    #[allow(clippy::needless_borrows_for_generic_args)]
    fn local_reductions_of_each_kind() {
        let (a, mut c) = (0b1100u16, 0b1010u16);
        reduce_local_into(&a, &mut c, SystemOperation::bitwise_and());
        assert_eq!(c, 0b1000);
        let mut f = [1.5f64, 2.0];
        reduce_local_into(&[3.0f64, -1.0][..], &mut f[..], &SystemOperation::max());
        assert_eq!(f, [3.0, 2.0]);
        let e = try_reduce_local_into(&1.0f32, &mut 2.0f32, SystemOperation::bitwise_or());
        assert!(e.is_err(), "bitwise on floats is an error");
        let concat = UserOperation::associative(|x, y| {
            let x: &[i32] = x.downcast().unwrap();
            let y: &mut [i32] = y.downcast().unwrap();
            for (xi, yi) in x.iter().zip(y) {
                *yi += *xi * 10;
            }
        });
        let mut r = 2i32;
        reduce_local_into(&1i32, &mut r, &concat);
        assert_eq!(r, 12, "invec is the left operand");
        let mut t = true;
        reduce_local_into(&false, &mut t, SystemOperation::logical_and());
        assert!(!t);
        assert!(!(&concat).is_commutative());
    }

    #[allow(unsafe_code)]
    unsafe extern "C" fn add_i32(
        a: *mut c_void,
        b: *mut c_void,
        n: *mut c_int,
        _: *mut MPI_Datatype,
    ) {
        // SAFETY: called by `call_c` with `n` elements at both.
        unsafe {
            let x = std::slice::from_raw_parts(a as *const i32, *n as usize);
            let y = std::slice::from_raw_parts_mut(b as *mut i32, *n as usize);
            for (xi, yi) in x.iter().zip(y) {
                *yi += xi;
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn c_functions_combine() {
        // SAFETY: `add_i32` reads and writes `len` i32s.
        let op = unsafe { UnsafeUserOperation::commutative(add_i32) };
        let mut r = [1i32, 2];
        reduce_local_into(&[10i32, 20][..], &mut r[..], &op);
        assert_eq!(r, [11, 22]);
    }
}
