//! A launch's jobs: the one `pwrun -n` started and those its ranks spawned (module
//! `boot::spawn`), supervised together. A spawn adds two jobs: the spawned processes (their
//! world) and the connection job between them and the spawning group, which has a socket
//! and a server but no processes of its own. The launch succeeds when every process of every
//! job has exited 0; the first that fails stops them all, as when no process was spawned.

use std::sync::mpsc;

use super::*;
use crate::spawn::{ConnectionJob, SpawnRequest};

/// Most processes one spawn may start.
const MAX_SPAWNED: usize = 4096;

/// Spawn requests from the connection threads to the launcher's main thread, which starts
/// processes (their parent-death signal is tied to the thread that spawns them).
#[derive(Default)]
pub(crate) struct SpawnQueue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    /// The launch is ending: no more spawns.
    closed: bool,
    pending: Vec<PendingSpawn>,
}

/// A request waiting for the main thread, and where its answer goes.
struct PendingSpawn {
    /// The job whose rank asked.
    job: String,
    request: SpawnRequest,
    answer: mpsc::Sender<std::result::Result<ConnectionJob, String>>,
}

impl SpawnQueue {
    /// Queues `request` from a rank of job `job` and waits for the main thread's answer.
    pub(crate) fn submit(
        &self,
        job: &str,
        request: SpawnRequest,
    ) -> std::result::Result<ConnectionJob, String> {
        let (answer, reply) = mpsc::channel();
        {
            let mut st = self.state.lock();
            if st.closed {
                return Err("the launcher is stopping the job".into());
            }
            st.pending.push(PendingSpawn {
                job: job.to_string(),
                request,
                answer,
            });
        }
        reply
            .recv()
            .unwrap_or_else(|_| Err("the launcher is stopping the job".into()))
    }

    fn take(&self) -> Vec<PendingSpawn> {
        std::mem::take(&mut self.state.lock().pending)
    }

    /// Refuses every waiting and later request.
    fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        st.pending.clear();
    }
}

/// The jobs of one launch: the first is the one `pwrun -n` started.
pub(crate) struct JobFamily {
    jobs: Vec<Job>,
    spawns: Arc<SpawnQueue>,
    /// The first job's extra environment, which spawned processes get too (as mpiexec
    /// passes its `-env` variables on to spawned processes).
    env: Vec<(OsString, OsString)>,
}

impl JobFamily {
    /// The family of `first`, whose ranks may spawn.
    pub(crate) fn new(first: Job, cfg: &LaunchConfig) -> JobFamily {
        let spawns = Arc::new(SpawnQueue::default());
        let _ = first.server.spawns.set(Arc::clone(&spawns));
        JobFamily {
            jobs: vec![first],
            spawns,
            env: cfg.env.clone(),
        }
    }

    /// Serves connections and spawn requests and watches every job's processes until all
    /// have exited 0, one fails, time runs out or the launcher is told to stop.
    pub(super) fn supervise(
        &mut self,
        start: Instant,
        timeout: Option<Duration>,
        signals: &sys::SignalGuard,
    ) -> Result<End> {
        loop {
            self.jobs[0].serve_for(POLL_INTERVAL)?;
            for job in &mut self.jobs[1..] {
                job.serve_for(Duration::ZERO)?;
            }
            for pending in self.spawns.take() {
                let answer = self.start_spawn(&pending.job, &pending.request);
                let _ = pending.answer.send(answer);
            }
            let mut running = 0;
            for j in 0..self.jobs.len() {
                for local in 0..self.jobs[j].children.len() {
                    let pid = self.jobs[j].server.pid(local);
                    let Some(status) = self.jobs[j].try_reap(local)? else {
                        running += usize::from(self.jobs[j].children[local].is_some());
                        continue;
                    };
                    for other in &self.jobs {
                        other.server.process_exited(pid);
                    }
                    if !status.success() {
                        let (exit_code, how) = describe(status);
                        let rank = self.jobs[j].server.ranks[local];
                        if j == 0 {
                            report_line(&format!("pwrun: rank {rank} (pid {pid}) {how}"));
                        } else {
                            report_line(&format!(
                                "pwrun: spawned rank {rank} of job {} (pid {pid}) {how}",
                                self.jobs[j].job_id
                            ));
                        }
                        return Ok(End::RankFailed {
                            rank: (j == 0).then_some(rank),
                            exit_code,
                        });
                    }
                }
            }
            if running == 0 {
                return Ok(End::Success);
            }
            if let Some(sig) = signals.pending() {
                return Ok(End::Interrupted(sig));
            }
            if let Some(limit) = timeout {
                if start.elapsed() >= limit {
                    return Ok(End::TimedOut(limit));
                }
            }
        }
    }

    /// Starts the processes of `request` from a rank of job `from` and the connection job
    /// between them and the spawning group; the error text goes back to the rank.
    fn start_spawn(
        &mut self,
        from: &str,
        request: &SpawnRequest,
    ) -> std::result::Result<ConnectionJob, String> {
        let asking = self
            .jobs
            .iter()
            .find(|j| j.job_id == from)
            .ok_or_else(|| format!("no job {from} in this launch"))?;
        let mut pids = Vec::with_capacity(request.group.len());
        for &rank in &request.group {
            pids.push(asking.server.pid_of_rank(rank).ok_or_else(|| {
                format!("spawn: the spawning group names rank {rank}, which job {from} lacks")
            })?);
        }
        let children: usize = request.commands.iter().map(|c| c.count).sum();
        if pids.is_empty() || request.commands.iter().any(|c| c.count == 0) {
            return Err("spawn: an empty spawning group or a command of no processes".into());
        }
        if children > MAX_SPAWNED {
            return Err(format!(
                "spawn of {children} processes: at most {MAX_SPAWNED} at a time"
            ));
        }
        let parents = pids.len();
        let connection_placement = Placement::local(parents + children);
        let connection = ConnectionJob {
            job: connection_placement.job_id.clone(),
            socket: connection_placement.socket_path.clone(),
            parents,
            children,
        };
        // The connection job listens before the children start, so that they find it.
        pids.resize(parents + children, 0);
        let connection_job =
            Job::connection(connection_placement, &pids).map_err(|e| e.to_string())?;
        let mut commands = Vec::with_capacity(children);
        for (appnum, command) in request.commands.iter().enumerate() {
            for _ in 0..command.count {
                let rank = parents + commands.len();
                let env = self
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone())))
                    .chain(command.env.iter().cloned())
                    .chain(
                        connection
                            .child_env(rank, appnum)
                            .into_iter()
                            .map(|(k, v)| (k, Some(v))),
                    )
                    .collect();
                commands.push(RankCommand {
                    program: command.program.clone(),
                    args: command.args.clone(),
                    env,
                    dir: command.dir.clone(),
                });
            }
        }
        // Spawned processes are not bound: the spawning job's ranks hold the cores already.
        let spawned = Job::start_commands(Placement::local(children), commands, BindTo::None)
            .map_err(|e| format!("spawn: {}", e.launcher_text()))?;
        for local in 0..children {
            connection_job
                .server
                .set_pid(parents + local, spawned.server.pid(local));
        }
        let _ = spawned.server.spawns.set(Arc::clone(&self.spawns));
        let _ = connection_job.server.spawns.set(Arc::clone(&self.spawns));
        self.jobs.push(spawned);
        self.jobs.push(connection_job);
        Ok(connection)
    }

    /// Stops every job ([`Job::finish`]); returns how many shared-memory objects were
    /// removed.
    pub(crate) fn finish(&mut self, graceful: bool) -> usize {
        self.spawns.close();
        self.jobs.iter_mut().map(|j| j.finish(graceful)).sum()
    }
}
