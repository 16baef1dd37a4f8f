//! A dynamic window's side on each rank: attaching and detaching regions, local access to
//! them, and the origin's checks of an access against its copy of the target's table (the
//! table itself is `dynamic.rs`).

use pagewire_transport::sys::AnonMapping;

use super::dynamic::{
    capacity, detach_increment, detaches, entries, header, publish, table_bytes, Attached,
    AttachedRegion, Attachment, RegionView, FIRST_READ_ENTRIES, TABLE_AT,
};
use super::memory::WindowMemory;
use super::{with_layer, word_span, Carrier, DynamicState, Held, Span, Window, LOCK_WORD};
use crate::datatype::Equivalence;
use crate::error::{fatal, Error, Result};
use crate::ErrorClass;

impl<T: Equivalence + Send + Sync> Window<T> {
    /// Attaches `data` to this rank's part of a dynamic window (`MPI_Win_attach`), which
    /// keeps it until [`Window::detach`] gives it back (or the window is freed). Local: peers
    /// may access it once they know its address ([`Attachment::disp`]). In `copy` and
    /// `pindown` the region is registered and pinned now; in `odp` it is covered by the
    /// window's on-demand registration of the whole address space, and its pages are
    /// prefetched for the NIC. Panics on error.
    pub fn attach(&self, data: Vec<T>) -> Attachment {
        fatal(self.try_attach(data))
    }

    /// [`Window::attach`], returning errors: not a dynamic window, an empty region, the
    /// window's table full (2,729 regions per rank), or the registration refused (the
    /// locked-memory limit); `data` is dropped then.
    pub fn try_attach(&self, data: Vec<T>) -> Result<Attachment> {
        let (dynamic, control) = self.dynamic_parts("attach")?;
        if self.local_open.get().is_some() {
            return Err(Error::WindowSync(
                "attach inside a local access to the window".into(),
            ));
        }
        if data.is_empty() {
            return Err(Error::invalid(
                ErrorClass::RmaAttach,
                "attach of an empty region: a dynamic window holds regions of one element or \
                 more",
            ));
        }
        let mut attached = dynamic.attached.borrow_mut();
        if attached.len() == capacity(control.len()) {
            return Err(Error::invalid(ErrorClass::RmaAttach, format!(
                "rank {} has {} regions attached to the window, the most its table holds:                  detach one first",
                self.rank,
                attached.len()
            )));
        }
        let memory = WindowMemory::new(data);
        let len = memory.len();
        let bytes = (len * std::mem::size_of::<T>()) as u64;
        let (lkey, rkey, pinned) = with_layer(&self.comm, |p2p| match dynamic.space {
            Some((lkey, rkey)) => {
                p2p.prefetch_exposed(lkey, memory.addr(), bytes)?;
                Ok((None, rkey, 0))
            }
            None => {
                let (addr, len) = word_span(memory.addr(), bytes);
                let region = p2p.expose(addr, len)?;
                let pinned = if p2p.exposes_on_demand() { 0 } else { len };
                Ok((Some(region.lkey), region.rkey, pinned))
            }
        })?;
        let mut c = self.counters.get();
        if lkey.is_some() {
            c.registered(word_span(memory.addr(), bytes).1, pinned);
        }
        c.attaches += 1;
        self.counters.set(c);
        let id = dynamic.next_id.get();
        dynamic.next_id.set(id + 1);
        let handle = Attachment {
            id,
            address: memory.addr() as usize,
            len,
            element: std::mem::size_of::<T>(),
        };
        attached.push(Attached {
            id,
            region: AttachedRegion {
                addr: memory.addr(),
                len: bytes,
                rkey,
            },
            memory,
            lkey,
            pinned,
        });
        let regions: Vec<AttachedRegion> = attached.iter().map(|a| a.region).collect();
        publish(control, &regions);
        Ok(handle)
    }

    /// Detaches the region `attachment` names (`MPI_Win_detach`) and gives its memory back.
    /// Local; waits while peers hold this rank's lock (every access to a dynamic window
    /// holds its target's lock), so no access is under way when it goes, and peers' later
    /// accesses to it fail at the origin ([`Error::NotAttached`]). Panics on error.
    pub fn detach(&self, attachment: Attachment) -> Vec<T> {
        fatal(self.try_detach(attachment))
    }

    /// [`Window::detach`], returning errors: not a dynamic window, a region of another
    /// window, this rank holding its own lock shared, or inside a local access.
    pub fn try_detach(&self, attachment: Attachment) -> Result<Vec<T>> {
        let (dynamic, control) = self.dynamic_parts("detach")?;
        if self.local_open.get().is_some() {
            return Err(Error::WindowSync(
                "detach inside a local access to the window".into(),
            ));
        }
        let Some(i) = dynamic
            .attached
            .borrow()
            .iter()
            .position(|a| a.id == attachment.id && a.region.addr == attachment.address as u64)
        else {
            return Err(Error::invalid(
                ErrorClass::RmaAttach,
                "detach of a region that is not attached to this window",
            ));
        };
        let me = self.rank;
        let take = match self.held.borrow()[me] {
            Held::None => true,
            Held::Exclusive => false,
            Held::Shared | Held::Implicit(_) => {
                return Err(Error::WindowSync(format!(
                    "rank {me} detaches a region while it holds its own lock shared (lock_all \
                     or lock_shared, or for its own request-based operations in flight): \
                     unlock or wait first"
                )))
            }
        };
        if take {
            self.acquire(me, Held::Exclusive)?;
        }
        // No peer accesses this rank's part now: the region leaves the table, the lock word
        // counts the detach (peers' views with it go stale at their next lock), the key goes.
        let gone = {
            let mut attached = dynamic.attached.borrow_mut();
            let gone = attached.remove(i);
            let regions: Vec<AttachedRegion> = attached.iter().map(|a| a.region).collect();
            publish(control, &regions);
            gone
        };
        let word = control
            .atomic_u64(LOCK_WORD as usize)
            .load(std::sync::atomic::Ordering::Acquire);
        let counted = self.control_add(me, LOCK_WORD, detach_increment(word));
        let unexposed = gone
            .lkey
            .map_or(Ok(()), |k| with_layer(&self.comm, |p2p| p2p.unexpose(k)));
        let mut c = self.counters.get();
        c.bytes_pinned -= gone.pinned;
        c.detaches += 1;
        self.counters.set(c);
        let released = if take { self.release(me) } else { Ok(()) };
        counted?;
        unexposed?;
        released?;
        Ok(gone.memory.into_vec())
    }

    /// Runs `f` on the elements of the region `attachment` names, attached here. Holds this
    /// rank's shared lock meanwhile, as [`Window::with_local`] does. Panics on error.
    pub fn with_attached<R>(&self, attachment: &Attachment, f: impl FnOnce(&[T]) -> R) -> R {
        fatal(self.try_with_attached(attachment, f))
    }

    /// [`Window::with_attached`], returning errors.
    pub fn try_with_attached<R>(
        &self,
        attachment: &Attachment,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        self.attached_access(attachment, Held::Shared, |m| m.with_local(f))
    }

    /// Runs `f` on the elements of the region `attachment` names, to change them. Holds
    /// this rank's exclusive lock meanwhile, as [`Window::with_local_mut`] does. Panics on
    /// error.
    pub fn with_attached_mut<R>(
        &self,
        attachment: &Attachment,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> R {
        fatal(self.try_with_attached_mut(attachment, f))
    }

    /// [`Window::with_attached_mut`], returning errors.
    pub fn try_with_attached_mut<R>(
        &self,
        attachment: &Attachment,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        self.attached_access(attachment, Held::Exclusive, |m| m.with_local_mut(f))
    }

    pub(super) fn attached_access<R>(
        &self,
        attachment: &Attachment,
        lock: Held,
        f: impl FnOnce(&WindowMemory<T>) -> R,
    ) -> Result<R> {
        let (dynamic, _) = self.dynamic_parts("a local access to an attached region")?;
        let attached = dynamic.attached.borrow();
        let a = attached
            .iter()
            .find(|a| a.id == attachment.id && a.region.addr == attachment.address as u64)
            .ok_or_else(|| {
                Error::invalid(
                    ErrorClass::RmaAttach,
                    "local access to a region that is not attached to this window",
                )
            })?;
        self.local_access(lock, || f(&a.memory))
    }

    /// A dynamic window's state and this rank's control page, or why `what` needs them.
    pub(super) fn dynamic_parts(&self, what: &str) -> Result<(&DynamicState<T>, &AnonMapping)> {
        match (&self.dynamic, &self.carrier) {
            (Some(d), Carrier::Nic { control, .. }) => Ok((d, control)),
            _ => Err(Error::invalid(
                ErrorClass::RmaFlavor,
                format!("{what} needs a dynamic window (Window::create_dynamic)"),
            )),
        }
    }

    /// Where `len` bytes from address `at` of dynamic-window target `t` lie: in a
    /// region of this rank's view of its table (read again once if none holds them).
    pub(super) fn dynamic_span(
        &self,
        dynamic: &DynamicState<T>,
        t: usize,
        at: u64,
        len: u64,
    ) -> Result<Span> {
        let world = self.parts[t].world;
        if len == 0 {
            return Ok(Span {
                target: t,
                world,
                at,
                rkey: 0,
            });
        }
        for read in [false, true] {
            if read {
                self.read_table(dynamic, t)?;
            }
            let found = dynamic.views.borrow()[t]
                .as_ref()
                .and_then(|v| v.find(at, len));
            if let Some(region) = found {
                return Ok(Span {
                    target: t,
                    world,
                    at,
                    rkey: region.rkey,
                });
            }
        }
        Err(Error::NotAttached {
            target: t,
            addr: at,
            end: at.saturating_add(len),
        })
    }

    /// Reads target `t`'s table of attached regions into this rank's view of it (this rank
    /// holds `t`'s lock, so no region is detached meanwhile; one attached meanwhile makes
    /// the copy retry).
    pub(super) fn read_table(&self, dynamic: &DynamicState<T>, t: usize) -> Result<()> {
        let part = self.parts[t];
        let table = part.control.addr + TABLE_AT as u64;
        let most = capacity(part.control.len as usize);
        let read = |copy: &mut [u8]| {
            with_layer(&self.comm, |p2p| {
                p2p.get(part.world, table, part.control.rkey, copy)
            })
        };
        loop {
            let mut copy = vec![0u8; table_bytes(FIRST_READ_ENTRIES)];
            read(&mut copy)?;
            let Some((generation, count)) = header(&copy) else {
                std::thread::yield_now();
                continue;
            };
            let count = count.min(most);
            if count > FIRST_READ_ENTRIES {
                copy.resize(table_bytes(count), 0);
                read(&mut copy)?;
                if header(&copy) != Some((generation, count)) {
                    continue;
                }
            }
            if self.control_add(t, TABLE_AT as u64, 0)? != generation {
                continue;
            }
            dynamic.views.borrow_mut()[t] = Some(RegionView {
                regions: entries(&copy, count),
            });
            return Ok(());
        }
    }

    /// Notes the lock word of target `t` read while taking its lock: a dynamic window's
    /// view of `t`'s table goes if `t` has detached a region since it was read.
    pub(super) fn saw_lock_word(&self, t: usize, word: u64) {
        if let Some(dynamic) = &self.dynamic {
            let now = detaches(word);
            let mut seen = dynamic.seen_detaches.borrow_mut();
            if seen[t] != now {
                seen[t] = now;
                dynamic.views.borrow_mut()[t] = None;
            }
        }
    }
}
