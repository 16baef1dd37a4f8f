//! A fake registrar for the unit tests: records every call, checks that the cache
//! deregisters only what it registered and only once, and can simulate a locked-memory
//! limit and unmapped ranges.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::interval::Span;
use crate::registrar::{RegisterError, Registrar, Registration};

/// What the fake saw; shared, so a test can look after the cache is dropped.
#[derive(Debug, Default)]
pub(crate) struct FakeLog {
    next_key: u32,
    /// Registrations made and not yet deregistered, by lkey.
    pub live: BTreeMap<u32, Registration>,
    /// Every registration ever made, in order.
    pub registered: Vec<Registration>,
    /// Every deregistration, in order.
    pub deregistered: Vec<Registration>,
    /// Every `register` call (successful or not), in order.
    pub attempts: Vec<Span>,
    /// Contract breaches seen (deregistering something not live).
    pub violations: Vec<String>,
    /// Simulated locked-memory limit on live bytes.
    pub limit: Option<u64>,
    /// Ranges reported as not mapped.
    pub unmapped: Vec<Span>,
}

impl FakeLog {
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live.values().map(|r| r.len).sum()
    }
}

/// The fake registrar; clones share one log.
#[derive(Clone, Debug, Default)]
pub(crate) struct FakeRegistrar {
    pub log: Arc<Mutex<FakeLog>>,
}

impl FakeRegistrar {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Refuses registrations that would make live bytes exceed `bytes`.
    pub(crate) fn with_limit(bytes: u64) -> Self {
        let f = Self::default();
        f.log.lock().limit = Some(bytes);
        f
    }

    /// Reports `[addr, addr+len)` as not mapped from now on.
    pub(crate) fn unmap(&self, addr: u64, len: u64) {
        self.log.lock().unmapped.push(Span::new(addr, len).unwrap());
    }

    /// Live registrations' lkeys.
    pub(crate) fn live_keys(&self) -> Vec<u32> {
        self.log.lock().live.keys().copied().collect()
    }

    /// Whether `lkey` is live.
    pub(crate) fn is_live(&self, lkey: u32) -> bool {
        self.log.lock().live.contains_key(&lkey)
    }

    /// The spans deregistered, in order.
    pub(crate) fn deregistered_spans(&self) -> Vec<Span> {
        let log = self.log.lock();
        log.deregistered
            .iter()
            .map(|r| Span::new(r.addr, r.len).unwrap())
            .collect()
    }

    /// The spans registered, in order.
    pub(crate) fn registered_spans(&self) -> Vec<Span> {
        let log = self.log.lock();
        log.registered
            .iter()
            .map(|r| Span::new(r.addr, r.len).unwrap())
            .collect()
    }
}

impl Registrar for FakeRegistrar {
    fn register(&mut self, addr: u64, len: u64) -> Result<Registration, RegisterError> {
        let mut log = self.log.lock();
        let span = Span::new(addr, len).expect("the cache never asks for a wrapping range");
        log.attempts.push(span);
        if log.unmapped.iter().any(|u| u.overlaps(&span)) {
            return Err(RegisterError::NotMapped { addr, len });
        }
        if let Some(limit) = log.limit {
            if log.live_bytes() + len > limit {
                return Err(RegisterError::NoResources("fake memlock limit".into()));
            }
        }
        log.next_key += 1;
        let key = 0x1000 + log.next_key;
        let reg = Registration {
            addr,
            len,
            lkey: key,
            rkey: key | 0x8000_0000,
        };
        log.live.insert(key, reg);
        log.registered.push(reg);
        Ok(reg)
    }

    fn deregister(&mut self, reg: &Registration) -> Result<(), RegisterError> {
        let mut log = self.log.lock();
        log.deregistered.push(*reg);
        match log.live.remove(&reg.lkey) {
            Some(r) if r == *reg => Ok(()),
            Some(r) => {
                log.violations
                    .push(format!("deregistered {reg:?} but {r:?} was registered"));
                Ok(())
            }
            None => {
                log.violations
                    .push(format!("deregistered {reg:?}, which is not live"));
                Err(RegisterError::Other("not live".into()))
            }
        }
    }
}
