//! Multi-process tests of persistent requests: point-to-point (`send_init`,
//! `synchronous_send_init`, `receive_init`) and collectives (`barrier_init`,
//! `broadcast_init`, `all_reduce_init`, `all_gather_init`), each started many times with
//! the data changed between starts and every element checked; the buffer prepared once
//! where messages go through the NIC; the errors (a second start, a wait without a start).

use pagewire::request::{scope, start_all, PersistentRequest};
use pagewire::traits::*;
use pagewire::{ErrorClass, SystemOperation};
use pagewire_test_support::facade::jobs;

const ROUNDS: u64 = 30;

/// Element `i` of round `round` from rank `r`.
fn value(r: i32, round: u64, i: usize) -> u64 {
    (r as u64) << 48 | round << 32 | i as u64
}

fn point_to_point(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    // Through the NIC (PAGEWIRE_LOCAL=nic) in a mode that registers or prefetches, a
    // contiguous buffer is prepared once.
    let prepares = std::env::var("PAGEWIRE_LOCAL").as_deref() == Ok("nic")
        && matches!(
            std::env::var("PAGEWIRE_MODE").as_deref(),
            Ok("pindown") | Ok("odp")
        );
    for len in [1usize, 1000, 1 << 17] {
        let mut out = vec![0u64; len];
        let mut back = vec![0u64; len];
        scope(|s| {
            let mut send = world.process_at_rank(next).send_init(s, &mut out[..]);
            let mut recv = world.process_at_rank(prev).receive_init(s, &mut back[..]);
            if prepares {
                assert!(send.is_prepared() && recv.is_prepared());
            }
            for round in 0..ROUNDS {
                for (i, v) in send.buffer_mut().unwrap().iter_mut().enumerate() {
                    *v = value(rank, round, i);
                }
                recv.start();
                send.start();
                assert!(send.buffer().is_none(), "no access while it runs");
                let status = recv.wait();
                send.wait();
                assert_eq!(status.source_rank(), prev);
                let got = recv.buffer().unwrap();
                assert!(
                    got.iter()
                        .enumerate()
                        .all(|(i, &v)| v == value(prev, round, i)),
                    "round {round}, {len} elements"
                );
            }
        });
    }
    // Synchronous sends, started together with start_all.
    let mut a = [0u32; 4];
    let mut b = [0u32; 4];
    scope(|s| {
        let mut sends: Vec<PersistentRequest<'_, [u32], _>> = vec![world
            .process_at_rank(next)
            .synchronous_send_init(s, &mut a[..])];
        let mut recv = world
            .process_at_rank(prev)
            .receive_init_with_tag(s, &mut b[..], 0);
        for round in 0..5u32 {
            sends[0]
                .buffer_mut()
                .unwrap()
                .fill(round * 10 + rank as u32);
            recv.start();
            start_all(&mut sends);
            recv.wait();
            sends[0].wait();
            assert_eq!(recv.buffer().unwrap(), &[round * 10 + prev as u32; 4]);
        }
        // Errors: a second start while active; a wait without a start.
        recv.start();
        assert!(matches!(recv.try_start(), Err(e) if e.class() == ErrorClass::Request));
        sends[0].start();
        sends[0].wait();
        recv.wait();
        assert!(matches!(recv.try_wait(), Err(e) if e.class() == ErrorClass::Request));
        assert_eq!(recv.test(), None, "test without a start");
    });
}

fn collectives(u: &pagewire::Universe) {
    let world = u.world();
    let (rank, size) = (world.rank(), world.size());
    let mut barrier = world.barrier_init();
    let mut data = vec![0u64; 300];
    let mut sum = [0u64; 3];
    let mut all = vec![0u64; size as usize];
    let mine = [rank as u64 + 1, 2, 3];
    let one = [rank as u64];
    scope(|s| {
        let mut bcast = world.process_at_rank(0).broadcast_init(s, &mut data[..]);
        let mut reduce = world.all_reduce_init(s, &mine[..], &mut sum[..], SystemOperation::sum());
        let mut gather = world.all_gather_init(s, &one[..], &mut all[..]);
        for round in 0..ROUNDS {
            if rank == 0 {
                for (i, v) in bcast.buffer_mut().unwrap().iter_mut().enumerate() {
                    *v = value(0, round, i);
                }
            }
            bcast.start();
            reduce.start();
            gather.start();
            barrier.start();
            bcast.wait();
            reduce.wait();
            gather.wait();
            barrier.wait();
            let got = bcast.buffer().unwrap();
            assert!(got
                .iter()
                .enumerate()
                .all(|(i, &v)| v == value(0, round, i)));
            let n = size as u64;
            assert_eq!(reduce.buffer().unwrap(), &[n * (n + 1) / 2, 2 * n, 3 * n]);
            let ranks: Vec<u64> = (0..n).collect();
            assert_eq!(gather.buffer().unwrap(), &ranks[..]);
        }
    });
}

#[test]
fn persistent_sends_and_receives() {
    jobs(
        "persistent_sends_and_receives",
        &[2, 3],
        &[],
        point_to_point,
    );
}

#[test]
fn persistent_sends_and_receives_through_the_nic_in_the_pindown_mode() {
    jobs(
        "persistent_sends_and_receives_through_the_nic_in_the_pindown_mode",
        &[2],
        &[("PAGEWIRE_MODE", "pindown"), ("PAGEWIRE_LOCAL", "nic")],
        point_to_point,
    );
}

#[test]
fn persistent_sends_and_receives_through_the_nic_in_the_odp_mode() {
    jobs(
        "persistent_sends_and_receives_through_the_nic_in_the_odp_mode",
        &[2],
        &[("PAGEWIRE_MODE", "odp"), ("PAGEWIRE_LOCAL", "nic")],
        point_to_point,
    );
}

#[test]
fn persistent_collectives() {
    jobs("persistent_collectives", &[2, 4], &[], collectives);
}
