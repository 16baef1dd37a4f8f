//! Reduction operations: the predefined ones ([`Op`], and [`BitOp`] typed for integers) and
//! user closures ([`UserOp`]), behind one trait, [`Operation`].
//!
//! Every operation must be associative. Commutativity decides which algorithms may run:
//! the predefined operations are commutative; a [`UserOp`] says whether it is. Algorithms
//! that reorder operands (Rabenseifner's and the ring allreduce, recursive-halving and ring
//! reduce-scatter, the root-relative binomial reduce) run only for commutative operations;
//! a non-commutative operation gets an order-preserving algorithm whatever the tuning says
//! (see each algorithm's documentation), so the result is `x_0 ∘ x_1 ∘ … ∘ x_{p-1}` in
//! rank order, as MPI requires.

use crate::element::{Element, Integer};
use crate::{Error, Result};
use pagewire_transport::ErrorClass;

/// The predefined reduction operations (`MPI_SUM` … `MPI_BXOR`). Valid for every
/// [`Element`], except that the bitwise ones are rejected for floats when the collective
/// starts (on every rank alike, before any message) with [`Error::Invalid`] of class
/// `MPI_ERR_OP`; use
/// [`BitOp`] to have that checked at compile time instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `a + b` (`MPI_SUM`).
    Sum,
    /// `a * b` (`MPI_PROD`).
    Product,
    /// The minimum (`MPI_MIN`).
    Min,
    /// The maximum (`MPI_MAX`).
    Max,
    /// Logical and: 1 if both are non-zero, else 0 (`MPI_LAND`).
    LogicalAnd,
    /// Logical or (`MPI_LOR`).
    LogicalOr,
    /// Logical exclusive or (`MPI_LXOR`).
    LogicalXor,
    /// Bitwise and, integers only (`MPI_BAND`).
    BitAnd,
    /// Bitwise or, integers only (`MPI_BOR`).
    BitOr,
    /// Bitwise exclusive or, integers only (`MPI_BXOR`).
    BitXor,
    /// The origin's value replaces the target's (`MPI_REPLACE`): one-sided accumulates
    /// only, refused by the collectives.
    Replace,
    /// The target's value stays (`MPI_NO_OP`): one-sided fetching accumulates only,
    /// refused by the collectives.
    NoOp,
}

impl Op {
    /// The ten reductions, for tests and tables (not the one-sided `Replace` and `NoOp`).
    pub const ALL: [Op; 10] = [
        Op::Sum,
        Op::Product,
        Op::Min,
        Op::Max,
        Op::LogicalAnd,
        Op::LogicalOr,
        Op::LogicalXor,
        Op::BitAnd,
        Op::BitOr,
        Op::BitXor,
    ];

    /// The MPI name.
    pub fn mpi_name(self) -> &'static str {
        match self {
            Op::Sum => "MPI_SUM",
            Op::Product => "MPI_PROD",
            Op::Min => "MPI_MIN",
            Op::Max => "MPI_MAX",
            Op::LogicalAnd => "MPI_LAND",
            Op::LogicalOr => "MPI_LOR",
            Op::LogicalXor => "MPI_LXOR",
            Op::BitAnd => "MPI_BAND",
            Op::BitOr => "MPI_BOR",
            Op::BitXor => "MPI_BXOR",
            Op::Replace => "MPI_REPLACE",
            Op::NoOp => "MPI_NO_OP",
        }
    }

    /// Whether the operation is only for one-sided accumulates (`MPI_REPLACE`,
    /// `MPI_NO_OP`).
    pub fn is_one_sided_only(self) -> bool {
        matches!(self, Op::Replace | Op::NoOp)
    }

    /// Whether the operation is bitwise (integers only).
    pub fn is_bitwise(self) -> bool {
        matches!(self, Op::BitAnd | Op::BitOr | Op::BitXor)
    }

    /// `a ∘ b` for one pair of elements.
    #[inline]
    pub fn combine<T: Element>(self, a: T, b: T) -> T {
        match self {
            Op::Sum => T::sum(a, b),
            Op::Product => T::product(a, b),
            Op::Min => T::min(a, b),
            Op::Max => T::max(a, b),
            Op::LogicalAnd => T::from_truth(a.truth() && b.truth()),
            Op::LogicalOr => T::from_truth(a.truth() || b.truth()),
            Op::LogicalXor => T::from_truth(a.truth() != b.truth()),
            Op::BitAnd => T::bit_and(a, b),
            Op::BitOr => T::bit_or(a, b),
            Op::BitXor => T::bit_xor(a, b),
            Op::Replace => a,
            Op::NoOp => b,
        }
    }
}

/// One loop per operation, so each is a tight, vectorisable loop over the slices.
fn kernel<T: Element>(op: Op, left: &[T], right: &mut [T]) {
    assert_eq!(
        left.len(),
        right.len(),
        "reduction of slices of different lengths"
    );
    macro_rules! each {
        ($f:expr) => {
            for (r, &l) in right.iter_mut().zip(left) {
                *r = $f(l, *r);
            }
        };
    }
    match op {
        Op::Sum => each!(T::sum),
        Op::Product => each!(T::product),
        Op::Min => each!(T::min),
        Op::Max => each!(T::max),
        Op::LogicalAnd => each!(|a: T, b: T| T::from_truth(a.truth() && b.truth())),
        Op::LogicalOr => each!(|a: T, b: T| T::from_truth(a.truth() || b.truth())),
        Op::LogicalXor => each!(|a: T, b: T| T::from_truth(a.truth() != b.truth())),
        Op::BitAnd => each!(T::bit_and),
        Op::BitOr => each!(T::bit_or),
        Op::BitXor => each!(T::bit_xor),
        Op::Replace => right.copy_from_slice(left),
        Op::NoOp => {}
    }
}

/// The bitwise operations, typed so that only [`Integer`]s compile with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BitOp {
    /// Bitwise and (`MPI_BAND`).
    And,
    /// Bitwise or (`MPI_BOR`).
    Or,
    /// Bitwise exclusive or (`MPI_BXOR`).
    Xor,
}

impl BitOp {
    /// The same operation as an [`Op`].
    pub fn op(self) -> Op {
        match self {
            BitOp::And => Op::BitAnd,
            BitOp::Or => Op::BitOr,
            BitOp::Xor => Op::BitXor,
        }
    }
}

/// The closure behind a [`UserOp`].
type UserFn<'f, T> = dyn Fn(&[T], &mut [T]) + 'f;

/// A user-defined reduction: a closure with MPI's `MPI_User_function` contract,
/// `f(invec, inoutvec)` computes `inoutvec[i] = invec[i] ∘ inoutvec[i]` for every `i`,
/// where `invec` holds the contributions of the *lower* ranks. It must be associative;
/// [`UserOp::associative`] declares it non-commutative, and then every collective combines
/// in rank order (see the module documentation).
pub struct UserOp<'f, T> {
    f: Box<UserFn<'f, T>>,
    commutative: bool,
}

impl<T> std::fmt::Debug for UserOp<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserOp")
            .field("commutative", &self.commutative)
            .finish()
    }
}

impl<'f, T> UserOp<'f, T> {
    /// A commutative and associative operation (rsmpi's `UserOperation::commutative`).
    pub fn commutative(f: impl Fn(&[T], &mut [T]) + 'f) -> Self {
        UserOp {
            f: Box::new(f),
            commutative: true,
        }
    }

    /// An associative operation that may not commute (rsmpi's
    /// `UserOperation::associative`).
    pub fn associative(f: impl Fn(&[T], &mut [T]) + 'f) -> Self {
        UserOp {
            f: Box::new(f),
            commutative: false,
        }
    }
}

/// What the collectives accept as a reduction of `T`s.
pub trait Operation<T: Element> {
    /// `right[i] = left[i] ∘ right[i]`, where `left` holds lower ranks' contributions.
    fn apply(&self, left: &[T], right: &mut [T]);
    /// Whether `a ∘ b == b ∘ a` (the algorithms may then reorder operands).
    fn is_commutative(&self) -> bool;
    /// Rejects an operation that is not defined for `T` (called on every rank before any
    /// message).
    fn check(&self) -> Result<()> {
        Ok(())
    }
    /// A name for messages.
    fn describe(&self) -> String;
    /// The predefined operation this is, if it is one (`MPI_SUM` …): a layer that forwards
    /// reductions to a library with its own predefined operations (the facade's `mpi`
    /// transport) hands those over and combines anything else itself.
    fn predefined(&self) -> Option<Op> {
        None
    }
    /// How many `T`s make one element that the operation combines as a whole (a user
    /// operation over a struct of two `u64`s sees whole structs: 2). Algorithms that cut a
    /// buffer into blocks cut at multiples of it, so every [`Operation::apply`] gets whole
    /// elements; buffers hold a whole number of them. 1 for the predefined operations.
    fn granularity(&self) -> usize {
        1
    }
}

impl<T: Element> Operation<T> for Op {
    fn apply(&self, left: &[T], right: &mut [T]) {
        kernel(*self, left, right)
    }
    fn is_commutative(&self) -> bool {
        true
    }
    fn check(&self) -> Result<()> {
        if self.is_one_sided_only() {
            return Err(Error::invalid(
                ErrorClass::Op,
                format!(
                    "{} is for one-sided accumulates (windows) only, not for reductions",
                    self.mpi_name()
                ),
            ));
        }
        if self.is_bitwise() && !T::IS_INTEGER {
            return Err(Error::invalid(
                ErrorClass::Op,
                format!(
                    "{} is a bitwise operation, defined for integers only, not for {} (use \
                 BitOp to have this checked at compile time)",
                    self.mpi_name(),
                    T::RUST_NAME
                ),
            ));
        }
        Ok(())
    }
    fn describe(&self) -> String {
        self.mpi_name().to_string()
    }
    fn predefined(&self) -> Option<Op> {
        Some(*self)
    }
}

impl<T: Integer> Operation<T> for BitOp {
    fn apply(&self, left: &[T], right: &mut [T]) {
        kernel(self.op(), left, right)
    }
    fn is_commutative(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.op().mpi_name().to_string()
    }
    fn predefined(&self) -> Option<Op> {
        Some(self.op())
    }
}

impl<T: Element> Operation<T> for UserOp<'_, T> {
    fn apply(&self, left: &[T], right: &mut [T]) {
        assert_eq!(
            left.len(),
            right.len(),
            "reduction of slices of different lengths"
        );
        (self.f)(left, right)
    }
    fn is_commutative(&self) -> bool {
        self.commutative
    }
    fn describe(&self) -> String {
        if self.commutative {
            "a commutative user operation".into()
        } else {
            "a non-commutative user operation".into()
        }
    }
}

impl<T: Element, O: Operation<T> + ?Sized> Operation<T> for &O {
    fn apply(&self, left: &[T], right: &mut [T]) {
        (**self).apply(left, right)
    }
    fn is_commutative(&self) -> bool {
        (**self).is_commutative()
    }
    fn check(&self) -> Result<()> {
        (**self).check()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn predefined(&self) -> Option<Op> {
        (**self).predefined()
    }
    fn granularity(&self) -> usize {
        (**self).granularity()
    }
}

/// `left[i] = left[i] ∘ right[i]` (the result in the lower ranks' buffer). Commutative
/// operations swap the operands; others go through `scratch`.
pub(crate) fn apply_into_left<T: Element, O: Operation<T> + ?Sized>(
    op: &O,
    left: &mut [T],
    right: &[T],
    scratch: &mut Vec<T>,
) {
    if op.is_commutative() {
        op.apply(right, left);
    } else {
        scratch.clear();
        scratch.extend_from_slice(right);
        op.apply(left, scratch);
        left.copy_from_slice(scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predefined_operations_on_integers() {
        let a = [6i32, -3, 0, 12];
        let b = [3i32, 5, 0, 10];
        let run = |op: Op| {
            let mut r = b;
            Operation::<i32>::apply(&op, &a, &mut r);
            r
        };
        assert_eq!(run(Op::Sum), [9, 2, 0, 22]);
        assert_eq!(run(Op::Product), [18, -15, 0, 120]);
        assert_eq!(run(Op::Min), [3, -3, 0, 10]);
        assert_eq!(run(Op::Max), [6, 5, 0, 12]);
        assert_eq!(run(Op::LogicalAnd), [1, 1, 0, 1]);
        assert_eq!(run(Op::LogicalOr), [1, 1, 0, 1]);
        assert_eq!(run(Op::LogicalXor), [0, 0, 0, 0]);
        assert_eq!(run(Op::BitAnd), [6 & 3, -3 & 5, 0, 12 & 10]);
        assert_eq!(run(Op::BitOr), [6 | 3, -3 | 5, 0, 12 | 10]);
        assert_eq!(run(Op::BitXor), [6 ^ 3, -3 ^ 5, 0, 12 ^ 10]);
        let mut r = [0i32, 7];
        Operation::<i32>::apply(&Op::LogicalXor, &[3, 0], &mut r);
        assert_eq!(r, [1, 1]);
    }

    #[test]
    fn integer_arithmetic_wraps() {
        let mut r = [u8::MAX, 200];
        Operation::<u8>::apply(&Op::Sum, &[1, 100], &mut r);
        assert_eq!(r, [0, 44]);
        let mut r = [i8::MIN];
        Operation::<i8>::apply(&Op::Product, &[-1], &mut r);
        assert_eq!(r, [i8::MIN]);
    }

    #[test]
    fn predefined_operations_on_floats() {
        let mut r = [1.5f64, -2.0, 0.0];
        Operation::<f64>::apply(&Op::Sum, &[0.25, 4.0, 0.0], &mut r);
        assert_eq!(r, [1.75, 2.0, 0.0]);
        let mut r = [1.5f32, f32::NAN];
        Operation::<f32>::apply(&Op::Min, &[-1.0, 3.0], &mut r);
        assert_eq!(r, [-1.0, 3.0]);
        let mut r = [0.0f32, 2.0];
        Operation::<f32>::apply(&Op::LogicalOr, &[0.0, 0.0], &mut r);
        assert_eq!(r, [0.0, 1.0]);
    }

    #[test]
    fn bitwise_on_floats_is_rejected_with_a_clear_error() {
        let e = Operation::<f64>::check(&Op::BitOr).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("MPI_BOR") && msg.contains("f64"), "{msg}");
        assert!(Operation::<f64>::check(&Op::Max).is_ok());
        assert!(Operation::<u16>::check(&Op::BitXor).is_ok());
        let mut r = [0b1100u16];
        Operation::<u16>::apply(&BitOp::Xor, &[0b1010], &mut r);
        assert_eq!(r, [0b0110]);
    }

    #[test]
    fn user_operations_follow_mpi_argument_order() {
        // Non-commutative: "keep the left one" composes to the lowest rank's value.
        let first = UserOp::associative(|l: &[i64], r: &mut [i64]| r.copy_from_slice(l));
        let mut r = [2i64];
        first.apply(&[1], &mut r);
        assert_eq!(r, [1]);
        let mut left = [1i64];
        let mut scratch = Vec::new();
        apply_into_left(&first, &mut left, &[2], &mut scratch);
        assert_eq!(left, [1], "left ∘ right with the result in left");
        // Commutative ones swap operands instead of copying.
        let add = UserOp::commutative(|l: &[i64], r: &mut [i64]| {
            for (a, b) in r.iter_mut().zip(l) {
                *a += b
            }
        });
        let mut left = [1i64, 2];
        apply_into_left(&add, &mut left, &[10, 20], &mut scratch);
        assert_eq!(left, [11, 22]);
        assert!(!first.is_commutative() && add.is_commutative());
    }
}
