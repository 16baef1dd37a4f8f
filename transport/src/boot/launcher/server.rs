//! The bootstrap server of the built-in launcher: one thread per rank connection, the
//! hello (checked with `SO_PEERCRED`), the allgathers and barriers of the `pwrun_client`
//! protocol, and what the supervisor learns of closed connections.

use super::*;

/// Bootstrap state shared by the connection threads and the supervisor.
pub(super) struct Server {
    pub(super) job: String,
    pub(super) size: usize,
    pub(super) state: Mutex<State>,
    /// Signalled when a rank's connection closes (a reconnecting rank waits for it).
    pub(super) conn_closed: Condvar,
}

pub(super) struct State {
    pub(super) ranks: Vec<Slot>,
    /// Accepted connections that have not said hello yet (nor closed).
    pub(super) unidentified: usize,
    /// Number of completed collectives; the incomplete one (if any) has this index.
    pub(super) round: u64,
    pub(super) next_conn: u64,
}

pub(super) struct Slot {
    pub(super) pid: u32,
    /// The process has been reaped.
    pub(super) exited: bool,
    /// The rank's current connection: its id and a handle to write to.
    pub(super) conn: Option<(u64, UnixStream)>,
    /// Exited with no connection left: will never contribute again.
    pub(super) left: bool,
    /// Contribution to the incomplete collective.
    pub(super) contrib: Option<Vec<u8>>,
}

impl Server {
    pub(super) fn new(size: usize, job: String) -> Server {
        let ranks = (0..size)
            .map(|_| Slot {
                pid: 0,
                exited: false,
                conn: None,
                left: false,
                contrib: None,
            })
            .collect();
        Server {
            job,
            size,
            conn_closed: Condvar::new(),
            state: Mutex::new(State {
                ranks,
                unidentified: 0,
                round: 0,
                next_conn: 0,
            }),
        }
    }

    pub(super) fn set_pid(&self, rank: usize, pid: u32) {
        self.state.lock().ranks[rank].pid = pid;
    }

    pub(super) fn pid(&self, rank: usize) -> u32 {
        self.state.lock().ranks[rank].pid
    }

    /// Registers a new, not yet identified connection; returns its id.
    pub(super) fn accepted(&self) -> u64 {
        let mut st = self.state.lock();
        st.unidentified += 1;
        st.next_conn += 1;
        st.next_conn
    }

    /// Handles a HELLO on connection `id`; replies on `stream`. Returns the rank on
    /// success; on failure the connection stays unidentified and should be closed.
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
        if let Err(why) = self.check_credentials(stream, rank) {
            report_line(&format!(
                "pwrun: refused a bootstrap connection for rank {rank}: {why}"
            ));
            return refuse(why);
        }
        let mut st = self.state.lock();
        // A rank that dropped its bootstrap and connects again may be faster than the
        // thread noticing that its old connection closed: give that thread a moment.
        let deadline = Instant::now() + RECONNECT_PATIENCE;
        while st.ranks[rank].conn.is_some() {
            if self.conn_closed.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        if st.ranks[rank].conn.is_some() {
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
        st.ranks[rank].conn = Some((id, writer));
        st.unidentified -= 1;
        st.reevaluate();
        Some(rank)
    }

    /// Checks that the process behind `stream` may speak for `rank`: it runs as this
    /// launcher's user, and it is the rank's process or a descendant of it (a wrapper such
    /// as `sh -c` may start the program in a child). Where the kernel cannot name the
    /// process (another pid namespace), the user check alone applies.
    pub(super) fn check_credentials(&self, stream: &UnixStream, rank: usize) -> Result<(), String> {
        let peer = sys::peer_credentials(stream.as_fd())
            .map_err(|e| format!("cannot read the connection's credentials (SO_PEERCRED): {e}"))?;
        let uid = sys::effective_uid();
        if peer.uid != uid {
            return Err(format!(
                "the connecting process (pid {}) runs as uid {}, the job as uid {uid}",
                peer.pid, peer.uid
            ));
        }
        let rank_pid = self.pid(rank);
        if peer.pid != 0 && !is_same_or_descendant(peer.pid, rank_pid) {
            return Err(format!(
                "the connecting process (pid {}) is neither rank {rank} (pid {rank_pid}) nor \
                 a process it started",
                peer.pid
            ));
        }
        Ok(())
    }

    /// Handles a GATHER from `rank`.
    pub(super) fn gather(&self, rank: usize, data: Vec<u8>) {
        let mut st = self.state.lock();
        if st.ranks[rank].contrib.is_some() {
            let round = st.round;
            st.send(
                rank,
                wire::ERROR,
                format!("rank {rank} joined collective #{round} twice").as_bytes(),
            );
            return;
        }
        st.ranks[rank].contrib = Some(data);
        st.progress();
    }

    /// Replies with a protocol error on a connection (under the lock, so it cannot
    /// interleave with a result being written).
    pub(super) fn protocol_error(&self, stream: &UnixStream, text: &str) {
        let _st = self.state.lock();
        let mut s = stream;
        let _ = wire::write_frame(&mut s, wire::ERROR, text.as_bytes());
    }

    /// Connection `id` of `rank` closed.
    pub(super) fn closed(&self, rank: usize, id: u64) {
        let mut st = self.state.lock();
        if matches!(st.ranks[rank].conn, Some((cid, _)) if cid == id) {
            st.ranks[rank].conn = None;
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

    /// The supervisor reaped `rank`.
    pub(super) fn rank_exited(&self, rank: usize) {
        let mut st = self.state.lock();
        st.ranks[rank].exited = true;
        st.reevaluate();
    }
}

impl State {
    /// Marks ranks that have left, then fails or completes the pending collective.
    pub(super) fn reevaluate(&mut self) {
        let quiet = self.unidentified == 0;
        for slot in &mut self.ranks {
            if !slot.left && slot.exited && slot.conn.is_none() && quiet {
                slot.left = true;
            }
        }
        self.progress();
    }

    /// Completes the pending collective if everyone joined; fails it if someone who has
    /// not joined has left.
    pub(super) fn progress(&mut self) {
        if !self.ranks.iter().any(|s| s.contrib.is_some()) {
            return;
        }
        if self.ranks.iter().all(|s| s.contrib.is_some()) {
            let parts = self
                .ranks
                .iter()
                .map(|s| s.contrib.as_deref().unwrap_or_default());
            let payload = wire::encode_result(parts);
            let total: usize = self
                .ranks
                .iter()
                .map(|s| s.contrib.as_ref().map_or(0, Vec::len))
                .sum();
            for s in &mut self.ranks {
                s.contrib = None;
            }
            let round = self.round;
            self.round += 1;
            match payload {
                Some(p) => self.broadcast(wire::RESULT, &p),
                None => self.broadcast(
                    wire::ERROR,
                    format!(
                        "collective #{round}: the {total} gathered bytes exceed the {} MiB frame limit",
                        wire::MAX_FRAME >> 20
                    )
                    .as_bytes(),
                ),
            }
            return;
        }
        let missing = self
            .ranks
            .iter()
            .position(|s| s.left && s.contrib.is_none());
        if let Some(gone) = missing {
            let text = format!(
                "rank {gone} (pid {}) left the job before joining collective #{}",
                self.ranks[gone].pid, self.round
            );
            for rank in 0..self.ranks.len() {
                if self.ranks[rank].contrib.take().is_some() {
                    self.send(rank, wire::ERROR, text.as_bytes());
                }
            }
        }
    }

    pub(super) fn broadcast(&mut self, tag: u8, payload: &[u8]) {
        for rank in 0..self.ranks.len() {
            self.send(rank, tag, payload);
        }
    }

    /// Sends a frame to `rank` if it is connected; a rank that cannot be written to is
    /// disconnected (it then sees end-of-file rather than a torn frame).
    pub(super) fn send(&mut self, rank: usize, tag: u8, payload: &[u8]) {
        let Some((_, stream)) = &self.ranks[rank].conn else {
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
            (_, tag) => {
                let expected = if rank.is_none() {
                    "a hello"
                } else {
                    "a gather"
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
