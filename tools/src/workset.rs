//! A dynamic working set under one memory budget (Lesokhin17 §6.1,
//! Fig. 7), behind `pw-workset`.
//!
//! Two jobs, each a server rank holding an LRU item store and a client rank requesting
//! items uniformly from its working set ([`job`]), run at once in one memory cgroup whose
//! limit is the budget ([`cgroup`], [`driver`]). At the switch one working set grows nine
//! times and the other shrinks nine times ([`schedule`]). With pinning (`pindown`) the
//! budget is split statically, half per store, so the job with the large working set always
//! misses; with on-demand paging (`odp`) each store may hold its largest working set, the
//! stores are unpinned and the kernel moves the budget to the job that uses it. The clients
//! count hits and misses per time window ([`report`]); [`plot`] draws them as Lesokhin17's
//! Fig. 7 (a: ODP per job, b: pinned per job, c: combined).

pub mod cgroup;
pub mod driver;
pub mod job;
pub mod plot;
pub mod report;
pub mod schedule;
pub mod store;

use std::path::PathBuf;
use std::time::Duration;

pub use job::{JobConfig, StoreKind};
pub use schedule::{JobKind, Schedule};

/// One job's settings as the driver passes them to the job's processes (the hidden
/// `pw-workset job` subcommand).
#[derive(Clone, Debug, clap::Args)]
pub struct JobArgs {
    /// Which way the working set changes.
    #[arg(long, value_enum)]
    pub job: JobKind,
    /// The store's memory.
    #[arg(long, value_enum)]
    pub store: StoreKind,
    /// The store's file (with `--store file`).
    #[arg(long)]
    pub store_path: PathBuf,
    /// Items per store.
    #[arg(long)]
    pub capacity_items: u64,
    /// Bytes per item.
    #[arg(long)]
    pub item_size: usize,
    /// Items of the small working set.
    #[arg(long)]
    pub small_items: u64,
    /// Items of the large working set.
    #[arg(long)]
    pub large_items: u64,
    /// The timed run, ms.
    #[arg(long)]
    pub duration_ms: u64,
    /// The switch, ms into the run.
    #[arg(long)]
    pub switch_at_ms: u64,
    /// Reporting window, ms.
    #[arg(long)]
    pub window_ms: u64,
    /// Where the start signals go.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Register (pin) the whole store at the start.
    #[arg(long)]
    pub pin_store: bool,
}

impl JobArgs {
    /// The arguments that parse back into `self`.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--job".into(),
            self.job.name().into(),
            "--store".into(),
            match self.store {
                StoreKind::Anon => "anon".into(),
                StoreKind::File => "file".into(),
            },
            "--store-path".into(),
            self.store_path.display().to_string(),
            "--capacity-items".into(),
            self.capacity_items.to_string(),
            "--item-size".into(),
            self.item_size.to_string(),
            "--small-items".into(),
            self.small_items.to_string(),
            "--large-items".into(),
            self.large_items.to_string(),
            "--duration-ms".into(),
            self.duration_ms.to_string(),
            "--switch-at-ms".into(),
            self.switch_at_ms.to_string(),
            "--window-ms".into(),
            self.window_ms.to_string(),
            "--run-dir".into(),
            self.run_dir.display().to_string(),
        ];
        if self.pin_store {
            v.push("--pin-store".into());
        }
        v
    }

    /// The job's configuration.
    pub fn config(&self) -> JobConfig {
        JobConfig {
            job: self.job,
            store: self.store,
            store_path: self.store_path.clone(),
            capacity_items: self.capacity_items,
            item_size: self.item_size,
            schedule: Schedule {
                small_items: self.small_items,
                large_items: self.large_items,
                switch_at: Duration::from_millis(self.switch_at_ms),
            },
            duration: Duration::from_millis(self.duration_ms),
            window: Duration::from_millis(self.window_ms),
            run_dir: self.run_dir.clone(),
            pin_store: self.pin_store,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: JobArgs,
    }

    #[test]
    fn job_arguments_round_trip() {
        let a = JobArgs {
            job: JobKind::Shrinking,
            store: StoreKind::File,
            store_path: "/var/tmp/x/store".into(),
            capacity_items: 46_080,
            item_size: 20_480,
            small_items: 5_120,
            large_items: 46_080,
            duration_ms: 60_000,
            switch_at_ms: 30_000,
            window_ms: 1_000,
            run_dir: "/var/tmp/x".into(),
            pin_store: true,
        };
        let argv = std::iter::once("pw-workset".to_string()).chain(a.to_args());
        let b = Wrap::try_parse_from(argv).unwrap().args;
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let c = b.config();
        assert_eq!(c.schedule.items(JobKind::Shrinking, Duration::ZERO), 46_080);
        assert_eq!(
            c.schedule
                .items(JobKind::Shrinking, Duration::from_secs(30)),
            5_120
        );
    }
}
