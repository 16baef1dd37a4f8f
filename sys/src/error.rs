//! The error of the layers below the message layer: this crate, the memory monitor, the NIC
//! boundary and its providers, start-up. The message layer wraps it
//! (`pagewire_transport::Error::System`); the facade shows it as its own flat error.
//!
//! Each variant carries what a user needs to act: which limit, which key, which rank.
//! Errors of a *work request* (a bad rkey on an RDMA READ, say) are not `Error`s: they
//! arrive as a [`crate::WcStatus`] in the completion, as on real verbs hardware.

use std::io;

pub use crate::error_class::ErrorClass;

/// Result alias of the layers that share [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the message layer: in a system call, the memory
/// monitor, a NIC provider or start-up.
///
/// Not `#[non_exhaustive]`: the message layer wraps it and the facade's flat
/// `pagewire::Error` converts it variant by variant, so a variant added here fails the
/// facade's build until it has a twin there.
#[derive(Debug, thiserror::Error)]
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
        /// The code's class (`MPI_Error_class`), as the host library gave it.
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
}

/// `bytes` in MiB with one decimal, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

impl Error {
    /// The error in the launcher's own words: a [`Error::Launcher`]'s text without its
    /// `launcher:` label (for spawn, which labels it itself), any other error as it
    /// displays.
    pub fn launcher_text(&self) -> String {
        match self {
            Error::Launcher(text) => text.clone(),
            e => e.to_string(),
        }
    }

    /// [`Error::InvalidSetting`] for `variable=value`.
    pub fn invalid_setting(
        variable: impl Into<String>,
        value: impl std::fmt::Display,
        accepted: impl Into<String>,
    ) -> Self {
        Error::InvalidSetting {
            variable: variable.into(),
            value: value.to_string(),
            accepted: accepted.into(),
        }
    }

    /// Wraps the current `errno` as an [`Error::Os`] for `call`.
    pub fn last_os(call: impl Into<String>) -> Self {
        Error::Os {
            call: call.into(),
            source: io::Error::last_os_error(),
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
