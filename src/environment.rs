//! The environment (rsmpi's `environment` module, MPI chapter 8): the state of
//! initialisation, the threading level, version and processor name, and the clock.
//!
//! pagewire's universe belongs to the thread that initialised it (its communicators are not
//! `Send`), so the threading level it provides is at most [`Threading::Funneled`]: only
//! that thread makes calls. The state is per thread, as the universe is.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Instant;

use crate::error::{Error, Result};
pub use crate::topology::Universe;

/// Threading levels (`MPI_THREAD_*`), ordered from least to most support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Threading {
    /// One thread only (`MPI_THREAD_SINGLE`).
    Single,
    /// Many threads, but only the initialising one calls (`MPI_THREAD_FUNNELED`).
    Funneled,
    /// Many threads, calling one at a time (`MPI_THREAD_SERIALIZED`).
    Serialized,
    /// Many threads, calling at any time (`MPI_THREAD_MULTIPLE`).
    Multiple,
}

/// The most a pagewire universe provides (see the module documentation).
pub(crate) const PROVIDED: Threading = Threading::Funneled;

/// Where this thread is in the life of a universe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Before,
    Running(Threading),
    After,
}

thread_local! {
    static PHASE: Cell<Phase> = const { Cell::new(Phase::Before) };
}

/// Marks the universe of this thread as running with `threading`; false if one already is.
pub(crate) fn start(threading: Threading) -> bool {
    PHASE.with(|p| {
        if matches!(p.get(), Phase::Running(_)) {
            return false;
        }
        p.set(Phase::Running(threading));
        true
    })
}

/// Marks the universe of this thread as not started after all.
pub(crate) fn abandon() {
    PHASE.with(|p| p.set(Phase::Before));
}

/// Marks the universe of this thread as finalised.
pub(crate) fn finish() {
    PHASE.with(|p| p.set(Phase::After));
}

/// The exit of a command-line program built on pagewire: on error, one line `PROGRAM:
/// error: cause: ...` on stderr and status 1. A user's mistake (a bad flag value, a
/// misspelt `PAGEWIRE_*` variable) then reads as one line, not as `anyhow`'s stack
/// backtrace, also where `RUST_BACKTRACE=1` is set.
pub fn exit_code<E: std::fmt::Display>(
    program: &str,
    result: std::result::Result<(), E>,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Whether a universe runs on this thread (`MPI_Initialized`).
pub fn is_initialized() -> bool {
    PHASE.with(|p| matches!(p.get(), Phase::Running(_)))
}

/// Whether this thread's universe has been finalised (`MPI_Finalized`).
pub fn is_finalized() -> bool {
    PHASE.with(|p| p.get() == Phase::After)
}

/// The threading level of the running universe (`MPI_Query_thread`); `Single` when none
/// runs on this thread.
pub fn threading_support() -> Threading {
    PHASE.with(|p| match p.get() {
        Phase::Running(t) => t,
        _ => Threading::Single,
    })
}

/// The version of the MPI standard whose semantics pagewire follows (`MPI_Get_version`).
pub fn version() -> (i32, i32) {
    (3, 1)
}

/// The library's name and version (`MPI_Get_library_version`).
pub fn library_version() -> Result<String> {
    Ok(format!(
        "pagewire {} (MPI {}.{} semantics, rsmpi-shaped API)",
        env!("CARGO_PKG_VERSION"),
        version().0,
        version().1
    ))
}

/// The name of the host this process runs on (`MPI_Get_processor_name`).
pub fn processor_name() -> Result<String> {
    let name = match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(name) => name,
        Err(e) => std::env::var("HOSTNAME").map_err(|_| {
            Error::os(
                "reading /proc/sys/kernel/hostname (and HOSTNAME is not set)",
                e,
            )
        })?,
    };
    Ok(name.trim().to_string())
}

fn clock_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Seconds since an arbitrary point, for timing (`MPI_Wtime`).
pub fn time() -> f64 {
    clock_start().elapsed().as_secs_f64()
}

/// The resolution of [`time`] in seconds (`MPI_Wtick`): the smallest step the clock
/// shows, measured once.
pub fn time_resolution() -> f64 {
    static TICK: OnceLock<f64> = OnceLock::new();
    *TICK.get_or_init(|| {
        let start = clock_start();
        (0..16)
            .filter_map(|_| {
                let a = start.elapsed();
                loop {
                    let b = start.elapsed();
                    if b > a {
                        break Some((b - a).as_secs_f64());
                    }
                }
            })
            .fold(f64::INFINITY, f64::min)
    })
}

/// Panics unless a derived datatype may be built now, as rsmpi's derive does: while a
/// universe runs, on its thread (pagewire never provides `Multiple`).
pub(crate) fn check_datatype_creation(type_name: &str) {
    match PHASE.with(Cell::get) {
        Phase::Running(_) => {}
        Phase::Before => panic!(
            "pagewire: the datatype of {type_name} is built on first use, which needs a \
             running universe on this thread (initialise first, or build it on the thread \
             that initialised)"
        ),
        Phase::After => panic!(
            "pagewire: the datatype of {type_name} cannot be built after the universe was \
             finalised"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_and_the_clock_ticks() {
        assert!(Threading::Single < Threading::Funneled);
        assert!(Threading::Serialized < Threading::Multiple);
        let r = time_resolution();
        assert!(r > 0.0 && r < 1e-3, "{r}");
        let t = time();
        assert!(time() >= t);
        assert!(library_version().unwrap().contains("pagewire"));
        assert!(!processor_name().unwrap().is_empty());
    }
}
