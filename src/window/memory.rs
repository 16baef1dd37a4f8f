//! A window's local memory and the byte views of element slices: the window module's only
//! `unsafe`.
//!
//! The memory is a `Vec<T>` taken apart into its raw parts, or a slice borrowed for the
//! window's life (`Window::create`), so that no Rust reference to it lives while peers'
//! NICs write it; references exist only inside
//! [`WindowMemory::with_local`] and [`WindowMemory::with_local_mut`], whose callers hold
//! the window's lock on this rank's part for that time (see the module `window`).
#![allow(unsafe_code)]

use std::marker::PhantomData;

use pagewire_transport::sys::SharedSegment;

use crate::datatype::{Equivalence, TypeMap, UncommittedDatatype};
use crate::error::{Error, Result};
use crate::ErrorClass;

/// The elements of a window on this rank (or of one region attached to a dynamic window).
pub(crate) struct WindowMemory<T> {
    ptr: *mut T,
    len: usize,
    /// The capacity of the `Vec<T>` this owns; `None` for a borrowed slice, which the
    /// window's creator keeps borrowed until the window is gone.
    capacity: Option<usize>,
}

// SAFETY: the memory is owned as a `Vec<T>` would own it, or borrowed mutably for the
// window's life as `&mut [T]` would be; `T: Send` moves with it.
unsafe impl<T: Send> Send for WindowMemory<T> {}
// SAFETY: shared access only hands out `&[T]` inside `with_local` (needs `T: Sync`), and
// `&mut [T]` inside `with_local_mut`, whose callers serialise them with the window's lock.
unsafe impl<T: Sync> Sync for WindowMemory<T> {}

impl<T> WindowMemory<T> {
    /// Takes over `data`'s buffer.
    pub(crate) fn new(data: Vec<T>) -> WindowMemory<T> {
        let mut data = std::mem::ManuallyDrop::new(data);
        WindowMemory {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            capacity: Some(data.capacity()),
        }
    }

    /// Stands for `data`, which the caller keeps borrowed for as long as this lives (the
    /// window of `Window::create` lives inside the call that borrows it).
    pub(crate) fn borrowed(data: &mut [T]) -> WindowMemory<T> {
        WindowMemory {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            capacity: None,
        }
    }

    /// Gives back the `Vec<T>` [`WindowMemory::new`] took over (an empty one if this was
    /// borrowed).
    pub(crate) fn into_vec(self) -> Vec<T> {
        let this = std::mem::ManuallyDrop::new(self);
        match this.capacity {
            // SAFETY: the parts of the `Vec<T>` taken apart in `new`, put back once (the
            // `ManuallyDrop` keeps `drop` from doing it a second time).
            Some(capacity) => unsafe { Vec::from_raw_parts(this.ptr, this.len, capacity) },
            None => Vec::new(),
        }
    }

    /// Address of element 0.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Runs `f` on the elements. The caller holds this rank's window lock (shared at least),
    /// so no peer writes them meanwhile.
    pub(crate) fn with_local<R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        // SAFETY: `ptr`/`len` come from a live `Vec<T>` this owns, or from a slice borrowed
        // for as long as this lives (`borrowed`); the caller's lock keeps
        // peers' writes out for the closure's duration, and the slice does not outlive it.
        f(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Runs `f` on the elements, to change them. The caller holds this rank's window lock
    /// exclusively, and `&self` cannot give out another slice meanwhile (the caller's lock
    /// state refuses a second local access while one is open).
    pub(crate) fn with_local_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> R {
        // SAFETY: as for `with_local`, with the exclusive lock: no other reader or writer,
        // local or remote, while the closure runs.
        f(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }
}

impl<T> WindowMemory<T> {
    /// The bytes of the elements as the target's progress engine updates them
    /// (`active.rs`). The window stops that engine's handler before this memory goes (its
    /// free), so the writer never outlives it.
    pub(crate) fn part_writer(&self) -> PartWriter {
        PartWriter {
            ptr: self.ptr.cast(),
            len: self.len * std::mem::size_of::<T>(),
        }
    }
}

/// This rank's part of a window as bytes, for the progress engine that applies origins'
/// accumulates to it (`active.rs`): valid while the window lives, which stops that engine
/// before its memory goes.
pub(crate) struct PartWriter {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer names memory the window owns (or borrows) for its whole life; the
// writer moves with the message layer's handler, which runs on the thread that drives the
// window (the message layer belongs to one thread at a time).
unsafe impl Send for PartWriter {}

impl PartWriter {
    /// Runs `f` on bytes `[offset, offset + len)` of the part; `None` if they lie outside
    /// it. The caller has checked that no local access holds references to the part (its
    /// flag) and holds the part's update mutex, so nothing else in this process reads or
    /// writes those bytes meanwhile; peers' NICs write them only in epochs that MPI keeps
    /// apart from accumulates to the same bytes.
    pub(crate) fn update<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above) of memory that lives as long as the writer
        // (see the type); no reference to it exists meanwhile (see above), and the slice
        // does not outlive the call.
        Some(f(unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add(offset), len)
        }))
    }
}

impl<T> Drop for WindowMemory<T> {
    fn drop(&mut self) {
        if let Some(capacity) = self.capacity {
            // SAFETY: the parts of the `Vec<T>` taken apart in `new`, put back once.
            drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, capacity) });
        }
    }
}

/// The parts of a shared-memory window (`Window::allocate_shared`) as this rank maps them:
/// every rank's part lies in one segment of `/dev/shm` that every rank of the window maps,
/// one after the other, and after them every rank's control words (its lock and its
/// update mutex), [`CONTROL_SLOT`] bytes each.
pub(crate) struct SharedParts<T> {
    segment: SharedSegment,
    /// By rank: the first element's byte offset in the segment, and the elements.
    parts: Vec<(usize, usize)>,
    /// Byte offset of rank 0's control words.
    controls: usize,
    _elements: PhantomData<fn() -> T>,
}

/// Bytes of one rank's control words in a shared segment (a cache line).
pub(crate) const CONTROL_SLOT: usize = 64;

/// Bytes a shared segment needs for parts of `counts` elements of `T` and their ranks'
/// control words.
pub(crate) fn shared_segment_bytes<T>(counts: &[usize]) -> usize {
    let parts: usize = counts.iter().sum::<usize>() * std::mem::size_of::<T>();
    parts.next_multiple_of(CONTROL_SLOT) + counts.len() * CONTROL_SLOT
}

impl<T> SharedParts<T> {
    /// The parts of `counts` elements, one after the other in `segment`, which must hold
    /// them all; this rank's (`me`) filled with `value`.
    pub(crate) fn new(segment: SharedSegment, counts: &[usize], me: usize, value: T) -> Self
    where
        T: Clone,
    {
        let size = std::mem::size_of::<T>();
        let mut at = 0;
        let parts: Vec<(usize, usize)> = counts
            .iter()
            .map(|&n| {
                let part = (at, n);
                at += n * size;
                part
            })
            .collect();
        let controls = at.next_multiple_of(CONTROL_SLOT);
        assert!(
            controls + counts.len() * CONTROL_SLOT <= segment.len(),
            "the segment holds every part and every control slot"
        );
        let (offset, count) = parts[me];
        let first = segment.addr_of(offset) as *mut T;
        for i in 0..count {
            // SAFETY: in this rank's part of the segment (checked above), aligned (the
            // segment is page-aligned and parts are whole elements apart); nothing else
            // references it yet, and `write` does not read the bytes there.
            unsafe { first.add(i).write(value.clone()) };
        }
        SharedParts {
            segment,
            parts,
            controls,
            _elements: PhantomData,
        }
    }

    /// Address (in this process) of rank `rank`'s element 0, and its elements.
    pub(crate) fn part(&self, rank: usize) -> (u64, usize) {
        let (offset, count) = self.parts[rank];
        (self.segment.addr_of(offset), count)
    }

    /// Copies `src` into rank `rank`'s part from byte `offset` (a put, with stores).
    pub(crate) fn write(&self, rank: usize, offset: usize, src: &[u8]) {
        let at = self.byte_range(rank, offset, src.len());
        // SAFETY: in the mapped segment (checked); no reference to these bytes lives in this
        // process (the window refuses an operation on a part a local access borrows), and
        // what other processes do at the same time is the window's synchronisation, as for
        // a NIC's write.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), at, src.len()) };
    }

    /// Copies `dst.len()` bytes of rank `rank`'s part from byte `offset` into `dst` (a get,
    /// with loads).
    pub(crate) fn read(&self, rank: usize, offset: usize, dst: &mut [u8]) {
        let at = self.byte_range(rank, offset, dst.len());
        // SAFETY: as for `write`, reading.
        unsafe { std::ptr::copy_nonoverlapping(at as *const u8, dst.as_mut_ptr(), dst.len()) };
    }

    /// The 8-byte word at byte `offset` of rank `rank`'s part, as an atomic (an 8-aligned
    /// address), for fetch-and-add and compare-and-swap with the CPU's locked instructions.
    pub(crate) fn word(&self, rank: usize, offset: usize) -> &std::sync::atomic::AtomicU64 {
        let at = self.byte_range(rank, offset, 8);
        assert!(at as usize % 8 == 0, "an aligned word");
        // SAFETY: in the mapped segment and aligned (checked); AtomicU64 has u64's layout,
        // and every process updates the word with atomic instructions.
        unsafe { &*(at as *const std::sync::atomic::AtomicU64) }
    }

    /// Rank `rank`'s control word at byte `word` (0: the lock, 8: the update mutex) of its
    /// slot, as an atomic: every rank updates it with the CPU's locked instructions.
    pub(crate) fn control(&self, rank: usize, word: u64) -> &std::sync::atomic::AtomicU64 {
        assert!(rank < self.parts.len() && word % 8 == 0 && (word as usize) < CONTROL_SLOT);
        let at = self
            .segment
            .addr_of(self.controls + rank * CONTROL_SLOT + word as usize);
        // SAFETY: in the mapped segment (checked at creation), 8-aligned (the slots are
        // 64-byte aligned), u64's layout; only ever accessed atomically.
        unsafe { &*(at as *const std::sync::atomic::AtomicU64) }
    }

    /// The address of bytes `offset..offset+len` of rank `rank`'s part, checked to lie in it.
    fn byte_range(&self, rank: usize, offset: usize, len: usize) -> *mut u8 {
        let (addr, count) = self.part(rank);
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= count * std::mem::size_of::<T>()),
            "bytes within the part (the window checks the range first)"
        );
        (addr as usize + offset) as *mut u8
    }

    /// This rank's part as window memory (the segment outlives it: the window holds both).
    pub(crate) fn own_memory(&self, me: usize) -> WindowMemory<T> {
        let (addr, len) = self.part(me);
        WindowMemory {
            ptr: addr as *mut T,
            len,
            capacity: None,
        }
    }

    /// Runs `f` on rank `rank`'s elements. The caller holds `rank`'s window lock (shared at
    /// least), so no peer writes them meanwhile, and holds no other reference to them.
    pub(crate) fn with_part<R>(&self, rank: usize, f: impl FnOnce(&[T]) -> R) -> R {
        let (addr, len) = self.part(rank);
        // SAFETY: the part lies in the mapped segment (checked at creation), holds `len`
        // valid `T`s (each rank fills its own at creation; peers write only `T`s' bytes),
        // and the caller's lock keeps writers out for the closure's time.
        f(unsafe { std::slice::from_raw_parts(addr as *const T, len) })
    }

    /// Runs `f` on rank `rank`'s elements, to change them. The caller holds `rank`'s lock
    /// exclusively (or one that keeps every other locker out) and no other reference.
    pub(crate) fn with_part_mut<R>(&self, rank: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
        let (addr, len) = self.part(rank);
        // SAFETY: as for `with_part`, with no other reader or writer for the closure's time.
        f(unsafe { std::slice::from_raw_parts_mut(addr as *mut T, len) })
    }
}

// SAFETY: the segment is process-shared memory reached only through the methods above,
// whose callers serialise access with the window's locks; `T: Send` moves with it.
unsafe impl<T: Send> Send for SharedParts<T> {}
// SAFETY: as above; shared references are handed out only under a lock (`T: Sync`).
unsafe impl<T: Sync> Sync for SharedParts<T> {}

/// Proof that `T`'s datatype is one gap-free run of `size_of::<T>()` bytes, so that a
/// slice of `T`s is its bytes: made only by [`ElementBytes::check`].
#[derive(Clone, Copy)]
pub(crate) struct ElementBytes<T>(PhantomData<fn() -> T>);

impl<T: Equivalence> ElementBytes<T> {
    /// The proof for `T` (`None` if its datatype has gaps: padding, or fields left out),
    /// and its datatype; or why a window cannot hold `T`s.
    pub(crate) fn check() -> Result<(Option<ElementBytes<T>>, TypeMap)> {
        let map = T::equivalent_datatype().type_map().clone();
        let size = std::mem::size_of::<T>();
        if map.extent() != size || map.lower_bound() != 0 {
            return Err(Error::invalid(
                ErrorClass::Type,
                format!(
                    "a window of {}: its datatype spans {} bytes from {}, the type {size} from 0; \
                 a window's elements are laid out as the type is",
                    std::any::type_name::<T>(),
                    map.extent(),
                    map.lower_bound()
                ),
            ));
        }
        let gapless = map.is_contiguous() && map.size() == size;
        Ok((gapless.then_some(ElementBytes(PhantomData)), map))
    }

    /// The bytes of `data`.
    pub(crate) fn of<'a>(&self, data: &'a [T]) -> &'a [u8] {
        // SAFETY: the proof says every byte of a `T` is a byte of its datatype's one block:
        // there is no padding, so all are initialised.
        unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
    }

    /// The bytes of `data`, to fill.
    ///
    /// The caller writes only bytes that came from `T` values of the same datatype (a
    /// window's elements), so every `T` stays valid.
    pub(crate) fn of_mut<'a>(&self, data: &'a mut [T]) -> &'a mut [u8] {
        // SAFETY: as for `of`; the bytes written are those of valid `T`s (see above).
        unsafe {
            std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data))
        }
    }
}
