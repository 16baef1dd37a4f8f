//! The put and get pipeline alone, against the fake of [`RmaIo`](super::RmaIo): chunks up to
//! the mode's depth, staging on the right side of the RDMA, completions reaped in order, no
//! lease now, a failed post, a chunk that completes in error, and the blocking pass.

use super::RmaPipeline;
use crate::buffer_mode::Direction;
use crate::error::Error;
use crate::msg::rndv_io::fake::{plan, FakeIo, LEASE_BASE};
use crate::nic::{Opcode, WcStatus};
use crate::sys::Error as SystemError;

const REMOTE: u64 = 0x7000_0000;
const RKEY: u32 = 9;

fn pipeline(len: usize, chunk: usize, depth: usize, dir: Direction) -> RmaPipeline {
    RmaPipeline::new(1, REMOTE, RKEY, plan(chunk, depth), len, dir)
}

/// The remote address and length of each post, and whether it WRITEs.
fn posts(io: &FakeIo) -> Vec<(u64, u32, bool)> {
    io.rma_posts
        .iter()
        .map(|(op, sge)| match *op {
            Opcode::RdmaWrite { remote_addr, rkey } => {
                assert_eq!(rkey, RKEY);
                (remote_addr, sge.len, true)
            }
            Opcode::RdmaRead { remote_addr, rkey } => {
                assert_eq!(rkey, RKEY);
                (remote_addr, sge.len, false)
            }
            other => panic!("a put or get posts WRITEs or READs, not {other:?}"),
        })
        .collect()
}

#[test]
fn a_put_writes_chunks_up_to_the_depth_staging_each_before_its_post() {
    let mut io = FakeIo::default();
    let mut p = pipeline(10_000, 4096, 2, Direction::Source);
    assert_eq!(p.step(false, &mut io), 2);
    assert_eq!(
        posts(&io),
        [(REMOTE, 4096, true), (REMOTE + 4096, 4096, true)]
    );
    assert_eq!(
        io.staged,
        [(LEASE_BASE, 0, 4096), (LEASE_BASE + 4096, 4096, 4096)]
    );
    assert_eq!(
        io.rma_posts[1].1.addr,
        LEASE_BASE + 4096,
        "each chunk on its lease"
    );
    assert_eq!(
        p.step(false, &mut io),
        0,
        "the depth is full and nothing completed"
    );

    io.rma_done.push((0, WcStatus::Success));
    assert_eq!(p.step(false, &mut io), 1, "the oldest is reaped");
    assert_eq!(io.out.len(), 1, "its lease went back");
    assert_eq!(p.step(false, &mut io), 1, "the last chunk is posted");
    assert_eq!(posts(&io)[2], (REMOTE + 8192, 10_000 - 8192, true));
    io.rma_done
        .extend([(2, WcStatus::Success), (1, WcStatus::Success)]);
    assert_eq!(p.step(false, &mut io), 2);
    assert!(p.finished() && io.out.is_empty());
    let (_, outcome) = p.end();
    outcome.unwrap();
}

#[test]
fn a_get_reads_and_stages_each_chunk_out_once_it_and_those_before_it_completed() {
    let mut io = FakeIo::default();
    let mut p = pipeline(8192, 4096, 4, Direction::Sink);
    assert_eq!(p.step(false, &mut io), 2);
    assert_eq!(
        posts(&io),
        [(REMOTE, 4096, false), (REMOTE + 4096, 4096, false)]
    );
    assert!(
        io.staged.is_empty(),
        "nothing is staged before the READ lands"
    );
    io.rma_done.push((1, WcStatus::Success));
    assert_eq!(p.step(false, &mut io), 0, "completions are reaped in order");
    io.rma_done.push((0, WcStatus::Success));
    assert_eq!(p.step(false, &mut io), 2);
    assert_eq!(
        io.staged,
        [(LEASE_BASE, 0, 4096), (LEASE_BASE + 4096, 4096, 4096)]
    );
    assert!(p.finished());
}

#[test]
fn with_no_lease_now_nothing_is_posted_and_a_later_pass_goes_on() {
    let mut io = FakeIo {
        leases_left: Some(0),
        ..FakeIo::default()
    };
    let mut p = pipeline(4096, 4096, 2, Direction::Source);
    assert_eq!(p.step(false, &mut io), 0);
    assert!(!p.finished() && io.rma_posts.is_empty());
    io.leases_left = Some(1);
    assert_eq!(p.step(false, &mut io), 1);
    assert_eq!(posts(&io), [(REMOTE, 4096, true)]);
}

#[test]
fn a_failed_post_gives_its_lease_back_and_stops_the_pipeline() {
    let mut io = FakeIo {
        peer_gone: true,
        ..FakeIo::default()
    };
    let mut p = pipeline(3 * 4096, 4096, 3, Direction::Source);
    p.step(false, &mut io);
    assert!(io.rma_posts.is_empty() && io.out.is_empty());
    assert!(
        p.finished(),
        "nothing is in flight and nothing more is posted"
    );
    match p.end().1 {
        Err(Error::Communication {
            status: WcStatus::RetryExceeded,
            ..
        }) => {}
        other => panic!("expected the post's error, got {other:?}"),
    }
}

#[test]
fn a_chunk_completing_in_error_fails_the_operation_once_the_rest_has_drained() {
    let mut io = FakeIo::default();
    let mut p = pipeline(4 * 4096, 4096, 2, Direction::Sink);
    assert_eq!(p.step(false, &mut io), 2);
    io.rma_done.push((0, WcStatus::RemoteAccessError));
    p.step(false, &mut io);
    assert_eq!(
        io.rma_posts.len(),
        2,
        "nothing more is posted after the error"
    );
    assert!(io.staged.is_empty(), "a failed READ's bytes are not staged");
    assert!(!p.finished(), "a chunk is still in flight");
    io.rma_done.push((1, WcStatus::Success));
    p.step(false, &mut io);
    assert!(p.finished() && io.out.is_empty(), "every lease went back");
    match p.end().1 {
        Err(Error::Communication {
            peer: 1,
            status: WcStatus::RemoteAccessError,
            ..
        }) => {}
        other => panic!("expected the chunk's error, got {other:?}"),
    }
}

#[test]
fn a_blocking_pass_waits_for_the_oldest_chunk_only() {
    let mut io = FakeIo::default();
    let mut p = pipeline(3 * 4096, 4096, 2, Direction::Source);
    io.rma_done.push((0, WcStatus::Success));
    assert_eq!(
        p.step(true, &mut io),
        3,
        "two posted, the oldest waited for"
    );
    assert_eq!(
        io.rma_posts.len(),
        2,
        "the next post waits for the next pass"
    );
    io.rma_done
        .extend([(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(
        p.step(true, &mut io),
        2,
        "the third posted, the second waited for"
    );
    assert_eq!(p.step(true, &mut io), 1);
    assert!(p.finished());
}

#[test]
fn an_error_from_elsewhere_stops_posting() {
    let mut io = FakeIo::default();
    let mut p = pipeline(2 * 4096, 4096, 1, Direction::Source);
    p.step(false, &mut io);
    p.fail(SystemError::Internal("a test's failure".into()).into());
    io.rma_done.push((0, WcStatus::Success));
    p.step(false, &mut io);
    assert_eq!(io.rma_posts.len(), 1);
    assert!(p.finished());
    assert!(matches!(
        p.end().1,
        Err(Error::System(SystemError::Internal(_)))
    ));
}
