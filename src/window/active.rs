//! Accumulates applied by the target's progress engine (active messages), as MPICH's CH4
//! and the UCX-based MPI libraries run the accumulates a NIC's atomics cannot make: the
//! origin sends the operation, the displacement and its data in one eager message, the
//! target applies it to its part in its next progress pass and answers with the bytes that
//! were there (`PAGEWIRE_RMA_ACCUMULATE=am`, the default). One round trip instead of the
//! four of the update mutex (`mutex`: the origin locks, reads, combines, writes back and
//! unlocks, with no action by the target's CPU).
//!
//! The target applies a request only when no local access (`with_local`, `with_local_mut`)
//! holds references to its part, and under its update mutex, the word an origin of the
//! `mutex` way takes too, so the two ways exclude each other and each element update stays
//! atomic. Requests of one origin are applied in its order (it waits for each reply). The
//! price is MPICH's: a target that computes without calling pagewire answers nothing until
//! its next call; puts, gets, 64-bit sums and compare-and-swaps stay NIC operations that
//! need no target CPU. Windows over shared memory combine in place under their mutex, and
//! dynamic windows, whose regions change, keep the `mutex` way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pagewire_collectives::Op;
use pagewire_transport::msg::{ActiveMessageHandler, Handled};
use pagewire_transport::sys::AnonMapping;
use pagewire_transport::Error as MessageError;

use super::memory::PartWriter;
use super::{with_layer, Span, Window, UPDATE_MUTEX};
use crate::backend::CommunicatorBackend;
use crate::collective::operation::{combine_bytes, Reduction};
use crate::datatype::{Equivalence, TypeMap};
use crate::error::{Error, Result};
use crate::topology::{Communicator, SimpleCommunicator};

/// How a window's accumulates that the NIC's atomics cannot make are applied
/// (`PAGEWIRE_RMA_ACCUMULATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AccumulateMethod {
    /// By the target's progress engine: one message and its reply (`am`, the default).
    ActiveMessage,
    /// By the origin under the target's update mutex: four NIC round trips, no action by
    /// the target's CPU (`mutex`).
    Mutex,
}

impl AccumulateMethod {
    /// The method `PAGEWIRE_RMA_ACCUMULATE` names.
    pub(super) fn from_env() -> Result<AccumulateMethod> {
        match std::env::var("PAGEWIRE_RMA_ACCUMULATE").as_deref() {
            Err(_) | Ok("") | Ok("am") => Ok(AccumulateMethod::ActiveMessage),
            Ok("mutex") => Ok(AccumulateMethod::Mutex),
            Ok(v) => Err(Error::InvalidSetting {
                variable: "PAGEWIRE_RMA_ACCUMULATE".into(),
                value: v.into(),
                accepted: "expected am or mutex".into(),
            }),
        }
    }
}

/// The wire code of `op`: its place among the reductions (`Op::ALL`), then `Replace` and
/// `NoOp`.
fn op_code(op: Op) -> u8 {
    let reductions = Op::ALL.len() as u8;
    match op {
        Op::Replace => reductions,
        Op::NoOp => reductions + 1,
        _ => Op::ALL.iter().position(|&o| o == op).expect("a reduction") as u8,
    }
}

/// The operation of wire code `code` ([`op_code`]).
fn op_of(code: u8) -> Option<Op> {
    let reductions = Op::ALL.len() as u8;
    match code {
        c if c == reductions => Some(Op::Replace),
        c if c == reductions + 1 => Some(Op::NoOp),
        c => Op::ALL.get(c as usize).copied(),
    }
}

/// A request's kinds: an accumulate (its data the origin's elements) and a
/// compare-and-swap (its data the comparand, then the swap value).
const ACCUMULATE: u8 = 0;
const COMPARE_AND_SWAP: u8 = 1;
/// A request: kind, operation code, the part's byte offset (u64, little endian), the data.
const REQUEST_HEADER: usize = 10;
/// A reply: `OK` and the bytes before, or `REFUSED` and why (UTF-8).
const OK: u8 = 0;
const REFUSED: u8 = 1;
/// The most bytes of a refusal's text an origin reads.
const REFUSAL_TEXT: usize = 512;
/// Every request and reply travels with this tag in its own context.
const TAG: i32 = 0;

/// One rank's side of a window whose targets apply its accumulates.
pub(super) struct ActiveUpdates {
    /// The contexts of the requests and of their replies.
    requests: u32,
    replies: u32,
    /// Whether a local access holds references to this rank's part (the target's handler
    /// then puts requests off).
    pub(super) local_open: Arc<AtomicBool>,
    /// The communicators whose contexts these are, kept for the window's life.
    _comms: [SimpleCommunicator; 2],
}

impl ActiveUpdates {
    /// Sets this rank up (collective over `comm`: two duplicates for the contexts) and hands
    /// the handler of this rank's `part` to the message layer.
    pub(super) fn start(
        comm: &SimpleCommunicator,
        part: PartWriter,
        map: TypeMap,
        control: Arc<AnonMapping>,
    ) -> Result<ActiveUpdates> {
        let comms = [comm.try_duplicate()?, comm.try_duplicate()?];
        let context = |c: &SimpleCommunicator| {
            c.as_simple().backend().message_context().ok_or_else(|| {
                Error::NotSupported("a window's accumulates need pagewire's transport".into())
            })
        };
        let (requests, replies) = (context(&comms[0])?, context(&comms[1])?);
        let local_open = Arc::new(AtomicBool::new(false));
        let handler = UpdateHandler {
            part,
            map,
            control,
            local_open: Arc::clone(&local_open),
        };
        with_layer(comm, |p2p| {
            p2p.handle_context(requests, replies, Box::new(handler))
        })?;
        Ok(ActiveUpdates {
            requests,
            replies,
            local_open,
            _comms: comms,
        })
    }

    /// Stops this rank's handler: the window's free, once no origin sends any more.
    pub(super) fn stop(&self, comm: &SimpleCommunicator) {
        let _ = with_layer(comm, |p2p| {
            p2p.stop_handling(self.requests);
            Ok(())
        });
    }
}

/// The target's side: applies requests to this rank's part.
struct UpdateHandler {
    part: PartWriter,
    map: TypeMap,
    /// The window's control page, whose update mutex the origins of the `mutex` way take.
    control: Arc<AnonMapping>,
    local_open: Arc<AtomicBool>,
}

impl ActiveMessageHandler for UpdateHandler {
    fn handle(&mut self, _source: usize, _tag: i32, payload: &[u8]) -> Handled {
        if self.local_open.load(Ordering::Acquire) {
            return Handled::Later;
        }
        let mutex = self.control.atomic_u64(UPDATE_MUTEX as usize);
        if mutex
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Handled::Later;
        }
        let applied = self.apply(payload);
        mutex.fetch_sub(1, Ordering::Release);
        let mut reply = Vec::new();
        match applied {
            Ok(before) => {
                reply.push(OK);
                reply.extend_from_slice(&before);
            }
            Err(why) => {
                reply.push(REFUSED);
                reply.extend_from_slice(why.as_bytes());
            }
        }
        Handled::Reply(reply)
    }
}

impl UpdateHandler {
    /// Applies request `p`; the bytes before, or why not.
    fn apply(&self, p: &[u8]) -> std::result::Result<Vec<u8>, String> {
        if p.len() < REQUEST_HEADER {
            return Err("a truncated request".into());
        }
        let offset = u64::from_le_bytes(p[2..10].try_into().expect("8 bytes"));
        let offset = usize::try_from(offset).map_err(|_| "an offset past the part")?;
        let data = &p[REQUEST_HEADER..];
        let outside = || {
            format!(
                "{} bytes at offset {offset} lie outside the part",
                data.len()
            )
        };
        match p[0] {
            ACCUMULATE => {
                let op = op_of(p[1]).ok_or("an unknown operation")?;
                self.part
                    .update(offset, data.len(), |current| {
                        let before = current.to_vec();
                        let after = match op {
                            Op::Replace => data.to_vec(),
                            Op::NoOp => return Ok(before),
                            _ => combine_bytes(&self.map, Reduction::System(op), &[data, current])
                                .map_err(|e| e.to_string())?,
                        };
                        current.copy_from_slice(&after);
                        Ok(before)
                    })
                    .ok_or_else(outside)?
            }
            COMPARE_AND_SWAP if data.len() % 2 == 0 => {
                let (compare, swap) = data.split_at(data.len() / 2);
                self.part
                    .update(offset, compare.len(), |current| {
                        let before = current.to_vec();
                        if current == compare {
                            current.copy_from_slice(swap);
                        }
                        before
                    })
                    .ok_or_else(outside)
            }
            _ => Err("an unknown request".into()),
        }
    }
}

impl<T: Equivalence + Send + Sync> Window<T> {
    /// Combines `origin` into where `s` lies with `op` by the target's progress engine; the
    /// bytes before. `None`: this window's targets do not (or the request exceeds one eager
    /// message), so the origin combines under the mutex.
    pub(super) fn update_by_target(
        &self,
        s: Span,
        op: Op,
        origin: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        self.request_update(s, [ACCUMULATE, op_code(op)], &[origin], origin.len())
    }

    /// Compares and swaps where `s` lies by the target's progress engine; the bytes before
    /// (`None` as for [`Window::update_by_target`]).
    pub(super) fn compare_and_swap_by_target(
        &self,
        s: Span,
        compare: &[u8],
        swap: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        self.request_update(s, [COMPARE_AND_SWAP, 0], &[compare, swap], compare.len())
    }

    fn request_update(
        &self,
        s: Span,
        [kind, op]: [u8; 2],
        data: &[&[u8]],
        before_len: usize,
    ) -> Result<Option<Vec<u8>>> {
        let Some(am) = &self.active else {
            return Ok(None);
        };
        let offset = s.at - self.parts[s.target].base;
        let mut request =
            Vec::with_capacity(REQUEST_HEADER + data.iter().map(|d| d.len()).sum::<usize>());
        request.extend_from_slice(&[kind, op]);
        request.extend_from_slice(&offset.to_le_bytes());
        data.iter().for_each(|d| request.extend_from_slice(d));
        with_layer(&self.comm, |p2p| {
            if request.len() > p2p.eager_limit_to(s.world) {
                return Ok(None);
            }
            p2p.send(s.world, TAG, am.requests, &request)?;
            let mut reply = vec![0u8; 1 + before_len.max(REFUSAL_TEXT)];
            let status = p2p.recv(Some(s.world), Some(TAG), am.replies, &mut reply)?;
            reply.truncate(status.count);
            match reply.split_first() {
                Some((&OK, before)) if before.len() == before_len => Ok(Some(before.to_vec())),
                Some((_, why)) => Err(MessageError::invalid_argument(format!(
                    "rank {} did not apply an accumulate: {}",
                    s.target,
                    String::from_utf8_lossy(why)
                ))),
                None => Err(MessageError::invalid_argument(format!(
                    "rank {} answered an accumulate with nothing",
                    s.target
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_one_code() {
        let all = Op::ALL.into_iter().chain([Op::Replace, Op::NoOp]);
        for (i, op) in all.enumerate() {
            assert_eq!((op_code(op), op_of(i as u8)), (i as u8, Some(op)));
        }
        assert_eq!(op_of(12), None);
    }
}
