//! Collectives on pagewire's stack: the algorithms of `pagewire-collectives` on the message
//! layer, in the communicator's collective context (its context with
//! [`COLLECTIVE_CONTEXT_BIT`] set), over its group's world ranks.
//!
//! The algorithms are chosen per call by size and rank count; `PAGEWIRE_ALLREDUCE_ALGO`,
//! `PAGEWIRE_BCAST_ALGO`, `PAGEWIRE_ALLGATHER_ALGO` and `PAGEWIRE_REDUCE_SCATTER_ALGO` force
//! one (see `pagewire_collectives::tuning`); the settings are read once, at the first
//! collective.

use std::sync::OnceLock;

use bytemuck::Pod;
use pagewire_collectives::{Element, Group, Operation, Tuning};

use super::{PagewireComm, COLLECTIVE_CONTEXT_BIT};
use crate::backend::traits::CollectiveBackend;
use crate::datatype::Count;
use crate::error::{Error, Result};
use crate::ErrorClass;

/// The tuning from the environment, read once per process once it is good; a bad value is
/// its typed error (`InvalidSetting`, naming the variable) at every call.
fn tuning() -> Result<Tuning> {
    static TUNING: OnceLock<Tuning> = OnceLock::new();
    if let Some(t) = TUNING.get() {
        return Ok(*t);
    }
    let t = Tuning::from_env()?;
    Ok(*TUNING.get_or_init(|| t))
}

/// `counts` as element counts; an error (`MPI_ERR_COUNT`) names a negative one.
fn counts(c: &[Count]) -> Result<Vec<usize>> {
    c.iter()
        .map(|&n| {
            usize::try_from(n).map_err(|_| {
                Error::invalid(ErrorClass::Count, format!("negative count {n} in {c:?}"))
            })
        })
        .collect()
}

impl PagewireComm {
    /// Runs `f` on the group of this communicator's ranks (group ranks mapped to world ranks
    /// for a sub-communicator), in its collective context.
    fn on_group<R>(
        &self,
        f: impl FnOnce(&mut Group) -> pagewire_transport::Result<R>,
    ) -> Result<R> {
        self.refuse_on_intercommunicator("a collective")?;
        let tuning = tuning()?;
        let mut p2p = self.universe.p2p.borrow_mut();
        let local = p2p.all_local_among((0..self.size).map(|r| self.world_rank(r)));
        let mut g = Group {
            p2p: &mut p2p,
            context: self.context | COLLECTIVE_CONTEXT_BIT,
            rank: self.rank,
            size: self.size,
            tuning,
            world_ranks: self.world_ranks(),
            local,
        };
        f(&mut g).map_err(Error::from)
    }
}

impl CollectiveBackend for PagewireComm {
    fn barrier(&self) -> Result<()> {
        self.on_group(|g| g.barrier())
    }

    fn broadcast<T: Pod>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        self.on_group(|g| g.bcast(buf, root))
    }

    fn reduce<T: Element, O: Operation<T>>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<&mut [T]>,
        op: &O,
    ) -> Result<()> {
        self.on_group(|g| g.reduce(send, recv, op, root))
    }

    fn all_reduce<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        self.on_group(|g| g.allreduce(send, recv, op))
    }

    fn all_gather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.on_group(|g| g.allgather(send, recv))
    }

    fn all_gather_varcount<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
    ) -> Result<()> {
        let k = self::counts(counts)?;
        self.on_group(|g| g.allgatherv(send, recv, &k))
    }

    fn all_to_all<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.on_group(|g| g.alltoall(send, recv))
    }

    fn all_to_all_varcount<T: Pod>(
        &self,
        send: &[T],
        send_counts: &[Count],
        recv: &mut [T],
        recv_counts: &[Count],
    ) -> Result<()> {
        let (sc, rc) = (counts(send_counts)?, counts(recv_counts)?);
        self.on_group(|g| g.alltoallv(send, &sc, recv, &rc))
    }

    fn gather<T: Pod>(&self, root: usize, send: &[T], recv: Option<&mut [T]>) -> Result<()> {
        self.on_group(|g| g.gather(send, recv, root))
    }

    fn gather_varcount<T: Pod>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<(&mut [T], &[Count])>,
    ) -> Result<()> {
        match recv {
            Some((recv, c)) => {
                let k = counts(c)?;
                self.on_group(|g| g.gatherv(send, Some((recv, &k)), root))
            }
            None => self.on_group(|g| g.gatherv(send, None, root)),
        }
    }

    fn scatter<T: Pod>(&self, root: usize, send: Option<&[T]>, recv: &mut [T]) -> Result<()> {
        self.on_group(|g| g.scatter(send, recv, root))
    }

    fn scatter_varcount<T: Pod>(
        &self,
        root: usize,
        send: Option<(&[T], &[Count])>,
        recv: &mut [T],
    ) -> Result<()> {
        match send {
            Some((send, c)) => {
                let k = counts(c)?;
                self.on_group(|g| g.scatterv(Some((send, &k)), recv, root))
            }
            None => self.on_group(|g| g.scatterv(None, recv, root)),
        }
    }

    fn reduce_scatter_block<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<()> {
        self.on_group(|g| g.reduce_scatter_block(send, recv, op))
    }

    fn reduce_scatter<T: Element, O: Operation<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
        op: &O,
    ) -> Result<()> {
        let k = self::counts(counts)?;
        self.on_group(|g| g.reduce_scatter(send, recv, &k, op))
    }

    fn scan<T: Element, O: Operation<T>>(&self, send: &[T], recv: &mut [T], op: &O) -> Result<()> {
        self.on_group(|g| g.scan(send, recv, op))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_must_not_be_negative() {
        assert!(counts(&[1, -2]).is_err());
        assert_eq!(counts(&[3, 0]).unwrap(), vec![3, 0]);
    }
}
