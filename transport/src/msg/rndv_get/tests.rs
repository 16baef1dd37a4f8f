//! The RGET machines alone, against a fake of [`RendezvousIo`]: every transition of each
//! side, a short receive buffer, the mode or the send queue out of room, a peer that breaks
//! the protocol and one that is gone.

use std::sync::Arc;

use super::super::rndv::{RndvRecv, NO_CHUNK};
use super::super::rndv_io::fake::{
    buffer, chunk, receiver, sender, FakeIo, LEASE_BASE, RECEIVER, SENDER,
};
use super::super::wire::{self, Header, MsgKind};
use super::super::{ChunkDesc, RdmaOp};
use crate::buffer_mode::{Layout, UserMemory};
use crate::error::Error;
use crate::nic::WcStatus;

/// Completes the posted READs in order; returns whether the receive ended.
fn land_all(rv: &mut RndvRecv, io: &mut FakeIo) -> bool {
    let posted = std::mem::take(&mut io.posted);
    let mut finished = false;
    for p in &posted {
        finished = rv.on_read_done(RECEIVER, &p.op(RECEIVER), io).unwrap();
    }
    finished
}

fn chunk_done(k: u32, flags: u8) -> Header {
    let mut h = Header::new(MsgKind::ChunkDone);
    h.chunk = k;
    h.sreq = SENDER.0;
    h.rreq = RECEIVER.0;
    h.flags = flags;
    h
}

// ---- the receiver ----------------------------------------------------------------------

#[test]
fn the_receiver_reads_an_announced_chunk_in_pieces_of_its_own() {
    // One 10,000-byte chunk (a zero-copy sender), read in 4 KiB pieces (a copying receiver).
    let mut rv = receiver(true, 10_000, 10_000, 4096, 4, &[chunk(0, 0, 10_000)]);
    let mut io = FakeIo::default();
    assert_eq!(
        rv.advance_get(RECEIVER, &buffer(10_000), &mut io).unwrap(),
        3
    );
    let pieces: Vec<_> = io
        .posted
        .iter()
        .map(|p| (p.offset, p.len, p.remote_addr, p.rkey))
        .collect();
    assert_eq!(
        pieces,
        [
            (0, 4096, 0xa000_0000, 77),
            (4096, 4096, 0xa000_1000, 77),
            (8192, 1808, 0xa000_2000, 77),
        ]
    );
    assert!(rv.announced.is_empty(), "the chunk is fully posted");
    // Nothing more to read: a second pass posts nothing.
    assert_eq!(
        rv.advance_get(RECEIVER, &buffer(10_000), &mut io).unwrap(),
        0
    );
    // The pieces land in any order; only the last says anything to the sender.
    let mut posted = std::mem::take(&mut io.posted);
    posted.swap(0, 2);
    let ends: Vec<bool> = posted
        .iter()
        .map(|p| rv.on_read_done(RECEIVER, &p.op(RECEIVER), &mut io).unwrap())
        .collect();
    assert_eq!(ends, [false, false, true]);
    assert_eq!(io.sent.len(), 1);
    let done = io.sent[0];
    assert_eq!(done.kind(), Some(MsgKind::ChunkDone));
    assert_eq!(
        (done.chunk, done.sreq, done.rreq),
        (0, SENDER.0, RECEIVER.0)
    );
    assert_ne!(done.flags & wire::ALL_DONE, 0);
    // Every piece was staged in where it belongs, and every lease went back.
    let mut staged = io.staged.clone();
    staged.sort();
    assert_eq!(
        staged,
        [
            (LEASE_BASE, 0, 4096),
            (LEASE_BASE + 4096, 4096, 4096),
            (LEASE_BASE + 8192, 8192, 1808)
        ]
    );
    assert!(io.out.is_empty() && rv.leases.is_empty());
}

#[test]
fn its_depth_bounds_the_reads_in_flight() {
    let chunks: Vec<_> = (0..4).map(|k| chunk(k, k as u64 * 4096, 4096)).collect();
    let mut rv = receiver(true, 16_384, 16_384, 4096, 2, &chunks);
    let mut io = FakeIo::default();
    assert_eq!(
        rv.advance_get(RECEIVER, &buffer(16_384), &mut io).unwrap(),
        2
    );
    assert_eq!(rv.leases.len(), 2);
    // One lands: one more may go.
    let first = io.posted.remove(0);
    assert!(!rv
        .on_read_done(RECEIVER, &first.op(RECEIVER), &mut io)
        .unwrap());
    assert_eq!(
        rv.advance_get(RECEIVER, &buffer(16_384), &mut io).unwrap(),
        1
    );
    assert_eq!(io.posted.last().unwrap().chunk, 2);
    // A chunk read whole is a ChunkDone for it, so the sender can reuse its lease.
    assert_eq!(io.sent.len(), 1);
    assert_eq!((io.sent[0].chunk, io.sent[0].flags), (0, 0));
}

#[test]
fn a_chunk_done_goes_out_per_chunk_and_all_done_with_the_last() {
    let chunks: Vec<_> = (0..3).map(|k| chunk(k, k as u64 * 4096, 4096)).collect();
    let mut rv = receiver(true, 12_288, 12_288, 4096, 8, &chunks);
    let mut io = FakeIo::default();
    assert_eq!(
        rv.advance_get(RECEIVER, &buffer(12_288), &mut io).unwrap(),
        3
    );
    assert!(land_all(&mut rv, &mut io));
    let said: Vec<_> = io
        .sent
        .iter()
        .map(|h| (h.chunk, h.flags & wire::ALL_DONE != 0))
        .collect();
    assert_eq!(said, [(0, false), (1, false), (2, true)]);
    assert_eq!(rv.landed, 12_288);
}

#[test]
fn a_short_buffer_reads_what_it_takes_and_ends_the_send() {
    // 10,000 bytes sent into 5,000: the reads stop at 5,000, and the receive ends with
    // ALL_DONE (the layer reports the truncation: `finish_recv`).
    let chunks = [chunk(0, 0, 8192), chunk(1, 8192, 1808)];
    let mut rv = receiver(true, 10_000, 5_000, 4096, 8, &chunks);
    let mut io = FakeIo::default();
    assert_eq!(
        rv.advance_get(RECEIVER, &buffer(5_000), &mut io).unwrap(),
        2
    );
    let reads: Vec<_> = io.posted.iter().map(|p| (p.offset, p.len)).collect();
    assert_eq!(reads, [(0, 4096), (4096, 904)]);
    assert!(land_all(&mut rv, &mut io));
    let last = io.sent.last().unwrap();
    assert_ne!(last.flags & wire::ALL_DONE, 0);
    assert_eq!((rv.landed, rv.eff, rv.size), (5_000, 5_000, 10_000));
    // The chunk past the buffer is dropped without a read.
    assert_eq!(
        rv.advance_get(RECEIVER, &buffer(5_000), &mut io).unwrap(),
        0
    );
    assert!(rv.announced.is_empty() && io.posted.is_empty());
}

#[test]
fn without_a_lease_or_queue_room_nothing_is_posted_and_nothing_kept() {
    let mut rv = receiver(true, 8192, 8192, 4096, 4, &[chunk(0, 0, 8192)]);
    let mut io = FakeIo {
        leases_left: Some(0),
        ..FakeIo::default()
    };
    assert_eq!(rv.advance_get(RECEIVER, &buffer(8192), &mut io).unwrap(), 0);
    // The send queue is full: the lease goes straight back.
    io.leases_left = None;
    io.post_room = Some(0);
    assert_eq!(rv.advance_get(RECEIVER, &buffer(8192), &mut io).unwrap(), 0);
    assert!(io.out.is_empty() && rv.leases.is_empty());
    assert_eq!((rv.issued, rv.announced.len()), (0, 1));
    // Room again: the reads go as if nothing had happened.
    io.post_room = None;
    assert_eq!(rv.advance_get(RECEIVER, &buffer(8192), &mut io).unwrap(), 2);
    assert!(land_all(&mut rv, &mut io));
}

#[test]
fn announcements_outside_the_message_break_the_protocol_and_are_not_kept() {
    let mut rv = receiver(true, 8192, 8192, 4096, 4, &[chunk(0, 0, 4096)]);
    let mut past_the_end = Header::new(MsgKind::ChunkReady);
    (past_the_end.size, past_the_end.len) = (4096, 4097);
    assert_eq!(
        rv.on_chunk_ready(&past_the_end),
        Err("a chunk outside the message")
    );
    let mut wrapping = Header::new(MsgKind::ChunkReady);
    (wrapping.size, wrapping.len) = (u64::MAX, 2);
    assert_eq!(
        rv.on_chunk_ready(&wrapping),
        Err("a chunk outside the message")
    );
    // Inside the message each, but more than it together.
    let mut again = Header::new(MsgKind::ChunkReady);
    (again.size, again.len) = (0, 8192);
    assert_eq!(
        rv.on_chunk_ready(&again),
        Err("chunks adding up to more than the message")
    );
    assert_eq!((rv.announced.len(), rv.announced_bytes), (1, 4096));
    // The chunk the sender owes is taken.
    let mut rest = Header::new(MsgKind::ChunkReady);
    (rest.chunk, rest.size, rest.len, rest.addr, rest.rkey) = (1, 4096, 4096, 0xb000, 78);
    assert_eq!(rv.on_chunk_ready(&rest), Ok(()));
    let taken = ChunkDesc {
        chunk: 1,
        offset: 4096,
        addr: 0xb000,
        rkey: 78,
        len: 4096,
    };
    assert_eq!(rv.announced.back(), Some(&taken));
    assert_eq!(rv.announced_bytes, 8192);
}

#[test]
fn a_peer_gone_fails_the_step_that_speaks_to_it() {
    let mut rv = receiver(true, 4096, 4096, 4096, 4, &[chunk(0, 0, 4096)]);
    let mut io = FakeIo::default();
    assert_eq!(rv.advance_get(RECEIVER, &buffer(4096), &mut io).unwrap(), 1);
    io.peer_gone = true;
    let read = io.posted.remove(0);
    let e = rv
        .on_read_done(RECEIVER, &read.op(RECEIVER), &mut io)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Communication {
                status: WcStatus::RetryExceeded,
                ..
            }
        ),
        "{e}"
    );
    // The bytes that landed were taken and the lease given back all the same.
    assert_eq!(rv.landed, 4096);
    assert!(io.out.is_empty());
}

#[test]
fn a_read_of_no_lease_changes_nothing() {
    let mut rv = receiver(true, 4096, 4096, 4096, 4, &[chunk(0, 0, 4096)]);
    let mut io = FakeIo::default();
    let stray = RdmaOp {
        req: RECEIVER,
        key: 99,
        chunk: 0,
        offset: 0,
        len: 4096,
    };
    assert!(!rv.on_read_done(RECEIVER, &stray, &mut io).unwrap());
    assert_eq!(rv.landed, 0);
    assert!(io.sent.is_empty() && io.staged.is_empty());
}

#[test]
fn a_scatter_gather_sender_hears_only_the_last_chunk_done() {
    let chunks = [chunk(0, 0, 4096), chunk(1, 4096, 4096)];
    let mut rv = receiver(true, 8192, 8192, 4096, 4, &chunks);
    rv.peer_scatter_gather = true;
    let mut io = FakeIo::default();
    assert_eq!(rv.advance_get(RECEIVER, &buffer(8192), &mut io).unwrap(), 2);
    assert!(land_all(&mut rv, &mut io));
    assert_eq!(io.sent.len(), 1);
    assert_eq!(io.sent[0].chunk, NO_CHUNK);
    assert_ne!(io.sent[0].flags & wire::ALL_DONE, 0);
}

#[test]
fn a_gapped_receive_buffer_reads_run_by_run() {
    // Two 1,000-byte runs 4,096 bytes apart, twice: no READ crosses a gap.
    let layout = Arc::new(Layout::new([(0, 1000), (4096, 1000)], 8192, 2));
    let buf = UserMemory::describing(0x5000_0000, 0, Some(layout));
    assert_eq!(buf.len(), 4000);
    let mut rv = receiver(true, 4000, 4000, usize::MAX, 1, &[chunk(0, 0, 4000)]);
    rv.scatter_gather = true;
    let mut io = FakeIo::default();
    assert_eq!(rv.advance_get(RECEIVER, &buf, &mut io).unwrap(), 4);
    let reads: Vec<_> = io
        .posted
        .iter()
        .map(|p| (p.offset, p.len, p.lease_addr - LEASE_BASE, p.remote_addr))
        .collect();
    assert_eq!(
        reads,
        [
            (0, 1000, 0, 0xa000_0000),
            (1000, 1000, 4096, 0xa000_0000 + 1000),
            (2000, 1000, 8192, 0xa000_0000 + 2000),
            (3000, 1000, 12_288, 0xa000_0000 + 3000),
        ]
    );
    assert!(land_all(&mut rv, &mut io));
}

// ---- the sender ------------------------------------------------------------------------

#[test]
fn the_sender_waits_for_the_receiver_to_introduce_itself() {
    let mut io = FakeIo::default();
    // The RTS went without chunks (no lease was free then).
    let mut rs = sender(true, 16_384, 4096, 2, 0, &mut io);
    assert_eq!(rs.advance_get(SENDER, &buffer(16_384), &mut io).unwrap(), 0);
    assert!(io.sent.is_empty());
    // The receiver's ChunkDone for no chunk names it; the sender announces what it can.
    rs.on_chunk_done(&chunk_done(NO_CHUNK, 0), &mut io);
    assert_eq!(rs.advance_get(SENDER, &buffer(16_384), &mut io).unwrap(), 2);
    let said: Vec<_> = io
        .sent
        .iter()
        .map(|h| (h.kind(), h.chunk, h.size, h.len, h.rreq))
        .collect();
    assert_eq!(
        said,
        [
            (Some(MsgKind::ChunkReady), 0, 0, 4096, RECEIVER.0),
            (Some(MsgKind::ChunkReady), 1, 4096, 4096, RECEIVER.0),
        ]
    );
    // Each chunk was staged into its lease before it was announced.
    assert_eq!(
        io.staged,
        [(LEASE_BASE, 0, 4096), (LEASE_BASE + 4096, 4096, 4096)]
    );
}

#[test]
fn the_sender_reuses_a_lease_once_its_chunk_is_read() {
    let mut io = FakeIo::default();
    let mut rs = sender(true, 16_384, 4096, 2, 2, &mut io);
    rs.on_chunk_done(&chunk_done(NO_CHUNK, 0), &mut io);
    // Both leases are out: nothing more until a chunk is read.
    assert_eq!(rs.advance_get(SENDER, &buffer(16_384), &mut io).unwrap(), 0);
    rs.on_chunk_done(&chunk_done(0, 0), &mut io);
    assert_eq!(io.out.len(), 1, "chunk 0's lease went back");
    assert_eq!(rs.advance_get(SENDER, &buffer(16_384), &mut io).unwrap(), 1);
    let h = io.sent.last().unwrap();
    assert_eq!((h.chunk, h.size, h.len), (2, 8192, 4096));
    // A ChunkDone naming a chunk it does not hold changes nothing.
    rs.on_chunk_done(&chunk_done(9, 0), &mut io);
    assert_eq!(rs.leases.len(), 2);
}

#[test]
fn all_done_gives_every_lease_back_and_stops_the_announcements() {
    let mut io = FakeIo::default();
    let mut rs = sender(true, 16_384, 4096, 4, 2, &mut io);
    // A receiver with a short buffer wants nothing more after the first chunk.
    rs.on_chunk_done(&chunk_done(0, wire::ALL_DONE), &mut io);
    assert!(rs.all_done && rs.leases.is_empty() && io.out.is_empty());
    assert_eq!(rs.advance_get(SENDER, &buffer(16_384), &mut io).unwrap(), 0);
    assert!(io.sent.is_empty());
}

#[test]
fn the_sender_stops_at_the_message_end_and_when_the_mode_has_no_lease() {
    let mut io = FakeIo {
        leases_left: Some(3),
        ..FakeIo::default()
    };
    let mut rs = sender(true, 10_000, 4096, 8, 1, &mut io);
    rs.on_chunk_done(&chunk_done(NO_CHUNK, 0), &mut io);
    // Chunks 1 and 2 remain; the mode has two leases left.
    assert_eq!(rs.advance_get(SENDER, &buffer(10_000), &mut io).unwrap(), 2);
    assert_eq!(io.sent.last().map(|h| (h.size, h.len)), Some((8192, 1808)));
    assert_eq!(rs.next, rs.n);
    assert_eq!(rs.advance_get(SENDER, &buffer(10_000), &mut io).unwrap(), 0);
    // And with no lease left, a longer message waits.
    let mut io = FakeIo {
        leases_left: Some(1),
        ..FakeIo::default()
    };
    let mut rs = sender(true, 16_384, 4096, 8, 1, &mut io);
    rs.on_chunk_done(&chunk_done(NO_CHUNK, 0), &mut io);
    assert_eq!(rs.advance_get(SENDER, &buffer(16_384), &mut io).unwrap(), 0);
    assert_eq!(rs.next, 1);
}

#[test]
fn an_announcement_to_a_gone_peer_fails() {
    let mut io = FakeIo::default();
    let mut rs = sender(true, 8192, 4096, 2, 0, &mut io);
    rs.on_chunk_done(&chunk_done(NO_CHUNK, 0), &mut io);
    io.peer_gone = true;
    let e = rs.advance_get(SENDER, &buffer(8192), &mut io).unwrap_err();
    assert!(matches!(e, Error::Communication { peer: 1, .. }), "{e}");
    // Its lease stays with the request, which gives it back when it fails.
    assert_eq!(rs.leases.len(), 1);
}
