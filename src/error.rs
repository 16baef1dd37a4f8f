//! The facade's errors: [`Error`], the one error type a pagewire program sees, flat (one
//! variant per thing that can go wrong, whichever layer found it) so that programs `match`
//! on it directly; [`Error::class`], its MPI error class; and [`fatal`], which makes of an
//! error the panic that MPI's default handler (`MPI_ERRORS_ARE_FATAL`) would.
//!
//! Each layer below has an error of its own (`pagewire_sys::Error` for the system, the
//! memory monitor, the NIC and start-up; `pagewire_transport::Error` for the message layer);
//! [`layers`] converts them, variant by variant, into this one.

use std::io;

use pagewire_transport::sys::WcStatus;
pub use pagewire_transport::ErrorClass;

mod layers;

/// Result alias of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a pagewire call. Each variant carries what a user needs
/// to act (which limit, which key, which rank); [`Error::class`] gives its MPI class.
///
/// Errors of a *work request* (a bad rkey on an RDMA READ, say) on the raw NIC interface
/// ([`crate::nic`]) are not `Error`s: they arrive as a `WcStatus` in the completion, as on
/// real verbs hardware.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Registering would pin more than the locked-memory limit allows.
    #[error(
        "cannot pin {requested} more bytes: {pinned} bytes already pinned, limit is {limit} bytes \
         ({source_of_limit}); raise it with `ulimit -l` or set PAGEWIRE_MEMLOCK_LIMIT, or use an ODP \
         region, which pins nothing"
    )]
    MemlockLimit {
        /// Bytes this registration would newly pin (pages not already pinned by another region).
        requested: u64,
        /// Bytes pinned by this process's NIC at the time of the call.
        pinned: u64,
        /// The limit in force.
        limit: u64,
        /// Where the limit came from: `RLIMIT_MEMLOCK` or `PAGEWIRE_MEMLOCK_LIMIT`.
        source_of_limit: &'static str,
    },

    /// `/dev/shm` has no room for a rank's shared NIC memory. The soft NIC reserves its
    /// segment when it comes up, so a full `/dev/shm` is this error at start-up, not a
    /// `SIGBUS` when a page is first touched.
    #[error(
        "/dev/shm is too small for this job: {object} needs {} MiB ({} MiB for all {ranks} \
         ranks), but /dev/shm has {} MiB free; free space in /dev/shm or make it larger \
         (`mount -o remount,size=2G /dev/shm`; in a container, `--shm-size`), or run fewer ranks",
        mib(*.needed), mib(*.job_needed), mib(*.available)
    )]
    SharedMemoryFull {
        /// The object that could not be reserved (`/dev/shm/pagewire-JOB-nic-RANK`).
        object: String,
        /// Bytes that object needs.
        needed: u64,
        /// Bytes the whole job needs in `/dev/shm` (every rank's object).
        job_needed: u64,
        /// Ranks in the job.
        ranks: usize,
        /// Bytes free in `/dev/shm` when the reservation failed.
        available: u64,
    },

    /// The range given to `register` is not (entirely) mapped in this process.
    #[error("cannot register {len} bytes at {addr:#x}: the range is not mapped in this process")]
    UnmappedRange {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },

    /// An argument is outside what the call accepts (`MPI_ERR_ARG`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The call is valid MPI, but this build or this backend does not do it
    /// (`MPI_ERR_UNSUPPORTED_OPERATION`): a provider built without its feature, an operation
    /// the host-MPI backend does not wire up. The message says what would.
    #[error("not supported: {0}")]
    NotSupported(String),

    /// An internal invariant broke (`MPI_ERR_INTERN`): a bug in pagewire, not in the caller.
    /// The operation failed and nothing past it was changed.
    #[error("internal error (a bug in pagewire; please report it with what you ran): {0}")]
    Internal(String),

    /// An environment variable (`PAGEWIRE_...`) has a value pagewire does not accept; the
    /// message names the variable, the value and what it accepts.
    #[error("{variable}={value}: {accepted}")]
    InvalidSetting {
        /// The variable.
        variable: String,
        /// Its value.
        value: String,
        /// What it accepts ("expected auto, cma or staged").
        accepted: String,
    },

    /// A `PAGEWIRE_*` variable in the environment that is not a setting (misspelt, or from
    /// another version): reported instead of ignored.
    #[error(
        "{variable} is not a pagewire setting{}{} (docs/configuration.md lists them all)",
        if nearest.is_some() { "; did you mean " } else { "" },
        nearest.map(|n| format!("{n}?")).unwrap_or_default()
    )]
    UnknownSetting {
        /// The variable.
        variable: String,
        /// The known setting nearest to it, if one is near.
        nearest: Option<&'static str>,
    },

    /// The verbs provider found no RDMA device it can use: libibverbs lists none, the
    /// kernel has no RDMA support, no device has an active port, or the device named by
    /// `PAGEWIRE_DEVICE` is missing. The message is one line and names the soft provider.
    #[error(
        "{detail}; to run without RDMA hardware use the soft provider: PAGEWIRE_TRANSPORT=soft"
    )]
    NoRdmaDevice {
        /// What was looked for and what was found.
        detail: String,
    },

    /// The device cannot do what the caller needs (for example on-demand paging on RC
    /// queue pairs, which the `odp` buffer mode requires).
    #[error("{device} does not support {what}; {hint}")]
    Unsupported {
        /// The device, as `Capabilities::device` names it.
        device: String,
        /// The missing capability.
        what: String,
        /// What the user can do instead.
        hint: &'static str,
    },

    /// A resource table (memory regions, queue pairs, queue depth) is full.
    #[error("{what} exhausted: {limit} in use; {hint}")]
    Exhausted {
        /// The resource.
        what: &'static str,
        /// Its capacity.
        limit: u64,
        /// What the user can do about it.
        hint: &'static str,
    },

    /// A key passed to a local call does not name a live region of this NIC.
    #[error("no live memory region with key {key:#010x} on this NIC")]
    UnknownKey {
        /// The key.
        key: u32,
    },

    /// The queue pair is in the error state; every further work request is flushed.
    #[error("queue pair {qpn} to rank {peer} is in the error state: {why}")]
    QueuePairError {
        /// Local queue pair number.
        qpn: u32,
        /// The peer rank.
        peer: usize,
        /// What put it there.
        why: String,
    },

    /// A peer process is gone (exited or killed).
    #[error("rank {rank} (pid {pid}) is no longer running")]
    PeerGone {
        /// The peer's rank.
        rank: usize,
        /// The peer's process id.
        pid: u32,
    },

    /// Start-up or address exchange failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),

    /// A call into the host MPI library failed (feature `mpi`: the bootstrap under `mpirun`
    /// and the host-MPI backend). `code` is the MPI error code, `message` MPI's own text.
    #[error("MPI: {call} failed with error {code}: {message}")]
    Mpi {
        /// The failing MPI call.
        call: &'static str,
        /// Its error code, as the host library numbers it.
        code: i32,
        /// The code's class (`MPI_Error_class`), as [`Error::class`] reports it.
        class: ErrorClass,
        /// `MPI_Error_string` of the code.
        message: String,
    },

    /// The launcher could not start or supervise the job.
    #[error("launcher: {0}")]
    Launcher(String),

    /// A system call failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The failing call, with its essential arguments.
        call: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The memory monitor cannot run in this process (userfaultfd not permitted or not
    /// supported); registrations must not be cached.
    #[error("memory monitor unavailable: {reason}")]
    MonitorUnavailable {
        /// What failed, in one line.
        reason: String,
    },

    /// The memory monitor cannot see changes to this range, so a registration over it must
    /// not be cached (it is registered for one transfer instead).
    #[error("cannot watch {len} bytes at {addr:#x} for address-space changes: {reason}")]
    UnwatchableRange {
        /// Start of the range (page-aligned).
        addr: u64,
        /// Length of the range (whole pages).
        len: u64,
        /// Why.
        reason: String,
    },

    /// A call was made with an argument or in a state MPI gives a class of its own: a
    /// request started twice (`MPI_ERR_REQUEST`), a reduction an operation does not define
    /// (`MPI_ERR_OP`), a datatype the call cannot take (`MPI_ERR_TYPE`), a count past a
    /// limit (`MPI_ERR_COUNT`), a window of the wrong flavour (`MPI_ERR_WIN`). Nothing was
    /// changed.
    #[error("{what} ({class})")]
    Invalid {
        /// MPI's class of the mistake; never [`ErrorClass::Arg`] (that is
        /// [`Error::InvalidArgument`]).
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

    /// A one-sided operation on a dynamic window named bytes that no region attached at the
    /// target holds, whole (`MPI_ERR_RMA_RANGE`): never attached, detached since, or running
    /// past a region's end. Refused at the origin, before anything moved.
    #[error(
        "one-sided access to rank {target}'s dynamic window at addresses {addr:#x}..{end:#x}, \
         which no region attached there holds whole (attach it first, or it was detached)"
    )]
    NotAttached {
        /// The target rank (in the window's communicator).
        target: usize,
        /// First byte named (an address in the target's memory).
        addr: u64,
        /// One past the last byte named.
        end: u64,
    },

    /// A one-sided operation named bytes outside the target's window (`MPI_ERR_RMA_RANGE`):
    /// refused at the origin, before anything moved; no byte of either side changed.
    #[error(
        "one-sided access outside rank {target}'s window: bytes {offset}..{end} of a \
         {window_bytes}-byte window"
    )]
    OutOfWindow {
        /// The target rank (in the window's communicator).
        target: usize,
        /// First byte named, from the window's base.
        offset: u64,
        /// One past the last byte named.
        end: u64,
        /// The target's window size in bytes.
        window_bytes: u64,
    },

    /// A window's synchronisation was used out of order (`MPI_ERR_RMA_SYNC`): an unlock
    /// without a lock, a second lock on the same target, a free while a lock or an epoch
    /// is still open. Nothing was changed.
    #[error("window synchronisation: {0}")]
    WindowSync(String),
}

/// `bytes` in MiB with one decimal, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

impl Error {
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

    /// Wraps an [`io::Error`] as an [`Error::Os`] for `call`.
    pub fn os(call: impl Into<String>, source: io::Error) -> Self {
        Error::Os {
            call: call.into(),
            source,
        }
    }
}

/// The value of `r`, or a panic with its error (`pagewire: …`): what every call of the facade
/// without `try_` does with the error its `try_` twin returns.
pub(crate) fn fatal<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("pagewire: {e}"))
}
