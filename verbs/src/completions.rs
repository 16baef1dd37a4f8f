//! What the device reports: work completions turned into the `Nic` trait's, failed ones
//! kept for diagnosis, and asynchronous events applied to queue pairs and the device.
#![forbid(unsafe_code)]

use super::*;

impl VerbsNic {
    /// Reads every waiting asynchronous event and applies it (`events::effect`).
    pub(super) fn read_async_events(&self) {
        loop {
            match self.ctx.next_async_event() {
                Ok(Some(ev)) => self.apply_async_event(ev),
                Ok(None) => break,
                Err(e) => {
                    self.keep_event(AsyncEventRecord {
                        event: "ibv_get_async_event failed",
                        subject: e.to_string(),
                    });
                    break;
                }
            }
        }
    }

    pub(super) fn apply_async_event(&self, ev: ffi::AsyncEvent) {
        let event = events::name(ev.event_type);
        let cq_id = |addr: usize| self.cqs.read().iter().position(|e| e.cq.address() == addr);
        let subject = match ev.element {
            ffi::AsyncElement::QueuePair(n) => format!("queue pair {n:#x}"),
            ffi::AsyncElement::CompletionQueue(addr) => match cq_id(addr) {
                Some(id) => format!("completion queue {id}"),
                None => "a completion queue not made by this NIC".into(),
            },
            ffi::AsyncElement::Port(p) => format!("port {p}"),
            ffi::AsyncElement::Other => "the device".into(),
        };
        match (events::effect(ev.event_type), ev.element) {
            (events::Effect::QueuePairFailed, ffi::AsyncElement::QueuePair(n)) => {
                if let Some(q) = self.qps.read().get(&n) {
                    q.status
                        .lock()
                        .failed(|| format!("{event} (asynchronous event)"));
                }
            }
            (events::Effect::CompletionQueueFailed, ffi::AsyncElement::CompletionQueue(addr)) => {
                if let Some(id) = cq_id(addr) {
                    if let Some(e) = self.cqs.read().get(id) {
                        e.failed.store(true, Relaxed);
                    }
                }
            }
            (events::Effect::DeviceFailed, _) => self.device_failed.store(true, Relaxed),
            _ => {}
        }
        self.keep_event(AsyncEventRecord { event, subject });
    }

    pub(super) fn keep_event(&self, record: AsyncEventRecord) {
        let mut recent = self.recent_events.lock();
        if recent.len() == RECENT_ERRORS {
            recent.pop_front();
        }
        recent.push_back(record);
    }

    pub(super) fn record_error(&self, wc: &ibv_wc, wr_id: u64) {
        self.counters.error_completions.fetch_add(1, Relaxed);
        let mut recent = self.recent_errors.lock();
        if recent.len() == RECENT_ERRORS {
            recent.pop_front();
        }
        recent.push_back(RawCompletionError {
            wr_id,
            qp_num: wc.qp_num,
            status: wc.status,
            status_str: ffi::wc_status_str(wc.status),
            vendor_err: wc.vendor_err,
        });
    }

    /// One `ibv_wc` as the trait's completion.
    pub(super) fn completion(
        &self,
        wc: &ibv_wc,
        qps: &HashMap<u32, Arc<QueuePairEntry>>,
    ) -> Completion {
        let status = wc::status(wc.status);
        let recv = wc.wr_id & RECV_BIT != 0;
        let seq = wc.wr_id & !RECV_BIT;
        let looked_up = qps.get(&wc.qp_num).and_then(|q| {
            if recv {
                q.rq.lock().complete(seq)
            } else {
                q.sq.lock().complete(seq)
            }
        });
        let (wr_id, posted_as) =
            looked_up.unwrap_or((u64::MAX, if recv { WcOpcode::Recv } else { WcOpcode::Send }));
        if status != WcStatus::Success {
            self.record_error(wc, wr_id);
            if let Some(q) = qps.get(&wc.qp_num) {
                q.status.lock().failed(|| {
                    format!(
                        "work request {wr_id} ended with {} (ibv_wc_status {}, vendor syndrome {:#x})",
                        ffi::wc_status_str(wc.status),
                        wc.status,
                        wc.vendor_err
                    )
                });
            }
            return Completion {
                wr_id,
                status,
                opcode: posted_as,
                byte_len: 0,
                imm: None,
                qp_num: wc.qp_num,
            };
        }
        // Only the fields the verbs contract defines for this opcode: `wcs` is reused across
        // polls, and a provider leaves the others as an earlier completion wrote them.
        let fields = wc::success_fields(wc, posted_as);
        Completion {
            wr_id,
            status,
            opcode: fields.opcode,
            byte_len: fields.byte_len,
            imm: fields.imm,
            qp_num: wc.qp_num,
        }
    }
}
