//! One-sided operations with datatypes at both ends (`MPI_Put`, `MPI_Get` and
//! `MPI_Accumulate` with an origin and a target datatype): the origin is any buffer (a
//! slice, or a `View` of a derived datatype, of which only the blocks move), and the target
//! layout is `count` elements of a datatype from a displacement, for example a column of
//! a matrix (a vector type).
//!
//! The origin's blocks are packed (put, accumulate) or unpacked (get) at the origin; the
//! target's blocks, adjacent ones merged, are one RDMA operation each, all posted before
//! any is waited for. Every block is checked to lie in the target's part (in an attached
//! region, for a dynamic window) before anything moves. As in MPI, the two sides must move
//! the same bytes (their type signatures match); an accumulate's blocks must hold the
//! window's element type.

use pagewire_collectives::Op;

use super::{with_layer, Carrier, Span, Window};
use crate::collective::SystemOperation;
use crate::datatype::{
    packed, Buffer, BufferMut, Equivalence, Landing, TypeMap, UncommittedDatatype,
};
use crate::error::{fatal, Error, Result};
use crate::topology::Rank;
use crate::ErrorClass;

impl<T: Equivalence + Send + Sync> Window<T> {
    /// Writes the blocks of `origin` into rank `target`'s part, laid out as `target_count`
    /// elements of `target_type` from displacement `target_disp` (`MPI_Put` with both
    /// datatypes). Panics on error.
    pub fn put_typed<B: Buffer + ?Sized>(
        &self,
        target: Rank,
        target_disp: usize,
        origin: &B,
        target_type: &TypeMap,
        target_count: usize,
    ) {
        fatal(self.try_put_typed(target, target_disp, origin, target_type, target_count))
    }

    /// [`Window::put_typed`], returning errors: the type signatures differ
    /// ([`Error::Invalid`], `MPI_ERR_TYPE`), or a block lies outside the target's part
    /// ([`Error::OutOfWindow`], [`Error::NotAttached`]); nothing moved then.
    pub fn try_put_typed<B: Buffer + ?Sized>(
        &self,
        target: Rank,
        target_disp: usize,
        origin: &B,
        target_type: &TypeMap,
        target_count: usize,
    ) -> Result<()> {
        let bytes = packed(origin);
        let runs = target_runs(target_type, target_count, bytes.len())?;
        self.typed_access(target, target_disp, &runs, |spans| {
            let chunks = chunks(&bytes, &runs);
            match &self.carrier {
                _ if self.shared.is_some() => spans
                    .iter()
                    .zip(chunks)
                    .try_for_each(|(&s, src)| self.move_out(s, src)),
                Carrier::Nic { .. } => {
                    let world = spans.first().map_or(0, |s| s.world);
                    let runs: Vec<(u64, u32, &[u8])> = spans
                        .iter()
                        .zip(chunks)
                        .map(|(s, src)| (s.at, s.rkey, src))
                        .collect();
                    with_layer(&self.comm, |p2p| p2p.put_runs(world, &runs))
                }
                #[cfg(feature = "mpi")]
                Carrier::HostMpi(w) => spans
                    .iter()
                    .zip(chunks)
                    .try_for_each(|(s, src)| w.put(target, s.at - self.parts[s.target].base, src)),
            }
        })
    }

    /// Reads rank `target`'s part, laid out as `target_count` elements of `target_type`
    /// from displacement `target_disp`, into the blocks of `origin` (`MPI_Get` with both
    /// datatypes). Panics on error.
    pub fn get_typed<B: BufferMut + ?Sized>(
        &self,
        target: Rank,
        target_disp: usize,
        origin: &mut B,
        target_type: &TypeMap,
        target_count: usize,
    ) {
        fatal(self.try_get_typed(target, target_disp, origin, target_type, target_count))
    }

    /// [`Window::get_typed`], returning errors (as [`Window::try_put_typed`]'s).
    pub fn try_get_typed<B: BufferMut + ?Sized>(
        &self,
        target: Rank,
        target_disp: usize,
        origin: &mut B,
        target_type: &TypeMap,
        target_count: usize,
    ) -> Result<()> {
        let mut landing = Landing::new(origin);
        let mut bytes = vec![0u8; landing.packed_len()];
        let runs = target_runs(target_type, target_count, bytes.len())?;
        self.typed_access(target, target_disp, &runs, |spans| {
            let mut chunks = chunks_mut(&mut bytes, &runs);
            match &self.carrier {
                _ if self.shared.is_some() => spans
                    .iter()
                    .zip(chunks)
                    .try_for_each(|(&s, dst)| self.move_in(s, dst)),
                Carrier::Nic { .. } => {
                    let world = spans.first().map_or(0, |s| s.world);
                    let mut runs: Vec<(u64, u32, &mut [u8])> = spans
                        .iter()
                        .zip(chunks.drain(..))
                        .map(|(s, dst)| (s.at, s.rkey, dst))
                        .collect();
                    with_layer(&self.comm, |p2p| p2p.get_runs(world, &mut runs))
                }
                #[cfg(feature = "mpi")]
                Carrier::HostMpi(w) => spans
                    .iter()
                    .zip(chunks)
                    .try_for_each(|(s, dst)| w.get(target, s.at - self.parts[s.target].base, dst)),
            }
        })?;
        landing.unpack(&bytes);
        Ok(())
    }

    /// Combines the blocks of `origin` with `op` into rank `target`'s part, laid out as
    /// `target_count` elements of `target_type` from displacement `target_disp`
    /// (`MPI_Accumulate` with both datatypes), each element atomically. Both datatypes'
    /// blocks hold the window's element type. Panics on error.
    pub fn accumulate_typed<B: Buffer + ?Sized>(
        &self,
        target: Rank,
        target_disp: usize,
        origin: &B,
        (target_type, target_count): (&TypeMap, usize),
        op: SystemOperation,
    ) {
        fatal(self.try_accumulate_typed(
            target,
            target_disp,
            origin,
            (target_type, target_count),
            op,
        ))
    }

    /// [`Window::accumulate_typed`], returning errors.
    pub fn try_accumulate_typed<B: Buffer + ?Sized>(
        &self,
        target: Rank,
        target_disp: usize,
        origin: &B,
        (target_type, target_count): (&TypeMap, usize),
        op: SystemOperation,
    ) -> Result<()> {
        let op: Op = op.op();
        let unit = self.operation_unit(op)?;
        let datatype = origin.as_datatype();
        for (side, map) in [("origin", datatype.type_map()), ("target", target_type)] {
            if map.size() > 0 && map.primitive() != Some(unit) {
                return Err(Error::invalid(
                    ErrorClass::Type,
                    format!(
                        "{} of a window of {unit:?}: the {side} datatype's blocks hold {:?}",
                        op.mpi_name(),
                        map.primitive()
                    ),
                ));
            }
        }
        let bytes = packed(origin);
        let runs = target_runs(target_type, target_count, bytes.len())?;
        self.typed_access(target, target_disp, &runs, |spans| {
            spans
                .iter()
                .zip(chunks(&bytes, &runs))
                .try_for_each(|(&s, src)| self.update_span(s, unit, op, src, None))
        })
    }

    /// Runs `f` on the spans of `runs` (byte offsets from displacement `disp` of `target`'s
    /// part), each checked, with `target` held as every access holds it.
    fn typed_access<R>(
        &self,
        target: Rank,
        disp: usize,
        runs: &[(i64, usize)],
        f: impl FnOnce(&[Span]) -> Result<R>,
    ) -> Result<R> {
        let t = self.begin_access(target)?;
        let from = disp as u64 * self.disp_unit() as u64;
        let r = runs
            .iter()
            .map(|&(offset, len)| {
                let at = from.checked_add_signed(offset).ok_or(Error::OutOfWindow {
                    target: t,
                    offset: from,
                    end: from,
                    window_bytes: self.parts[t].bytes,
                })?;
                self.byte_span(t, at, len as u64)
            })
            .collect::<Result<Vec<Span>>>()
            .and_then(|spans| f(&spans));
        let ended = self.end_access_to(t);
        let r = r?;
        ended?;
        Ok(r)
    }
}

/// The byte runs (offset from the first element's address, length) of `count` elements of
/// `map`, adjacent ones merged, once their bytes are checked to be `bytes`.
fn target_runs(map: &TypeMap, count: usize, bytes: usize) -> Result<Vec<(i64, usize)>> {
    let total = map.size() * count;
    if total != bytes {
        return Err(Error::invalid(
            ErrorClass::Type,
            format!(
                "the origin moves {bytes} bytes and the target layout ({count} elements of a \
             {}-byte datatype) {total}: the type signatures must match",
                map.size()
            ),
        ));
    }
    let mut runs: Vec<(i64, usize)> = Vec::new();
    for i in 0..count as i64 {
        for b in map.blocks() {
            let at = i * map.extent() as i64 + b.offset as i64;
            match runs.last_mut() {
                Some((start, len)) if *start + *len as i64 == at => *len += b.len,
                _ if b.len > 0 => runs.push((at, b.len)),
                _ => {}
            }
        }
    }
    Ok(runs)
}

/// `bytes` cut into the lengths of `runs`, in order.
fn chunks<'b>(bytes: &'b [u8], runs: &[(i64, usize)]) -> Vec<&'b [u8]> {
    let mut rest = bytes;
    runs.iter()
        .map(|&(_, len)| {
            let (head, tail) = rest.split_at(len);
            rest = tail;
            head
        })
        .collect()
}

/// [`chunks`], to fill.
fn chunks_mut<'b>(bytes: &'b mut [u8], runs: &[(i64, usize)]) -> Vec<&'b mut [u8]> {
    let mut rest = bytes;
    runs.iter()
        .map(|&(_, len)| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            head
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::{Equivalence, UncommittedDatatype, UserDatatype};

    #[test]
    fn a_vector_target_is_one_run_per_block_and_adjacent_blocks_merge() {
        // Three blocks of two f64, four f64 apart.
        let column = UserDatatype::vector(3, 2, 4, &f64::equivalent_datatype());
        let runs = target_runs(column.type_map(), 1, 48).unwrap();
        assert_eq!(runs, vec![(0, 16), (32, 16), (64, 16)]);
        // Blocks of two with a stride of two: one run.
        let dense = UserDatatype::vector(3, 2, 2, &f64::equivalent_datatype());
        assert_eq!(target_runs(dense.type_map(), 2, 96).unwrap(), vec![(0, 96)]);
    }

    #[test]
    fn differing_type_signatures_are_refused() {
        let e = target_runs(f64::equivalent_datatype().type_map(), 3, 16).unwrap_err();
        assert!(e.to_string().contains("type signatures must match"), "{e}");
    }

    #[test]
    fn chunks_follow_the_runs() {
        let bytes: Vec<u8> = (0..10).collect();
        let runs = [(0, 3), (10, 0), (20, 7)];
        assert_eq!(
            chunks(&bytes, &runs),
            vec![&bytes[..3], &[][..], &bytes[3..]]
        );
    }
}
