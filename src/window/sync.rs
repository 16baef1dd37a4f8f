//! A window's synchronisation: fence, locks (words in the target's control page, taken
//! with the NIC's atomics), post/start/complete/wait, flushes, and the free.

use std::sync::atomic::Ordering;

use pagewire_transport::msg::RemoteAtomic;

use super::dynamic::DETACH_BITS;
use super::{with_layer, Carrier, Held, Window, COMPLETE_TAG, EXCLUSIVE, LOCK_WORD, POST_TAG};
use crate::collective::CommunicatorCollectives;
use crate::datatype::Equivalence;
use crate::error::{fatal, Error, Result};
use crate::point_to_point::{Destination, Source};
use crate::topology::{Communicator, Group, Rank};
use crate::ErrorClass;

impl<T: Equivalence + Send + Sync> Window<T> {
    /// Ends an epoch and starts the next (`MPI_Win_fence`): every rank's operations of the
    /// epoch are complete at their targets when it returns. Collective. Panics on error.
    pub fn fence(&self) {
        fatal(self.try_fence())
    }

    /// [`Window::fence`], returning errors.
    pub fn try_fence(&self) -> Result<()> {
        // Every other operation completed at its target before it returned: the inline puts
        // in flight, then the barrier, are the whole fence. The next epoch's accesses to
        // this rank's memory find its pages mapped for the NIC (odp).
        self.flush_puts(None)?;
        self.prefetch_exposed()?;
        self.comm.try_barrier()
    }

    /// Takes rank `target`'s lock exclusively (`MPI_Win_lock(MPI_LOCK_EXCLUSIVE)`): waits
    /// until no other rank holds it. Panics on error.
    pub fn lock(&self, target: Rank) {
        fatal(self.try_lock(target))
    }

    /// [`Window::lock`], returning errors.
    pub fn try_lock(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.acquire(t, Held::Exclusive)
    }

    /// Takes rank `target`'s lock shared (`MPI_Win_lock(MPI_LOCK_SHARED)`): waits while
    /// a rank holds it exclusively. Panics on error.
    pub fn lock_shared(&self, target: Rank) {
        fatal(self.try_lock_shared(target))
    }

    /// [`Window::lock_shared`], returning errors.
    pub fn try_lock_shared(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.acquire(t, Held::Shared)
    }

    /// Gives back rank `target`'s lock (`MPI_Win_unlock`); this rank's operations on it are
    /// complete. Panics on error.
    pub fn unlock(&self, target: Rank) {
        fatal(self.try_unlock(target))
    }

    /// [`Window::unlock`], returning errors.
    pub fn try_unlock(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.release(t)
    }

    /// Takes every rank's lock shared (`MPI_Win_lock_all`). Panics on error.
    pub fn lock_all(&self) {
        fatal(self.try_lock_all())
    }

    /// [`Window::lock_all`], returning errors; on an error, the locks taken are given back.
    pub fn try_lock_all(&self) -> Result<()> {
        for t in 0..self.parts.len() {
            if let Err(e) = self.acquire(t, Held::Shared) {
                for u in 0..t {
                    let _ = self.release(u);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Gives back every rank's lock taken by [`Window::lock_all`] (`MPI_Win_unlock_all`).
    /// Panics on error.
    pub fn unlock_all(&self) {
        fatal(self.try_unlock_all())
    }

    /// [`Window::unlock_all`], returning errors (the first; every lock is given back).
    pub fn try_unlock_all(&self) -> Result<()> {
        let mut first = None;
        for t in 0..self.parts.len() {
            if let Err(e) = self.release(t) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Completes this rank's operations on `target` at the target (`MPI_Win_flush`): waits
    /// for its inline puts (every other operation completed when it returned). Panics on
    /// error.
    pub fn flush(&self, target: Rank) {
        fatal(self.try_flush(target))
    }

    /// [`Window::flush`], returning errors (of a put that failed since the last flush).
    pub fn try_flush(&self, target: Rank) -> Result<()> {
        let t = self.target(target)?;
        self.flush_puts(Some(t))
    }

    /// Completes this rank's operations on `target` locally (`MPI_Win_flush_local`): the
    /// origin buffers are free as soon as each call returns, so this checks the rank only.
    /// Panics on error.
    pub fn flush_local(&self, target: Rank) {
        fatal(self.target(target).map(drop))
    }

    /// Completes this rank's operations on every target (`MPI_Win_flush_all`). Panics on
    /// error.
    pub fn flush_all(&self) {
        fatal(self.flush_puts(None))
    }

    /// Completes this rank's operations locally on every target
    /// (`MPI_Win_flush_local_all`): nothing to wait for (see [`Window::flush_local`]).
    pub fn flush_local_all(&self) {}

    /// Orders this rank's loads and stores of its part with the NIC's accesses
    /// (`MPI_Win_sync`): a full memory fence.
    pub fn sync(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// Opens an exposure epoch to the ranks of `group` (`MPI_Win_post`): they may access
    /// this rank's part once they have called [`Window::start`]. Panics on error.
    pub fn post(&self, group: &dyn Group) {
        fatal(self.try_post(group))
    }

    /// [`Window::post`], returning errors.
    pub fn try_post(&self, group: &dyn Group) -> Result<()> {
        if self.exposure.borrow().is_some() {
            return Err(Error::WindowSync(
                "post while an exposure epoch is open (call wait first)".into(),
            ));
        }
        let origins = self.ranks_of(group)?;
        self.prefetch_exposed()?;
        self.notify(&origins, POST_TAG)?;
        *self.exposure.borrow_mut() = Some(origins);
        Ok(())
    }

    /// Opens an access epoch to the ranks of `group` (`MPI_Win_start`): waits until each
    /// has posted an exposure epoch that includes this rank. Panics on error.
    pub fn start(&self, group: &dyn Group) {
        fatal(self.try_start(group))
    }

    /// [`Window::start`], returning errors.
    pub fn try_start(&self, group: &dyn Group) -> Result<()> {
        if self.access.borrow().is_some() {
            return Err(Error::WindowSync(
                "start while an access epoch is open (call complete first)".into(),
            ));
        }
        let targets = self.ranks_of(group)?;
        self.await_notices(&targets, POST_TAG)?;
        *self.access.borrow_mut() = Some(targets);
        Ok(())
    }

    /// Closes the access epoch (`MPI_Win_complete`): its operations are complete at their
    /// targets, which learn so. Panics on error.
    pub fn complete(&self) {
        fatal(self.try_complete())
    }

    /// [`Window::complete`], returning errors.
    pub fn try_complete(&self) -> Result<()> {
        let Some(targets) = self.access.borrow_mut().take() else {
            return Err(Error::WindowSync("complete without start".into()));
        };
        for &t in &targets {
            self.flush_puts(Some(t))?;
        }
        self.notify(&targets, COMPLETE_TAG)?;
        Ok(())
    }

    /// Closes the exposure epoch (`MPI_Win_wait`): waits until every origin of the group
    /// has completed its access epoch. Panics on error.
    pub fn wait(&self) {
        fatal(self.try_wait())
    }

    /// [`Window::wait`], returning errors.
    pub fn try_wait(&self) -> Result<()> {
        let Some(origins) = self.exposure.borrow_mut().take() else {
            return Err(Error::WindowSync("wait without post".into()));
        };
        self.await_notices(&origins, COMPLETE_TAG)?;
        Ok(())
    }

    /// Frees the window (`MPI_Win_free`; also what dropping it does): collective; an
    /// error if a lock or an epoch is still open on this rank's part or by this rank.
    pub fn try_free(mut self) -> Result<()> {
        self.free()
    }

    pub(super) fn free(&mut self) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        self.freed = true;
        let open = self.open_state();
        let flushed = self.flush_puts(None);
        // Every rank reaches the free (or a dead one is reported) before anything goes.
        let barrier = self.comm.try_barrier();
        // No rank accesses the window any more: the lock word is read as it is.
        let shared_word = self
            .shared
            .as_ref()
            .map(|s| s.control(self.rank, LOCK_WORD).load(Ordering::Acquire));
        let keys = self.registrations();
        let (word, unexposed) = match &mut self.carrier {
            Carrier::Nic { control, .. } => {
                let word = control
                    .atomic_u64(LOCK_WORD as usize)
                    .load(std::sync::atomic::Ordering::Acquire)
                    & !DETACH_BITS;
                let unexposed = with_layer(&self.comm, |p2p| {
                    keys.into_iter()
                        .map(|k| p2p.unexpose(k))
                        .fold(Ok(()), Result::and)
                });
                (word, unexposed)
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => (w.own_control(0), w.free()),
        };
        let word = shared_word.unwrap_or(word);
        // Every origin has had its accumulates answered: this rank's handler can go before
        // its memory does.
        if let Some(a) = &self.active {
            a.stop(&self.comm);
        }
        barrier?;
        flushed?;
        if let Some(why) = open {
            return Err(Error::WindowSync(why));
        }
        if word != 0 {
            return Err(Error::WindowSync(format!(
                "the window was freed while rank {}'s part was still locked ({}): every lock \
                 must be unlocked before the free",
                self.rank,
                if word & EXCLUSIVE != 0 {
                    "exclusively".to_string()
                } else {
                    format!("shared by {word}")
                }
            )));
        }
        unexposed
    }

    /// Where the buffer mode exposes memory on demand (odp), maps this rank's part (or its
    /// attached regions) for the NIC now, at an exposure epoch's start, so that peers'
    /// first accesses in it do not fault (ODP's prefetch; pages already mapped cost a look
    /// at the NIC's present bits). Nothing in the other modes, which pinned it.
    // Irrefutable without the `mpi` feature's host-MPI carrier.
    #[allow(irrefutable_let_patterns)]
    pub(super) fn prefetch_exposed(&self) -> Result<()> {
        let Carrier::Nic { own_key, .. } = &self.carrier else {
            return Ok(());
        };
        let mut ranges: Vec<(u32, u64, u64)> = Vec::new();
        match (&self.dynamic, own_key) {
            (Some(d), _) => {
                if let Some((lkey, _)) = d.space {
                    ranges.extend(
                        d.attached
                            .borrow()
                            .iter()
                            .map(|a| (lkey, a.region.addr, a.region.len)),
                    );
                }
            }
            (None, Some(lkey)) => {
                let part = self.parts[self.rank];
                ranges.push((*lkey, part.memory.addr, part.memory.len));
            }
            (None, None) => {}
        }
        if ranges.is_empty() {
            return Ok(());
        }
        with_layer(&self.comm, |p2p| {
            if !p2p.exposes_on_demand() {
                return Ok(());
            }
            ranges
                .iter()
                .try_for_each(|&(lkey, addr, len)| p2p.prefetch_exposed(lkey, addr, len))
        })
    }

    /// Takes this rank's registrations for the window (its part's or the address space's,
    /// each attached region's, its control page's), to deregister them.
    // Irrefutable without the `mpi` feature's host-MPI carrier.
    #[allow(irrefutable_let_patterns)]
    pub(super) fn registrations(&mut self) -> Vec<u32> {
        let mut keys = Vec::new();
        if let Carrier::Nic {
            own_key,
            control_key,
            ..
        } = &mut self.carrier
        {
            keys.extend(own_key.take());
            keys.push(*control_key);
        }
        if let Some(d) = &self.dynamic {
            keys.extend(
                d.attached
                    .borrow_mut()
                    .iter_mut()
                    .filter_map(|a| a.lkey.take()),
            );
        }
        keys
    }

    /// What this rank left open, if anything.
    pub(super) fn open_state(&self) -> Option<String> {
        let held = self.held.borrow();
        if let Some(t) = held.iter().position(|h| *h != Held::None) {
            return Some(format!(
                "the window was freed while rank {} still held its lock on rank {t}",
                self.rank
            ));
        }
        if self.access.borrow().is_some() || self.exposure.borrow().is_some() {
            return Some(format!(
                "the window was freed while rank {} had an epoch open (start without \
                 complete, or post without wait)",
                self.rank
            ));
        }
        None
    }

    /// Sends a zero-byte notice with `tag` to each of `ranks` (post/start/complete/wait).
    pub(super) fn notify(&self, ranks: &[usize], tag: i32) -> Result<()> {
        for &r in ranks {
            self.comm
                .process_at_rank(r as Rank)
                .try_send_with_tag(&0u8, tag)?;
        }
        Ok(())
    }

    /// Waits for a zero-byte notice with `tag` from each of `ranks`.
    pub(super) fn await_notices(&self, ranks: &[usize], tag: i32) -> Result<()> {
        for &r in ranks {
            let mut notice = 0u8;
            self.comm
                .process_at_rank(r as Rank)
                .try_receive_into_with_tag(&mut notice, Some(tag))?;
        }
        Ok(())
    }

    /// The window ranks of `group`'s members.
    pub(super) fn ranks_of(&self, group: &dyn Group) -> Result<Vec<usize>> {
        group
            .world_ranks()
            .iter()
            .map(|w| {
                self.parts
                    .iter()
                    .position(|p| p.world == *w)
                    .ok_or_else(|| {
                        Error::invalid(
                            ErrorClass::Group,
                            format!("world rank {w} of the group is not in the window"),
                        )
                    })
            })
            .collect()
    }

    /// Waits for this rank's inline puts to `target` (all: `None`) to complete.
    pub(super) fn flush_puts(&self, target: Option<usize>) -> Result<()> {
        match &self.carrier {
            Carrier::Nic { .. } => {
                let world = target.map(|t| self.parts[t].world);
                with_layer(&self.comm, |p2p| p2p.rma_flush(world))
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => match target {
                Some(t) => w.flush(t as Rank),
                None => w.flush_all(),
            },
        }
    }

    /// Compare-and-swap of `target`'s control word at byte `word`: its old value.
    pub(super) fn control_cas(
        &self,
        target: usize,
        word: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        if let Some(shared) = &self.shared {
            let w = shared.control(target, word);
            return Ok(w
                .compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst)
                .unwrap_or_else(|old| old));
        }
        match &self.carrier {
            Carrier::Nic { .. } => {
                let part = self.parts[target];
                let op = RemoteAtomic::CmpSwap { compare, swap };
                let at = part.control.addr + word;
                Ok(self.atomics(part.world, part.control.rkey, &[(at, op)])?[0])
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => w.control_cas(target as Rank, word / 8, compare, swap),
        }
    }

    /// Fetch-and-add of `target`'s control word at byte `word`: its old value.
    pub(super) fn control_add(&self, target: usize, word: u64, add: u64) -> Result<u64> {
        if let Some(shared) = &self.shared {
            return Ok(shared
                .control(target, word)
                .fetch_add(add, Ordering::SeqCst));
        }
        match &self.carrier {
            Carrier::Nic { .. } => {
                let part = self.parts[target];
                let op = RemoteAtomic::FetchAdd { add };
                let at = part.control.addr + word;
                Ok(self.atomics(part.world, part.control.rkey, &[(at, op)])?[0])
            }
            #[cfg(feature = "mpi")]
            Carrier::HostMpi(w) => w.control_add(target as Rank, word / 8, add),
        }
    }

    /// Takes `target`'s lock as `how`.
    pub(super) fn acquire(&self, target: usize, how: Held) -> Result<()> {
        match self.held.borrow()[target] {
            Held::None => {}
            Held::Implicit(_) => {
                return Err(Error::WindowSync(format!(
                    "rank {} locks rank {target} while its request-based operations on it are \
                     in flight (wait for them first)",
                    self.rank
                )))
            }
            _ => {
                return Err(Error::WindowSync(format!(
                    "rank {} locks rank {target} a second time (unlock first)",
                    self.rank
                )))
            }
        }
        // The lock word's middle bits count a dynamic window's detaches; free is every other
        // bit clear. An exclusive taker guesses the count (the last it saw) and learns it
        // from a failed compare-and-swap.
        let mut free = self
            .dynamic
            .as_ref()
            .map_or(0, |d| d.seen_detaches.borrow()[target] << 32);
        let mut spins = 0u32;
        loop {
            let got = match how {
                Held::Exclusive => {
                    let old = self.control_cas(target, LOCK_WORD, free, free | EXCLUSIVE)?;
                    if old != free && old & !DETACH_BITS == 0 {
                        free = old; // free, at another count of detaches: again at once
                        continue;
                    }
                    (old == free).then_some(old)
                }
                _ => {
                    let old = self.control_add(target, LOCK_WORD, 1)?;
                    if old & EXCLUSIVE != 0 {
                        self.control_add(target, LOCK_WORD, u64::MAX)?;
                        None
                    } else {
                        Some(old)
                    }
                }
            };
            if let Some(word) = got {
                self.held.borrow_mut()[target] = how;
                self.saw_lock_word(target, word);
                return Ok(());
            }
            spins += 1;
            // The holder may wait for this rank meanwhile (its accumulates, applied by this
            // rank's progress engine): keep it moving.
            self.progress_while_waiting()?;
            if spins > 16 {
                std::thread::yield_now();
            }
        }
    }

    /// One pass of the message layer's progress, for a rank that waits for a word another
    /// rank changes (a lock, the update mutex) where the wait itself may not pass through
    /// it (an atomic on this rank's own word).
    pub(super) fn progress_while_waiting(&self) -> Result<()> {
        match &self.carrier {
            Carrier::Nic { .. } if self.shared.is_none() => {
                with_layer(&self.comm, |p2p| p2p.progress().map(|_| ()))
            }
            _ => Ok(()),
        }
    }

    /// Gives back the lock this rank holds on `target`.
    pub(super) fn release(&self, target: usize) -> Result<()> {
        let how = self.held.borrow()[target];
        let add = match how {
            Held::None | Held::Implicit(_) => {
                return Err(Error::WindowSync(format!(
                    "rank {} unlocks rank {target}, which it has not locked",
                    self.rank
                )))
            }
            Held::Shared => u64::MAX, // minus one
            Held::Exclusive => EXCLUSIVE.wrapping_neg(),
        };
        // The epoch's puts are complete at the target before the lock goes.
        self.flush_puts(Some(target))?;
        self.control_add(target, LOCK_WORD, add)?;
        self.held.borrow_mut()[target] = Held::None;
        Ok(())
    }
}

impl<T: Equivalence + Send + Sync> Drop for Window<T> {
    fn drop(&mut self) {
        if self.freed {
            return;
        }
        if std::thread::panicking() {
            // The other ranks may never reach the free: give back the registrations only.
            self.freed = true;
            if let Some(a) = &self.active {
                a.stop(&self.comm);
            }
            let keys = self.registrations();
            match &mut self.carrier {
                Carrier::Nic { .. } => {
                    let _ = with_layer(&self.comm, |p2p| {
                        keys.into_iter().try_for_each(|k| p2p.unexpose(k))
                    });
                }
                // Freeing an MPI window is collective: it is left to MPI_Finalize.
                #[cfg(feature = "mpi")]
                Carrier::HostMpi(w) => w.leave_to_finalize(),
            }
            return;
        }
        if let Err(e) = self.free() {
            eprintln!("pagewire: rank {}: {e}", self.rank);
        }
    }
}
