//! The driver thread, the interrupt-handler analogue: it serves network page faults filed
//! on this rank's memory, fills its translation cache's misses (`tpt_cache.rs`), and drives
//! the engine while the application is not polling.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::time::Duration;

use pagewire_nic::counters::NpfTiming;
use pagewire_nic::PAGE_SIZE;
use pagewire_sys as sys;

use crate::layout::{
    MAX_QPS, NPF_ADDR, NPF_DONE, NPF_LEN, NPF_REQ, NPF_STATUS, NPF_TIME, NPF_WRITE,
};
use crate::Inner;

/// How long the driver thread sleeps between passes while it drives the engine for an
/// application that is not polling and has work outstanding.
pub(super) const DRIVER_BUSY_SLEEP: Duration = Duration::from_micros(100);
/// How long the driver thread sleeps when nothing needs it (it is woken earlier by a peer
/// that files a fault, finds a ring full, or waits too long for an acknowledgement).
pub(super) const DRIVER_IDLE_SLEEP: Duration = Duration::from_millis(200);

impl Inner {
    /// The driver thread: the interrupt-handler analogue. It sleeps on the doorbell until a
    /// peer (or a timeout) wakes it, serves the faults filed on this rank's memory, and
    /// drives the engine while the application is not polling and work is outstanding
    /// (acknowledging peers' requests, streaming staged READ responses). While the
    /// application polls, it does all of this itself and the driver stays asleep.
    pub(super) fn driver_loop(&self) {
        sys::exclude_this_thread_from_count();
        let bell = self.own.doorbell();
        let asleep = self.own.asleep_word();
        let mut polls_seen = self.own.app_polls();
        loop {
            let seen = bell.load(SeqCst);
            if self.shutdown.load(Acquire) {
                return;
            }
            self.serve_faults();
            self.serve_translation_misses();
            let polls = self.own.app_polls();
            let app_polling = polls != polls_seen;
            polls_seen = polls;
            let mut work = false;
            if !app_polling {
                if let Some(mut eng) = self.engine.try_lock() {
                    self.progress(&mut eng);
                    work = eng.has_work();
                    // The application is not polling: no reply will carry the ACKs soon.
                    self.flush_links(true);
                }
            }
            asleep.store(1, SeqCst);
            // A fault filed or a bell rung after the checks above: go round again.
            let faults_waiting =
                self.own.faults_filed() != self.faults_served.load(SeqCst) || self.misses_waiting();
            if faults_waiting || bell.load(SeqCst) != seen {
                asleep.store(0, SeqCst);
                continue;
            }
            let wait = if work && !app_polling {
                DRIVER_BUSY_SLEEP
            } else {
                DRIVER_IDLE_SLEEP
            };
            match &self.wire {
                None => sys::futex_wait(bell, seen, wait),
                Some(w) => w.sleep(bell, seen, wait, !app_polling, &self.links_output()),
            }
            asleep.store(0, SeqCst);
        }
    }

    /// The driver's fault handler: resolves every filed fault on this rank's memory. Cheap
    /// when none is pending; one thread serves at a time.
    pub(crate) fn serve_faults(&self) {
        if self.faults_served.load(Acquire) == self.own.faults_filed() {
            return;
        }
        let Some(_serving) = self.serving_faults.try_lock() else {
            return;
        };
        let filed = self.own.faults_filed();
        self.faults_served.store(filed, SeqCst);
        for qpn in 0..MAX_QPS as u32 {
            let slot = self.own.npf_slot(qpn);
            let req = slot.w[NPF_REQ].load(Acquire);
            if req == slot.w[NPF_DONE].load(Relaxed) {
                continue;
            }
            let (addr, len) = (
                slot.w[NPF_ADDR].load(Relaxed),
                slot.w[NPF_LEN].load(Relaxed),
            );
            let write = slot.w[NPF_WRITE].load(Relaxed) != 0;
            let t0 = slot.w[NPF_TIME].load(Relaxed);
            // Counted before publishing, so whoever sees the fault resolved sees it counted.
            let ok = self.resolve_responder_fault(addr, len, write, t0);
            slot.w[NPF_STATUS].store(!ok as u64, Relaxed);
            slot.w[NPF_DONE].store(req, Release);
            // A requester on another host cannot read the slot: it is told.
            self.report_fault_by_link(qpn, req, ok);
        }
    }

    /// The driver's handling of one responder fault taken at `taken_at_ns` (monotonic):
    /// resolves it, charges the profile's modelled hardware time, and counts it with where
    /// its time went. True if the pages are mapped now.
    pub(crate) fn resolve_responder_fault(
        &self,
        addr: u64,
        len: u64,
        write: bool,
        taken_at_ns: u64,
    ) -> bool {
        let taken = sys::monotonic_ns();
        let ok = self.resolve_fault(addr, len, write);
        let os_ns = sys::monotonic_ns().saturating_sub(taken);
        let model_ns = if ok {
            self.profile.charge_npf_hardware()
        } else {
            0
        };
        self.counters.record_npf(
            false,
            sys::page_span(addr, len).1 / PAGE_SIZE,
            NpfTiming {
                total_ns: sys::monotonic_ns().saturating_sub(taken_at_ns),
                wait_ns: taken.saturating_sub(taken_at_ns),
                os_ns,
                model_ns,
            },
        );
        ok
    }

    /// Maps `[addr, addr+len)` of this process and marks it present for the NIC.
    pub(crate) fn resolve_fault(&self, addr: u64, len: u64, write: bool) -> bool {
        if self.watch.make_present(addr, len, write).is_some() {
            true
        } else {
            self.counters.npf_failed.fetch_add(1, Relaxed);
            false
        }
    }
}
