//! [`HostMpi`]'s collectives: arguments checked on each rank (lengths against counts and
//! the communicator's size, the root's buffer on the root only), then one call of the host
//! MPI library (`ffi.rs`). Data movement goes as bytes, reductions typed.

use bytemuck::Pod;
use pagewire_collectives::{Element, Op};

use super::{ffi, reduction, HostMpi};
use crate::datatype::Count;
use crate::error::{Error, Result};
use crate::ErrorClass;

impl HostMpi {
    // ---- data movement (bytes) ---------------------------------------------------------------

    /// `MPI_Barrier`.
    pub fn barrier(&self) -> Result<()> {
        ffi::barrier(self.coll()?);
        Ok(())
    }

    /// `MPI_Bcast` of `buf` from `root`.
    pub fn broadcast<T: Pod>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        let root = self.peer(root)?;
        ffi::broadcast(self.coll()?, root, bytes_mut(buf));
        Ok(())
    }

    /// `MPI_Allgather`: `recv` holds `size · send.len()` elements, rank `j`'s block at `j`.
    pub fn all_gather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.expect_len("all_gather: recv", recv.len(), send.len() * self.size)?;
        ffi::all_gather(self.coll()?, bytes(send), bytes_mut(recv));
        Ok(())
    }

    /// `MPI_Allgatherv`: rank `j` contributes `counts[j]` elements, packed in rank order.
    pub fn all_gather_varcount<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
    ) -> Result<()> {
        let layout = self.layout::<T>("all_gather_varcount", counts)?;
        self.expect_len(
            "all_gather_varcount: send",
            send.len(),
            layout.elems[self.rank],
        )?;
        self.expect_len("all_gather_varcount: recv", recv.len(), layout.total)?;
        ffi::all_gather_varcount(
            self.coll()?,
            bytes(send),
            bytes_mut(recv),
            &layout.counts,
            &layout.displs,
        );
        Ok(())
    }

    /// `MPI_Alltoall`: block `j` of `send` goes to rank `j`; `recv` gets rank `j`'s block
    /// for this rank at `j`. Both hold `size` equal blocks.
    pub fn all_to_all<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.expect_len("all_to_all: recv", recv.len(), send.len())?;
        if send.len() % self.size != 0 {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: {} elements do not split into {} equal blocks",
                send.len(),
                self.size
            )));
        }
        ffi::all_to_all(self.coll()?, bytes(send), bytes_mut(recv));
        Ok(())
    }

    /// `MPI_Alltoallv`: `send_counts[j]` elements to rank `j`, `recv_counts[j]` from it,
    /// packed in rank order.
    pub fn all_to_all_varcount<T: Pod>(
        &self,
        send: &[T],
        send_counts: &[Count],
        recv: &mut [T],
        recv_counts: &[Count],
    ) -> Result<()> {
        let s = self.layout::<T>("all_to_all_varcount (send)", send_counts)?;
        let r = self.layout::<T>("all_to_all_varcount (recv)", recv_counts)?;
        self.expect_len("all_to_all_varcount: send", send.len(), s.total)?;
        self.expect_len("all_to_all_varcount: recv", recv.len(), r.total)?;
        ffi::all_to_all_varcount(
            self.coll()?,
            (bytes(send), &s.counts, &s.displs),
            (bytes_mut(recv), &r.counts, &r.displs),
        );
        Ok(())
    }

    /// `MPI_Gather` to `root`: `recv` (`Some` at the root only) holds `size · send.len()`
    /// elements.
    pub fn gather<T: Pod>(&self, root: usize, send: &[T], recv: Option<&mut [T]>) -> Result<()> {
        let root = self.root(root, "gather", recv.is_some())?;
        if let Some(recv) = &recv {
            self.expect_len("gather: recv", recv.len(), send.len() * self.size)?;
        }
        ffi::gather(self.coll()?, root, bytes(send), recv.map(bytes_mut));
        Ok(())
    }

    /// `MPI_Gatherv` to `root`: rank `j` sends `counts[j]` elements; `recv` (`Some` at the
    /// root only, with the counts of every rank) gets them packed in rank order.
    pub fn gather_varcount<T: Pod>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<(&mut [T], &[Count])>,
    ) -> Result<()> {
        let root = self.root(root, "gather_varcount", recv.is_some())?;
        match recv {
            Some((recv, counts)) => {
                let layout = self.layout::<T>("gather_varcount", counts)?;
                self.expect_len("gather_varcount: send", send.len(), layout.elems[self.rank])?;
                self.expect_len("gather_varcount: recv", recv.len(), layout.total)?;
                let recv = (bytes_mut(recv), &layout.counts[..], &layout.displs[..]);
                ffi::gather_varcount(self.coll()?, root, bytes(send), Some(recv));
            }
            None => ffi::gather_varcount(self.coll()?, root, bytes(send), None),
        }
        Ok(())
    }

    /// `MPI_Scatter` from `root`: `send` (`Some` at the root only) holds `size · recv.len()`
    /// elements, block `j` for rank `j`.
    pub fn scatter<T: Pod>(&self, root: usize, send: Option<&[T]>, recv: &mut [T]) -> Result<()> {
        let root = self.root(root, "scatter", send.is_some())?;
        let recv = bytes_mut(recv);
        if let Some(send) = send {
            self.expect_len(
                "scatter: send",
                std::mem::size_of_val(send),
                recv.len() * self.size,
            )?;
        }
        ffi::scatter(self.coll()?, root, send.map(bytes), recv);
        Ok(())
    }

    /// `MPI_Scatterv` from `root`: `send` (`Some` at the root only, with the counts of every
    /// rank) holds `counts[j]` elements for rank `j`, packed in rank order.
    pub fn scatter_varcount<T: Pod>(
        &self,
        root: usize,
        send: Option<(&[T], &[Count])>,
        recv: &mut [T],
    ) -> Result<()> {
        let root = self.root(root, "scatter_varcount", send.is_some())?;
        match send {
            Some((send, counts)) => {
                let layout = self.layout::<T>("scatter_varcount", counts)?;
                self.expect_len("scatter_varcount: send", send.len(), layout.total)?;
                self.expect_len(
                    "scatter_varcount: recv",
                    recv.len(),
                    layout.elems[self.rank],
                )?;
                let send = (bytes(send), &layout.counts[..], &layout.displs[..]);
                ffi::scatter_varcount(self.coll()?, root, Some(send), bytes_mut(recv));
            }
            None => ffi::scatter_varcount(self.coll()?, root, None, bytes_mut(recv)),
        }
        Ok(())
    }

    // ---- reductions (typed) -------------------------------------------------------------------

    /// `MPI_Reduce` to `root`: `recv` (`Some` at the root only) gets the element-wise `op`
    /// of every rank's `send`.
    pub fn reduce<T: Element>(
        &self,
        root: usize,
        send: &[T],
        recv: Option<&mut [T]>,
        op: Op,
    ) -> Result<()> {
        let root = self.root(root, "reduce", recv.is_some())?;
        reduction::check::<T>(op)?;
        if let Some(recv) = &recv {
            self.expect_len("reduce: recv", recv.len(), send.len())?;
        }
        ffi::reduce(self.coll()?, root, send, recv, op)
    }

    /// `MPI_Allreduce`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        self.expect_len("all_reduce: recv", recv.len(), send.len())?;
        reduction::check::<T>(op)?;
        ffi::all_reduce(self.coll()?, send, recv, op)
    }

    /// `MPI_Reduce_scatter_block`: `send` holds `size · recv.len()` elements; block `j` of
    /// the reduction lands in `recv` of rank `j`.
    pub fn reduce_scatter_block<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Op,
    ) -> Result<()> {
        self.expect_len(
            "reduce_scatter_block: send",
            send.len(),
            recv.len() * self.size,
        )?;
        reduction::check::<T>(op)?;
        ffi::reduce_scatter_block(self.coll()?, send, recv, op)
    }

    /// `MPI_Reduce_scatter`: `send` holds `Σ counts` elements; block `j` (`counts[j]`
    /// elements, packed in rank order) of the reduction lands in `recv` of rank `j`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[Count],
        op: Op,
    ) -> Result<()> {
        let layout = self.layout::<T>("reduce_scatter", counts)?;
        self.expect_len("reduce_scatter: send", send.len(), layout.total)?;
        self.expect_len("reduce_scatter: recv", recv.len(), layout.elems[self.rank])?;
        reduction::check::<T>(op)?;
        ffi::reduce_scatter(self.coll()?, send, recv, counts, op)
    }

    /// `MPI_Scan`: rank `r` gets the reduction of ranks `0..=r`.
    pub fn scan<T: Element>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        self.expect_len("scan: recv", recv.len(), send.len())?;
        reduction::check::<T>(op)?;
        ffi::scan(self.coll()?, send, recv, op)
    }

    // ---- argument checks -------------------------------------------------------------------

    /// `root` as an MPI rank, checking that exactly the root passed its root-only buffer:
    /// the root without it is `MPI_ERR_BUFFER`, as on pagewire's transport; another rank
    /// with it is an argument error.
    fn root(&self, root: usize, what: &str, has_root_buffer: bool) -> Result<i32> {
        let r = self.peer(root)?;
        let is_root = root == self.rank;
        if is_root && !has_root_buffer {
            return Err(Error::invalid(
                ErrorClass::Buffer,
                format!(
                    "{what}: rank {} is the root ({root}) but did not pass the root's buffer",
                    self.rank
                ),
            ));
        }
        if !is_root && has_root_buffer {
            return Err(Error::InvalidArgument(format!(
                "{what}: rank {} is not the root ({root}) but passed the root's buffer",
                self.rank
            )));
        }
        Ok(r)
    }

    fn expect_len(&self, what: &str, got: usize, want: usize) -> Result<()> {
        if got == want {
            Ok(())
        } else {
            Err(Error::invalid(
                ErrorClass::Count,
                format!(
                    "{what} has {got} elements, expected {want} (rank {} of {})",
                    self.rank, self.size
                ),
            ))
        }
    }

    /// Byte counts and displacements of `counts` elements of `T` per rank, packed.
    fn layout<T>(&self, what: &str, counts: &[Count]) -> Result<Layout> {
        layout(what, counts, self.size, size_of::<T>())
    }
}

/// Per-rank blocks packed in rank order, in bytes for MPI and in elements for the checks.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    counts: Vec<Count>,
    displs: Vec<Count>,
    elems: Vec<usize>,
    total: usize,
}

fn layout(what: &str, counts: &[Count], size: usize, elem: usize) -> Result<Layout> {
    if counts.len() != size {
        return Err(Error::InvalidArgument(format!(
            "{what}: {} counts for {size} ranks",
            counts.len()
        )));
    }
    let too_big = || {
        Error::invalid(
            ErrorClass::Count,
            format!(
                "{what}: counts {counts:?} of {elem}-byte elements exceed MPI's int range in bytes"
            ),
        )
    };
    let mut out = Layout {
        counts: Vec::with_capacity(size),
        displs: Vec::with_capacity(size),
        elems: Vec::with_capacity(size),
        total: 0,
    };
    let mut at = 0usize;
    for &c in counts {
        let n = usize::try_from(c).map_err(|_| {
            Error::invalid(
                ErrorClass::Count,
                format!("{what}: negative count {c} in {counts:?}"),
            )
        })?;
        let b = n.checked_mul(elem).ok_or_else(too_big)?;
        out.displs.push(Count::try_from(at).map_err(|_| too_big())?);
        out.counts.push(Count::try_from(b).map_err(|_| too_big())?);
        out.elems.push(n);
        out.total += n;
        at = at.checked_add(b).ok_or_else(too_big)?;
    }
    Count::try_from(at).map_err(|_| too_big())?;
    Ok(out)
}

fn bytes<T: Pod>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_scale_counts_to_bytes() {
        let l = layout("t", &[1, 0, 3], 3, 8).unwrap();
        assert_eq!(l.counts, vec![8, 0, 24]);
        assert_eq!(l.displs, vec![0, 8, 8]);
        assert_eq!(l.elems, vec![1, 0, 3]);
        assert_eq!(l.total, 4);
    }

    #[test]
    fn layouts_reject_bad_counts() {
        let e = layout("gatherv", &[1, 2], 3, 4).unwrap_err().to_string();
        assert!(e.contains("2 counts for 3 ranks"), "{e}");
        let e = layout("gatherv", &[1, -2], 2, 4).unwrap_err().to_string();
        assert!(e.contains("negative count -2"), "{e}");
        let e = layout("gatherv", &[i32::MAX / 4, i32::MAX / 4], 2, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("int range"), "{e}");
    }
}
