//! Multi-process tests of one-sided communication (`pagewire::window`): every operation
//! under every synchronisation kind, every element checked, in the three buffer modes and
//! on the TCP wire; a target that computes without calling pagewire; mutual exclusion of
//! locks; and the errors (out-of-window access, unlock without lock, free while locked).

use pagewire::traits::*;
use pagewire::window::Window;
use pagewire::{Error, ErrorClass, SystemOperation};
use pagewire_test_support::facade::jobs;

/// The value rank `r` puts at element `i`.
fn value(r: i32, i: usize) -> u64 {
    (r as u64) << 40 | (i as u64 * 2654435761) & 0xff_ffff_ffff
}

/// The mpi-rs 0.1 example's shape (put, with_local_mut, get, accumulate under fence), on a
/// window bound without `mut`, as mpi-rs users write it.
fn mpi_rs_shape(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let win = Window::<i32>::allocate(4, &world);
    win.fence();
    if rank == 0 {
        for r in 1..size {
            win.put(r, 0, &[r * 10, r * 10 + 1, r * 10 + 2, r * 10 + 3]);
        }
        win.with_local_mut(|m| {
            for (i, v) in m.iter_mut().enumerate() {
                *v = i as i32;
            }
        });
    }
    win.fence();
    if rank != 0 {
        win.with_local(|m| assert_eq!(m, [rank * 10, rank * 10 + 1, rank * 10 + 2, rank * 10 + 3]));
        let mut buf = [0i32; 4];
        win.get(0, 0, &mut buf);
        assert_eq!(buf, [0, 1, 2, 3]);
    }
    win.fence();
    let win2 = Window::<i32>::allocate(4, &world);
    win2.fence();
    win2.accumulate(0, 0, &[1, 1, 1, 1], SystemOperation::sum());
    win2.fence();
    if rank == 0 {
        win2.with_local(|m| assert_eq!(m, [size; 4]));
    }
    win2.fence();
    let _: usize = win.local_len();
    let _: i32 = win.rank() + win.size();
    win.lock(0);
    win.unlock(0);
    let from_vec = Window::from_vec(vec![rank as f64; 3], &world);
    from_vec.fence();
    let mut x = [0.0f64; 3];
    from_vec.get((rank + 1) % size, 0, &mut x);
    assert_eq!(x, [((rank + 1) % size) as f64; 3]);
    from_vec.fence();
}

/// Put and get of many sizes at odd displacements, under fence, exclusive and shared
/// locks, lock-all and post/start/complete/wait; every element checked.
fn put_get_everywhere(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    const LEN: usize = 300_000;
    let win = Window::<u64>::allocate(LEN, &world);
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    for (round, &(disp, n)) in [
        (0, 0),
        (0, 1),
        (7, 1000),
        (1, 100_000),
        (0, LEN),
        (LEN - 3, 3),
    ]
    .iter()
    .enumerate()
    {
        let data: Vec<u64> = (0..n).map(|i| value(rank, i + round)).collect();
        let expect: Vec<u64> = (0..n).map(|i| value(prev, i + round)).collect();
        // Fence.
        win.fence();
        win.put(next, disp, &data);
        win.fence();
        win.with_local(|m| assert_eq!(&m[disp..disp + n], &expect[..], "fence put {n}"));
        let mut back = vec![0u64; n];
        win.get(next, disp, &mut back);
        assert_eq!(back, data, "fence get {n}");
        win.fence();
        // Exclusive lock (passive target).
        win.lock(next);
        win.put(next, disp, &expect);
        win.get(next, disp, &mut back);
        win.unlock(next);
        assert_eq!(back, expect, "locked put then get {n}");
        win.fence();
        // Shared lock on everyone, reads only.
        win.lock_all();
        let mut mine = vec![0u64; n];
        win.get(next, disp, &mut mine);
        win.unlock_all();
        assert_eq!(mine, expect, "locked-all get {n}");
        // Post/start/complete/wait: each rank exposes to its predecessor, accesses its
        // successor.
        let to_next = world.group().include(&[next]);
        let from_prev = world.group().include(&[prev]);
        win.post(&from_prev);
        win.start(&to_next);
        win.put(next, disp, &data);
        win.complete();
        win.wait();
        win.with_local(|m| assert_eq!(&m[disp..disp + n], &expect[..], "pscw put {n}"));
    }
    win.fence();
}

/// Accumulates, fetching accumulates, fetch-and-op and compare-and-swap on several element
/// types, every rank into rank 0 at once: exact results.
fn accumulates(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let n = size as u64;
    // u64: sums by fetch-and-add, max and replace by compare-and-swap.
    let w = Window::<u64>::allocate(1024, &world);
    w.fence();
    let ones = vec![1u64; 1000];
    w.accumulate(0, 3, &ones, SystemOperation::sum());
    let old = w.fetch_and_op(0, 1020, &5, SystemOperation::sum());
    assert!(old % 5 == 0 && old < 5 * n);
    w.accumulate(0, 1021, &[rank as u64 * 7], SystemOperation::max());
    w.fence();
    if rank == 0 {
        w.with_local(|m| {
            assert!(m[3..1003].iter().all(|&x| x == n), "u64 sums");
            assert_eq!(m[..3], [0, 0, 0]);
            assert_eq!(m[1003], 0);
            assert_eq!(m[1020], 5 * n);
            assert_eq!(m[1021], (n - 1) * 7);
        });
    }
    w.fence();
    // i32 and u8: words shared by several elements, updated by compare-and-swap.
    let w32 = Window::<i32>::allocate(33, &world);
    let w8 = Window::<u8>::allocate(37, &world);
    w32.fence();
    w8.fence();
    let d: Vec<i32> = (0..31).map(|i| i - 15).collect();
    w32.accumulate(0, 1, &d, SystemOperation::sum());
    w8.accumulate(0, 3, &[1u8; 33], SystemOperation::sum());
    w8.accumulate(0, 0, &[rank as u8 + 1], SystemOperation::max());
    w32.fence();
    w8.fence();
    if rank == 0 {
        w32.with_local(|m| {
            assert_eq!(m[0], 0);
            for (i, x) in m[1..32].iter().enumerate() {
                assert_eq!(*x, (i as i32 - 15) * size, "i32 element {i}");
            }
            assert_eq!(m[32], 0);
        });
        w8.with_local(|m| {
            assert_eq!(m[0], size as u8);
            assert_eq!(m[1..3], [0, 0]);
            assert!(m[3..36].iter().all(|&x| x == size as u8));
            assert_eq!(m[36], 0);
        });
    }
    w32.fence();
    // f64: sums by compare-and-swap; get_accumulate and no_op reads.
    let wf = Window::<f64>::allocate(4, &world);
    wf.fence();
    let mut before = [0.0f64; 2];
    wf.get_accumulate(0, 1, &[0.5, 2.0], &mut before, SystemOperation::sum());
    assert!(before[0] >= 0.0 && before[0] < 0.5 * size as f64);
    wf.fence();
    let mut now = [0.0f64; 2];
    if u.transport() == pagewire::TransportKind::Pagewire {
        wf.get_accumulate(0, 1, &[9.0, 9.0], &mut now, SystemOperation::no_op());
    } else {
        wf.get(0, 1, &mut now);
    }
    assert_eq!(now, [0.5 * size as f64, 2.0 * size as f64]);
    wf.fence();
    // Compare-and-swap: exactly one rank claims each slot.
    let wc = Window::<i64>::allocate(2, &world);
    let wc16 = Window::<i16>::allocate(3, &world);
    wc.fence();
    wc16.fence();
    let won = wc.compare_and_swap(0, 1, 0, rank as i64 + 100) == 0;
    let won16 = wc16.compare_and_swap(0, 1, 0, rank as i16 + 1) == 0;
    let winners: Vec<i32> = {
        let mut all = vec![0i32; 2 * size as usize];
        world.all_gather_into(&[won as i32, won16 as i32][..], &mut all[..]);
        all
    };
    assert_eq!(
        winners.iter().step_by(2).sum::<i32>(),
        1,
        "one compare-and-swap wins"
    );
    assert_eq!(
        winners.iter().skip(1).step_by(2).sum::<i32>(),
        1,
        "one i16 swap wins"
    );
    wc.fence();
    wc16.fence();
    if rank == 0 {
        wc.with_local(|m| assert!(m[0] == 0 && (100..100 + size as i64).contains(&m[1])));
        wc16.with_local(|m| assert!(m[0] == 0 && m[2] == 0 && (1..=size as i16).contains(&m[1])));
    }
    // Replace is an atomic put (pagewire's transport: rsmpi does not bind MPI_REPLACE).
    if u.transport() == pagewire::TransportKind::Pagewire {
        w.accumulate(0, 0, &[42], SystemOperation::replace());
        w.fence();
        if rank == 0 {
            w.with_local(|m| assert_eq!(m[0], 42));
        }
    }
    w.fence();
}

/// Every rank increments rank 0's counter with a get and a put (not atomic by themselves)
/// under rank 0's exclusive lock, while rank 0 itself computes without calling pagewire
/// for a while: the count ends exact, so the lock excluded, and the target's NIC served
/// everything without its application.
fn locks_exclude_and_the_target_is_passive(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    const ROUNDS: u64 = 150;
    let win = Window::<u64>::allocate(2, &world);
    win.fence();
    if rank == 0 {
        // Compute: no pagewire call for 300 ms while the others lock, get and put.
        let t = std::time::Instant::now();
        let mut x = 1u64;
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
    }
    for _ in 0..ROUNDS {
        win.lock(0);
        let mut c = [0u64];
        win.get(0, 0, &mut c);
        win.put(0, 0, &[c[0] + 1]);
        win.unlock(0);
        win.fetch_and_op(0, 1, &1, SystemOperation::sum());
    }
    win.fence();
    if rank == 0 {
        win.with_local(|m| assert_eq!(m, [ROUNDS * size as u64; 2], "lost increments"));
    }
    win.fence();
}

/// The errors: nothing changes, and the window stays usable.
fn errors(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let win = Window::<u32>::allocate(10, &world);
    win.with_local_mut(|m| m.fill(7));
    win.fence();
    let other = (rank + 1) % size;
    let e = win.try_put(other, 8, &[1, 2, 3]).unwrap_err();
    assert!(
        matches!(e, Error::OutOfWindow { target, offset: 32, end: 44, window_bytes: 40 } if target == other as usize),
        "{e}"
    );
    let mut buf = [0u32; 2];
    assert!(matches!(
        win.try_get(other, 10, &mut buf),
        Err(Error::OutOfWindow { .. })
    ));
    assert!(matches!(
        win.try_get(other, usize::MAX / 2, &mut buf),
        Err(Error::OutOfWindow { .. })
    ));
    assert!(matches!(
        win.try_accumulate(other, 9, &[1, 1], SystemOperation::sum()),
        Err(Error::OutOfWindow { .. })
    ));
    assert!(matches!(
        win.try_put(size, 0, &[1]),
        Err(Error::NoSuchRank { .. })
    ));
    assert!(matches!(win.try_unlock(other), Err(Error::WindowSync(_))));
    win.lock(other);
    assert!(matches!(win.try_lock(other), Err(Error::WindowSync(_))));
    win.unlock(other);
    assert!(
        win.try_with_local(|_| win.try_with_local(|_| ()))
            .unwrap()
            .is_err(),
        "nested"
    );
    win.accumulate(other, 0, &[7], SystemOperation::bitwise_and());
    let wf = Window::<f32>::allocate(2, &world);
    assert!(wf
        .try_accumulate(other, 0, &[1.0], SystemOperation::bitwise_or())
        .is_err());
    win.fence();
    win.with_local(|m| assert_eq!(m, [7; 10], "a refused access changed the window"));
    // A window freed while a lock is held: the error says so, on the rank that held it.
    let held = Window::<u8>::allocate(4, &world);
    if rank == 0 {
        held.lock(1 % size);
    }
    let freed = held.try_free();
    if rank == 0 {
        assert!(matches!(freed, Err(Error::WindowSync(_))), "{freed:?}");
    }
    world.barrier();
    wf.fence();
}

/// Operations with a target datatype: a column of a 6 x 4 matrix of f64 (a vector type) is
/// put, got and accumulated; every other element stays as it was; mismatched signatures,
/// a column past the part and a datatype of another element type are refused.
fn typed(u: &pagewire::Universe) {
    use pagewire::datatype::{UncommittedDatatype, UserDatatype};
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let column = UserDatatype::vector(6, 1, 4, &f64::equivalent_datatype());
    let column = column.type_map();
    let win = Window::<f64>::allocate(24, &world);
    let c = rank as usize % 3;
    let mine: Vec<f64> = (0..6).map(|i| (rank * 10 + i) as f64).collect();
    win.fence();
    win.put_typed(next, c, &mine[..], column, 1);
    win.fence();
    let pc = prev as usize % 3;
    win.with_local(|m| {
        for (i, v) in m.iter().enumerate() {
            let expect = if i % 4 == pc {
                (prev * 10 + (i / 4) as i32) as f64
            } else {
                0.0
            };
            assert_eq!(*v, expect, "element {i}");
        }
    });
    let mut back = [0f64; 6];
    win.get_typed(next, c, &mut back[..], column, 1);
    assert_eq!(&back[..], &mine[..]);
    win.fence();
    // Every rank adds 1 to column 3 of rank 0, and the same through a lock.
    win.accumulate_typed(0, 3, &[1.0f64; 6][..], (column, 1), SystemOperation::sum());
    win.lock(0);
    win.accumulate_typed(0, 3, &[1.0f64; 6][..], (column, 1), SystemOperation::sum());
    win.unlock(0);
    win.fence();
    if rank == 0 {
        win.with_local(|m| {
            for i in 0..6 {
                assert_eq!(m[4 * i + 3], 2.0 * size as f64, "row {i}");
            }
        });
    }
    win.fence();
    let before = win.with_local(|m| m.to_vec());
    world.barrier();
    assert!(matches!(
        win.try_put_typed(next, 0, &mine[..5], column, 1),
        Err(e) if e.class() == ErrorClass::Type
    ));
    assert!(matches!(
        win.try_put_typed(next, 4, &mine[..], column, 1),
        Err(Error::OutOfWindow { .. })
    ));
    let ints = UserDatatype::vector(6, 2, 8, &i32::equivalent_datatype());
    assert!(matches!(
        win.try_accumulate_typed(
            next,
            0,
            &[1i32; 12][..],
            (ints.type_map(), 1),
            SystemOperation::sum()
        ),
        Err(e) if e.class() == ErrorClass::Type
    ));
    win.fence();
    win.with_local(|m| assert_eq!(m, &before[..], "a refused operation changed the part"));
    win.fence();
}

/// A particle: 9 bytes of fields and 7 of padding.
#[derive(pagewire_derive::Equivalence, Clone, Copy, Debug, Default, PartialEq)]
struct Particle {
    x: f64,
    kind: u8,
}

/// A window of a type with gaps: put, get and accumulate move its fields only; the
/// operations that need gap-free elements say so.
fn gapped(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let win = Window::<Particle>::allocate(100, &world);
    let mine: Vec<Particle> = (0..50)
        .map(|i| Particle {
            x: rank as f64 + i as f64 / 100.0,
            kind: (rank * 50 + i) as u8,
        })
        .collect();
    win.fence();
    win.put(next, 25, &mine);
    win.fence();
    win.with_local(|m| {
        for (i, p) in m.iter().enumerate() {
            let expect = if (25..75).contains(&i) {
                Particle {
                    x: prev as f64 + (i - 25) as f64 / 100.0,
                    kind: (prev * 50 + (i - 25) as i32) as u8,
                }
            } else {
                Particle::default()
            };
            assert_eq!(*p, expect, "element {i}");
        }
    });
    let mut back = vec![Particle::default(); 50];
    win.get(next, 25, &mut back);
    assert_eq!(back, mine);
    let e = win
        .try_fetch_and_op(next, 0, &mine[0], SystemOperation::sum())
        .unwrap_err();
    assert!(e.to_string().contains("a type with gaps"), "{e}");
    assert!(matches!(
        win.try_accumulate(next, 0, &mine[..1], SystemOperation::sum()),
        Err(e) if e.class() == ErrorClass::Type
    ));
    win.fence();
}

/// In the odp mode a fence maps this rank's part for the NIC (a prefetch), so the puts of
/// the next epoch into memory never touched before take no network page fault.
fn odp_prefetch_at_fence(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    const LEN: usize = 1 << 18; // 2 MiB of fresh zero pages
    let win = Window::<u64>::allocate(LEN, &world);
    let before = u.with_p2p(|p| p.nic_counters());
    win.fence();
    let data = vec![rank as u64 + 1; LEN];
    win.put(next, 0, &data);
    win.fence();
    let after = u.with_p2p(|p| p.nic_counters());
    assert_eq!(
        after.npf_responder - before.npf_responder,
        0,
        "no fault on the prefetched part"
    );
    assert!(
        after.prefetch_pages - before.prefetch_pages >= (LEN * 8 / 4096) as u64,
        "the part was prefetched: {} pages",
        after.prefetch_pages - before.prefetch_pages
    );
    let prev = (rank + size - 1) % size;
    win.with_local(|m| assert!(m.iter().all(|&v| v == prev as u64 + 1)));
    win.fence();
}

/// A window over a caller's vector, puts and gets under fences and locks, every element
/// checked; on the local path they are one kernel copy into and out of the peer's memory,
/// so the NIC moves next to none of the bytes (its atomics take the locks), while through
/// the NIC it moves them all.
fn vector_windows_move_by_the_path_in_force(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    const LEN: usize = 70_000;
    let win = Window::from_vec(vec![0u64; LEN], &world);
    let moved = || {
        u.with_p2p(|p| {
            let c = p.nic_counters();
            c.bytes_cma + c.bytes_staged + c.bytes_inline
        })
    };
    let before = moved();
    let mut bytes = 0;
    for (round, &(disp, n)) in [(0, 1), (5, 1000), (0, LEN)].iter().enumerate() {
        let data: Vec<u64> = (0..n).map(|i| value(rank, i + round)).collect();
        let expect: Vec<u64> = (0..n).map(|i| value(prev, i + round)).collect();
        win.fence();
        win.put(next, disp, &data);
        win.fence();
        win.with_local(|m| assert_eq!(&m[disp..disp + n], &expect[..], "put {n}"));
        let mut back = vec![0u64; n];
        win.lock(next);
        win.get(next, disp, &mut back);
        win.unlock(next);
        assert_eq!(back, data, "get {n}");
        bytes += 2 * 8 * n as u64;
    }
    win.fence();
    let nic_bytes = moved() - before;
    if u.local_path() == "shm" {
        assert!(
            nic_bytes < bytes / 16,
            "the NIC moved {nic_bytes} of {bytes} bytes"
        );
    } else {
        assert!(
            nic_bytes >= bytes / 2,
            "the NIC moved {nic_bytes} of {bytes} bytes"
        );
    }
}

/// Every rank adds to rank 0's element 100 times with an accumulate the NIC's atomics
/// cannot make (a sum of doubles): exact; with `PAGEWIRE_RMA_ACCUMULATE=am` (the default)
/// each is one message to the target, whose progress engine applies it, and with `mutex`
/// none is (the origin combines under the target's update mutex).
fn accumulates_by_the_method_in_force(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let win = Window::from_vec(vec![0f64; 4], &world);
    win.fence();
    let sent = || u.with_p2p(|p| p.counters().eager_sent);
    let before = sent();
    for i in 0..100 {
        win.accumulate(0, 1, &[1.0], SystemOperation::sum());
        if i % 10 == 0 {
            let mut old = [0f64];
            win.get_accumulate(0, 2, &[2.0], &mut old, SystemOperation::max());
        }
    }
    let messages = sent() - before;
    win.fence();
    if rank == 0 {
        win.with_local(|m| assert_eq!(m[..3], [0.0, 100.0 * size as f64, 2.0]));
    }
    if std::env::var("PAGEWIRE_RMA_ACCUMULATE").as_deref() == Ok("mutex") {
        assert!(messages < 100, "{messages} messages under the mutex");
    } else {
        assert!(messages >= 110, "{messages} messages for 110 accumulates");
    }
    win.fence();
}

#[test]
fn accumulates_are_applied_by_the_target() {
    jobs(
        "accumulates_are_applied_by_the_target",
        &[2, 3],
        &[],
        accumulates_by_the_method_in_force,
    );
}

#[test]
fn accumulates_under_the_update_mutex() {
    jobs(
        "accumulates_under_the_update_mutex",
        &[2, 3],
        &[("PAGEWIRE_RMA_ACCUMULATE", "mutex")],
        accumulates_by_the_method_in_force,
    );
}

#[test]
fn accumulates_are_exact_under_the_update_mutex() {
    jobs(
        "accumulates_are_exact_under_the_update_mutex",
        &[2, 3],
        &[
            ("PAGEWIRE_RMA_ACCUMULATE", "mutex"),
            ("PAGEWIRE_MODE", "copy"),
        ],
        accumulates,
    );
}

#[test]
fn a_window_over_a_vector_moves_by_the_path_in_force() {
    jobs(
        "a_window_over_a_vector_moves_by_the_path_in_force",
        &[2, 3],
        &[],
        vector_windows_move_by_the_path_in_force,
    );
}

#[test]
fn the_mpi_rs_window_example_runs_unchanged() {
    jobs(
        "the_mpi_rs_window_example_runs_unchanged",
        &[2, 3],
        &[],
        mpi_rs_shape,
    );
}

#[test]
fn put_and_get_under_every_synchronisation_in_the_copy_mode() {
    jobs(
        "put_and_get_under_every_synchronisation_in_the_copy_mode",
        &[2, 3],
        &[("PAGEWIRE_MODE", "copy")],
        put_get_everywhere,
    );
}

#[test]
fn put_and_get_under_every_synchronisation_in_the_pindown_mode() {
    jobs(
        "put_and_get_under_every_synchronisation_in_the_pindown_mode",
        &[2, 4],
        &[("PAGEWIRE_MODE", "pindown")],
        put_get_everywhere,
    );
}

#[test]
fn put_and_get_under_every_synchronisation_in_the_odp_mode() {
    jobs(
        "put_and_get_under_every_synchronisation_in_the_odp_mode",
        &[2, 3],
        &[("PAGEWIRE_MODE", "odp")],
        put_get_everywhere,
    );
}

#[test]
fn put_and_get_on_the_tcp_wire() {
    jobs(
        "put_and_get_on_the_tcp_wire",
        &[3],
        &[("PAGEWIRE_SOFT_WIRE", "tcp")],
        put_get_everywhere,
    );
}

#[test]
fn accumulates_are_exact() {
    jobs("accumulates_are_exact", &[2, 4], &[], accumulates);
}

#[test]
fn accumulates_are_exact_in_the_pindown_mode() {
    jobs(
        "accumulates_are_exact_in_the_pindown_mode",
        &[2, 3],
        &[("PAGEWIRE_MODE", "pindown")],
        accumulates,
    );
}

#[test]
fn accumulates_are_exact_in_the_odp_mode() {
    jobs(
        "accumulates_are_exact_in_the_odp_mode",
        &[2, 4],
        &[("PAGEWIRE_MODE", "odp")],
        accumulates,
    );
}

#[test]
fn accumulates_are_exact_on_the_tcp_wire() {
    jobs(
        "accumulates_are_exact_on_the_tcp_wire",
        &[3],
        &[("PAGEWIRE_SOFT_WIRE", "tcp")],
        accumulates,
    );
}

#[test]
fn locks_exclude_and_the_target_needs_no_cpu() {
    jobs(
        "locks_exclude_and_the_target_needs_no_cpu",
        &[2, 4],
        &[],
        locks_exclude_and_the_target_is_passive,
    );
}

#[test]
fn locks_exclude_and_the_target_needs_no_cpu_in_the_odp_mode() {
    jobs(
        "locks_exclude_and_the_target_needs_no_cpu_in_the_odp_mode",
        &[2, 3],
        &[("PAGEWIRE_MODE", "odp")],
        locks_exclude_and_the_target_is_passive,
    );
}

#[test]
fn a_column_is_put_got_and_accumulated_with_a_target_datatype() {
    jobs(
        "a_column_is_put_got_and_accumulated_with_a_target_datatype",
        &[2, 3],
        &[],
        typed,
    );
}

#[test]
fn a_column_with_a_target_datatype_in_the_odp_mode() {
    jobs(
        "a_column_with_a_target_datatype_in_the_odp_mode",
        &[2],
        &[("PAGEWIRE_MODE", "odp")],
        typed,
    );
}

#[test]
fn a_window_of_a_type_with_padding_moves_its_fields() {
    jobs(
        "a_window_of_a_type_with_padding_moves_its_fields",
        &[2, 3],
        &[],
        gapped,
    );
}

#[test]
fn in_the_odp_mode_a_fence_prefetches_the_part_and_puts_take_no_fault() {
    jobs(
        "in_the_odp_mode_a_fence_prefetches_the_part_and_puts_take_no_fault",
        &[2],
        &[("PAGEWIRE_MODE", "odp")],
        odp_prefetch_at_fence,
    );
}

#[test]
fn bad_window_accesses_are_errors_at_the_origin() {
    jobs(
        "bad_window_accesses_are_errors_at_the_origin",
        &[2, 3],
        &[],
        errors,
    );
}

/// The same bodies under mpirun: on the host MPI library's windows (`PAGEWIRE_TRANSPORT=mpi`)
/// and on pagewire's transport bootstrapped by MPI.
mod under_mpirun {
    use pagewire_test_support::mpirun;

    const SUITE: mpirun::SuiteTests = &[
        ("the_mpi_rs_window_example_runs_unchanged", None),
        ("accumulates_are_exact", None),
        ("locks_exclude_and_the_target_needs_no_cpu", Some(&[2])),
        ("bad_window_accesses_are_errors_at_the_origin", None),
        (
            "a_column_is_put_got_and_accumulated_with_a_target_datatype",
            None,
        ),
    ];

    #[test]
    #[cfg(feature = "mpi")]
    fn windows_on_the_mpi_transport() {
        mpirun::on_the_mpi_transport(SUITE, &[]);
    }

    #[test]
    #[cfg_attr(
        not(feature = "mpi"),
        ignore = "under mpiexec through PMI-1: .ci/mpi.sh runs it"
    )]
    fn windows_on_pagewire_bootstrapped_by_mpi() {
        mpirun::on_pagewire_bootstrapped_by_mpi(SUITE, &[]);
    }
}
