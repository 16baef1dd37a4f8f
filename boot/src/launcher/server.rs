//! The bootstrap server of the built-in launcher: one thread per rank connection, the
//! hello (checked with `SO_PEERCRED`), the allgathers and barriers of the `pwrun_client`
//! protocol, and what the supervisor learns of closed connections.

use std::sync::OnceLock;

use super::family::SpawnQueue;
use super::rounds::{Answer, Rounds};
use super::*;
use crate::spawn::wire as spawn_wire;

/// Bootstrap state shared by the connection threads and the supervisor.
pub(crate) struct Server {
    pub(super) job: String,
    /// Ranks in the job.
    pub(super) size: usize,
    /// The job's ranks served here (this launcher's children), by local index: every rank
    /// under `pwrun -n`, this host's under an agent of `pwrun --hosts`.
    pub(super) ranks: Vec<usize>,
    pub(super) state: Mutex<State>,
    /// Signalled when a rank's connection closes (a reconnecting rank waits for it).
    pub(super) conn_closed: Condvar,
    /// Where the ranks' spawn requests go (the launcher's main thread); unset where the
    /// launcher cannot spawn (an agent of `pwrun --hosts`).
    pub(super) spawns: OnceLock<Arc<SpawnQueue>>,
}

pub(super) struct State {
    /// By local index.
    pub(super) slots: Vec<Slot>,
    /// Accepted connections that have not said hello yet (nor closed).
    pub(super) unidentified: usize,
    pub(super) next_conn: u64,
    pub(super) collectives: Collectives,
    /// Global rank -> local index.
    local: Vec<Option<usize>>,
    global: Vec<usize>,
}

/// Who completes the bootstrap's collectives.
pub(super) enum Collectives {
    /// This server: it serves every rank of the job.
    Here(Rounds),
    /// The frontend of `pwrun --hosts`, through `up`: this server (a host's agent) passes
    /// its ranks' contributions and departures up and their answers down
    /// ([`Server::answer`]). `joined` marks the local ranks waiting in a collective.
    Relayed {
        up: Arc<dyn Relay>,
        joined: Vec<bool>,
    },
}

/// Where an agent sends what its ranks do in the bootstrap (the frontend, over the
/// agent's channel). Called under the server's lock, so in the order it happened.
pub(crate) trait Relay: Send + Sync {
    /// Rank `rank` joined its next collective with `data`.
    fn joined(&self, rank: usize, data: &[u8]);
    /// Rank `rank` has left the job (exited, its connection closed).
    fn left(&self, rank: usize);
}

pub(super) struct Slot {
    pub(super) pid: u32,
    /// The process has been reaped.
    pub(super) exited: bool,
    /// The rank's current connection: its id and a handle to write to.
    pub(super) conn: Option<(u64, UnixStream)>,
    /// Exited with no connection left: will never contribute again.
    pub(super) left: bool,
}

impl Server {
    /// A server for `ranks` (global ranks, in local order) of a job of `size`; with `relay`,
    /// an agent's, whose collectives the frontend completes.
    pub(super) fn new(
        size: usize,
        ranks: Vec<usize>,
        job: String,
        relay: Option<Arc<dyn Relay>>,
    ) -> Server {
        let slots = ranks
            .iter()
            .map(|_| Slot {
                pid: 0,
                exited: false,
                conn: None,
                left: false,
            })
            .collect();
        let mut local = vec![None; size];
        for (i, &r) in ranks.iter().enumerate() {
            local[r] = Some(i);
        }
        let collectives = match relay {
            Some(up) => Collectives::Relayed {
                up,
                joined: vec![false; ranks.len()],
            },
            None => Collectives::Here(Rounds::new(size)),
        };
        Server {
            job,
            size,
            conn_closed: Condvar::new(),
            spawns: OnceLock::new(),
            state: Mutex::new(State {
                slots,
                unidentified: 0,
                next_conn: 0,
                collectives,
                local,
                global: ranks.clone(),
            }),
            ranks,
        }
    }

    pub(super) fn set_pid(&self, local: usize, pid: u32) {
        self.state.lock().slots[local].pid = pid;
    }

    pub(super) fn pid(&self, local: usize) -> u32 {
        self.state.lock().slots[local].pid
    }

    /// The pid of the job's rank `rank`, if it runs here and has started.
    pub(super) fn pid_of_rank(&self, rank: usize) -> Option<u32> {
        let st = self.state.lock();
        let local = (*st.local.get(rank)?)?;
        Some(st.slots[local].pid).filter(|&pid| pid != 0)
    }

    /// Process `pid`, a rank of this job started as a rank of another (a connection job's),
    /// was reaped.
    pub(super) fn process_exited(&self, pid: u32) {
        let mut st = self.state.lock();
        let mut any = false;
        for slot in st.slots.iter_mut().filter(|s| s.pid == pid && !s.exited) {
            slot.exited = true;
            any = true;
        }
        if any {
            st.reevaluate();
        }
    }

    /// Handles a SPAWN from the rank of local index `local`: the launcher's main thread
    /// starts the processes; the rank gets SPAWNED or an ERROR saying why not.
    pub(super) fn spawn(&self, local: usize, payload: &[u8]) {
        let answer = match (spawn_wire::decode_request(payload), self.spawns.get()) {
            (None, _) => Err("protocol error: malformed spawn request".to_string()),
            (Some(_), None) => Err("pwrun --hosts cannot add processes to a running job; \
                                    spawn works under pwrun -n on one host"
                .to_string()),
            (Some(request), Some(queue)) => queue.submit(&self.job, request),
        };
        let mut st = self.state.lock();
        match answer {
            Ok(conn) => st.send(local, wire::SPAWNED, &spawn_wire::encode_connection(&conn)),
            Err(text) => st.send(local, wire::ERROR, text.as_bytes()),
        }
    }

    /// Registers a new, not yet identified connection; returns its id.
    pub(super) fn accepted(&self) -> u64 {
        let mut st = self.state.lock();
        st.unidentified += 1;
        st.next_conn += 1;
        st.next_conn
    }

    /// Handles a HELLO on connection `id`; replies on `stream`. Returns the rank's local
    /// index on success; on failure the connection stays unidentified and should be
    /// closed.
    pub(super) fn hello(&self, id: u64, stream: &UnixStream, payload: &[u8]) -> Option<usize> {
        let size = self.size;
        // Only this thread writes to a connection before it is identified.
        let refuse = |why: String| {
            let mut s = stream;
            let _ = wire::write_frame(&mut s, wire::ERROR, why.as_bytes());
            None
        };
        let Some(h) = wire::decode_hello(payload) else {
            return refuse("protocol error: malformed hello".into());
        };
        if h.job != self.job {
            return refuse(format!(
                "job id mismatch: the rank belongs to job {:?}, this launcher runs job {}",
                h.job, self.job
            ));
        }
        if h.size != size as u64 {
            return refuse(format!(
                "job size mismatch: the rank thinks there are {} ranks, the job has {size}",
                h.size
            ));
        }
        let Some(rank) = usize::try_from(h.rank).ok().filter(|&r| r < size) else {
            return refuse(format!("rank {} is out of range for {size} ranks", h.rank));
        };
        let Some(local) = self.ranks.iter().position(|&r| r == rank) else {
            return refuse(format!("rank {rank} runs on another host"));
        };
        if let Err(why) = self.check_credentials(stream, local) {
            report_line(&format!(
                "pwrun: refused a bootstrap connection for rank {rank}: {why}"
            ));
            return refuse(why);
        }
        let mut st = self.state.lock();
        // A rank that dropped its bootstrap and connects again may be faster than the
        // thread noticing that its old connection closed: give that thread a moment.
        let deadline = Instant::now() + RECONNECT_PATIENCE;
        while st.slots[local].conn.is_some() {
            if self.conn_closed.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        if st.slots[local].conn.is_some() {
            return refuse(format!("rank {rank} is already connected"));
        }
        let writer = match stream.try_clone() {
            Ok(w) => w,
            Err(e) => return refuse(format!("launcher cannot serve the connection: {e}")),
        };
        let _ = writer.set_write_timeout(Some(WRITE_TIMEOUT));
        let mut w = &writer;
        if wire::write_frame(&mut w, wire::WELCOME, &[]).is_err() {
            return None;
        }
        st.slots[local].conn = Some((id, writer));
        st.unidentified -= 1;
        st.reevaluate();
        Some(local)
    }

    /// Checks that the process behind `stream` may speak for the rank of local index
    /// `local`: it runs as this launcher's user, and it is the rank's process or a
    /// descendant of it (a wrapper such as `sh -c` may start the program in a child).
    /// Where the kernel cannot name the process (another pid namespace), the user check
    /// alone applies.
    pub(super) fn check_credentials(
        &self,
        stream: &UnixStream,
        local: usize,
    ) -> Result<(), String> {
        let peer = sys::peer_credentials(stream.as_fd())
            .map_err(|e| format!("cannot read the connection's credentials (SO_PEERCRED): {e}"))?;
        let uid = sys::effective_uid();
        if peer.uid != uid {
            return Err(format!(
                "the connecting process (pid {}) runs as uid {}, the job as uid {uid}",
                peer.pid, peer.uid
            ));
        }
        let rank_pid = self.pid(local);
        if peer.pid != 0 && !is_same_or_descendant(peer.pid, rank_pid) {
            return Err(format!(
                "the connecting process (pid {}) is neither rank {} (pid {rank_pid}) nor \
                 a process it started",
                peer.pid, self.ranks[local]
            ));
        }
        Ok(())
    }

    /// Handles a GATHER from the rank of local index `local`.
    pub(super) fn gather(&self, local: usize, data: Vec<u8>) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let rank = st.global[local];
        let who = st.who();
        let answer = match &mut st.collectives {
            Collectives::Here(rounds) => rounds.join(rank, data, who),
            Collectives::Relayed { up, joined } => {
                if joined[local] {
                    Answer::Fail {
                        ranks: vec![rank],
                        text: format!("rank {rank} joined a collective twice"),
                    }
                } else {
                    joined[local] = true;
                    up.joined(rank, &data);
                    Answer::Wait
                }
            }
        };
        st.apply(answer);
    }

    /// The frontend's answer to a collective (an agent's server: [`Collectives::Relayed`]).
    pub(crate) fn answer(&self, answer: Answer) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if let Collectives::Relayed { joined, .. } = &mut st.collectives {
            match &answer {
                Answer::Complete(_) => joined.iter_mut().for_each(|j| *j = false),
                Answer::Fail { ranks, .. } => {
                    for &r in ranks {
                        if let Some(Some(l)) = st.local.get(r) {
                            joined[*l] = false;
                        }
                    }
                }
                Answer::Wait => {}
            }
        }
        st.apply(answer);
    }

    /// Replies with a protocol error on a connection (under the lock, so it cannot
    /// interleave with a result being written).
    pub(super) fn protocol_error(&self, stream: &UnixStream, text: &str) {
        let _st = self.state.lock();
        let mut s = stream;
        let _ = wire::write_frame(&mut s, wire::ERROR, text.as_bytes());
    }

    /// Connection `id` of the rank of local index `local` closed.
    pub(super) fn closed(&self, local: usize, id: u64) {
        let mut st = self.state.lock();
        if matches!(st.slots[local].conn, Some((cid, _)) if cid == id) {
            st.slots[local].conn = None;
            st.reevaluate();
            self.conn_closed.notify_all();
        }
    }

    /// A connection closed (or failed its hello) before identifying itself.
    pub(super) fn unidentified_closed(&self) {
        let mut st = self.state.lock();
        st.unidentified -= 1;
        st.reevaluate();
    }

    /// The supervisor reaped the rank of local index `local`.
    pub(super) fn rank_exited(&self, local: usize) {
        let mut st = self.state.lock();
        st.slots[local].exited = true;
        st.reevaluate();
    }
}

impl State {
    /// Marks ranks that have left, and tells whoever completes the collectives.
    pub(super) fn reevaluate(&mut self) {
        let quiet = self.unidentified == 0;
        for local in 0..self.slots.len() {
            let slot = &mut self.slots[local];
            if slot.left || !slot.exited || slot.conn.is_some() || !quiet {
                continue;
            }
            slot.left = true;
            let rank = self.global[local];
            let who = self.who();
            let answer = match &mut self.collectives {
                Collectives::Here(rounds) => rounds.leave(rank, who),
                Collectives::Relayed { up, .. } => {
                    up.left(rank);
                    Answer::Wait
                }
            };
            self.apply(answer);
        }
    }

    /// Describes a rank in an error: its pid.
    fn who(&self) -> impl Fn(usize) -> String {
        let pids: Vec<Option<u32>> = self
            .local
            .iter()
            .map(|l| l.map(|l| self.slots[l].pid))
            .collect();
        move |r| match pids.get(r).copied().flatten() {
            Some(pid) => format!("pid {pid}"),
            None => "on another host".into(),
        }
    }

    /// Sends `answer` to the ranks it is for (those served here).
    fn apply(&mut self, answer: Answer) {
        match answer {
            Answer::Wait => {}
            Answer::Complete(payload) => {
                for local in 0..self.slots.len() {
                    self.send(local, wire::RESULT, &payload);
                }
            }
            Answer::Fail { ranks, text } => {
                for r in ranks {
                    if let Some(Some(local)) = self.local.get(r).copied() {
                        self.send(local, wire::ERROR, text.as_bytes());
                    }
                }
            }
        }
    }

    /// Sends a frame to the rank of local index `local` if it is connected; a rank that
    /// cannot be written to is disconnected (it then sees end-of-file rather than a torn
    /// frame).
    pub(super) fn send(&mut self, local: usize, tag: u8, payload: &[u8]) {
        let Some((_, stream)) = &self.slots[local].conn else {
            return;
        };
        let mut s = stream;
        if wire::write_frame(&mut s, tag, payload).is_err() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Deepest chain of parents followed by [`is_same_or_descendant`].
pub(super) const MAX_ANCESTRY: usize = 64;

/// Whether process `pid` is `ancestor` or descends from it, following the parent links of
/// `/proc/PID/stat`. False when a link cannot be read (the process is gone).
pub(super) fn is_same_or_descendant(pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    for _ in 0..MAX_ANCESTRY {
        if p == ancestor {
            return true;
        }
        if p <= 1 {
            return false;
        }
        match parent_of(p) {
            Some(parent) => p = parent,
            None => return false,
        }
    }
    false
}

/// The parent of process `pid` (field 4 of `/proc/PID/stat`, after the parenthesised
/// command name, which may itself contain spaces and parentheses).
pub(super) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Serves one connection until it closes.
pub(super) fn serve_connection(server: &Server, mut stream: UnixStream, id: u64) {
    let mut rank = None;
    // A connection that never says hello must not keep the server from deciding that
    // exited ranks have left.
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    loop {
        let (tag, payload) = match wire::read_frame(&mut stream) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    server.protocol_error(&stream, &format!("protocol error: {e}"));
                }
                break;
            }
        };
        match (rank, tag) {
            (None, wire::HELLO) => match server.hello(id, &stream, &payload) {
                Some(r) => {
                    rank = Some(r);
                    // Collectives may take arbitrarily long.
                    let _ = stream.set_read_timeout(None);
                }
                None => break,
            },
            (Some(r), wire::GATHER) => server.gather(r, payload),
            (Some(r), wire::SPAWN) => server.spawn(r, &payload),
            (_, tag) => {
                let expected = if rank.is_none() {
                    "a hello"
                } else {
                    "a gather or a spawn"
                };
                server.protocol_error(
                    &stream,
                    &format!("protocol error: got frame {tag:#04x}, expected {expected}"),
                );
                break;
            }
        }
    }
    match rank {
        Some(r) => server.closed(r, id),
        None => server.unidentified_closed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestry_follows_parent_links() {
        let me = std::process::id();
        let parent = std::os::unix::process::parent_id();
        assert_eq!(parent_of(me), Some(parent));
        assert!(is_same_or_descendant(me, me));
        assert!(is_same_or_descendant(me, parent));
        assert!(!is_same_or_descendant(parent, me));
        assert!(!is_same_or_descendant(u32::MAX, me), "no such process");
    }
}
