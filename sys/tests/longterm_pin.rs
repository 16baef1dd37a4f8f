//! Long-term pins through io_uring's fixed buffers (`sys::LongTermPins`): a pinned
//! region keeps its pages after the application replaces them, bad ranges fail with the
//! kernel's error without leaking a table slot, and `write_pages` reaches the pinned pages.
//!
//! Where io_uring's fixed buffers are unavailable the tests are skipped, or fail under
//! `PAGEWIRE_REQUIRE=longterm-pin` (as in CI; the older `PAGEWIRE_REQUIRE_LONGTERM_PIN=1`
//! still works).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use pagewire_sys::{AnonMapping, LongTermPins, NEVER_MAPPED};
use pagewire_test_support::{require, Prerequisite};

/// The pins, or `None` (the test is skipped) where io_uring's fixed buffers are
/// unavailable; `PAGEWIRE_REQUIRE=longterm-pin` makes that a failure.
fn pins() -> Option<LongTermPins> {
    let pins =
        LongTermPins::new().map_err(|e| format!("io_uring fixed buffers unavailable here: {e}"));
    require(Prerequisite::LongtermPin, pins)
}

/// The free slots of the pins' table, as their `Debug` shows them (`free_slots: N`).
fn free_slots(p: &LongTermPins) -> usize {
    let debug = format!("{p:?}");
    let n = debug
        .split("free_slots: ")
        .nth(1)
        .expect("free_slots in LongTermPins' Debug");
    n.trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .expect("a count of free slots")
}

#[test]
fn a_pinned_region_keeps_its_pages_after_the_range_is_replaced() {
    let Some(mut p) = pins() else { return };
    let mut m = AnonMapping::new(3 * 4096).unwrap();
    m.as_mut_slice().fill(0xaa);
    let pin = p.pin(m.addr() + 100, 2 * 4096).unwrap();
    assert_eq!((pin.start(), pin.span()), (m.addr(), 3 * 4096));
    // The application drops the pages and writes new ones at the same addresses.
    m.discard(0, 3 * 4096).unwrap();
    m.as_mut_slice()[..4096].fill(0x55);
    let snap = p.snapshot(&pin).unwrap();
    // SAFETY (test): the snapshot is a live mapping of `span` bytes we own.
    let copy = unsafe { std::slice::from_raw_parts(snap.addr() as *const u8, snap.len()) };
    assert!(
        copy.iter().all(|&b| b == 0xaa),
        "the pinned (old) pages' bytes"
    );
    assert!(m.as_slice()[..4096].iter().all(|&b| b == 0x55));
    p.unpin(pin);
}

#[test]
fn bad_ranges_fail_with_the_kernels_error_and_free_their_slots() {
    let Some(mut p) = pins() else { return };
    let free = free_slots(&p);
    // Not a hole unmapped here: this binary's other tests map memory on their threads and
    // could take a hole's addresses (seen once in CI's second run of the suites).
    let e = p.pin(NEVER_MAPPED, 4096).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
    assert_eq!(free_slots(&p), free, "no slot leaked");
}

#[test]
fn write_pages_reaches_the_pinned_pages() {
    let Some(mut p) = pins() else { return };
    let mut m = AnonMapping::new(2 * 4096).unwrap();
    m.as_mut_slice().fill(1);
    let pin = p.pin(m.addr(), 2 * 4096).unwrap();
    m.discard(0, 2 * 4096).unwrap();
    let snap = p.snapshot(&pin).unwrap();
    // A memory file with 7s, read into the old pages at offset 4000.
    // SAFETY (test): creating a memory file.
    let fd = unsafe { libc::memfd_create(c"t".as_ptr(), 0) };
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let sevens = [7u8; 200];
    // SAFETY (test): writing our buffer to our file.
    assert_eq!(
        unsafe { libc::write(fd.as_raw_fd(), sevens.as_ptr().cast(), 200) },
        200
    );
    p.write_pages(&pin, m.addr() + 4000, 200, &fd, 0).unwrap();
    assert!(
        m.as_slice().iter().all(|&b| b == 0),
        "the application's new pages untouched"
    );
    drop(snap);
    let after = p.snapshot(&pin).unwrap();
    // SAFETY (test): live mapping we own.
    let copy = unsafe { std::slice::from_raw_parts(after.addr() as *const u8, after.len()) };
    assert!(copy[4000..4200].iter().all(|&b| b == 7));
    assert!(copy[..4000].iter().chain(&copy[4200..]).all(|&b| b == 1));
    p.unpin(pin);
}
