//! Multi-process tests of windows over memory the caller keeps (`Window::create`) and of
//! dynamic windows (`Window::create_dynamic`, `attach`, `detach`): every operation on
//! attached regions under fence, locks and lock-all, in the three buffer modes and on the
//! TCP wire; what each mode registers and pins; accesses to detached memory refused at the
//! origin while the owner attaches and detaches under them, with no byte of a detached
//! region changed afterwards.

use pagewire::traits::*;
use pagewire::window::{Attachment, Window};
use pagewire::{Error, ErrorClass, SystemOperation};
use pagewire_test_support::facade::jobs;

/// The value rank `r` puts at element `i`.
fn value(r: i32, i: usize) -> u64 {
    (r as u64) << 40 | (i as u64 * 2654435761) & 0xff_ffff_ffff
}

/// Every rank's address of its region (an allgather, as an MPI program sends
/// `MPI_Get_address`'s result).
fn addresses<C: Communicator>(comm: &C, a: &Attachment) -> Vec<usize> {
    let mut all = vec![0u64; comm.size() as usize];
    comm.all_gather_into(&(a.address() as u64), &mut all[..]);
    all.into_iter().map(|x| x as usize).collect()
}

/// A window over each rank's own slice: puts land in it, and it is the caller's again
/// after the call.
fn over_a_borrowed_slice(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let mut mine = vec![0u64; 1000];
    let seen = Window::create(&mut mine, &world, |win| {
        assert_eq!(win.local_len(), 1000);
        win.fence();
        let data: Vec<u64> = (0..1000).map(|i| value(rank, i)).collect();
        win.put(next, 0, &data);
        win.fence();
        win.lock(next);
        win.accumulate(next, 10, &[5, 5], SystemOperation::sum());
        win.unlock(next);
        win.fence();
        win.with_local(|m| m[10])
    });
    let expect: Vec<u64> = (0..1000)
        .map(|i| value(prev, i) + if (10..12).contains(&i) { 5 } else { 0 })
        .collect();
    assert_eq!(seen, expect[10]);
    assert_eq!(
        mine, expect,
        "the slice holds what peers put, after the window"
    );
}

/// Each rank attaches two regions and every operation runs on its successor's, under
/// fence, exclusive and shared locks and lock-all; every element checked; then a region
/// is detached and accesses to it fail at the origin while the other still works.
fn dynamic_everywhere(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let odp = std::env::var("PAGEWIRE_MODE").as_deref() == Ok("odp");
    let win = Window::<u64>::create_dynamic(&world);
    assert!(win.is_dynamic() && win.disp_unit() == 1 && win.local_len() == 0);
    let before = win.counters();
    const BIG: usize = 200_000;
    let big = win.attach(vec![0u64; BIG]);
    let small = win.attach(vec![0u64; 8]);
    let c = win.counters();
    assert_eq!(c.attaches, 2);
    if odp {
        assert_eq!(c.bytes_pinned, 0, "odp pins nothing: {c:?}");
        assert_eq!(
            c.registrations, before.registrations,
            "odp registers no region: {c:?}"
        );
    } else {
        assert_eq!(c.registrations, before.registrations + 2, "{c:?}");
        assert_eq!(
            c.bytes_pinned,
            before.bytes_pinned + 8 * (BIG as u64 + 8),
            "each attached region pinned: {c:?}"
        );
    }
    let big_at = addresses(&world, &big);
    let small_at = addresses(&world, &small);
    let unit = std::mem::size_of::<u64>();
    for (round, &(from, n)) in [(0, 1), (7, 1000), (1, 100_000), (0, BIG), (BIG - 3, 3)]
        .iter()
        .enumerate()
    {
        let at = big_at[next as usize] + from * unit;
        let data: Vec<u64> = (0..n).map(|i| value(rank, i + round)).collect();
        let expect: Vec<u64> = (0..n).map(|i| value(prev, i + round)).collect();
        win.fence();
        win.put(next, at, &data);
        win.fence();
        win.with_attached(&big, |m| {
            assert_eq!(&m[from..from + n], &expect[..], "put {n}")
        });
        let mut back = vec![0u64; n];
        win.lock(next);
        win.get(next, at, &mut back);
        win.unlock(next);
        assert_eq!(back, data, "get {n}");
        win.fence();
        win.lock_all();
        win.get(next, at, &mut back);
        win.unlock_all();
        assert_eq!(back, data, "lock_all get {n}");
    }
    // Atomics and accumulates on the small region, every rank into rank 0's.
    win.fence();
    let zero = small_at[0];
    win.accumulate(0, zero, &[1, 2], SystemOperation::sum());
    win.fetch_and_op(0, zero + 2 * unit, &3, SystemOperation::sum());
    win.lock_shared(0);
    let mut old = [0u64; 1];
    win.get_accumulate(0, zero + 3 * unit, &[1], &mut old, SystemOperation::max());
    win.unlock(0);
    let mut won = 0;
    for _ in 0..3 {
        let seen = win.compare_and_swap(0, zero + 4 * unit, 0, rank as u64 + 1);
        won += (seen == 0) as u32;
    }
    win.fence();
    if rank == 0 {
        win.with_attached(&small, |m| {
            let n = size as u64;
            assert_eq!(&m[..4], &[n, 2 * n, 3 * n, 1], "{m:?}");
            assert!((1..=n).contains(&m[4]), "one compare-and-swap won: {m:?}");
        });
    }
    let won = {
        let mut all = vec![0u32; size as usize];
        world.all_gather_into(&won, &mut all[..]);
        all.iter().sum::<u32>()
    };
    assert_eq!(won, 1, "exactly one compare-and-swap from zero won");
    // A target datatype on an attached region: every other element of the successor's.
    {
        use pagewire::datatype::{UncommittedDatatype, UserDatatype};
        let every_other = UserDatatype::vector(4, 1, 2, &u64::equivalent_datatype());
        win.fence();
        let before = win.with_attached(&small, |m| m.to_vec());
        world.barrier();
        let values = [11 + rank as u64, 12, 13, 14];
        win.put_typed(
            next,
            small_at[next as usize],
            &values[..],
            every_other.type_map(),
            1,
        );
        win.fence();
        win.with_attached(&small, |m| {
            for i in 0..8 {
                let expect = if i % 2 == 0 {
                    [11 + prev as u64, 12, 13, 14][i / 2]
                } else {
                    before[i]
                };
                assert_eq!(m[i], expect, "element {i}");
            }
        });
        win.fence();
    }
    // Bounds: past the region's end, between regions, and nowhere.
    let e = win
        .try_put(next, big_at[next as usize] + (BIG - 1) * unit, &[1, 2])
        .unwrap_err();
    assert!(
        matches!(e, Error::NotAttached { target, .. } if target == next as usize),
        "{e}"
    );
    assert!(matches!(
        win.try_get(next, 64, &mut [0u64]),
        Err(Error::NotAttached { .. })
    ));
    // Detach the big region: its memory comes back whole, and peers' accesses to it fail
    // at the origin; the small one still works.
    win.fence();
    let last: Vec<u64> = (0..3).map(|i| value(prev, i + 4)).collect();
    let back = win.detach(big);
    assert_eq!(back.len(), BIG);
    assert_eq!(&back[BIG - 3..], &last[..]);
    let c = win.counters();
    assert_eq!(c.detaches, 1);
    if !odp {
        assert_eq!(c.bytes_pinned, before.bytes_pinned + 64, "{c:?}");
    }
    world.barrier();
    let e = win.try_put(next, big_at[next as usize], &[9]).unwrap_err();
    assert!(matches!(e, Error::NotAttached { .. }), "{e}");
    win.lock(next);
    assert!(matches!(
        win.try_get(next, big_at[next as usize] + 8, &mut [0u64]),
        Err(Error::NotAttached { .. })
    ));
    win.put(next, small_at[next as usize] + 7 * unit, &[42]);
    win.unlock(next);
    win.fence();
    win.with_attached(&small, |m| assert_eq!(m[7], 42));
    win.fence();
}

/// Rank 0 attaches and detaches regions over and over while the others put into whatever
/// it last published, each put either landing or refused: every detached region comes
/// back with no byte changed after its detach, and every put that succeeded landed.
fn detach_under_fire(u: &pagewire::Universe) {
    let world = u.world();
    let rank = world.rank();
    const ROUNDS: usize = 40;
    const LEN: usize = 4096;
    let win = Window::<u64>::create_dynamic(&world);
    // Rank 0 publishes the address of its current region in a static window.
    let board = Window::<u64>::allocate(1, &world);
    board.fence();
    if rank == 0 {
        let mut current: Option<Attachment> = None;
        // The regions detached, kept (so that their memory is not reused), and copies of
        // them taken at the detach.
        let mut detached: Vec<Vec<u64>> = Vec::new();
        let mut snapshots: Vec<Vec<u64>> = Vec::new();
        for _ in 0..ROUNDS {
            let next = win.attach(vec![0u64; LEN]);
            board.with_local_mut(|m| m[0] = next.address() as u64);
            if let Some(old) = current.replace(next) {
                let back = win.detach(old);
                snapshots.push(back.clone());
                detached.push(back);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        world.barrier(); // the others are done
        for (got, snap) in detached.iter().zip(&snapshots) {
            assert_eq!(
                got, snap,
                "a byte of a detached region changed after its detach"
            );
        }
        let last = win.detach(current.expect("attached"));
        assert!(
            last.iter().all(|&v| v == 0 || v >> 40 != 0),
            "only the peers' values"
        );
        win.with_local(|m| assert!(m.is_empty()));
    } else {
        let mut landed = 0u64;
        let mut refused = 0u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(60);
        while std::time::Instant::now() < deadline || landed == 0 {
            let mut at = [0u64];
            board.get(0, 0, &mut at);
            if at[0] == 0 {
                continue;
            }
            let i = (landed + refused) as usize % LEN;
            match win.try_put(0, at[0] as usize + 8 * i, &[value(rank, i)]) {
                Ok(()) => landed += 1,
                Err(Error::NotAttached { .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        world.barrier();
        assert!(landed > 0);
    }
    world.barrier();
    board.fence();
}

/// The errors of attach and detach: nothing changes, and the window stays usable.
fn attach_errors(u: &pagewire::Universe) {
    let world = u.world();
    let win = Window::<u32>::create_dynamic(&world);
    let other = Window::<u32>::create_dynamic(&world);
    let fixed = Window::<u32>::allocate(4, &world);
    assert!(matches!(
        win.try_attach(Vec::new()),
        Err(e) if e.class() == ErrorClass::RmaAttach
    ));
    assert!(matches!(
        fixed.try_attach(vec![1]),
        Err(e) if e.class() == ErrorClass::RmaFlavor
    ));
    let a = win.attach(vec![1, 2, 3]);
    let b = other.attach(vec![4]);
    let b = match win.try_detach(b) {
        Err(e) if e.class() == ErrorClass::RmaAttach => other.detach(other.attach(vec![5])),
        r => panic!("a region of another window detached: {r:?}"),
    };
    assert_eq!(b, vec![5]);
    win.with_attached(&a, |m| assert_eq!(m, [1, 2, 3]));
    // Detaching under one's own shared lock (peers may be in an access) is refused.
    win.lock_all();
    let e = win.try_detach(a);
    win.unlock_all();
    assert!(matches!(e, Err(Error::WindowSync(_))), "{e:?}");
    // An operation on one's own part while a local access holds references to it.
    let me = world.rank();
    let e = fixed
        .try_with_local(|_| fixed.try_put(me, 0, &[1]))
        .unwrap();
    assert!(matches!(e, Err(Error::WindowSync(_))), "{e:?}");
    world.barrier();
}

#[test]
fn a_window_over_a_borrowed_slice_gives_it_back_with_the_puts_in_it() {
    jobs(
        "a_window_over_a_borrowed_slice_gives_it_back_with_the_puts_in_it",
        &[2, 3],
        &[],
        over_a_borrowed_slice,
    );
}

#[test]
fn dynamic_windows_in_the_copy_mode() {
    jobs(
        "dynamic_windows_in_the_copy_mode",
        &[2, 3],
        &[("PAGEWIRE_MODE", "copy")],
        dynamic_everywhere,
    );
}

#[test]
fn dynamic_windows_in_the_pindown_mode() {
    jobs(
        "dynamic_windows_in_the_pindown_mode",
        &[2, 4],
        &[("PAGEWIRE_MODE", "pindown")],
        dynamic_everywhere,
    );
}

#[test]
fn dynamic_windows_in_the_odp_mode_register_nothing_per_region() {
    jobs(
        "dynamic_windows_in_the_odp_mode_register_nothing_per_region",
        &[2, 3],
        &[("PAGEWIRE_MODE", "odp")],
        dynamic_everywhere,
    );
}

#[test]
fn dynamic_windows_on_the_tcp_wire() {
    jobs(
        "dynamic_windows_on_the_tcp_wire",
        &[3],
        &[("PAGEWIRE_SOFT_WIRE", "tcp")],
        dynamic_everywhere,
    );
}

#[test]
fn a_region_detached_under_peers_accesses_is_never_written_after() {
    jobs(
        "a_region_detached_under_peers_accesses_is_never_written_after",
        &[2, 3],
        &[],
        detach_under_fire,
    );
}

#[test]
fn a_region_detached_under_peers_accesses_is_never_written_after_in_the_odp_mode() {
    jobs(
        "a_region_detached_under_peers_accesses_is_never_written_after_in_the_odp_mode",
        &[3],
        &[("PAGEWIRE_MODE", "odp")],
        detach_under_fire,
    );
}

#[test]
fn attach_and_detach_errors() {
    jobs("attach_and_detach_errors", &[2], &[], attach_errors);
}
