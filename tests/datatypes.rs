//! Multi-process tests of datatypes and nonblocking collectives through the rsmpi-shaped
//! facade: non-contiguous datatypes (vector, indexed, struct, derived) move every byte of
//! their blocks and leave the gaps between them untouched, eager and rendezvous, blocking
//! and nonblocking, point-to-point and collective, in the copy, pindown and odp buffer
//! modes; nonblocking collectives progress while the caller computes and exchanges
//! point-to-point messages.

use pagewire::datatype::{
    MutView, PartitionMut, UncommittedDatatype, UncommittedUserDatatype, UserDatatype, View,
};
use pagewire::traits::*;
use pagewire::{request, Address, Count, SystemOperation};
use pagewire_test_support::facade::ranks;

const MODES: [&str; 3] = ["copy", "pindown", "odp"];

/// What the gaps of a receive buffer hold before and after.
const GAP: i32 = -7;

/// Element `i` as rank `rank` sends it.
fn value(rank: i32, i: usize) -> i32 {
    rank * 1_000_003 + i as i32
}

/// A vector of `blocks` runs of 3 of every 5 `i32`s: blocks, then gaps of 2.
fn strided(blocks: usize) -> UserDatatype {
    UserDatatype::vector(blocks as Count, 3, 5, &i32::equivalent_datatype())
}

/// Whether element `i` of a strided buffer is in a block.
fn in_block(i: usize) -> bool {
    i % 5 < 3
}

/// Checks a strided receive buffer: blocks from `from`, gaps untouched.
fn check_strided(buf: &[i32], from: i32, what: &str) {
    for (i, &x) in buf.iter().enumerate() {
        let want = if in_block(i) { value(from, i) } else { GAP };
        assert_eq!(x, want, "{what}: element {i} of {}", buf.len());
    }
}

fn vectors_point_to_point(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank(), world.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    // 20 blocks stay eager; 40,000 (480 KB of data) go by rendezvous.
    for blocks in [20usize, 40_000] {
        let t = strided(blocks);
        let len = blocks * 5 - 2;
        let send: Vec<i32> = (0..len).map(|i| value(me, i)).collect();
        // Blocking, with a send buffer whose gaps hold other values (they must not travel).
        let mut recv = vec![GAP; len];
        {
            let sv = unsafe { View::with_count_and_datatype(&send[..], 1, &t) };
            let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &t) };
            let status = pagewire::point_to_point::send_receive_into(
                &sv,
                &world.process_at_rank(next),
                &mut rv,
                &world.process_at_rank(prev),
            );
            assert_eq!(status.count_bytes(), blocks * 3 * 4);
        }
        check_strided(&recv, prev, "blocking vector");
        // Nonblocking.
        let mut recv = vec![GAP; len];
        {
            let sv = unsafe { View::with_count_and_datatype(&send[..], 1, &t) };
            let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &t) };
            request::scope(|scope| {
                let r = world
                    .process_at_rank(prev)
                    .immediate_receive_into(scope, &mut rv);
                let s = world.process_at_rank(next).immediate_send(scope, &sv);
                s.wait();
                r.wait();
            });
        }
        check_strided(&recv, prev, "immediate vector");
    }
}

#[test]
fn vectors_move_their_blocks_and_leave_the_gaps_in_every_mode() {
    for mode in MODES {
        let env = [
            ("PAGEWIRE_MODE", mode),
            ("PAGEWIRE_MEMLOCK_LIMIT", "unlimited"),
        ];
        ranks(
            "vectors_move_their_blocks_and_leave_the_gaps_in_every_mode",
            3,
            &env,
            vectors_point_to_point,
        );
    }
}

/// `i32`s per run of a wide vector (16 KiB: over `PAGEWIRE_SG_MIN_RUN`'s default, so zero-copy
/// modes move it in place, scatter-gather).
const RUN: usize = 4096;
/// `i32`s between two runs of a wide vector.
const HOLE: usize = 1000;

/// A vector of `blocks` runs of [`RUN`] `i32`s, [`HOLE`] apart.
fn wide(blocks: usize) -> UserDatatype {
    UserDatatype::vector(
        blocks as Count,
        RUN as Count,
        (RUN + HOLE) as Count,
        &i32::equivalent_datatype(),
    )
}

/// Element `j` of a wide vector's message: its index in the buffer.
fn wide_index(j: usize) -> usize {
    j / RUN * (RUN + HOLE) + j % RUN
}

/// Checks a wide receive buffer: its first `blocks` runs from `from`, everything else
/// (holes, and whatever lies past those runs) untouched.
fn check_wide(buf: &[i32], blocks: usize, from: i32, what: &str) {
    for (i, &x) in buf.iter().enumerate() {
        let in_run = i % (RUN + HOLE) < RUN && i / (RUN + HOLE) < blocks;
        let want = if in_run { value(from, i) } else { GAP };
        assert_eq!(x, want, "{what}: element {i} of {}", buf.len());
    }
}

fn wide_vectors_point_to_point(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank(), world.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let blocks = 24;
    let t = wide(blocks);
    let len = blocks * (RUN + HOLE) - HOLE;
    let send: Vec<i32> = (0..len).map(|i| value(me, i)).collect();
    let before = u.with_p2p(|p| p.counters().rndv_scatter_gather);
    let sv = unsafe { View::with_count_and_datatype(&send[..], 1, &t) };

    // Gaps on both sides, blocking.
    let mut recv = vec![GAP; len];
    {
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &t) };
        let status = pagewire::point_to_point::send_receive_into(
            &sv,
            &world.process_at_rank(next),
            &mut rv,
            &world.process_at_rank(prev),
        );
        assert_eq!(status.count_bytes(), blocks * RUN * 4);
    }
    check_wide(&recv, blocks, prev, "wide vector to wide vector");

    // Gaps on the sending side only: the receiver gets the runs back to back.
    let mut packed = vec![GAP; blocks * RUN];
    pagewire::point_to_point::send_receive_into(
        &sv,
        &world.process_at_rank(next),
        &mut packed[..],
        &world.process_at_rank(prev),
    );
    for (j, &x) in packed.iter().enumerate() {
        assert_eq!(
            x,
            value(prev, wide_index(j)),
            "wide vector to slice: element {j}"
        );
    }

    // Gaps on the receiving side only, nonblocking.
    let contiguous: Vec<i32> = (0..blocks * RUN)
        .map(|j| value(me, wide_index(j)))
        .collect();
    let mut recv = vec![GAP; len];
    {
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &t) };
        request::scope(|scope| {
            let r = world
                .process_at_rank(prev)
                .immediate_receive_into(scope, &mut rv);
            let s = world
                .process_at_rank(next)
                .immediate_send(scope, &contiguous[..]);
            s.wait();
            r.wait();
        });
    }
    check_wide(&recv, blocks, prev, "slice to wide vector");

    // A receive buffer of half the runs (and a half): the message is truncated, nothing
    // past the buffer's runs is written, the send completes.
    let short = UserDatatype::vector(
        blocks as Count / 2 + 1,
        RUN as Count / 2,
        (RUN + HOLE) as Count,
        &i32::equivalent_datatype(),
    );
    let mut recv = vec![GAP; len];
    let result = {
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &short) };
        request::scope(|scope| {
            let s = world.process_at_rank(next).immediate_send(scope, &sv);
            let r = world
                .process_at_rank(prev)
                .try_receive_into_with_tag(&mut rv, None);
            s.wait();
            r
        })
    };
    let e = result.expect_err("a truncated receive").to_string();
    assert!(e.contains("truncated"), "{e}");
    for (i, &x) in recv.iter().enumerate() {
        let (k, within) = (i / (RUN + HOLE), i % (RUN + HOLE));
        let in_run = within < RUN / 2 && k <= blocks / 2;
        // Run `k` of the short buffer holds message elements from `k · RUN/2` on.
        let want = if in_run {
            value(prev, wide_index(k * RUN / 2 + within))
        } else {
            GAP
        };
        assert_eq!(x, want, "truncated: element {i}");
    }

    // Zero-copy modes told to take 8 KiB runs in place moved every rendezvous with gaps
    // that way: 2 sends and 2 receives with gaps, the truncated receive and its send.
    // Otherwise they packed them; `copy` gathers through bounce slots.
    let moved = u.with_p2p(|p| p.counters().rndv_scatter_gather) - before;
    let zero_copy = u.with_p2p(|p| p.mode_name()) != "copy";
    let in_place = std::env::var("PAGEWIRE_SG_MIN_RUN").as_deref() == Ok("8K");
    let expected = if zero_copy && in_place { 6 } else { 0 };
    assert_eq!(moved, expected, "scatter-gather rendezvous");
}

#[test]
fn wide_vectors_move_in_place_by_scatter_gather_and_leave_the_gaps_in_every_mode() {
    // `PAGEWIRE_SG_MIN_RUN=8K` takes the runs (16 KiB, and 8 KiB in the short buffer) in
    // place (scatter-gather); 256K and the default pack them in zero-copy modes. An eager limit of 256 bytes leaves room in the
    // RTS for 8 of the 24 runs: ChunkReady announces the rest.
    for (mode, rndv, eager, sg_min_run) in [
        ("copy", "auto", "16384", "8K"),
        ("pindown", "auto", "16384", "8K"),
        ("odp", "auto", "16384", "8K"),
        ("pindown", "put", "16384", "8K"),
        ("odp", "put", "16384", "8K"),
        ("copy", "get", "16384", "8K"),
        ("pindown", "auto", "256", "8K"),
        ("pindown", "auto", "16384", "256K"),
        ("odp", "auto", "16384", "off"),
    ] {
        let env = [
            ("PAGEWIRE_MODE", mode),
            ("PAGEWIRE_RNDV", rndv),
            ("PAGEWIRE_EAGER_LIMIT", eager),
            ("PAGEWIRE_SG_MIN_RUN", sg_min_run),
            ("PAGEWIRE_SG_MIN_BYTES", "0"),
            ("PAGEWIRE_MEMLOCK_LIMIT", "unlimited"),
        ];
        ranks(
            "wide_vectors_move_in_place_by_scatter_gather_and_leave_the_gaps_in_every_mode",
            2,
            &env,
            wide_vectors_point_to_point,
        );
    }
}

/// A struct with padding: the datatype covers the fields only.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
struct Particle {
    kind: u8,
    // 7 bytes of padding here.
    mass: f64,
    charge: i16,
    // 6 bytes of padding here.
}

// SAFETY: the datatype describes the three fields at their offsets.
unsafe impl Equivalence for Particle {
    type Out = UserDatatype;
    fn equivalent_datatype() -> UserDatatype {
        let fields = UncommittedUserDatatype::structured(
            &[1, 1, 1],
            &[
                std::mem::offset_of!(Particle, kind) as Address,
                std::mem::offset_of!(Particle, mass) as Address,
                std::mem::offset_of!(Particle, charge) as Address,
            ],
            &[
                u8::equivalent_datatype().dup(),
                f64::equivalent_datatype().dup(),
                i16::equivalent_datatype().dup(),
            ],
        );
        UserDatatype::resized(&fields, 0, std::mem::size_of::<Particle>() as Address)
    }
}

/// A struct whose datatype `#[derive(Equivalence)]` builds.
#[derive(pagewire_derive::Equivalence, Clone, Copy, Debug, Default, PartialEq)]
struct Sample {
    flag: bool,
    pair: (u16, f32),
    values: [i64; 3],
}

fn structs_and_indexed(u: &pagewire::Universe) {
    let world = u.world();
    let me = world.rank();
    let root = world.process_at_rank(0);
    // Structs with padding, broadcast: 5,000 of them (rendezvous) and 1 (eager).
    for n in [1usize, 5_000] {
        let mut particles: Vec<Particle> = (0..n)
            .map(|i| Particle {
                kind: if me == 0 { i as u8 } else { 0 },
                mass: if me == 0 { i as f64 * 0.5 } else { 0.0 },
                charge: if me == 0 { -(i as i16) } else { 0 },
            })
            .collect();
        root.broadcast_into(&mut particles[..]);
        for (i, p) in particles.iter().enumerate() {
            let want = Particle {
                kind: i as u8,
                mass: i as f64 * 0.5,
                charge: -(i as i16),
            };
            assert_eq!(*p, want, "particle {i} of {n}");
        }
    }
    // Derived: gathered at the root.
    let mine = Sample {
        flag: me % 2 == 1,
        pair: (me as u16 + 1, me as f32 * 1.5),
        values: [me as i64, -(me as i64), 42],
    };
    if me == 0 {
        let mut all = vec![Sample::default(); world.size() as usize];
        root.gather_into_root(&mine, &mut all[..]);
        for (r, s) in all.iter().enumerate() {
            assert_eq!(s.pair, (r as u16 + 1, r as f32 * 1.5));
            assert_eq!(s.values, [r as i64, -(r as i64), 42]);
            assert_eq!(s.flag, r % 2 == 1);
        }
    } else {
        root.gather_into(&mine);
    }
    // Indexed blocks into a partitioned receive: rank r sends elements 4r.. of an indexed
    // type (blocks of 2 at 0 and 5), everyone gathers them into blocks placed backwards.
    let t = UserDatatype::indexed(&[2, 1], &[0, 5], &i32::equivalent_datatype());
    let send: Vec<i32> = (0..6).map(|i| value(me, i)).collect();
    let size = world.size() as usize;
    let counts = vec![3 as Count; size];
    let displs: Vec<Count> = (0..size).map(|r| ((size - 1 - r) * 4) as Count).collect();
    let mut recv = vec![GAP; 4 * size];
    {
        let sv = unsafe { View::with_count_and_datatype(&send[..], 1, &t) };
        let mut rv = PartitionMut::new(&mut recv[..], &counts[..], &displs[..]);
        world.all_gather_varcount_into(&sv, &mut rv);
    }
    for r in 0..size {
        let at = (size - 1 - r) * 4;
        let want = [
            value(r as i32, 0),
            value(r as i32, 1),
            value(r as i32, 5),
            GAP,
        ];
        assert_eq!(recv[at..at + 4], want, "block of rank {r}");
    }
}

#[test]
fn structs_derived_and_indexed_types_in_collectives_in_every_mode() {
    for mode in MODES {
        let env = [
            ("PAGEWIRE_MODE", mode),
            ("PAGEWIRE_MEMLOCK_LIMIT", "unlimited"),
        ];
        ranks(
            "structs_derived_and_indexed_types_in_collectives_in_every_mode",
            3,
            &env,
            structs_and_indexed,
        );
    }
}

/// Nonblocking collectives started, then point-to-point traffic (receives from any source
/// with any tag, which must not take the collectives' messages) and computation, then the
/// collectives completed: by test in a loop, and by wait.
fn overlap(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank(), world.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let big: Vec<f64> = (0..100_000).map(|i| (i as f64) + f64::from(me)).collect();
    let mut sum = vec![0.0f64; big.len()];
    let mut max = -1i32;
    let mut all = vec![0i32; n as usize];
    let mut work = 0u64;
    request::scope(|scope| {
        let barrier = world.immediate_barrier();
        let reduce =
            world.immediate_all_reduce_into(scope, &big[..], &mut sum[..], SystemOperation::sum());
        let gather = world.immediate_all_gather_into(scope, &me, &mut all[..]);
        let maxed = world.immediate_all_reduce_into(scope, &me, &mut max, SystemOperation::max());
        // Point-to-point meanwhile: a ring, received from any process.
        for round in 0..50 {
            let (x, status) = request::scope(|s| {
                let send = world
                    .process_at_rank(next)
                    .immediate_send_with_tag(s, &round, 3);
                let got = world.any_process().receive::<i32>();
                send.wait();
                got
            });
            assert_eq!((x, status.source_rank(), status.tag()), (round, prev, 3));
            work += (0..1000u64).map(|k| k * k % 7).sum::<u64>();
        }
        // Completed by polling, while computing.
        let mut reduce = reduce;
        loop {
            match reduce.test() {
                Ok(_) => break,
                Err(r) => {
                    reduce = r;
                    work += 1;
                }
            }
        }
        barrier.wait();
        gather.wait();
        maxed.wait();
    });
    assert!(work > 0);
    assert_eq!(max, n - 1);
    assert_eq!(all, (0..n).collect::<Vec<_>>());
    let ranks_sum = f64::from(n * (n - 1) / 2);
    for (i, &s) in sum.iter().enumerate() {
        assert_eq!(s, i as f64 * f64::from(n) + ranks_sum, "element {i}");
    }
    // Many at once, completed in any order.
    request::multiple_scope(64, |_, coll| {
        for _ in 0..64 {
            coll.add(world.immediate_barrier());
        }
        let mut done = Vec::new();
        coll.wait_all(&mut done);
        assert_eq!(done.len(), 64);
    });
    // Prefix reductions, a rooted one and a scatter, nonblocking.
    let (mut inclusive, mut exclusive) = (0i32, -1i32);
    let root = world.process_at_rank(n - 1);
    let (one_more, mine) = (me + 1, i64::from(me));
    let mut at_root = 0i64;
    let mut part = 0u16;
    let parts: Vec<u16> = (0..n as u16).map(|r| r * 10).collect();
    let sum = SystemOperation::sum();
    request::scope(|scope| {
        let a = world.immediate_scan_into(scope, &one_more, &mut inclusive, sum);
        let b = world.immediate_exclusive_scan_into(scope, &one_more, &mut exclusive, sum);
        let c = if me == n - 1 {
            root.immediate_reduce_into_root(scope, &mine, &mut at_root, sum)
        } else {
            root.immediate_reduce_into(scope, &mine, sum)
        };
        let d = if me == n - 1 {
            root.immediate_scatter_into_root(scope, &parts[..], &mut part)
        } else {
            root.immediate_scatter_into(scope, &mut part)
        };
        a.wait();
        b.wait();
        c.wait();
        d.wait();
    });
    assert_eq!(inclusive, (me + 1) * (me + 2) / 2);
    if me > 0 {
        assert_eq!(exclusive, me * (me + 1) / 2);
    } else {
        assert_eq!(exclusive, -1, "rank 0's exclusive scan leaves its buffer");
    }
    if me == n - 1 {
        assert_eq!(at_root, i64::from(n * (n - 1) / 2));
    }
    assert_eq!(part, me as u16 * 10);
}

#[test]
fn immediate_collectives_overlap_with_computation_and_point_to_point() {
    for n in [2, 3] {
        ranks(
            "immediate_collectives_overlap_with_computation_and_point_to_point",
            n,
            &[],
            overlap,
        );
    }
}

/// The sender dies while a scatter-gather rendezvous is in flight: the receive ends with an
/// error naming the dead peer, not a hang, and no gap of its buffer was written.
fn sender_dies_mid_scatter_gather(u: &pagewire::Universe) {
    let world = u.world();
    let peer = world.process_at_rank(1 - world.rank());
    // 64 runs of 128 KiB (8 MiB), 4,000 bytes apart.
    let (run, hole, blocks) = (32 * RUN, HOLE, 64);
    let t = UserDatatype::vector(
        blocks as Count,
        run as Count,
        (run + hole) as Count,
        &i32::equivalent_datatype(),
    );
    let len = blocks * (run + hole) - hole;
    if world.rank() == 1 {
        let send = vec![1i32; len];
        let sv = unsafe { View::with_count_and_datatype(&send[..], 1, &t) };
        request::scope(|scope| {
            let _req = peer.immediate_send(scope, &sv);
            // Die with the rendezvous started and nothing finished.
            std::process::exit(0);
        })
    } else {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut recv = vec![GAP; len];
        let r = {
            let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &t) };
            peer.try_receive_into_with_tag(&mut rv, None)
        };
        assert!(
            matches!(r, Err(pagewire::Error::Communication { peer: 1, .. })),
            "{r:?}"
        );
        for (i, &x) in recv.iter().enumerate() {
            if i % (run + hole) >= run {
                assert_eq!(x, GAP, "gap element {i} written");
            }
        }
        std::process::exit(0); // no collective finalise with a dead peer
    }
}

#[test]
fn a_sender_dying_mid_scatter_gather_is_an_error_and_leaves_the_gaps() {
    for (mode, rndv) in [("pindown", "get"), ("odp", "put")] {
        let env = [
            ("PAGEWIRE_MODE", mode),
            ("PAGEWIRE_RNDV", rndv),
            ("PAGEWIRE_SG_MIN_RUN", "0"),
            ("PAGEWIRE_SG_MIN_BYTES", "0"),
            ("PAGEWIRE_MEMLOCK_LIMIT", "unlimited"),
        ];
        ranks(
            "a_sender_dying_mid_scatter_gather_is_an_error_and_leaves_the_gaps",
            2,
            &env,
            sender_dies_mid_scatter_gather,
        );
    }
}
