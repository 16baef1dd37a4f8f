//! The verbs provider's only `unsafe` module: owning handles over libibverbs objects, and the
//! few `static inline` helpers of `<infiniband/verbs.h>` that pagewire calls, written out.
//!
//! Every function here is one libibverbs call (or one inline helper of verbs.h) and can be
//! read against its man page: `ibv_get_device_list(3)`, `ibv_open_device(3)`,
//! `ibv_query_device_ex(3)`, `ibv_query_port(3)`, `ibv_query_gid_ex(3)`, `ibv_alloc_pd(3)`,
//! `ibv_reg_mr(3)`, `ibv_advise_mr(3)`, `ibv_create_cq(3)`, `ibv_create_qp(3)`,
//! `ibv_modify_qp(3)`, `ibv_post_send(3)`, `ibv_post_recv(3)`, `ibv_poll_cq(3)`,
//! `ibv_fork_init(3)`, `ibv_is_fork_initialized(3)`.
//!
//! **Linked and looked up.** Everything is linked except the two entry points newer than
//! libibverbs' IBVERBS_1.1 symbol version, `_ibv_query_gid_ex` (rdma-core 32) and
//! `ibv_is_fork_initialized` (rdma-core 35): those are found with `dlsym` in the libibverbs
//! already loaded ([`LateSymbols`]), so the binary starts against any libibverbs.
//!
//! **Ownership** (after rust-ibverbs, STYLE.md): each handle owns its parent through an
//! `Arc`, so teardown order is right by construction, on error paths too: a
//! [`MemoryRegion`] keeps its [`ProtectionDomain`], a [`QueuePair`] keeps its protection
//! domain and both [`CompletionQueue`]s, and those keep the [`Context`]. A handle is made
//! the moment its `ibv_create_*`/`ibv_alloc_*` call succeeds, so a later failure (a
//! `ibv_modify_qp` that fails, say) drops it and destroys the object. `Drop` never panics;
//! a failing destroy there cannot be reported and is ignored (the kernel reclaims the object
//! when the process exits).
//!
//! **Why some verbs.h inline helpers are written out here.** rdma-sys 0.3.0 reimplements
//! them, but its `verbs_get_ctx` compares `ibv_context::abi_compat` with `u32::MAX`, while
//! verbs.h's `__VERBS_ABI_IS_EXTENDED` is `(void *)UINTPTR_MAX`. On a 64-bit host its
//! helpers therefore never find the extended context: `ibv_query_device_ex` silently falls
//! back to the legacy query (no ODP capabilities: every device would look ODP-less) and
//! `ibv_advise_mr` always returns `EOPNOTSUPP`. `verbs_context_op!` follows verbs.h
//! (`verbs_get_ctx`, `verbs_get_ctx_op`) exactly; the data-path helpers (`ibv_post_send`,
//! `ibv_post_recv`, `ibv_poll_cq`) go through `ibv_context::ops` as verbs.h does.
// The parent module denies `unsafe_code`; this is the one place allowed to use it.
#![allow(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::CStr;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::raw::{c_int, c_uint, c_void};
use std::ptr::{self, NonNull};
use std::sync::{Arc, OnceLock};

use rdma_sys::{
    _compat_ibv_port_attr, ibv_ah_attr, ibv_context, ibv_cq, ibv_device, ibv_device_attr_ex,
    ibv_gid, ibv_gid_entry, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_cap,
    ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc, verbs_context,
};

use super::events::{self, Subject};

/// `_ibv_query_gid_ex` (libibverbs IBVERBS_1.11, rdma-core 32): what verbs.h's inline
/// `ibv_query_gid_ex` calls with `sizeof(struct ibv_gid_entry)`.
type QueryGidExFn = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int;

/// `ibv_is_fork_initialized` (libibverbs IBVERBS_1.13, rdma-core 35): returns an
/// `enum ibv_fork_status` (`IBV_FORK_DISABLED` 0, `IBV_FORK_ENABLED` 1, `IBV_FORK_UNNEEDED` 2).
type IsForkInitializedFn = unsafe extern "C" fn() -> c_uint;

/// The libibverbs entry points newer than IBVERBS_1.1 that the provider uses, looked up at
/// run time instead of linked.
///
/// Linking them would make every binary built with the `verbs` feature refuse to start
/// against an older libibverbs (the dynamic loader wants the symbol version), even one that
/// runs the soft provider. Looked up, the binary needs nothing newer than IBVERBS_1.1
/// (`.ci/verbs.sh` checks), the verbs provider says at `open` which rdma-core it needs, and
/// `ibv_is_fork_initialized` is used where it exists.
struct LateSymbols {
    query_gid_ex: Option<QueryGidExFn>,
    is_fork_initialized: Option<IsForkInitializedFn>,
}

/// The soname this crate links (libibverbs' ABI major has been 1 since it began).
const LIBIBVERBS_SONAME: &CStr = c"libibverbs.so.1";

fn late_symbols() -> &'static LateSymbols {
    static SYMBOLS: OnceLock<LateSymbols> = OnceLock::new();
    SYMBOLS.get_or_init(|| {
        // SAFETY: `RTLD_NOLOAD` only returns a handle to the copy of libibverbs already
        // loaded (this crate links it, so it is); nothing is loaded or initialised. The
        // handle is never closed, so the library and the pointers below stay valid.
        let lib = unsafe {
            libc::dlopen(
                LIBIBVERBS_SONAME.as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD,
            )
        };
        if lib.is_null() {
            return LateSymbols {
                query_gid_ex: None,
                is_fork_initialized: None,
            };
        }
        // SAFETY: `lib` is a live handle; the names are NUL-terminated.
        let (gid, fork) = unsafe {
            (
                libc::dlsym(lib, c"_ibv_query_gid_ex".as_ptr()),
                libc::dlsym(lib, c"ibv_is_fork_initialized".as_ptr()),
            )
        };
        LateSymbols {
            // SAFETY: a non-null address of libibverbs' `_ibv_query_gid_ex`, whose C type
            // (verbs.h) is what `QueryGidExFn` spells out.
            query_gid_ex: (!gid.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut c_void, QueryGidExFn>(gid) }),
            // SAFETY: likewise for `ibv_is_fork_initialized` and `IsForkInitializedFn`.
            is_fork_initialized: (!fork.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut c_void, IsForkInitializedFn>(fork) }),
        }
    })
}

/// Whether the libibverbs in this process has `_ibv_query_gid_ex` (rdma-core 32 or later).
pub(crate) fn has_query_gid_ex() -> bool {
    late_symbols().query_gid_ex.is_some()
}

/// `ibv_is_fork_initialized(3)` as its raw `enum ibv_fork_status`; `None` when the
/// libibverbs in this process predates it (rdma-core 34 and older).
pub(crate) fn fork_status() -> Option<u32> {
    // SAFETY: takes no arguments and only reads libibverbs' state (and, for copy-on-fork,
    // the kernel's); callable at any time.
    late_symbols().is_fork_initialized.map(|f| unsafe { f() })
}

/// `IB_UVERBS_ADVISE_MR_FLAG_FLUSH` (`IBV_ADVISE_MR_FLAG_FLUSH`, verbs_api.h): the advice
/// returns only once the translations are in the NIC (`ibv_advise_mr(3)`). rdma-sys does not
/// bind this anonymous enum.
pub(crate) const ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// C structs for which all-zero bytes are a valid value (`memset(&x, 0, sizeof x)` is how
/// the verbs man pages and examples initialise them).
///
/// # Safety
/// Implement only for `#[repr(C)]` types made of integers, raw pointers, `Option` of
/// function pointers, and arrays, structs and unions of those.
pub(crate) unsafe trait Zeroable: Sized {}

// SAFETY: this and the impls below are for bindgen- or rdma-sys-defined `#[repr(C)]` structs
// of integers (including the `c_uint` enum aliases), raw pointers, and nested structs/unions
// of those; the all-zero bit pattern is a valid value of each.
unsafe impl Zeroable for ibv_device_attr_ex {}
// SAFETY: see above.
unsafe impl Zeroable for ibv_port_attr {}
// SAFETY: see above.
unsafe impl Zeroable for ibv_gid_entry {}
// SAFETY: see above.
unsafe impl Zeroable for ibv_qp_attr {}
// SAFETY: see above.
unsafe impl Zeroable for ibv_ah_attr {}
// SAFETY: see above.
unsafe impl Zeroable for ibv_send_wr {}
// SAFETY: see above.
unsafe impl Zeroable for ibv_recv_wr {}
// SAFETY: see above.
unsafe impl Zeroable for ibv_wc {}

/// An all-zero `T`.
pub(crate) fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `Zeroable` promises that all-zero bytes are a valid `T`.
    unsafe { std::mem::zeroed() }
}

/// The 16 bytes of a GID (`union ibv_gid`).
pub(crate) fn gid_bytes(gid: &ibv_gid) -> [u8; 16] {
    // SAFETY: both members of `union ibv_gid` cover the same 16 bytes of plain integers, so
    // reading `raw` is valid whichever member was written.
    unsafe { gid.raw }
}

/// The immediate data of a completion as it sits in `ibv_wc` (network byte order).
pub(crate) fn wc_imm_raw(wc: &ibv_wc) -> u32 {
    // SAFETY: both members of the union are `u32`; any bit pattern is valid.
    unsafe { wc.imm_data_invalidated_rkey_union.imm_data }
}

/// The immediate data of a send work request as stored (network byte order).
#[cfg(test)]
pub(crate) fn send_wr_imm_raw(wr: &ibv_send_wr) -> u32 {
    // SAFETY: both members of the union are `u32`; any bit pattern is valid.
    unsafe { wr.imm_data_invalidated_rkey_union.imm_data }
}

/// `wr.rdma.remote_addr` and `wr.rdma.rkey` of a send work request.
#[cfg(test)]
pub(crate) fn send_wr_rdma(wr: &ibv_send_wr) -> (u64, u32) {
    // SAFETY: the union's members are structs of integers and raw pointers, and `rdma` is its
    // smallest member, so its bytes are initialised whichever member was written last (the
    // builders start from `zeroed()`); any bit pattern of (u64, u32) is valid.
    unsafe { (wr.wr.rdma.remote_addr, wr.wr.rdma.rkey) }
}

/// `wr.atomic` of a send work request: `(remote_addr, compare_add, swap, rkey)`.
#[cfg(test)]
pub(crate) fn send_wr_atomic(wr: &ibv_send_wr) -> (u64, u64, u64, u32) {
    // SAFETY: the union's members are structs of integers and raw pointers, and `atomic` is
    // its largest member, so its bytes are initialised whichever member was written last (the
    // builders start from `zeroed()`); any bit pattern of these integers is valid.
    let a = unsafe { wr.wr.atomic };
    (a.remote_addr, a.compare_add, a.swap, a.rkey)
}

/// `ibv_wc_status_str(3)`.
pub(crate) fn wc_status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a pointer to a static NUL-terminated string for any
    // value ("unknown" outside the enum).
    let s = unsafe { rdma_sys::ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, static and NUL-terminated (above).
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// `ibv_fork_init(3)`. Returns the errno it reports: `EINVAL` once anything in the process
/// called `ibv_dontfork_range` without fork support enabled, which every memory registration
/// and mlx5's own queue and completion-queue buffers do (`libibverbs/memory.c`: `too_late`);
/// before rdma-core 51 also when the kernel copies DMA pages on fork and fork support is not
/// needed at all (see `fork::plan`).
pub(crate) fn fork_init() -> io::Result<()> {
    // SAFETY: takes no arguments; safe to call at any time (it fails, as above, when it is
    // too late).
    errno_result(unsafe { rdma_sys::ibv_fork_init() })
}

/// A verbs return value that is 0 or an errno value (`ibv_modify_qp(3)` and friends).
fn errno_result(ret: c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(ret))
    }
}

/// `verbs_get_ctx(ctx)` of verbs.h: the `struct verbs_context` around `ctx`, if `ctx` is an
/// extended context (`abi_compat == __VERBS_ABI_IS_EXTENDED`, i.e. `UINTPTR_MAX`).
fn verbs_context_of(ctx: NonNull<ibv_context>) -> Option<NonNull<verbs_context>> {
    // SAFETY: `ctx` comes from a live `Context`; reading one pointer-sized field.
    let abi = unsafe { (*ctx.as_ptr()).abi_compat };
    if abi as usize != usize::MAX {
        return None;
    }
    // SAFETY: an extended context is the last member `context` of a `struct verbs_context`
    // (verbs.h, `verbs_get_ctx`), so stepping back by that member's offset stays inside the
    // same allocation and lands on the containing struct.
    let outer = unsafe {
        ctx.as_ptr()
            .cast::<u8>()
            .sub(offset_of!(verbs_context, context))
            .cast::<verbs_context>()
    };
    NonNull::new(outer)
}

/// `verbs_get_ctx_op(ctx, op)` of verbs.h: the provider's `op` function pointer when the
/// context is extended, large enough to hold `op` (`sz`), and `op` is set.
macro_rules! verbs_context_op {
    ($ctx:expr, $op:ident) => {{
        match verbs_context_of($ctx) {
            None => None,
            Some(v) => {
                // SAFETY: `v` is the live `verbs_context` around a live context; `sz` is its
                // first-initialised size field (verbs.h).
                let sz = unsafe { (*v.as_ptr()).sz };
                if sz < size_of::<verbs_context>() - offset_of!(verbs_context, $op) {
                    None
                } else {
                    // SAFETY: `sz` says the provider's struct extends over `$op`.
                    unsafe { (*v.as_ptr()).$op }
                }
            }
        }
    }};
}

/// The array returned by `ibv_get_device_list(3)`; freed on drop. Contexts opened from it
/// stay valid after that (`ibv_get_device_list(3)`, NOTES).
pub(crate) struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// `ibv_get_device_list`: `Err` carries the errno it set (`ENOSYS`: no kernel support).
    pub(crate) fn get() -> io::Result<DeviceList> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array is ours until
        // ibv_free_device_list.
        let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
        match NonNull::new(list) {
            None => Err(io::Error::last_os_error()),
            Some(list) => Ok(DeviceList {
                list,
                len: usize::try_from(n).unwrap_or(0),
            }),
        }
    }

    fn device(&self, i: usize) -> *mut ibv_device {
        assert!(i < self.len, "device index {i} out of range");
        // SAFETY: the array holds `len` device pointers (then a NULL), `i < len`.
        unsafe { *self.list.as_ptr().add(i) }
    }

    /// `ibv_get_device_name` of every device, in list order.
    pub(crate) fn names(&self) -> Vec<String> {
        (0..self.len)
            .map(|i| {
                // SAFETY: a device of the live list.
                let name = unsafe { rdma_sys::ibv_get_device_name(self.device(i)) };
                if name.is_null() {
                    format!("device{i}")
                } else {
                    // SAFETY: non-null, NUL-terminated, owned by the device.
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned()
                }
            })
            .collect()
    }

    /// `ibv_open_device` on device `i`.
    pub(crate) fn open(&self, i: usize) -> io::Result<Arc<Context>> {
        // SAFETY: a device of the live list.
        let ctx = unsafe { rdma_sys::ibv_open_device(self.device(i)) };
        match NonNull::new(ctx) {
            None => Err(io::Error::last_os_error()),
            Some(ctx) => Ok(Arc::new(Context { ctx })),
        }
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the array came from ibv_get_device_list and is freed once.
        unsafe { rdma_sys::ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// A device context (`ibv_open_device`); closed on drop, after everything made from it.
pub(crate) struct Context {
    ctx: NonNull<ibv_context>,
}

// SAFETY: libibverbs objects may be used and destroyed from any thread: the verbs API is
// thread safe (locks in libibverbs and in each provider guard CQs, QPs and the control path);
// rust-ibverbs relies on the same. Destruction happens once, in `Drop`.
unsafe impl Send for Context {}
// SAFETY: see `Send`; every method takes `&self` and only calls thread-safe verbs.
unsafe impl Sync for Context {}

impl Context {
    /// `ibv_query_device_ex(context, NULL, &attr)`, as verbs.h implements it: the provider's
    /// `query_device_ex`, else (or on `EOPNOTSUPP`/`ENOSYS`) the legacy `ibv_query_device`
    /// into a zeroed `attr`, which then reports no ODP.
    pub(crate) fn query_device_ex(&self) -> io::Result<ibv_device_attr_ex> {
        let mut attr: ibv_device_attr_ex = zeroed();
        if let Some(op) = verbs_context_op!(self.ctx, query_device_ex) {
            // SAFETY: live context, NULL input (allowed), `attr` sized as passed.
            let ret = unsafe {
                op(
                    self.ctx.as_ptr(),
                    ptr::null(),
                    &mut attr,
                    size_of::<ibv_device_attr_ex>(),
                )
            };
            if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
                return errno_result(ret).map(|()| attr);
            }
        }
        attr = zeroed();
        // SAFETY: live context; `orig_attr` is a valid out-pointer.
        errno_result(unsafe { rdma_sys::ibv_query_device(self.ctx.as_ptr(), &mut attr.orig_attr) })
            .map(|()| attr)
    }

    /// `ibv_query_port(context, port, &attr)`, as verbs.h's `___ibv_query_port` implements it.
    pub(crate) fn query_port(&self, port: u8) -> io::Result<ibv_port_attr> {
        let mut attr: ibv_port_attr = zeroed();
        let ret = match verbs_context_op!(self.ctx, query_port) {
            // SAFETY: live context, `attr` sized as passed.
            Some(op) => unsafe {
                op(
                    self.ctx.as_ptr(),
                    port,
                    &mut attr,
                    size_of::<ibv_port_attr>(),
                )
            },
            // SAFETY: the compat struct is the leading part of `ibv_port_attr` (verbs.h
            // casts the same way), and `attr` is zeroed as verbs.h does.
            None => unsafe {
                rdma_sys::ibv_query_port(
                    self.ctx.as_ptr(),
                    port,
                    (&mut attr as *mut ibv_port_attr).cast::<_compat_ibv_port_attr>(),
                )
            },
        };
        errno_result(ret).map(|()| attr)
    }

    /// `ibv_query_gid_ex(context, port, index, &entry, 0)`; `Ok(None)` for an empty entry
    /// (`ENODATA`); `ENOSYS` when libibverbs predates it (rdma-core 31 and older).
    pub(crate) fn query_gid_ex(&self, port: u8, index: u32) -> io::Result<Option<ibv_gid_entry>> {
        let Some(query_gid_ex) = late_symbols().query_gid_ex else {
            return Err(io::Error::from_raw_os_error(libc::ENOSYS));
        };
        let mut entry: ibv_gid_entry = zeroed();
        // SAFETY: live context; `entry` is a valid out-pointer of the size passed; flags 0.
        let ret = unsafe {
            query_gid_ex(
                self.ctx.as_ptr(),
                u32::from(port),
                index,
                &mut entry,
                0,
                size_of::<ibv_gid_entry>(),
            )
        };
        match ret {
            0 => Ok(Some(entry)),
            libc::ENODATA => Ok(None),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    /// `ibv_alloc_pd`.
    pub(crate) fn alloc_pd(self: &Arc<Self>) -> io::Result<Arc<ProtectionDomain>> {
        // SAFETY: live context.
        let pd = unsafe { rdma_sys::ibv_alloc_pd(self.ctx.as_ptr()) };
        match NonNull::new(pd) {
            None => Err(io::Error::last_os_error()),
            Some(pd) => Ok(Arc::new(ProtectionDomain {
                pd,
                _ctx: self.clone(),
            })),
        }
    }

    /// `ibv_create_cq(context, cqe, NULL, NULL, 0)`: no completion channel (pagewire polls).
    pub(crate) fn create_cq(self: &Arc<Self>, cqe: c_int) -> io::Result<Arc<CompletionQueue>> {
        // SAFETY: live context; NULL context, NULL channel and vector 0 are allowed.
        let cq = unsafe {
            rdma_sys::ibv_create_cq(self.ctx.as_ptr(), cqe, ptr::null_mut(), ptr::null_mut(), 0)
        };
        match NonNull::new(cq) {
            None => Err(io::Error::last_os_error()),
            Some(cq) => {
                // SAFETY: a live CQ returned just now; `cqe` is the size it got, fixed until
                // an `ibv_resize_cq`, which pagewire never calls.
                let cqe = unsafe { (*cq.as_ptr()).cqe };
                Ok(Arc::new(CompletionQueue {
                    cq,
                    cqe: u32::try_from(cqe).unwrap_or(0),
                    _ctx: self.clone(),
                }))
            }
        }
    }
}

/// `union` of `struct ibv_async_event`: which member is valid depends on the event type.
#[repr(C)]
#[derive(Clone, Copy)]
union RawAsyncElement {
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    other: *mut c_void,
    port_num: c_int,
}

/// `struct ibv_async_event` with the event type as a plain integer: rdma-sys's binding makes
/// it a Rust `enum`, which a value from a newer kernel or library would make undefined
/// behaviour to hold. Same layout (checked in the tests).
#[repr(C)]
struct RawAsyncEvent {
    element: RawAsyncElement,
    event_type: c_uint,
}

/// What an asynchronous event was about, read before it was acknowledged (after that the
/// object may be destroyed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AsyncElement {
    /// A queue pair, by number.
    QueuePair(u32),
    /// A completion queue, by address ([`CompletionQueue::address`]).
    CompletionQueue(usize),
    /// A port, by number.
    Port(i32),
    /// The device, or an object pagewire does not make (SRQ, WQ).
    Other,
}

/// One asynchronous event, already acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AsyncEvent {
    /// The `enum ibv_event_type` value.
    pub event_type: u32,
    /// What it was about.
    pub element: AsyncElement,
}

impl Context {
    /// Makes `ibv_get_async_event` return at once when no event is waiting
    /// (`ibv_get_async_event(3)`, EXAMPLES: `O_NONBLOCK` on `context->async_fd`).
    pub(crate) fn set_async_nonblocking(&self) -> io::Result<()> {
        // SAFETY: reading one int field of a live context.
        let fd = unsafe { (*self.ctx.as_ptr()).async_fd };
        // SAFETY: `fd` is the context's open event file; F_GETFL/F_SETFL only read and set its
        // status flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next asynchronous event, acknowledged at once (`ibv_get_async_event`, then
    /// `ibv_ack_async_event`: destroying a queue pair or completion queue waits for its
    /// events to be acknowledged); `Ok(None)` when none is waiting (after
    /// [`Context::set_async_nonblocking`]).
    pub(crate) fn next_async_event(&self) -> io::Result<Option<AsyncEvent>> {
        let mut raw = RawAsyncEvent {
            element: RawAsyncElement {
                other: ptr::null_mut(),
            },
            event_type: 0,
        };
        let raw_ptr = (&mut raw as *mut RawAsyncEvent).cast::<rdma_sys::ibv_async_event>();
        // SAFETY: live context; `raw` has the layout of `struct ibv_async_event`, which
        // libibverbs fills (the type as an int, which `RawAsyncEvent` reads as one).
        if unsafe { rdma_sys::ibv_get_async_event(self.ctx.as_ptr(), raw_ptr) } != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        // Which member of the element libibverbs filled depends on the type.
        let element = match events::subject(raw.event_type) {
            // SAFETY: for this event type libibverbs set `element.qp` to the live queue pair
            // the event is about; it stays alive until the event is acknowledged below.
            Subject::QueuePair => match unsafe { raw.element.qp.as_ref() } {
                Some(qp) => AsyncElement::QueuePair(qp.qp_num),
                None => AsyncElement::Other,
            },
            Subject::CompletionQueue => {
                // SAFETY: `element.cq` is the member set for this type (the union was
                // initialised whole above in any case); only its address is kept.
                AsyncElement::CompletionQueue(unsafe { raw.element.cq } as usize)
            }
            Subject::Port => {
                // SAFETY: `element.port_num` is the member libibverbs sets for port events.
                AsyncElement::Port(unsafe { raw.element.port_num })
            }
            Subject::Device | Subject::SharedReceiveQueue | Subject::WorkQueue => {
                AsyncElement::Other
            }
        };
        // SAFETY: the event returned just now, acknowledged once.
        unsafe { rdma_sys::ibv_ack_async_event(raw_ptr) };
        Ok(Some(AsyncEvent {
            event_type: raw.event_type,
            element,
        }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every PD and CQ holds an `Arc<Context>`, so none is left; closed once.
        let _ = unsafe { rdma_sys::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// A protection domain (`ibv_alloc_pd`); deallocated on drop, after its regions and queue
/// pairs.
pub(crate) struct ProtectionDomain {
    pd: NonNull<ibv_pd>,
    _ctx: Arc<Context>,
}

// SAFETY: as for `Context`.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as for `Context`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// `ibv_reg_mr(pd, addr, len, access)`. `addr = 0, len = usize::MAX` with
    /// `IBV_ACCESS_ON_DEMAND` is implicit ODP (`ibv_reg_mr(3)`).
    ///
    /// Safe to call: the kernel validates the range (`EFAULT` when not mapped) and pins it or,
    /// for ODP, records it; no Rust memory is touched. What the NIC may do to that memory
    /// later is governed by the `post_*` contracts.
    pub(crate) fn reg_mr(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        access: u32,
    ) -> io::Result<MemoryRegion> {
        // SAFETY: live PD; the address is only passed to the kernel, never dereferenced here.
        // verbs.h's `ibv_reg_mr` macro calls this same exported symbol when the access flags
        // carry no IBV_ACCESS_OPTIONAL_RANGE (we never set it).
        let mr = unsafe {
            rdma_sys::ibv_reg_mr(
                self.pd.as_ptr(),
                addr as usize as *mut c_void,
                len,
                access as c_int,
            )
        };
        match NonNull::new(mr) {
            None => Err(io::Error::last_os_error()),
            Some(mr) => {
                // SAFETY: a live MR returned just now; its keys are fixed for its lifetime.
                let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
                Ok(MemoryRegion {
                    mr: Some(mr),
                    lkey,
                    rkey,
                    _pd: self.clone(),
                })
            }
        }
    }

    /// `ibv_advise_mr(pd, advice, flags, sg_list, num_sge)`, as verbs.h implements it
    /// (`EOPNOTSUPP` when the provider has no `advise_mr`).
    pub(crate) fn advise_mr(
        &self,
        advice: u32,
        flags: u32,
        sges: &mut [ibv_sge],
    ) -> io::Result<()> {
        // SAFETY: reading the `context` field of a live PD.
        let ctx = unsafe { (*self.pd.as_ptr()).context };
        let ctx = NonNull::new(ctx).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let Some(op) = verbs_context_op!(ctx, advise_mr) else {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        };
        let n =
            u32::try_from(sges.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: live PD; `sges` is a valid array of `n` entries for the duration of the call
        // (the kernel copies it).
        errno_result(unsafe { op(self.pd.as_ptr(), advice, flags, sges.as_mut_ptr(), n) })
    }

    /// `ibv_create_qp(pd, &init_attr)` for an RC queue pair on `send_cq`/`recv_cq`, without
    /// an SRQ, signalling only requested completions (`sq_sig_all = 0`). Returns the pair
    /// and the sizes the provider actually gave it (`init_attr.cap` after the call).
    pub(crate) fn create_rc_qp(
        self: &Arc<Self>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        cap: ibv_qp_cap,
    ) -> io::Result<(QueuePair, ibv_qp_cap)> {
        let mut init = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.cq.as_ptr(),
            recv_cq: recv_cq.cq.as_ptr(),
            srq: ptr::null_mut(),
            cap,
            qp_type: ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQs (their Arcs go into the handle below); `init` is valid.
        let qp = unsafe { rdma_sys::ibv_create_qp(self.pd.as_ptr(), &mut init) };
        match NonNull::new(qp) {
            None => Err(io::Error::last_os_error()),
            Some(qp) => {
                // SAFETY: a live QP returned just now; `qp_num` is fixed for its lifetime.
                let qp_num = unsafe { (*qp.as_ptr()).qp_num };
                Ok((
                    QueuePair {
                        qp,
                        qp_num,
                        _pd: self.clone(),
                        _send_cq: send_cq.clone(),
                        _recv_cq: recv_cq.clone(),
                    },
                    init.cap,
                ))
            }
        }
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and QP holds an `Arc<ProtectionDomain>`, so none is left (otherwise
        // ibv_dealloc_pd would fail with EBUSY); deallocated once.
        let _ = unsafe { rdma_sys::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A memory region (`ibv_reg_mr`); deregistered by [`MemoryRegion::dereg`] or on drop.
pub(crate) struct MemoryRegion {
    mr: Option<NonNull<ibv_mr>>,
    lkey: u32,
    rkey: u32,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: as for `Context`.
unsafe impl Send for MemoryRegion {}
// SAFETY: as for `Context`.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// The local key.
    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key.
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// `ibv_dereg_mr`, reporting its errno. After a failure the region is still registered
    /// (and deregistration is tried again on drop).
    pub(crate) fn dereg(&mut self) -> io::Result<()> {
        let Some(mr) = self.mr else { return Ok(()) };
        // SAFETY: a live MR, deregistered at most once (set to None on success).
        errno_result(unsafe { rdma_sys::ibv_dereg_mr(mr.as_ptr()) })?;
        self.mr = None;
        Ok(())
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _ = self.dereg();
    }
}

/// A completion queue (`ibv_create_cq`); destroyed on drop, after the queue pairs using it.
pub(crate) struct CompletionQueue {
    cq: NonNull<ibv_cq>,
    cqe: u32,
    _ctx: Arc<Context>,
}

// SAFETY: as for `Context`; concurrent `ibv_poll_cq` on one CQ is serialised by the provider.
unsafe impl Send for CompletionQueue {}
// SAFETY: as for `Send`.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// The entries it holds: `cq->cqe` after `ibv_create_cq`, which may be more than asked
    /// for (`ibv_create_cq(3)`).
    pub(crate) fn entries(&self) -> u32 {
        self.cqe
    }

    /// Its address, which names it in an asynchronous event.
    pub(crate) fn address(&self) -> usize {
        self.cq.as_ptr() as usize
    }

    /// `ibv_poll_cq(cq, wcs.len(), wcs)`: `cq->context->ops.poll_cq`, as verbs.h does.
    pub(crate) fn poll(&self, wcs: &mut [ibv_wc]) -> io::Result<usize> {
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: reading `context` of a live CQ, then the live context's ops table.
        let poll = unsafe { (*(*self.cq.as_ptr()).context).ops.poll_cq };
        let Some(poll) = poll else {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        };
        // SAFETY: live CQ; `wcs` has room for `n` entries.
        let got = unsafe { poll(self.cq.as_ptr(), n, wcs.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| io::Error::other(format!("ibv_poll_cq returned {got}")))
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an `Arc<CompletionQueue>`, so none is left;
        // destroyed once.
        let _ = unsafe { rdma_sys::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// An RC queue pair (`ibv_create_qp`); destroyed on drop, before its CQs and PD.
pub(crate) struct QueuePair {
    qp: NonNull<ibv_qp>,
    qp_num: u32,
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
}

// SAFETY: as for `Context`; concurrent posting to one QP is serialised by the provider.
unsafe impl Send for QueuePair {}
// SAFETY: as for `Send`.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// The queue pair number.
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// `ibv_modify_qp(qp, attr, mask)`.
    pub(crate) fn modify(&self, attr: &mut ibv_qp_attr, mask: u32) -> io::Result<()> {
        // SAFETY: live QP; `attr` is a valid ibv_qp_attr; the mask names its valid fields.
        errno_result(unsafe { rdma_sys::ibv_modify_qp(self.qp.as_ptr(), attr, mask as c_int) })
    }

    /// `ibv_post_send(qp, wr, &bad_wr)`: `qp->context->ops.post_send`, as verbs.h does.
    ///
    /// # Safety
    /// `wr` (one work request, `next` NULL) and its `sg_list` must be valid for the call.
    /// Unless it is `IBV_SEND_INLINE`, the memory its scatter-gather entries name must stay
    /// valid, and must not be accessed in a way that conflicts with the NIC, until its
    /// completion is polled (`ibv_post_send(3)`): the NIC reads it (SEND, WRITE) or writes it
    /// (READ) by DMA at any time until then.
    pub(crate) unsafe fn post_send(&self, wr: &mut ibv_send_wr) -> io::Result<()> {
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: reading `context` of a live QP, then the live context's ops table.
        let post = unsafe { (*(*self.qp.as_ptr()).context).ops.post_send };
        let Some(post) = post else {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        };
        // SAFETY: live QP; `wr` valid per this function's contract; `bad` is an out-pointer.
        errno_result(unsafe { post(self.qp.as_ptr(), wr, &mut bad) })
    }

    /// `ibv_post_recv(qp, wr, &bad_wr)`: `qp->context->ops.post_recv`, as verbs.h does.
    ///
    /// # Safety
    /// `wr` (one work request, `next` NULL) and its `sg_list` must be valid for the call, and
    /// the memory its entries name must stay valid and unaccessed until the receive's
    /// completion is polled (`ibv_post_recv(3)`): the NIC writes it by DMA.
    pub(crate) unsafe fn post_recv(&self, wr: &mut ibv_recv_wr) -> io::Result<()> {
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: reading `context` of a live QP, then the live context's ops table.
        let post = unsafe { (*(*self.qp.as_ptr()).context).ops.post_recv };
        let Some(post) = post else {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        };
        // SAFETY: live QP; `wr` valid per this function's contract; `bad` is an out-pointer.
        errno_result(unsafe { post(self.qp.as_ptr(), wr, &mut bad) })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: a live QP destroyed once; its CQs and PD outlive it (held by Arc).
        let _ = unsafe { rdma_sys::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_structs_read_as_zero() {
        let wc: ibv_wc = zeroed();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len, wc_imm_raw(&wc)),
            (0, 0, 0, 0)
        );
        let attr: ibv_device_attr_ex = zeroed();
        assert_eq!(attr.odp_caps.general_caps, 0);
    }

    /// rdma-sys writes `ibv_send_wr`, `ibv_wc`, `ibv_ah_attr` and `ibv_gid` by hand (bindgen
    /// cannot do their unions); their layout must be the C one. Sizes and offsets as gcc
    /// reports them for `<infiniband/verbs.h>` (rdma-core 44) on x86-64; these structs are
    /// part of libibverbs' stable ABI.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn hand_written_structs_have_the_c_layout() {
        use rdma_sys::ibv_qp_attr;
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union), 36);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
        assert_eq!(offset_of!(ibv_send_wr, bind_mw_tso_union), 80);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(offset_of!(ibv_wc, imm_data_invalidated_rkey_union), 24);
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(offset_of!(ibv_ah_attr, dlid), 24);
        assert_eq!(offset_of!(ibv_ah_attr, port_num), 30);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(offset_of!(ibv_qp_attr, rnr_retry), 132);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_gid_entry>(), 32);
        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(offset_of!(ibv_device_attr_ex, odp_caps), 240);
    }

    /// The build script recorded the rdma-core release pkg-config found; the libibverbs this
    /// test runs against is that installation's.
    #[test]
    fn late_symbols_are_found_exactly_where_the_installed_rdma_core_has_them() {
        let release: u32 = env!("PAGEWIRE_RDMA_CORE_RELEASE")
            .parse()
            .expect("set by the build script");
        assert!(release >= crate::rdma_core_version::MIN_RDMA_CORE);
        assert!(
            has_query_gid_ex(),
            "rdma-core {release} has _ibv_query_gid_ex"
        );
        assert_eq!(
            fork_status().is_some(),
            release >= 35,
            "ibv_is_fork_initialized exists from rdma-core 35 (IBVERBS_1.13); this is {release}"
        );
        if let Some(status) = fork_status() {
            assert!(
                status <= 2,
                "enum ibv_fork_status has three values: {status}"
            );
        }
    }

    /// `RawAsyncEvent` stands for rdma-sys's `ibv_async_event` in the calls.
    #[test]
    fn the_raw_async_event_has_the_bindings_layout() {
        use rdma_sys::ibv_async_event;
        assert_eq!(size_of::<RawAsyncEvent>(), size_of::<ibv_async_event>());
        assert_eq!(
            std::mem::align_of::<RawAsyncEvent>(),
            std::mem::align_of::<ibv_async_event>()
        );
        assert_eq!(
            offset_of!(RawAsyncEvent, event_type),
            offset_of!(ibv_async_event, event_type)
        );
        assert_eq!(size_of::<RawAsyncElement>(), size_of::<*mut c_void>());
    }

    #[test]
    fn gid_bytes_reads_the_raw_member() {
        let mut raw = [0u8; 16];
        raw[15] = 7;
        raw[0] = 0xfe;
        assert_eq!(gid_bytes(&ibv_gid { raw }), raw);
    }

    #[test]
    fn status_strings_come_from_libibverbs() {
        // ibv_wc_status_str is a pure table lookup in libibverbs; no device needed.
        assert_eq!(
            wc_status_str(rdma_sys::ibv_wc_status::IBV_WC_SUCCESS),
            "success"
        );
        assert_eq!(
            wc_status_str(rdma_sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR),
            "remote access error"
        );
    }
}
