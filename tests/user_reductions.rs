//! Multi-process tests of user-defined reductions over derived datatypes (MPI 3.1 §5.9.5,
//! rsmpi's `UserOperation` and `UnsafeUserOperation`): the operation is handed buffers of
//! the user's datatype (`is` and `downcast` to the user's type work, `len` counts its
//! elements), algorithms cut buffers only between elements, and the gaps of a receive
//! buffer are never written. Structs of one primitive, of mixed primitives, with padding,
//! with nested arrays, a vector and an indexed datatype; closures and `extern "C"`
//! functions, commutative and not; every reduction collective, blocking and immediate, and
//! `reduce_local_into`; 1 to 4 ranks, the three buffer modes, sizes on both sides of every
//! algorithm switch point (lowered thresholds, forced algorithms, and the default ones at
//! several MiB); each result compared element by element with a sequential fold in rank
//! order.

use std::ffi::{c_int, c_void};
use std::fmt::Debug;
use std::ops::Range;

use pagewire::collective::{reduce_local_into, UnsafeUserOperation};
use pagewire::datatype::{DynBuffer, DynBufferMut, MutView, UserDatatype, View};
use pagewire::ffi::MPI_Datatype;
use pagewire::traits::*;
use pagewire::{request, Count, SimpleCommunicator, SystemOperation, UserOperation};
use pagewire_derive::Equivalence;
use pagewire_test_support::facade::jobs;

// ---------------------------------------------------------------------------------------
// The elements under test.

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash(seed: u64, rank: usize, i: usize) -> u64 {
    mix(seed ^ ((rank as u64) << 40) ^ i as u64)
}

/// An element type under test: a datatype whose elements are `UNITS` values of `Unit`
/// (gaps included), made from (seed, rank, index), and an associative operation on it.
trait Case: 'static {
    /// The Rust type of the buffers' items.
    type Unit: Equivalence + Copy + PartialEq + Debug + 'static;
    /// For messages.
    const NAME: &'static str;
    /// Items per element (more than one where the datatype is a vector or indexed one).
    const UNITS: usize = 1;
    /// Whether `combine` commutes.
    const COMMUTATIVE: bool;
    /// The datatype of one element.
    fn datatype() -> UserDatatype {
        Self::Unit::equivalent_datatype().dup()
    }
    /// Whether the operation can downcast its buffers to `Unit` (the datatype is `Unit`'s).
    const DOWNCASTS: bool = true;
    /// The items of element `i` of rank `rank`'s input, gaps holding [`Case::gap`].
    fn make(seed: u64, rank: usize, i: usize) -> Vec<Self::Unit>;
    /// `right = left ∘ right` on one element's items, `left` from the lower ranks; gaps
    /// untouched.
    fn combine(left: &[Self::Unit], right: &mut [Self::Unit]);
    /// What a gap holds, and the data of a fresh receive buffer (a value of a rank that
    /// does not take part, which no result holds).
    fn gap() -> Self::Unit {
        Self::make(u64::MAX, 999, 0)[0]
    }
    /// Which items of an element are data (the rest are gaps).
    fn is_data(_item: usize) -> bool {
        true
    }
}

/// One primitive, no padding: the element of a published sort's global minimum.
#[derive(Equivalence, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Item {
    key: u64,
    rank: u64,
}

struct MinItem;
impl Case for MinItem {
    type Unit = Item;
    const NAME: &'static str = "Item {u64, u64}, minimum";
    const COMMUTATIVE: bool = true;
    fn make(seed: u64, rank: usize, i: usize) -> Vec<Item> {
        vec![Item {
            key: hash(seed, rank, i) % 50,
            rank: rank as u64,
        }]
    }
    fn combine(left: &[Item], right: &mut [Item]) {
        right[0] = left[0].min(right[0]);
    }
}

/// An affine map `x -> mul·x + add (mod 2^32)`: composing them is associative and not
/// commutative, so a result in the wrong order is caught.
#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
struct Affine {
    mul: u32,
    add: u32,
}

impl Affine {
    fn of(h: u64) -> Affine {
        Affine {
            mul: (h as u32) | 1,
            add: (h >> 32) as u32,
        }
    }
    /// `self` first, then `next`.
    fn then(self, next: Affine) -> Affine {
        Affine {
            mul: next.mul.wrapping_mul(self.mul),
            add: next.mul.wrapping_mul(self.add).wrapping_add(next.add),
        }
    }
    fn packed(self) -> u64 {
        (u64::from(self.mul) << 32) | u64::from(self.add)
    }
    fn unpacked(v: u64) -> Affine {
        Affine {
            mul: (v >> 32) as u32,
            add: v as u32,
        }
    }
}

struct ComposeAffine;
impl Case for ComposeAffine {
    type Unit = Affine;
    const NAME: &'static str = "Affine {u32, u32}, composition";
    const COMMUTATIVE: bool = false;
    fn make(seed: u64, rank: usize, i: usize) -> Vec<Affine> {
        vec![Affine::of(hash(seed, rank, i))]
    }
    fn combine(left: &[Affine], right: &mut [Affine]) {
        right[0] = left[0].then(right[0]);
    }
}

/// Mixed primitives and two bytes of padding at the end (14 of 16 bytes travel).
#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Mixed {
    x: f64,
    n: i32,
    s: u16,
}

struct SumMixed;
impl Case for SumMixed {
    type Unit = Mixed;
    const NAME: &'static str = "Mixed {f64, i32, u16}, sums";
    const COMMUTATIVE: bool = true;
    fn make(seed: u64, rank: usize, i: usize) -> Vec<Mixed> {
        let h = hash(seed, rank, i);
        vec![Mixed {
            // Small integers: every order of summation gives the same exact result.
            x: (h % 1001) as f64 - 500.0,
            n: (h >> 16) as i32,
            s: (h >> 48) as u16,
        }]
    }
    fn combine(l: &[Mixed], r: &mut [Mixed]) {
        r[0] = Mixed {
            x: l[0].x + r[0].x,
            n: l[0].n.wrapping_add(r[0].n),
            s: l[0].s.wrapping_add(r[0].s),
        };
    }
}

/// Seven bytes of padding inside: a byte, then an affine map packed in a `u64`; the byte
/// keeps the lowest rank's (not commutative).
#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Padded {
    first: u8,
    map: u64,
}

struct FirstAndCompose;
impl Case for FirstAndCompose {
    type Unit = Padded;
    const NAME: &'static str = "Padded {u8, u64}, first and composition";
    const COMMUTATIVE: bool = false;
    fn make(seed: u64, rank: usize, i: usize) -> Vec<Padded> {
        let h = hash(seed, rank, i);
        vec![Padded {
            first: rank as u8 + 1,
            map: Affine::of(h).packed(),
        }]
    }
    fn combine(l: &[Padded], r: &mut [Padded]) {
        r[0] = Padded {
            first: l[0].first,
            map: Affine::unpacked(l[0].map)
                .then(Affine::unpacked(r[0].map))
                .packed(),
        };
    }
}

/// Nested arrays of mixed widths (21 of 24 bytes travel); the id keeps the lowest rank's.
#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Nested {
    rows: [[i16; 3]; 2],
    weights: [f32; 2],
    id: u8,
}

struct SumNested;
impl Case for SumNested {
    type Unit = Nested;
    const NAME: &'static str = "Nested {[[i16; 3]; 2], [f32; 2], u8}, sums and first";
    const COMMUTATIVE: bool = false;
    fn make(seed: u64, rank: usize, i: usize) -> Vec<Nested> {
        let h = hash(seed, rank, i);
        let mut rows = [[0i16; 3]; 2];
        for (k, v) in rows.iter_mut().flatten().enumerate() {
            *v = (h >> (k * 8)) as i16;
        }
        vec![Nested {
            rows,
            weights: [(h % 64) as f32, -(((h >> 8) % 64) as f32)],
            id: 10 + rank as u8,
        }]
    }
    fn combine(l: &[Nested], r: &mut [Nested]) {
        let (a, b) = (l[0], &mut r[0]);
        for (x, y) in a.rows.iter().flatten().zip(b.rows.iter_mut().flatten()) {
            *y = x.wrapping_add(*y);
        }
        for (x, y) in a.weights.iter().zip(b.weights.iter_mut()) {
            *y += x;
        }
        b.id = a.id;
    }
}

/// A vector datatype: two runs of two `i64`s, three apart (items 0, 1, 3, 4 of 5), summed.
struct SumVector;
impl Case for SumVector {
    type Unit = i64;
    const NAME: &'static str = "vector(2, 2, 3) of i64, sums";
    const UNITS: usize = 5;
    const COMMUTATIVE: bool = true;
    const DOWNCASTS: bool = false;
    fn datatype() -> UserDatatype {
        UserDatatype::vector(2, 2, 3, &i64::equivalent_datatype())
    }
    fn make(seed: u64, rank: usize, i: usize) -> Vec<i64> {
        (0..5)
            .map(|k| {
                if Self::is_data(k) {
                    hash(seed, rank, i * 5 + k) as i64 >> 8
                } else {
                    -7
                }
            })
            .collect()
    }
    fn combine(l: &[i64], r: &mut [i64]) {
        for k in (0..5).filter(|&k| Self::is_data(k)) {
            r[k] = l[k].wrapping_add(r[k]);
        }
    }
    fn gap() -> i64 {
        -7
    }
    fn is_data(item: usize) -> bool {
        item != 2
    }
}

/// An indexed datatype of affine maps: one at item 3, two at items 0 and 1 (item 2 is a
/// gap), composed.
struct ComposeIndexed;
impl Case for ComposeIndexed {
    type Unit = Affine;
    const NAME: &'static str = "indexed([1, 2], [3, 0]) of Affine, composition";
    const UNITS: usize = 4;
    const COMMUTATIVE: bool = false;
    const DOWNCASTS: bool = false;
    fn datatype() -> UserDatatype {
        UserDatatype::indexed(&[1, 2], &[3, 0], &Affine::equivalent_datatype())
    }
    fn make(seed: u64, rank: usize, i: usize) -> Vec<Affine> {
        (0..4)
            .map(|k| {
                if Self::is_data(k) {
                    Affine::of(hash(seed, rank, i * 4 + k))
                } else {
                    Self::gap()
                }
            })
            .collect()
    }
    fn combine(l: &[Affine], r: &mut [Affine]) {
        for k in (0..4).filter(|&k| Self::is_data(k)) {
            r[k] = l[k].then(r[k]);
        }
    }
    fn gap() -> Affine {
        Affine { mul: 7, add: 7 }
    }
    fn is_data(item: usize) -> bool {
        item != 2
    }
}

// ---------------------------------------------------------------------------------------
// The operations: a closure and a C function per case, both checking what they are handed.

/// The items of a user operation's operands, checked against the case's datatype.
fn operands<'a, C: Case>(
    x: DynBuffer<'a>,
    mut y: DynBufferMut<'a>,
    datatype: &UserDatatype,
) -> (&'a [C::Unit], &'a mut [C::Unit]) {
    assert_eq!(
        x.len(),
        y.len(),
        "{}: operands of different lengths",
        C::NAME
    );
    assert_eq!(
        x.as_datatype().type_map(),
        datatype.type_map(),
        "{}: the operation sees the user's datatype",
        C::NAME
    );
    if C::DOWNCASTS {
        assert!(
            x.is::<C::Unit>() && y.is::<C::Unit>(),
            "{}: is::<T>()",
            C::NAME
        );
        let x = x.downcast::<C::Unit>().expect("downcast of invec");
        let y = y.downcast::<C::Unit>().expect("downcast of inoutvec");
        return (x, y);
    }
    assert!(
        !x.is::<C::Unit>(),
        "{}: a derived datatype is not its parts",
        C::NAME
    );
    let n = x.len() * C::UNITS;
    // SAFETY: the buffers hold `len` elements of the case's datatype, whose extent is
    // `UNITS` items and whose blocks and gaps are initialised items (the operation is
    // handed the user's memory or a copy laid out the same way, gaps zeroed).
    unsafe {
        (
            std::slice::from_raw_parts(x.as_ptr().cast::<C::Unit>(), n),
            std::slice::from_raw_parts_mut(y.as_mut_ptr().cast::<C::Unit>(), n),
        )
    }
}

fn closure<C: Case>() -> UserOperation<'static> {
    let datatype = C::datatype();
    let f = move |x: DynBuffer, y: DynBufferMut| {
        let (x, y) = operands::<C>(x, y, &datatype);
        for (l, r) in x.chunks(C::UNITS).zip(y.chunks_mut(C::UNITS)) {
            C::combine(l, r);
        }
    };
    if C::COMMUTATIVE {
        UserOperation::commutative(f)
    } else {
        UserOperation::associative(f)
    }
}

/// The case's operation as a C function (`MPI_User_function`).
unsafe extern "C" fn c_function<C: Case>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    datatype: *mut MPI_Datatype,
) {
    // SAFETY: called by pagewire with `*len` elements of the reduction's datatype at both
    // vectors (`UNITS` initialised items each) and a datatype handle.
    unsafe {
        assert!(!(*datatype).0.is_null(), "a datatype handle");
        let n = *len as usize * C::UNITS;
        let x = std::slice::from_raw_parts(invec.cast::<C::Unit>(), n);
        let y = std::slice::from_raw_parts_mut(inoutvec.cast::<C::Unit>(), n);
        for (l, r) in x.chunks(C::UNITS).zip(y.chunks_mut(C::UNITS)) {
            C::combine(l, r);
        }
    }
}

fn c_operation<C: Case>() -> UnsafeUserOperation {
    // SAFETY: `c_function::<C>` reads `*len` elements at `invec` and writes them at
    // `inoutvec`, nothing else.
    unsafe {
        if C::COMMUTATIVE {
            UnsafeUserOperation::commutative(c_function::<C>)
        } else {
            UnsafeUserOperation::associative(c_function::<C>)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Inputs, references and checks.

/// Rank `rank`'s input of `n` elements.
fn input<C: Case>(seed: u64, rank: usize, n: usize) -> Vec<C::Unit> {
    (0..n).flat_map(|i| C::make(seed, rank, i)).collect()
}

/// The inputs of `ranks` combined in rank order, element by element.
fn reference<C: Case>(seed: u64, ranks: Range<usize>, n: usize) -> Vec<C::Unit> {
    let mut acc = input::<C>(seed, ranks.start, n);
    for r in ranks.start + 1..ranks.end {
        let mut next = input::<C>(seed, r, n);
        for (l, rt) in acc.chunks(C::UNITS).zip(next.chunks_mut(C::UNITS)) {
            C::combine(l, rt);
        }
        acc = next;
    }
    acc
}

/// A receive buffer of `n` elements, gaps holding the case's gap value, data a value no
/// result has.
fn fresh<C: Case>(n: usize) -> Vec<C::Unit> {
    vec![C::gap(); n * C::UNITS]
}

/// `got` against `want` item by item: data equal, gaps still holding the gap value.
fn expect<C: Case>(got: &[C::Unit], want: &[C::Unit], what: &str) {
    assert_eq!(got.len(), want.len(), "{}: {what}: length", C::NAME);
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let (i, item) = (k / C::UNITS, k % C::UNITS);
        if C::is_data(item) {
            assert_eq!(g, w, "{}: {what}: element {i}, item {item}", C::NAME);
        } else {
            assert_eq!(
                *g,
                C::gap(),
                "{}: {what}: gap of element {i} written",
                C::NAME
            );
        }
    }
}

fn count(n: usize) -> Count {
    Count::try_from(n).expect("a count below 2^31")
}

/// Every reduction of `n` elements with `op` on `world`, checked.
fn check_reductions<C: Case, O: Operation + Copy>(
    world: &SimpleCommunicator,
    op: O,
    n: usize,
    seed: u64,
    label: &str,
) {
    let (me, p) = (world.rank() as usize, world.size() as usize);
    let t = C::datatype();
    let what = |call: &str| format!("{call} of {n} on {p} ranks, {label}");
    let send = input::<C>(seed, me, n);
    // SAFETY: `send` and every receive buffer hold `n` elements of `t` (`UNITS` items each).
    let sv = unsafe { View::with_count_and_datatype(&send[..], count(n), &t) };
    let all = reference::<C>(seed, 0..p, n);

    let mut recv = fresh::<C>(n);
    {
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], count(n), &t) };
        world.all_reduce_into(&sv, &mut rv, op);
    }
    expect::<C>(&recv, &all, &what("all_reduce_into"));

    let root = (n + 1) % p;
    let mut recv = fresh::<C>(n);
    if me == root {
        {
            let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], count(n), &t) };
            let process = world.process_at_rank(root as i32);
            process.reduce_into_root(&sv, &mut rv, op);
        }
        expect::<C>(&recv, &all, &what("reduce_into_root"));
    } else {
        world.process_at_rank(root as i32).reduce_into(&sv, op);
    }

    let mut recv = fresh::<C>(n);
    {
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], count(n), &t) };
        world.scan_into(&sv, &mut rv, op);
    }
    expect::<C>(
        &recv,
        &reference::<C>(seed, 0..me + 1, n),
        &what("scan_into"),
    );

    let mut recv = fresh::<C>(n);
    {
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], count(n), &t) };
        world.exclusive_scan_into(&sv, &mut rv, op);
    }
    if me > 0 {
        let want = reference::<C>(seed, 0..me, n);
        expect::<C>(&recv, &want, &what("exclusive_scan_into"));
    }

    // Reduce-scatter: `n` elements per rank out of `n·p`.
    let wide = input::<C>(seed + 1, me, n * p);
    let wv = unsafe { View::with_count_and_datatype(&wide[..], count(n * p), &t) };
    let whole = reference::<C>(seed + 1, 0..p, n * p);
    let mine = &whole[me * n * C::UNITS..(me + 1) * n * C::UNITS];
    let mut recv = fresh::<C>(n);
    {
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], count(n), &t) };
        world.reduce_scatter_block_into(&wv, &mut rv, op);
    }
    expect::<C>(&recv, mine, &what("reduce_scatter_block_into"));

    // The immediate forms, all started before any is waited for.
    let (mut a, mut r, mut s, mut x, mut b) = (
        fresh::<C>(n),
        fresh::<C>(n),
        fresh::<C>(n),
        fresh::<C>(n),
        fresh::<C>(n),
    );
    {
        let mut av = unsafe { MutView::with_count_and_datatype(&mut a[..], count(n), &t) };
        let mut rv = unsafe { MutView::with_count_and_datatype(&mut r[..], count(n), &t) };
        let mut scv = unsafe { MutView::with_count_and_datatype(&mut s[..], count(n), &t) };
        let mut xv = unsafe { MutView::with_count_and_datatype(&mut x[..], count(n), &t) };
        let mut bv = unsafe { MutView::with_count_and_datatype(&mut b[..], count(n), &t) };
        request::scope(|scope| {
            let ra = world.immediate_all_reduce_into(scope, &sv, &mut av, op);
            let process = world.process_at_rank(root as i32);
            let rr = if me == root {
                process
                    .immediate_reduce_into_root(scope, &sv, &mut rv, op)
                    .wait()
            } else {
                process.immediate_reduce_into(scope, &sv, op).wait()
            };
            let rs = world.immediate_scan_into(scope, &sv, &mut scv, op);
            let rx = world.immediate_exclusive_scan_into(scope, &sv, &mut xv, op);
            let rb = world.immediate_reduce_scatter_block_into(scope, &wv, &mut bv, op);
            ra.wait();
            let _ = rr;
            rs.wait();
            rx.wait();
            rb.wait();
        });
    }
    expect::<C>(&a, &all, &what("immediate_all_reduce_into"));
    if me == root {
        expect::<C>(&r, &all, &what("immediate_reduce_into_root"));
    }
    let want = reference::<C>(seed, 0..me + 1, n);
    expect::<C>(&s, &want, &what("immediate_scan_into"));
    if me > 0 {
        let want = reference::<C>(seed, 0..me, n);
        expect::<C>(&x, &want, &what("immediate_exclusive_scan_into"));
    }
    expect::<C>(&b, mine, &what("immediate_reduce_scatter_block_into"));

    // Locally: this rank's input into the next rank's.
    let mut inout = input::<C>(seed, me + 1, n);
    let mut want = inout.clone();
    for (l, r) in send.chunks(C::UNITS).zip(want.chunks_mut(C::UNITS)) {
        C::combine(l, r);
    }
    {
        let mut iv = unsafe { MutView::with_count_and_datatype(&mut inout[..], count(n), &t) };
        reduce_local_into(&sv, &mut iv, op);
    }
    expect::<C>(&inout, &want, &what("reduce_local_into"));
}

/// Which sizes a job runs (`UREDTEST_SIZES`): `small` crosses the lowered thresholds of
/// [`LOWERED`]; `big` adds one of several MiB for the default thresholds' ring.
const SIZES_VAR: &str = "UREDTEST_SIZES";

/// Element counts: 1 and 3 (recursive doubling), 37 and 301 (Rabenseifner or the ring with
/// the lowered thresholds), 613 (the ring); none a multiple of 2, 3 or 4, so blocks end
/// inside what a cut between primitives would split.
const SIZES: [usize; 5] = [1, 3, 37, 301, 613];

fn case<C: Case>(world: &SimpleCommunicator, big: bool) {
    let closure = closure::<C>();
    let c = c_operation::<C>();
    for (k, &n) in SIZES.iter().enumerate() {
        check_reductions::<C, _>(world, &closure, n, 100 + k as u64, "closure");
        check_reductions::<C, _>(world, &c, n, 200 + k as u64, "C function");
    }
    if big {
        // Over 2 MiB packed at 16 bytes per element: the default thresholds' ring.
        let n = 140_001;
        let seed = 300;
        let (me, p) = (world.rank() as usize, world.size() as usize);
        let t = C::datatype();
        let send = input::<C>(seed, me, n);
        let mut recv = fresh::<C>(n);
        let sv = unsafe { View::with_count_and_datatype(&send[..], count(n), &t) };
        {
            let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], count(n), &t) };
            world.all_reduce_into(&sv, &mut rv, &closure);
        }
        let what = format!("all_reduce_into of {n} on {p} ranks");
        expect::<C>(&recv, &reference::<C>(seed, 0..p, n), &what);
    }
}

fn battery(u: &pagewire::Universe) {
    let world = u.world();
    let big = std::env::var(SIZES_VAR).as_deref() == Ok("big") && !cfg!(debug_assertions);
    case::<MinItem>(&world, big);
    case::<ComposeAffine>(&world, false);
    case::<SumMixed>(&world, big);
    case::<FirstAndCompose>(&world, false);
    case::<SumNested>(&world, false);
    case::<SumVector>(&world, false);
    case::<ComposeIndexed>(&world, false);
    world.barrier();
}

/// Thresholds low enough that [`SIZES`] take every algorithm the tuning picks.
const LOWERED: [(&str, &str); 4] = [
    ("PAGEWIRE_ALLREDUCE_SHORT", "256"),
    ("PAGEWIRE_ALLREDUCE_SHORT_LOCAL", "256"),
    ("PAGEWIRE_ALLREDUCE_RING", "4K"),
    ("PAGEWIRE_REDUCE_SCATTER_RING", "4K"),
];

/// 1 to 4 ranks in buffer mode `mode`, lowered thresholds.
fn every_algorithm(name: &str, mode: &str) {
    let mut env = LOWERED.to_vec();
    env.push(("PAGEWIRE_MODE", mode));
    env.push((SIZES_VAR, "small"));
    jobs(name, &[1, 2, 3, 4], &env, battery);
}

#[test]
fn every_algorithm_in_copy_mode() {
    every_algorithm("every_algorithm_in_copy_mode", "copy");
}

#[test]
fn every_algorithm_in_pindown_mode() {
    every_algorithm("every_algorithm_in_pindown_mode", "pindown");
}

#[test]
fn every_algorithm_in_odp_mode() {
    every_algorithm("every_algorithm_in_odp_mode", "odp");
}

/// The default thresholds, with a vector of several MiB (the ring).
#[test]
fn default_thresholds_up_to_the_ring() {
    jobs(
        "default_thresholds_up_to_the_ring",
        &[2, 3],
        &[(SIZES_VAR, "big")],
        battery,
    );
}

/// Forced algorithms at every size (vectors shorter than the rank count included).
fn forced(name: &str, allreduce: &str, reduce_scatter: &str) {
    jobs(
        name,
        &[2, 3, 4],
        &[
            ("PAGEWIRE_ALLREDUCE_ALGO", allreduce),
            ("PAGEWIRE_REDUCE_SCATTER_ALGO", reduce_scatter),
            (SIZES_VAR, "small"),
        ],
        battery,
    );
}

#[test]
fn forced_rabenseifner_and_recursive_halving() {
    forced(
        "forced_rabenseifner_and_recursive_halving",
        "rabenseifner",
        "recursive_halving",
    );
}

#[test]
fn forced_ring() {
    forced("forced_ring", "ring", "ring");
}

/// The published code's minimal case, as rsmpi's documentation writes it: one `Item` per
/// rank, a commutative closure that downcasts; and the error of a predefined operation on a
/// struct it does not apply to.
fn minimum_of_one_item_per_rank(u: &pagewire::Universe) {
    let world = u.world();
    let (me, p) = (world.rank() as u64, world.size() as u64);
    let mine = Item {
        key: 100 - me,
        rank: me,
    };
    let mut out = Item { key: 0, rank: 0 };
    world.all_reduce_into(
        &mine,
        &mut out,
        &UserOperation::commutative(|x, y| {
            assert_eq!((x.len(), y.len()), (1, 1));
            assert!(x.is::<Item>());
            let x: &[Item] = x.downcast().unwrap();
            let y: &mut [Item] = y.downcast().unwrap();
            for (a, b) in x.iter().zip(y) {
                *b = (*a).min(*b);
            }
        }),
    );
    assert_eq!(
        out,
        Item {
            key: 100 - (p - 1),
            rank: p - 1
        }
    );
    // A predefined operation on a struct of mixed primitives: an error on every rank, before
    // any message, that says what to do.
    let mixed = Mixed { x: 1.0, n: 2, s: 3 };
    let mut sum = mixed;
    let e = world
        .try_all_reduce_into(&mixed, &mut sum, SystemOperation::sum())
        .expect_err("MPI_SUM of a struct of mixed primitives");
    let message = e.to_string();
    assert!(
        message.contains("MPI_SUM needs a datatype made of one primitive type")
            && message.contains("a user operation can combine it"),
        "{message}"
    );
    assert_eq!(sum, mixed, "nothing written");
    world.barrier();
}

#[test]
fn a_closure_downcasts_to_the_users_struct() {
    jobs(
        "a_closure_downcasts_to_the_users_struct",
        &[2, 4],
        &[],
        minimum_of_one_item_per_rank,
    );
}

/// The battery under a real `mpirun` (feature `mpi`; `.ci/mpi.sh` runs the `under_mpirun::`
/// tests of this binary): on the mpi transport, where the host MPI library moves the
/// contributions and pagewire combines them, and on pagewire's transport bootstrapped by
/// MPI in each buffer mode.
mod under_mpirun {
    use pagewire_test_support::mpirun;

    const SUITE: mpirun::SuiteTests = &[
        // The job's mode is mpirun's: each of the three, or the host MPI library's.
        ("every_algorithm_in_copy_mode", None),
        ("a_closure_downcasts_to_the_users_struct", None),
    ];
    const ENV: &[(&str, &str)] = &[
        ("PAGEWIRE_ALLREDUCE_SHORT", "256"),
        ("PAGEWIRE_ALLREDUCE_SHORT_LOCAL", "256"),
        ("PAGEWIRE_ALLREDUCE_RING", "4K"),
        ("PAGEWIRE_REDUCE_SCATTER_RING", "4K"),
        ("UREDTEST_SIZES", "small"),
    ];

    #[test]
    #[cfg(feature = "mpi")]
    fn user_reductions_on_the_mpi_transport() {
        mpirun::on_the_mpi_transport(SUITE, ENV);
    }

    #[test]
    #[cfg_attr(
        not(feature = "mpi"),
        ignore = "under mpiexec through PMI-1: .ci/mpi.sh runs it"
    )]
    fn user_reductions_on_pagewire_bootstrapped_by_mpi() {
        mpirun::on_pagewire_bootstrapped_by_mpi(SUITE, ENV);
    }
}
