//! The element types reductions work on: every Rust primitive integer and float, and
//! nothing else. [`Element`] is sealed, so reducing a type without an implementation does
//! not compile:
//!
//! ```compile_fail,E0277
//! use pagewire_collectives::{Element, Op, Operation};
//! #[derive(Clone, Copy)]
//! struct Point { x: f64, y: f64 }
//! fn needs_element<T: Element>(_: &[T]) {}
//! needs_element(&[Point { x: 0.0, y: 0.0 }]);
//! ```
//!
//! Bitwise operations are typed for [`Integer`]s only ([`crate::BitOp`]); a float does not
//! compile with them:
//!
//! ```compile_fail,E0277
//! use pagewire_collectives::{BitOp, Operation};
//! fn reduce_with<T: pagewire_collectives::Element, O: Operation<T>>(_: &[T], _: O) {}
//! reduce_with(&[1.0f64], BitOp::Or);
//! ```

mod sealed {
    pub trait Sealed {}
}

/// A primitive integer or float that reductions combine: `u8`..`u128`, `i8`..`i128`,
/// `usize`, `isize`, `f32`, `f64`.
///
/// Integer arithmetic wraps (MPI leaves overflow undefined; wrapping keeps it defined and
/// free of debug-build panics). Logical operations treat non-zero as true and produce 1 or
/// 0 (MPI defines `MPI_LAND` and friends on integers; floats are accepted as an
/// extension). Min and max of floats follow `f64::min`/`f64::max` (a NaN loses to a
/// number).
pub trait Element:
    bytemuck::Pod + PartialOrd + Send + Sync + std::fmt::Debug + sealed::Sealed
{
    /// The Rust name of the type, for messages.
    const RUST_NAME: &'static str;
    /// Whether the type is an integer (bitwise operations are defined).
    const IS_INTEGER: bool;
    /// `a + b`.
    fn sum(a: Self, b: Self) -> Self;
    /// `a * b`.
    fn product(a: Self, b: Self) -> Self;
    /// The smaller of `a` and `b`.
    fn min(a: Self, b: Self) -> Self;
    /// The larger of `a` and `b`.
    fn max(a: Self, b: Self) -> Self;
    /// Whether the value is non-zero.
    fn truth(self) -> bool;
    /// 1 for true, 0 for false.
    fn from_truth(t: bool) -> Self;
    #[doc(hidden)]
    /// Bitwise and of the representations (used for [`Integer`]s only).
    fn bit_and(a: Self, b: Self) -> Self;
    #[doc(hidden)]
    /// Bitwise or of the representations (used for [`Integer`]s only).
    fn bit_or(a: Self, b: Self) -> Self;
    #[doc(hidden)]
    /// Bitwise exclusive or of the representations (used for [`Integer`]s only).
    fn bit_xor(a: Self, b: Self) -> Self;
}

/// The primitive integers: the types bitwise operations are defined on.
pub trait Integer: Element {}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const RUST_NAME: &'static str = stringify!($t);
            const IS_INTEGER: bool = true;
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn product(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            #[inline(always)]
            fn truth(self) -> bool { self != 0 }
            #[inline(always)]
            fn from_truth(t: bool) -> Self { t as $t }
            #[inline(always)]
            fn bit_and(a: Self, b: Self) -> Self { a & b }
            #[inline(always)]
            fn bit_or(a: Self, b: Self) -> Self { a | b }
            #[inline(always)]
            fn bit_xor(a: Self, b: Self) -> Self { a ^ b }
        }
        impl Integer for $t {}
    )*};
}

macro_rules! float {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const RUST_NAME: &'static str = stringify!($t);
            const IS_INTEGER: bool = false;
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn product(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { a.min(b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { a.max(b) }
            #[inline(always)]
            fn truth(self) -> bool { self != 0.0 }
            #[inline(always)]
            fn from_truth(t: bool) -> Self { if t { 1.0 } else { 0.0 } }
            fn bit_and(a: Self, b: Self) -> Self { <$t>::from_bits(a.to_bits() & b.to_bits()) }
            fn bit_or(a: Self, b: Self) -> Self { <$t>::from_bits(a.to_bits() | b.to_bits()) }
            fn bit_xor(a: Self, b: Self) -> Self { <$t>::from_bits(a.to_bits() ^ b.to_bits()) }
        }
    )*};
}

integer!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);
float!(f32, f64);
