//! The host MPI library's error classes as pagewire's [`ErrorClass`]: MPICH and Open MPI
//! number the classes differently, so an error from the host keeps the class by name.

use mpi::ffi;

use crate::ErrorClass;

/// The host library's class constants beside pagewire's. Classes the host may return that
/// pagewire has no name for (the file classes of MPI-IO, which pagewire does not expose) map
/// to [`ErrorClass::Other`]. `MPI_ERR_PROC_ABORTED` is left out: Open MPI 4.1's header does
/// not define it.
const HOST_CLASSES: [(u32, ErrorClass); 39] = [
    (ffi::MPI_ERR_BUFFER, ErrorClass::Buffer),
    (ffi::MPI_ERR_COUNT, ErrorClass::Count),
    (ffi::MPI_ERR_TYPE, ErrorClass::Type),
    (ffi::MPI_ERR_TAG, ErrorClass::Tag),
    (ffi::MPI_ERR_COMM, ErrorClass::Comm),
    (ffi::MPI_ERR_RANK, ErrorClass::Rank),
    (ffi::MPI_ERR_REQUEST, ErrorClass::Request),
    (ffi::MPI_ERR_ROOT, ErrorClass::Root),
    (ffi::MPI_ERR_GROUP, ErrorClass::Group),
    (ffi::MPI_ERR_OP, ErrorClass::Op),
    (ffi::MPI_ERR_TOPOLOGY, ErrorClass::Topology),
    (ffi::MPI_ERR_DIMS, ErrorClass::Dims),
    (ffi::MPI_ERR_ARG, ErrorClass::Arg),
    (ffi::MPI_ERR_UNKNOWN, ErrorClass::Unknown),
    (ffi::MPI_ERR_TRUNCATE, ErrorClass::Truncate),
    (ffi::MPI_ERR_OTHER, ErrorClass::Other),
    (ffi::MPI_ERR_INTERN, ErrorClass::Intern),
    (ffi::MPI_ERR_IN_STATUS, ErrorClass::InStatus),
    (ffi::MPI_ERR_PENDING, ErrorClass::Pending),
    (ffi::MPI_ERR_INFO, ErrorClass::Info),
    (ffi::MPI_ERR_KEYVAL, ErrorClass::Keyval),
    (ffi::MPI_ERR_NO_MEM, ErrorClass::NoMem),
    (ffi::MPI_ERR_BASE, ErrorClass::Base),
    (ffi::MPI_ERR_SIZE, ErrorClass::Size),
    (ffi::MPI_ERR_DISP, ErrorClass::Disp),
    (ffi::MPI_ERR_LOCKTYPE, ErrorClass::Locktype),
    (ffi::MPI_ERR_ASSERT, ErrorClass::Assert),
    (ffi::MPI_ERR_WIN, ErrorClass::Win),
    (ffi::MPI_ERR_RMA_CONFLICT, ErrorClass::RmaConflict),
    (ffi::MPI_ERR_RMA_SYNC, ErrorClass::RmaSync),
    (ffi::MPI_ERR_RMA_RANGE, ErrorClass::RmaRange),
    (ffi::MPI_ERR_RMA_ATTACH, ErrorClass::RmaAttach),
    (ffi::MPI_ERR_RMA_SHARED, ErrorClass::RmaShared),
    (ffi::MPI_ERR_RMA_FLAVOR, ErrorClass::RmaFlavor),
    (ffi::MPI_ERR_SPAWN, ErrorClass::Spawn),
    (ffi::MPI_ERR_PORT, ErrorClass::Port),
    (ffi::MPI_ERR_SERVICE, ErrorClass::Service),
    (ffi::MPI_ERR_NAME, ErrorClass::Name),
    (
        ffi::MPI_ERR_UNSUPPORTED_OPERATION,
        ErrorClass::UnsupportedOperation,
    ),
];

/// pagewire's name for the host library's error class `host_class` (what `MPI_Error_class`
/// returned).
pub(super) fn from_host(host_class: i32) -> ErrorClass {
    HOST_CLASSES
        .iter()
        .find(|(c, _)| i64::from(*c) == i64::from(host_class))
        .map_or(ErrorClass::Other, |&(_, class)| class)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_class_has_its_own_name() {
        for (i, (code, class)) in HOST_CLASSES.iter().enumerate() {
            assert_eq!(from_host(*code as i32), *class);
            assert!(
                HOST_CLASSES[..i]
                    .iter()
                    .all(|(c, k)| c != code && k != class),
                "{class} listed twice"
            );
            assert!(class.mpi_name().starts_with("MPI_ERR_"));
        }
        assert_eq!(
            from_host(ffi::MPI_ERR_LASTCODE as i32 + 1),
            ErrorClass::Other
        );
    }
}
