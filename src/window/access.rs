//! How an operation reaches a target's part: the target's rank and span checked, access
//! begun and ended (the implicit lock of a dynamic window), the NIC's atomics, data moved
//! in and out through the message layer, and the updates the NIC's atomics cannot make
//! (applied at the target, or under its update mutex).

use std::sync::atomic::Ordering;

use pagewire_collectives::Op;
use pagewire_transport::msg::RemoteAtomic;

use super::memory::ElementBytes;
#[cfg(feature = "mpi")]
use super::{unit_size, Carrier};
use super::{with_layer, Held, Span, Window, UPDATE_MUTEX};
use crate::collective::operation::{combine_bytes, Reduction};
use crate::datatype::{Equivalence, Primitive};
use crate::error::{Error, Result};
use crate::topology::Rank;
use crate::ErrorClass;

impl<T: Equivalence + Send + Sync> Window<T> {
    /// The rank index of `target`, or an error.
    pub(super) fn target(&self, target: Rank) -> Result<usize> {
        usize::try_from(target)
            .ok()
            .filter(|&t| t < self.parts.len())
            .ok_or(Error::NoSuchRank {
                rank: target.max(0) as usize,
                size: self.parts.len(),
            })
    }

    /// Runs `f` on where `count` elements from displacement `disp` of `target` lie, once
    /// they are checked to lie in its part (in a region attached there, for a dynamic
    /// window, whose lock is held meanwhile: one taken for this access alone if this rank
    /// holds none on it).
    pub(super) fn access<R>(
        &self,
        target: Rank,
        disp: usize,
        count: usize,
        f: impl FnOnce(Span) -> Result<R>,
    ) -> Result<R> {
        let span = self.span(target, disp, count)?;
        let r = f(span);
        let released = self.end_access(span);
        let r = r?;
        released?;
        Ok(r)
    }

    /// Where `count` elements from displacement `disp` of `target` lie, checked; for a
    /// dynamic window with the target's lock held, taken for the access if this rank holds
    /// none ([`Held::Implicit`]; [`Window::end_access`] gives it back).
    pub(super) fn span(&self, target: Rank, disp: usize, count: usize) -> Result<Span> {
        let t = self.begin_access(target)?;
        let unit = self.disp_unit() as u64;
        let at = (disp as u64).saturating_mul(unit);
        let len = (count as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        let span = self.byte_span(t, at, len);
        if span.is_err() {
            let _ = self.end_access_to(t);
        }
        span
    }

    /// Begins an access to `target`: checks that no local access borrows its part, and on
    /// a dynamic window holds its lock (taken for the access if this rank holds none; end
    /// it with [`Window::end_access_to`]). The target's index.
    pub(super) fn begin_access(&self, target: Rank) -> Result<usize> {
        let t = self.target(target)?;
        if self.local_open.get() == Some(t) {
            return Err(Error::WindowSync(
                "a one-sided operation on this rank's own part inside a local access to it \
                 (with_local/with_local_mut hold references to it)"
                    .into(),
            ));
        }
        if self.dynamic.is_some() {
            let held = self.held.borrow()[t];
            match held {
                Held::None => {
                    self.acquire(t, Held::Shared)?;
                    self.held.borrow_mut()[t] = Held::Implicit(1);
                }
                Held::Implicit(n) => self.held.borrow_mut()[t] = Held::Implicit(n + 1),
                Held::Shared | Held::Exclusive => {}
            }
        }
        Ok(t)
    }

    /// Where `len` bytes from byte `at` of target `t`'s part lie (`at` counts from the
    /// part's element 0; in a dynamic window it is an address), checked.
    pub(super) fn byte_span(&self, t: usize, at: u64, len: u64) -> Result<Span> {
        match &self.dynamic {
            Some(dynamic) => self.dynamic_span(dynamic, t, at, len),
            None => self.static_span(t, at, len),
        }
    }

    /// Ends an access [`Window::span`] began: gives back a lock taken for it alone.
    pub(super) fn end_access(&self, span: Span) -> Result<()> {
        if self.dynamic.is_some() {
            self.end_access_to(span.target)
        } else {
            Ok(())
        }
    }

    pub(super) fn end_access_to(&self, t: usize) -> Result<()> {
        let held = self.held.borrow()[t];
        match held {
            Held::Implicit(1) => {
                self.held.borrow_mut()[t] = Held::Shared;
                self.release(t)
            }
            Held::Implicit(n) => {
                self.held.borrow_mut()[t] = Held::Implicit(n - 1);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Where `len` bytes from byte `offset` of target `t`'s part lie, once checked to
    /// lie in the part.
    pub(super) fn static_span(&self, t: usize, offset: u64, len: u64) -> Result<Span> {
        let part = self.parts[t];
        let end = offset.saturating_add(len);
        if end > part.bytes || (len > 0 && offset >= part.bytes) {
            return Err(Error::OutOfWindow {
                target: t,
                offset,
                end,
                window_bytes: part.bytes,
            });
        }
        Ok(Span {
            target: t,
            world: part.world,
            at: part.base + offset,
            rkey: part.memory.rkey,
        })
    }

    /// Runs atomics on the words of world rank `world` under `rkey`.
    pub(super) fn atomics(
        &self,
        world: usize,
        rkey: u32,
        ops: &[(u64, RemoteAtomic)],
    ) -> Result<Vec<u64>> {
        with_layer(&self.comm, |p2p| p2p.rma_atomics(world, rkey, ops))
    }

    /// Runs atomics on words of the part where `s` lies (addresses in the target's address
    /// space): the NIC's, or the CPU's locked instructions on a shared-memory window's
    /// mapping (where every rank's updates of the part are the CPU's, so they are atomic
    /// with each other).
    pub(super) fn data_atomics(&self, s: Span, ops: &[(u64, RemoteAtomic)]) -> Result<Vec<u64>> {
        let Some(shared) = &self.shared else {
            return self.atomics(s.world, s.rkey, ops);
        };
        let base = self.parts[s.target].base;
        Ok(ops
            .iter()
            .map(|&(at, op)| {
                let word = shared.word(s.target, (at - base) as usize);
                match op {
                    RemoteAtomic::FetchAdd { add } => word.fetch_add(add, Ordering::SeqCst),
                    RemoteAtomic::CmpSwap { compare, swap } => word
                        .compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst)
                        .unwrap_or_else(|old| old),
                }
            })
            .collect())
    }

    /// Writes `src` where `s` lies: stores into a shared-memory window's mapping, else an
    /// RDMA WRITE.
    pub(super) fn move_out(&self, s: Span, src: &[u8]) -> Result<()> {
        match &self.shared {
            Some(shared) => {
                let offset = (s.at - self.parts[s.target].base) as usize;
                shared.write(s.target, offset, src);
                Ok(())
            }
            None => with_layer(&self.comm, |p2p| p2p.put(s.world, s.at, s.rkey, src)),
        }
    }

    /// Reads into `dst` from where `s` lies: loads from a shared-memory window's mapping,
    /// else an RDMA READ.
    pub(super) fn move_in(&self, s: Span, dst: &mut [u8]) -> Result<()> {
        match &self.shared {
            Some(shared) => {
                let offset = (s.at - self.parts[s.target].base) as usize;
                shared.read(s.target, offset, dst);
                Ok(())
            }
            None => with_layer(&self.comm, |p2p| p2p.get(s.world, s.at, s.rkey, dst)),
        }
    }

    /// Combines `origin` (the bytes of `count` elements) into `target`'s part from
    /// element `disp` with `op`; the elements' bytes before.
    pub(super) fn update(
        &self,
        target: Rank,
        disp: usize,
        op: Op,
        origin: &[u8],
        result: Option<&mut [u8]>,
    ) -> Result<()> {
        let count = origin.len() / std::mem::size_of::<T>().max(1);
        let unit = self.operation_unit(op)?;
        self.access(target, disp, count, |s| {
            self.update_span(s, unit, op, origin, result)
        })
    }

    /// The primitive `op` combines, once checked to be defined for the elements (bitwise on
    /// floats is not): refused before anything moves, on either carrier.
    pub(super) fn operation_unit(&self, op: Op) -> Result<Primitive> {
        let unit = self.primitive(op)?;
        if !op.is_one_sided_only() {
            combine_bytes(&self.map, Reduction::System(op), &[])?;
        }
        Ok(unit)
    }

    /// Combines `origin` into where `s` lies with `op`, each element atomically; the
    /// elements' bytes before into `result`.
    pub(super) fn update_span(
        &self,
        s: Span,
        unit: Primitive,
        op: Op,
        origin: &[u8],
        result: Option<&mut [u8]>,
    ) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let (Carrier::HostMpi(w), None) = (&self.carrier, &self.shared) {
            let unit_bytes = unit_size(unit);
            return w.accumulate(
                (s.target as Rank, s.at - self.parts[s.target].base),
                (unit, unit_bytes),
                op,
                origin,
                result,
            );
        }
        let old = self.update_nic(s, unit, op, origin)?;
        if let Some(result) = result {
            result.copy_from_slice(&old);
        }
        Ok(())
    }

    /// The proof that elements are their bytes, or why `what` needs it.
    pub(super) fn gapless(&self, what: &str) -> Result<&ElementBytes<T>> {
        self.bytes.as_ref().ok_or_else(|| {
            Error::invalid(
                ErrorClass::Type,
                format!(
                    "{what} on a window of {}, a type with gaps: put, get and accumulate move its \
                 blocks, the other operations need a type without gaps",
                    std::any::type_name::<T>()
                ),
            )
        })
    }

    /// The one primitive the elements are made of, for `op`.
    pub(super) fn primitive(&self, op: Op) -> Result<Primitive> {
        self.map.primitive().ok_or_else(|| {
            Error::invalid(
                ErrorClass::Type,
                format!(
                    "{} needs a datatype made of one primitive type (a number or bool)",
                    op.mpi_name()
                ),
            )
        })
    }

    /// [`Window::update`] on the NIC: the elements' bytes before.
    pub(super) fn update_nic(
        &self,
        s: Span,
        unit: Primitive,
        op: Op,
        origin: &[u8],
    ) -> Result<Vec<u8>> {
        let at = s.at;
        // Sums and reads of 64-bit integers are the NIC's fetch-and-add, word by word.
        if matches!(unit, Primitive::I64 | Primitive::U64)
            && matches!(op, Op::Sum | Op::NoOp)
            && at % 8 == 0
        {
            let ops: Vec<(u64, RemoteAtomic)> = origin
                .chunks_exact(8)
                .enumerate()
                .map(|(i, v)| {
                    let add = match op {
                        Op::Sum => u64::from_ne_bytes(v.try_into().expect("8 bytes")),
                        _ => 0,
                    };
                    (at + 8 * i as u64, RemoteAtomic::FetchAdd { add })
                })
                .collect();
            let old = self.data_atomics(s, &ops)?;
            return Ok(old.iter().flat_map(|w| w.to_ne_bytes()).collect());
        }
        if let Some(before) = self.update_by_target(s, op, origin)? {
            return Ok(before);
        }
        let map = &self.map;
        let mut combine = |current: &[u8]| -> Result<Vec<u8>> {
            match op {
                Op::Replace => Ok(origin.to_vec()),
                Op::NoOp => Ok(current.to_vec()),
                _ => combine_bytes(map, Reduction::System(op), &[origin, current]),
            }
        };
        self.update_under_mutex(s, origin.len(), &mut combine)
    }

    /// Updates `len` bytes where `s` lies to `combine(current)` under the target's update
    /// mutex (a word of its control page taken with `CMP_SWAP`): a get, the combination
    /// here, a put, the mutex given back; the bytes before.
    pub(super) fn update_under_mutex(
        &self,
        s: Span,
        len: usize,
        combine: &mut dyn FnMut(&[u8]) -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        while self.control_cas(s.target, UPDATE_MUTEX, 0, 1)? != 0 {
            self.progress_while_waiting()?;
            std::thread::yield_now();
        }
        let result = (|| {
            let mut current = vec![0u8; len];
            self.move_in(s, &mut current)?;
            let new = combine(&current)?;
            self.move_out(s, &new)?;
            Ok(current)
        })();
        self.control_add(s.target, UPDATE_MUTEX, u64::MAX)?;
        result
    }
}
