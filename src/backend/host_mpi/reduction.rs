//! Which reductions the host MPI library does itself: MPI defines logical and bitwise
//! operations for integers only, has no datatype for 128-bit integers, and (as Debian
//! packages MPICH 4.0.2) orders unsigned integers wrongly. What it does not do, the facade
//! combines itself (`combine.rs`).

use pagewire_collectives::{Element, Op};

use super::ffi;
use crate::error::{Error, Result};
use crate::ErrorClass;

/// Fails unless MPI defines `op` for `T`'s type class (integers, floats).
pub(super) fn check<T: Element>(op: Op) -> Result<()> {
    if op.is_one_sided_only() {
        return Err(Error::invalid(
            ErrorClass::Op,
            format!(
                "{} is for one-sided accumulates (windows) only, not for reductions",
                op.mpi_name()
            ),
        ));
    }
    let integer_only = !matches!(op, Op::Sum | Op::Product | Op::Min | Op::Max);
    if integer_only && !T::IS_INTEGER {
        return Err(Error::invalid(
            ErrorClass::Op,
            format!(
                "{} on {}: MPI defines logical and bitwise reductions for integers only",
                op.mpi_name(),
                T::RUST_NAME
            ),
        ));
    }
    Ok(())
}

/// Whether [`HostMpi`](super::HostMpi)'s reductions take `op` on `T`s: MPI has a datatype
/// for `T` and defines `op` for its type class. Otherwise they return
/// an [`Error::Invalid`] of class `MPI_ERR_OP`, and a caller that needs the reduction anyway moves the data
/// with MPI and combines it itself (as the facade does).
///
/// Minimum and maximum of unsigned integers are not handed to MPI either: MPICH 4.0.2 as
/// Debian packages it (ch4:ucx) compares `MPI_UINT8_T` … `MPI_UINT64_T` and
/// `MPI_UNSIGNED_CHAR` as if they were signed (`MPI_MIN` of 100 and 200 as `MPI_UINT8_T`
/// gives 200), which the collective suite caught under `mpirun`.
pub fn reduces_natively<T: Element>(op: Op) -> bool {
    let unsigned_order = matches!(op, Op::Min | Op::Max) && T::IS_INTEGER && !is_signed::<T>();
    !unsigned_order && check::<T>(op).is_ok() && ffi::has_datatype::<T>()
}

/// Whether the integer type `T` is signed: its all-ones bit pattern is -1, below zero
/// (an unsigned type's is its maximum). `Element` has no arithmetic to ask otherwise.
fn is_signed<T: Element>() -> bool {
    let mut all_ones = T::zeroed();
    bytemuck::bytes_of_mut(&mut all_ones).fill(0xff);
    all_ones < T::zeroed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_follow_mpis_type_classes() {
        for op in Op::ALL {
            assert!(check::<i32>(op).is_ok(), "{op:?} on i32");
        }
        assert!(check::<f64>(Op::Sum).is_ok());
        assert!(check::<f32>(Op::Max).is_ok());
        let e = check::<f64>(Op::LogicalAnd)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("MPI_LAND on f64"), "{e}");
        assert!(check::<f32>(Op::BitXor).is_err());
    }

    #[test]
    fn unsigned_order_and_what_mpi_lacks_are_combined_by_the_caller() {
        assert!(reduces_natively::<f32>(Op::Sum));
        assert!(reduces_natively::<i8>(Op::Min));
        assert!(reduces_natively::<u32>(Op::Sum));
        assert!(reduces_natively::<u64>(Op::BitXor));
        assert!(
            !reduces_natively::<u8>(Op::Min),
            "MPICH 4.0.2 orders it as signed"
        );
        assert!(!reduces_natively::<usize>(Op::Max));
        assert!(!reduces_natively::<f64>(Op::LogicalAnd));
        assert!(is_signed::<i64>() && is_signed::<isize>() && !is_signed::<u16>());
    }
}
