//! A registrar that watches every range it registers with a memory monitor
//! (`transport::memmon`), so the cache hears when memory under a registration changes
//! (Wyckoff05's `dreg` design: the OS tells the cache).
//!
//! Per the monitor's contract, a range is subscribed *before* it is registered, so a change
//! between the two is seen. A range the monitor cannot watch (System V shared memory, most
//! file mappings) is still registered, but marked unwatched: the mode must not keep it
//! cached after its transfer.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use pagewire_transport::memmon::{MemoryMonitor, SubscriptionId};
use pagewire_transport::nic::Nic;

use crate::registrar::{NicRegistrar, RegisterError, Registrar, Registration};

/// [`NicRegistrar`] plus a memory-monitor subscription per registration.
pub struct MonitoredRegistrar<P> {
    inner: NicRegistrar<P>,
    monitor: Arc<dyn MemoryMonitor>,
    /// Subscription per registration (by local key); `None`: the range is not watchable.
    watched: HashMap<u32, Option<SubscriptionId>>,
}

impl<P> std::fmt::Debug for MonitoredRegistrar<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MonitoredRegistrar")
            .field("registrations", &self.watched.len())
            .finish()
    }
}

impl<P> MonitoredRegistrar<P>
where
    P: Deref,
    P::Target: Nic,
{
    /// Registers through `inner` and watches with `monitor`.
    pub fn new(inner: NicRegistrar<P>, monitor: Arc<dyn MemoryMonitor>) -> Self {
        MonitoredRegistrar {
            inner,
            monitor,
            watched: HashMap::new(),
        }
    }

    /// Whether changes to the registration with local key `lkey` are delivered.
    pub fn is_watched(&self, lkey: u32) -> bool {
        matches!(self.watched.get(&lkey), Some(Some(_)))
    }

    /// The monitor.
    pub fn monitor(&self) -> &Arc<dyn MemoryMonitor> {
        &self.monitor
    }
}

impl<P> Registrar for MonitoredRegistrar<P>
where
    P: Deref,
    P::Target: Nic,
{
    fn register(&mut self, addr: u64, len: u64) -> Result<Registration, RegisterError> {
        let sub = self.monitor.subscribe(addr, len).ok();
        match self.inner.register(addr, len) {
            Ok(r) => {
                self.watched.insert(r.lkey, sub);
                Ok(r)
            }
            Err(e) => {
                if let Some(s) = sub {
                    self.monitor.unsubscribe(s);
                }
                Err(e)
            }
        }
    }

    fn deregister(&mut self, reg: &Registration) -> Result<(), RegisterError> {
        if let Some(Some(s)) = self.watched.remove(&reg.lkey) {
            self.monitor.unsubscribe(s);
        }
        self.inner.deregister(reg)
    }
}
