//! A memory copy that survives a bad address: the soft NIC's local DMA.
//!
//! A real HCA reads and writes host memory by DMA; a page that is not mapped makes the
//! work request fail with an error completion, never the process. The soft NIC copies
//! inline sends, eager payloads and staged packets between its rings and the application's
//! registered memory with the CPU, without a system call, so it needs the same property
//! from a CPU copy. [`guarded_copy`] is a copy routine (`rep movsb`) whose one faulting
//! instruction is known to a `SIGSEGV`/`SIGBUS` handler: a fault there resumes at a fixup
//! that returns an error, the way the kernel's `copy_from_user` uses its exception table.
//! Faults anywhere else go to the handler that was installed before (Rust's stack-overflow
//! handler, an application's, or the default action), so nothing else changes.
//!
//! The handler is installed once, the first time a copy runs or [`install`] is called. An
//! application that later installs its own `SIGSEGV` handler without chaining to the
//! previous one takes this safety net away: a bad address in a work request then kills the
//! process, as an inline send from a bad address does with rdma-core. On architectures
//! other than x86-64 the copy goes through `process_vm_readv` on this process (one system
//! call per copy, the same safety).

use std::io;

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::sync::OnceLock;

    // The routine: rdi = dst, rsi = src, rdx = len; returns eax = 0, or 1 after a fault.
    // `rep movsb` is the only instruction that touches the caller's memory; on a fault the
    // CPU reports its address (the instruction restarts from where it stopped), so the
    // handler recognises it exactly and sends it to the fixup.
    std::arch::global_asm!(
        ".pushsection .text.pagewire_guarded_copy,\"ax\",@progbits",
        ".globl pagewire_guarded_copy",
        ".globl pagewire_guarded_copy_movsb",
        ".globl pagewire_guarded_copy_fixup",
        ".type pagewire_guarded_copy,@function",
        ".p2align 4",
        "pagewire_guarded_copy:",
        "    mov rcx, rdx",
        "pagewire_guarded_copy_movsb:",
        "    rep movsb",
        "    xor eax, eax",
        "    ret",
        "pagewire_guarded_copy_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size pagewire_guarded_copy, . - pagewire_guarded_copy",
        // Fetch-and-add: rdi = word, rsi = add, rdx = where the old value goes.
        ".globl pagewire_guarded_fetch_add",
        ".globl pagewire_guarded_fetch_add_xadd",
        ".type pagewire_guarded_fetch_add,@function",
        ".p2align 4",
        "pagewire_guarded_fetch_add:",
        "    mov rax, rsi",
        "pagewire_guarded_fetch_add_xadd:",
        "    lock xadd qword ptr [rdi], rax",
        "    mov qword ptr [rdx], rax",
        "    xor eax, eax",
        "    ret",
        ".size pagewire_guarded_fetch_add, . - pagewire_guarded_fetch_add",
        // Compare-and-swap: rdi = word, rsi = compare, rdx = swap, rcx = where the old value
        // goes.
        ".globl pagewire_guarded_cmp_swap",
        ".globl pagewire_guarded_cmp_swap_cmpxchg",
        ".type pagewire_guarded_cmp_swap,@function",
        ".p2align 4",
        "pagewire_guarded_cmp_swap:",
        "    mov rax, rsi",
        "pagewire_guarded_cmp_swap_cmpxchg:",
        "    lock cmpxchg qword ptr [rdi], rdx",
        "    mov qword ptr [rcx], rax",
        "    xor eax, eax",
        "    ret",
        ".size pagewire_guarded_cmp_swap, . - pagewire_guarded_cmp_swap",
        ".popsection",
    );

    extern "C" {
        fn pagewire_guarded_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        static pagewire_guarded_copy_movsb: u8;
        static pagewire_guarded_copy_fixup: u8;
        fn pagewire_guarded_fetch_add(word: *mut u64, add: u64, old: *mut u64) -> u32;
        static pagewire_guarded_fetch_add_xadd: u8;
        fn pagewire_guarded_cmp_swap(word: *mut u64, compare: u64, swap: u64, old: *mut u64)
            -> u32;
        static pagewire_guarded_cmp_swap_cmpxchg: u8;
    }

    /// The actions in force before ours, for chaining: `[SIGSEGV, SIGBUS]`.
    static PREVIOUS: OnceLock<[libc::sigaction; 2]> = OnceLock::new();

    /// The instructions that touch the caller's memory; a fault on one of them goes to the
    /// fixup. Only the symbols' addresses are taken; the bytes are never read.
    fn guarded_instruction(rip: usize) -> bool {
        rip == std::ptr::addr_of!(pagewire_guarded_copy_movsb) as usize
            || rip == std::ptr::addr_of!(pagewire_guarded_fetch_add_xadd) as usize
            || rip == std::ptr::addr_of!(pagewire_guarded_cmp_swap_cmpxchg) as usize
    }

    fn fixup_addr() -> usize {
        std::ptr::addr_of!(pagewire_guarded_copy_fixup) as usize
    }

    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid ucontext for an SA_SIGINFO handler; only the
        // saved instruction pointer is read and, for our own instruction, rewritten.
        unsafe {
            let uc = ctx as *mut libc::ucontext_t;
            let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
            // Every routine faults before it has pushed anything: the fixup's `ret` returns
            // to its caller.
            if guarded_instruction(*rip as usize) {
                *rip = fixup_addr() as i64;
                return;
            }
        }
        chain(sig, info, ctx);
    }

    /// Hands a fault that is not ours to the action that was installed before.
    fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let Some(prev) = PREVIOUS.get() else {
            return;
        };
        let prev = &prev[usize::from(sig == libc::SIGBUS)];
        let h = prev.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // Back to the default action: a fault re-executes and ends the process as it
            // would have without us; a signal sent with kill(2) is raised again.
            // SAFETY: sigaction and raise are async-signal-safe; the struct is ours.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                if info.is_null() || (*info).si_code <= 0 {
                    libc::raise(sig);
                }
            }
        } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this
            // signature; it gets the same arguments the kernel gave us.
            unsafe {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(h);
                f(sig, info, ctx);
            }
        } else {
            // SAFETY: a plain handler takes the signal number only.
            unsafe {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                f(sig);
            }
        }
    }

    pub(super) fn install() {
        PREVIOUS.get_or_init(|| {
            // SAFETY: installing a process-wide handler for two synchronous signals; the
            // previous actions are kept for chaining. SA_ONSTACK keeps a stack overflow
            // handled on the alternate stack that Rust set up for it.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_fault as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                let mut prev: [libc::sigaction; 2] = std::mem::zeroed();
                libc::sigaction(libc::SIGSEGV, &act, &mut prev[0]);
                libc::sigaction(libc::SIGBUS, &act, &mut prev[1]);
                prev
            }
        });
    }

    /// # Safety
    /// As [`super::guarded_copy`].
    pub(super) unsafe fn copy(dst: u64, src: u64, len: usize) -> bool {
        install();
        // SAFETY: the caller's contract; the routine either completes or reports a fault.
        unsafe { pagewire_guarded_copy(dst as *mut u8, src as *const u8, len) == 0 }
    }

    /// # Safety
    /// As [`super::guarded_fetch_add`].
    pub(super) unsafe fn fetch_add(word: u64, add: u64) -> Option<u64> {
        install();
        let mut old = 0u64;
        // SAFETY: the caller's contract; `old` is a local the routine writes once.
        let ok = unsafe { pagewire_guarded_fetch_add(word as *mut u64, add, &mut old) == 0 };
        ok.then_some(old)
    }

    /// # Safety
    /// As [`super::guarded_cmp_swap`].
    pub(super) unsafe fn cmp_swap(word: u64, compare: u64, swap: u64) -> Option<u64> {
        install();
        let mut old = 0u64;
        // SAFETY: the caller's contract; `old` is a local the routine writes once.
        let ok =
            unsafe { pagewire_guarded_cmp_swap(word as *mut u64, compare, swap, &mut old) == 0 };
        ok.then_some(old)
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub(super) fn install() {}

    /// # Safety
    /// As [`super::guarded_copy`].
    pub(super) unsafe fn copy(dst: u64, src: u64, len: usize) -> bool {
        let local = [super::super::Extent {
            addr: dst,
            len: len as u64,
        }];
        let remote = [super::super::Extent {
            addr: src,
            len: len as u64,
        }];
        super::super::cma_copy(
            std::process::id(),
            super::super::CmaDirection::Read,
            &local,
            &remote,
        )
        .is_ok()
    }

    /// Whether the word can be read and written now: a guarded read and write-back of one
    /// byte (the atomic itself is unguarded here, so a concurrent unmap can still fault).
    fn probe(word: u64) -> bool {
        let mut b = 0u8;
        let at = std::ptr::addr_of_mut!(b) as u64;
        // SAFETY: `b` is a local; the word's byte is written back unchanged.
        unsafe { copy(at, word, 1) && copy(word, at, 1) }
    }

    /// # Safety
    /// As [`super::guarded_fetch_add`].
    pub(super) unsafe fn fetch_add(word: u64, add: u64) -> Option<u64> {
        use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
        // SAFETY: the caller's contract: aligned, and accessed atomically by everyone else.
        probe(word).then(|| unsafe { AtomicU64::from_ptr(word as *mut u64) }.fetch_add(add, SeqCst))
    }

    /// # Safety
    /// As [`super::guarded_cmp_swap`].
    pub(super) unsafe fn cmp_swap(word: u64, compare: u64, swap: u64) -> Option<u64> {
        use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
        probe(word).then(|| {
            // SAFETY: as above.
            let w = unsafe { AtomicU64::from_ptr(word as *mut u64) };
            match w.compare_exchange(compare, swap, SeqCst, SeqCst) {
                Ok(v) | Err(v) => v,
            }
        })
    }
}

/// Installs the fault handler now (it is installed at the first copy otherwise). The soft
/// NIC calls it at start-up, so that an application installing its own handler later
/// chains to it.
pub fn install() {
    imp::install();
}

/// Copies `len` bytes from `src` to `dst` in this process. If either range touches memory
/// that is not mapped (or not readable, or writable, as needed), or a shared-memory page
/// beyond the end of its file, the copy stops and `EFAULT` is returned: some bytes may have
/// been written to `dst`, none outside it.
///
/// # Safety
/// `dst..dst+len` must not be memory that Rust code reads or writes concurrently or holds
/// a reference to: it is the NIC's to write (a posted receive, a ring slot owned by the
/// caller, a buffer the caller owns). `src..src+len` must not be written concurrently by
/// Rust code. Either may be unmapped.
pub unsafe fn guarded_copy(dst: u64, src: u64, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    if unsafe { imp::copy(dst, src, len) } {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}

/// Adds `add` to the 64-bit word at `word` in this process, atomically (a locked
/// instruction, so atomic with respect to every CPU's loads, stores and atomics), and
/// returns its old value; `EFAULT` if the word is not mapped writable (nothing changed).
///
/// # Safety
/// `word` must be 8-byte aligned, and no Rust code may hold a reference to it or access it
/// other than atomically while this runs (it is the NIC's to update: a registered window).
pub unsafe fn guarded_fetch_add(word: u64, add: u64) -> io::Result<u64> {
    debug_assert_eq!(word % 8, 0, "an unaligned atomic");
    // SAFETY: the caller's contract.
    unsafe { imp::fetch_add(word, add) }.ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Writes `swap` into the 64-bit word at `word` in this process if it holds `compare`,
/// atomically, and returns its old value; `EFAULT` if the word is not mapped writable
/// (nothing changed).
///
/// # Safety
/// As [`guarded_fetch_add`].
pub unsafe fn guarded_cmp_swap(word: u64, compare: u64, swap: u64) -> io::Result<u64> {
    debug_assert_eq!(word % 8, 0, "an unaligned atomic");
    // SAFETY: the caller's contract.
    unsafe { imp::cmp_swap(word, compare, swap) }
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AnonMapping;

    #[test]
    fn copies_every_size_and_alignment() {
        let mut src = AnonMapping::new(1 << 16).unwrap();
        for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let mut dst = vec![0u8; 1 << 16];
        for len in [0usize, 1, 7, 8, 63, 64, 65, 4095, 4096, 4097, 40000] {
            for off in [0usize, 1, 13] {
                dst.fill(0);
                // SAFETY: dst is a local Vec not otherwise borrowed during the call.
                unsafe { guarded_copy(dst.as_mut_ptr() as u64 + off as u64, src.addr(), len) }
                    .unwrap();
                assert_eq!(
                    &dst[off..off + len],
                    &src.as_slice()[..len],
                    "len {len} off {off}"
                );
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(
                    dst[off + len..].iter().all(|&b| b == 0),
                    "wrote past the end"
                );
            }
        }
    }

    /// A page of `m` made inaccessible (`PROT_NONE`): a fault for every access, and, unlike a
    /// hole unmapped in it, never handed to another thread's mapping while a test runs
    /// (the tests run in parallel, and the kernel fills a one-page hole first).
    fn guard_page(m: &AnonMapping, at: usize) -> u64 {
        let page = crate::PAGE_SIZE as usize;
        let addr = m.addr() + at as u64;
        // SAFETY: a page of our own mapping; no reference into it is held.
        let rc = unsafe { libc::mprotect(addr as *mut libc::c_void, page, libc::PROT_NONE) };
        assert_eq!(rc, 0);
        addr
    }

    #[test]
    fn a_fault_on_either_side_is_an_error_not_a_crash() {
        let page = crate::PAGE_SIZE as usize;
        let mut m = AnonMapping::new(3 * page).unwrap();
        m.as_mut_slice().fill(0x5a);
        let guard = guard_page(&m, page);
        let mut buf = vec![0u8; 2 * page];
        // Reading across into the guard page: the first page's bytes may land, then EFAULT.
        // SAFETY: buf is ours; the source is our (partly inaccessible) mapping.
        let e = unsafe { guarded_copy(buf.as_mut_ptr() as u64, m.addr(), 2 * page) };
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        // Writing into it, and into memory that is never mapped.
        // SAFETY: the destination is inaccessible memory of ours; nothing references it.
        let e = unsafe { guarded_copy(guard, buf.as_ptr() as u64, 16) };
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        // SAFETY: nothing is mapped there (NEVER_MAPPED).
        let e = unsafe { guarded_copy(crate::NEVER_MAPPED, buf.as_ptr() as u64, 16) };
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        // Null and a kernel address.
        // SAFETY: as above; neither is mapped.
        assert!(unsafe { guarded_copy(buf.as_mut_ptr() as u64, 0, 8) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { guarded_copy(u64::MAX - 4095, buf.as_ptr() as u64, 8) }.is_err());
        // The process goes on, and copies still work.
        // SAFETY: both are ours.
        unsafe { guarded_copy(buf.as_mut_ptr() as u64, m.addr(), 8) }.unwrap();
        assert_eq!(&buf[..8], &[0x5a; 8]);
    }

    #[test]
    fn a_read_only_destination_is_an_error() {
        let page = crate::PAGE_SIZE as usize;
        let m = AnonMapping::new(page).unwrap();
        // SAFETY: our own mapping, made read-only; nothing writes it.
        assert_eq!(
            unsafe { libc::mprotect(m.addr() as *mut libc::c_void, page, libc::PROT_READ) },
            0
        );
        let src = [1u8; 8];
        // SAFETY: the destination is our read-only mapping; no reference into it is held.
        let e = unsafe { guarded_copy(m.addr(), src.as_ptr() as u64, 8) };
        assert!(e.is_err());
        assert_eq!(m.as_slice()[0], 0);
    }

    #[test]
    fn a_fault_elsewhere_still_ends_the_process_with_sigsegv() {
        install();
        // SAFETY: the child only faults and exits; the parent waits for it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY (deliberately not): a null read that is not the guarded copy's.
            unsafe { std::ptr::read_volatile(std::ptr::null::<u8>()) };
            // SAFETY: never reached; leave the child without running the test harness.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status), "child status {status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
    }

    #[test]
    fn atomics_update_the_word_and_return_its_old_value() {
        let m = AnonMapping::new(crate::PAGE_SIZE as usize).unwrap();
        let w = m.addr() + 8;
        // SAFETY: our own mapping; nothing else accesses the word during the calls.
        unsafe {
            assert_eq!(guarded_fetch_add(w, 5).unwrap(), 0);
            assert_eq!(guarded_fetch_add(w, u64::MAX).unwrap(), 5); // wraps: 5 - 1
            assert_eq!(guarded_cmp_swap(w, 3, 9).unwrap(), 4); // no swap
            assert_eq!(guarded_cmp_swap(w, 4, 9).unwrap(), 4); // swap
            assert_eq!(guarded_fetch_add(w, 0).unwrap(), 9);
        }
        assert_eq!(&m.as_slice()[..8], &[0; 8], "the word before is untouched");
        assert_eq!(m.as_slice()[8], 9);
    }

    #[test]
    fn atomics_on_unmapped_or_read_only_memory_are_errors() {
        let page = crate::PAGE_SIZE as usize;
        // SAFETY: nothing is mapped there (NEVER_MAPPED).
        let e = unsafe { guarded_fetch_add(crate::NEVER_MAPPED, 1) };
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        // SAFETY: as above.
        assert!(unsafe { guarded_cmp_swap(crate::NEVER_MAPPED, 0, 1) }.is_err());
        let m = AnonMapping::new(page).unwrap();
        let guard = guard_page(&m, 0);
        // SAFETY: inaccessible memory of ours; nothing references it.
        assert!(unsafe { guarded_fetch_add(guard, 1) }.is_err());
        let ro = AnonMapping::new(page).unwrap();
        // SAFETY: our own mapping, made read-only; nothing writes it.
        assert_eq!(
            unsafe { libc::mprotect(ro.addr() as *mut libc::c_void, page, libc::PROT_READ) },
            0
        );
        // SAFETY: as above.
        assert!(unsafe { guarded_fetch_add(ro.addr(), 1) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { guarded_cmp_swap(ro.addr(), 0, 1) }.is_err());
        assert_eq!(ro.as_slice()[0], 0);
    }

    #[test]
    fn concurrent_fetch_adds_lose_nothing() {
        let m = AnonMapping::new(crate::PAGE_SIZE as usize).unwrap();
        let w = m.addr();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        // SAFETY: every access to the word is one of these atomics.
                        unsafe { guarded_fetch_add(w, 1) }.unwrap();
                    }
                });
            }
        });
        // SAFETY: the threads are done.
        assert_eq!(unsafe { guarded_fetch_add(w, 0) }.unwrap(), 40_000);
    }
}
