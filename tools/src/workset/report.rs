//! What the jobs print and how the driver reads it back: one `key=value` record per line,
//! the per-window counts of the clients (hits and misses per time window) and the final
//! counters of servers and clients; and the per-phase means of the summary.
//!
//! ```text
//! window job=growing t=12 hits=30512 misses=0
//! server job=growing store=file capacity_items=46080 items=46080 evictions=0 ...
//! ```

use std::collections::BTreeMap;

use super::schedule::JobKind;

/// One output line: a kind (its first word) and `key=value` fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// `window`, `server`, `client`.
    pub kind: String,
    /// The fields, by key.
    pub fields: BTreeMap<String, String>,
}

impl Record {
    /// Parses `kind key=value ...`; `None` for any other line (launcher notes, blank lines)
    /// or a line whose words after the first are not all `key=value`.
    pub fn parse(line: &str) -> Option<Record> {
        let mut words = line.split_whitespace();
        let kind = words.next()?;
        if !matches!(kind, "window" | "server" | "client") {
            return None;
        }
        let mut fields = BTreeMap::new();
        for w in words {
            let (k, v) = w.split_once('=')?;
            fields.insert(k.to_string(), v.to_string());
        }
        Some(Record {
            kind: kind.to_string(),
            fields,
        })
    }

    /// Field `key` as a number (0 when absent or not a number).
    pub fn num(&self, key: &str) -> u64 {
        self.fields
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Field `key` as text.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// The job the record is about.
    pub fn job(&self) -> Option<JobKind> {
        self.text("job").and_then(JobKind::from_name)
    }
}

/// One time window of one job's client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The job.
    pub job: JobKind,
    /// The window's index: it covers seconds `[t, t+1) * window length`.
    pub t: u64,
    /// GETs answered with the item.
    pub hits: u64,
    /// GETs answered "miss" (the client then stores the item).
    pub misses: u64,
}

impl Window {
    /// The line a client prints for it.
    pub fn line(&self) -> String {
        format!(
            "window job={} t={} hits={} misses={}",
            self.job.name(),
            self.t,
            self.hits,
            self.misses
        )
    }

    /// The window of a `window` record.
    pub fn from_record(r: &Record) -> Option<Window> {
        (r.kind == "window").then_some(())?;
        Some(Window {
            job: r.job()?,
            t: r.text("t")?.parse().ok()?,
            hits: r.text("hits")?.parse().ok()?,
            misses: r.text("misses")?.parse().ok()?,
        })
    }
}

/// Every record of a job's output.
pub fn records(output: &str) -> Vec<Record> {
    output.lines().filter_map(Record::parse).collect()
}

/// Every window of a job's output, in order.
pub fn windows(output: &str) -> Vec<Window> {
    records(output)
        .iter()
        .filter_map(Window::from_record)
        .collect()
}

/// The mean hits per second of the windows whose start lies in `[from, to)` seconds;
/// `None` without any.
pub fn mean_hits_per_sec(windows: &[Window], window_secs: f64, from: f64, to: f64) -> Option<f64> {
    let picked: Vec<&Window> = windows
        .iter()
        .filter(|w| {
            let start = w.t as f64 * window_secs;
            start >= from && start + window_secs <= to + 1e-9
        })
        .collect();
    (!picked.is_empty()).then(|| {
        picked.iter().map(|w| w.hits as f64).sum::<f64>() / (picked.len() as f64 * window_secs)
    })
}

/// The share of GETs that hit, over the windows whose start lies in `[from, to)` seconds;
/// `None` without any GET.
pub fn hit_ratio(windows: &[Window], window_secs: f64, from: f64, to: f64) -> Option<f64> {
    let (hits, gets) = windows
        .iter()
        .filter(|w| {
            let start = w.t as f64 * window_secs;
            start >= from && start + window_secs <= to + 1e-9
        })
        .fold((0u64, 0u64), |(h, g), w| {
            (h + w.hits, g + w.hits + w.misses)
        });
    (gets > 0).then(|| hits as f64 / gets as f64)
}

/// The two steady phases the summary compares: the second half of the time before the
/// switch and the second half of the time after it (the first halves hold the warm-up of
/// the timing and the transition after the switch, Lesokhin17 Fig. 7's "short transition
/// period").
pub fn steady_phases(switch_at: f64, duration: f64) -> [(f64, f64); 2] {
    [
        (switch_at / 2.0, switch_at),
        (switch_at + (duration - switch_at) / 2.0, duration),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_round_trip_and_other_lines_are_skipped() {
        let w = Window {
            job: JobKind::Shrinking,
            t: 3,
            hits: 1000,
            misses: 20,
        };
        let out = format!(
            "pwrun: note\n{}\nserver job=shrinking store=anon evictions=7\nwindow job=growing t=x hits=1 misses=1\nwindow bad\n",
            w.line()
        );
        assert_eq!(windows(&out), vec![w]);
        let recs = records(&out);
        assert_eq!(recs.len(), 3, "{recs:?}");
        assert_eq!(recs[1].kind, "server");
        assert_eq!(recs[1].num("evictions"), 7);
        assert_eq!(recs[1].text("store"), Some("anon"));
        assert_eq!(recs[1].job(), Some(JobKind::Shrinking));
        assert_eq!(recs[1].num("missing"), 0);
        assert!(Record::parse("window job=growing stray").is_none());
    }

    #[test]
    fn phase_means_take_whole_windows_inside_the_phase() {
        let ws: Vec<Window> = (0..10)
            .map(|t| Window {
                job: JobKind::Growing,
                t,
                hits: if t < 5 { 100 } else { 40 },
                misses: 0,
            })
            .collect();
        let [a, b] = steady_phases(5.0, 10.0);
        assert_eq!((a, b), ((2.5, 5.0), (7.5, 10.0)));
        // Windows 3 and 4 (whole inside [2.5, 5)), at 100 hits per 1-s window.
        assert_eq!(mean_hits_per_sec(&ws, 1.0, a.0, a.1), Some(100.0));
        assert_eq!(mean_hits_per_sec(&ws, 1.0, b.0, b.1), Some(40.0));
        // Half-second windows: 100 hits each is 200 hits/s.
        assert_eq!(mean_hits_per_sec(&ws, 0.5, 1.5, 2.5), Some(200.0));
        assert_eq!(mean_hits_per_sec(&ws, 1.0, 20.0, 30.0), None);
        let mut missing = ws.clone();
        missing[3].misses = 100;
        // Windows 3 and 4: 200 hits of 300 GETs.
        assert_eq!(hit_ratio(&missing, 1.0, a.0, a.1), Some(200.0 / 300.0));
        assert_eq!(hit_ratio(&missing, 1.0, 20.0, 30.0), None);
    }
}
