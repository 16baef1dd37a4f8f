//! The state the two monitor threads share, and their loops: the reader drains the
//! descriptor into the ring, the dispatcher applies events to subscriptions and calls the
//! sinks.

#![forbid(unsafe_code)]

use super::*;

impl Shared {
    /// Registers `[start, end)` with the kernel (idempotent for pages this descriptor
    /// already watches) and counts a reference on its pages.
    ///
    /// hugetlbfs memory must be registered in whole huge pages: when the page-aligned
    /// range is refused with `EINVAL`, the range rounded out to 2 MiB and then to 1 GiB is
    /// tried. Returns the range registered.
    pub(super) fn acquire(&self, start: u64, end: u64) -> Result<(u64, u64)> {
        let unwatchable = |reason: String| Error::UnwatchableRange {
            addr: start,
            len: end - start,
            reason,
        };
        let mut reg = self.registry.lock();
        let mut attempt = self
            .uffd
            .register_wp(start, end - start)
            .map(|i| (i, start, end));
        for huge in [2u64 << 20, 1 << 30] {
            if !matches!(&attempt, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
                break;
            }
            let (hs, he) = (start & !(huge - 1), end.div_ceil(huge) * huge);
            attempt = self.uffd.register_wp(hs, he - hs).map(|i| (i, hs, he));
        }
        let (ioctls, start, end) = attempt.map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::EINVAL) => {
                    "it is not anonymous, shmem or hugetlbfs memory (a file mapping or a System \
                     V shared memory segment), or not mapped"
                }
                Some(libc::EBUSY) => "another userfaultfd in this process watches part of it",
                Some(libc::ENOMEM) => {
                    "it is not mapped, or the process has reached vm.max_map_count mappings"
                }
                _ => "the kernel refused to register it",
            };
            unwatchable(format!("{why} (UFFDIO_REGISTER: {e})"))
        })?;
        let undo = |reg: &Segments| {
            for (a, b) in reg.uncovered(start, end) {
                let _ = self.uffd.unregister(a, b - a);
            }
        };
        // hugetlbfs ranges report no UFFDIO_ZEROPAGE; among them, System V segments made
        // with SHM_HUGETLB can be registered, but their shmdt is never reported.
        if ioctls & sys::IOCTL_ZEROPAGE_BIT == 0 && overlaps_sysv_shm(start, end) {
            undo(&reg);
            return Err(unwatchable(
                "it is System V shared memory, whose shmdt the kernel does not report".into(),
            ));
        }
        // Registration skips holes; a hole filled later would be unwatched.
        if !pagewire_sys::is_mapped(start, end - start) {
            undo(&reg);
            return Err(unwatchable("it is not entirely mapped".into()));
        }
        reg.add(start, end);
        Ok((start, end))
    }

    /// Drops a reference on the pages of `[start, end)`; unregisters those left with none.
    pub(super) fn release(&self, start: u64, end: u64) {
        let mut reg = self.registry.lock();
        for (a, b) in reg.remove(start, end) {
            // Fails harmlessly where the memory is gone.
            let _ = self.uffd.unregister(a, b - a);
        }
    }

    pub(super) fn flush(&self) {
        if on_monitor_thread() {
            return;
        }
        let target = self.read_seq.load(SeqCst);
        if self.done_seq.load(SeqCst) >= target {
            return;
        }
        let mut g = self.done_mx.lock();
        while self.done_seq.load(SeqCst) < target && !self.stopping.load(SeqCst) {
            self.done_cv.wait_for(&mut g, Duration::from_millis(100));
        }
    }

    /// From the `pthread_atfork` handler: has the dispatcher deliver a fork and waits.
    pub(super) fn request_fork(&self) {
        let ticket = self.fork_requested.fetch_add(1, SeqCst) + 1;
        self.wake.signal();
        if on_monitor_thread() {
            return;
        }
        let mut g = self.done_mx.lock();
        while self.fork_done.load(SeqCst) < ticket && !self.stopping.load(SeqCst) {
            self.done_cv.wait_for(&mut g, Duration::from_millis(100));
        }
    }

    pub(super) fn live_handles(&self) -> Vec<Arc<Handle>> {
        self.handles
            .read()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    pub(super) fn deliver(&self, handles: &[Arc<Handle>], e: Entry, seq: u64) {
        match e {
            Entry::Unmap { start, end } => {
                for h in handles {
                    h.hit(start, end, seq, Cause::Unmap, &h.unmap_events);
                }
            }
            Entry::Remove { start, end } => {
                for h in handles {
                    h.hit(start, end, seq, Cause::Remove, &h.remove_events);
                }
            }
            Entry::Remap { from, to, len } => {
                for h in handles {
                    h.hit(
                        from,
                        from.saturating_add(len),
                        seq,
                        Cause::Remap,
                        &h.remap_events,
                    );
                }
                // The kernel moved our registration along with the pages; nobody
                // subscribed the new place, so stop watching it.
                let reg = self.registry.lock();
                for (a, b) in reg.uncovered(to, to.saturating_add(len)) {
                    let _ = self.uffd.unregister(a, b - a);
                }
            }
            Entry::Fork { ticket } => {
                for h in handles {
                    h.fork_events.fetch_add(1, Relaxed);
                    if h.options.fork == ForkPolicy::InvalidateAll {
                        h.hit_all(seq, Cause::Fork);
                    }
                }
                if ticket > 0 {
                    self.fork_done.fetch_max(ticket, SeqCst);
                }
            }
        }
    }
}

pub(super) fn reader_loop(sh: Arc<Shared>) {
    let mut buf = [sys::Msg::default(); READ_BATCH];
    let mut pending = [None::<Entry>; READ_BATCH];
    let mut forks_enqueued = 0u64;
    loop {
        let ready = match sys::poll2(sh.uffd.raw(), sh.wake.raw()) {
            Ok(r) => r,
            Err(_) => {
                sh.counters.read_errors.fetch_add(1, Relaxed);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        if ready.second {
            sh.wake.drain();
            if sh.stopping.load(SeqCst) {
                return;
            }
        }
        let forks = sh.fork_requested.load(SeqCst);
        if !ready.first && forks == forks_enqueued {
            continue;
        }
        // Bumped before the read that lets the event's thread go on (module docs).
        let seq = sh.read_seq.fetch_add(1, SeqCst) + 1;
        let n = if ready.first {
            match sh.uffd.read_msgs(&mut buf) {
                Ok(n) => n,
                Err(_) => {
                    // EMFILE while installing a fork event's descriptor, say: the event
                    // stays queued; try again shortly.
                    sh.counters.read_errors.fetch_add(1, Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                    0
                }
            }
        } else {
            0
        };
        let mut k = 0;
        for m in &buf[..n] {
            sh.counters.events_read.fetch_add(1, Relaxed);
            let e = match m.event {
                sys::EVENT_UNMAP => Entry::Unmap {
                    start: m.arg[0],
                    end: m.arg[1],
                },
                sys::EVENT_REMOVE => Entry::Remove {
                    start: m.arg[0],
                    end: m.arg[1],
                },
                sys::EVENT_REMAP => Entry::Remap {
                    from: m.arg[0],
                    to: m.arg[1],
                    len: m.arg[2],
                },
                sys::EVENT_FORK => {
                    // The child's copy of our registrations: closing it releases them.
                    sys::close_handed_fd(m.fork_fd());
                    Entry::Fork { ticket: 0 }
                }
                sys::EVENT_PAGEFAULT => {
                    // Never expected (nothing is write-protected); let the thread go on.
                    sh.counters.routed_faults.fetch_add(1, Relaxed);
                    if m.arg[0] & sys::PAGEFAULT_FLAG_WP != 0 {
                        sh.uffd.release_fault(m.arg[1], PAGE_SIZE);
                    }
                    continue;
                }
                _ => continue,
            };
            pending[k] = Some(e);
            k += 1;
        }
        for e in pending[..k].iter_mut().filter_map(Option::take) {
            if !sh.ring.push(e, seq) {
                sh.counters.lost.fetch_add(1, Relaxed);
            }
        }
        if forks != forks_enqueued {
            if !sh.ring.push(Entry::Fork { ticket: forks }, seq) {
                sh.counters.lost.fetch_add(1, Relaxed);
            }
            forks_enqueued = forks;
        }
        // Closes the batch: a subscription born from now on is not touched by it.
        let closed = sh.read_seq.fetch_add(1, SeqCst) + 1;
        sh.ring.publish(closed);
    }
}

pub(super) fn dispatcher_loop(sh: Arc<Shared>) {
    let mut local: Vec<(Entry, u64)> = Vec::with_capacity(QUEUE_CAPACITY);
    let mut done = 0u64;
    loop {
        let bell = sh.ring.doorbell.load(Acquire);
        let published = sh.ring.published.load(Acquire);
        let stop = sh.stopping.load(SeqCst);
        if published == done && !stop {
            pagewire_sys::futex_wait(&sh.ring.doorbell, bell, Duration::from_millis(500));
            continue;
        }
        // Everything of batches up to `published` is in the ring now.
        let overflow = sh.ring.overflow.swap(false, AcqRel);
        sh.ring.take(&mut local);
        let handles = sh.live_handles();
        if overflow {
            for h in &handles {
                h.hit_all(u64::MAX, Cause::Lost);
            }
            sh.fork_done
                .fetch_max(sh.fork_requested.load(SeqCst), SeqCst);
        }
        for (e, seq) in local.drain(..) {
            sh.deliver(&handles, e, seq);
        }
        drop(handles);
        done = published;
        sh.done_seq.store(done, SeqCst);
        {
            let _g = sh.done_mx.lock();
            sh.done_cv.notify_all();
        }
        if stop {
            return;
        }
    }
}
