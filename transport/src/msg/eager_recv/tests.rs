//! The eager protocol's unexpected messages alone, against a fake of [`EagerIo`]: copied
//! out within the budget, held past it, always copied from a local cell; the later match
//! (from the copy or from the held slot), truncation and the synchronous sender's answer.

use super::{deliver_unexpected, eager_result, EagerArrival, EagerBytes, EagerIo};
use crate::error::{Error, Result};
use crate::msg::credits::Credits;
use crate::msg::matching::Envelope;
use crate::msg::state::{EagerData, Unexpected};
use crate::msg::{RequestId, Status};

const RECEIVE: RequestId = RequestId(3);
const SENDER_REQ: u64 = 41;
const ENV: Envelope = Envelope {
    source: 1,
    tag: 7,
    context: 0,
};

/// What the machine did, in order.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// Bytes written into a receive: how many, and whether from a copy made earlier.
    Wrote {
        n: usize,
        owned: bool,
    },
    Completed,
    PutBack,
    SyncAck(u64),
    Unexpected,
}

/// The layer as the machine sees it: one receive buffer, a payload where the message
/// arrived, and the sender's credits.
struct FakeIo {
    /// The receive's buffer length (`None`: the receive is gone).
    buffer: Option<usize>,
    payload: Vec<u8>,
    /// The arrival is in a NIC slot, whose putting back owes a credit.
    in_slot: bool,
    credits: Credits,
    events: Vec<Event>,
    written: Vec<u8>,
    results: Vec<Result<Status>>,
    unexpected: Vec<(Envelope, Unexpected)>,
}

impl FakeIo {
    fn new(buffer: usize, payload_len: usize) -> FakeIo {
        FakeIo {
            buffer: Some(buffer),
            payload: (0..payload_len).map(|i| i as u8).collect(),
            in_slot: true,
            credits: Credits::new(8),
            events: Vec::new(),
            written: Vec::new(),
            results: Vec::new(),
            unexpected: Vec::new(),
        }
    }
}

impl EagerIo for FakeIo {
    fn write_receive(&mut self, rid: RequestId, size: usize, from: EagerBytes) -> Option<usize> {
        assert_eq!(rid, RECEIVE);
        let buffer = self.buffer?;
        let n = size.min(buffer);
        let (bytes, owned) = match from {
            EagerBytes::Arrived => (&self.payload[..n], false),
            EagerBytes::Owned(b) => (&b[..n], true),
        };
        self.written = bytes.to_vec();
        self.events.push(Event::Wrote { n, owned });
        Some(buffer)
    }

    fn copy_out(&mut self, size: usize) -> Vec<u8> {
        self.payload[..size].to_vec()
    }

    fn complete(&mut self, rid: RequestId, result: Result<Status>) {
        assert_eq!(rid, RECEIVE);
        self.events.push(Event::Completed);
        self.results.push(result);
    }

    fn put_back(&mut self) -> Result<()> {
        if self.in_slot {
            self.credits.slot_reposted();
        }
        self.events.push(Event::PutBack);
        Ok(())
    }

    fn sync_ack(&mut self, sreq: u64) -> Result<()> {
        self.events.push(Event::SyncAck(sreq));
        Ok(())
    }

    fn push_unexpected(&mut self, env: Envelope, message: Unexpected) {
        self.events.push(Event::Unexpected);
        self.unexpected.push((env, message));
    }

    fn credits(&mut self) -> &mut Credits {
        &mut self.credits
    }
}

fn arrival(size: usize, sync: bool, slot: Option<usize>) -> EagerArrival {
    EagerArrival {
        env: ENV,
        size,
        sync,
        sreq: SENDER_REQ,
        slot,
    }
}

const BUDGET: usize = 1 << 20;

#[test]
fn an_unexpected_message_within_the_budget_is_copied_out_and_its_slot_goes_back() {
    let mut io = FakeIo::new(64, 24);
    arrival(24, true, Some(5))
        .queue_unexpected(BUDGET, &mut io)
        .unwrap();
    assert_eq!(
        io.events,
        [Event::Unexpected, Event::PutBack],
        "no SyncAck before a match"
    );
    let (env, message) = io.unexpected.pop().unwrap();
    assert_eq!(env, ENV);
    match message {
        Unexpected::Eager {
            data: EagerData::Owned(bytes),
            size: 24,
            sync: true,
            sreq: SENDER_REQ,
        } => assert_eq!(bytes, io.payload),
        _ => panic!("expected a copy of the message"),
    }
    assert!(
        !io.credits.unexpected_fits(BUDGET - 23, BUDGET),
        "its bytes count"
    );
    assert_eq!(io.credits.to_carry(), 1);
}

#[test]
fn past_the_budget_the_message_stays_in_its_slot_and_its_credit_is_withheld() {
    let mut io = FakeIo::new(64, 24);
    arrival(24, false, Some(5))
        .queue_unexpected(16, &mut io)
        .unwrap();
    assert_eq!(io.events, [Event::Unexpected], "the slot is held");
    assert!(matches!(
        io.unexpected[0].1,
        Unexpected::Eager {
            data: EagerData::Held { slot: 5 },
            ..
        }
    ));
    assert_eq!(
        io.credits.to_carry(),
        0,
        "no credit goes back for a held slot"
    );
}

#[test]
fn a_local_cell_is_copied_out_whatever_the_budget() {
    let mut io = FakeIo::new(64, 24);
    io.in_slot = false;
    arrival(24, false, None)
        .queue_unexpected(0, &mut io)
        .unwrap();
    assert!(matches!(
        io.unexpected[0].1,
        Unexpected::Eager {
            data: EagerData::Owned(_),
            ..
        }
    ));
    assert_eq!(io.events, [Event::Unexpected, Event::PutBack]);
}

#[test]
fn a_held_message_matched_later_is_copied_from_its_slot_which_then_goes_back() {
    let mut io = FakeIo::new(64, 24);
    deliver_unexpected(
        RECEIVE,
        ENV,
        &EagerData::Held { slot: 5 },
        24,
        Some(SENDER_REQ),
        &mut io,
    )
    .unwrap();
    assert_eq!(
        io.events,
        [
            Event::Wrote {
                n: 24,
                owned: false
            },
            Event::Completed,
            Event::PutBack,
            Event::SyncAck(SENDER_REQ)
        ]
    );
    assert_eq!(
        io.credits.to_carry(),
        1,
        "the held credit goes back with the slot"
    );
}

#[test]
fn a_copied_out_message_matched_later_frees_its_share_of_the_budget() {
    let mut io = FakeIo::new(64, 0);
    io.credits.copied_out(24);
    let bytes: Vec<u8> = (100..124).collect();
    deliver_unexpected(
        RECEIVE,
        ENV,
        &EagerData::Owned(bytes.clone()),
        24,
        None,
        &mut io,
    )
    .unwrap();
    assert_eq!(
        io.events,
        [Event::Wrote { n: 24, owned: true }, Event::Completed]
    );
    assert_eq!(io.written, bytes);
    assert!(
        io.credits.unexpected_fits(16, 16),
        "its bytes no longer count"
    );
}

#[test]
fn a_receive_that_is_gone_is_not_completed() {
    let mut io = FakeIo::new(64, 8);
    io.buffer = None;
    deliver_unexpected(RECEIVE, ENV, &EagerData::Held { slot: 2 }, 8, None, &mut io).unwrap();
    assert_eq!(io.events, [Event::PutBack], "the held slot still goes back");
}

#[test]
fn a_copy_longer_than_the_buffer_delivers_the_buffer_and_is_truncated() {
    let mut io = FakeIo::new(16, 0);
    io.credits.copied_out(40);
    let bytes: Vec<u8> = (0..40).collect();
    deliver_unexpected(
        RECEIVE,
        ENV,
        &EagerData::Owned(bytes.clone()),
        40,
        None,
        &mut io,
    )
    .unwrap();
    assert_eq!(io.written, bytes[..16]);
    match io.results.pop().unwrap() {
        Err(Error::Truncated {
            source_rank: 1,
            tag: 7,
            message_bytes: 40,
            buffer_bytes: 16,
        }) => {}
        other => panic!("expected a truncation, got {other:?}"),
    }
}

#[test]
fn an_empty_message_fits_any_buffer() {
    let status = eager_result(ENV, 0, 0).unwrap();
    assert_eq!(status.count, 0);
    assert!(eager_result(ENV, 1, 0).is_err());
    assert_eq!(eager_result(ENV, 8, 9).unwrap().count, 8);
}
