//! The reduction operations of the collectives: the predefined ones ([`SystemOperation`],
//! `MPI_SUM` …, typed so that the bitwise ones do not compile with floats) and user-defined
//! ones ([`UserOperation`]).

use std::marker::PhantomData;

use pagewire_collectives::{self as coll, Element, Integer, Op, Operation};

/// A user-defined reduction (rsmpi's `UserOperation`): `UserOperation::commutative(f)` or
/// `UserOperation::associative(f)` (not commutative: combined in rank order), where
/// `f(invec, inoutvec)` sets `inoutvec[i] = invec[i] ∘ inoutvec[i]`, `invec` holding the
/// lower ranks' contribution (`MPI_User_function`).
pub type UserOperation<'f, T> = coll::UserOp<'f, T>;

/// Marks the arithmetic, comparison and logical [`SystemOperation`]s (any [`Element`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arithmetic {}

/// Marks the bitwise [`SystemOperation`]s (integers only, checked at compile time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bitwise {}

/// A predefined reduction (rsmpi's `SystemOperation`: `MPI_SUM` …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemOperation<K = Arithmetic> {
    op: Op,
    _kind: PhantomData<K>,
}

impl<K> SystemOperation<K> {
    const fn of(op: Op) -> Self {
        SystemOperation {
            op,
            _kind: PhantomData,
        }
    }

    /// The operation as `pagewire_collectives` names it.
    pub fn op(&self) -> Op {
        self.op
    }
}

impl SystemOperation<Arithmetic> {
    /// `MPI_MAX`.
    pub const fn max() -> Self {
        Self::of(Op::Max)
    }
    /// `MPI_MIN`.
    pub const fn min() -> Self {
        Self::of(Op::Min)
    }
    /// `MPI_SUM`.
    pub const fn sum() -> Self {
        Self::of(Op::Sum)
    }
    /// `MPI_PROD`.
    pub const fn product() -> Self {
        Self::of(Op::Product)
    }
    /// `MPI_LAND`.
    pub const fn logical_and() -> Self {
        Self::of(Op::LogicalAnd)
    }
    /// `MPI_LOR`.
    pub const fn logical_or() -> Self {
        Self::of(Op::LogicalOr)
    }
    /// `MPI_LXOR`.
    pub const fn logical_xor() -> Self {
        Self::of(Op::LogicalXor)
    }
}

impl SystemOperation<Bitwise> {
    /// `MPI_BAND`.
    pub const fn bitwise_and() -> Self {
        Self::of(Op::BitAnd)
    }
    /// `MPI_BOR`.
    pub const fn bitwise_or() -> Self {
        Self::of(Op::BitOr)
    }
    /// `MPI_BXOR`.
    pub const fn bitwise_xor() -> Self {
        Self::of(Op::BitXor)
    }
}

impl<T: Element> Operation<T> for SystemOperation<Arithmetic> {
    fn apply(&self, left: &[T], right: &mut [T]) {
        Operation::<T>::apply(&self.op, left, right)
    }
    fn is_commutative(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.op.mpi_name().into()
    }
    fn predefined(&self) -> Option<Op> {
        Some(self.op)
    }
}

impl<T: Integer> Operation<T> for SystemOperation<Bitwise> {
    fn apply(&self, left: &[T], right: &mut [T]) {
        Operation::<T>::apply(&self.op, left, right)
    }
    fn is_commutative(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.op.mpi_name().into()
    }
    fn predefined(&self) -> Option<Op> {
        Some(self.op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_operations_map_to_the_predefined_ones() {
        assert_eq!(SystemOperation::sum().op(), Op::Sum);
        assert_eq!(SystemOperation::logical_xor().op(), Op::LogicalXor);
        assert_eq!(SystemOperation::bitwise_or().op(), Op::BitOr);
        let mut r = [1.5f64, 2.0];
        Operation::<f64>::apply(&SystemOperation::max(), &[3.0, -1.0], &mut r);
        assert_eq!(r, [3.0, 2.0]);
        let mut r = [0b0110u8];
        Operation::<u8>::apply(&SystemOperation::bitwise_and(), &[0b0011], &mut r);
        assert_eq!(r, [0b0010]);
    }
}
