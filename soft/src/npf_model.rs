//! Soft NIC profiles: which costs the NIC charges beyond the real ones.
//!
//! The default profile charges only what this machine really spends: the operating system's
//! work to map pages, the kernel copies, the driver thread's wake-up. A network page fault on
//! an HCA also costs the NIC's own hardware and firmware — detecting the fault, raising the
//! interrupt, walking the updated IOMMU tables and resuming the queue pair — which Lesokhin17
//! measured on a Connect-IB: a minor fault of a 4 KB message takes about 220 µs, "90% of
//! which is due to hardware (firmware)" (§4 and Fig. 3(a)), and Table 4 gives its tail. The
//! `npf-model` profile adds that hardware part, drawn per fault from Table 4's 4 KB row less
//! the OS's 10 %, on top of the real OS work; the counters keep the two apart
//! (`npf_os_ns`, `npf_model_ns`), so every report can say what was measured and what was
//! modelled.

use std::time::{Duration, Instant};

use pagewire_sys::error::{Error, Result};

/// Which costs the soft NIC charges (`PAGEWIRE_SOFT_PROFILE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SoftProfile {
    /// Only the real costs of this machine (`real`, the default).
    #[default]
    Real,
    /// The real costs plus the NIC hardware's part of every network page fault, modelled
    /// from Lesokhin17 Table 4 (`npf-model`).
    NpfModel,
}

impl SoftProfile {
    /// Parses a `PAGEWIRE_SOFT_PROFILE` value (`None`/empty is [`SoftProfile::Real`]).
    pub fn parse(value: Option<&str>) -> Result<SoftProfile> {
        match value.map(str::trim) {
            None | Some("") | Some("real") => Ok(SoftProfile::Real),
            Some("npf-model") => Ok(SoftProfile::NpfModel),
            Some(other) => Err(Error::invalid_setting(
                "PAGEWIRE_SOFT_PROFILE",
                other,
                "expected real or npf-model",
            )),
        }
    }

    /// The profile's name as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            SoftProfile::Real => "real",
            SoftProfile::NpfModel => "npf-model",
        }
    }

    /// One line for reports: what the profile charges.
    pub fn describe(self) -> &'static str {
        match self {
            SoftProfile::Real => "real: this machine's costs only",
            SoftProfile::NpfModel => {
                "npf-model: real costs + modelled NIC firmware time per network page fault \
                 (Lesokhin17 Table 4, 4 KB row less the OS's 10 %)"
            }
        }
    }

    /// Charges the modelled hardware part of one network page fault, if this profile has
    /// one: waits it out and returns the time waited in nanoseconds (0 on `real`).
    pub(crate) fn charge_npf_hardware(self) -> u64 {
        match self {
            SoftProfile::Real => 0,
            SoftProfile::NpfModel => {
                let us = firmware_us(rand::random::<f64>());
                wait_for(Duration::from_nanos((us * 1000.0) as u64))
            }
        }
    }
}

/// The hardware part of a minor fault as (cumulative probability, µs): Lesokhin17 Table 4's
/// 4 KB row (50 % 215, 95 % 250, 99 % 261, max 464 µs) less the software's 10 % of the
/// 220 µs mean (22 µs), which our own OS work replaces. The table gives nothing below the
/// median; the 5th and 0th percentiles mirror the 95th and 99th around it (an assumption).
/// The 4 MB row adds software time only ("due to software, as the OS must translate and
/// possibly allocate many more pages"), so the hardware part does not grow with the pages.
const FIRMWARE_QUANTILES_US: [(f64, f64); 6] = [
    (0.0, 147.0),
    (0.05, 158.0),
    (0.5, 193.0),
    (0.95, 228.0),
    (0.99, 239.0),
    (1.0, 442.0),
];

/// The hardware time at cumulative probability `u` (0..1): linear between the quantiles.
fn firmware_us(u: f64) -> f64 {
    let u = u.clamp(0.0, 1.0);
    for w in FIRMWARE_QUANTILES_US.windows(2) {
        let ((p0, t0), (p1, t1)) = (w[0], w[1]);
        if u <= p1 {
            return t0 + (t1 - t0) * (u - p0) / (p1 - p0);
        }
    }
    FIRMWARE_QUANTILES_US[FIRMWARE_QUANTILES_US.len() - 1].1
}

/// Waits `d` without holding a core for most of it (the firmware, not the host CPU, is busy):
/// sleeps all but the last 100 µs, then spins to the deadline, since a sleep may overshoot by
/// the timer slack (50 µs by default). Returns the time actually waited in nanoseconds.
pub(super) fn wait_for(d: Duration) -> u64 {
    const SPIN: Duration = Duration::from_micros(100);
    let start = Instant::now();
    if d > SPIN {
        std::thread::sleep(d - SPIN);
    }
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
    start.elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_bad_names_say_what_is_accepted() {
        assert_eq!(SoftProfile::parse(None).unwrap(), SoftProfile::Real);
        assert_eq!(SoftProfile::parse(Some("")).unwrap(), SoftProfile::Real);
        assert_eq!(
            SoftProfile::parse(Some(" npf-model ")).unwrap(),
            SoftProfile::NpfModel
        );
        let e = SoftProfile::parse(Some("fast")).unwrap_err().to_string();
        assert!(
            e.contains("PAGEWIRE_SOFT_PROFILE") && e.contains("npf-model"),
            "{e}"
        );
    }

    #[test]
    fn the_firmware_time_follows_seed_000_table_4_less_the_os_share() {
        // Table 4, 4 KB: 215 / 250 / 261 / 464 µs at 50 / 95 / 99 / 100 %, less 22 µs.
        assert_eq!(firmware_us(0.5), 193.0);
        assert_eq!(firmware_us(0.95), 228.0);
        assert_eq!(firmware_us(0.99), 239.0);
        assert_eq!(firmware_us(1.0), 442.0);
        assert_eq!(firmware_us(0.0), 147.0);
        assert_eq!(firmware_us(-1.0), 147.0);
        let mut last = 0.0;
        for i in 0..=1000 {
            let t = firmware_us(i as f64 / 1000.0);
            assert!(t >= last, "the quantile function is monotone");
            last = t;
        }
    }

    #[test]
    fn the_real_profile_charges_nothing_and_the_model_at_least_its_minimum() {
        assert_eq!(SoftProfile::Real.charge_npf_hardware(), 0);
        let ns = SoftProfile::NpfModel.charge_npf_hardware();
        assert!(ns >= 147_000, "{ns} ns");
    }
}
