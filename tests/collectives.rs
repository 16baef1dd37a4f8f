//! Multi-process tests of the collectives through the rsmpi-shaped facade: every collective
//! against a sequential reference computed locally from deterministic inputs, on 1 to 8
//! ranks, at sizes on both sides of every algorithm switch point (with the default
//! thresholds, lowered thresholds and forced algorithms), every operation on every
//! primitive type, user operations (commutative and not), the copy, odp and pindown buffer
//! modes, and arguments that do not match across ranks.
//!
//! The jobs of this file run one at a time (8 busy-polling ranks on a small machine are
//! slow enough). Sizes reach several MiB at 2 to 4 ranks in release builds; debug builds
//! and larger rank counts use smaller ones.

use std::ops::Range;
use std::time::Instant;

use pagewire::collective::{Count, Element, Operation};
use pagewire::datatype::{Partition, PartitionMut};
use pagewire::traits::*;
use pagewire::{Error, ErrorClass, SimpleCommunicator, SystemOperation, UserOperation};
use pagewire_collectives::Op;
use pagewire_test_support::facade::{jobs, launch};
use pagewire_test_support::ROLE;

/// Which sizes a job runs (`COLLTEST_SIZES`): `full` reaches several MiB, `small` stays in
/// the tens of KiB (for lowered thresholds and forced algorithms).
const SIZES_VAR: &str = "COLLTEST_SIZES";

// ---------------------------------------------------------------------------------------
// Deterministic inputs and sequential references.

/// The primitive types under test.
trait Num: Element + pagewire::Equivalence + PartialEq + std::fmt::Debug {
    fn from_i64(v: i64) -> Self;
}

macro_rules! num {
    ($($t:ty),*) => {$( impl Num for $t { fn from_i64(v: i64) -> Self { v as $t } } )*};
}
num!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64);

/// Displacements of blocks of `counts` packed in rank order.
fn displs(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of rank `rank`'s input for `op`. Floats get small integers (products of at
/// most 8 values from {±1, ±2, 3}), so every order of reduction gives the same exact result.
fn value<T: Num>(op: Op, seed: u64, rank: usize, i: usize) -> T {
    let h = mix(seed ^ ((rank as u64) << 40) ^ i as u64);
    let v = match op {
        Op::Product => [1, 2, -1, 1, 3, 1, -2, 1][(h % 8) as usize],
        Op::LogicalAnd | Op::LogicalOr | Op::LogicalXor => (h % 3) as i64,
        Op::BitAnd | Op::BitOr | Op::BitXor => (h % 256) as i64 - 64,
        _ => (h % 201) as i64 - 100,
    };
    T::from_i64(v)
}

fn input<T: Num>(op: Op, seed: u64, rank: usize, n: usize) -> Vec<T> {
    (0..n).map(|i| value(op, seed, rank, i)).collect()
}

/// `x_first ∘ … ∘ x_last` over `ranks`, in rank order.
fn reference<T: Num>(op: Op, seed: u64, ranks: Range<usize>, n: usize) -> Vec<T> {
    let mut acc: Vec<T> = input(op, seed, ranks.start, n);
    for r in ranks.start + 1..ranks.end {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = op.combine(*a, value(op, seed, r, i));
        }
    }
    acc
}

/// Bytes identifying (rank, element): for the data-movement collectives.
fn tagged(seed: u64, rank: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| (mix(seed ^ ((rank as u64) << 40) ^ i as u64) as u32) | 1)
        .collect()
}

fn system_op(op: Op) -> SystemOperation {
    match op {
        Op::Sum => SystemOperation::sum(),
        Op::Product => SystemOperation::product(),
        Op::Min => SystemOperation::min(),
        Op::Max => SystemOperation::max(),
        Op::LogicalAnd => SystemOperation::logical_and(),
        Op::LogicalOr => SystemOperation::logical_or(),
        Op::LogicalXor => SystemOperation::logical_xor(),
        _ => unreachable!("bitwise operations have their own type"),
    }
}

fn bitwise_op(op: Op) -> SystemOperation {
    match op {
        Op::BitAnd => SystemOperation::bitwise_and(),
        Op::BitOr => SystemOperation::bitwise_or(),
        Op::BitXor => SystemOperation::bitwise_xor(),
        _ => unreachable!(),
    }
}

/// Sizes to run: `small` always; `big` too in full jobs in release builds, all of them at
/// up to 4 ranks, those of at most [`MEDIUM`] elements on more.
struct Plan {
    p: usize,
    me: usize,
    full: bool,
}

/// The largest `big` size (elements) run on more than 4 ranks.
const MEDIUM: usize = 200_000;

impl Plan {
    fn of(world: &SimpleCommunicator) -> Plan {
        let p = world.size() as usize;
        let full = std::env::var(SIZES_VAR).as_deref() == Ok("full") && !cfg!(debug_assertions);
        Plan {
            p,
            me: world.rank() as usize,
            full,
        }
    }

    fn sizes(&self, small: &[usize], big: &[usize]) -> Vec<usize> {
        self.sizes_up_to(small, big, MEDIUM)
    }

    /// [`Plan::sizes`] with another limit on more than 4 ranks.
    fn sizes_up_to(&self, small: &[usize], big: &[usize], medium: usize) -> Vec<usize> {
        let mut v = small.to_vec();
        if self.full {
            v.extend(big.iter().filter(|&&n| self.p <= 4 || n <= medium));
        }
        v
    }
}

// ---------------------------------------------------------------------------------------
// The checks, one per collective.

/// Nanoseconds on the host's clock (the same for every rank: they share the host).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}

/// No rank leaves a barrier of `comm` before the last has entered it: the ranks enter
/// 0 to 3 ms apart, in an order that changes each round.
fn barrier_holds(comm: &SimpleCommunicator, round: usize) {
    let (me, p) = (comm.rank() as usize, comm.size() as usize);
    std::thread::sleep(std::time::Duration::from_micros(
        ((me + round) % p) as u64 * 1000,
    ));
    let entered = now_ns();
    comm.barrier();
    let left = now_ns();
    let mut all = vec![0u64; 2 * p];
    comm.all_gather_into(&[entered, left][..], &mut all[..]);
    let last_in = all.iter().step_by(2).max().expect("ranks");
    let first_out = all.iter().skip(1).step_by(2).min().expect("ranks");
    assert!(
        first_out >= last_in,
        "round {round}: a rank left the barrier {} ns before the last entered",
        last_in - first_out
    );
}

/// Barriers on the world and, interleaved, on the communicators of even and odd ranks.
fn check_barrier(world: &SimpleCommunicator) {
    let half = world
        .split_by_color(pagewire::topology::Color::with_value(world.rank() % 2))
        .expect("every rank has a colour");
    for round in 0..3 {
        barrier_holds(world, round);
        barrier_holds(&half, round);
    }
    world.barrier();
}

fn check_bcast(world: &SimpleCommunicator, plan: &Plan) {
    // Bytes; the default switch to scatter+allgather is at 4 MiB (from 5 ranks).
    let sizes = plan.sizes_up_to(
        &[0, 1, 3, 100, 2047, 2048, 2049, 16385, 70_001],
        &[524_288, (4 << 20) - 1, 4 << 20, (5 << 20) + 5],
        5 << 20,
    );
    for (k, &n) in sizes.iter().enumerate() {
        let root = [0, plan.p - 1, plan.p / 2][k % 3];
        let want: Vec<u8> = tagged(n as u64, root, n).iter().map(|&x| x as u8).collect();
        let mut buf = if plan.me == root {
            want.clone()
        } else {
            vec![0u8; n]
        };
        world
            .process_at_rank(root as i32)
            .broadcast_into(&mut buf[..]);
        assert!(buf == want, "bcast of {n} bytes from {root}");
    }
    // Other types too.
    let want = tagged(7, 1 % plan.p, 1000);
    let mut buf = if plan.me == 1 % plan.p {
        want.clone()
    } else {
        vec![0u32; 1000]
    };
    world
        .process_at_rank((1 % plan.p) as i32)
        .broadcast_into(&mut buf[..]);
    assert_eq!(buf, want);
}

fn check_allreduce<T: Num, O: Operation + Copy>(
    world: &SimpleCommunicator,
    plan: &Plan,
    op: Op,
    call_op: O,
    sizes: &[usize],
) {
    for &n in sizes {
        let seed = n as u64 * 31 + 1;
        let send: Vec<T> = input(op, seed, plan.me, n);
        let mut recv = vec![T::from_i64(0); n];
        world.all_reduce_into(&send[..], &mut recv[..], call_op);
        let want = reference::<T>(op, seed, 0..plan.p, n);
        assert!(
            recv == want,
            "allreduce {op:?} of {n} {} on {} ranks",
            T::RUST_NAME,
            plan.p
        );
    }
}

fn check_reduce<T: Num, O: Operation + Copy>(
    world: &SimpleCommunicator,
    plan: &Plan,
    op: Op,
    call_op: O,
    sizes: &[usize],
) {
    for (k, &n) in sizes.iter().enumerate() {
        let root = [plan.p - 1, 0, plan.p / 2][k % 3];
        let seed = n as u64 * 17 + 3;
        let send: Vec<T> = input(op, seed, plan.me, n);
        let process = world.process_at_rank(root as i32);
        if plan.me == root {
            let mut recv = vec![T::from_i64(0); n];
            process.reduce_into_root(&send[..], &mut recv[..], call_op);
            assert!(
                recv == reference::<T>(op, seed, 0..plan.p, n),
                "reduce {op:?} of {n} {} to {root}",
                T::RUST_NAME
            );
        } else {
            process.reduce_into(&send[..], call_op);
        }
    }
}

fn check_scan<T: Num, O: Operation + Copy>(
    world: &SimpleCommunicator,
    plan: &Plan,
    op: Op,
    call_op: O,
    sizes: &[usize],
) {
    for &n in sizes {
        let seed = n as u64 * 13 + 5;
        let send: Vec<T> = input(op, seed, plan.me, n);
        let mut recv = vec![T::from_i64(0); n];
        world.scan_into(&send[..], &mut recv[..], call_op);
        assert!(
            recv == reference::<T>(op, seed, 0..plan.me + 1, n),
            "scan {op:?} of {n} {}",
            T::RUST_NAME
        );
    }
}

fn check_reduce_scatter<T: Num, O: Operation + Copy>(
    world: &SimpleCommunicator,
    plan: &Plan,
    op: Op,
    call_op: O,
    blocks: &[usize],
) {
    let p = plan.p;
    for &m in blocks {
        // Equal blocks.
        let seed = m as u64 * 7 + 11;
        let send: Vec<T> = input(op, seed, plan.me, m * p);
        let mut recv = vec![T::from_i64(0); m];
        world.reduce_scatter_block_into(&send[..], &mut recv[..], call_op);
        let all = reference::<T>(op, seed, 0..p, m * p);
        assert!(
            recv[..] == all[plan.me * m..(plan.me + 1) * m],
            "reduce_scatter_block {op:?} of {m} {} per rank",
            T::RUST_NAME
        );
        // Uneven blocks, some empty.
        let counts: Vec<usize> = (0..p).map(|j| (m * (j % 3)) / 2 + j % 2).collect();
        let total: usize = counts.iter().sum();
        let send: Vec<T> = input(op, seed + 1, plan.me, total);
        let mut recv = vec![T::from_i64(0); counts[plan.me]];
        let k: Vec<Count> = counts.iter().map(|&c| c as Count).collect();
        world.reduce_scatter_varcount_into(&send[..], &mut recv[..], &k, call_op);
        let all = reference::<T>(op, seed + 1, 0..p, total);
        let at: usize = counts[..plan.me].iter().sum();
        assert!(
            recv[..] == all[at..at + counts[plan.me]],
            "reduce_scatter {op:?} with counts {counts:?}"
        );
    }
}

fn check_allgather(world: &SimpleCommunicator, plan: &Plan) {
    let p = plan.p;
    // Per-rank u32 counts; the default switch to the ring is at 1 MiB gathered: 32 768
    // per rank on 8 ranks, 52 428.8 on 5, 65 536 on 4, 131 072 on 2.
    let sizes = plan.sizes(
        &[0, 1, 7, 100, 255, 256, 257, 1000, 4095, 4096, 4097, 9000],
        &[
            32_767, 32_768, 52_428, 52_429, 65_535, 65_536, 131_071, 131_072, 300_001,
        ],
    );
    for &m in &sizes {
        let send = tagged(m as u64, plan.me, m);
        let mut recv = vec![0u32; m * p];
        world.all_gather_into(&send[..], &mut recv[..]);
        for j in 0..p {
            assert!(
                recv[j * m..(j + 1) * m] == tagged(m as u64, j, m)[..],
                "allgather of {m} from {j}"
            );
        }
        // Varcount: rank j contributes a different count (some none).
        let counts: Vec<usize> = (0..p).map(|j| (m * (j + 1)) / (p + 1) + j % 2).collect();
        let total: usize = counts.iter().sum();
        let send = tagged(m as u64 + 1, plan.me, counts[plan.me]);
        let mut recv = vec![0u32; total];
        let k: Vec<Count> = counts.iter().map(|&c| c as Count).collect();
        let mut recv_blocks = PartitionMut::new(&mut recv[..], &k[..], displs(&k));
        world.all_gather_varcount_into(&send[..], &mut recv_blocks);
        let mut at = 0;
        for (j, &c) in counts.iter().enumerate() {
            assert!(
                recv[at..at + c] == tagged(m as u64 + 1, j, c)[..],
                "allgatherv block {j} of {counts:?}"
            );
            at += c;
        }
    }
}

fn check_alltoall(world: &SimpleCommunicator, plan: &Plan) {
    let p = plan.p;
    let sizes = plan.sizes(&[0, 1, 5, 1000, 5000], &[70_000, 300_000]);
    for &m in &sizes {
        // Block j of rank i: tagged(seed, i * p + j).
        let send: Vec<u32> = (0..p)
            .flat_map(|j| tagged(m as u64, plan.me * p + j, m))
            .collect();
        let mut recv = vec![0u32; m * p];
        world.all_to_all_into(&send[..], &mut recv[..]);
        for i in 0..p {
            assert!(
                recv[i * m..(i + 1) * m] == tagged(m as u64, i * p + plan.me, m)[..],
                "alltoall block from {i}, {m} each"
            );
        }
        // Varcount: i sends (i + 2j) % 5 * m / 4 + j % 2 elements to j.
        let count = |i: usize, j: usize| ((i + 2 * j) % 5) * m / 4 + j % 2;
        let sc: Vec<usize> = (0..p).map(|j| count(plan.me, j)).collect();
        let rc: Vec<usize> = (0..p).map(|i| count(i, plan.me)).collect();
        let send: Vec<u32> = (0..p)
            .flat_map(|j| tagged(m as u64 + 9, plan.me * p + j, count(plan.me, j)))
            .collect();
        let mut recv = vec![0u32; rc.iter().sum()];
        let k = |v: &[usize]| v.iter().map(|&c| c as Count).collect::<Vec<_>>();
        let send = Partition::new(&send[..], k(&sc), displs(&k(&sc)));
        let mut recv_blocks = PartitionMut::new(&mut recv[..], k(&rc), displs(&k(&rc)));
        world.all_to_all_varcount_into(&send, &mut recv_blocks);
        let mut at = 0;
        for (i, &c) in rc.iter().enumerate() {
            assert!(
                recv[at..at + c] == tagged(m as u64 + 9, i * p + plan.me, c)[..],
                "alltoallv block from {i}"
            );
            at += c;
        }
    }
}

fn check_gather_scatter(world: &SimpleCommunicator, plan: &Plan) {
    let p = plan.p;
    let sizes = plan.sizes(&[0, 1, 3, 1000, 9000], &[100_000, 400_000]);
    for (k, &m) in sizes.iter().enumerate() {
        let root = [plan.p / 2, 0, plan.p - 1][k % 3];
        let process = world.process_at_rank(root as i32);
        // Gather.
        let send = tagged(m as u64, plan.me, m);
        if plan.me == root {
            let mut recv = vec![0u32; m * p];
            process.gather_into_root(&send[..], &mut recv[..]);
            for j in 0..p {
                assert!(
                    recv[j * m..(j + 1) * m] == tagged(m as u64, j, m)[..],
                    "gather of {m} from {j} to {root}"
                );
            }
        } else {
            process.gather_into(&send[..]);
        }
        // Scatter.
        let mut recv = vec![0u32; m];
        if plan.me == root {
            let all: Vec<u32> = (0..p).flat_map(|j| tagged(m as u64 + 1, j, m)).collect();
            process.scatter_into_root(&all[..], &mut recv[..]);
        } else {
            process.scatter_into(&mut recv[..]);
        }
        assert_eq!(
            recv,
            tagged(m as u64 + 1, plan.me, m),
            "scatter of {m} from {root}"
        );
        // Gatherv and scatterv with uneven counts.
        let counts: Vec<usize> = (0..p).map(|j| (j * m) / p + (j + 1) % 2).collect();
        let k: Vec<Count> = counts.iter().map(|&c| c as Count).collect();
        let send = tagged(m as u64 + 2, plan.me, counts[plan.me]);
        if plan.me == root {
            let mut recv = vec![0u32; counts.iter().sum()];
            let mut blocks = PartitionMut::new(&mut recv[..], &k[..], displs(&k));
            process.gather_varcount_into_root(&send[..], &mut blocks);
            let want: Vec<u32> = (0..p)
                .flat_map(|j| tagged(m as u64 + 2, j, counts[j]))
                .collect();
            assert_eq!(recv, want, "gatherv of {counts:?} to {root}");
        } else {
            process.gather_varcount_into(&send[..]);
        }
        let mut recv = vec![0u32; counts[plan.me]];
        if plan.me == root {
            let all: Vec<u32> = (0..p)
                .flat_map(|j| tagged(m as u64 + 3, j, counts[j]))
                .collect();
            let all = Partition::new(&all[..], &k[..], displs(&k));
            process.scatter_varcount_into_root(&all, &mut recv[..]);
        } else {
            process.scatter_varcount_into(&mut recv[..]);
        }
        assert_eq!(recv, tagged(m as u64 + 3, plan.me, counts[plan.me]));
    }
}

/// The reductions with `f32` and `i64` sums across the switch points (the default
/// switches are at 1 MiB and 2 MiB for allreduce, 2 MiB in total for reduce-scatter;
/// 262 144 and 524 288 `f32`s).
fn check_reductions(world: &SimpleCommunicator, plan: &Plan) {
    let sum = SystemOperation::sum();
    let allreduce = plan.sizes_up_to(
        &[
            0, 1, 2, 3, 5, 63, 64, 65, 255, 256, 257, 1000, 4095, 4096, 4097, 20_000,
        ],
        &[262_143, 262_144, 262_145, 524_287, 524_288, 1_100_001],
        600_000,
    );
    check_allreduce::<f32, _>(world, plan, Op::Sum, sum, &allreduce);
    check_allreduce::<i64, _>(
        world,
        plan,
        Op::Sum,
        sum,
        &allreduce[..allreduce.len().min(19)],
    );
    let reduce = plan.sizes(&[0, 1, 1000, 20_000], &[600_000]);
    check_reduce::<f64, _>(world, plan, Op::Sum, sum, &reduce);
    check_scan::<i32, _>(world, plan, Op::Sum, sum, &reduce);
    // Per-rank blocks: 2 MiB in total is 65 536 per rank on 8 ranks, 262 144 on 2.
    let blocks = plan.sizes(
        &[0, 1, 3, 100, 1000, 5000],
        &[40_000, 65_535, 65_536, 131_072, 300_000],
    );
    check_reduce_scatter::<f32, _>(world, plan, Op::Sum, sum, &blocks);
}

/// Every predefined operation on every primitive type (allreduce, reduce, scan,
/// reduce-scatter), at a size that uses more than one algorithm block.
fn check_operations(world: &SimpleCommunicator, plan: &Plan) {
    fn arith<T: Num>(world: &SimpleCommunicator, plan: &Plan) {
        for op in Op::ALL.into_iter().filter(|o| !o.is_bitwise()) {
            let o = system_op(op);
            check_allreduce::<T, _>(world, plan, op, o, &[37, 3000]);
            check_reduce::<T, _>(world, plan, op, o, &[37]);
            check_scan::<T, _>(world, plan, op, o, &[37]);
            check_reduce_scatter::<T, _>(world, plan, op, o, &[5]);
        }
    }
    fn bitwise<T: Num + pagewire::collective::Integer>(world: &SimpleCommunicator, plan: &Plan) {
        arith::<T>(world, plan);
        for op in [Op::BitAnd, Op::BitOr, Op::BitXor] {
            let o = bitwise_op(op);
            check_allreduce::<T, _>(world, plan, op, o, &[37, 3000]);
            check_reduce::<T, _>(world, plan, op, o, &[37]);
            check_scan::<T, _>(world, plan, op, o, &[37]);
            check_reduce_scatter::<T, _>(world, plan, op, o, &[5]);
        }
    }
    bitwise::<u8>(world, plan);
    bitwise::<i8>(world, plan);
    bitwise::<u16>(world, plan);
    bitwise::<i16>(world, plan);
    bitwise::<u32>(world, plan);
    bitwise::<i32>(world, plan);
    bitwise::<u64>(world, plan);
    bitwise::<i64>(world, plan);
    bitwise::<usize>(world, plan);
    bitwise::<isize>(world, plan);
    arith::<f32>(world, plan);
    arith::<f64>(world, plan);
}

/// An affine map `x -> a·x + b (mod 2^32)` packed as `a << 32 | b`; `compose(f, g)` is "f,
/// then g": associative, not commutative.
fn compose(f: u64, g: u64) -> u64 {
    let (fa, fb) = ((f >> 32) as u32, f as u32);
    let (ga, gb) = ((g >> 32) as u32, g as u32);
    let a = ga.wrapping_mul(fa);
    let b = ga.wrapping_mul(fb).wrapping_add(gb);
    (a as u64) << 32 | b as u64
}

fn affine(seed: u64, rank: usize, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| mix(seed ^ ((rank as u64) << 40) ^ i as u64) | 1 << 32)
        .collect()
}

fn affine_reference(seed: u64, ranks: Range<usize>, n: usize) -> Vec<u64> {
    let mut acc = affine(seed, ranks.start, n);
    for r in ranks.start + 1..ranks.end {
        for (a, x) in acc.iter_mut().zip(affine(seed, r, n)) {
            *a = compose(*a, x);
        }
    }
    acc
}

/// User operations: a commutative one on every algorithm, a non-commutative one (affine
/// maps composed in rank order) on every reduction, which must then keep rank order.
fn check_user_operations(world: &SimpleCommunicator, plan: &Plan) {
    let p = plan.p;
    let add = UserOperation::commutative(|a, b| {
        let a: &[i64] = a.downcast().expect("i64 elements");
        let b: &mut [i64] = b.downcast().expect("i64 elements");
        for (y, x) in b.iter_mut().zip(a) {
            *y = y.wrapping_add(*x);
        }
    });
    let sizes = plan.sizes(&[0, 1, 100, 1000, 3000, 40_000], &[140_000]);
    check_allreduce::<i64, _>(world, plan, Op::Sum, &add, &sizes);
    check_reduce::<i64, _>(world, plan, Op::Sum, &add, &sizes[..4]);
    check_scan::<i64, _>(world, plan, Op::Sum, &add, &sizes[..4]);
    check_reduce_scatter::<i64, _>(world, plan, Op::Sum, &add, &[0, 7, 3000]);

    let then = UserOperation::associative(|a, b| {
        let a: &[u64] = a.downcast().expect("u64 elements");
        let b: &mut [u64] = b.downcast().expect("u64 elements");
        for (y, x) in b.iter_mut().zip(a) {
            *y = compose(*x, *y);
        }
    });
    for (k, &n) in plan
        .sizes(&[1, 2, 100, 5000], &[100_000])
        .iter()
        .enumerate()
    {
        let seed = 1000 + n as u64;
        let send = affine(seed, plan.me, n);
        let mut recv = vec![0u64; n];
        world.all_reduce_into(&send[..], &mut recv[..], &then);
        assert_eq!(
            recv,
            affine_reference(seed, 0..p, n),
            "non-commutative allreduce of {n}"
        );
        world.scan_into(&send[..], &mut recv[..], &then);
        assert_eq!(
            recv,
            affine_reference(seed, 0..plan.me + 1, n),
            "non-commutative scan"
        );
        let root = [p - 1, 0, p / 2][k % 3];
        let process = world.process_at_rank(root as i32);
        if plan.me == root {
            process.reduce_into_root(&send[..], &mut recv[..], &then);
            assert_eq!(
                recv,
                affine_reference(seed, 0..p, n),
                "non-commutative reduce to {root}"
            );
        } else {
            process.reduce_into(&send[..], &then);
        }
        let send = affine(seed, plan.me, n * p);
        let mut block = vec![0u64; n];
        world.reduce_scatter_block_into(&send[..], &mut block[..], &then);
        let all = affine_reference(seed, 0..p, n * p);
        assert!(
            block[..] == all[plan.me * n..(plan.me + 1) * n],
            "non-commutative reduce_scatter_block of {n} per rank"
        );
    }
}

/// Everything, in an order that also checks collectives and point-to-point traffic do not
/// mix: a point-to-point message is left pending across the collectives.
fn battery(u: &pagewire::Universe) {
    let world = u.world();
    let plan = Plan::of(&world);
    let p = plan.p;
    // A message with tag 0 from the left neighbour, received only at the end.
    let pending = [plan.me as u64; 3];
    let left = world.process_at_rank(((plan.me + p - 1) % p) as i32);
    let right = world.process_at_rank(((plan.me + 1) % p) as i32);
    right.send(&pending[..]);
    let t = Instant::now();
    check_barrier(&world);
    check_bcast(&world, &plan);
    check_reductions(&world, &plan);
    check_allgather(&world, &plan);
    check_alltoall(&world, &plan);
    check_gather_scatter(&world, &plan);
    check_user_operations(&world, &plan);
    if std::env::var("COLLTEST_OPERATIONS").as_deref() == Ok("1") {
        check_operations(&world, &plan);
    }
    let mut got = [0u64; 3];
    let s = left.receive_into(&mut got[..]);
    assert_eq!(got, [((plan.me + p - 1) % p) as u64; 3]);
    assert_eq!(s.count_bytes(), 24);
    world.barrier();
    if plan.me == 0 {
        eprintln!(
            "  battery on {p} ranks ({} sizes, mode {}): {:.2} s",
            match (plan.full, p <= 4) {
                (false, _) => "small",
                (true, true) => "full",
                (true, false) => "medium",
            },
            u.mode_name(),
            t.elapsed().as_secs_f64()
        );
    }
}

/// Default thresholds, sizes up to several MiB (at 2 to 4 ranks), every operation and type.
#[test]
fn collectives_match_sequential_references_on_1_to_8_ranks() {
    jobs(
        "collectives_match_sequential_references_on_1_to_8_ranks",
        &[1, 2, 3, 4, 5, 6, 7, 8],
        &[(SIZES_VAR, "full"), ("COLLTEST_OPERATIONS", "1")],
        battery,
    );
}

/// Thresholds lowered so that small sizes cross every switch point at every rank count.
#[test]
fn every_switch_point_with_lowered_thresholds() {
    jobs(
        "every_switch_point_with_lowered_thresholds",
        &[2, 3, 4, 5, 6, 7, 8],
        &[
            (SIZES_VAR, "small"),
            ("PAGEWIRE_ALLREDUCE_SHORT", "256"),
            ("PAGEWIRE_ALLREDUCE_SHORT_LOCAL", "256"),
            ("PAGEWIRE_ALLREDUCE_RING", "4K"),
            ("PAGEWIRE_BCAST_LONG", "2K"),
            ("PAGEWIRE_BCAST_LONG_RANKS", "3"),
            ("PAGEWIRE_ALLGATHER_SHORT", "1K"),
            ("PAGEWIRE_REDUCE_SCATTER_RING", "4K"),
        ],
        battery,
    );
}

/// The algorithms `auto` picks least: the ring allreduce on powers of two, Bruck's
/// allgather on powers of two, scatter+allgather on 2 ranks, the ring reduce-scatter at
/// small sizes.
#[test]
fn forced_ring_bruck_and_scatter_allgather() {
    jobs(
        "forced_ring_bruck_and_scatter_allgather",
        &[2, 3, 4, 5, 8],
        &[
            (SIZES_VAR, "small"),
            ("PAGEWIRE_ALLREDUCE_ALGO", "ring"),
            ("PAGEWIRE_ALLGATHER_ALGO", "bruck"),
            ("PAGEWIRE_BCAST_ALGO", "scatter_allgather"),
            ("PAGEWIRE_REDUCE_SCATTER_ALGO", "ring"),
        ],
        battery,
    );
}

/// Rabenseifner and recursive halving at every size (including vectors shorter than the
/// rank count), the ring allgather and the binomial broadcast at every size.
#[test]
fn forced_rabenseifner_recursive_halving_and_ring_allgather() {
    jobs(
        "forced_rabenseifner_recursive_halving_and_ring_allgather",
        &[2, 3, 4, 6, 7],
        &[
            (SIZES_VAR, "small"),
            ("PAGEWIRE_ALLREDUCE_ALGO", "rabenseifner"),
            ("PAGEWIRE_ALLGATHER_ALGO", "ring"),
            ("PAGEWIRE_BCAST_ALGO", "binomial"),
            ("PAGEWIRE_REDUCE_SCATTER_ALGO", "recursive_halving"),
        ],
        battery,
    );
}

/// The odp buffer mode: full sizes at 2 to 4 ranks, lowered thresholds at 5.
#[test]
fn odp_mode_collectives() {
    jobs(
        "odp_mode_collectives",
        &[2, 3, 4],
        &[(SIZES_VAR, "full"), ("PAGEWIRE_MODE", "odp")],
        battery,
    );
}

/// The pin-down cache mode: full sizes at 2 to 4 ranks.
#[test]
fn pindown_mode_collectives() {
    jobs(
        "pindown_mode_collectives",
        &[2, 3, 4],
        &[(SIZES_VAR, "full"), ("PAGEWIRE_MODE", "pindown")],
        battery,
    );
}

#[test]
fn odp_mode_every_switch_point_on_5_ranks() {
    jobs(
        "odp_mode_every_switch_point_on_5_ranks",
        &[5],
        &[
            (SIZES_VAR, "small"),
            ("PAGEWIRE_MODE", "odp"),
            ("PAGEWIRE_ALLREDUCE_SHORT", "256"),
            ("PAGEWIRE_ALLREDUCE_SHORT_LOCAL", "256"),
            ("PAGEWIRE_ALLREDUCE_RING", "4K"),
            ("PAGEWIRE_BCAST_LONG", "2K"),
            ("PAGEWIRE_BCAST_LONG_RANKS", "3"),
            ("PAGEWIRE_ALLGATHER_SHORT", "1K"),
            ("PAGEWIRE_REDUCE_SCATTER_RING", "4K"),
        ],
        battery,
    );
}

// ---------------------------------------------------------------------------------------
// Arguments that do not match across ranks.

/// After a failed collective, the next ones work (nothing was left in flight).
fn still_works(world: &SimpleCommunicator) {
    let p = world.size() as i64;
    let mut sum = 0i64;
    world.all_reduce_into(&(world.rank() as i64), &mut sum, SystemOperation::sum());
    assert_eq!(sum, p * (p - 1) / 2);
    world.barrier();
}

fn expect_err(r: pagewire::Result<()>, needles: &[&str], what: &str) -> String {
    match r {
        Err(e @ (Error::InvalidArgument(_) | Error::Invalid { .. })) => {
            let m = e.to_string();
            for n in needles {
                assert!(m.contains(n), "{what}: {m:?} does not mention {n:?}");
            }
            m
        }
        other => panic!("{what}: expected a mismatch error, got {other:?}"),
    }
}

/// Either fine, or the error that names the rank that found the mismatch.
fn ok_or_reported(r: pagewire::Result<()>, detector: usize, what: &str) {
    if let Err(e) = r {
        let m = e.to_string();
        assert!(
            m.contains(&format!("rank {detector} found the mismatch")),
            "{what}: {m}"
        );
    }
}

fn mismatches(u: &pagewire::Universe) {
    let world = u.world();
    let (me, p) = (world.rank() as usize, world.size() as usize);
    let odd = 2; // the rank whose arguments are off
    let root = world.process_at_rank(0);

    // gatherv: rank 2 contributes 5 elements where the root's counts say 4.
    let counts: Vec<Count> = vec![4; p];
    let send = vec![me as u32; if me == odd { 5 } else { 4 }];
    if me == 0 {
        let mut recv = vec![0u32; 4 * p];
        let mut blocks = PartitionMut::new(&mut recv[..], &counts[..], displs(&counts));
        let r = root.try_gather_varcount_into_root(&send[..], &mut blocks);
        expect_err(
            r,
            &[
                "gatherv: rank 2 contributes 5 elements",
                "expects 4 elements",
                "counts[2]",
            ],
            "gatherv root",
        );
    } else {
        root.try_gather_varcount_into(&send[..])
            .expect("gatherv non-root");
    }
    still_works(&world);

    // scatterv: the root sends 3 elements to rank 2, which expects 4.
    let counts: Vec<Count> = (0..p).map(|j| if j == odd { 3 } else { 4 }).collect();
    let mut recv = [0u32; 4];
    let r = if me == 0 {
        let all = vec![7u32; 4 * p - 1];
        let all = Partition::new(&all[..], &counts[..], displs(&counts));
        root.try_scatter_varcount_into_root(&all, &mut recv[..])
    } else {
        root.try_scatter_varcount_into(&mut recv[..])
    };
    if me == odd {
        expect_err(
            r,
            &[
                "scatterv: the root (rank 0) sends 3 elements",
                "rank 2, which expects 4",
            ],
            "scatterv",
        );
    } else {
        r.expect("scatterv elsewhere");
    }
    still_works(&world);

    // allgatherv: rank 2 contributes 5 elements where everyone's counts say 4: every rank
    // reports it, before any data moves.
    let counts: Vec<Count> = vec![4; p];
    let send = vec![1u16; if me == odd { 5 } else { 4 }];
    let mut recv = vec![0u16; 4 * p];
    let mut blocks = PartitionMut::new(&mut recv[..], &counts[..], displs(&counts));
    let r = world.try_all_gather_varcount_into(&send[..], &mut blocks);
    expect_err(
        r,
        &[&format!(
            "allgatherv: rank 2 contributes 5 elements but rank {me} expects 4"
        )],
        "allgatherv",
    );
    still_works(&world);

    // allgatherv: rank 1 passes other counts: every rank reports it.
    let counts: Vec<Count> = (0..p)
        .map(|j| if me == 1 && j == 0 { 5 } else { 4 })
        .collect();
    let send = vec![1u16; counts[me] as usize];
    let mut recv = vec![0u16; counts.iter().sum::<Count>() as usize];
    let mut blocks = PartitionMut::new(&mut recv[..], &counts[..], displs(&counts));
    let r = world.try_all_gather_varcount_into(&send[..], &mut blocks);
    expect_err(
        r,
        &["allgatherv: the ranks pass different counts"],
        "allgatherv counts",
    );
    still_works(&world);

    // alltoallv: rank 0 sends 3 elements to rank 1, which expects 2.
    let sc: Vec<Count> = (0..p)
        .map(|j| if me == 0 && j == 1 { 3 } else { 2 })
        .collect();
    let rc: Vec<Count> = vec![2; p];
    let send = vec![9i64; sc.iter().sum::<Count>() as usize];
    let mut recv = vec![0i64; 2 * p];
    let send = Partition::new(&send[..], &sc[..], displs(&sc));
    let mut blocks = PartitionMut::new(&mut recv[..], &rc[..], displs(&rc));
    let r = world.try_all_to_all_varcount_into(&send, &mut blocks);
    if me == 1 {
        expect_err(
            r,
            &["alltoallv: rank 0 sends 3 elements (i64) to rank 1, which expects 2"],
            "alltoallv",
        );
    } else {
        // Rank 1 sends error messages from then on; their receivers say so.
        ok_or_reported(r, 1, "alltoallv elsewhere");
    }
    still_works(&world);

    // gather (binomial): rank 2 contributes 3 where the others contribute 2.
    let send = vec![me as u8; if me == odd { 3 } else { 2 }];
    let r = if me == 0 {
        let mut recv = vec![0u8; 2 * p];
        root.try_gather_into_root(&send[..], &mut recv[..])
    } else {
        root.try_gather_into(&send[..])
    };
    if me == 0 {
        // Where rank 2 has children it sees the mismatch first and the root names it.
        expect_err(r, &["gather:"], "gather root");
    } else if me != odd {
        // Rank 2 sends and is done; an intermediate rank may have seen it first.
        let _ = r;
    }
    still_works(&world);

    // scatter (binomial): rank 2 expects 3 elements per rank where the root sends 2.
    let mut recv = vec![0u8; if me == odd { 3 } else { 2 }];
    let r = if me == 0 {
        let all = vec![5u8; 2 * p];
        root.try_scatter_into_root(&all[..], &mut recv[..])
    } else {
        root.try_scatter_into(&mut recv[..])
    };
    if me == odd {
        expect_err(r, &["scatter:", "rank 2"], "scatter");
    }
    still_works(&world);

    // bcast: rank 2's buffer is longer than the root's; then the root's message is long
    // enough for scatter+allgather while rank 2 would choose the binomial tree.
    for (n_root, n_odd) in [(8usize, 10usize), (1 << 20, 100)] {
        let mut buf = vec![1u8; if me == odd { n_odd } else { n_root }];
        let r = root.try_broadcast_into(&mut buf[..]);
        if me == odd {
            expect_err(r, &["bcast:"], "bcast");
        }
        still_works(&world);
    }

    // reduce: rank 2 contributes 5 elements, the others 4.
    let send = vec![1.0f64; if me == odd { 5 } else { 4 }];
    let r = if me == 0 {
        let mut recv = [0f64; 4];
        root.try_reduce_into_root(&send[..], &mut recv[..], SystemOperation::sum())
    } else {
        root.try_reduce_into(&send[..], SystemOperation::sum())
    };
    if me == 0 {
        expect_err(r, &["reduce:"], "reduce root");
    }
    still_works(&world);

    // allreduce (same algorithm on every rank): every rank's result depends on rank 2's
    // contribution, so every rank reports the mismatch.
    let send = vec![1i32; if me == odd { 5 } else { 4 }];
    let mut recv = vec![0i32; send.len()];
    let r = world.try_all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
    expect_err(r, &["allreduce:"], "allreduce");
    still_works(&world);

    // scan: rank 2's count differs: it and every rank above it report it.
    let send = vec![1i32; if me == odd { 5 } else { 4 }];
    let mut recv = vec![0i32; send.len()];
    let r = world.try_scan_into(&send[..], &mut recv[..], SystemOperation::sum());
    if me >= odd {
        expect_err(r, &["scan:"], "scan");
    }
    still_works(&world);

    // A receive buffer of the wrong length on one rank: that rank reports it, nobody hangs.
    let send = [1u32, 2];
    let mut recv = vec![0u32; 2 * p + usize::from(me == 1)];
    let r = world.try_all_gather_into(&send[..], &mut recv[..]);
    if me == 1 {
        expect_err(r, &["allgather: recv holds"], "allgather buffer");
    }
    still_works(&world);

    // The root and non-root variants mixed up.
    let send = [me as u32];
    if me == 1 {
        let mut recv = vec![0u32; p];
        let r = root.try_gather_into_root(&send[..], &mut recv[..]);
        assert!(
            matches!(&r, Err(e) if e.class() == ErrorClass::Root),
            "{r:?}"
        );
        expect_err(
            r,
            &["rank 1 called gather_into_root but the root is rank 0"],
            "variant",
        );
    } else if me == 0 {
        let r = root.try_gather_into(&send[..]);
        expect_err(r, &["the root (rank 0) passed no recv buffer"], "variant");
    } else {
        root.try_gather_into(&send[..]).expect("gather elsewhere");
    }
    still_works(&world);

    // A root that does not exist.
    let mut buf = [0u8; 4];
    let r = world
        .process_at_rank(p as i32)
        .try_broadcast_into(&mut buf[..]);
    assert!(matches!(r, Err(Error::NoSuchRank { .. })), "{r:?}");
    still_works(&world);
}

#[test]
fn mismatched_arguments_are_errors_not_hangs() {
    jobs(
        "mismatched_arguments_are_errors_not_hangs",
        &[3, 4, 5],
        &[],
        mismatches,
    );
}

// ---------------------------------------------------------------------------------------
// A rank that fails inside a collective.

/// Rank 1 exits with status 3 in the middle of a run of allreduces, while the others are
/// inside one: the launcher reports rank 1's status and ends the job, nobody hangs.
fn dies_inside_allreduce(u: &pagewire::Universe) {
    let world = u.world();
    let big = vec![1.0f32; 1 << 18];
    let mut out = vec![0.0f32; 1 << 18];
    for i in 0..20 {
        if world.rank() == 1 && i == 10 {
            std::process::exit(3);
        }
        world.all_reduce_into(&big[..], &mut out[..], SystemOperation::sum());
    }
    unreachable!("the job should have ended when rank 1 exited");
}

#[test]
fn a_rank_failing_inside_a_collective_takes_the_job_down() {
    let name = "a_rank_failing_inside_a_collective_takes_the_job_down";
    if std::env::var(ROLE).as_deref() == Ok(name) {
        let universe = pagewire::initialize().expect("first initialisation");
        dies_inside_allreduce(&universe);
        return;
    }
    for mode in ["copy", "odp"] {
        let t0 = Instant::now();
        let o = launch(name, 3, &[("PAGEWIRE_MODE", mode)]);
        assert_eq!((o.exit_code, o.failed_rank), (3, Some(1)), "{mode}: {o:?}");
        assert!(
            t0.elapsed().as_secs() < 60,
            "{mode}: took {:?}",
            t0.elapsed()
        );
    }
}

/// The collective suite under a real `mpirun` (feature `mpi`; `.ci/mpi.sh` runs the
/// `under_mpirun::` tests of this binary): the default-threshold job, at full sizes with
/// every operation on every type and user operations, on the mpi transport and on
/// pagewire's transport bootstrapped by MPI in each buffer mode, on the rank counts of
/// `PAGEWIRE_MPI_NP`. mpirun starts this binary filtered to the job's test with
/// `PAGEWIRE_TEST_ROLE` naming it, so the test function plays a rank as under `pwrun`.
/// Without the feature the module's pagewire test is ignored by default; `.ci/mpi.sh` runs
/// it (`--ignored under_mpirun::`) under MPICH's `mpiexec`, also across two namespaced hosts,
/// the ranks bootstrapping through its PMI-1 server.
mod under_mpirun {
    use pagewire_test_support::mpirun;

    /// The suite's job: every collective against sequential references.
    const SUITE: mpirun::SuiteTests = &[(
        "collectives_match_sequential_references_on_1_to_8_ranks",
        None,
    )];
    /// Full sizes, every operation on every type, user operations.
    const FULL: &[(&str, &str)] = &[("COLLTEST_SIZES", "full"), ("COLLTEST_OPERATIONS", "1")];

    #[test]
    #[cfg(feature = "mpi")]
    fn collective_suite_on_the_mpi_transport() {
        mpirun::on_the_mpi_transport(SUITE, FULL);
    }

    #[test]
    #[cfg_attr(
        not(feature = "mpi"),
        ignore = "under mpiexec through PMI-1: .ci/mpi.sh runs it"
    )]
    fn collective_suite_on_pagewire_bootstrapped_by_mpi() {
        mpirun::on_pagewire_bootstrapped_by_mpi(SUITE, FULL);
    }
}
