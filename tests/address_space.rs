//! Wyckoff05's scenarios, on two ranks, in the `pindown` and `odp` modes: rank 0
//! sends from a buffer, changes its address space under the buffer, puts different bytes
//! at the same virtual address and sends again; rank 1 checks every message against the
//! bytes rank 0 says it wrote. Rank 0 checks that a counter proves the invalidation: the
//! pin-down cache's `invalidations` (or, for memory the monitor cannot watch, that the
//! registration was never reused), the NIC's invalidated ODP pages.
//!
//! Each test launches the job once per mode; the body runs in the launched ranks. The
//! classic failures of Wyckoff05 (free + malloc, munmap + mmap at the same address) run a
//! third time with the pin-down cache's invalidation turned off
//! (`PAGEWIRE_PINDOWN_INVALIDATE=off`): the stale registration stays bound to the
//! old pages, as on hardware, and rank 1 must see wrong bytes — so these tests can fail.

use pagewire::traits::*;
use pagewire_test_support::facade::launch;
use pagewire_test_support::{pattern, ROLE};

const P: usize = 4096;
/// The buffer of most scenarios: above the eager limit, so it moves zero-copy.
const N: usize = 1 << 20;

/// Raw address-space calls of the scenarios. Test code: each call is checked and the
/// addresses are only ever handed to the library as byte slices of live mappings.
mod raw {
    use super::P;

    pub fn mmap_at(addr: u64, len: usize, fixed: bool) -> u64 {
        let flags =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if fixed { libc::MAP_FIXED } else { 0 };
        // SAFETY: an anonymous mapping; with MAP_FIXED the caller names a range it owns.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        p as u64
    }

    pub fn munmap(addr: u64, len: usize) {
        // SAFETY: the caller owns the range and no slice over it outlives this call.
        let r = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        assert_eq!(r, 0, "munmap: {}", std::io::Error::last_os_error());
    }

    /// Moves `[from, from+len)` to `to` (which the caller owns).
    pub fn mremap_to(from: u64, len: usize, to: u64) {
        // SAFETY: both ranges belong to the caller; the old one is gone afterwards.
        let p = unsafe {
            libc::mremap(
                from as *mut libc::c_void,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                to as *mut libc::c_void,
            )
        };
        assert_eq!(p as u64, to, "mremap: {}", std::io::Error::last_os_error());
    }

    /// Writes `bytes` at `addr`.
    pub fn write(addr: u64, bytes: &[u8]) {
        slice_mut(addr, bytes.len()).copy_from_slice(bytes);
    }

    pub fn slice<'a>(addr: u64, len: usize) -> &'a [u8] {
        // SAFETY: the caller passes a mapped, readable range that stays mapped while the
        // slice is used (the scenarios change it only after the send returned).
        unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
    }

    pub fn slice_mut<'a>(addr: u64, len: usize) -> &'a mut [u8] {
        // SAFETY: as `slice`, and nothing else refers to the range meanwhile.
        unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
    }

    pub fn malloc(len: usize) -> u64 {
        // SAFETY: plain allocation; freed by `free`.
        let p = unsafe { libc::malloc(len) };
        assert!(!p.is_null());
        p as u64
    }

    pub fn free(addr: u64) {
        // SAFETY: `addr` came from `malloc` and is freed once.
        unsafe { libc::free(addr as *mut libc::c_void) }
    }

    /// Serves allocations of `threshold` bytes and more by `mmap` (and frees them by
    /// `munmap`), without glibc's dynamic raising of the threshold.
    pub fn mmap_threshold(threshold: usize) {
        // SAFETY: a malloc tuning call.
        assert_eq!(
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, threshold as i32) },
            1
        );
    }

    pub fn sbrk(delta: isize) -> u64 {
        // SAFETY: the scenario moves the break up and back down by what it added, and
        // checks that nobody else moved it meanwhile.
        let p = unsafe { libc::sbrk(delta as libc::intptr_t) };
        assert_ne!(p as isize, -1, "sbrk: {}", std::io::Error::last_os_error());
        p as u64
    }

    /// A new System V segment of `len` bytes attached at `at` (anywhere if 0).
    pub fn shm_attach(len: usize, at: u64) -> (i32, u64) {
        // SAFETY: a private segment; attached at a page-aligned address the caller owns
        // (just detached) or anywhere.
        unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | 0o600);
            assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
            let a = libc::shmat(id, at as *const libc::c_void, 0);
            assert_ne!(a as isize, -1, "shmat: {}", std::io::Error::last_os_error());
            // Removed once detached.
            libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
            (id, a as u64)
        }
    }

    pub fn shm_detach(addr: u64) {
        // SAFETY: `addr` is an attachment of ours, not used after this.
        assert_eq!(unsafe { libc::shmdt(addr as *const libc::c_void) }, 0);
    }

    /// Forks; the child writes `fill` over its copy of `[addr, addr+len)` and exits at
    /// once; the parent waits for it.
    pub fn fork_child_writes(addr: u64, len: usize, fill: u8) {
        // SAFETY: the child only writes its own copy of the range (already mapped and
        // touched) and calls `_exit`: both async-signal-safe.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
            if pid == 0 {
                std::ptr::write_bytes(addr as *mut u8, fill, len);
                libc::_exit(0);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        }
    }

    pub fn page_align_up(x: u64) -> u64 {
        x.div_ceil(P as u64) * P as u64
    }
}

/// Rank 0's side: sends announced messages and reads the mode's counters.
struct Sender<'u> {
    u: &'u pagewire::Universe,
    seed: u64,
}

impl Sender<'_> {
    /// Writes fresh bytes over `[addr, addr+len)` and sends them.
    fn send_fresh(&mut self, addr: u64, len: usize) {
        self.seed += 1;
        raw::write(addr, &pattern(self.seed, len));
        let world = self.u.world();
        let peer = world.process_at_rank(1);
        peer.send(&self.seed);
        peer.send(raw::slice(addr, len));
    }

    /// Invalidations the mode counts (pin-down entries, or present ODP pages).
    fn invalidations(&self) -> u64 {
        self.u.with_p2p(|p| p.mode_counters().invalidations)
    }

    fn hits(&self) -> u64 {
        self.u.with_p2p(|p| p.mode_counters().hits)
    }

    fn mode(&self) -> &'static str {
        self.u.mode_name()
    }

    /// Asserts the change since `before` was seen, for `what` (or, with invalidation
    /// off, that it was not, and that the NIC kept the registration on its old pages).
    fn assert_invalidated(&self, before: u64, what: &str) {
        let now = self.invalidations();
        if expect_stale() {
            let nic = self.u.with_p2p(|p| p.nic_counters());
            assert_eq!(
                now, before,
                "{what}: invalidation is off, yet the cache invalidated"
            );
            assert!(
                nic.detached_regions >= 1 && nic.detached_bytes > 0,
                "{what}: the stale registration was not used on its old pages: {nic:?}"
            );
            return;
        }
        assert!(
            now > before,
            "{}: {what} was not invalidated (invalidations {before} -> {now}; {:?}; NIC {:?})",
            self.mode(),
            self.u.with_p2p(|p| p.mode_counters()),
            self.u.with_p2p(|p| p.nic_counters()),
        );
    }

    fn done(self) {
        self.u.world().process_at_rank(1).send(&u64::MAX);
    }
}

/// Whether this run turned invalidation off and so must see stale bytes.
fn expect_stale() -> bool {
    std::env::var("PAGEWIRE_PINDOWN_INVALIDATE").as_deref() == Ok("off")
}

/// Runs `scenario` as rank 0 against a checking rank 1.
fn two_ranks(u: &pagewire::Universe, scenario: fn(&mut Sender)) {
    let world = u.world();
    assert_eq!(world.size(), 2);
    if world.rank() == 0 {
        let mut s = Sender { u, seed: 0 };
        scenario(&mut s);
        s.done();
    } else {
        let peer = world.process_at_rank(0);
        let mut messages = 0;
        let mut stale = 0;
        loop {
            let (seed, _) = peer.receive::<u64>();
            if seed == u64::MAX {
                break;
            }
            let (got, _) = peer.receive_vec::<u8>();
            if got != pattern(seed, got.len()) {
                assert!(
                    expect_stale(),
                    "message {messages} (seed {seed}, {} bytes): stale or corrupt bytes",
                    got.len()
                );
                // What arrived is what the buffer held before the change.
                assert!(
                    (1..seed).any(|old| got == pattern(old, got.len())),
                    "message {messages} (seed {seed}): wrong bytes that are no earlier message"
                );
                stale += 1;
            }
            messages += 1;
        }
        assert!(messages >= 3, "only {messages} messages");
        if expect_stale() {
            assert!(stale >= 1, "invalidation off, yet every message was right");
        }
    }
}

/// Runs the test `name` in the pindown and odp modes (and, in the launched ranks, `body`).
fn in_both_modes(name: &str, body: fn(&pagewire::Universe)) {
    in_modes(name, body, false);
}

/// [`in_both_modes`], then pindown once more with invalidation off, where the scenario must
/// deliver stale bytes.
fn in_both_modes_and_without_invalidation(name: &str, body: fn(&pagewire::Universe)) {
    in_modes(name, body, true);
}

fn in_modes(name: &str, body: fn(&pagewire::Universe), unsafe_run: bool) {
    if std::env::var(ROLE).as_deref() == Ok(name) {
        let universe = pagewire::initialize().expect("first initialisation");
        body(&universe);
        return;
    }
    for mode in ["pindown", "odp"] {
        let o = launch(
            name,
            2,
            &[("PAGEWIRE_MODE", mode), ("PAGEWIRE_MEMMON", "uffd")],
        );
        assert!(o.success(), "{mode}: {o:?}");
    }
    if unsafe_run {
        let o = launch(
            name,
            2,
            &[
                ("PAGEWIRE_MODE", "pindown"),
                ("PAGEWIRE_MEMMON", "uffd"),
                ("PAGEWIRE_PIN", "longterm"),
                ("PAGEWIRE_PINDOWN_INVALIDATE", "off"),
            ],
        );
        assert!(o.success(), "pindown without invalidation: {o:?}");
    }
}

fn free_then_malloc(s: &mut Sender) {
    raw::mmap_threshold(128 << 10);
    let a = raw::malloc(N);
    s.send_fresh(a, N);
    s.send_fresh(a, N);
    let before = s.invalidations();
    raw::free(a); // munmap inside free()
    let b = raw::malloc(N);
    assert_eq!(
        b, a,
        "malloc did not return the freed address; the scenario needs it"
    );
    s.send_fresh(b, N);
    s.assert_invalidated(before, "free() + malloc() at the same address");
    raw::free(b);
}

#[test]
fn free_and_malloc_of_the_same_address() {
    in_both_modes_and_without_invalidation("free_and_malloc_of_the_same_address", |u| {
        two_ranks(u, free_then_malloc)
    });
}

fn munmap_then_mmap_fixed(s: &mut Sender) {
    let a = raw::mmap_at(0, N, false);
    s.send_fresh(a, N);
    s.send_fresh(a, N);
    let before = s.invalidations();
    raw::munmap(a, N);
    raw::mmap_at(a, N, true);
    s.send_fresh(a, N);
    s.assert_invalidated(before, "munmap + mmap(MAP_FIXED)");
    raw::munmap(a, N);
}

#[test]
fn munmap_and_mmap_fixed_at_the_same_address() {
    in_both_modes_and_without_invalidation("munmap_and_mmap_fixed_at_the_same_address", |u| {
        two_ranks(u, munmap_then_mmap_fixed)
    });
}

fn partial_munmap(s: &mut Sender) {
    let a = raw::mmap_at(0, 3 * N, false);
    s.send_fresh(a, 3 * N);
    s.send_fresh(a, 3 * N);
    let before = s.invalidations();
    let nic_before = s.u.with_p2p(|p| p.nic_counters());
    raw::munmap(a + N as u64, N);
    // The untouched parts stay usable, with their own bytes.
    s.send_fresh(a, N);
    s.send_fresh(a + 2 * N as u64, N);
    s.assert_invalidated(before, "the middle of a registered range");
    if s.mode() == "odp" {
        let d = s.u.with_p2p(|p| p.nic_counters()).since(&nic_before);
        assert!(
            d.invalidated_pages >= (N / P) as u64,
            "the hole's present pages were not all cleared: {d:?}"
        );
        assert_eq!(
            d.npf_requester + d.npf_responder,
            0,
            "untouched pages faulted: {d:?}"
        );
    }
    // New memory in the hole, new bytes everywhere.
    raw::mmap_at(a + N as u64, N, true);
    s.send_fresh(a, 3 * N);
    raw::munmap(a, 3 * N);
}

#[test]
fn partial_munmap_of_a_registered_range() {
    in_both_modes("partial_munmap_of_a_registered_range", |u| {
        two_ranks(u, partial_munmap)
    });
}

fn mremap_move(s: &mut Sender) {
    let a = raw::mmap_at(0, N, false);
    let elsewhere = raw::mmap_at(0, N, false);
    s.send_fresh(a, N);
    s.send_fresh(a, N);
    let before = s.invalidations();
    raw::mremap_to(a, N, elsewhere);
    raw::mmap_at(a, N, true);
    s.send_fresh(a, N);
    s.assert_invalidated(before, "mremap moving the buffer away");
    s.send_fresh(elsewhere, N);
    raw::munmap(a, N);
    raw::munmap(elsewhere, N);
}

#[test]
fn mremap_moving_a_buffer() {
    in_both_modes("mremap_moving_a_buffer", |u| two_ranks(u, mremap_move));
}

fn madvise_dontneed(s: &mut Sender) {
    let mut a = pagewire::sys::AnonMapping::new(N).unwrap();
    s.send_fresh(a.addr(), N);
    s.send_fresh(a.addr(), N);
    let before = s.invalidations();
    // MADV_DONTNEED (MADV_DONTNEED_LOCKED where the pin-down mode mlocked the pages).
    a.discard(0, N).unwrap();
    assert!(
        a.as_slice().iter().all(|&b| b == 0),
        "discarded pages read as zeros"
    );
    s.send_fresh(a.addr(), N);
    s.assert_invalidated(before, "MADV_DONTNEED");
}

#[test]
fn madvise_dontneed_under_a_buffer() {
    in_both_modes("madvise_dontneed_under_a_buffer", |u| {
        two_ranks(u, madvise_dontneed)
    });
}

fn brk_shrink_and_grow(s: &mut Sender) {
    let cur = raw::sbrk(0);
    let pad = (raw::page_align_up(cur) - cur) as isize;
    raw::sbrk(pad);
    let base = raw::sbrk(N as isize);
    assert_eq!(base % P as u64, 0);
    s.send_fresh(base, N);
    s.send_fresh(base, N);
    let before = s.invalidations();
    assert_eq!(
        raw::sbrk(0),
        base + N as u64,
        "something else moved the break; cannot shrink safely"
    );
    raw::sbrk(-(N as isize)); // shrink: the kernel unmaps the pages
    let again = raw::sbrk(N as isize); // grow: new zero pages at the same address
    assert_eq!(again, base);
    s.send_fresh(base, N);
    s.assert_invalidated(before, "brk shrink and grow");
    assert_eq!(raw::sbrk(0), base + N as u64);
    raw::sbrk(-(N as isize) - pad);
}

#[test]
fn brk_shrink_and_grow_under_a_buffer() {
    in_both_modes("brk_shrink_and_grow_under_a_buffer", |u| {
        two_ranks(u, brk_shrink_and_grow)
    });
}

/// System V shared memory: the monitor cannot see `shmdt`, so nothing over it is kept
/// between transfers (pin-down: registered per transfer, never a hit; ODP: present only
/// until the owner's next post), and a new segment at the same address gets its own bytes.
fn sysv_shm(s: &mut Sender) {
    let (_, a) = raw::shm_attach(N, 0);
    let hits = s.hits();
    let before = s.invalidations();
    s.send_fresh(a, N);
    s.send_fresh(a, N);
    raw::shm_detach(a);
    let (_, b) = raw::shm_attach(N, a);
    assert_eq!(b, a, "shmat at the old address");
    s.send_fresh(b, N);
    match s.mode() {
        "pindown" => {
            let c = s.u.with_p2p(|p| p.mode_counters());
            assert_eq!(
                c.hits, hits,
                "a registration over SysV memory was reused: {c:?}"
            );
        }
        _ => s.assert_invalidated(before, "SysV shared memory"),
    }
    raw::shm_detach(b);
}

#[test]
fn shmdt_and_shmat_of_a_system_v_segment_at_the_same_address() {
    in_both_modes(
        "shmdt_and_shmat_of_a_system_v_segment_at_the_same_address",
        |u| two_ranks(u, sysv_shm),
    );
}

fn fork_child_writes(s: &mut Sender) {
    let a = raw::mmap_at(0, N, false);
    s.send_fresh(a, N);
    s.send_fresh(a, N);
    let before = s.invalidations();
    raw::fork_child_writes(a, N, 0xee);
    // The parent's own next bytes, not the child's, must arrive.
    s.send_fresh(a, N);
    s.assert_invalidated(before, "fork (pages shared copy-on-write)");
    raw::munmap(a, N);
}

#[test]
fn fork_in_the_sending_rank_with_the_child_writing() {
    in_both_modes("fork_in_the_sending_rank_with_the_child_writing", |u| {
        two_ranks(u, fork_child_writes)
    });
}
