//! Shared-memory windows (`MPI_Win_allocate_shared`, `MPI_Win_shared_query`): the ranks of
//! one host allocate their parts one after the other in one segment of `/dev/shm` that
//! every rank maps, so each reads and writes every part with loads and stores; the
//! window's operations work on it as on any window: put and get as loads and stores into
//! the mapping, fetch-and-op and compare-and-swap as the CPU's locked instructions.

use std::sync::atomic::{AtomicU64, Ordering};

use pagewire_transport::sys::{HostKey, SharedSegment, HOST_KEY_BYTES};

use super::create::WindowKind;
use super::memory::{shared_segment_bytes, SharedParts};
use super::{Held, Window};
use crate::backend::CommunicatorBackend;
use crate::collective::{CommunicatorCollectives, Root};
use crate::datatype::Equivalence;
use crate::error::{fatal, Error, Result};
use crate::topology::{Communicator, Rank};
use crate::ErrorClass;

/// Bytes of a segment's name, as rank 0 broadcasts it.
const NAME_BYTES: usize = 128;

/// Segments this process made, for unique names.
static SEGMENTS: AtomicU64 = AtomicU64::new(0);

/// Where rank `rank`'s part of a shared-memory window lies in this process
/// (`MPI_Win_shared_query`): for code that reads and writes it through the pointer itself
/// (`unsafe`, under the window's synchronisation); [`Window::with_shared`] is the safe way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedPart<T> {
    /// Its element 0, mapped in this process.
    pub ptr: *mut T,
    /// Its elements.
    pub len: usize,
    /// Bytes per displacement (one element).
    pub disp_unit: usize,
}

impl<T: Equivalence + Send + Sync> Window<T> {
    /// A window of `count` elements per rank, each `T::default()`, in memory that every
    /// rank of `comm` maps (`MPI_Win_allocate_shared`): the parts lie one after the other.
    /// Every rank of `comm` must be on one host ([`Communicator::split_shared`] makes such
    /// communicators). Collective. Panics on error.
    pub fn allocate_shared<C: Communicator + ?Sized>(count: usize, comm: &C) -> Window<T>
    where
        T: Default + Clone,
    {
        fatal(Self::try_allocate_shared(count, comm))
    }

    /// [`Window::allocate_shared`], returning errors: ranks on more than one host, or no
    /// room in `/dev/shm`.
    pub fn try_allocate_shared<C: Communicator + ?Sized>(
        count: usize,
        comm: &C,
    ) -> Result<Window<T>>
    where
        T: Default + Clone,
    {
        let size = comm.size() as usize;
        let me = comm.rank() as usize;
        let mut key = Vec::with_capacity(HOST_KEY_BYTES);
        HostKey::here().encode(&mut key);
        let mut keys = vec![0u8; HOST_KEY_BYTES * size];
        comm.try_all_gather_into(&key[..], &mut keys[..])?;
        if let Some(other) = keys
            .chunks_exact(HOST_KEY_BYTES)
            .position(|k| k != &keys[..HOST_KEY_BYTES])
        {
            return Err(Error::invalid(
                ErrorClass::Comm,
                format!(
                "allocate_shared needs every rank of the communicator on one host; ranks 0 and \
                 {other} are on different hosts (split the communicator with split_shared \
                 first)"
            ),
            ));
        }
        let mut counts = vec![0u64; size];
        comm.try_all_gather_into(&(count as u64), &mut counts[..])?;
        let counts: Vec<usize> = counts.iter().map(|&n| n as usize).collect();
        let segment_bytes = shared_segment_bytes::<T>(&counts).next_multiple_of(4096);
        // Rank 0 makes the segment, the others map it; its name goes once all have.
        let root = comm.process_at_rank(0);
        let mut name = [0u8; NAME_BYTES];
        let made = if me == 0 {
            let job = comm.as_simple().backend().bootstrap().job_id().to_string();
            let n = format!(
                "{}win-{}-{}",
                pagewire_transport::boot::shm_prefix(&job),
                std::process::id(),
                SEGMENTS.fetch_add(1, Ordering::Relaxed)
            );
            name[..n.len()].copy_from_slice(n.as_bytes());
            Some(SharedSegment::create(&n, segment_bytes))
        } else {
            None
        };
        // Every rank learns whether it worked (an empty name: it did not).
        if matches!(made, Some(Err(_))) {
            name = [0u8; NAME_BYTES];
        }
        root.try_broadcast_into(&mut name[..])?;
        let len = name.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
        let segment = match made {
            Some(made) => made?,
            None if len == 0 => {
                return Err(Error::InvalidArgument(
                    "allocate_shared: rank 0 could not make the shared segment".into(),
                ))
            }
            None => {
                // Rank 0 wrote the name with `format!`: always UTF-8.
                let name = std::str::from_utf8(&name[..len]).map_err(|_| {
                    Error::Internal("allocate_shared: a garbled segment name".into())
                })?;
                SharedSegment::open(name)?
            }
        };
        comm.try_barrier()?;
        segment.unlink_name();
        let parts = SharedParts::new(segment, &counts, me, T::default());
        let mut window = Self::build(comm, parts.own_memory(me), WindowKind::Shared)?;
        window.shared = Some(parts);
        Ok(window)
    }

    /// Whether this is a shared-memory window ([`Window::allocate_shared`]).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Where rank `rank`'s part lies in this process (`MPI_Win_shared_query`). An error if
    /// the window is not a shared-memory window or the rank is not in it.
    pub fn shared_query(&self, rank: Rank) -> Result<SharedPart<T>> {
        let t = self.target(rank)?;
        let parts = self.shared_parts()?;
        let (addr, len) = parts.part(t);
        Ok(SharedPart {
            ptr: addr as *mut T,
            len,
            disp_unit: std::mem::size_of::<T>(),
        })
    }

    /// Runs `f` on rank `rank`'s part of a shared-memory window, read with loads. Holds
    /// `rank`'s lock shared meanwhile (unless this rank holds a lock on it already). Panics
    /// on error.
    pub fn with_shared<R>(&self, rank: Rank, f: impl FnOnce(&[T]) -> R) -> R {
        fatal(self.try_with_shared(rank, f))
    }

    /// [`Window::with_shared`], returning errors.
    pub fn try_with_shared<R>(&self, rank: Rank, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let t = self.target(rank)?;
        let parts = self.shared_parts()?;
        self.load_store_access(t, Held::Shared, || parts.with_part(t, f))
    }

    /// Runs `f` on rank `rank`'s part of a shared-memory window, to change it with stores.
    /// Holds `rank`'s lock exclusively meanwhile (unless this rank holds a lock on it
    /// already). Panics on error.
    pub fn with_shared_mut<R>(&self, rank: Rank, f: impl FnOnce(&mut [T]) -> R) -> R {
        fatal(self.try_with_shared_mut(rank, f))
    }

    /// [`Window::with_shared_mut`], returning errors.
    pub fn try_with_shared_mut<R>(&self, rank: Rank, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        let t = self.target(rank)?;
        let parts = self.shared_parts()?;
        self.load_store_access(t, Held::Exclusive, || parts.with_part_mut(t, f))
    }

    fn shared_parts(&self) -> Result<&SharedParts<T>> {
        self.shared.as_ref().ok_or_else(|| {
            Error::invalid(
                ErrorClass::Win,
                "load/store access to peers' parts needs a shared-memory window \
                 (Window::allocate_shared)",
            )
        })
    }
}
