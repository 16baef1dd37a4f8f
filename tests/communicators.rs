//! Multi-process tests of communicators and matched probes through the rsmpi-shaped facade:
//! `duplicate`, `split_by_color(_with_key)`, `Color::undefined`, point-to-point and
//! collectives on the new communicators (checked against sequential references), context
//! isolation between a communicator and its duplicate, `matched_probe`/`Message` with
//! `any_process` on 3 and more ranks, and bad ranks on a sub-communicator. Real ranks under
//! the built-in launcher; the copy mode on 1 to 6 ranks, and the pindown and odp modes.
//!
//! The jobs of this file run one at a time (busy-polling ranks on a small machine).

use std::collections::BTreeSet;

use pagewire::request;
use pagewire::traits::*;
use pagewire::{Color, Error, ErrorClass, Key, SimpleCommunicator, SystemOperation};
use pagewire_test_support::facade::jobs;
use pagewire_test_support::{pattern, ROLE};

// ---------------------------------------------------------------------------------------
// Sequential references.

/// `MPI_Comm_split` computed locally: the world ranks of the communicator that `me` joins
/// (ranks with `me`'s color, ordered by key, then by parent rank) and `me`'s rank in it;
/// `None` for an undefined color.
fn split_reference(
    parent_world: &[usize],
    colors: &[Option<i32>],
    keys: &[Key],
    me: usize,
) -> Option<(usize, Vec<usize>)> {
    let mine = colors[me]?;
    let mut members: Vec<(Key, usize)> = (0..colors.len())
        .filter(|&r| colors[r] == Some(mine))
        .map(|r| (keys[r], r))
        .collect();
    members.sort();
    let rank = members.iter().position(|&(_, r)| r == me).unwrap();
    Some((
        rank,
        members.iter().map(|&(_, r)| parent_world[r]).collect(),
    ))
}

fn color_of(c: Option<i32>) -> Color {
    c.map_or(Color::undefined(), Color::with_value)
}

/// The world ranks of `comm`'s ranks, in order, learnt through its own allgather.
fn world_ranks_of(comm: &SimpleCommunicator, world_rank: usize) -> Vec<usize> {
    let mut all = vec![0u64; comm.size() as usize];
    comm.all_gather_into(&(world_rank as u64), &mut all[..]);
    all.into_iter().map(|w| w as usize).collect()
}

/// Splits `parent` (whose ranks are the world ranks `parent_world`) with every rank's
/// color and key, and checks the result against [`split_reference`].
fn split_checked(
    parent: &SimpleCommunicator,
    parent_world: &[usize],
    colors: &[Option<i32>],
    keys: &[Key],
) -> Option<(SimpleCommunicator, Vec<usize>)> {
    let me = parent.rank() as usize;
    let want = split_reference(parent_world, colors, keys, me);
    let got = parent.split_by_color_with_key(color_of(colors[me]), keys[me]);
    match (got, want) {
        (None, None) => None,
        (Some(sub), Some((rank, members))) => {
            assert_eq!(
                (sub.rank() as usize, sub.size() as usize),
                (rank, members.len()),
                "rank and size of the split of rank {me} (colors {colors:?}, keys {keys:?})"
            );
            assert_eq!(world_ranks_of(&sub, parent_world[me]), members);
            Some((sub, members))
        }
        (got, want) => panic!("rank {me}: split gave {got:?}, expected {want:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// What every new communicator must do: point-to-point with its own ranks, collectives.

/// A ring on `comm` with every rank's world rank in `world`: rank `r` sends to `r + 1` and
/// receives from any process, eager and rendezvous sizes, alternating plain receives and
/// matched probes; statuses name the sender by its rank in `comm`.
fn ring(comm: &SimpleCommunicator, world: &[usize]) {
    let (r, s) = (comm.rank() as usize, comm.size() as usize);
    let (next, prev) = ((r + 1) % s, (r + s - 1) % s);
    for (i, &len) in [0usize, 100, 20_000, 300_000].iter().enumerate() {
        let tag = i as i32;
        let data = pattern((world[r] * 1000 + i) as u64, len);
        let mut got = vec![0u8; len];
        let status = request::scope(|scope| {
            let send =
                comm.process_at_rank(next as i32)
                    .immediate_send_with_tag(scope, &data[..], tag);
            let status = if i % 2 == 0 {
                comm.any_process().receive_into_with_tag(&mut got[..], tag)
            } else {
                let (msg, probed) = comm.any_process().matched_probe_with_tag(tag);
                assert_eq!(
                    (probed.source_rank(), probed.count_bytes()),
                    (prev as i32, len)
                );
                msg.matched_receive_into(&mut got[..])
            };
            send.wait();
            status
        });
        assert_eq!(
            (status.source_rank(), status.tag(), status.count_bytes()),
            (prev as i32, tag, len),
            "status on rank {r} of {s}"
        );
        assert!(
            got == pattern((world[prev] * 1000 + i) as u64, len),
            "{len} bytes from rank {prev}"
        );
    }
    // A named source and a probe on it report ranks of this communicator too.
    if s > 1 {
        let mine = world[r] as u64;
        request::scope(|scope| {
            let send = comm
                .process_at_rank(prev as i32)
                .immediate_send_with_tag(scope, &mine, 77);
            let p = comm.process_at_rank(next as i32).probe_with_tag(77);
            assert_eq!(p.source_rank(), next as i32);
            let (v, st) = comm
                .process_at_rank(next as i32)
                .receive_with_tag::<u64>(77);
            assert_eq!((v as usize, st.source_rank()), (world[next], next as i32));
            send.wait();
        });
    }
}

/// Collectives on `comm` against sequential references: allreduce (several sizes, so
/// several algorithms), bcast from the last rank, gather to rank 0, scan (rank order) and
/// barrier.
fn collectives(comm: &SimpleCommunicator, world: &[usize]) {
    let (r, s) = (comm.rank() as usize, comm.size() as usize);
    let value = |w: usize, j: usize| (w * 7919 + j) as i64 % 1013 - 500;
    for &n in &[1usize, 1000, 40_000] {
        let send: Vec<i64> = (0..n).map(|j| value(world[r], j)).collect();
        let mut sum = vec![0i64; n];
        comm.all_reduce_into(&send[..], &mut sum[..], SystemOperation::sum());
        let want: Vec<i64> = (0..n)
            .map(|j| world.iter().map(|&w| value(w, j)).sum())
            .collect();
        assert!(sum == want, "allreduce of {n} on rank {r} of {s}");
        let mut max = vec![0i64; n];
        comm.all_reduce_into(&send[..], &mut max[..], SystemOperation::max());
        assert!(max
            .iter()
            .enumerate()
            .all(|(j, &m)| m == world.iter().map(|&w| value(w, j)).max().unwrap()));
    }
    let root = s - 1;
    for &len in &[10usize, 300_000] {
        let mut buf = if r == root {
            pattern(world[root] as u64 + 5, len)
        } else {
            vec![0u8; len]
        };
        comm.process_at_rank(root as i32)
            .broadcast_into(&mut buf[..]);
        assert!(
            buf == pattern(world[root] as u64 + 5, len),
            "bcast of {len}"
        );
    }
    for &m in &[3usize, 5000] {
        let mine = pattern(world[r] as u64 + 9, m);
        let root = comm.process_at_rank(0);
        if r == 0 {
            let mut all = vec![0u8; m * s];
            root.gather_into_root(&mine[..], &mut all[..]);
            for (j, block) in all.chunks(m.max(1)).enumerate() {
                assert!(
                    *block == pattern(world[j] as u64 + 9, m)[..],
                    "gather block {j}"
                );
            }
        } else {
            root.gather_into(&mine[..]);
        }
    }
    let mut prefix = 0u64;
    comm.scan_into(&(world[r] as u64), &mut prefix, SystemOperation::sum());
    assert_eq!(
        prefix,
        world[..=r].iter().map(|&w| w as u64).sum::<u64>(),
        "scan in the communicator's rank order"
    );
    comm.barrier();
}

// ---------------------------------------------------------------------------------------
// Splits.

/// Even and odd world ranks in two communicators, each running the ring and the
/// collectives at the same time as the other, with the same context; then a split of a
/// split.
fn split_even_odd(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank() as usize, world.size() as usize);
    let all: Vec<usize> = (0..n).collect();
    let colors: Vec<Option<i32>> = (0..n).map(|r| Some((r % 2) as i32)).collect();
    let (sub, members) = split_checked(&world, &all, &colors, &vec![0; n]).unwrap();
    assert_eq!(sub.rank() as usize, me / 2);
    ring(&sub, &members);
    collectives(&sub, &members);
    // The rsmpi spelling without a key keeps the parent's order.
    let same = world
        .split_by_color(Color::with_value((me % 2) as i32))
        .unwrap();
    assert_eq!(world_ranks_of(&same, me), members);
    // Split the half again: its first rank alone, the others together.
    let sub_colors: Vec<Option<i32>> = (0..members.len()).map(|r| Some(i32::from(r > 0))).collect();
    let keys = vec![0; members.len()];
    let (subsub, subsub_members) = split_checked(&sub, &members, &sub_colors, &keys).unwrap();
    ring(&subsub, &subsub_members);
    collectives(&subsub, &subsub_members);
    // The world still works, and its ranks are world ranks.
    ring(&world, &all);
    world.barrier();
}

#[test]
fn split_even_odd_on_1_to_6_ranks() {
    jobs(
        "split_even_odd_on_1_to_6_ranks",
        &[1, 2, 3, 4, 5, 6],
        &[],
        split_even_odd,
    );
}

#[test]
fn pindown_mode_split_even_odd() {
    jobs(
        "pindown_mode_split_even_odd",
        &[4, 5],
        &[("PAGEWIRE_MODE", "pindown")],
        split_even_odd,
    );
}

#[test]
fn odp_mode_split_even_odd() {
    jobs(
        "odp_mode_split_even_odd",
        &[4, 5],
        &[("PAGEWIRE_MODE", "odp")],
        split_even_odd,
    );
}

/// Keys decide the order: reversed keys reverse the ranks, equal keys keep the parent's
/// order, negative keys sort first; a split of the reversed communicator composes the
/// rank maps.
fn split_by_key(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank() as usize, world.size() as usize);
    let all: Vec<usize> = (0..n).collect();
    let one = vec![Some(0); n];
    // Reversal.
    let reversed_keys: Vec<Key> = (0..n).map(|r| (n - 1 - r) as Key).collect();
    let (rev, rev_members) = split_checked(&world, &all, &one, &reversed_keys).unwrap();
    assert_eq!(rev.rank() as usize, n - 1 - me);
    assert_eq!(rev_members, (0..n).rev().collect::<Vec<_>>());
    ring(&rev, &rev_members);
    collectives(&rev, &rev_members);
    // Ties broken by the parent's rank: odd ranks (key 0) first, then even (key 1).
    let parity_keys: Vec<Key> = (0..n).map(|r| ((r + 1) % 2) as Key).collect();
    let (ties, ties_members) = split_checked(&world, &all, &one, &parity_keys).unwrap();
    collectives(&ties, &ties_members);
    // Pairs with negative keys, reversed within each pair.
    let pair_colors: Vec<Option<i32>> = (0..n).map(|r| Some((r / 2) as i32)).collect();
    let neg_keys: Vec<Key> = (0..n).map(|r| -(r as Key)).collect();
    let (pairs, pair_members) = split_checked(&world, &all, &pair_colors, &neg_keys).unwrap();
    ring(&pairs, &pair_members);
    // A split of the reversed communicator, by parity of its ranks, reversed again.
    let m = rev_members.len();
    let colors: Vec<Option<i32>> = (0..m).map(|r| Some((r % 2) as i32)).collect();
    let keys: Vec<Key> = (0..m).map(|r| (m - r) as Key).collect();
    let (nested, nested_members) = split_checked(&rev, &rev_members, &colors, &keys).unwrap();
    ring(&nested, &nested_members);
    collectives(&nested, &nested_members);
}

#[test]
fn split_by_key_orders_ranks_on_1_to_6_ranks() {
    jobs(
        "split_by_key_orders_ranks_on_1_to_6_ranks",
        &[1, 2, 3, 4, 5, 6],
        &[],
        split_by_key,
    );
}

/// Ranks passing `Color::undefined()` get `None` but take part; the others get a working
/// communicator; one rank alone in its color gets a communicator of one.
fn undefined_color(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank() as usize, world.size() as usize);
    let all: Vec<usize> = (0..n).collect();
    // Every third rank undefined; the last rank (if defined) alone in color 9.
    let colors: Vec<Option<i32>> = (0..n)
        .map(|r| match r {
            r if r % 3 == 0 => None,
            r if r == n - 1 => Some(9),
            _ => Some(1),
        })
        .collect();
    let got = split_checked(&world, &all, &colors, &vec![0; n]);
    assert_eq!(got.is_none(), colors[me].is_none());
    if let Some((sub, members)) = got {
        ring(&sub, &members);
        collectives(&sub, &members);
    }
    // All undefined: nobody gets a communicator, and nothing hangs.
    assert!(world.split_by_color(Color::undefined()).is_none());
    world.barrier();
}

#[test]
fn undefined_color_gives_none_on_1_to_5_ranks() {
    jobs(
        "undefined_color_gives_none_on_1_to_5_ranks",
        &[1, 2, 3, 4, 5],
        &[],
        undefined_color,
    );
}

// ---------------------------------------------------------------------------------------
// Duplicates.

/// A duplicate's messages never match the parent's, whatever the order of sends and
/// receives, and contexts agreed in different orders by different groups never collide.
fn duplicate(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank() as usize, world.size() as usize);
    let all: Vec<usize> = (0..n).collect();
    let dup = world.duplicate();
    assert_eq!((dup.rank(), dup.size()), (world.rank(), world.size()));
    // Rank 0 sends on the world first, then on the duplicate, same tag (nonblocking: the
    // rendezvous sends complete only when received); rank 1 receives from the duplicate
    // first, with wildcards.
    if n >= 2 && me == 0 {
        let bufs = [
            pattern(1, 100),
            pattern(2, 100),
            pattern(3, 50_000),
            pattern(4, 50_000),
        ];
        request::scope(|scope| {
            let to = |c: &SimpleCommunicator, i: usize, tag| {
                c.process_at_rank(1)
                    .immediate_send_with_tag(scope, &bufs[i][..], tag)
            };
            let reqs = vec![
                to(&world, 0, 7),
                to(&dup, 1, 7),
                to(&world, 2, 8),
                to(&dup, 3, 8),
            ];
            request::wait_all(reqs);
        });
    } else if n >= 2 && me == 1 {
        let (v, s) = dup.any_process().receive_vec::<u8>();
        assert_eq!((v, s.source_rank(), s.tag()), (pattern(2, 100), 0, 7));
        // The world's message arrived before the duplicate's: neither a probe nor a matched
        // probe on the duplicate sees it.
        assert!(world.any_process().immediate_probe().is_some());
        let (v, s) = dup
            .any_process()
            .matched_probe()
            .matched_receive_vec::<u8>();
        assert_eq!((v, s.tag()), (pattern(4, 50_000), 8));
        assert!(dup.any_process().immediate_probe().is_none());
        assert!(dup.any_process().immediate_matched_probe().is_none());
        let (v, s) = world.process_at_rank(0).receive_vec_with_tag::<u8>(8);
        assert_eq!((v, s.tag()), (pattern(3, 50_000), 8));
        let (v, _) = world.any_process().receive_vec_with_tag::<u8>(7);
        assert_eq!(v, pattern(1, 100));
    }
    ring(&dup, &all);
    collectives(&dup, &all);
    // Collectives of the two interleave without crossing.
    let mut a = 0u64;
    let mut b = 0u64;
    world.all_reduce_into(&1u64, &mut a, SystemOperation::sum());
    dup.all_reduce_into(&10u64, &mut b, SystemOperation::sum());
    assert_eq!((a, b), (n as u64, 10 * n as u64));

    // Only the even ranks duplicate their half; then everyone duplicates the world. The
    // world's duplicate must not reuse the context the evens just took.
    let colors: Vec<Option<i32>> = (0..n).map(|r| Some((r % 2) as i32)).collect();
    let (half, half_members) = split_checked(&world, &all, &colors, &vec![0; n]).unwrap();
    let half_dup = (me % 2 == 0).then(|| half.duplicate());
    let world_dup = world.duplicate();
    if n >= 3 && (me == 0 || me == 2) {
        let peer = 2 - me; // world rank
        let half_peer = (peer / 2) as i32;
        let half_dup = half_dup.as_ref().unwrap();
        half_dup
            .process_at_rank(half_peer)
            .send_with_tag(&pattern(me as u64 + 40, 64)[..], 3);
        world_dup
            .process_at_rank(peer as i32)
            .send_with_tag(&pattern(me as u64 + 50, 64)[..], 3);
        half.process_at_rank(half_peer)
            .send_with_tag(&pattern(me as u64 + 60, 64)[..], 3);
        // Receive in the opposite order of the sends.
        let (v, _) = half.any_process().receive_vec::<u8>();
        assert_eq!(v, pattern(peer as u64 + 60, 64));
        let (v, _) = world_dup.any_process().receive_vec::<u8>();
        assert_eq!(v, pattern(peer as u64 + 50, 64));
        let (v, _) = half_dup.any_process().receive_vec::<u8>();
        assert_eq!(v, pattern(peer as u64 + 40, 64));
    }
    if let Some(d) = &half_dup {
        collectives(d, &half_members);
    }
    collectives(&world_dup, &all);
    // A duplicate of a sub-communicator keeps its group.
    let d = half.duplicate();
    assert_eq!(world_ranks_of(&d, me), half_members);
    ring(&d, &half_members);
}

#[test]
fn a_duplicate_never_matches_its_parents_messages_on_1_to_5_ranks() {
    jobs(
        "a_duplicate_never_matches_its_parents_messages_on_1_to_5_ranks",
        &[1, 2, 3, 4, 5],
        &[],
        duplicate,
    );
}

#[test]
fn pindown_and_odp_modes_duplicate() {
    let name = "pindown_and_odp_modes_duplicate";
    if std::env::var(ROLE).as_deref() == Ok(name) {
        return jobs(name, &[], &[], duplicate);
    }
    for mode in ["pindown", "odp"] {
        jobs(name, &[3], &[("PAGEWIRE_MODE", mode)], duplicate);
    }
}

// ---------------------------------------------------------------------------------------
// Matched probes.

/// The payload rank `w` sends with tag `t`: eager or rendezvous by tag.
fn matched_payload(w: usize, t: i32) -> Vec<u8> {
    let len = if t % 2 == 0 { 100 + 37 * w } else { 70_000 + w };
    pattern((w * 100) as u64 + t as u64, len)
}

/// Records a message rank 0 received in [`matched_probe`], checking its bytes and that it
/// arrived only once.
fn received_once(
    seen: &mut BTreeSet<(i32, i32)>,
    n: usize,
    data: &[u8],
    source: i32,
    tag: i32,
    how: &str,
) {
    assert!(
        source > 0 && (source as usize) < n,
        "{how}: source {source}"
    );
    assert!(
        data == &matched_payload(source as usize, tag)[..],
        "{how}: bytes of ({source}, {tag})"
    );
    assert!(seen.insert((source, tag)), "{how}: ({source}, {tag}) twice");
}

/// Every other rank sends rank 0 four messages (eager and rendezvous) and a synchronous
/// one; rank 0 takes them with matched probes from any source while ordinary wildcard
/// receives for the same tag run in between, and checks that each message arrives exactly
/// once, to the handle that matched it. The synchronous messages are matched and dropped
/// unreceived, and their senders still complete.
fn matched_probe(u: &pagewire::Universe) {
    let world = u.world();
    let (me, n) = (world.rank() as usize, world.size() as usize);
    let tags = [10, 11, 12, 13];
    if me != 0 {
        let root = world.process_at_rank(0);
        for &t in &tags {
            root.send_with_tag(&matched_payload(me, t)[..], t);
        }
        root.synchronous_send_with_tag(&pattern(me as u64, 20_000)[..], 99);
        world.barrier();
        return;
    }
    let all: BTreeSet<(i32, i32)> = (1..n as i32)
        .flat_map(|s| tags.iter().map(move |&t| (s, t)))
        .collect();
    let mut seen = BTreeSet::new();
    let mut dropped = 0;
    let mut round = 0;
    while seen.len() < all.len() {
        // 1. A matched probe from any source and any tag...
        let Some((msg, probed)) = world.any_process().immediate_matched_probe() else {
            continue;
        };
        if probed.tag() == 99 {
            // Taken out of matching and let go: received and discarded.
            drop(msg);
            dropped += 1;
            continue;
        }
        assert_eq!(msg.status(), probed);
        // 2. ...then, while the handle is held, an ordinary receive from any source for a
        // tag of a message that has already arrived (the held message's own tag when one
        // has), posted before the matched receive: it must get one of those, never the held
        // one. Only arrived messages: a sender sends its next tag only once its previous
        // rendezvous message was taken, so waiting for a later tag could deadlock.
        let held = (probed.source_rank(), probed.tag());
        let arrived = |tag: Option<i32>| {
            let p = world.any_process();
            match tag {
                Some(t) => p.immediate_probe_with_tag(t),
                None => p.immediate_probe(),
            }
            .map(|s| s.tag())
            .filter(|&t| t != 99)
        };
        let other_tag = arrived(Some(held.1)).or_else(|| arrived(None));
        let mut other = vec![0u8; 100_000];
        let (mine, other_status) = request::scope(|scope| {
            let req = other_tag.map(|t| {
                world
                    .any_process()
                    .immediate_receive_into_with_tag(scope, &mut other[..], t)
            });
            // 3. The matched message arrives exactly, in one of four ways.
            let mine = match round % 4 {
                0 => msg.matched_receive_vec::<u8>(),
                1 => (msg, probed).matched_receive_vec::<u8>(),
                2 => {
                    let mut buf = vec![0u8; probed.count_bytes()];
                    let s = msg.matched_receive_into(&mut buf[..]);
                    (buf, s)
                }
                _ => {
                    let mut buf = vec![0u8; probed.count_bytes()];
                    let s = request::scope(|inner| {
                        msg.immediate_matched_receive_into(inner, &mut buf[..])
                            .wait()
                    });
                    (buf, s)
                }
            };
            (mine, req.map(|r| r.wait()))
        });
        let (data, status) = mine;
        assert_eq!(
            (status.source_rank(), status.tag(), status.count_bytes()),
            (probed.source_rank(), probed.tag(), probed.count_bytes())
        );
        received_once(&mut seen, n, &data, held.0, held.1, "matched receive");
        if let Some(s) = other_status {
            let got = &other[..s.count_bytes()];
            received_once(&mut seen, n, got, s.source_rank(), s.tag(), "wildcard");
        }
        round += 1;
    }
    // The synchronous messages not seen yet: matched with their tag, dropped.
    while dropped < n - 1 {
        drop(world.any_process().matched_probe_with_tag(99));
        dropped += 1;
    }
    // Every synchronous sender completed (else the barrier would not); nothing is left.
    world.barrier();
    assert!(world.any_process().immediate_probe().is_none());
    assert!(world
        .any_process()
        .immediate_matched_probe_with_tag(99)
        .is_none());
}

#[test]
fn matched_probe_takes_the_message_out_of_matching_on_3_and_4_ranks() {
    jobs(
        "matched_probe_takes_the_message_out_of_matching_on_3_and_4_ranks",
        &[3, 4],
        &[],
        matched_probe,
    );
}

#[test]
fn pindown_and_odp_modes_matched_probe() {
    let name = "pindown_and_odp_modes_matched_probe";
    if std::env::var(ROLE).as_deref() == Ok(name) {
        return jobs(name, &[], &[], matched_probe);
    }
    for mode in ["pindown", "odp"] {
        jobs(name, &[3], &[("PAGEWIRE_MODE", mode)], matched_probe);
    }
}

/// Truncation through a matched receive: the prefix arrives, the rest of the buffer is
/// untouched, the error names the message.
fn matched_truncation(u: &pagewire::Universe) {
    let world = u.world();
    if world.rank() == 1 {
        for (t, len) in [(1, 1000usize), (2, 200_000)] {
            world
                .process_at_rank(0)
                .send_with_tag(&pattern(t, len)[..], t as i32);
        }
    } else if world.rank() == 0 {
        for (t, len) in [(1, 1000usize), (2, 200_000)] {
            let (msg, s) = world.any_process().matched_probe_with_tag(t as i32);
            assert_eq!(s.count_bytes(), len);
            let mut buf = vec![0xeeu8; len / 2 + 64];
            match msg.try_matched_receive_into(&mut buf[..len / 2]) {
                Err(Error::Truncated {
                    source_rank: 1,
                    tag,
                    message_bytes,
                    buffer_bytes,
                }) => assert_eq!((tag, message_bytes, buffer_bytes), (t as i32, len, len / 2)),
                other => panic!("expected truncation, got {other:?}"),
            }
            assert!(buf[..len / 2] == pattern(t, len)[..len / 2]);
            assert!(buf[len / 2..].iter().all(|&b| b == 0xee));
        }
    }
    world.barrier();
}

#[test]
fn a_matched_receive_into_a_short_buffer_is_truncated_without_overrun() {
    jobs(
        "a_matched_receive_into_a_short_buffer_is_truncated_without_overrun",
        &[2],
        &[],
        matched_truncation,
    );
}

// ---------------------------------------------------------------------------------------
// Bad input.

/// Ranks of the parent that are not ranks of the sub-communicator are errors there, with
/// the sub-communicator's size; nothing is sent.
fn bad_ranks(u: &pagewire::Universe) {
    let world = u.world();
    let me = world.rank() as usize;
    let sub = world
        .split_by_color(Color::with_value((me % 2) as i32))
        .unwrap();
    let size = sub.size() as usize;
    let mut buf = [0u8; 4];
    for bad in [size as i32, world.size(), 1000] {
        let p = sub.process_at_rank(bad);
        let no_such = |e: Error| {
            assert!(
                matches!(e, Error::NoSuchRank { rank, size: s } if rank == bad as usize && s == size),
                "{e}"
            );
            assert!(e.to_string().contains("does not exist"), "{e}");
        };
        no_such(p.try_send_with_tag(&buf[..], 0).unwrap_err());
        no_such(p.try_synchronous_send_with_tag(&buf[..], 0).unwrap_err());
        no_such(p.try_receive_into_with_tag(&mut buf[..], None).unwrap_err());
        no_such(p.try_immediate_probe_with_tag(None).unwrap_err());
        no_such(p.try_immediate_matched_probe_with_tag(None).unwrap_err());
        no_such(p.try_matched_probe_with_tag(Some(1)).unwrap_err());
        no_such(request::scope(|scope| {
            p.try_immediate_send_with_tag(scope, &buf[..], 0)
                .unwrap_err()
        }));
        no_such(p.try_broadcast_into(&mut buf[..]).unwrap_err());
        no_such(p.try_gather_into(&buf[..]).unwrap_err());
    }
    let e = sub
        .process_at_rank(-1)
        .try_send_with_tag(&buf[..], 0)
        .unwrap_err();
    assert!(matches!(e, Error::NoSuchRank { .. }), "{e}");
    let e = sub
        .process_at_rank(0)
        .try_send_with_tag(&buf[..], -3)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidTag { tag: -3, .. }), "{e}");
    // A group with ranks outside the communicator (MPI_ERR_GROUP), found before any message.
    let e = sub.try_split_by_subgroup(&world.group()).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Group, "{e}");
    assert!(e.to_string().contains("is not in the communicator"), "{e}");
    // Both communicators still work.
    collectives(&sub, &world_ranks_of(&sub, me));
    world.barrier();
}

#[test]
fn a_rank_outside_a_sub_communicator_is_an_error_on_3_and_4_ranks() {
    jobs(
        "a_rank_outside_a_sub_communicator_is_an_error_on_3_and_4_ranks",
        &[3, 4],
        &[],
        bad_ranks,
    );
}

#[test]
#[should_panic(expected = "Value of color must be non-negative")]
fn a_negative_color_panics_as_in_rsmpi() {
    let _ = Color::with_value(-2);
}

/// `split_shared`: one communicator per host (the host keys compared here as the reference),
/// ranked by key (reversed here), on which a shared-memory window works; on a world that
/// spans hosts, `allocate_shared` is refused with the error that says so.
fn split_shared_by_host(u: &pagewire::Universe) {
    use pagewire::sys::{HostKey, HOST_KEY_BYTES};
    use pagewire::window::Window;
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let mut mine = Vec::new();
    HostKey::here().encode(&mut mine);
    let mut keys = vec![0u8; HOST_KEY_BYTES * size as usize];
    world.all_gather_into(&mine[..], &mut keys[..]);
    let same: Vec<i32> = (0..size)
        .filter(|&r| {
            keys[r as usize * HOST_KEY_BYTES..(r as usize + 1) * HOST_KEY_BYTES] == mine[..]
        })
        .collect();
    let node = world.split_shared(-rank);
    assert_eq!(node.size() as usize, same.len());
    // Ranked by key (minus the world rank): the highest world rank first.
    let expect = same.iter().rev().position(|&r| r == rank).unwrap();
    assert_eq!(node.rank() as usize, expect);
    collectives(&node, &world_ranks_of(&node, rank as usize));
    let win = Window::<u64>::allocate_shared(2, &node);
    win.with_local_mut(|m| m.fill(rank as u64));
    win.fence();
    for r in 0..node.size() {
        let w = same[same.len() - 1 - r as usize] as u64;
        win.with_shared(r, |m| assert_eq!(m, [w, w]));
    }
    win.fence();
    drop(win);
    if same.len() < size as usize {
        let e = Window::<u64>::try_allocate_shared(1, &world).unwrap_err();
        assert!(e.to_string().contains("on one host"), "{e}");
    }
}

#[test]
fn split_shared_gives_one_communicator_per_host_on_1_to_4_ranks() {
    jobs(
        "split_shared_gives_one_communicator_per_host_on_1_to_4_ranks",
        &[1, 2, 4],
        &[],
        split_shared_by_host,
    );
}

/// `abort` on one rank ends the whole job with its code, while the others wait in a
/// barrier for it (rsmpi's `Communicator::abort`, `MPI_Abort`).
#[test]
fn abort_on_one_rank_ends_the_job_with_its_code() {
    let name = "abort_on_one_rank_ends_the_job_with_its_code";
    if std::env::var(ROLE).as_deref() == Ok(name) {
        let universe = pagewire::initialize().expect("first initialisation");
        let world = universe.world();
        if world.rank() == 1 {
            world.abort(7);
        }
        world.barrier();
        return;
    }
    let t0 = std::time::Instant::now();
    let o = pagewire_test_support::facade::launch(name, 3, &[]);
    assert_eq!((o.exit_code, o.failed_rank), (7, Some(1)), "{o:?}");
    assert!(t0.elapsed().as_secs() < 60, "took {:?}", t0.elapsed());
}

/// Tests of this file under a real `mpirun` (feature `mpi`; `.ci/mpi.sh` runs the
/// `under_mpirun::` tests of this binary), on the rank counts of `PAGEWIRE_MPI_NP`: those
/// whose checks hold on any MPI-like transport on the mpi transport and on pagewire's
/// transport bootstrapped by MPI in each buffer mode; the truncation test (`Error::Truncated`:
/// MPI does not report a truncated message's length) on pagewire's only. mpirun starts this
/// binary filtered to one test with `PAGEWIRE_TEST_ROLE` naming it, so the test function
/// plays a rank as under `pwrun`.
/// Without the feature the module's pagewire test is ignored by default; `.ci/mpi.sh` runs
/// it (`--ignored under_mpirun::`) under MPICH's `mpiexec`, also across two namespaced hosts,
/// the ranks bootstrapping through its PMI-1 server.
mod under_mpirun {
    use pagewire_test_support::mpirun;

    /// Checks that hold on any MPI-like transport: (test, rank counts; `None`: all).
    const NEUTRAL: mpirun::SuiteTests = &[
        ("split_even_odd_on_1_to_6_ranks", None),
        ("split_by_key_orders_ranks_on_1_to_6_ranks", None),
        ("undefined_color_gives_none_on_1_to_5_ranks", None),
        (
            "a_duplicate_never_matches_its_parents_messages_on_1_to_5_ranks",
            None,
        ),
        (
            "matched_probe_takes_the_message_out_of_matching_on_3_and_4_ranks",
            Some(&[3, 4]),
        ),
        (
            "split_shared_gives_one_communicator_per_host_on_1_to_4_ranks",
            None,
        ),
    ];
    /// Checks of pagewire's own behaviour.
    const PAGEWIRE_ONLY: mpirun::SuiteTests = &[(
        "a_matched_receive_into_a_short_buffer_is_truncated_without_overrun",
        Some(&[2, 3]),
    )];

    #[test]
    #[cfg(feature = "mpi")]
    fn communicators_on_the_mpi_transport() {
        mpirun::on_the_mpi_transport(NEUTRAL, &[]);
    }

    #[test]
    #[cfg_attr(
        not(feature = "mpi"),
        ignore = "under mpiexec through PMI-1: .ci/mpi.sh runs it"
    )]
    fn communicators_on_pagewire_bootstrapped_by_mpi() {
        mpirun::on_pagewire_bootstrapped_by_mpi(NEUTRAL, &[]);
        mpirun::on_pagewire_bootstrapped_by_mpi(PAGEWIRE_ONLY, &[]);
    }
}
