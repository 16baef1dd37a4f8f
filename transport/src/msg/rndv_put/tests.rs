//! The RPUT machines alone, against a fake of [`RendezvousIo`](super::super::rndv_io):
//! every transition of each side, a short receive buffer, the mode or the send queue out of
//! room, a CTS outside the message and a peer that is gone.

use std::sync::Arc;

use super::super::rndv_io::fake::{buffer, receiver, sender, FakeIo, LEASE_BASE, RECEIVER, SENDER};
use super::super::wire::{self, Header, MsgKind};
use super::CtsTaken;
use crate::buffer_mode::{Layout, UserMemory};
use crate::error::Error;

/// The CTS the receiver sends for region `k`: `len` bytes at message offset `offset`,
/// writable at `0xc000_0000 + offset` under rkey 5.
fn cts(k: u32, offset: u64, len: u64, last: bool) -> Header {
    let mut h = Header::new(MsgKind::Cts);
    h.chunk = k;
    h.size = offset;
    h.len = len;
    h.addr = 0xc000_0000u64.wrapping_add(offset);
    h.rkey = 5;
    h.sreq = SENDER.0;
    h.rreq = RECEIVER.0;
    if last {
        h.flags = wire::ALL_DONE;
    }
    h
}

// ---- the receiver ----------------------------------------------------------------------

#[test]
fn the_receiver_asks_for_chunks_while_it_has_leases() {
    let mut rv = receiver(false, 16_384, 16_384, 4096, 2, &[]);
    let mut io = FakeIo::default();
    assert_eq!(
        rv.advance_put(RECEIVER, &buffer(16_384), &mut io).unwrap(),
        2
    );
    let asked: Vec<_> = io
        .sent
        .iter()
        .map(|h| (h.kind(), h.chunk, h.size, h.len, h.addr, h.sreq, h.flags))
        .collect();
    assert_eq!(
        asked,
        [
            (Some(MsgKind::Cts), 0, 0, 4096, LEASE_BASE, SENDER.0, 0),
            (
                Some(MsgKind::Cts),
                1,
                4096,
                4096,
                LEASE_BASE + 4096,
                SENDER.0,
                0
            ),
        ]
    );
    // Both leases are out: nothing more until a region is written.
    assert_eq!(
        rv.advance_put(RECEIVER, &buffer(16_384), &mut io).unwrap(),
        0
    );
}

#[test]
fn a_fin_stages_its_region_in_and_the_last_ends_the_receive() {
    let mut rv = receiver(false, 16_384, 16_384, 4096, 2, &[]);
    let mut io = FakeIo::default();
    let buf = buffer(16_384);
    rv.advance_put(RECEIVER, &buf, &mut io).unwrap();
    assert_eq!(rv.on_fin(0, &buf, &mut io), Some(false));
    assert_eq!(io.staged, [(LEASE_BASE, 0, 4096)]);
    assert_eq!(io.out.len(), 1, "region 0's lease went back");
    // Its lease free, the receiver asks for the next region.
    assert_eq!(rv.advance_put(RECEIVER, &buf, &mut io).unwrap(), 1);
    assert_eq!(io.sent.last().map(|h| h.chunk), Some(2));
    assert_eq!(rv.on_fin(1, &buf, &mut io), Some(false));
    rv.advance_put(RECEIVER, &buf, &mut io).unwrap();
    // The CTS for the last region says the receiver takes nothing more after it.
    let last = io.sent.last().unwrap();
    assert_eq!((last.chunk, last.flags), (3, wire::ALL_DONE));
    assert_eq!(rv.on_fin(2, &buf, &mut io), Some(false));
    assert_eq!(rv.on_fin(3, &buf, &mut io), Some(true));
    assert_eq!(rv.landed, 16_384);
    assert!(io.out.is_empty() && rv.leases.is_empty());
}

#[test]
fn a_short_buffer_asks_only_for_what_it_takes() {
    // 10,000 bytes into 5,000: two regions, the second cut at the buffer's end and the last.
    let mut rv = receiver(false, 10_000, 5_000, 4096, 8, &[]);
    let mut io = FakeIo::default();
    let buf = buffer(5_000);
    assert_eq!(rv.advance_put(RECEIVER, &buf, &mut io).unwrap(), 2);
    let asked: Vec<_> = io.sent.iter().map(|h| (h.size, h.len, h.flags)).collect();
    assert_eq!(asked, [(0, 4096, 0), (4096, 904, wire::ALL_DONE)]);
    assert_eq!(rv.on_fin(0, &buf, &mut io), Some(false));
    assert_eq!(rv.on_fin(1, &buf, &mut io), Some(true));
    assert_eq!((rv.landed, rv.size), (5_000, 10_000));
}

#[test]
fn without_a_lease_the_receiver_waits_and_a_stray_fin_changes_nothing() {
    let mut rv = receiver(false, 8192, 8192, 4096, 2, &[]);
    let mut io = FakeIo {
        leases_left: Some(0),
        ..FakeIo::default()
    };
    let buf = buffer(8192);
    assert_eq!(rv.advance_put(RECEIVER, &buf, &mut io).unwrap(), 0);
    assert_eq!(rv.next, 0);
    // A FIN for a region never asked for.
    assert_eq!(rv.on_fin(0, &buf, &mut io), None);
    assert_eq!((rv.done, rv.landed), (0, 0));
    assert!(io.staged.is_empty());
}

#[test]
fn a_cts_to_a_gone_sender_fails_the_step() {
    let mut rv = receiver(false, 8192, 8192, 4096, 2, &[]);
    let mut io = FakeIo {
        peer_gone: true,
        ..FakeIo::default()
    };
    let e = rv
        .advance_put(RECEIVER, &buffer(8192), &mut io)
        .unwrap_err();
    assert!(matches!(e, Error::Communication { peer: 1, .. }), "{e}");
    // The lease stays with the request, which gives it back when it fails.
    assert_eq!(rv.leases.len(), 1);
}

// ---- the sender ------------------------------------------------------------------------

#[test]
fn a_cts_outside_the_message_is_refused() {
    let mut io = FakeIo::default();
    let rs = sender(false, 8192, 4096, 2, 0, &mut io);
    assert!(rs.cts_inside_message(&cts(0, 0, 8192, true)));
    assert!(rs.cts_inside_message(&cts(1, 8192, 0, true)));
    assert!(!rs.cts_inside_message(&cts(1, 4096, 4097, false)));
    assert!(!rs.cts_inside_message(&cts(1, u64::MAX, 2, false)));
}

#[test]
fn a_cts_outside_the_message_is_neither_queued_nor_written() {
    let mut io = FakeIo::default();
    let mut rs = sender(false, 8192, 4096, 2, 0, &mut io);
    let buf = buffer(8192);
    for bad in [cts(1, 4096, 4097, false), cts(1, u64::MAX, 2, false)] {
        let taken = rs.take_cts(SENDER, &bad, &buf, &mut io).unwrap();
        assert_eq!(taken, CtsTaken::OutsideMessage);
    }
    assert!(rs.pending_cts.is_empty() && rs.rreq.is_none());
    assert!(io.moving.is_empty() && io.posted.is_empty() && io.sent.is_empty());
}

#[test]
fn the_sender_writes_a_region_in_pieces_and_fins_it_after_the_last() {
    let mut io = FakeIo::default();
    let mut rs = sender(false, 8192, 4096, 4, 0, &mut io);
    let buf = buffer(8192);
    assert_eq!(
        rs.take_cts(SENDER, &cts(0, 0, 8192, true), &buf, &mut io)
            .unwrap(),
        CtsTaken::Queued
    );
    assert_eq!(rs.rreq, Some(RECEIVER.0));
    assert_eq!(
        io.moving,
        [(0, 8192)],
        "the mode hears what is about to move"
    );
    assert_eq!(rs.advance_put(SENDER, &buf, &mut io).unwrap(), 2);
    let writes: Vec<_> = io
        .posted
        .iter()
        .map(|p| (p.write, p.offset, p.len, p.remote_addr, p.rkey))
        .collect();
    assert_eq!(
        writes,
        [
            (true, 0, 4096, 0xc000_0000, 5),
            (true, 4096, 4096, 0xc000_1000, 5)
        ]
    );
    assert_eq!(
        io.staged,
        [(LEASE_BASE, 0, 4096), (LEASE_BASE + 4096, 4096, 4096)]
    );
    // FIN follows the region's last WRITE on the same queue pair.
    assert_eq!(io.sent.len(), 1);
    assert_eq!(
        (io.sent[0].kind(), io.sent[0].chunk, io.sent[0].rreq),
        (Some(MsgKind::Fin), 0, RECEIVER.0)
    );
    // The send ends once the WRITEs have completed, not before.
    assert!(rs.all_done && !rs.is_finished());
    for p in std::mem::take(&mut io.posted) {
        rs.on_write_done(p.key, &mut io);
    }
    assert!(rs.is_finished() && io.out.is_empty());
}

#[test]
fn depth_and_queue_room_bound_the_writes() {
    let mut io = FakeIo::default();
    let mut rs = sender(false, 8192, 4096, 1, 0, &mut io);
    let buf = buffer(8192);
    assert_eq!(
        rs.take_cts(SENDER, &cts(0, 0, 8192, true), &buf, &mut io)
            .unwrap(),
        CtsTaken::Queued
    );
    assert_eq!(rs.advance_put(SENDER, &buf, &mut io).unwrap(), 1);
    assert!(io.sent.is_empty(), "no FIN before the region's last WRITE");
    let first = io.posted.remove(0);
    rs.on_write_done(first.key, &mut io);
    // The send queue is full: the lease goes straight back, nothing is posted.
    io.post_room = Some(0);
    assert_eq!(rs.advance_put(SENDER, &buf, &mut io).unwrap(), 0);
    assert!(io.out.is_empty() && rs.leases.is_empty());
    io.post_room = None;
    assert_eq!(rs.advance_put(SENDER, &buf, &mut io).unwrap(), 1);
    assert_eq!(io.posted[0].offset, 4096);
    assert_eq!(io.sent.len(), 1);
}

#[test]
fn an_empty_region_is_taken_without_a_write() {
    let mut io = FakeIo::default();
    let mut rs = sender(false, 0, 4096, 2, 0, &mut io);
    let buf = buffer(0);
    assert_eq!(
        rs.take_cts(SENDER, &cts(0, 0, 0, true), &buf, &mut io)
            .unwrap(),
        CtsTaken::Queued
    );
    assert_eq!(rs.advance_put(SENDER, &buf, &mut io).unwrap(), 0);
    assert!(io.posted.is_empty() && io.sent.is_empty());
    assert!(rs.is_finished());
}

#[test]
fn a_fin_to_a_gone_receiver_fails_the_step() {
    let mut io = FakeIo::default();
    let mut rs = sender(false, 4096, 4096, 2, 0, &mut io);
    let buf = buffer(4096);
    assert_eq!(
        rs.take_cts(SENDER, &cts(0, 0, 4096, true), &buf, &mut io)
            .unwrap(),
        CtsTaken::Queued
    );
    io.peer_gone = true;
    let e = rs.advance_put(SENDER, &buf, &mut io).unwrap_err();
    assert!(matches!(e, Error::Communication { peer: 1, .. }), "{e}");
    // The WRITE went out: its lease is held until its completion, and the region stays
    // asked for, so the request ends only once nothing is in flight.
    assert_eq!(
        (rs.writes_out, rs.leases.len(), rs.pending_cts.len()),
        (1, 1, 1)
    );
    assert!(!rs.is_finished());
}

#[test]
fn a_gapped_send_buffer_writes_run_by_run() {
    // Two 1,000-byte runs 4,096 bytes apart, twice; the receiver asked for all 4,000 bytes.
    let layout = Arc::new(Layout::new([(0, 1000), (4096, 1000)], 8192, 2));
    let buf = UserMemory::describing(0x5000_0000, 0, Some(layout));
    let mut io = FakeIo::default();
    let mut rs = sender(false, 4000, usize::MAX, 1, 0, &mut io);
    rs.scatter_gather = true;
    assert_eq!(
        rs.take_cts(SENDER, &cts(0, 0, 4000, true), &buf, &mut io)
            .unwrap(),
        CtsTaken::Queued
    );
    assert_eq!(
        io.moving,
        [(0, 12_288 + 1000)],
        "from the first byte to the last"
    );
    assert_eq!(rs.advance_put(SENDER, &buf, &mut io).unwrap(), 4);
    let writes: Vec<_> = io
        .posted
        .iter()
        .map(|p| (p.offset, p.len, p.lease_addr - LEASE_BASE, p.remote_addr))
        .collect();
    assert_eq!(
        writes,
        [
            (0, 1000, 0, 0xc000_0000),
            (1000, 1000, 4096, 0xc000_0000 + 1000),
            (2000, 1000, 8192, 0xc000_0000 + 2000),
            (3000, 1000, 12_288, 0xc000_0000 + 3000),
        ]
    );
    assert_eq!(io.sent.len(), 1, "one FIN for the region");
}
