//! How a universe is configured ([`UniverseConfig`], from the `PAGEWIRE_*` variables): what
//! carries the calls ([`TransportKind`], which chooses the backend) and pagewire's buffer mode
//! ([`ModeKind`]) and settings.

use pagewire_odp::OdpConfig;
use pagewire_transport::buffer_mode::copy::CopyConfig;
use pagewire_transport::msg::MsgConfig;

use crate::error::{Error, Result};

/// Which buffer mode moves user buffers (`PAGEWIRE_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeKind {
    /// Pinned bounce buffers, pipelined.
    Copy,
    /// On-demand paging: unpinned user buffers, network page faults, prefetch.
    Odp,
    /// Registration in place, kept in a pin-down cache.
    Pindown,
}

/// What carries the facade's calls (`PAGEWIRE_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// pagewire's message layer on one of its NIC providers (`PAGEWIRE_TRANSPORT=soft`, the
    /// default, or `verbs`) in the buffer mode of `PAGEWIRE_MODE`.
    Pagewire,
    /// The host MPI library (`PAGEWIRE_TRANSPORT=mpi`; feature `mpi`, under `mpirun`):
    /// every point-to-point and collective call is forwarded to it, so one binary measures
    /// pagewire and the MPI library side by side.
    HostMpi,
}

/// Everything [`Universe::from_config`](crate::Universe::from_config) needs;
/// [`UniverseConfig::from_env`] reads it from the `PAGEWIRE_*` variables.
#[derive(Clone, Debug)]
pub struct UniverseConfig {
    /// What carries the calls.
    pub transport: TransportKind,
    /// The buffer mode.
    pub mode: ModeKind,
    /// The copy mode's pool.
    pub copy: CopyConfig,
    /// The ODP mode's regions and prefetch policy.
    pub odp: OdpConfig,
    /// The message layer.
    pub msg: MsgConfig,
}

impl UniverseConfig {
    /// Reads `PAGEWIRE_TRANSPORT` (`mpi`, or a NIC provider that
    /// [`nic::open`](crate::nic::open) checks), `PAGEWIRE_MODE` (`copy`, `pindown` or `odp`),
    /// the modes' and the message layer's settings.
    /// First, every `PAGEWIRE_*` variable must be a setting
    /// ([`check_environment`](pagewire_transport::env::settings::check_environment)): a
    /// misspelt one is an error naming the setting meant.
    pub fn from_env() -> Result<UniverseConfig> {
        pagewire_transport::env::settings::check_environment()?;
        let transport = match std::env::var("PAGEWIRE_TRANSPORT").as_deref() {
            Ok("mpi") if cfg!(feature = "mpi") => TransportKind::HostMpi,
            Ok("mpi") => return Err(no_mpi_feature()),
            _ => TransportKind::Pagewire,
        };
        let mode = match std::env::var("PAGEWIRE_MODE").as_deref() {
            Err(_) | Ok("") | Ok("copy") => ModeKind::Copy,
            Ok("odp") => ModeKind::Odp,
            Ok("pindown") => ModeKind::Pindown,
            Ok(other) => {
                return Err(Error::InvalidSetting {
                    variable: "PAGEWIRE_MODE".into(),
                    value: other.into(),
                    accepted: "expected copy, pindown or odp".into(),
                })
            }
        };
        if transport == TransportKind::Pagewire {
            check_stack_settings()?;
        }
        Ok(UniverseConfig {
            transport,
            mode,
            copy: CopyConfig::from_env()?,
            odp: OdpConfig::from_env()?,
            msg: MsgConfig::from_env()?,
        })
    }
}

/// Prints every user setting, its value and where it came from (`PAGEWIRE_VERBOSE=1`).
pub(crate) fn print_settings_in_force() {
    for line in pagewire_transport::env::settings::in_force().lines() {
        eprintln!("pagewire: setting {line}");
    }
}

/// What `PAGEWIRE_TRANSPORT=mpi` gives in a build without the `mpi` feature.
pub(crate) fn no_mpi_feature() -> Error {
    Error::NotSupported(
        "PAGEWIRE_TRANSPORT=mpi, but pagewire was built without the `mpi` feature; rebuild \
         with `--features mpi` (it needs an MPI library: Debian's libmpich-dev, libclang-dev \
         and pkg-config) and start the program with mpirun, or use pagewire's own transport \
         (PAGEWIRE_TRANSPORT=soft)"
            .into(),
    )
}

/// Checks the settings that pagewire's stack reads only once it starts: the soft NIC's
/// (`PAGEWIRE_SOFT_*`, `PAGEWIRE_PIN`, `PAGEWIRE_MEMLOCK_LIMIT`), the pin-down cache's
/// strategy, policy, limits and invalidation switch, the memory monitor, and the
/// collectives' tuning. So a program that starts its own ranks
/// (`self_launch`) can report a bad value once, before it starts them, instead of once per
/// rank; the ranks read the same values again when they start.
fn check_stack_settings() -> Result<()> {
    use pagewire_transport::nic::{soft::SoftConfig, ProviderKind};
    if ProviderKind::from_env()? == ProviderKind::Soft {
        SoftConfig::from_env()?;
    }
    pagewire_pindown::Strategy::from_env()?;
    pagewire_pindown::Policy::from_env().map_err(pindown_setting)?;
    pagewire_pindown::mode::memlock_limit_from_env()?;
    pagewire_pindown::Limits::from_env(None, 0).map_err(pindown_setting)?;
    pagewire_pindown::mode::invalidation_from_env()?;
    pagewire_transport::memmon::MonitorChoice::parse(
        std::env::var("PAGEWIRE_MEMMON").ok().as_deref(),
    )?;
    pagewire_collectives::tuning::Tuning::from_env()?;
    Ok(())
}

/// The pin-down cache's error reading a setting as the facade's: a bad value stays an
/// [`Error::InvalidSetting`] naming the variable, whatever crate read it.
fn pindown_setting(e: pagewire_pindown::Error) -> Error {
    match e {
        pagewire_pindown::Error::Config {
            variable,
            value,
            accepted,
        } => Error::InvalidSetting {
            variable,
            value,
            accepted,
        },
        other => Error::BufferMode {
            mode: "pindown",
            source: Box::new(other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::pindown_setting;
    use crate::{Error, ErrorClass};

    #[test]
    fn a_bad_pindown_value_is_an_invalid_setting_naming_it() {
        let e = pagewire_pindown::Policy::from_lookup(|_| Some("mru".into()))
            .map_err(pindown_setting)
            .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidSetting { variable, value, .. }
                if variable == "PAGEWIRE_PINDOWN_POLICY" && value == "mru"),
            "{e:?}"
        );
        assert_eq!(e.class(), ErrorClass::Arg);
        assert_eq!(
            e.to_string(),
            "PAGEWIRE_PINDOWN_POLICY=mru: expected lru, lfu, fifo or size"
        );
    }
}
