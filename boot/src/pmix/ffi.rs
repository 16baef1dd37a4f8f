//! The few calls of libpmix a client needs, loaded at run time (`dlopen` of
//! `libpmix.so.2`), so a pagewire binary needs no PMIx library to build or to run where no
//! PMIx launcher starts it. The types are PMIx 4's C ABI (`pmix_common.h`): `pmix_proc_t`
//! (260 bytes), `pmix_value_t` (a 2-byte type and a 24-byte union at offset 8),
//! `pmix_info_t` (a 512-byte key, flags, a value: 552 bytes); the sizes are checked below.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::ManuallyDrop;

use libloading::Library;

/// The library's file name (its SONAME in PMIx 2 to 5).
pub(super) const LIBRARY: &str = "libpmix.so.2";

const MAX_NSLEN: usize = 255;
const MAX_KEYLEN: usize = 511;
/// The rank that names a whole namespace (job-level keys are stored under it).
pub(super) const RANK_WILDCARD: u32 = 0xffff_fffe;
const SUCCESS: c_int = 0;
const SCOPE_GLOBAL: u8 = 3;

// Data types (pmix_data_type_t).
const BOOL: u16 = 1;
const STRING: u16 = 3;
const SIZE: u16 = 4;
const INT: u16 = 6;
const INT8: u16 = 7;
const INT16: u16 = 8;
const INT32: u16 = 9;
const INT64: u16 = 10;
const UINT: u16 = 11;
const UINT8: u16 = 12;
const UINT16: u16 = 13;
const UINT32: u16 = 14;
const UINT64: u16 = 15;
const BYTE_OBJECT: u16 = 27;
const PROC_RANK: u16 = 40;

#[repr(C)]
#[derive(Clone, Copy)]
struct Proc {
    nspace: [c_char; MAX_NSLEN + 1],
    rank: u32,
}

/// `pmix_value_t`: the union's members all start at its first byte (offset 8 of the value).
#[repr(C)]
struct Value {
    kind: u16,
    data: [u64; 3],
}

#[repr(C)]
struct Info {
    key: [c_char; MAX_KEYLEN + 1],
    flags: u32,
    value: Value,
}

const _: () = assert!(std::mem::size_of::<Proc>() == 260);
const _: () = assert!(std::mem::size_of::<Value>() == 32);
const _: () = assert!(std::mem::size_of::<Info>() == 552);
const _: () = assert!(std::mem::offset_of!(Info, value) == 520);

impl Info {
    /// A boolean directive that is true.
    fn flag(key: &str) -> Info {
        let mut info = Info {
            key: [0; MAX_KEYLEN + 1],
            flags: 0,
            value: Value {
                kind: BOOL,
                data: [1, 0, 0],
            },
        };
        for (d, s) in info.key.iter_mut().zip(key.bytes()) {
            *d = s as c_char;
        }
        info
    }
}

type InitFn = unsafe extern "C" fn(*mut Proc, *mut Info, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const Info, usize) -> c_int;
type GetFn =
    unsafe extern "C" fn(*const Proc, *const c_char, *const Info, usize, *mut *mut Value) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const Info, usize) -> c_int;
type AbortFn = unsafe extern "C" fn(c_int, *const c_char, *mut Proc, usize) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type VersionFn = unsafe extern "C" fn() -> *const c_char;
type ValueDestructFn = unsafe extern "C" fn(*mut Value);

/// A value read by [`PmixClient::get`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PmixValue {
    /// Any integer type (servers differ in which they use for a key).
    Number(u64),
    Text(String),
    Bytes(Vec<u8>),
    /// A type this client does not read.
    Other(u16),
}

/// An initialised PMIx client: this process's namespace and rank, and the library's calls.
pub(super) struct PmixClient {
    // Never unloaded: libpmix keeps a progress thread, and the process ends soon after
    // finalize anyway.
    _library: ManuallyDrop<Library>,
    me: Proc,
    finalize: FinalizeFn,
    get: GetFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    abort: AbortFn,
    error_string: ErrorStringFn,
    version: VersionFn,
    value_destruct: ValueDestructFn,
}

/// Why a call failed: the call and PMIx's own words for the status.
pub(super) type CallError = String;

impl PmixClient {
    /// Loads libpmix and connects to the PMIx server of the launcher that started this
    /// process (`PMIx_Init`).
    pub(super) fn init() -> Result<PmixClient, CallError> {
        // SAFETY: loading libpmix runs its initialisers, which only set up its own state.
        let library =
            unsafe { Library::new(LIBRARY) }.map_err(|e| format!("cannot load {LIBRARY}: {e}"))?;
        macro_rules! symbol {
            ($name:literal, $ty:ty) => {
                // SAFETY: the symbol is libpmix's function of this C prototype (pmix.h).
                *unsafe { library.get::<$ty>(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{LIBRARY} has no {}: {e}", $name))?
            };
        }
        let init: InitFn = symbol!("PMIx_Init", InitFn);
        let client = PmixClient {
            me: Proc {
                nspace: [0; MAX_NSLEN + 1],
                rank: 0,
            },
            finalize: symbol!("PMIx_Finalize", FinalizeFn),
            get: symbol!("PMIx_Get", GetFn),
            put: symbol!("PMIx_Put", PutFn),
            commit: symbol!("PMIx_Commit", CommitFn),
            fence: symbol!("PMIx_Fence", FenceFn),
            abort: symbol!("PMIx_Abort", AbortFn),
            error_string: symbol!("PMIx_Error_string", ErrorStringFn),
            version: symbol!("PMIx_Get_version", VersionFn),
            value_destruct: symbol!("PMIx_Value_destruct", ValueDestructFn),
            _library: ManuallyDrop::new(library),
        };
        let mut client = client;
        // SAFETY: `me` is a valid pmix_proc_t to fill; no directives.
        let rc = unsafe { init(&mut client.me, std::ptr::null_mut(), 0) };
        client.check("PMIx_Init", rc)?;
        Ok(client)
    }

    fn check(&self, call: &str, rc: c_int) -> Result<(), CallError> {
        if rc == SUCCESS {
            return Ok(());
        }
        // SAFETY: PMIx_Error_string returns a static NUL-terminated string for any status.
        let text = unsafe { CStr::from_ptr((self.error_string)(rc)) };
        Err(format!("{call} failed: {} ({rc})", text.to_string_lossy()))
    }

    /// This process's namespace (its job's name).
    pub(super) fn namespace(&self) -> String {
        // SAFETY: PMIx_Init wrote a NUL-terminated name into the 256-byte array.
        unsafe { CStr::from_ptr(self.me.nspace.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// This process's rank in its namespace.
    pub(super) fn rank(&self) -> u32 {
        self.me.rank
    }

    /// The library's version line.
    pub(super) fn version(&self) -> String {
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr((self.version)()) }
            .to_string_lossy()
            .into_owned()
    }

    fn proc_of(&self, rank: u32) -> Proc {
        Proc { rank, ..self.me }
    }

    /// The value of `key` of rank `rank` of this namespace ([`RANK_WILDCARD`]: the job's),
    /// or `None` if there is none. Never waits for a key that no one has put.
    pub(super) fn get(&self, rank: u32, key: &str) -> Result<Option<PmixValue>, CallError> {
        const NOT_FOUND: c_int = -46;
        let proc = self.proc_of(rank);
        let name = CString::new(key).map_err(|_| format!("a key with a NUL: {key:?}"))?;
        let optional = Info::flag("pmix.optional");
        let mut value: *mut Value = std::ptr::null_mut();
        // SAFETY: valid proc, key and one directive; PMIx_Get allocates `*value` on success.
        let rc = unsafe { (self.get)(&proc, name.as_ptr(), &optional, 1, &mut value) };
        if rc == NOT_FOUND {
            return Ok(None);
        }
        self.check(&format!("PMIx_Get({key}) of rank {rank}"), rc)?;
        if value.is_null() {
            return Ok(None);
        }
        // SAFETY: PMIx_Get succeeded: `value` points to a value it allocated, whose union
        // holds the member its type names.
        let read = unsafe {
            let v = &*value;
            let word = v.data[0];
            match v.kind {
                BOOL | UINT8 | INT8 => PmixValue::Number(word & 0xff),
                UINT16 | INT16 => PmixValue::Number(word & 0xffff),
                UINT32 | INT32 | INT | UINT | PROC_RANK => PmixValue::Number(word & 0xffff_ffff),
                SIZE | UINT64 | INT64 => PmixValue::Number(word),
                STRING if word != 0 => PmixValue::Text(
                    CStr::from_ptr(word as *const c_char)
                        .to_string_lossy()
                        .into_owned(),
                ),
                BYTE_OBJECT => {
                    let (ptr, len) = (word as *const u8, v.data[1] as usize);
                    PmixValue::Bytes(if ptr.is_null() || len == 0 {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(ptr, len).to_vec()
                    })
                }
                other => PmixValue::Other(other),
            }
        };
        // SAFETY: PMIX_VALUE_RELEASE: the library frees the payload, libc's free the value
        // it malloc'd.
        unsafe {
            (self.value_destruct)(value);
            libc::free(value as *mut c_void);
        }
        Ok(Some(read))
    }

    /// Publishes `bytes` under `key` for every rank of the job (`PMIx_Put`, global scope).
    pub(super) fn put(&self, key: &str, bytes: &[u8]) -> Result<(), CallError> {
        let name = CString::new(key).map_err(|_| format!("a key with a NUL: {key:?}"))?;
        let mut value = Value {
            kind: BYTE_OBJECT,
            data: [bytes.as_ptr() as u64, bytes.len() as u64, 0],
        };
        // SAFETY: a byte object over `bytes`, which PMIx_Put copies before it returns.
        let rc = unsafe { (self.put)(SCOPE_GLOBAL, name.as_ptr(), &mut value) };
        self.check(&format!("PMIx_Put({key})"), rc)
    }

    /// Sends what was put to the server, then waits for every rank of the job, collecting
    /// all their data (`PMIx_Commit`, `PMIx_Fence` with `pmix.collect`).
    pub(super) fn commit_and_fence(&self) -> Result<(), CallError> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.commit)() };
        self.check("PMIx_Commit", rc)?;
        let all = self.proc_of(RANK_WILDCARD);
        let collect = Info::flag("pmix.collect");
        // SAFETY: one valid proc (the whole namespace) and one directive.
        let rc = unsafe { (self.fence)(&all, 1, &collect, 1) };
        self.check("PMIx_Fence", rc)
    }

    /// Asks the launcher to end the job with `code` (`PMIx_Abort` of this namespace).
    pub(super) fn abort(&self, code: i32, message: &str) {
        let text = CString::new(message.replace('\0', " ")).expect("no NUL");
        // SAFETY: a NUL-terminated message; no procs means this process's namespace.
        unsafe { (self.abort)(code, text.as_ptr(), std::ptr::null_mut(), 0) };
    }

    /// Tells the server this process ends in order (`PMIx_Finalize`).
    pub(super) fn finalize(&self) {
        // SAFETY: no directives.
        unsafe { (self.finalize)(std::ptr::null(), 0) };
    }
}
