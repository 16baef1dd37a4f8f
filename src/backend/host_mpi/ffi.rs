//! Every call into the host MPI library: rsmpi's safe API (`mpi`) where it does what the
//! backend needs (communicators; collectives, which keep MPI's default
//! `MPI_ERRORS_ARE_FATAL`), and its raw bindings (`mpi::ffi`, mpi-sys) where rsmpi does not
//! return MPI's error codes or has no call (point-to-point with `MPI_ERRORS_RETURN`, matched
//! probes, `MPI_Reduce_scatter`). The only file of the host-MPI backend that names rsmpi, and
//! its only `unsafe`; the rest checks arguments and lays out buffers.
//!
//! Data movement goes as bytes (`MPI_BYTE`); reductions are typed: [`typed!`] finds the
//! primitive type behind a generic [`Element`] so that rsmpi passes its datatype, and
//! [`mpi_op`] maps [`Op`] to the predefined `MPI_Op`.
#![allow(unsafe_code)]
// `typed!` wraps unit-valued rsmpi calls in `Ok(..)`.
#![allow(clippy::unit_arg)]

use std::any::TypeId;
use std::ffi::{c_int, c_void};

use mpi::collective::{CommunicatorCollectives as _, Root as _, SystemOperation as MpiOp};
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use pagewire_collectives::{Element, Op};
use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::msg::Status;

use crate::datatype::Count;
use crate::error::{Error, Result};
use crate::ErrorClass;

/// Runs `$body` with `$u` the concrete primitive type that the generic `$t` is, so that
/// rsmpi's typed calls see the right MPI datatype; `Err` for a type MPI has no datatype for.
macro_rules! typed {
    ($t:ty, |$u:ident| $body:expr) => {{
        let id = TypeId::of::<$t>();
        typed!(@chain id, $t, $u, $body; u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64)
    }};
    (@chain $id:ident, $t:ty, $u:ident, $body:expr; $($p:ident),*) => {
        $(
            if $id == TypeId::of::<$p>() {
                #[allow(dead_code)]
                type $u = $p;
                Ok($body)
            } else
        )* {
            Err(no_datatype::<$t>())
        }
    };
}

/// Whether MPI has a datatype for `T` (a primitive integer or float of at most 64 bits).
pub(super) fn has_datatype<T: Element>() -> bool {
    typed!(T, |U| ()).is_ok()
}

fn no_datatype<T: Element>() -> Error {
    Error::invalid(
        ErrorClass::Type,
        format!(
            "{}: MPI has no datatype for it; the host-MPI backend cannot reduce it",
            T::RUST_NAME
        ),
    )
}

/// `s` as `U`, which [`typed!`] has found to be `T` itself.
fn cast<T: Element, U: bytemuck::Pod>(s: &[T]) -> &[U] {
    bytemuck::cast_slice(s)
}

/// `s` as `U`, which [`typed!`] has found to be `T` itself.
fn cast_mut<T: Element, U: bytemuck::Pod>(s: &mut [T]) -> &mut [U] {
    bytemuck::cast_slice_mut(s)
}

/// The predefined `MPI_Op` of `op`.
pub(super) fn mpi_op(op: Op) -> MpiOp {
    match op {
        Op::Sum => MpiOp::sum(),
        Op::Product => MpiOp::product(),
        Op::Min => MpiOp::min(),
        Op::Max => MpiOp::max(),
        Op::LogicalAnd => MpiOp::logical_and(),
        Op::LogicalOr => MpiOp::logical_or(),
        Op::LogicalXor => MpiOp::logical_xor(),
        Op::BitAnd => MpiOp::bitwise_and(),
        Op::BitOr => MpiOp::bitwise_or(),
        Op::BitXor => MpiOp::bitwise_xor(),
        Op::Replace | Op::NoOp => unreachable!("refused by reduction::check"),
    }
}

// ---- communicators ---------------------------------------------------------------------------

/// An MPI communicator (`MPI_Comm`), freed when dropped.
pub(super) type Comm = SimpleCommunicator;

/// Whether `MPI_Finalize` has run: nothing may be freed after it.
pub(super) fn is_finalized() -> bool {
    mpi::environment::is_finalized()
}

/// This process's rank in `comm`.
pub(super) fn rank(comm: &Comm) -> usize {
    usize::try_from(comm.rank()).expect("MPI ranks are non-negative")
}

/// Ranks in `comm`.
pub(super) fn size(comm: &Comm) -> usize {
    usize::try_from(comm.size()).expect("MPI sizes are positive")
}

/// `MPI_Comm_dup` (collective).
pub(super) fn duplicate(comm: &Comm) -> Comm {
    comm.duplicate()
}

/// `MPI_Comm_split` (collective); `None` as color is `MPI_UNDEFINED`, which joins none.
pub(super) fn split(comm: &Comm, color: Option<i32>, key: i32) -> Option<Comm> {
    let color = match color {
        Some(c) => Color::with_value(c),
        None => Color::undefined(),
    };
    comm.split_by_color_with_key(color, key)
}

/// What point-to-point calls address: an intracommunicator (ranks of its own group) or an
/// intercommunicator (ranks of the other group: `MPI_Comm_spawn`'s result and the parent).
pub(super) enum PeerComm {
    /// An intracommunicator, freed when dropped.
    Intra(Comm),
    /// An intercommunicator that this process created (`MPI_Comm_spawn`), freed when
    /// dropped.
    Inter(ffi::MPI_Comm),
    /// The parent intercommunicator (`MPI_Comm_get_parent`): MPI's own handle, never freed
    /// (a second `parent()` returns the same handle), as rsmpi does.
    Parent(ffi::MPI_Comm),
}

impl PeerComm {
    /// The `MPI_Comm` handle.
    pub(super) fn as_raw(&self) -> ffi::MPI_Comm {
        match self {
            PeerComm::Intra(c) => c.as_raw(),
            PeerComm::Inter(c) | PeerComm::Parent(c) => *c,
        }
    }

    /// Ranks the calls address: the group's own, or the other group's for an
    /// intercommunicator (rsmpi's `target_size`).
    pub(super) fn target_size(&self) -> usize {
        match self {
            PeerComm::Intra(c) => size(c),
            PeerComm::Inter(c) | PeerComm::Parent(c) => {
                let mut n: c_int = 0;
                // SAFETY: a live intercommunicator; writes one int.
                unsafe { ffi::MPI_Comm_remote_size(*c, &mut n) };
                usize::try_from(n).expect("MPI sizes are non-negative")
            }
        }
    }

    /// This process's rank and the size of its own group.
    pub(super) fn local_rank_and_size(&self) -> (usize, usize) {
        let (mut rank, mut n): (c_int, c_int) = (0, 0);
        // SAFETY: a live communicator; each call writes one int.
        unsafe {
            ffi::MPI_Comm_rank(self.as_raw(), &mut rank);
            ffi::MPI_Comm_size(self.as_raw(), &mut n);
        }
        (rank.max(0) as usize, n.max(0) as usize)
    }
}

impl Drop for PeerComm {
    fn drop(&mut self) {
        if let PeerComm::Inter(c) = self {
            if !is_finalized() {
                // SAFETY: an intercommunicator this process owns, used by nothing after this;
                // MPI_Comm_free is local (MPI_Comm_disconnect would wait for the other group).
                unsafe { ffi::MPI_Comm_free(c) };
            }
        }
    }
}

/// `MPI_Comm_spawn_multiple` of `maxprocs[i]` processes of `commands[i]`, collective over
/// `comm` (an intracommunicator with `MPI_ERRORS_RETURN`, so that a failed spawn is an
/// [`Error::Mpi`] on every rank with MPI's message, not an abort whose text hydra may drop),
/// the commands and counts taken from `root`.
pub(super) fn spawn(
    comm: &PeerComm,
    root: i32,
    commands: &[std::process::Command],
    maxprocs: &[i32],
) -> Result<PeerComm> {
    use std::ffi::CString;
    if let Some(c) = commands.iter().find(|c| c.get_envs().len() > 0) {
        return Err(Error::NotSupported(format!(
            "spawn of {c:?}: environment variables on the command are not passed to spawned \
             processes (rsmpi has no way to either); set them before mpirun"
        )));
    }
    let c_string = |s: &std::ffi::OsStr| {
        CString::new(s.to_string_lossy().into_owned())
            .map_err(|_| Error::InvalidArgument(format!("spawn: {s:?} holds a NUL byte")))
    };
    let programs = commands
        .iter()
        .map(|c| c_string(c.get_program()))
        .collect::<Result<Vec<_>>>()?;
    let args = commands
        .iter()
        .map(|c| c.get_args().map(c_string).collect::<Result<Vec<_>>>())
        .collect::<Result<Vec<_>>>()?;
    // MPI takes `char *` everywhere and writes through none of them.
    let mut program_ptrs: Vec<*mut std::ffi::c_char> =
        programs.iter().map(|p| p.as_ptr().cast_mut()).collect();
    let mut argv_ptrs: Vec<Vec<*mut std::ffi::c_char>> = args
        .iter()
        .map(|a| {
            a.iter()
                .map(|s| s.as_ptr().cast_mut())
                .chain(std::iter::once(std::ptr::null_mut()))
                .collect()
        })
        .collect();
    let mut argvs: Vec<*mut *mut std::ffi::c_char> =
        argv_ptrs.iter_mut().map(|a| a.as_mut_ptr()).collect();
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let infos = vec![unsafe { ffi::RSMPI_INFO_NULL }; commands.len()];
    let total: usize = maxprocs.iter().map(|&n| n.max(0) as usize).sum();
    let mut errcodes: Vec<c_int> = vec![0; total];
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let mut raw = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: `commands.len()` programs, NULL-terminated argument vectors, counts and infos,
    // all alive across the (blocking) call; one errcode per process; one handle written.
    let rc = unsafe {
        ffi::MPI_Comm_spawn_multiple(
            count(commands.len())?,
            program_ptrs.as_mut_ptr(),
            argvs.as_mut_ptr(),
            maxprocs.as_ptr(),
            infos.as_ptr(),
            root,
            comm.as_raw(),
            &mut raw,
            errcodes.as_mut_ptr(),
        )
    };
    check("MPI_Comm_spawn_multiple", rc)?;
    let failed = errcodes
        .iter()
        .filter(|&&c| c != ffi::MPI_SUCCESS as c_int)
        .count();
    // SAFETY: reads a constant that rsmpi's C shim defines.
    if raw == unsafe { ffi::RSMPI_COMM_NULL } {
        return Err(Error::Bootstrap(format!(
            "spawn of {commands:?}: MPI returned no intercommunicator"
        )));
    }
    // Owned from here: freed when dropped, on the error path too.
    let inter = PeerComm::Inter(raw);
    if failed > 0 {
        return Err(Error::Bootstrap(format!(
            "spawn of {commands:?}: {failed} of {total} processes did not start"
        )));
    }
    Ok(inter)
}

/// The intercommunicator to the processes that spawned this one (`MPI_Comm_get_parent`),
/// if they did.
pub(super) fn parent() -> Option<PeerComm> {
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let mut raw = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: writes one handle.
    unsafe { ffi::MPI_Comm_get_parent(&mut raw) };
    // SAFETY: reads a constant that rsmpi's C shim defines.
    (raw != unsafe { ffi::RSMPI_COMM_NULL }).then_some(PeerComm::Parent(raw))
}

/// `MPI_Intercomm_merge` of `inter` (collective over both groups): this group's ranks
/// after the other's when `high`.
pub(super) fn merge(inter: &PeerComm, high: bool) -> Result<Comm> {
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let mut raw = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: a live intercommunicator; writes one handle.
    let rc = unsafe { ffi::MPI_Intercomm_merge(inter.as_raw(), c_int::from(high), &mut raw) };
    check("MPI_Intercomm_merge", rc)?;
    // SAFETY: reads a constant that rsmpi's C shim defines.
    if raw == unsafe { ffi::RSMPI_COMM_NULL } {
        return Err(Error::Bootstrap(
            "MPI_Intercomm_merge returned no communicator".into(),
        ));
    }
    // SAFETY: a new, live intracommunicator that nothing else holds.
    Ok(unsafe { <SimpleCommunicator as mpi::raw::FromRaw>::from_raw(raw) })
}

/// The rank in `MPI_COMM_WORLD` of each rank of `comm`; `None` for a process outside this
/// world (one of another job's, after a merge with spawned processes).
pub(super) fn world_ranks(comm: &Comm) -> Vec<Option<usize>> {
    use mpi::topology::Group as _;
    let world = SimpleCommunicator::world().group();
    let ranks: Vec<i32> = (0..comm.size()).collect();
    comm.group()
        .translate_ranks(&ranks, &world)
        .into_iter()
        .map(|r| r.and_then(|r| usize::try_from(r).ok()))
        .collect()
}

/// `MPI_Comm_create_group`: a communicator of `comm`'s ranks `members`, in that order,
/// collective over the members only; `tag` tells concurrent calls apart.
pub(super) fn create_from_members(comm: &Comm, members: &[i32], tag: i32) -> Result<Comm> {
    use mpi::topology::Group as _;
    let group = comm.group().include(members);
    comm.split_by_subgroup_with_tag(&group, tag)
        .ok_or_else(|| Error::InvalidArgument("this rank is not among the members".into()))
}

pub(super) fn errors_return(comm: &PeerComm) -> Result<()> {
    // SAFETY: a live communicator and a predefined error handler.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
    check("MPI_Comm_set_errhandler", rc)
}

// ---- point-to-point (MPI_ERRORS_RETURN) ------------------------------------------------------

/// An `MPI_Request` handle.
pub(super) type Request = ffi::MPI_Request;

pub(super) fn any_source() -> i32 {
    // SAFETY: reads a constant that rsmpi's C shim defines.
    unsafe { ffi::RSMPI_ANY_SOURCE }
}

pub(super) fn tag_or_any(tag: Option<i32>) -> i32 {
    // SAFETY: reads a constant that rsmpi's C shim defines.
    tag.unwrap_or(unsafe { ffi::RSMPI_ANY_TAG })
}

pub(super) fn is_null(r: &Request) -> bool {
    // SAFETY: reads a constant that rsmpi's C shim defines.
    *r == unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn byte() -> ffi::MPI_Datatype {
    u8::equivalent_datatype().as_raw()
}

fn empty_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is a C struct of integers, for which all zeroes is valid.
    unsafe { std::mem::zeroed() }
}

/// MPI's text for `code`.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as the call requires.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {code}");
    }
    buf.truncate(len.clamp(0, ffi::MPI_MAX_ERROR_STRING as c_int) as usize);
    String::from_utf8_lossy(&buf).trim().to_string()
}

fn error_class(code: c_int) -> c_int {
    let mut class: c_int = code;
    // SAFETY: writes one int.
    unsafe { ffi::MPI_Error_class(code, &mut class) };
    class
}

pub(super) fn check(call: &'static str, code: c_int) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(Error::Mpi {
            call,
            code,
            class: super::error_class::from_host(error_class(code)),
            message: error_string(code),
        })
    }
}

/// The status of a completed receive of at most `cap` bytes, or its error. A truncation
/// is [`Error::Mpi`] with the class `MPI_ERR_TRUNCATE` and a message naming the sender,
/// tag and buffer: not [`Error::Truncated`], which carries the message's length, since
/// MPI does not report it (MPICH 4.0 leaves a meaningless count in the status).
fn received(call: &'static str, code: c_int, st: &ffi::MPI_Status, cap: usize) -> Result<Status> {
    let s = mpi::point_to_point::Status::from_raw(*st);
    if code != ffi::MPI_SUCCESS as c_int {
        if error_class(code) == ffi::MPI_ERR_TRUNCATE as c_int {
            return Err(Error::Mpi {
                call,
                code,
                class: ErrorClass::Truncate,
                message: format!(
                    "message truncated: rank {} sent more than the {cap}-byte receive \
                     buffer holds with tag {} (MPI does not say how much more)",
                    s.source_rank(),
                    s.tag()
                ),
            });
        }
        check(call, code)?;
    }
    Ok(status(&s))
}

fn status(s: &mpi::point_to_point::Status) -> Status {
    Status {
        source: s.source_rank().max(0) as usize,
        tag: s.tag(),
        count: s.count(u8::equivalent_datatype()).max(0) as usize,
    }
}

fn count(len: usize) -> Result<c_int> {
    c_int::try_from(len).map_err(|_| {
        Error::invalid(
            ErrorClass::Count,
            format!("{len} bytes exceed MPI's int count; split the message"),
        )
    })
}

pub(super) fn send(comm: &PeerComm, buf: &[u8], dest: i32, tag: i32, sync: bool) -> Result<()> {
    let n = count(buf.len())?;
    let p = buf.as_ptr().cast::<c_void>();
    // SAFETY: MPI reads `n` bytes of `buf`, which is borrowed for the whole (blocking) call.
    let rc = unsafe {
        if sync {
            ffi::MPI_Ssend(p, n, byte(), dest, tag, comm.as_raw())
        } else {
            ffi::MPI_Send(p, n, byte(), dest, tag, comm.as_raw())
        }
    };
    check(if sync { "MPI_Ssend" } else { "MPI_Send" }, rc)
}

pub(super) fn recv(comm: &PeerComm, buf: &mut [u8], source: i32, tag: i32) -> Result<Status> {
    let n = count(buf.len())?;
    let mut st = empty_status();
    // SAFETY: MPI writes at most `n` bytes into `buf`, borrowed mutably for the whole
    // (blocking) call, and one status.
    let rc = unsafe {
        ffi::MPI_Recv(
            buf.as_mut_ptr().cast(),
            n,
            byte(),
            source,
            tag,
            comm.as_raw(),
            &mut st,
        )
    };
    received("MPI_Recv", rc, &st, buf.len())
}

/// `MPI_Sendrecv` of bytes: `send` to `dest`, into `recv` from `source`.
#[allow(clippy::too_many_arguments)]
pub(super) fn sendrecv(
    comm: &PeerComm,
    send: &[u8],
    dest: i32,
    send_tag: i32,
    recv: &mut [u8],
    source: i32,
    recv_tag: i32,
) -> Result<Status> {
    let (ns, nr) = (count(send.len())?, count(recv.len())?);
    let mut st = empty_status();
    // SAFETY: MPI reads `ns` bytes of `send` and writes at most `nr` bytes into `recv` (a
    // distinct, mutably borrowed slice) and one status, within this blocking call.
    let rc = unsafe {
        ffi::MPI_Sendrecv(
            send.as_ptr().cast(),
            ns,
            byte(),
            dest,
            send_tag,
            recv.as_mut_ptr().cast(),
            nr,
            byte(),
            source,
            recv_tag,
            comm.as_raw(),
            &mut st,
        )
    };
    received("MPI_Sendrecv", rc, &st, recv.len())
}

pub(super) fn probe(comm: &PeerComm, source: i32, tag: i32) -> Result<Status> {
    let mut st = empty_status();
    // SAFETY: writes one status.
    let rc = unsafe { ffi::MPI_Probe(source, tag, comm.as_raw(), &mut st) };
    check("MPI_Probe", rc)?;
    Ok(status(&mpi::point_to_point::Status::from_raw(st)))
}

pub(super) fn iprobe(comm: &PeerComm, source: i32, tag: i32) -> Result<Option<Status>> {
    let mut st = empty_status();
    let mut flag: c_int = 0;
    // SAFETY: writes one flag and one status.
    let rc = unsafe { ffi::MPI_Iprobe(source, tag, comm.as_raw(), &mut flag, &mut st) };
    check("MPI_Iprobe", rc)?;
    Ok((flag != 0).then(|| status(&mpi::point_to_point::Status::from_raw(st))))
}

/// An `MPI_Message` handle.
pub(super) type Message = ffi::MPI_Message;

pub(super) fn is_null_message(m: &Message) -> bool {
    // SAFETY: reads a constant that rsmpi's C shim defines.
    *m == unsafe { ffi::RSMPI_MESSAGE_NULL }
}

pub(super) fn improbe(comm: &PeerComm, source: i32, tag: i32) -> Result<Option<(Message, Status)>> {
    let mut st = empty_status();
    let mut flag: c_int = 0;
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let mut msg = unsafe { ffi::RSMPI_MESSAGE_NULL };
    // SAFETY: writes one flag, one message handle and one status.
    let rc = unsafe { ffi::MPI_Improbe(source, tag, comm.as_raw(), &mut flag, &mut msg, &mut st) };
    check("MPI_Improbe", rc)?;
    Ok((flag != 0).then(|| (msg, status(&mpi::point_to_point::Status::from_raw(st)))))
}

pub(super) fn mrecv(msg: &mut Message, buf: &mut [u8]) -> Result<Status> {
    let n = count(buf.len())?;
    let mut st = empty_status();
    // SAFETY: a matched message (MPI sets the handle to MPI_MESSAGE_NULL); MPI writes at
    // most `n` bytes into `buf`, borrowed mutably for the whole (blocking) call.
    let rc = unsafe { ffi::MPI_Mrecv(buf.as_mut_ptr().cast(), n, byte(), msg, &mut st) };
    received("MPI_Mrecv", rc, &st, buf.len())
}

pub(super) fn imrecv(msg: &mut Message, buf: UserBufMut) -> Result<Request> {
    debug_assert!(
        !buf.is_gapped(),
        "the host MPI library is given packed bytes"
    );
    let n = count(buf.len())?;
    let p = buf.addr() as usize as *mut c_void;
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: a matched message; the range is writable and used by nobody else until
    // the request completes (the contract of `UserBufMut::new`); MPI writes at most `n`
    // bytes.
    let rc = unsafe { ffi::MPI_Imrecv(p, n, byte(), msg, &mut req) };
    check("MPI_Imrecv", rc)?;
    Ok(req)
}

pub(super) fn isend(
    comm: &PeerComm,
    buf: UserBuf,
    dest: i32,
    tag: i32,
    sync: bool,
) -> Result<Request> {
    debug_assert!(
        !buf.is_gapped(),
        "the host MPI library is given packed bytes"
    );
    let n = count(buf.len())?;
    let p = buf.addr() as usize as *const c_void;
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: the range is readable and unwritten until the request completes: the
    // contract of `UserBuf::new`, upheld by its creator; the HostRequest that owns the
    // MPI_Request waits for it before it goes away.
    let rc = unsafe {
        if sync {
            ffi::MPI_Issend(p, n, byte(), dest, tag, comm.as_raw(), &mut req)
        } else {
            ffi::MPI_Isend(p, n, byte(), dest, tag, comm.as_raw(), &mut req)
        }
    };
    check(if sync { "MPI_Issend" } else { "MPI_Isend" }, rc)?;
    Ok(req)
}

pub(super) fn irecv(comm: &PeerComm, buf: UserBufMut, source: i32, tag: i32) -> Result<Request> {
    debug_assert!(
        !buf.is_gapped(),
        "the host MPI library is given packed bytes"
    );
    let n = count(buf.len())?;
    let p = buf.addr() as usize as *mut c_void;
    // SAFETY: reads a constant that rsmpi's C shim defines.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: the range is writable and used by nobody else until the request
    // completes: the contract of `UserBufMut::new`; MPI writes at most `n` bytes.
    let rc = unsafe { ffi::MPI_Irecv(p, n, byte(), source, tag, comm.as_raw(), &mut req) };
    check("MPI_Irecv", rc)?;
    Ok(req)
}

pub(super) fn wait(req: &mut Request, cap: usize) -> Result<Status> {
    let mut st = empty_status();
    // SAFETY: a live request (or MPI_REQUEST_NULL, which completes at once); MPI sets
    // it to MPI_REQUEST_NULL.
    let rc = unsafe { ffi::MPI_Wait(req, &mut st) };
    received("MPI_Wait", rc, &st, cap)
}

pub(super) fn test(req: &mut Request, cap: usize) -> Result<Option<Status>> {
    let mut st = empty_status();
    let mut flag: c_int = 0;
    // SAFETY: as `wait`; writes one flag and one status.
    let rc = unsafe { ffi::MPI_Test(req, &mut flag, &mut st) };
    if flag == 0 && rc == ffi::MPI_SUCCESS as c_int {
        return Ok(None);
    }
    received("MPI_Test", rc, &st, cap).map(Some)
}

pub(super) fn is_done(req: &Request) -> bool {
    let mut st = empty_status();
    let mut flag: c_int = 0;
    // SAFETY: a live request, which MPI_Request_get_status leaves live; writes one flag
    // and one status.
    let rc = unsafe { ffi::MPI_Request_get_status(*req, &mut flag, &mut st) };
    rc != ffi::MPI_SUCCESS as c_int || flag != 0
}

pub(super) fn cancel(req: &mut Request) {
    // SAFETY: a live request; the caller waits for it afterwards.
    unsafe { ffi::MPI_Cancel(req) };
}

/// `MPI_Reduce_scatter` on `U`s (rsmpi has only the block variant). Checks the lengths
/// itself, since MPI trusts them.
fn reduce_scatter_of<U: Equivalence>(
    comm: &Comm,
    send: &[U],
    recv: &mut [U],
    counts: &[c_int],
    op: &MpiOp,
) -> Result<()> {
    let n = usize::try_from(mpi::topology::Communicator::size(comm)).unwrap_or(0);
    let rank = usize::try_from(mpi::topology::Communicator::rank(comm)).unwrap_or(0);
    let total: i64 = counts.iter().map(|&c| i64::from(c)).sum();
    assert!(
        counts.len() == n
            && counts.iter().all(|&c| c >= 0)
            && total == send.len() as i64
            && counts[rank] as usize == recv.len(),
        "reduce_scatter: buffers do not match the counts"
    );
    // SAFETY: MPI reads Σ counts = send.len() elements of `send` and writes
    // counts[rank] = recv.len() elements of `recv` (checked above); both are borrowed for
    // the whole call; the datatype is U's.
    let rc = unsafe {
        ffi::MPI_Reduce_scatter(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            counts.as_ptr(),
            U::equivalent_datatype().as_raw(),
            op.as_raw(),
            comm.as_raw(),
        )
    };
    check("MPI_Reduce_scatter", rc)
}

// ---- collectives: data movement, in bytes (MPI_ERRORS_ARE_FATAL) ----------------------------

/// `MPI_Barrier`.
pub(super) fn barrier(comm: &Comm) {
    comm.barrier();
}

/// `MPI_Bcast` of `buf` from `root`.
pub(super) fn broadcast(comm: &Comm, root: i32, buf: &mut [u8]) {
    comm.process_at_rank(root).broadcast_into(buf);
}

/// `MPI_Allgather`.
pub(super) fn all_gather(comm: &Comm, send: &[u8], recv: &mut [u8]) {
    comm.all_gather_into(send, recv);
}

/// `MPI_Allgatherv`: rank `j`'s bytes land at `displs[j]`, `counts[j]` of them.
pub(super) fn all_gather_varcount(
    comm: &Comm,
    send: &[u8],
    recv: &mut [u8],
    counts: &[Count],
    displs: &[Count],
) {
    let mut part = PartitionMut::new(recv, counts, displs);
    comm.all_gather_varcount_into(send, &mut part);
}

/// `MPI_Alltoall`.
pub(super) fn all_to_all(comm: &Comm, send: &[u8], recv: &mut [u8]) {
    comm.all_to_all_into(send, recv);
}

/// `MPI_Alltoallv`: byte counts and displacements per rank of both buffers.
pub(super) fn all_to_all_varcount(
    comm: &Comm,
    (send, send_counts, send_displs): (&[u8], &[Count], &[Count]),
    (recv, recv_counts, recv_displs): (&mut [u8], &[Count], &[Count]),
) {
    let sp = Partition::new(send, send_counts, send_displs);
    let mut rp = PartitionMut::new(recv, recv_counts, recv_displs);
    comm.all_to_all_varcount_into(&sp, &mut rp);
}

/// `MPI_Gather` to `root`, which passes `recv`.
pub(super) fn gather(comm: &Comm, root: i32, send: &[u8], recv: Option<&mut [u8]>) {
    let p = comm.process_at_rank(root);
    match recv {
        Some(recv) => p.gather_into_root(send, recv),
        None => p.gather_into(send),
    }
}

/// `MPI_Gatherv` to `root`, which passes `recv` with byte counts and displacements per rank.
pub(super) fn gather_varcount(
    comm: &Comm,
    root: i32,
    send: &[u8],
    recv: Option<(&mut [u8], &[Count], &[Count])>,
) {
    let p = comm.process_at_rank(root);
    match recv {
        Some((recv, counts, displs)) => {
            let mut part = PartitionMut::new(recv, counts, displs);
            p.gather_varcount_into_root(send, &mut part);
        }
        None => p.gather_varcount_into(send),
    }
}

/// `MPI_Scatter` from `root`, which passes `send`.
pub(super) fn scatter(comm: &Comm, root: i32, send: Option<&[u8]>, recv: &mut [u8]) {
    let p = comm.process_at_rank(root);
    match send {
        Some(send) => p.scatter_into_root(send, recv),
        None => p.scatter_into(recv),
    }
}

/// `MPI_Scatterv` from `root`, which passes `send` with byte counts and displacements per
/// rank.
pub(super) fn scatter_varcount(
    comm: &Comm,
    root: i32,
    send: Option<(&[u8], &[Count], &[Count])>,
    recv: &mut [u8],
) {
    let p = comm.process_at_rank(root);
    match send {
        Some((send, counts, displs)) => {
            let part = Partition::new(send, counts, displs);
            p.scatter_varcount_into_root(&part, recv);
        }
        None => p.scatter_varcount_into(recv),
    }
}

// ---- collectives: reductions, typed (MPI_ERRORS_ARE_FATAL) -----------------------------------

/// `MPI_Reduce` to `root`, which passes `recv`.
pub(super) fn reduce<T: Element>(
    comm: &Comm,
    root: i32,
    send: &[T],
    recv: Option<&mut [T]>,
    op: Op,
) -> Result<()> {
    let op = mpi_op(op);
    let p = comm.process_at_rank(root);
    match recv {
        Some(recv) => typed!(T, |U| p.reduce_into_root(
            cast::<T, U>(send),
            cast_mut::<T, U>(recv),
            op
        )),
        None => typed!(T, |U| p.reduce_into(cast::<T, U>(send), op)),
    }
}

/// `MPI_Allreduce`.
pub(super) fn all_reduce<T: Element>(
    comm: &Comm,
    send: &[T],
    recv: &mut [T],
    op: Op,
) -> Result<()> {
    let op = mpi_op(op);
    typed!(T, |U| comm.all_reduce_into(
        cast::<T, U>(send),
        cast_mut::<T, U>(recv),
        op
    ))
}

/// `MPI_Reduce_scatter_block`.
pub(super) fn reduce_scatter_block<T: Element>(
    comm: &Comm,
    send: &[T],
    recv: &mut [T],
    op: Op,
) -> Result<()> {
    let op = mpi_op(op);
    typed!(T, |U| comm.reduce_scatter_block_into(
        cast::<T, U>(send),
        cast_mut::<T, U>(recv),
        op
    ))
}

/// `MPI_Reduce_scatter` with `counts` elements per rank.
pub(super) fn reduce_scatter<T: Element>(
    comm: &Comm,
    send: &[T],
    recv: &mut [T],
    counts: &[Count],
    op: Op,
) -> Result<()> {
    let op = mpi_op(op);
    typed!(T, |U| reduce_scatter_of(
        comm,
        cast::<T, U>(send),
        cast_mut::<T, U>(recv),
        counts,
        &op
    )?)
}

/// `MPI_Scan`.
pub(super) fn scan<T: Element>(comm: &Comm, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    let op = mpi_op(op);
    typed!(T, |U| comm.scan_into(
        cast::<T, U>(send),
        cast_mut::<T, U>(recv),
        op
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_dispatch_finds_the_primitive_or_refuses() {
        fn name<T: Element>() -> Result<&'static str> {
            typed!(T, |U| std::any::type_name::<U>())
        }
        assert_eq!(name::<u16>().unwrap(), "u16");
        assert_eq!(name::<isize>().unwrap(), "isize");
        assert_eq!(name::<f32>().unwrap(), "f32");
        let e = name::<u128>().unwrap_err().to_string();
        assert!(e.contains("u128: MPI has no datatype"), "{e}");
        assert!(has_datatype::<f64>() && !has_datatype::<i128>());
    }
}
