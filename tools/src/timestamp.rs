//! Dates as C's `ctime`/`asctime` print them (`Sun Nov 22 05:58:31 2026`): IMB's `# Date`
//! line and b_eff's summary. Like the originals, in the local time zone.

use chrono::{DateTime, Local, TimeZone, Utc};

/// `t` in `asctime`'s layout (day of month padded to two places with a space).
pub fn ctime<Tz: TimeZone>(t: &DateTime<Tz>) -> String
where
    Tz::Offset: std::fmt::Display,
{
    t.format("%a %b %e %H:%M:%S %Y").to_string()
}

/// `secs` since the epoch, in local time.
pub fn ctime_local(secs: i64) -> String {
    match Local.timestamp_opt(secs, 0).single() {
        Some(t) => ctime(&t),
        None => ctime_utc(secs),
    }
}

/// `secs` since the epoch, in UTC.
pub fn ctime_utc(secs: i64) -> String {
    ctime(&Utc.timestamp_opt(secs, 0).single().unwrap_or_default())
}

/// Now, in local time.
pub fn ctime_now() -> String {
    ctime(&Local::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asctime_layout() {
        assert_eq!(ctime_utc(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(ctime_utc(1_795_325_678), "Sun Nov 22 05:34:38 2026");
        assert_eq!(ctime_utc(951_782_400), "Tue Feb 29 00:00:00 2000");
        assert_eq!(ctime_now().len(), 24);
    }
}
