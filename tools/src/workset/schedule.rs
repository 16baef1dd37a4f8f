//! The working sets over time (Lesokhin17 §6.1): at the switch, one job's working set grows
//! from the small to the large size and the other's shrinks from the large to the small one
//! (the seed: 100 MB to 900 MB and back, at 50 s).

use std::time::Duration;

use serde::Serialize;

/// Which way a job's working set changes at the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// Small, then large (the seed's first memcached instance).
    Growing,
    /// Large, then small (the seed's second instance).
    Shrinking,
}

impl JobKind {
    /// Both jobs, in the order they are reported.
    pub const BOTH: [JobKind; 2] = [JobKind::Growing, JobKind::Shrinking];

    /// The name used in output lines and file names.
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Growing => "growing",
            JobKind::Shrinking => "shrinking",
        }
    }

    /// The inverse of [`JobKind::name`].
    pub fn from_name(name: &str) -> Option<JobKind> {
        JobKind::BOTH.into_iter().find(|k| k.name() == name)
    }
}

/// The working-set sizes, in items, over one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Items of the small working set.
    pub small_items: u64,
    /// Items of the large working set.
    pub large_items: u64,
    /// When the working sets change, from the start of the timed run.
    pub switch_at: Duration,
}

impl Schedule {
    /// The number of items `job` requests from (keys `0..n`) at `elapsed` into the run.
    pub fn items(&self, job: JobKind, elapsed: Duration) -> u64 {
        let before = elapsed < self.switch_at;
        match (job, before) {
            (JobKind::Growing, true) | (JobKind::Shrinking, false) => self.small_items,
            (JobKind::Growing, false) | (JobKind::Shrinking, true) => self.large_items,
        }
    }

    /// The largest working set `job` ever has, in items.
    pub fn peak_items(&self) -> u64 {
        self.small_items.max(self.large_items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_set_grows_and_the_other_shrinks_at_the_switch() {
        let s = Schedule {
            small_items: 5,
            large_items: 45,
            switch_at: Duration::from_secs(30),
        };
        let before = Duration::from_millis(29_999);
        let after = Duration::from_secs(30);
        assert_eq!(s.items(JobKind::Growing, Duration::ZERO), 5);
        assert_eq!(s.items(JobKind::Growing, before), 5);
        assert_eq!(s.items(JobKind::Growing, after), 45);
        assert_eq!(s.items(JobKind::Shrinking, before), 45);
        assert_eq!(s.items(JobKind::Shrinking, after), 5);
        assert_eq!(s.peak_items(), 45);
        assert_eq!(JobKind::from_name("shrinking"), Some(JobKind::Shrinking));
        assert_eq!(JobKind::from_name("other"), None);
    }
}
