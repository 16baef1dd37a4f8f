//! Settings read from the environment, shared by the layers that read them (the lowest
//! module but `sys`: it depends on nothing above the error type), and the table of them all
//! ([`settings`]).

pub mod settings;

use crate::error::{Error, Result};

/// Reads a byte count (`65536`, `64K`, `8M`, `1G`) from variable `name`; `None` when unset.
pub fn bytes(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => match parse_bytes(&v) {
            Some(Some(n)) => Ok(Some(n as usize)),
            _ => Err(Error::invalid_setting(
                name,
                v,
                "expected a number of bytes like 65536 or 256K",
            )),
        },
    }
}

/// Parses `65536`, `64K`, `8M`, `1G` or `unlimited` (outer `None` = invalid).
pub fn parse_bytes(s: &str) -> Option<Option<u64>> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("unlimited") {
        return Some(None);
    }
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_byte_count_names_the_variable_and_what_it_accepts() {
        std::env::set_var("PAGEWIRE_TEST_ENV_BYTES", "12 parsecs");
        let e = bytes("PAGEWIRE_TEST_ENV_BYTES").unwrap_err();
        let Error::InvalidSetting {
            variable, value, ..
        } = &e
        else {
            panic!("expected InvalidSetting, got {e:?}");
        };
        assert_eq!(
            (variable.as_str(), value.as_str()),
            ("PAGEWIRE_TEST_ENV_BYTES", "12 parsecs")
        );
        assert!(e
            .to_string()
            .starts_with("PAGEWIRE_TEST_ENV_BYTES=12 parsecs: expected"));
        std::env::set_var("PAGEWIRE_TEST_ENV_BYTES", "64K");
        assert_eq!(bytes("PAGEWIRE_TEST_ENV_BYTES").unwrap(), Some(64 << 10));
        std::env::remove_var("PAGEWIRE_TEST_ENV_BYTES");
        assert_eq!(bytes("PAGEWIRE_TEST_ENV_BYTES").unwrap(), None);
    }
}
