//! Asynchronous events (`ibv_get_async_event(3)`): what each one is about and what it does
//! to the provider, and how often the provider looks for them.
//!
//! Some failures are reported only here, never as a completion: a completion queue that
//! overran (`IBV_EVENT_CQ_ERR`) or a device in a fatal state (`IBV_EVENT_DEVICE_FATAL`)
//! produce no more completions at all, so a caller polling for one would wait forever.
//! `poll_cq` therefore reads the device's events (the context's `async_fd` is made
//! non-blocking, as the man page's example does) whenever a poll comes back short, at most
//! once per [`CHECK_INTERVAL_NS`], and turns a fatal one into an error.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

/// Shortest time between two reads of the event queue: 10 ms, so a hang becomes an error
/// within that, at a cost of at most 100 `read` calls a second and none while completions
/// keep coming.
pub(crate) const CHECK_INTERVAL_NS: u64 = 10_000_000;

/// Which member of `ibv_async_event::element` an event fills (libibverbs'
/// `ibv_get_async_event`, `libibverbs/device.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    /// `element.qp`.
    QueuePair,
    /// `element.cq`.
    CompletionQueue,
    /// `element.srq` (pagewire makes none).
    SharedReceiveQueue,
    /// `element.wq` (pagewire makes none).
    WorkQueue,
    /// `element.port_num`.
    Port,
    /// The device as a whole (`IBV_EVENT_DEVICE_FATAL`; libibverbs fills `port_num` with
    /// whatever the kernel sent, which means nothing here).
    Device,
}

/// What an event does to the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// The queue pair is in ERROR (its outstanding requests complete as flushed).
    QueuePairFailed,
    /// The completion queue is unusable: polling it is an error from now on.
    CompletionQueueFailed,
    /// The device is unusable: every poll and post is an error from now on.
    DeviceFailed,
    /// Worth keeping for diagnosis, nothing to do (a port going down shows up as transport
    /// retries exceeded on its queue pairs).
    Note,
}

/// `enum ibv_event_type` values (verbs.h), by name.
const NAMES: [&str; 20] = [
    "IBV_EVENT_CQ_ERR",
    "IBV_EVENT_QP_FATAL",
    "IBV_EVENT_QP_REQ_ERR",
    "IBV_EVENT_QP_ACCESS_ERR",
    "IBV_EVENT_COMM_EST",
    "IBV_EVENT_SQ_DRAINED",
    "IBV_EVENT_PATH_MIG",
    "IBV_EVENT_PATH_MIG_ERR",
    "IBV_EVENT_DEVICE_FATAL",
    "IBV_EVENT_PORT_ACTIVE",
    "IBV_EVENT_PORT_ERR",
    "IBV_EVENT_LID_CHANGE",
    "IBV_EVENT_PKEY_CHANGE",
    "IBV_EVENT_SM_CHANGE",
    "IBV_EVENT_SRQ_ERR",
    "IBV_EVENT_SRQ_LIMIT_REACHED",
    "IBV_EVENT_QP_LAST_WQE_REACHED",
    "IBV_EVENT_CLIENT_REREGISTER",
    "IBV_EVENT_GID_CHANGE",
    "IBV_EVENT_WQ_FATAL",
];

/// The event's name in verbs.h (`"unknown event"` for a value this build does not know).
pub(crate) fn name(event_type: u32) -> &'static str {
    NAMES
        .get(event_type as usize)
        .copied()
        .unwrap_or("unknown event")
}

/// What `event_type` is about.
pub(crate) fn subject(event_type: u32) -> Subject {
    match event_type {
        0 => Subject::CompletionQueue,
        1..=7 | 16 => Subject::QueuePair,
        14 | 15 => Subject::SharedReceiveQueue,
        19 => Subject::WorkQueue,
        8 => Subject::Device,
        _ => Subject::Port,
    }
}

/// What `event_type` does to the provider.
pub(crate) fn effect(event_type: u32) -> Effect {
    match event_type {
        // CQ overrun.
        0 => Effect::CompletionQueueFailed,
        // QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR: the queue pair went to ERROR.
        1..=3 => Effect::QueuePairFailed,
        8 => Effect::DeviceFailed,
        _ => Effect::Note,
    }
}

/// Lets one caller at a time read the event queue, at most once per [`CHECK_INTERVAL_NS`].
#[derive(Debug, Default)]
pub(crate) struct CheckGate {
    /// When the queue was last read, in ns on the caller's clock.
    last_ns: AtomicU64,
}

impl CheckGate {
    /// Whether the caller, at `now_ns`, should read the queue now. At most one of several
    /// callers racing at the same moment gets `true`.
    pub(crate) fn claim(&self, now_ns: u64) -> bool {
        let last = self.last_ns.load(Ordering::Relaxed);
        now_ns.saturating_sub(last) >= CHECK_INTERVAL_NS
            && self
                .last_ns
                .compare_exchange(last, now_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of `enum ibv_event_type` in verbs.h, from the binding.
    #[test]
    fn names_follow_the_verbs_h_enum() {
        use rdma_sys::ibv_event_type as E;
        for (e, n) in [
            (E::IBV_EVENT_CQ_ERR, "IBV_EVENT_CQ_ERR"),
            (E::IBV_EVENT_QP_FATAL, "IBV_EVENT_QP_FATAL"),
            (E::IBV_EVENT_DEVICE_FATAL, "IBV_EVENT_DEVICE_FATAL"),
            (E::IBV_EVENT_PORT_ERR, "IBV_EVENT_PORT_ERR"),
            (
                E::IBV_EVENT_QP_LAST_WQE_REACHED,
                "IBV_EVENT_QP_LAST_WQE_REACHED",
            ),
            (E::IBV_EVENT_WQ_FATAL, "IBV_EVENT_WQ_FATAL"),
        ] {
            assert_eq!(name(e as u32), n);
        }
        assert_eq!(name(20), "unknown event");
    }

    /// The same cases as libibverbs' `ibv_get_async_event` and `ibv_ack_async_event`.
    #[test]
    fn subjects_follow_libibverbs() {
        use rdma_sys::ibv_event_type as E;
        assert_eq!(
            subject(E::IBV_EVENT_CQ_ERR as u32),
            Subject::CompletionQueue
        );
        for e in [
            E::IBV_EVENT_QP_FATAL,
            E::IBV_EVENT_QP_REQ_ERR,
            E::IBV_EVENT_QP_ACCESS_ERR,
            E::IBV_EVENT_COMM_EST,
            E::IBV_EVENT_SQ_DRAINED,
            E::IBV_EVENT_PATH_MIG,
            E::IBV_EVENT_PATH_MIG_ERR,
            E::IBV_EVENT_QP_LAST_WQE_REACHED,
        ] {
            assert_eq!(subject(e as u32), Subject::QueuePair, "{e:?}");
        }
        for e in [E::IBV_EVENT_SRQ_ERR, E::IBV_EVENT_SRQ_LIMIT_REACHED] {
            assert_eq!(subject(e as u32), Subject::SharedReceiveQueue, "{e:?}");
        }
        assert_eq!(subject(E::IBV_EVENT_WQ_FATAL as u32), Subject::WorkQueue);
        for e in [
            E::IBV_EVENT_PORT_ACTIVE,
            E::IBV_EVENT_PORT_ERR,
            E::IBV_EVENT_LID_CHANGE,
            E::IBV_EVENT_PKEY_CHANGE,
            E::IBV_EVENT_SM_CHANGE,
            E::IBV_EVENT_CLIENT_REREGISTER,
            E::IBV_EVENT_GID_CHANGE,
        ] {
            assert_eq!(subject(e as u32), Subject::Port, "{e:?}");
        }
        assert_eq!(subject(E::IBV_EVENT_DEVICE_FATAL as u32), Subject::Device);
        // libibverbs' default case: anything else fills port_num.
        assert_eq!(subject(99), Subject::Port);
    }

    #[test]
    fn fatal_events_fail_their_object_the_rest_are_kept() {
        use rdma_sys::ibv_event_type as E;
        assert_eq!(
            effect(E::IBV_EVENT_CQ_ERR as u32),
            Effect::CompletionQueueFailed
        );
        for e in [
            E::IBV_EVENT_QP_FATAL,
            E::IBV_EVENT_QP_REQ_ERR,
            E::IBV_EVENT_QP_ACCESS_ERR,
        ] {
            assert_eq!(effect(e as u32), Effect::QueuePairFailed, "{e:?}");
        }
        assert_eq!(
            effect(E::IBV_EVENT_DEVICE_FATAL as u32),
            Effect::DeviceFailed
        );
        for e in [
            E::IBV_EVENT_COMM_EST,
            E::IBV_EVENT_PORT_ERR,
            E::IBV_EVENT_PATH_MIG_ERR,
        ] {
            assert_eq!(effect(e as u32), Effect::Note, "{e:?}");
        }
        assert_eq!(effect(99), Effect::Note);
    }

    #[test]
    fn the_event_queue_is_read_at_most_once_per_interval() {
        let gate = CheckGate::default();
        assert!(gate.claim(CHECK_INTERVAL_NS), "the first check is due");
        assert!(!gate.claim(CHECK_INTERVAL_NS), "not twice at once");
        assert!(!gate.claim(2 * CHECK_INTERVAL_NS - 1));
        assert!(gate.claim(2 * CHECK_INTERVAL_NS));
        // A clock that reads earlier than the last check (another thread's later stamp).
        assert!(!gate.claim(CHECK_INTERVAL_NS));
    }
}
