//! What the soft NIC does when a request's data arrives for pages it has no translation
//! for, a receive-side network page fault (rNPF; Lesokhin17 §4-5 and
//! Fig. 10). One policy per job (`PAGEWIRE_SOFT_RNPF`):
//!
//! - **`rnr`** (the default; Lesokhin17 §4, the InfiniBand design): the responder answers
//!   receiver-not-ready at once and files the fault; the requester pauses and retransmits
//!   as soon as the fault is resolved ("a relatively short NPF-specific timeout").
//! - **`drop`** (what RC must do for a READ response, and what a plain Ethernet NIC does):
//!   the request is discarded without a word, its fault filed, and every later packet of
//!   the queue pair is discarded too until the requester's retransmission timer
//!   (`PAGEWIRE_SOFT_ACK_TIMEOUT`, IB's `timeout`: 4.096 µs × 2^N) fires and it goes back
//!   to the dropped request (go-back-N).
//! - **`backup`** (Lesokhin17 §5, Figs. 5-6): a SEND that faults is stored in a small pinned
//!   per-connection ring (`PAGEWIRE_SOFT_BACKUP_RING` bytes, at most
//!   [`BACKUP_RING_MAX_MESSAGES`] messages) and acknowledged; once the fault is resolved
//!   the NIC's driver copies it into the receive buffer. Later messages go straight to
//!   their buffers, but no completion is reported before those of the messages parked
//!   ahead of them. A SEND the ring has no room for is dropped (as above). RDMA WRITEs have
//!   no receive ring to back up; they are answered receiver-not-ready, as an InfiniBand
//!   NIC does.
//!
//! Under every policy a READ request whose source pages are not present is answered
//! receiver-not-ready: that fault is the responder's own, on data it sends (Lesokhin17: "as
//! the faulting data is local"), not an incoming packet.

use pagewire_sys::env::parse_bytes;
use pagewire_sys::error::{Error, Result};

/// Messages the backup ring holds at most per queue pair (Lesokhin17 Fig. 6's `bm_size`).
pub const BACKUP_RING_MAX_MESSAGES: usize = 64;

/// The retransmission timeout's default exponent: 14, 67 ms, what perftest's `ib_send_bw`
/// and most verbs programs set.
pub const DEFAULT_ACK_TIMEOUT: u8 = 14;

/// The backup ring's default size per queue pair: 512 KiB, eight 64 KiB messages.
pub const DEFAULT_BACKUP_RING_BYTES: u64 = 512 << 10;

/// What the receiving NIC does on a receive-side network page fault.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReceiveFaultPolicy {
    /// Answer receiver-not-ready (`rnr`).
    #[default]
    Rnr,
    /// Discard silently; the requester's timer retransmits (`drop`).
    Drop,
    /// Store SENDs in a pinned backup ring and copy them into place later (`backup`).
    Backup,
}

/// The receive-fault settings of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveFaultSettings {
    /// The policy (`PAGEWIRE_SOFT_RNPF`).
    pub policy: ReceiveFaultPolicy,
    /// The requester's retransmission timeout as IB's exponent: 4.096 µs × 2^N
    /// (`PAGEWIRE_SOFT_ACK_TIMEOUT`, 1 to 31). The soft NIC loses no packet of its own, so
    /// the timer runs only under `drop` and `backup`, whose NICs discard requests.
    pub ack_timeout: u8,
    /// Bytes of each queue pair's backup ring under `backup` (`PAGEWIRE_SOFT_BACKUP_RING`).
    pub backup_ring_bytes: u64,
}

impl Default for ReceiveFaultSettings {
    fn default() -> Self {
        ReceiveFaultSettings {
            policy: ReceiveFaultPolicy::Rnr,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            backup_ring_bytes: DEFAULT_BACKUP_RING_BYTES,
        }
    }
}

impl ReceiveFaultSettings {
    /// Parses the three settings (`None` or empty: the default).
    pub fn parse(
        policy: Option<&str>,
        ack_timeout: Option<&str>,
        backup_ring: Option<&str>,
    ) -> Result<ReceiveFaultSettings> {
        let policy = match policy.map(str::trim) {
            None | Some("") | Some("rnr") => ReceiveFaultPolicy::Rnr,
            Some("drop") => ReceiveFaultPolicy::Drop,
            Some("backup") => ReceiveFaultPolicy::Backup,
            Some(other) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_SOFT_RNPF",
                    other,
                    "expected rnr, drop or backup",
                ))
            }
        };
        let mut s = ReceiveFaultSettings {
            policy,
            ..ReceiveFaultSettings::default()
        };
        if let Some(v) = ack_timeout.map(str::trim).filter(|v| !v.is_empty()) {
            s.ack_timeout = v
                .parse::<u8>()
                .ok()
                .filter(|n| (1..=31).contains(n))
                .ok_or_else(|| {
                    Error::invalid_setting(
                        "PAGEWIRE_SOFT_ACK_TIMEOUT",
                        v,
                        "expected IB's timeout exponent, 1 to 31 (4.096 µs × 2^N; 14 is 67 ms)",
                    )
                })?;
        }
        if let Some(v) = backup_ring.map(str::trim).filter(|v| !v.is_empty()) {
            s.backup_ring_bytes = parse_bytes(v)
                .flatten()
                .filter(|&n| (4096..=1 << 30).contains(&n))
                .ok_or_else(|| {
                    Error::invalid_setting(
                        "PAGEWIRE_SOFT_BACKUP_RING",
                        v,
                        "expected bytes from 4K to 1G, like 512K",
                    )
                })?;
        }
        Ok(s)
    }

    /// Reads `PAGEWIRE_SOFT_RNPF`, `PAGEWIRE_SOFT_ACK_TIMEOUT` and `PAGEWIRE_SOFT_BACKUP_RING`.
    pub fn from_env() -> Result<ReceiveFaultSettings> {
        let var = |n: &str| std::env::var(n).ok();
        Self::parse(
            var("PAGEWIRE_SOFT_RNPF").as_deref(),
            var("PAGEWIRE_SOFT_ACK_TIMEOUT").as_deref(),
            var("PAGEWIRE_SOFT_BACKUP_RING").as_deref(),
        )
    }

    /// The retransmission timeout in nanoseconds, when the requester's timer runs (`drop`
    /// and `backup`; `None` under `rnr`).
    pub fn retransmit_after_ns(&self) -> Option<u64> {
        (self.policy != ReceiveFaultPolicy::Rnr).then(|| 4096u64 << self.ack_timeout)
    }

    /// The policy's name as reports print it.
    pub fn name(&self) -> &'static str {
        match self.policy {
            ReceiveFaultPolicy::Rnr => "rnr",
            ReceiveFaultPolicy::Drop => "drop",
            ReceiveFaultPolicy::Backup => "backup",
        }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let timeout_ms = (4096u64 << self.ack_timeout) as f64 / 1e6;
        match self.policy {
            ReceiveFaultPolicy::Rnr => "receive faults: rnr (receiver-not-ready)".to_string(),
            ReceiveFaultPolicy::Drop => format!(
                "receive faults: drop, retransmission after {timeout_ms:.3} ms \
                 (PAGEWIRE_SOFT_ACK_TIMEOUT={})",
                self.ack_timeout
            ),
            ReceiveFaultPolicy::Backup => format!(
                "receive faults: backup ring of {} KiB per queue pair (at most {} messages), \
                 drop when full with retransmission after {timeout_ms:.3} ms",
                self.backup_ring_bytes >> 10,
                BACKUP_RING_MAX_MESSAGES
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_with_defaults_and_clear_errors() {
        let d = ReceiveFaultSettings::parse(None, None, None).unwrap();
        assert_eq!(d, ReceiveFaultSettings::default());
        assert_eq!(d.retransmit_after_ns(), None);
        let s = ReceiveFaultSettings::parse(Some("drop"), Some("8"), None).unwrap();
        assert_eq!(s.policy, ReceiveFaultPolicy::Drop);
        assert_eq!(s.retransmit_after_ns(), Some(4096 << 8)); // 1.05 ms
        let b = ReceiveFaultSettings::parse(Some("backup"), None, Some("64K")).unwrap();
        assert_eq!(
            (b.policy, b.backup_ring_bytes),
            (ReceiveFaultPolicy::Backup, 64 << 10)
        );
        assert_eq!(b.retransmit_after_ns(), Some(4096 << 14));
        for (p, t, r, var) in [
            (Some("nak"), None, None, "PAGEWIRE_SOFT_RNPF=nak"),
            (None, Some("0"), None, "PAGEWIRE_SOFT_ACK_TIMEOUT=0"),
            (None, Some("32"), None, "PAGEWIRE_SOFT_ACK_TIMEOUT=32"),
            (None, None, Some("1K"), "PAGEWIRE_SOFT_BACKUP_RING=1K"),
            (None, None, Some("lots"), "PAGEWIRE_SOFT_BACKUP_RING=lots"),
        ] {
            let e = ReceiveFaultSettings::parse(p, t, r)
                .unwrap_err()
                .to_string();
            assert!(e.contains(var), "{e}");
        }
    }
}
