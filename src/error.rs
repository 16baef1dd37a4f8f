//! The facade's errors: the lower layers' [`Error`] and [`Result`], and [`fatal`], which makes
//! of an error the panic that MPI's default handler (`MPI_ERRORS_ARE_FATAL`) would.

pub use pagewire_transport::{Error, Result};

/// The value of `r`, or a panic with its error (`pagewire: …`): what every call of the facade
/// without `try_` does with the error its `try_` twin returns.
pub(crate) fn fatal<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("pagewire: {e}"))
}
