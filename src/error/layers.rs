//! The layers' errors, converted into the facade's flat [`Error`], and the MPI class of each
//! error ([`Error::class`]).
//!
//! Each conversion matches every variant of the layer's error: a variant added below fails
//! this build until it has a twin here, so no error reaches a user as something else.

use pagewire_transport::sys::{Error as SystemError, WcStatus};
use pagewire_transport::Error as MessageError;

use super::{Error, ErrorClass};

// The conversions are the error path of every call: out of line, so that the calls' own
// code stays small.
impl From<SystemError> for Error {
    #[cold]
    #[inline(never)]
    fn from(e: SystemError) -> Self {
        match e {
            SystemError::MemlockLimit {
                requested,
                pinned,
                limit,
                source_of_limit,
            } => Error::MemlockLimit {
                requested,
                pinned,
                limit,
                source_of_limit,
            },
            SystemError::SharedMemoryFull {
                object,
                needed,
                job_needed,
                ranks,
                available,
            } => Error::SharedMemoryFull {
                object,
                needed,
                job_needed,
                ranks,
                available,
            },
            SystemError::UnmappedRange { addr, len } => Error::UnmappedRange { addr, len },
            SystemError::InvalidArgument(what) => Error::InvalidArgument(what),
            SystemError::NotSupported(what) => Error::NotSupported(what),
            SystemError::Internal(what) => Error::Internal(what),
            SystemError::InvalidSetting {
                variable,
                value,
                accepted,
            } => Error::InvalidSetting {
                variable,
                value,
                accepted,
            },
            SystemError::UnknownSetting { variable, nearest } => {
                Error::UnknownSetting { variable, nearest }
            }
            SystemError::NoRdmaDevice { detail } => Error::NoRdmaDevice { detail },
            SystemError::Unsupported { device, what, hint } => {
                Error::Unsupported { device, what, hint }
            }
            SystemError::Exhausted { what, limit, hint } => Error::Exhausted { what, limit, hint },
            SystemError::UnknownKey { key } => Error::UnknownKey { key },
            SystemError::QueuePairError { qpn, peer, why } => {
                Error::QueuePairError { qpn, peer, why }
            }
            SystemError::PeerGone { rank, pid } => Error::PeerGone { rank, pid },
            SystemError::Bootstrap(what) => Error::Bootstrap(what),
            SystemError::Mpi {
                call,
                code,
                class,
                message,
            } => Error::Mpi {
                call,
                code,
                class,
                message,
            },
            SystemError::Launcher(what) => Error::Launcher(what),
            SystemError::Os { call, source } => Error::Os { call, source },
            SystemError::MonitorUnavailable { reason } => Error::MonitorUnavailable { reason },
            SystemError::UnwatchableRange { addr, len, reason } => {
                Error::UnwatchableRange { addr, len, reason }
            }
        }
    }
}

impl From<MessageError> for Error {
    #[cold]
    #[inline(never)]
    fn from(e: MessageError) -> Self {
        match e {
            MessageError::System(e) => e.into(),
            MessageError::Invalid { class, what } => Error::Invalid { class, what },
            MessageError::BufferMode { mode, source } => Error::BufferMode { mode, source },
            MessageError::Truncated {
                source_rank,
                tag,
                message_bytes,
                buffer_bytes,
            } => Error::Truncated {
                source_rank,
                tag,
                message_bytes,
                buffer_bytes,
            },
            MessageError::NoSuchRank { rank, size } => Error::NoSuchRank { rank, size },
            MessageError::InvalidTag { tag, max } => Error::InvalidTag { tag, max },
            MessageError::Communication { peer, status, what } => {
                Error::Communication { peer, status, what }
            }
            MessageError::ProtocolViolation { peer, why } => Error::ProtocolViolation { peer, why },
            MessageError::Cancelled => Error::Cancelled,
        }
    }
}

impl Error {
    /// The error's MPI class (`MPI_Error_class`), which MPI programs test to decide what to
    /// do: [`ErrorClass::Truncate`] for a truncated receive, [`ErrorClass::ProcAborted`] for
    /// a peer that died, [`ErrorClass::NoMem`] for the locked-memory limit, and so on.
    pub fn class(&self) -> ErrorClass {
        use ErrorClass as C;
        match self {
            Error::MemlockLimit { .. } | Error::SharedMemoryFull { .. } => C::NoMem,
            Error::Exhausted { .. } => C::NoMem,
            Error::UnmappedRange { .. } | Error::UnwatchableRange { .. } => C::Buffer,
            Error::InvalidArgument(_) | Error::InvalidSetting { .. } => C::Arg,
            Error::UnknownSetting { .. } | Error::UnknownKey { .. } => C::Arg,
            Error::Invalid { class, .. } | Error::Mpi { class, .. } => *class,
            Error::NotSupported(_) | Error::Unsupported { .. } => C::UnsupportedOperation,
            Error::Internal(_) => C::Intern,
            Error::Truncated { .. } => C::Truncate,
            Error::NoSuchRank { .. } => C::Rank,
            Error::InvalidTag { .. } => C::Tag,
            Error::NotAttached { .. } | Error::OutOfWindow { .. } => C::RmaRange,
            Error::WindowSync(_) => C::RmaSync,
            Error::Cancelled => C::Request,
            Error::PeerGone { .. } => C::ProcAborted,
            // The transport's retries ran out: the peer is gone or unreachable, which is what
            // a dead peer looks like to a NIC.
            Error::Communication {
                status: WcStatus::RetryExceeded,
                ..
            } => C::ProcAborted,
            Error::Communication { .. } | Error::ProtocolViolation { .. } => C::Other,
            Error::QueuePairError { .. } | Error::NoRdmaDevice { .. } => C::Other,
            Error::Launcher(_) => C::Spawn,
            Error::Os { source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => C::NoMem,
            Error::Os { .. } => C::Other,
            Error::BufferMode { .. } | Error::Bootstrap(_) => C::Other,
            Error::MonitorUnavailable { .. } => C::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[test]
    fn errors_take_the_class_mpi_gives_them() {
        let truncated = Error::Truncated {
            source_rank: 1,
            tag: 0,
            message_bytes: 8,
            buffer_bytes: 4,
        };
        assert_eq!(truncated.class(), ErrorClass::Truncate);
        let dead = Error::Communication {
            peer: 1,
            status: WcStatus::RetryExceeded,
            what: "receiving",
        };
        assert_eq!(dead.class(), ErrorClass::ProcAborted);
        let flushed = Error::Communication {
            peer: 1,
            status: WcStatus::WrFlushError,
            what: "receiving",
        };
        assert_eq!(flushed.class(), ErrorClass::Other);
        let enomem = Error::os("mmap", io::Error::from_raw_os_error(libc::ENOMEM));
        assert_eq!(enomem.class(), ErrorClass::NoMem);
        let einval = Error::os("x", io::Error::from_raw_os_error(libc::EINVAL));
        assert_eq!(einval.class(), ErrorClass::Other);
        let request = Error::invalid(ErrorClass::Request, "started twice");
        assert_eq!(request.class(), ErrorClass::Request);
        assert_eq!(request.to_string(), "started twice (MPI_ERR_REQUEST)");
        assert_eq!(Error::InvalidArgument("x".into()).class(), ErrorClass::Arg);
        assert_eq!(Error::Internal("x".into()).class(), ErrorClass::Intern);
        assert_eq!(
            Error::NotSupported("x".into()).class(),
            ErrorClass::UnsupportedOperation
        );
    }

    #[test]
    fn a_layers_error_keeps_its_variant_and_its_words() {
        let below = SystemError::MemlockLimit {
            requested: 4096,
            pinned: 8192,
            limit: 8192,
            source_of_limit: "RLIMIT_MEMLOCK",
        };
        let text = below.to_string();
        let e = Error::from(MessageError::from(below));
        assert!(matches!(
            e,
            Error::MemlockLimit {
                requested: 4096,
                ..
            }
        ));
        assert_eq!(e.to_string(), text);
        assert_eq!(e.class(), ErrorClass::NoMem);

        let message = MessageError::Truncated {
            source_rank: 2,
            tag: 5,
            message_bytes: 16,
            buffer_bytes: 8,
        };
        let text = message.to_string();
        let e = Error::from(message);
        assert!(matches!(e, Error::Truncated { source_rank: 2, .. }));
        assert_eq!(e.to_string(), text);

        let os = MessageError::os("mmap", io::Error::from_raw_os_error(libc::ENOMEM));
        let text = os.to_string();
        let e = Error::from(os);
        assert!(matches!(e, Error::Os { .. }));
        assert_eq!(e.to_string(), text);
        assert_eq!(e.class(), ErrorClass::NoMem);
    }
}
