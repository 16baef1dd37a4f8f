//! Multi-process tests of shared-memory windows (`Window::allocate_shared`,
//! `shared_query`, `with_shared`, `with_shared_mut`) and of `split_shared`: parts laid one
//! after the other, every rank reading every part with loads, increments under a peer's
//! lock that end exact, the window's NIC operations on the same memory, and the errors.

use pagewire::traits::*;
use pagewire::window::Window;
use pagewire::{Error, ErrorClass, SystemOperation};
use pagewire_test_support::facade::jobs;

fn shared(u: &pagewire::Universe) {
    let world = u.world();
    let node = world.split_shared(0);
    assert_eq!(node.size(), world.size(), "pwrun's ranks share one host");
    assert_eq!(node.rank(), world.rank());
    let (rank, size) = (node.rank(), node.size());
    // Rank r holds r + 2 elements.
    let win = Window::<u64>::allocate_shared(rank as usize + 2, &node);
    assert!(win.is_shared());
    win.with_local_mut(|m| {
        assert_eq!(m.len(), rank as usize + 2);
        assert!(m.iter().all(|&v| v == 0), "T::default()");
        for (i, v) in m.iter_mut().enumerate() {
            *v = (rank as u64) << 32 | i as u64;
        }
    });
    win.fence();
    for r in 0..size {
        win.with_shared(r, |m| {
            let expect: Vec<u64> = (0..r as u64 + 2).map(|i| (r as u64) << 32 | i).collect();
            assert_eq!(m, &expect[..], "rank {r}'s part, read with loads");
        });
    }
    // The parts lie one after the other.
    for r in 1..size {
        let (a, b) = (
            win.shared_query(r - 1).unwrap(),
            win.shared_query(r).unwrap(),
        );
        assert_eq!(b.ptr as usize, a.ptr as usize + a.len * 8);
        assert_eq!((b.len, b.disp_unit), (r as usize + 2, 8));
    }
    win.fence();
    // Stores under rank 0's exclusive lock exclude each other: the count ends exact.
    const ROUNDS: u64 = 200;
    for _ in 0..ROUNDS {
        win.with_shared_mut(0, |m| m[1] += 1);
    }
    win.fence();
    win.with_shared(0, |m| assert_eq!(m[1], 1 + ROUNDS * size as u64));
    // The window's own operations reach the same memory.
    let next = (rank + 1) % size;
    win.fence();
    win.put(next, 0, &[7 + rank as u64]);
    win.accumulate(0, 1, &[1], SystemOperation::sum());
    win.fence();
    let prev = (rank + size - 1) % size;
    win.with_local(|m| assert_eq!(m[0], 7 + prev as u64));
    win.with_shared(0, |m| {
        assert_eq!(m[0], 7 + (size - 1) as u64);
        assert_eq!(m[1], 1 + (ROUNDS + 1) * size as u64);
    });
    win.fence();
    // Atomics and accumulates from every rank on one word, with the CPU's locked
    // instructions on the mapping: exact.
    if rank == 0 {
        win.with_local_mut(|m| m[0] = 0);
    }
    win.fence();
    let before = win.fetch_and_op(0, 1, &0, SystemOperation::no_op());
    world.barrier();
    for _ in 0..ROUNDS {
        win.fetch_and_op(0, 1, &1, SystemOperation::sum());
        win.accumulate(0, 1, &[2], SystemOperation::sum());
    }
    let mut won = 0u64;
    for _ in 0..ROUNDS {
        let seen = win.compare_and_swap(0, 0, 0, 1);
        won += u64::from(seen == 0);
        if seen == 0 {
            win.compare_and_swap(0, 0, 1, 0);
        }
    }
    win.fence();
    win.with_shared(0, |m| {
        assert_eq!(m[1], before + 3 * ROUNDS * size as u64);
        assert_eq!(m[0], 0, "every compare-and-swap that won was undone");
    });
    let mut wins = 0u64;
    world.all_reduce_into(&won, &mut wins, SystemOperation::sum());
    assert!(wins > 0);
    win.put(0, 0, &[7 + (size - 1) as u64]);
    win.fence();
    // Errors: nothing changes.
    let plain = Window::from_vec(vec![0u64; 2], &world);
    assert!(matches!(
        plain.shared_query(0),
        Err(e) if e.class() == ErrorClass::Win
    ));
    assert!(matches!(
        plain.try_with_shared(0, |_| ()),
        Err(e) if e.class() == ErrorClass::Win
    ));
    let e = win
        .try_with_shared(next, |_| win.try_put(next, 0, &[1]))
        .unwrap();
    assert!(
        matches!(e, Err(Error::WindowSync(_))),
        "a put into a part borrowed here"
    );
    let e = win
        .try_with_shared(next, |_| win.try_with_shared(prev, |_| ()))
        .unwrap();
    assert!(matches!(e, Err(Error::WindowSync(_))), "nested");
    assert!(matches!(
        win.try_with_shared(size, |_| ()),
        Err(Error::NoSuchRank { .. })
    ));
    win.fence();
    plain.fence();
}

#[test]
fn shared_memory_windows() {
    jobs("shared_memory_windows", &[2, 3], &[], shared);
}

#[test]
fn shared_memory_windows_in_the_odp_mode() {
    jobs(
        "shared_memory_windows_in_the_odp_mode",
        &[2],
        &[("PAGEWIRE_MODE", "odp")],
        shared,
    );
}

#[test]
fn shared_memory_windows_in_the_pindown_mode() {
    jobs(
        "shared_memory_windows_in_the_pindown_mode",
        &[3],
        &[("PAGEWIRE_MODE", "pindown")],
        shared,
    );
}
