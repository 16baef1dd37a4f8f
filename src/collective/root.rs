//! Rooted collectives ([`Root`], rsmpi's `Root`): broadcast, reduce, gather(v) and
//! scatter(v), called on the root process of a communicator by every rank.

use pagewire_collectives::{Element, Operation};

use crate::backend::CollectiveBackend;
use crate::datatype::{Buffer, BufferMut, Count};
use crate::error::{fatal, Error, Result};
use crate::topology::communicator::Process;
use crate::topology::{Communicator, Rank};

/// Rooted collectives, called on the root process of the communicator by every rank
/// (rsmpi's `Root`): `world.process_at_rank(root).broadcast_into(&mut buf)`. The root calls
/// the `_root` variants, the others the plain ones; a non-root that calls a `_root`
/// variant takes part normally and then gets an error.
pub trait Root {
    /// The root's rank.
    fn root_rank(&self) -> Rank;

    /// Copies the root's `buf` into every rank's `buf` (`MPI_Bcast`); panics on error.
    fn broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) {
        fatal(self.try_broadcast_into(buf))
    }
    /// Contributes `send` to a reduction at the root (`MPI_Reduce`, non-root side);
    /// panics on error.
    fn reduce_into<S, O>(&self, send: &S, op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        O: Operation<S::Item>,
    {
        fatal(self.try_reduce_into(send, op))
    }
    /// Combines every rank's `send` into `recv` (`MPI_Reduce`, root side); panics on error.
    fn reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O)
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        fatal(self.try_reduce_into_root(send, recv, op))
    }
    /// Sends `send` to the root's gather (`MPI_Gather`, non-root side); panics on error.
    fn gather_into<S: Buffer + ?Sized>(&self, send: &S) {
        fatal(self.try_gather_into(send))
    }
    /// Gathers every rank's `send` into `recv` in rank order (`MPI_Gather`, root side);
    /// panics on error.
    fn gather_into_root<S, R>(&self, send: &S, recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_gather_into_root(send, recv))
    }
    /// Sends `send` to the root's gatherv (`MPI_Gatherv`, non-root side); panics on error.
    fn gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) {
        fatal(self.try_gather_varcount_into(send))
    }
    /// Gathers rank `j`'s `counts[j]` elements into `recv`, packed in rank order
    /// (`MPI_Gatherv`, root side); panics on error.
    fn gather_varcount_into_root<S, R>(&self, send: &S, recv: &mut R, counts: &[Count])
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_gather_varcount_into_root(send, recv, counts))
    }
    /// Receives this rank's block of the root's scatter (`MPI_Scatter`, non-root side);
    /// panics on error.
    fn scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) {
        fatal(self.try_scatter_into(recv))
    }
    /// Scatters `send` (`size · recv.len()` elements) in rank order (`MPI_Scatter`, root
    /// side); panics on error.
    fn scatter_into_root<S, R>(&self, send: &S, recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_scatter_into_root(send, recv))
    }
    /// Receives this rank's block of the root's scatterv (`MPI_Scatterv`, non-root side);
    /// panics on error.
    fn scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) {
        fatal(self.try_scatter_varcount_into(recv))
    }
    /// Scatters `counts[j]` elements of `send` (packed in rank order) to rank `j`
    /// (`MPI_Scatterv`, root side); panics on error.
    fn scatter_varcount_into_root<S, R>(&self, send: &S, counts: &[Count], recv: &mut R)
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        fatal(self.try_scatter_varcount_into_root(send, counts, recv))
    }

    /// [`Root::broadcast_into`], returning errors.
    fn try_broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()>;
    /// [`Root::reduce_into`], returning errors.
    fn try_reduce_into<S, O>(&self, send: &S, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        O: Operation<S::Item>;
    /// [`Root::reduce_into_root`], returning errors.
    fn try_reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>;
    /// [`Root::gather_into`], returning errors.
    fn try_gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()>;
    /// [`Root::gather_into_root`], returning errors.
    fn try_gather_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`Root::gather_varcount_into`], returning errors.
    fn try_gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()>;
    /// [`Root::gather_varcount_into_root`], returning errors.
    fn try_gather_varcount_into_root<S, R>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`Root::scatter_into`], returning errors.
    fn try_scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()>;
    /// [`Root::scatter_into_root`], returning errors.
    fn try_scatter_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
    /// [`Root::scatter_varcount_into`], returning errors.
    fn try_scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()>;
    /// [`Root::scatter_varcount_into_root`], returning errors.
    fn try_scatter_varcount_into_root<S, R>(
        &self,
        send: &S,
        counts: &[Count],
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized;
}

impl Process<'_> {
    /// The root as a group rank, or `NoSuchRank`.
    fn root(&self) -> Result<usize> {
        if self.rank < 0 || self.rank >= self.comm.size() {
            return Err(Error::NoSuchRank {
                rank: self.rank.max(0) as usize,
                size: self.comm.size() as usize,
            });
        }
        Ok(self.rank as usize)
    }

    /// After a `_root` variant on a rank that is not the root: the call took part, but
    /// the caller mixed the variants up.
    fn must_be_root(&self, what: &str) -> Result<()> {
        let me = self.comm.rank();
        if me != self.rank {
            return Err(Error::InvalidArgument(format!(
                "rank {me} called {what} but the root is rank {}; non-roots call the variant \
                 without `_root`",
                self.rank
            )));
        }
        Ok(())
    }
}

impl Root for Process<'_> {
    fn root_rank(&self) -> Rank {
        self.rank
    }

    fn try_broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        let root = self.root()?;
        self.comm.backend().broadcast(root, buf.as_items_mut())
    }

    fn try_reduce_into<S, O>(&self, send: &S, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        O: Operation<S::Item>,
    {
        let root = self.root()?;
        self.comm.backend().reduce(root, send.as_items(), None, &op)
    }

    fn try_reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        S::Item: Element,
        R: BufferMut<Item = S::Item> + ?Sized,
        O: Operation<S::Item>,
    {
        let root = self.root()?;
        let recv = Some(recv.as_items_mut());
        self.comm
            .backend()
            .reduce(root, send.as_items(), recv, &op)?;
        self.must_be_root("reduce_into_root")
    }

    fn try_gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        self.comm.backend().gather(root, send.as_items(), None)
    }

    fn try_gather_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let recv = Some(recv.as_items_mut());
        self.comm.backend().gather(root, send.as_items(), recv)?;
        self.must_be_root("gather_into_root")
    }

    fn try_gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let root = self.root()?;
        self.comm
            .backend()
            .gather_varcount(root, send.as_items(), None)
    }

    fn try_gather_varcount_into_root<S, R>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Count],
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let recv = Some((recv.as_items_mut(), counts));
        self.comm
            .backend()
            .gather_varcount(root, send.as_items(), recv)?;
        self.must_be_root("gather_varcount_into_root")
    }

    fn try_scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        self.comm.backend().scatter(root, None, recv.as_items_mut())
    }

    fn try_scatter_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let send = Some(send.as_items());
        self.comm
            .backend()
            .scatter(root, send, recv.as_items_mut())?;
        self.must_be_root("scatter_into_root")
    }

    fn try_scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let root = self.root()?;
        self.comm
            .backend()
            .scatter_varcount(root, None, recv.as_items_mut())
    }

    fn try_scatter_varcount_into_root<S, R>(
        &self,
        send: &S,
        counts: &[Count],
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut<Item = S::Item> + ?Sized,
    {
        let root = self.root()?;
        let send = Some((send.as_items(), counts));
        self.comm
            .backend()
            .scatter_varcount(root, send, recv.as_items_mut())?;
        self.must_be_root("scatter_varcount_into_root")
    }
}
