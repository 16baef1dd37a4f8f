//! The backend seam: what carries the facade's calls, chosen once at start-up ([`start`]).
//!
//! - [`pagewire`]: pagewire's own stack, the message layer (`transport::msg`) on a NIC
//!   provider in a buffer mode, with the collective algorithms of `pagewire-collectives`;
//! - `host_mpi` (feature `mpi`, `PAGEWIRE_TRANSPORT=mpi`): the host MPI library, through
//!   rsmpi, so that one binary measures pagewire and the MPI library side by side.
//!
//! Each communicator holds a [`CommBackend`]: the world's is chosen by [`start`], and every
//! communicator made from one (duplicate, split) is on the same backend. The rsmpi-shaped
//! traits above (`topology`, `point_to_point`, `request`, `collective`) call it through the
//! traits of [`traits`] and never ask which backend they got; `cfg(feature = "mpi")` is
//! written here, in `host_mpi/`, where the crate root re-exports `host_mpi` and where
//! `PAGEWIRE_TRANSPORT=mpi` is parsed (`config.rs`).
//!
//! # Adding an operation
//!
//! 1. Its declaration, once, in the trait of its group in `traits.rs` ([`CollectiveBackend`]
//!    …), written in a `backend_trait!` block: that makes [`CommBackend`] (or the
//!    request's or message's enum) hand the call to the backend inside.
//! 2. Its implementation in each backend: `pagewire/` and `host_mpi/communicator.rs` (the
//!    compiler lists the backends that lack it); an MPI call that `HostMpi` does not make
//!    yet is a `HostMpi` method and its rsmpi or MPI call in `host_mpi/ffi.rs`.
//! 3. The user-facing method on the rsmpi-shaped trait above, which calls
//!    `comm.backend().method(..)`.

#[cfg(feature = "mpi")]
pub mod host_mpi;
pub(crate) mod pagewire;

use pagewire_transport::boot::Bootstrap;

use crate::config::{TransportKind, UniverseConfig};
use crate::error::Result;

pub(crate) use traits::{
    CollectiveBackend, CommunicatorBackend, MessageBackend, PointToPointBackend, RequestBackend,
};

/// Declares an enum with one variant per backend (the host-MPI one with the feature only) and
/// `From` each backend's type.
macro_rules! per_backend {
    ($(#[$meta:meta])* $name:ident { pagewire: $pagewire:ty, host_mpi: $host:ty $(,)? }) => {
        $(#[$meta])*
        pub(crate) enum $name {
            /// pagewire's own stack.
            Pagewire($pagewire),
            /// The host MPI library.
            #[cfg(feature = "mpi")]
            HostMpi($host),
        }

        impl From<$pagewire> for $name {
            fn from(b: $pagewire) -> Self {
                $name::Pagewire(b)
            }
        }

        #[cfg(feature = "mpi")]
        impl From<$host> for $name {
            fn from(b: $host) -> Self {
                $name::HostMpi(b)
            }
        }
    };
}

/// `$call` on the backend inside `$value` (an enum of [`per_backend!`]), bound to `$b`.
macro_rules! dispatch {
    ($value:expr, $b:ident => $call:expr) => {
        match $value {
            Self::Pagewire($b) => $call,
            #[cfg(feature = "mpi")]
            Self::HostMpi($b) => $call,
        }
    };
}

/// Declares a trait of the seam once and makes the enum of [`per_backend!`] named before it
/// implement it by handing each call to the backend inside. The trait is written as usual,
/// but for each method's generics, in brackets (`fn f[T: Pod](&self, ...)`), and what
/// follows a method's signature where the backend's result needs it: the conversion to the
/// enum's types, appended to the backend's call (`=> [.map(Into::into)]`), or a body of the
/// enum's own (`as { ... }`). Associated types come first, in a `types { ... }` block, each
/// naming the enum's type (`type Request: RequestBackend = PendingRequest;`). A backend then
/// implements the trait, and nothing else is written.
macro_rules! backend_trait {
    (
        $enum:ident =>
        $(#[$meta:meta])*
        $vis:vis trait $trait:ident $(: $supertrait:path)? {
            $(types {
                $(
                    $(#[$type_meta:meta])*
                    type $assoc:ident: $bound:path = $concrete:ty;
                )*
            })?
            $(
                $(#[$fn_meta:meta])*
                fn $name:ident $([$($generics:tt)*])? ($($params:tt)*) -> $ret:ty
                    $(=> [$($lift:tt)*])? $(as $body:block)?;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis trait $trait $(: $supertrait)? {
            $($(
                $(#[$type_meta])*
                type $assoc: $bound;
            )*)?
            $(
                $(#[$fn_meta])*
                fn $name $(<$($generics)*>)? ($($params)*) -> $ret;
            )*
        }

        impl $trait for $enum {
            $($(type $assoc = $concrete;)*)?
            $(
                fn $name $(<$($generics)*>)? ($($params)*) -> $ret {
                    backend_trait!(@call $name ($($params)*) [[$($($lift)*)?] [$($body)?]])
                }
            )*
        }
    };
    // The receiver and the arguments' names, from the parameters.
    (@call $name:ident (&mut $s:ident $(, $arg:ident: $ty:ty)* $(,)?) $how:tt) => {
        backend_trait!(@dispatch $s $name ($($arg),*) $how)
    };
    (@call $name:ident (& $s:ident $(, $arg:ident: $ty:ty)* $(,)?) $how:tt) => {
        backend_trait!(@dispatch $s $name ($($arg),*) $how)
    };
    (@call $name:ident ($s:ident $(, $arg:ident: $ty:ty)* $(,)?) $how:tt) => {
        backend_trait!(@dispatch $s $name ($($arg),*) $how)
    };
    (@dispatch $s:ident $name:ident ($($arg:ident),*) [[$($lift:tt)*] []]) => {
        dispatch!($s, b => b.$name($($arg),*) $($lift)*)
    };
    (@dispatch $s:ident $name:ident ($($arg:ident),*) [[] [$body:block]]) => {
        $body
    };
}

mod traits;

per_backend! {
    /// A communicator's backend.
    #[derive(Clone, Debug)]
    CommBackend {
        pagewire: pagewire::PagewireComm,
        host_mpi: host_mpi::communicator::HostMpiComm,
    }
}

per_backend! {
    /// A nonblocking operation started on a [`CommBackend`].
    #[derive(Debug)]
    PendingRequest {
        pagewire: pagewire::point_to_point::PagewireRequest,
        host_mpi: host_mpi::communicator::HostMpiRequest,
    }
}

per_backend! {
    /// A message that a matched probe on a [`CommBackend`] took out of matching.
    #[derive(Debug)]
    MatchedMessage {
        pagewire: pagewire::point_to_point::PagewireMessage,
        host_mpi: host_mpi::communicator::HostMpiMessage,
    }
}

impl CommBackend {
    /// The host MPI library's communicator, on the mpi transport.
    #[cfg(feature = "mpi")]
    pub(crate) fn host_mpi(&self) -> Option<&host_mpi::communicator::HostMpiComm> {
        match self {
            CommBackend::HostMpi(h) => Some(h),
            CommBackend::Pagewire(_) => None,
        }
    }
}

/// Starts the backend `cfg` asks for and returns the world communicator's.
pub(crate) fn start(cfg: UniverseConfig) -> Result<CommBackend> {
    match cfg.transport {
        TransportKind::Pagewire => pagewire::PagewireComm::start_world(cfg).map(Into::into),
        TransportKind::HostMpi => start_host_mpi(),
    }
}

/// Starts the host-MPI backend on `MPI_COMM_WORLD`.
#[cfg(feature = "mpi")]
fn start_host_mpi() -> Result<CommBackend> {
    host_mpi::communicator::HostMpiComm::start_world().map(Into::into)
}

/// Without the feature there is no host MPI library to forward to.
#[cfg(not(feature = "mpi"))]
fn start_host_mpi() -> Result<CommBackend> {
    Err(crate::config::no_mpi_feature())
}

/// What a rank unwinding from a panic does before its universe goes: under mpirun it removes
/// the job's shared-memory objects (the soft NIC's rings and tables of every rank). pwrun does
/// this after a failed job; under mpirun nobody would, and the ranks that `MPI_Abort` kills
/// leave theirs behind. So the failing rank removes them all before its bootstrap aborts: the
/// others keep their mappings until they are killed, and a rank still starting up fails to
/// open a peer's, which ends it as the abort would.
#[cfg(feature = "mpi")]
pub(crate) fn clean_up_after_panic(boot: &dyn Bootstrap) {
    if boot.as_mpi().is_none() {
        return;
    }
    let prefix = pagewire_transport::boot::shm_prefix(boot.job_id());
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Without the feature, pwrun removes a failed job's shared memory.
#[cfg(not(feature = "mpi"))]
pub(crate) fn clean_up_after_panic(_boot: &dyn Bootstrap) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mpi_transport_says_what_it_needs() {
        // Not under mpirun here: without the feature the build is wrong, with it the launch.
        let e = start_host_mpi().expect_err("refused").to_string();
        if cfg!(feature = "mpi") {
            assert!(e.contains("must be started by mpirun or mpiexec"), "{e}");
        } else {
            assert!(e.contains("built without the `mpi` feature"), "{e}");
        }
    }
}
