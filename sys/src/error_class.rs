//! [`ErrorClass`], MPI's classes of errors (`MPI_ERR_*`): what MPI programs test
//! (`MPI_Error_class`) to decide what to do. The facade gives each of its errors one
//! (`pagewire::Error::class`); the host MPI library's errors carry the class it gave them
//! ([`Error::Mpi`](crate::Error::Mpi)).

/// The MPI error class of an error (`MPI_ERR_*`, MPI 4.0 section 9.4): what an MPI program
/// tests with `MPI_Error_class` to decide what to do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// `MPI_ERR_BUFFER`: an invalid buffer: memory that is not mapped, or cannot be watched.
    Buffer,
    /// `MPI_ERR_COUNT`: an invalid count.
    Count,
    /// `MPI_ERR_TYPE`: an invalid datatype, or one the operation cannot take.
    Type,
    /// `MPI_ERR_TAG`: a tag outside `0..=TAG_UB`.
    Tag,
    /// `MPI_ERR_COMM`: an invalid communicator.
    Comm,
    /// `MPI_ERR_RANK`: a rank outside the communicator.
    Rank,
    /// `MPI_ERR_REQUEST`: an invalid request, or one used out of turn.
    Request,
    /// `MPI_ERR_ROOT`: an invalid root.
    Root,
    /// `MPI_ERR_GROUP`: an invalid group.
    Group,
    /// `MPI_ERR_OP`: an operation that is not defined for the datatype or the call.
    Op,
    /// `MPI_ERR_TOPOLOGY`: an invalid topology.
    Topology,
    /// `MPI_ERR_DIMS`: invalid dimensions.
    Dims,
    /// `MPI_ERR_ARG`: an invalid argument of another kind (a setting, a flag).
    Arg,
    /// `MPI_ERR_UNKNOWN`: an error the library cannot classify.
    Unknown,
    /// `MPI_ERR_TRUNCATE`: a message longer than the receive buffer.
    Truncate,
    /// `MPI_ERR_OTHER`: an error of none of the other classes (a failed system call, a broken peer).
    Other,
    /// `MPI_ERR_INTERN`: an internal error: a bug of the library.
    Intern,
    /// `MPI_ERR_IN_STATUS`: an error code in a status.
    InStatus,
    /// `MPI_ERR_PENDING`: a pending request.
    Pending,
    /// `MPI_ERR_INFO`: an invalid info object.
    Info,
    /// `MPI_ERR_KEYVAL`: an invalid attribute key.
    Keyval,
    /// `MPI_ERR_NO_MEM`: memory (pinned, shared or allocated) exhausted.
    NoMem,
    /// `MPI_ERR_BASE`: an invalid base address.
    Base,
    /// `MPI_ERR_SIZE`: an invalid size.
    Size,
    /// `MPI_ERR_DISP`: an invalid displacement.
    Disp,
    /// `MPI_ERR_LOCKTYPE`: an invalid lock type.
    Locktype,
    /// `MPI_ERR_ASSERT`: an invalid assertion.
    Assert,
    /// `MPI_ERR_WIN`: an invalid window, or one of the wrong flavour for the call.
    Win,
    /// `MPI_ERR_RMA_CONFLICT`: conflicting accesses to a window.
    RmaConflict,
    /// `MPI_ERR_RMA_SYNC`: a window's synchronisation used out of order.
    RmaSync,
    /// `MPI_ERR_RMA_RANGE`: a one-sided access outside the target's window or attached memory.
    RmaRange,
    /// `MPI_ERR_RMA_ATTACH`: memory that cannot be attached to a window.
    RmaAttach,
    /// `MPI_ERR_RMA_SHARED`: memory that cannot be shared.
    RmaShared,
    /// `MPI_ERR_RMA_FLAVOR`: a window of the wrong flavour.
    RmaFlavor,
    /// `MPI_ERR_SPAWN`: processes that could not be started.
    Spawn,
    /// `MPI_ERR_PORT`: an invalid port name.
    Port,
    /// `MPI_ERR_SERVICE`: an invalid service name.
    Service,
    /// `MPI_ERR_NAME`: an invalid name.
    Name,
    /// `MPI_ERR_PROC_ABORTED`: a peer process aborted (died, or became unreachable).
    ProcAborted,
    /// `MPI_ERR_UNSUPPORTED_OPERATION`: an operation this build or this backend does not support.
    UnsupportedOperation,
    /// `MPI_ERR_IO`: an I/O error.
    Io,
}

impl ErrorClass {
    /// Every class, in the order of MPI's table.
    pub const ALL: [ErrorClass; 41] = [
        ErrorClass::Buffer,
        ErrorClass::Count,
        ErrorClass::Type,
        ErrorClass::Tag,
        ErrorClass::Comm,
        ErrorClass::Rank,
        ErrorClass::Request,
        ErrorClass::Root,
        ErrorClass::Group,
        ErrorClass::Op,
        ErrorClass::Topology,
        ErrorClass::Dims,
        ErrorClass::Arg,
        ErrorClass::Unknown,
        ErrorClass::Truncate,
        ErrorClass::Other,
        ErrorClass::Intern,
        ErrorClass::InStatus,
        ErrorClass::Pending,
        ErrorClass::Info,
        ErrorClass::Keyval,
        ErrorClass::NoMem,
        ErrorClass::Base,
        ErrorClass::Size,
        ErrorClass::Disp,
        ErrorClass::Locktype,
        ErrorClass::Assert,
        ErrorClass::Win,
        ErrorClass::RmaConflict,
        ErrorClass::RmaSync,
        ErrorClass::RmaRange,
        ErrorClass::RmaAttach,
        ErrorClass::RmaShared,
        ErrorClass::RmaFlavor,
        ErrorClass::Spawn,
        ErrorClass::Port,
        ErrorClass::Service,
        ErrorClass::Name,
        ErrorClass::ProcAborted,
        ErrorClass::UnsupportedOperation,
        ErrorClass::Io,
    ];

    /// The class's name in MPI, e.g. `MPI_ERR_TRUNCATE`.
    pub fn mpi_name(self) -> &'static str {
        match self {
            ErrorClass::Buffer => "MPI_ERR_BUFFER",
            ErrorClass::Count => "MPI_ERR_COUNT",
            ErrorClass::Type => "MPI_ERR_TYPE",
            ErrorClass::Tag => "MPI_ERR_TAG",
            ErrorClass::Comm => "MPI_ERR_COMM",
            ErrorClass::Rank => "MPI_ERR_RANK",
            ErrorClass::Request => "MPI_ERR_REQUEST",
            ErrorClass::Root => "MPI_ERR_ROOT",
            ErrorClass::Group => "MPI_ERR_GROUP",
            ErrorClass::Op => "MPI_ERR_OP",
            ErrorClass::Topology => "MPI_ERR_TOPOLOGY",
            ErrorClass::Dims => "MPI_ERR_DIMS",
            ErrorClass::Arg => "MPI_ERR_ARG",
            ErrorClass::Unknown => "MPI_ERR_UNKNOWN",
            ErrorClass::Truncate => "MPI_ERR_TRUNCATE",
            ErrorClass::Other => "MPI_ERR_OTHER",
            ErrorClass::Intern => "MPI_ERR_INTERN",
            ErrorClass::InStatus => "MPI_ERR_IN_STATUS",
            ErrorClass::Pending => "MPI_ERR_PENDING",
            ErrorClass::Info => "MPI_ERR_INFO",
            ErrorClass::Keyval => "MPI_ERR_KEYVAL",
            ErrorClass::NoMem => "MPI_ERR_NO_MEM",
            ErrorClass::Base => "MPI_ERR_BASE",
            ErrorClass::Size => "MPI_ERR_SIZE",
            ErrorClass::Disp => "MPI_ERR_DISP",
            ErrorClass::Locktype => "MPI_ERR_LOCKTYPE",
            ErrorClass::Assert => "MPI_ERR_ASSERT",
            ErrorClass::Win => "MPI_ERR_WIN",
            ErrorClass::RmaConflict => "MPI_ERR_RMA_CONFLICT",
            ErrorClass::RmaSync => "MPI_ERR_RMA_SYNC",
            ErrorClass::RmaRange => "MPI_ERR_RMA_RANGE",
            ErrorClass::RmaAttach => "MPI_ERR_RMA_ATTACH",
            ErrorClass::RmaShared => "MPI_ERR_RMA_SHARED",
            ErrorClass::RmaFlavor => "MPI_ERR_RMA_FLAVOR",
            ErrorClass::Spawn => "MPI_ERR_SPAWN",
            ErrorClass::Port => "MPI_ERR_PORT",
            ErrorClass::Service => "MPI_ERR_SERVICE",
            ErrorClass::Name => "MPI_ERR_NAME",
            ErrorClass::ProcAborted => "MPI_ERR_PROC_ABORTED",
            ErrorClass::UnsupportedOperation => "MPI_ERR_UNSUPPORTED_OPERATION",
            ErrorClass::Io => "MPI_ERR_IO",
        }
    }
}

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.mpi_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_its_own_mpi_name() {
        for (i, c) in ErrorClass::ALL.iter().enumerate() {
            assert!(c.mpi_name().starts_with("MPI_ERR_"), "{c:?}");
            assert!(
                ErrorClass::ALL[..i]
                    .iter()
                    .all(|d| d.mpi_name() != c.mpi_name()),
                "{c} named twice"
            );
        }
    }
}
