//! The split local rendezvous's machines alone, against a fake of [`LocalCopyIo`]: the
//! sender's answers to a CopyShare (written, declined, outside the message, a failed write,
//! a receiver gone) and its count of CopyDones; the receiver's end at ShareDone.

use super::{LocalCopyIo, LocalSend, LocalSplitRecv, ShareAnswer, SplitEnd};
use crate::buffer_mode::UserMemory;
use crate::error::{Error, Result};
use crate::msg::wire::{self, Header, LocalSource, MsgKind};
use crate::nic::WcStatus;
use crate::sys::{CmaDirection, Error as SystemError, Extent};

const BUF: u64 = 0x4000_0000;
const PEER_BUF: u64 = 0x9000_0000;

/// The peer's memory and control path: copies recorded, failing on request.
#[derive(Default)]
struct FakeCma {
    copies: Vec<(CmaDirection, Vec<Extent>, Vec<Extent>)>,
    /// The next copy fails with this errno.
    copy_errno: Option<i32>,
    sent: Vec<Header>,
    send_fails: bool,
}

impl LocalCopyIo for FakeCma {
    fn copy(
        &mut self,
        dir: CmaDirection,
        local: &[Extent],
        remote: &[Extent],
    ) -> std::io::Result<u64> {
        self.copies.push((dir, local.to_vec(), remote.to_vec()));
        match self.copy_errno.take() {
            Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
            None => Ok(local.iter().map(|e| e.len).sum()),
        }
    }

    fn send_control(&mut self, h: Header) -> Result<()> {
        if self.send_fails {
            return Err(Error::Communication {
                peer: 1,
                status: WcStatus::RetryExceeded,
                what: "sending a control message",
            });
        }
        self.sent.push(h);
        Ok(())
    }
}

fn contiguous(addr: u64, len: u64) -> LocalSource {
    LocalSource {
        addr,
        extent: len,
        count: 1,
        runs: vec![(0, len)],
    }
}

/// The receiver's CopyShare: bytes `[at, at + len)` into its buffer at `PEER_BUF`.
fn share(at: u64, len: u64) -> Header {
    let mut h = Header::new(MsgKind::CopyShare);
    h.sreq = 7;
    h.rreq = 9;
    h.size = at;
    h.len = len;
    h
}

fn extent(addr: u64, len: u64) -> Extent {
    Extent { addr, len }
}

// ---- the sender ------------------------------------------------------------------------

#[test]
fn a_share_inside_the_message_is_written_and_answered_with_its_length() {
    let mut io = FakeCma::default();
    let mut send = LocalSend::new(None);
    let buf = UserMemory::describing(BUF, 1000, None);
    let dest = contiguous(PEER_BUF, 1000);
    let answer = send.on_copy_share(&buf, &share(448, 552), &dest, false, &mut io);
    assert_eq!(answer.unwrap(), ShareAnswer::Written);
    assert_eq!(
        io.copies,
        [(
            CmaDirection::Write,
            vec![extent(BUF + 448, 552)],
            vec![extent(PEER_BUF + 448, 552)]
        )]
    );
    let done = &io.sent[0];
    assert_eq!(
        (done.kind(), done.rreq, done.len, done.flags),
        (Some(MsgKind::ShareDone), 9, 552, 0)
    );
    assert!(send
        .on_copy_done(&Header::new(MsgKind::CopyDone), 1)
        .unwrap()
        .is_ok());
}

#[test]
fn a_share_outside_the_message_is_neither_written_nor_answered() {
    let mut io = FakeCma::default();
    let mut send = LocalSend::new(None);
    let buf = UserMemory::describing(BUF, 1000, None);
    let dest = contiguous(PEER_BUF, 1000);
    for bad in [share(448, 553), share(u64::MAX, 2)] {
        let answer = send.on_copy_share(&buf, &bad, &dest, false, &mut io);
        assert_eq!(answer.unwrap(), ShareAnswer::OutsideMessage);
    }
    assert!(io.copies.is_empty() && io.sent.is_empty());
}

#[test]
fn a_declined_share_answers_nothing_written_and_waits_for_two_copy_dones() {
    let mut io = FakeCma::default();
    let mut send = LocalSend::new(None);
    let buf = UserMemory::describing(BUF, 1000, None);
    let answer = send.on_copy_share(
        &buf,
        &share(448, 552),
        &contiguous(PEER_BUF, 1000),
        true,
        &mut io,
    );
    assert_eq!(answer.unwrap(), ShareAnswer::Declined);
    assert!(io.copies.is_empty());
    assert_eq!(io.sent[0].len, 0, "ShareDone of length 0: declined");
    let done = Header::new(MsgKind::CopyDone);
    assert!(
        send.on_copy_done(&done, 1).is_none(),
        "the front's CopyDone"
    );
    assert!(send.on_copy_done(&done, 1).unwrap().is_ok(), "the back's");
}

#[test]
fn a_failed_write_is_said_in_the_answer() {
    let mut io = FakeCma {
        copy_errno: Some(libc::EFAULT),
        ..FakeCma::default()
    };
    let mut send = LocalSend::new(None);
    let buf = UserMemory::describing(BUF, 1000, None);
    let answer = send.on_copy_share(
        &buf,
        &share(448, 552),
        &contiguous(PEER_BUF, 1000),
        false,
        &mut io,
    );
    assert_eq!(answer.unwrap(), ShareAnswer::Written);
    assert_eq!(io.sent[0].flags & wire::COPY_FAILED, wire::COPY_FAILED);
}

#[test]
fn a_receiver_gone_mid_write_gets_no_answer() {
    let mut io = FakeCma {
        copy_errno: Some(libc::ESRCH),
        ..FakeCma::default()
    };
    let mut send = LocalSend::new(None);
    let buf = UserMemory::describing(BUF, 1000, None);
    let answer = send.on_copy_share(
        &buf,
        &share(448, 552),
        &contiguous(PEER_BUF, 1000),
        false,
        &mut io,
    );
    assert_eq!(answer.unwrap(), ShareAnswer::PeerGone);
    assert!(io.sent.is_empty());
}

#[test]
fn a_packed_send_writes_from_its_packed_copy() {
    let mut io = FakeCma::default();
    let packed = vec![5u8; 64];
    let at = packed.as_ptr() as u64;
    let mut send = LocalSend::new(Some(packed));
    // The RTS described the packed copy of the buffer's 64 message bytes.
    let buf = UserMemory::describing(BUF, 64, None);
    send.on_copy_share(
        &buf,
        &share(32, 32),
        &contiguous(PEER_BUF, 64),
        false,
        &mut io,
    )
    .unwrap();
    assert_eq!(io.copies[0].1, [extent(at + 32, 32)]);
}

#[test]
fn a_copy_done_flagged_failed_fails_the_send() {
    let mut send = LocalSend::new(None);
    let mut done = Header::new(MsgKind::CopyDone);
    done.flags = wire::COPY_FAILED;
    match send.on_copy_done(&done, 3) {
        Some(Err(Error::Communication {
            peer: 3,
            status: WcStatus::RemoteAccessError,
            ..
        })) => {}
        other => panic!("expected the receiver's failure, got {other:?}"),
    }
}

// ---- the receiver ----------------------------------------------------------------------

/// A split receive of 1000 bytes whose back `[448, 1000)` the sender was asked to write.
fn split_receive() -> LocalSplitRecv {
    LocalSplitRecv {
        peer: 1,
        tag: 4,
        size: 1000,
        sreq: 7,
        pid: 4242,
        source: contiguous(PEER_BUF, 1000),
        back: (448, 1000),
        failed: None,
    }
}

fn share_done(len: u64, failed: bool) -> Header {
    let mut h = Header::new(MsgKind::ShareDone);
    h.rreq = 9;
    h.len = len;
    if failed {
        h.flags = wire::COPY_FAILED;
    }
    h
}

#[test]
fn the_back_written_by_the_sender_completes_the_receive() {
    let mut io = FakeCma::default();
    let buf = UserMemory::describing(BUF, 1000, None);
    let end = split_receive().on_share_done(&buf, &share_done(552, false), &mut io);
    assert!(matches!(end, SplitEnd::Received));
    assert!(io.copies.is_empty() && io.sent.is_empty());
}

#[test]
fn declined_the_receiver_copies_the_back_and_says_so() {
    let mut io = FakeCma::default();
    let buf = UserMemory::describing(BUF, 1000, None);
    let end = split_receive().on_share_done(&buf, &share_done(0, false), &mut io);
    assert!(matches!(end, SplitEnd::Received));
    assert_eq!(
        io.copies,
        [(
            CmaDirection::Read,
            vec![extent(BUF + 448, 552)],
            vec![extent(PEER_BUF + 448, 552)]
        )]
    );
    let done = &io.sent[0];
    assert_eq!(
        (done.kind(), done.sreq, done.flags),
        (Some(MsgKind::CopyDone), 7, 0)
    );
}

#[test]
fn a_failed_front_skips_the_back_and_flags_the_second_copy_done() {
    let mut io = FakeCma::default();
    let buf = UserMemory::describing(BUF, 1000, None);
    let mut rv = split_receive();
    rv.failed = Some(rv.copy_error(std::io::Error::from_raw_os_error(libc::EFAULT)));
    let end = rv.on_share_done(&buf, &share_done(0, false), &mut io);
    assert!(
        matches!(end, SplitEnd::Failed(Error::System(SystemError::Os { .. }))),
        "{end:?}"
    );
    assert!(io.copies.is_empty());
    assert_eq!(io.sent[0].flags & wire::COPY_FAILED, wire::COPY_FAILED);
}

#[test]
fn the_senders_failed_write_fails_the_receive() {
    let mut io = FakeCma::default();
    let buf = UserMemory::describing(BUF, 1000, None);
    let end = split_receive().on_share_done(&buf, &share_done(552, true), &mut io);
    assert!(matches!(
        end,
        SplitEnd::Failed(Error::Communication {
            status: WcStatus::RemoteAccessError,
            ..
        })
    ));
}

#[test]
fn a_sender_gone_while_the_back_is_copied_ends_the_receive_so() {
    let mut io = FakeCma {
        copy_errno: Some(libc::ESRCH),
        ..FakeCma::default()
    };
    let buf = UserMemory::describing(BUF, 1000, None);
    let end = split_receive().on_share_done(&buf, &share_done(0, false), &mut io);
    assert!(matches!(end, SplitEnd::SenderGone));
    assert!(io.sent.is_empty());
}

#[test]
fn a_copy_done_that_cannot_be_sent_fails_the_receive() {
    let mut io = FakeCma {
        send_fails: true,
        ..FakeCma::default()
    };
    let buf = UserMemory::describing(BUF, 1000, None);
    let end = split_receive().on_share_done(&buf, &share_done(0, false), &mut io);
    assert!(matches!(end, SplitEnd::Failed(Error::Communication { .. })));
}
