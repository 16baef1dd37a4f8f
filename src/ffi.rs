//! The C-level types that rsmpi programs name in `extern "C"` reduction functions
//! ([`crate::collective::UnsafeUserOperation`]). pagewire has no C library underneath; these
//! are its own handles, laid out as C pointers.

use std::ffi::c_void;

/// A datatype handle as a C reduction function receives it: the address of the datatype's
/// type map (`crate::datatype::TypeMap`), opaque to the function.
#[allow(non_camel_case_types)]
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct MPI_Datatype(pub *const c_void);

/// A reduction function in C's calling convention (`MPI_User_function`):
/// `inoutvec[i] = invec[i] ∘ inoutvec[i]` for `*len` elements.
#[allow(non_camel_case_types)]
pub type MPI_User_function = unsafe extern "C" fn(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut std::ffi::c_int,
    datatype: *mut MPI_Datatype,
);
