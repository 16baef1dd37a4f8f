//! Multi-process tests of request-based one-sided operations (`rput`, `rget`,
//! `raccumulate`): many in flight at once, of sizes that take one chunk or many, completed
//! by `wait`, by `test` alone while the origin computes, by the scope's end, and by the
//! window's `unlock`; on static and dynamic windows, in the three buffer modes and on the
//! TCP wire; every element checked.

use pagewire::request::{multiple_scope, scope};
use pagewire::traits::*;
use pagewire::window::Window;
use pagewire::{Error, SystemOperation};
use pagewire_test_support::facade::jobs;

/// The value rank `r` puts at element `i`.
fn value(r: i32, i: usize) -> u64 {
    (r as u64) << 40 | (i as u64 * 2654435761) & 0xff_ffff_ffff
}

/// Lengths of the operations (elements of 8 bytes): inline-sized, a page, 72 KB, and 1 MiB
/// (several chunks in every mode).
const LENGTHS: [usize; 4] = [3, 512, 9_000, 1 << 17];

fn requests(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let total: usize = LENGTHS.iter().sum();
    let win = Window::<u64>::allocate(total, &world);
    let data: Vec<u64> = (0..total).map(|i| value(rank, i)).collect();
    let expect: Vec<u64> = (0..total).map(|i| value(prev, i)).collect();
    // Every length in flight at once, waited for as a collection.
    win.fence();
    multiple_scope(LENGTHS.len(), |s, coll| {
        let mut at = 0;
        for n in LENGTHS {
            coll.add(win.rput(s, next, at, &data[at..at + n]));
            at += n;
        }
        let mut done = Vec::new();
        coll.wait_all(&mut done);
        assert_eq!(done.len(), LENGTHS.len());
    });
    win.fence();
    win.with_local(|m| assert_eq!(m, &expect[..], "rput collection"));
    // Gets, each completed by test alone while this rank computes between tests.
    let mut back = vec![0u64; total];
    scope(|s| {
        let mut pending = Vec::new();
        let mut rest = &mut back[..];
        let mut at = 0;
        for n in LENGTHS {
            let (head, tail) = rest.split_at_mut(n);
            pending.push(win.rget(s, next, at, head));
            rest = tail;
            at += n;
        }
        let mut spins = 0u64;
        while !pending.is_empty() {
            pending = pending.into_iter().filter_map(|r| r.test().err()).collect();
            spins = spins.wrapping_add(std::hint::black_box(spins) | 1);
        }
    });
    assert_eq!(back, data, "rget by test");
    // Unlock completes a request that was never waited for: the data is there after it.
    win.fence();
    let twice: Vec<u64> = data.iter().map(|v| v.wrapping_mul(2)).collect();
    scope(|s| {
        win.lock(next);
        let r = win.rput(s, next, 0, &twice[..]);
        win.unlock(next);
        world.barrier();
        win.with_local(|m| {
            let prev_twice: Vec<u64> = expect.iter().map(|v| v.wrapping_mul(2)).collect();
            assert_eq!(m, &prev_twice[..], "rput complete at unlock");
        });
        r.wait();
    });
    // A request dropped unfinished: the scope's end waits for it, so the put lands.
    win.fence();
    scope(|s| {
        let _unwaited = win.rput(s, next, 0, &data[..]);
    });
    win.fence();
    win.with_local(|m| assert_eq!(m, &expect[..], "dropped rput"));
    // Request-based accumulates.
    win.fence();
    scope(|s| {
        let r = win.raccumulate(s, 0, 0, &[1, 2, 3], SystemOperation::sum());
        r.wait();
    });
    win.fence();
    if rank == 0 {
        let n = size as u64;
        win.with_local(|m| {
            let e = |i: usize| expect[i].wrapping_add(n * (i as u64 + 1));
            assert_eq!(&m[..3], &[e(0), e(1), e(2)]);
        });
    }
    // Out of the window: refused at the call, nothing moves.
    scope(|s| {
        assert!(matches!(
            win.try_rput(s, next, total - 1, &data[..2]),
            Err(Error::OutOfWindow { .. })
        ));
    });
    win.fence();
}

/// The same on a dynamic window: each request holds the target's lock until it completes.
fn dynamic_requests(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let total: usize = LENGTHS.iter().sum();
    let win = Window::<u64>::create_dynamic(&world);
    let region = win.attach(vec![0u64; total]);
    let mut all = vec![0u64; size as usize];
    world.all_gather_into(&(region.address() as u64), &mut all[..]);
    let base = all[next as usize] as usize;
    let data: Vec<u64> = (0..total).map(|i| value(rank, i)).collect();
    win.fence();
    multiple_scope(LENGTHS.len(), |s, coll| {
        let mut at = 0;
        for n in LENGTHS {
            coll.add(win.rput(s, next, base + 8 * at, &data[at..at + n]));
            at += n;
        }
        let mut done = Vec::new();
        coll.wait_all(&mut done);
        assert_eq!(done.len(), LENGTHS.len());
    });
    win.fence();
    let expect: Vec<u64> = (0..total).map(|i| value(prev, i)).collect();
    win.with_attached(&region, |m| assert_eq!(m, &expect[..], "dynamic rput"));
    let mut back = vec![0u64; total];
    scope(|s| {
        let got = win.rget(s, next, base, &mut back[..]).wait_for_data();
        assert_eq!(got, &data[..], "dynamic rget");
    });
    // A lock on a target with a request to it not yet completed (which holds the target's
    // lock until then) is refused, not a deadlock.
    scope(|s| {
        let r = win.rget(s, next, base, &mut back[..8]);
        assert!(matches!(win.try_lock(next), Err(Error::WindowSync(_))));
        r.wait();
    });
    win.fence();
    let _ = win.detach(region);
    win.fence();
}

#[test]
fn request_based_puts_and_gets_in_the_copy_mode() {
    jobs(
        "request_based_puts_and_gets_in_the_copy_mode",
        &[2, 3],
        &[("PAGEWIRE_MODE", "copy")],
        requests,
    );
}

#[test]
fn request_based_puts_and_gets_in_the_pindown_mode() {
    jobs(
        "request_based_puts_and_gets_in_the_pindown_mode",
        &[2],
        &[("PAGEWIRE_MODE", "pindown")],
        requests,
    );
}

#[test]
fn request_based_puts_and_gets_in_the_odp_mode() {
    jobs(
        "request_based_puts_and_gets_in_the_odp_mode",
        &[2, 3],
        &[("PAGEWIRE_MODE", "odp")],
        requests,
    );
}

#[test]
fn request_based_puts_and_gets_on_the_tcp_wire() {
    jobs(
        "request_based_puts_and_gets_on_the_tcp_wire",
        &[2],
        &[("PAGEWIRE_SOFT_WIRE", "tcp")],
        requests,
    );
}

#[test]
fn request_based_operations_on_dynamic_windows() {
    jobs(
        "request_based_operations_on_dynamic_windows",
        &[2, 3],
        &[],
        dynamic_requests,
    );
}

#[test]
fn request_based_operations_on_dynamic_windows_in_the_odp_mode() {
    jobs(
        "request_based_operations_on_dynamic_windows_in_the_odp_mode",
        &[2],
        &[("PAGEWIRE_MODE", "odp")],
        dynamic_requests,
    );
}
