//! Nonblocking collectives (`MPI_I*`): each is one set of point-to-point messages, all
//! posted when the call starts, in the communicator's context for nonblocking collectives
//! under a tag of its own (the backend's `nonblocking_channel`), so neither user receives
//! nor blocking collectives match them, and concurrent ones never mix. The message layer
//! moves them while the caller computes or communicates; completing the request combines
//! (reductions, in rank order) and unpacks what arrived into the caller's buffer.
//!
//! The algorithms are the direct ones (every rank that needs a block gets it from its
//! owner): right for the small jobs of one host that pagewire runs, and simple enough to
//! need no schedule of rounds. Their cost is O(size) messages per rank (O(size²) for the
//! all-to-all ones).

use crate::backend::{CommBackend, CommunicatorBackend};
use crate::collective::operation::{combine_bytes, unit_of, Operation};
use crate::datatype::{packed, Buffer, Landing, UncommittedDatatype};
use crate::error::{Error, Result};
use crate::request::{OwnedReceive, OwnedSend, Pending};
use crate::status::Status;
use crate::ErrorClass;

/// What completes a collective once its messages have arrived: the blocks received, by
/// source rank.
type Finish<'a> = Box<dyn FnOnce(Vec<Option<Vec<u8>>>) -> Result<()> + 'a>;

/// A nonblocking collective in flight.
struct Collective<'a> {
    sends: Vec<OwnedSend>,
    /// Per source rank: the receive from it, until it completes.
    receives: Vec<Option<OwnedReceive>>,
    received: Vec<Option<Vec<u8>>>,
    finish: Option<Finish<'a>>,
}

/// Posts `receives` (source rank, bytes) and `sends` (destination rank, bytes) on the
/// nonblocking channel of `backend`; `finish` runs once all are done.
fn start<'a>(
    backend: &CommBackend,
    receives: Vec<(usize, usize)>,
    sends: Vec<(usize, Vec<u8>)>,
    finish: Finish<'a>,
) -> Result<Box<dyn Pending + 'a>> {
    let (channel, tag) = backend.nonblocking_channel()?;
    let size = backend.size();
    let mut posted: Vec<Option<OwnedReceive>> = (0..size).map(|_| None).collect();
    for (src, len) in receives {
        posted[src] = Some(OwnedReceive::start(&channel, Some(src), Some(tag), len)?);
    }
    let sends = sends
        .into_iter()
        .map(|(dest, bytes)| OwnedSend::start(&channel, dest, tag, bytes))
        .collect::<Result<Vec<_>>>()?;
    Ok(Box::new(Collective {
        sends,
        receives: posted,
        received: vec![None; size],
        finish: Some(finish),
    }))
}

impl Collective<'_> {
    /// Completes what has arrived; true once everything has.
    fn advance(&mut self) -> Result<bool> {
        let mut all = true;
        for (src, slot) in self.receives.iter_mut().enumerate() {
            if let Some(r) = slot.take() {
                match r.test()? {
                    Ok((bytes, _)) => self.received[src] = Some(bytes),
                    Err(r) => {
                        *slot = Some(r);
                        all = false;
                    }
                }
            }
        }
        for s in &mut self.sends {
            all &= s.test()?;
        }
        Ok(all)
    }
}

impl Pending for Collective<'_> {
    fn wait(&mut self) -> Result<Status> {
        loop {
            if let Some(s) = self.test()? {
                return Ok(s);
            }
        }
    }

    fn test(&mut self) -> Result<Option<Status>> {
        if !self.advance()? {
            return Ok(None);
        }
        if let Some(finish) = self.finish.take() {
            finish(std::mem::take(&mut self.received))?;
        }
        Ok(Some(Status::empty()))
    }

    fn is_done(&mut self) -> bool {
        self.finish.is_none()
            || (self.receives.iter_mut().flatten().all(|r| r.is_done())
                && self.advance().unwrap_or(true))
    }
}

impl Drop for Collective<'_> {
    fn drop(&mut self) {
        // The other ranks count on this one's messages: finish rather than abandon.
        if self.finish.is_some() && !std::thread::panicking() {
            let _ = self.wait();
        }
    }
}

/// The blocks of `received` in rank order, `mine` at rank `me`, concatenated.
fn concatenate(received: Vec<Option<Vec<u8>>>, me: usize, mine: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (r, block) in received.into_iter().enumerate() {
        if r == me {
            out.extend_from_slice(mine);
        } else if let Some(b) = block {
            out.extend_from_slice(&b);
        }
    }
    out
}

/// Each rank's bytes in `landing`: its partition's blocks, or equal shares.
fn shares(landing: &Landing<'_>, size: usize) -> Vec<usize> {
    landing
        .block_lens()
        .unwrap_or_else(|| vec![landing.packed_len() / size.max(1); size])
}

/// The other ranks of `backend`.
fn others(backend: &CommBackend) -> impl Iterator<Item = usize> {
    let me = backend.rank();
    (0..backend.size()).filter(move |&r| r != me)
}

/// `MPI_Ibarrier`: an empty message from every rank to every other.
pub(crate) fn barrier(backend: &CommBackend) -> Result<Box<dyn Pending + 'static>> {
    let receives = others(backend).map(|r| (r, 0)).collect();
    let sends = others(backend).map(|r| (r, Vec::new())).collect();
    start(backend, receives, sends, Box::new(|_| Ok(())))
}

/// `MPI_Ibcast` from `root` of the content of `landing`.
pub(crate) fn broadcast<'a>(
    backend: &CommBackend,
    root: usize,
    mut landing: Landing<'a>,
) -> Result<Box<dyn Pending + 'a>> {
    if backend.rank() == root {
        let mut bytes = vec![0u8; landing.packed_len()];
        landing.read_into(&mut bytes);
        let sends = others(backend).map(|r| (r, bytes.clone())).collect();
        return start(backend, Vec::new(), sends, Box::new(|_| Ok(())));
    }
    let len = landing.packed_len();
    let finish: Finish<'a> = Box::new(move |mut got| {
        landing.unpack(&got[root].take().unwrap_or_default());
        Ok(())
    });
    start(backend, vec![(root, len)], Vec::new(), finish)
}

/// `MPI_Iallgather(v)`: `send` from every rank into its block of `landing` on every rank.
pub(crate) fn all_gather<'a>(
    backend: &CommBackend,
    send: &[u8],
    mut landing: Landing<'a>,
) -> Result<Box<dyn Pending + 'a>> {
    let (me, size) = (backend.rank(), backend.size());
    let lens = shares(&landing, size);
    let receives = others(backend).map(|r| (r, lens[r])).collect();
    let sends = others(backend).map(|r| (r, send.to_vec())).collect();
    let mine = send.to_vec();
    let finish: Finish<'a> = Box::new(move |got| {
        landing.unpack(&concatenate(got, me, &mine));
        Ok(())
    });
    start(backend, receives, sends, finish)
}

/// `MPI_Ialltoall(v)`: block `j` of `send` (`send_lens[j]` bytes) to rank `j`.
pub(crate) fn all_to_all<'a>(
    backend: &CommBackend,
    send: &[u8],
    send_lens: &[usize],
    mut landing: Landing<'a>,
) -> Result<Box<dyn Pending + 'a>> {
    let (me, size) = (backend.rank(), backend.size());
    if send_lens.len() != size {
        return Err(Error::InvalidArgument(format!(
            "all_to_all: {} send blocks for {size} ranks",
            send_lens.len()
        )));
    }
    let mut blocks = Vec::with_capacity(size);
    let mut at = 0;
    for &n in send_lens {
        blocks.push(send[at..at + n].to_vec());
        at += n;
    }
    let lens = shares(&landing, size);
    let receives = others(backend).map(|r| (r, lens[r])).collect();
    let mine = std::mem::take(&mut blocks[me]);
    let sends = others(backend)
        .map(|r| (r, std::mem::take(&mut blocks[r])))
        .collect();
    let finish: Finish<'a> = Box::new(move |got| {
        landing.unpack(&concatenate(got, me, &mine));
        Ok(())
    });
    start(backend, receives, sends, finish)
}

/// `MPI_Igather(v)` of `send` into `landing` at `root` (`None` elsewhere).
pub(crate) fn gather<'a>(
    backend: &CommBackend,
    root: usize,
    send: &[u8],
    landing: Option<Landing<'a>>,
) -> Result<Box<dyn Pending + 'a>> {
    let (me, size) = (backend.rank(), backend.size());
    if me != root {
        return start(
            backend,
            Vec::new(),
            vec![(root, send.to_vec())],
            Box::new(|_| Ok(())),
        );
    }
    let mut landing = landing.ok_or_else(|| {
        Error::invalid(
            ErrorClass::Buffer,
            "the root of a gather passes a receive buffer",
        )
    })?;
    let lens = shares(&landing, size);
    let receives = others(backend).map(|r| (r, lens[r])).collect();
    let mine = send.to_vec();
    let finish: Finish<'a> = Box::new(move |got| {
        landing.unpack(&concatenate(got, me, &mine));
        Ok(())
    });
    start(backend, receives, Vec::new(), finish)
}

/// `MPI_Iscatter(v)` from `root` of `send` (its blocks and their lengths, at the root only)
/// into `landing`.
pub(crate) fn scatter<'a>(
    backend: &CommBackend,
    root: usize,
    send: Option<(Vec<u8>, Vec<usize>)>,
    mut landing: Landing<'a>,
) -> Result<Box<dyn Pending + 'a>> {
    let me = backend.rank();
    if me != root {
        let len = landing.packed_len();
        let finish: Finish<'a> = Box::new(move |mut got| {
            landing.unpack(&got[root].take().unwrap_or_default());
            Ok(())
        });
        return start(backend, vec![(root, len)], Vec::new(), finish);
    }
    let (bytes, lens) = send.ok_or_else(|| {
        Error::invalid(
            ErrorClass::Buffer,
            "the root of a scatter passes a send buffer",
        )
    })?;
    let mut blocks = Vec::with_capacity(lens.len());
    let mut at = 0;
    for &n in &lens {
        blocks.push(bytes[at..at + n].to_vec());
        at += n;
    }
    let mine = std::mem::take(&mut blocks[me]);
    let sends = others(backend)
        .map(|r| (r, std::mem::take(&mut blocks[r])))
        .collect();
    let finish: Finish<'a> = Box::new(move |_| {
        landing.unpack(&mine);
        Ok(())
    });
    start(backend, Vec::new(), sends, finish)
}

/// Which reduction a nonblocking reduction computes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Combine {
    /// Every rank gets the reduction of all (`MPI_Iallreduce`).
    All,
    /// `root` gets the reduction of all (`MPI_Ireduce`).
    Root(usize),
    /// Rank `r` gets the reduction of ranks `0..=r` (inclusive) or `0..r` (`MPI_Iscan`,
    /// `MPI_Iexscan`).
    Prefix {
        /// Whether rank `r`'s own contribution is included.
        inclusive: bool,
    },
    /// Rank `j` gets block `j` of the reduction (`MPI_Ireduce_scatter_block`).
    ScatterBlock,
}

/// A nonblocking reduction of `send` with `op` into `landing` (where this rank gets one).
pub(crate) fn reduction<'a, S, O>(
    backend: &CommBackend,
    combine: Combine,
    send: &S,
    landing: Option<Landing<'a>>,
    op: O,
) -> Result<Box<dyn Pending + 'a>>
where
    S: Buffer + ?Sized,
    O: Operation + 'a,
{
    let datatype = send.as_datatype();
    let map = datatype.type_map().clone();
    // Checked before any message: a predefined operation on a datatype of mixed primitives
    // is an error on every rank alike.
    unit_of(&map, op.reduction())?;
    let mine = packed(send).into_owned();
    let (me, size) = (backend.rank(), backend.size());
    // Who this rank sends its contribution (or which block of it) to, and receives from.
    let (to, from): (Vec<usize>, Vec<usize>) = match combine {
        Combine::All | Combine::ScatterBlock => {
            (others(backend).collect(), others(backend).collect())
        }
        Combine::Root(root) if me == root => (Vec::new(), others(backend).collect()),
        Combine::Root(root) => (vec![root], Vec::new()),
        Combine::Prefix { .. } => ((me + 1..size).collect(), (0..me).collect()),
    };
    let block = if matches!(combine, Combine::ScatterBlock) {
        // Whole elements per rank.
        let element = map.size().max(1);
        mine.len() / element / size.max(1) * element
    } else {
        mine.len()
    };
    let part = |r: usize| -> Vec<u8> {
        if matches!(combine, Combine::ScatterBlock) {
            mine[r * block..(r + 1) * block].to_vec()
        } else {
            mine.clone()
        }
    };
    let sends = to.iter().map(|&r| (r, part(r))).collect();
    let receives = from.iter().map(|&r| (r, block)).collect();
    let own = part(me);
    // Whether this rank gets a result (rank 0's exclusive scan gets none).
    let gets = match combine {
        Combine::All | Combine::ScatterBlock => true,
        Combine::Root(root) => me == root,
        Combine::Prefix { inclusive } => inclusive || me > 0,
    };
    let Some(mut landing) = landing.filter(|_| gets) else {
        return start(backend, receives, sends, Box::new(|_| Ok(())));
    };
    let finish: Finish<'a> = Box::new(move |got| {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        for (r, block) in got.into_iter().enumerate() {
            let included = match combine {
                Combine::Prefix { inclusive } => r < me || (inclusive && r == me),
                _ => true,
            };
            if !included {
                continue;
            }
            if r == me {
                parts.push(own.clone());
            } else if let Some(b) = block {
                parts.push(b);
            }
        }
        if parts.is_empty() {
            return Ok(());
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let result = combine_bytes(&map, op.reduction(), &refs)?;
        landing.unpack(&result);
        Ok(())
    });
    start(backend, receives, sends, finish)
}
