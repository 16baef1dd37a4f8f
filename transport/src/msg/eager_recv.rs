//! The eager protocol's unexpected messages as a machine, against [`EagerIo`] alone.
//!
//! An eager message that finds its receive posted is copied straight from its slot or
//! local cell into the receive's buffer (one copy) and its slot goes back, in the layer
//! (`eager.rs`: it is the hottest path of the library, and kept in one piece there). One
//! that finds none is unexpected: copied out of its slot while the peer's unexpected bytes
//! stay under the budget, else left in its slot, whose credit is then withheld
//! ([`Credits`]), so a flood of unexpected messages stops its sender. A local cell is always
//! copied out, as MPICH's and Open MPI's shared-memory paths do: its ring moves on. When a
//! receive later matches the message, the bytes go to its buffer and a held slot goes back.
//! A message longer than the buffer delivers the buffer's length and ends the receive with
//! [`Error::Truncated`]; the sender of a synchronous send hears of the match (SyncAck) only
//! once the bytes are delivered.

use super::credits::Credits;
use super::matching::Envelope;
use super::state::{EagerData, Unexpected};
use super::{RequestId, Status};
use crate::error::{Error, Result};

/// An eager message as it arrived: its header read, its payload still where it landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EagerArrival {
    pub env: Envelope,
    /// Payload bytes.
    pub size: usize,
    /// A synchronous send, waiting for its match.
    pub sync: bool,
    /// The sender's request, which a SyncAck names.
    pub sreq: u64,
    /// The NIC's receive slot the message is in, which may be held; `None` for a cell of
    /// the local path.
    pub slot: Option<usize>,
}

/// Where the bytes written into a receive come from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum EagerBytes<'a> {
    /// The message's slot or cell (a held message: its slot).
    Arrived,
    /// A copy made when the message was unexpected.
    Owned(&'a [u8]),
}

/// All the eager receive side may do with an unexpected message: copy it, complete the
/// receive that matches it, give its slot back, answer a synchronous sender.
pub(crate) trait EagerIo {
    /// Writes the first bytes of the payload (`size` in all) into receive `rid`'s buffer, as
    /// many as it holds. Returns the buffer's length, or `None` if `rid` is no receive.
    fn write_receive(&mut self, rid: RequestId, size: usize, from: EagerBytes) -> Option<usize>;
    /// A copy of the arrived payload's `size` bytes.
    fn copy_out(&mut self, size: usize) -> Vec<u8>;
    /// Receive `rid` ends with `result`.
    fn complete(&mut self, rid: RequestId, result: Result<Status>);
    /// The arrival's slot (when it has one) goes back to the NIC, its credit owed to the
    /// sender.
    fn put_back(&mut self) -> Result<()>;
    /// Tells the sender that its synchronous send `sreq` matched.
    fn sync_ack(&mut self, sreq: u64) -> Result<()>;
    /// Queues the message, unmatched.
    fn push_unexpected(&mut self, env: Envelope, message: Unexpected);
    /// The sending peer's flow-control account.
    fn credits(&mut self) -> &mut Credits;
}

impl EagerArrival {
    /// The message found no posted receive: queued unexpected, copied out while the peer's
    /// unexpected bytes stay under `budget` (its slot then goes back), else held in its slot
    /// (its credit withheld). A local cell is always copied out.
    pub(crate) fn queue_unexpected(self, budget: usize, io: &mut impl EagerIo) -> Result<()> {
        let data = match self.slot {
            Some(slot) if !io.credits().unexpected_fits(self.size, budget) => {
                EagerData::Held { slot }
            }
            _ => {
                io.credits().copied_out(self.size);
                EagerData::Owned(io.copy_out(self.size))
            }
        };
        let held = matches!(data, EagerData::Held { .. });
        let message = Unexpected::Eager {
            data,
            size: self.size,
            sync: self.sync,
            sreq: self.sreq,
        };
        io.push_unexpected(self.env, message);
        if !held {
            io.put_back()?;
        }
        Ok(())
    }
}

/// A new receive `rid` matched the unexpected eager message `data` of `size` bytes from
/// `env`: the bytes go to its buffer, a held slot goes back (for a held message, `io`'s
/// arrival is that slot), and a synchronous sender hears of the match.
pub(crate) fn deliver_unexpected(
    rid: RequestId,
    env: Envelope,
    data: &EagerData,
    size: usize,
    sync_sreq: Option<u64>,
    io: &mut impl EagerIo,
) -> Result<()> {
    match data {
        EagerData::Owned(bytes) => {
            io.credits().delivered(size);
            deliver(rid, env, size, EagerBytes::Owned(bytes), io);
        }
        EagerData::Held { .. } => {
            deliver(rid, env, size, EagerBytes::Arrived, io);
            io.put_back()?;
        }
    }
    if let Some(sreq) = sync_sreq {
        io.sync_ack(sreq)?;
    }
    Ok(())
}

/// Writes the `size`-byte payload into receive `rid` and completes it.
fn deliver(rid: RequestId, env: Envelope, size: usize, from: EagerBytes, io: &mut impl EagerIo) {
    if let Some(buffer_bytes) = io.write_receive(rid, size, from) {
        io.complete(rid, eager_result(env, size, buffer_bytes));
    }
}

/// How an eager receive of a `size`-byte message into a `buffer_bytes` buffer ends: its
/// status, or [`Error::Truncated`] when the message was longer (the buffer's length was
/// delivered).
pub(crate) fn eager_result(env: Envelope, size: usize, buffer_bytes: usize) -> Result<Status> {
    if size > buffer_bytes {
        Err(Error::Truncated {
            source_rank: env.source,
            tag: env.tag,
            message_bytes: size,
            buffer_bytes,
        })
    } else {
        Ok(Status {
            source: env.source,
            tag: env.tag,
            count: size,
        })
    }
}

#[cfg(test)]
mod tests;
