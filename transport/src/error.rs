//! The message layer's error: what matching, the protocols, the buffer modes and the local
//! path report of their own (a truncated receive, a peer that broke the protocol, a rank
//! outside the job), and the layers' below it ([`Error::System`]) as they reported them.
//!
//! It is not `#[non_exhaustive]`: the facade's flat `pagewire::Error` converts it variant by
//! variant, so a variant added here fails the facade's build until it has a twin there.

use std::io;

use pagewire_sys::{ErrorClass, WcStatus};

/// Result alias of the message layer and the crates above it that share [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the message layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A layer below the message layer failed: a system call, the memory monitor, a NIC
    /// provider, start-up (its error, as it reported it).
    #[error(transparent)]
    System(pagewire_sys::Error),

    /// A call was made with an argument or in a state MPI gives a class of its own: a
    /// request started twice (`MPI_ERR_REQUEST`), a reduction an operation does not define
    /// (`MPI_ERR_OP`), a datatype the call cannot take (`MPI_ERR_TYPE`), a count past a
    /// limit (`MPI_ERR_COUNT`), a window of the wrong flavour (`MPI_ERR_WIN`). Nothing was
    /// changed.
    #[error("{what} ({class})")]
    Invalid {
        /// MPI's class of the mistake; never [`ErrorClass::Arg`] (that is
        /// [`pagewire_sys::Error::InvalidArgument`]).
        class: ErrorClass,
        /// What was wrong, and what the call accepts.
        what: String,
    },

    /// A buffer mode failed for a reason of its own (its error, kept typed as the source:
    /// for the pin-down cache a `pagewire_pindown::Error`).
    #[error("{mode} buffer mode: {source}")]
    BufferMode {
        /// The mode's name (`pindown`, `odp`).
        mode: &'static str,
        /// The mode's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A message was longer than the receive buffer (`MPI_ERR_TRUNCATE`). The first
    /// `buffer_bytes` bytes were delivered; nothing past the buffer was written.
    #[error(
        "message truncated: rank {source_rank} sent {message_bytes} bytes with tag {tag}, \
         but the receive buffer holds {buffer_bytes}"
    )]
    Truncated {
        /// Sending rank.
        source_rank: usize,
        /// The message's tag.
        tag: i32,
        /// The message's size.
        message_bytes: usize,
        /// The receive buffer's size (bytes delivered).
        buffer_bytes: usize,
    },

    /// A rank outside the communicator was named (`MPI_ERR_RANK`).
    #[error("rank {rank} does not exist: the communicator has {size} ranks")]
    NoSuchRank {
        /// The rank named.
        rank: usize,
        /// Ranks in the communicator.
        size: usize,
    },

    /// A tag outside `0..=TAG_UB` was used for a send or a receive (`MPI_ERR_TAG`).
    #[error("tag {tag} is out of range: tags are 0..={max} (use ANY_TAG to receive any)")]
    InvalidTag {
        /// The tag used.
        tag: i32,
        /// The largest valid tag.
        max: i32,
    },

    /// The NIC could not complete an operation with a peer (it died, or its queue pair
    /// failed); every operation involving that peer fails with this error.
    #[error("communication with rank {peer} failed ({status}) while {what}")]
    Communication {
        /// The peer.
        peer: usize,
        /// The NIC's completion status.
        status: WcStatus,
        /// What the layer was doing.
        what: &'static str,
    },

    /// A peer sent a message or packet that no correct peer sends (a field out of range, a
    /// region outside the message, a length its bytes do not have): nothing of it was used,
    /// and every operation with that peer fails from then on.
    #[error("rank {peer} broke the protocol ({why}); communication with it has stopped")]
    ProtocolViolation {
        /// The peer.
        peer: usize,
        /// What was wrong, in a few words.
        why: &'static str,
    },

    /// The request was cancelled before it matched.
    #[error("the request was cancelled before it matched a message")]
    Cancelled,
}

// Out of line: the conversion is the error path of the layer's hottest calls (posting,
// polling), whose own code stays small without it.
impl From<pagewire_sys::Error> for Error {
    #[cold]
    #[inline(never)]
    fn from(e: pagewire_sys::Error) -> Self {
        Error::System(e)
    }
}

impl Error {
    /// Whether the error is a peer's failure (its death, or its queue pair's): the requests
    /// with that peer learn of it through their own completions, so a pass of progress that
    /// reports it does not end the wait of a request with another peer.
    pub fn is_peer_failure(&self) -> bool {
        matches!(
            self,
            Error::Communication { .. } | Error::System(pagewire_sys::Error::PeerGone { .. })
        )
    }

    /// [`Error::Invalid`] of `class`.
    pub fn invalid(class: ErrorClass, what: impl Into<String>) -> Self {
        debug_assert!(
            class != ErrorClass::Arg,
            "an Arg is an Error::InvalidArgument"
        );
        Error::Invalid {
            class,
            what: what.into(),
        }
    }

    /// An argument outside what the call accepts ([`pagewire_sys::Error::InvalidArgument`],
    /// `MPI_ERR_ARG`).
    pub fn invalid_argument(what: impl Into<String>) -> Self {
        pagewire_sys::Error::InvalidArgument(what.into()).into()
    }

    /// A system call's failure ([`pagewire_sys::Error::Os`]) for `call`.
    pub fn os(call: impl Into<String>, source: io::Error) -> Self {
        pagewire_sys::Error::os(call, source).into()
    }

    /// A setting's bad value ([`pagewire_sys::Error::InvalidSetting`]).
    pub fn invalid_setting(
        variable: impl Into<String>,
        value: impl std::fmt::Display,
        accepted: impl Into<String>,
    ) -> Self {
        pagewire_sys::Error::invalid_setting(variable, value, accepted).into()
    }
}
