//! The one-sided operations of [`Window`]'s API: put, get, the accumulates, fetch-and-op
//! and compare-and-swap (`MPI_Put` ... `MPI_Compare_and_swap`), each with its `try_` twin.

use pagewire_transport::msg::RemoteAtomic;

#[cfg(feature = "mpi")]
use super::Carrier;
use super::Window;
use crate::collective::SystemOperation;
use crate::datatype::Equivalence;
use crate::error::{fatal, Error, Result};
use crate::topology::Rank;
use crate::ErrorClass;
#[cfg(feature = "mpi")]
use pagewire_collectives::Op;

impl<T: Equivalence + Send + Sync> Window<T> {
    /// Writes `data` into rank `target`'s part from element `target_disp` (`MPI_Put`).
    /// Panics on error.
    pub fn put(&self, target: Rank, target_disp: usize, data: &[T]) {
        fatal(self.try_put(target, target_disp, data))
    }

    /// [`Window::put`], returning errors.
    pub fn try_put(&self, target: Rank, target_disp: usize, data: &[T]) -> Result<()> {
        let Some(bytes) = &self.bytes else {
            return self.try_put_typed(target, target_disp, data, &self.map, data.len());
        };
        let src = bytes.of(data);
        self.access(target, target_disp, data.len(), |s| match &self.carrier {
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) if self.shared.is_none() => {
                w.put(target, s.at - self.parts[s.target].base, src)
            }
            _ => self.move_out(s, src),
        })
    }

    /// Reads `buf.len()` elements of rank `target`'s part from element `target_disp` into
    /// `buf` (`MPI_Get`). Panics on error.
    pub fn get(&self, target: Rank, target_disp: usize, buf: &mut [T]) {
        fatal(self.try_get(target, target_disp, buf))
    }

    /// [`Window::get`], returning errors.
    pub fn try_get(&self, target: Rank, target_disp: usize, buf: &mut [T]) -> Result<()> {
        let count = buf.len();
        let Some(bytes) = &self.bytes else {
            return self.try_get_typed(target, target_disp, buf, &self.map, count);
        };
        let dst = bytes.of_mut(buf);
        self.access(target, target_disp, count, |s| match &self.carrier {
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) if self.shared.is_none() => {
                w.get(target, s.at - self.parts[s.target].base, dst)
            }
            _ => self.move_in(s, dst),
        })
    }

    /// Combines `data` into rank `target`'s part from element `target_disp` with `op`,
    /// element by element, each element atomically (`MPI_Accumulate`). Panics on error.
    pub fn accumulate(&self, target: Rank, target_disp: usize, data: &[T], op: SystemOperation) {
        fatal(self.try_accumulate(target, target_disp, data, op))
    }

    /// [`Window::accumulate`], returning errors.
    pub fn try_accumulate(
        &self,
        target: Rank,
        target_disp: usize,
        data: &[T],
        op: SystemOperation,
    ) -> Result<()> {
        let Some(bytes) = &self.bytes else {
            return self.try_accumulate_typed(
                target,
                target_disp,
                data,
                (&self.map, data.len()),
                op,
            );
        };
        self.update(target, target_disp, op.op(), bytes.of(data), None)
    }

    /// [`Window::accumulate`] that also returns the elements' values before it into
    /// `result` (`MPI_Get_accumulate`; with `SystemOperation::no_op()`, an atomic get).
    /// Panics on error.
    pub fn get_accumulate(
        &self,
        target: Rank,
        target_disp: usize,
        data: &[T],
        result: &mut [T],
        op: SystemOperation,
    ) {
        fatal(self.try_get_accumulate(target, target_disp, data, result, op))
    }

    /// [`Window::get_accumulate`], returning errors.
    pub fn try_get_accumulate(
        &self,
        target: Rank,
        target_disp: usize,
        data: &[T],
        result: &mut [T],
        op: SystemOperation,
    ) -> Result<()> {
        if result.len() != data.len() {
            return Err(Error::invalid(
                ErrorClass::Count,
                format!(
                    "get_accumulate of {} elements into a result of {}",
                    data.len(),
                    result.len()
                ),
            ));
        }
        let bytes = self.gapless("get_accumulate")?;
        let result = bytes.of_mut(result);
        self.update(target, target_disp, op.op(), bytes.of(data), Some(result))
    }

    /// Combines `value` into element `target_disp` of rank `target`'s part with `op`,
    /// atomically, and returns the element's value before (`MPI_Fetch_and_op`). Panics on
    /// error.
    pub fn fetch_and_op(
        &self,
        target: Rank,
        target_disp: usize,
        value: &T,
        op: SystemOperation,
    ) -> T
    where
        T: Copy,
    {
        fatal(self.try_fetch_and_op(target, target_disp, value, op))
    }

    /// [`Window::fetch_and_op`], returning errors.
    pub fn try_fetch_and_op(
        &self,
        target: Rank,
        target_disp: usize,
        value: &T,
        op: SystemOperation,
    ) -> Result<T>
    where
        T: Copy,
    {
        let mut out = [*value];
        self.try_get_accumulate(
            target,
            target_disp,
            std::slice::from_ref(value),
            &mut out,
            op,
        )?;
        Ok(out[0])
    }

    /// Writes `swap` into element `target_disp` of rank `target`'s part if it equals
    /// `compare` (bit for bit), atomically, and returns its value before
    /// (`MPI_Compare_and_swap`). Panics on error.
    pub fn compare_and_swap(&self, target: Rank, target_disp: usize, compare: T, swap: T) -> T
    where
        T: Copy,
    {
        fatal(self.try_compare_and_swap(target, target_disp, compare, swap))
    }

    /// [`Window::compare_and_swap`], returning errors.
    pub fn try_compare_and_swap(
        &self,
        target: Rank,
        target_disp: usize,
        compare: T,
        swap: T,
    ) -> Result<T>
    where
        T: Copy,
    {
        let bytes = self.gapless("compare_and_swap")?;
        let compare = bytes.of(std::slice::from_ref(&compare)).to_vec();
        let swap_bytes = bytes.of(std::slice::from_ref(&swap)).to_vec();
        let mut out = [swap];
        self.access(target, target_disp, 1, |s| {
            #[cfg(feature = "mpi")]
            if let (Carrier::HostMpi(w), None) = (&self.carrier, &self.shared) {
                let unit = self.primitive(Op::Replace)?;
                return w.compare_and_swap(
                    target,
                    s.at - self.parts[s.target].base,
                    unit,
                    &compare,
                    &swap_bytes,
                    bytes.of_mut(&mut out),
                );
            }
            let old = if compare.len() == 8 && s.at % 8 == 0 {
                // One aligned word: the NIC's compare-and-swap.
                let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
                let op = RemoteAtomic::CmpSwap {
                    compare: word(&compare),
                    swap: word(&swap_bytes),
                };
                let old = self.data_atomics(s, &[(s.at, op)])?[0];
                old.to_ne_bytes().to_vec()
            } else if let Some(before) =
                self.compare_and_swap_by_target(s, &compare, &swap_bytes)?
            {
                before
            } else {
                self.update_under_mutex(s, compare.len(), &mut |current| {
                    Ok(if current == compare {
                        swap_bytes.clone()
                    } else {
                        current.to_vec()
                    })
                })?
            };
            bytes.of_mut(&mut out).copy_from_slice(&old);
            Ok(())
        })?;
        Ok(out[0])
    }
}
