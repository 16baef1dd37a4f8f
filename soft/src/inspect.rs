//! What a [`SoftNic`] tells about itself beyond the `Nic` trait: its rank and size, how it
//! reaches each peer, its pinning, settings and translation cache; and two hooks that let
//! tests play a hostile peer.

use crate::{inbox, ring, tpt_cache, MemlockLimit, ReceiveFaultSettings, SoftNic, SoftProfile};

impl SoftNic {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks the NIC is connected to (including itself).
    pub fn size(&self) -> usize {
        self.inner.peers.len()
    }

    /// Whether packets to `peer` go over TCP (a peer on another host, or
    /// `PAGEWIRE_SOFT_WIRE=tcp`) rather than through shared memory.
    pub fn uses_tcp(&self, peer: usize) -> bool {
        self.inner.peers.get(peer).is_some_and(|p| p.link.is_some())
    }

    /// Why the TCP connection to `peer` failed (a malformed frame, a reset, an end of
    /// stream without a goodbye), once it has; `None` while it stands, after an orderly
    /// goodbye, and for a peer reached through shared memory.
    pub fn link_failure(&self, peer: usize) -> Option<String> {
        self.inner.peers.get(peer)?.link.as_ref()?.failure()
    }

    /// For hostile-peer tests only: writes `bytes` on the TCP connection to `peer` as they
    /// are, after what is queued. False if `peer` is not reached by TCP or its connection is
    /// closed.
    #[doc(hidden)]
    pub fn send_raw_wire_bytes(&self, peer: usize, bytes: &[u8]) -> bool {
        let Some(p) = self.inner.peers.get(peer) else {
            return false;
        };
        let Some(l) = &p.link else {
            return false;
        };
        l.send_raw(&p.mem.ring_from(self.inner.rank), bytes)
    }

    /// Whether payloads to `peer` move by CMA (one kernel copy) rather than staged.
    pub fn uses_cma(&self, peer: usize) -> bool {
        self.inner.peers.get(peer).is_some_and(|p| p.cma)
    }

    /// The locked-memory limit in force and bytes pinned now.
    pub fn memlock(&self) -> (MemlockLimit, u64) {
        let r = self.inner.regions.lock();
        (r.pins.limit_value(), r.pins.pinned_bytes())
    }

    /// For hostile-peer tests only: publishes one packet into the ring to `peer` with header
    /// words 0..7 exactly as given (the ring's encoding, little-endian words: kind | flags<<8
    /// | code<<16 | imm<<32; dst_qpn | src_qpn<<32; msn; total_len; offset; remote_addr;
    /// rkey | payload_len<<32) and `payload` (at most one slot), checking nothing: what a
    /// peer that writes anything into the shared memory it maps can do. False if `peer` does
    /// not exist or its ring is full.
    #[doc(hidden)]
    pub fn publish_raw_packet(&self, peer: usize, header: [u64; 7], payload: &[u8]) -> bool {
        let Some(p) = self.inner.peers.get(peer) else {
            return false;
        };
        let ring = p.mem.ring_from(self.inner.rank);
        let Some(slot) = ring.reserve() else {
            return false;
        };
        slot.write_payload(&payload[..payload.len().min(ring::MTU)]);
        ring.publish_words(slot, header);
        inbox::announce(&ring, p.mem.pending(), self.inner.rank);
        p.mem.wake_driver_if_asleep();
        true
    }

    /// Which costs beyond the real ones this NIC charges (`PAGEWIRE_SOFT_PROFILE`).
    pub fn profile(&self) -> SoftProfile {
        self.inner.profile
    }

    /// Entries of this NIC's translation cache, 0 when it has none
    /// (`PAGEWIRE_SOFT_TPT_CACHE`).
    pub fn tpt_cache_entries(&self) -> usize {
        self.inner.own.tpt_cache().entries()
    }

    /// What this NIC does on a receive-side network page fault (`PAGEWIRE_SOFT_RNPF`).
    pub fn receive_fault(&self) -> ReceiveFaultSettings {
        self.inner.receive_fault
    }

    /// One line for reports on the translation cache (`tpt-cache: N entries ...`, with what
    /// it models), or `None` when the NIC has none.
    pub fn describe_tpt_cache(&self) -> Option<String> {
        let n = self.tpt_cache_entries();
        (n > 0).then(|| tpt_cache::describe(n))
    }

    /// One line: how this NIC pins registered memory, and whether regions stay bound to
    /// their pages (`PAGEWIRE_VERBOSE=1` prints it).
    pub fn describe_pinning(&self) -> String {
        let how = self.inner.regions.lock().pins.describe();
        if self.inner.bound.active() {
            format!("{how}; regions stay bound to their pages")
        } else {
            format!("{how}; regions follow their address range (no long-term pins or no memory monitor)")
        }
    }
}
