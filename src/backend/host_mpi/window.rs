//! The host MPI library's windows (`MPI_Win`) behind `pagewire::window` under
//! `PAGEWIRE_TRANSPORT=mpi`, so that one binary measures pagewire's one-sided path next to
//! MPICH's or Open MPI's.
//!
//! Safe Rust lends a buffer to a call for that call only, so each operation completes
//! before it returns. MPI completes single operations only inside a passive-target epoch
//! (`MPI_Win_flush_local`), so a window lives in one `MPI_Win_lock_all` epoch from creation
//! to free: puts, accumulates and gets are followed by `MPI_Win_flush_local`, `fence` is
//! `MPI_Win_flush_all` and a barrier, and the facade's exclusive and shared locks are words
//! of a second window updated with `MPI_Compare_and_swap` and `MPI_Fetch_and_op`, as on the
//! NIC path. Every call returns MPI's error (`MPI_ERRORS_RETURN` on both windows).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use mpi::datatype::Equivalence as _;
use mpi::ffi;
use mpi::raw::AsRaw;
use pagewire_collectives::Op;

use super::ffi::{check, mpi_op, PeerComm};
use crate::datatype::Primitive;
use crate::error::{Error, Result};
use crate::ErrorClass;

/// Bytes of each rank's control window (its lock word and a spare word).
const CONTROL_BYTES: usize = 16;

/// One window of the host MPI library, with its control window.
pub(crate) struct HostWindow {
    win: ffi::MPI_Win,
    control: ffi::MPI_Win,
    control_base: *mut u64,
    freed: bool,
}

impl std::fmt::Debug for HostWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWindow").finish_non_exhaustive()
    }
}

/// The MPI datatype of a primitive, where MPI has one.
fn datatype(p: Primitive) -> Result<ffi::MPI_Datatype> {
    Ok(match p {
        Primitive::Bool => bool::equivalent_datatype().as_raw(),
        Primitive::I8 => i8::equivalent_datatype().as_raw(),
        Primitive::I16 => i16::equivalent_datatype().as_raw(),
        Primitive::I32 => i32::equivalent_datatype().as_raw(),
        Primitive::I64 => i64::equivalent_datatype().as_raw(),
        Primitive::U8 => u8::equivalent_datatype().as_raw(),
        Primitive::U16 => u16::equivalent_datatype().as_raw(),
        Primitive::U32 => u32::equivalent_datatype().as_raw(),
        Primitive::U64 => u64::equivalent_datatype().as_raw(),
        Primitive::F32 => f32::equivalent_datatype().as_raw(),
        Primitive::F64 => f64::equivalent_datatype().as_raw(),
        Primitive::Complex32 | Primitive::Complex64 => {
            return Err(Error::NotSupported(
                "one-sided accumulates of complex numbers are not supported".into(),
            ))
        }
    })
}

/// The predefined `MPI_Op` of `op`; `MPI_REPLACE` and `MPI_NO_OP` are not among rsmpi's
/// bindings, so they are refused here.
fn rma_op(op: Op) -> Result<ffi::MPI_Op> {
    if op.is_one_sided_only() {
        return Err(Error::NotSupported(format!(
            "{} on a window of the host MPI library (PAGEWIRE_TRANSPORT=mpi): its handle is \
             not among rsmpi's bindings; pagewire's own transport has it",
            op.mpi_name()
        )));
    }
    Ok(mpi_op(op).as_raw())
}

fn count(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        Error::invalid(
            ErrorClass::Count,
            format!("{n} elements exceed MPI's int count; split it"),
        )
    })
}

fn byte() -> ffi::MPI_Datatype {
    u8::equivalent_datatype().as_raw()
}

impl HostWindow {
    /// `MPI_Win_create` over `bytes` bytes at `base` (displacements in bytes) and a control
    /// window, both in a lock-all epoch. Collective over `comm`.
    ///
    /// The memory at `base` must stay valid until [`HostWindow::free`] returns.
    pub(super) fn create(comm: &PeerComm, base: *mut u8, bytes: usize) -> Result<HostWindow> {
        let raw = comm.as_raw();
        let size = ffi::MPI_Aint::try_from(bytes)
            .map_err(|_| Error::InvalidArgument(format!("a window of {bytes} bytes")))?;
        // SAFETY: RSMPI_* are constants of rsmpi's C shim.
        let (info, errors) = unsafe { (ffi::RSMPI_INFO_NULL, ffi::RSMPI_ERRORS_RETURN) };
        // SAFETY: `base` covers `bytes` bytes for the window's life (the caller's contract);
        // MPI writes the handle.
        let mut win: ffi::MPI_Win = unsafe { std::mem::zeroed() };
        check("MPI_Win_create", unsafe {
            ffi::MPI_Win_create(base.cast::<c_void>(), size, 1, info, raw, &mut win)
        })?;
        // SAFETY: a live window.
        check("MPI_Win_set_errhandler", unsafe {
            ffi::MPI_Win_set_errhandler(win, errors)
        })?;
        let mut control: ffi::MPI_Win = unsafe { std::mem::zeroed() };
        let mut control_base: *mut u64 = std::ptr::null_mut();
        // SAFETY: MPI allocates CONTROL_BYTES and writes their address and the handle.
        check("MPI_Win_allocate", unsafe {
            ffi::MPI_Win_allocate(
                CONTROL_BYTES as ffi::MPI_Aint,
                1,
                info,
                raw,
                (&mut control_base as *mut *mut u64).cast::<c_void>(),
                &mut control,
            )
        })?;
        // SAFETY: MPI's own memory of CONTROL_BYTES, not yet exposed to any access epoch.
        unsafe { std::ptr::write_bytes(control_base.cast::<u8>(), 0, CONTROL_BYTES) };
        let w = HostWindow {
            win,
            control,
            control_base,
            freed: false,
        };
        // SAFETY: live windows.
        check("MPI_Win_set_errhandler", unsafe {
            ffi::MPI_Win_set_errhandler(control, errors)
        })?;
        // Every rank's control words are zero before anyone locks.
        check("MPI_Barrier", unsafe { ffi::MPI_Barrier(raw) })?;
        check("MPI_Win_lock_all", unsafe { ffi::MPI_Win_lock_all(0, win) })?;
        check("MPI_Win_lock_all", unsafe {
            ffi::MPI_Win_lock_all(0, control)
        })?;
        Ok(w)
    }

    /// `MPI_Put` of `src` at byte `disp` of `target`, completed locally.
    pub(crate) fn put(&self, target: i32, disp: u64, src: &[u8]) -> Result<()> {
        let n = count(src.len())?;
        // SAFETY: `src` is borrowed until the local flush below completes the put.
        check("MPI_Put", unsafe {
            ffi::MPI_Put(
                src.as_ptr().cast(),
                n,
                byte(),
                target,
                disp as ffi::MPI_Aint,
                n,
                byte(),
                self.win,
            )
        })?;
        self.flush_local(target)
    }

    /// `MPI_Get` into `dst` from byte `disp` of `target`, completed.
    pub(crate) fn get(&self, target: i32, disp: u64, dst: &mut [u8]) -> Result<()> {
        let n = count(dst.len())?;
        // SAFETY: `dst` is borrowed until the local flush below completes the get.
        check("MPI_Get", unsafe {
            ffi::MPI_Get(
                dst.as_mut_ptr().cast(),
                n,
                byte(),
                target,
                disp as ffi::MPI_Aint,
                n,
                byte(),
                self.win,
            )
        })?;
        self.flush_local(target)
    }

    /// `MPI_Accumulate` (or `MPI_Get_accumulate` into `result`) of `origin`, elements of
    /// `unit`, at byte `disp` of `target` with `op`; completed locally.
    pub(crate) fn accumulate(
        &self,
        (target, disp): (i32, u64),
        (unit, size_of_unit): (Primitive, usize),
        op: Op,
        origin: &[u8],
        result: Option<&mut [u8]>,
    ) -> Result<()> {
        let dt = datatype(unit)?;
        let op = rma_op(op)?;
        let n = count(origin.len() / size_of_unit.max(1))?;
        match result {
            None => {
                // SAFETY: `origin` is borrowed until the local flush below.
                check("MPI_Accumulate", unsafe {
                    ffi::MPI_Accumulate(
                        origin.as_ptr().cast(),
                        n,
                        dt,
                        target,
                        disp as ffi::MPI_Aint,
                        n,
                        dt,
                        op,
                        self.win,
                    )
                })?
            }
            Some(result) => {
                // SAFETY: both buffers are borrowed until the local flush below.
                check("MPI_Get_accumulate", unsafe {
                    ffi::MPI_Get_accumulate(
                        origin.as_ptr().cast(),
                        n,
                        dt,
                        result.as_mut_ptr().cast(),
                        n,
                        dt,
                        target,
                        disp as ffi::MPI_Aint,
                        n,
                        dt,
                        op,
                        self.win,
                    )
                })?
            }
        }
        self.flush_local(target)
    }

    /// `MPI_Compare_and_swap` of one element of `unit` at byte `disp` of `target`: its old
    /// value into `result`.
    pub(crate) fn compare_and_swap(
        &self,
        target: i32,
        disp: u64,
        unit: Primitive,
        compare: &[u8],
        swap: &[u8],
        result: &mut [u8],
    ) -> Result<()> {
        let dt = datatype(unit)?;
        // SAFETY: the three buffers are borrowed until the local flush below.
        check("MPI_Compare_and_swap", unsafe {
            ffi::MPI_Compare_and_swap(
                swap.as_ptr().cast(),
                compare.as_ptr().cast(),
                result.as_mut_ptr().cast(),
                dt,
                target,
                disp as ffi::MPI_Aint,
                self.win,
            )
        })?;
        self.flush_local(target)
    }

    /// Compare-and-swap of `target`'s control word `word`: its old value.
    pub(crate) fn control_cas(
        &self,
        target: i32,
        word: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        let mut old = 0u64;
        // SAFETY: locals borrowed until the flush below.
        check("MPI_Compare_and_swap", unsafe {
            ffi::MPI_Compare_and_swap(
                (&swap as *const u64).cast(),
                (&compare as *const u64).cast(),
                (&mut old as *mut u64).cast(),
                u64::equivalent_datatype().as_raw(),
                target,
                (word * 8) as ffi::MPI_Aint,
                self.control,
            )
        })?;
        check("MPI_Win_flush", unsafe {
            ffi::MPI_Win_flush(target, self.control)
        })?;
        Ok(old)
    }

    /// Fetch-and-add of `target`'s control word `word`: its old value.
    pub(crate) fn control_add(&self, target: i32, word: u64, add: u64) -> Result<u64> {
        let mut old = 0u64;
        // SAFETY: locals borrowed until the flush below.
        check("MPI_Fetch_and_op", unsafe {
            ffi::MPI_Fetch_and_op(
                (&add as *const u64).cast(),
                (&mut old as *mut u64).cast(),
                u64::equivalent_datatype().as_raw(),
                target,
                (word * 8) as ffi::MPI_Aint,
                mpi_op(Op::Sum).as_raw(),
                self.control,
            )
        })?;
        check("MPI_Win_flush", unsafe {
            ffi::MPI_Win_flush(target, self.control)
        })?;
        Ok(old)
    }

    /// This rank's own control word `word`, as it is (read after a barrier, when no rank
    /// accesses it).
    pub(crate) fn own_control(&self, word: usize) -> u64 {
        // SAFETY: MPI's memory of CONTROL_BYTES; `word` < 2; the caller reads it when no
        // access is in flight, after MPI_Win_sync.
        unsafe {
            ffi::MPI_Win_sync(self.control);
            std::ptr::read_volatile(self.control_base.add(word))
        }
    }

    fn flush_local(&self, target: i32) -> Result<()> {
        // SAFETY: a live window in a lock-all epoch.
        check("MPI_Win_flush_local", unsafe {
            ffi::MPI_Win_flush_local(target, self.win)
        })
    }

    /// Completes this rank's operations on `target` at the target.
    pub(crate) fn flush(&self, target: i32) -> Result<()> {
        // SAFETY: a live window in a lock-all epoch.
        check("MPI_Win_flush", unsafe {
            ffi::MPI_Win_flush(target, self.win)
        })
    }

    /// Completes this rank's operations on every target.
    pub(crate) fn flush_all(&self) -> Result<()> {
        // SAFETY: as above.
        check("MPI_Win_flush_all", unsafe {
            ffi::MPI_Win_flush_all(self.win)
        })?;
        // SAFETY: as above.
        check("MPI_Win_sync", unsafe { ffi::MPI_Win_sync(self.win) })
    }

    /// Leaves the windows to `MPI_Finalize` (a rank unwinding from a panic cannot free
    /// them: freeing is collective).
    pub(crate) fn leave_to_finalize(&mut self) {
        self.freed = true;
    }

    /// Ends the epoch and frees both windows (collective).
    pub(crate) fn free(&mut self) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        self.freed = true;
        // SAFETY: live windows in their lock-all epochs; freed once.
        unsafe {
            check("MPI_Win_unlock_all", ffi::MPI_Win_unlock_all(self.win))?;
            check("MPI_Win_unlock_all", ffi::MPI_Win_unlock_all(self.control))?;
            check("MPI_Win_free", ffi::MPI_Win_free(&mut self.win))?;
            check("MPI_Win_free", ffi::MPI_Win_free(&mut self.control))
        }
    }
}

impl Drop for HostWindow {
    fn drop(&mut self) {
        if !self.freed && !super::ffi::is_finalized() {
            let _ = self.free();
        }
    }
}

impl super::communicator::HostMpiComm {
    /// A window of the host MPI library over `bytes` bytes at `base` on this communicator
    /// (collective). `base` must stay valid until the window is freed.
    pub(crate) fn create_window(&self, base: *mut u8, bytes: usize) -> Result<HostWindow> {
        HostWindow::create(self.peer_comm(), base, bytes)
    }
}
