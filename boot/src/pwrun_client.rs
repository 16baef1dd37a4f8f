//! The rank side of `pwrun`'s bootstrap, and the wire protocol both sides speak.
//!
//! # Wire protocol
//!
//! Each rank holds one connection to the launcher's Unix socket (path in
//! `PAGEWIRE_BOOT_SOCKET`). Both directions carry frames; integers are little endian:
//!
//! ```text
//! frame    = len:u32 tag:u8 payload        len = 1 + payload length, at most 256 MiB
//!
//! rank -> launcher
//!   HELLO   0x01  rank:u64 size:u64 pid:u64 job:bytes   first frame, exactly once
//!   GATHER  0x02  data:bytes                             join the next collective
//!   SPAWN   0x03  request (spawn::wire)                  start processes, open a job
//! launcher -> rank
//!   WELCOME 0x81  (empty)                                hello accepted
//!   RESULT  0x82  n:u32 { len:u64 data:bytes } * n       contributions in rank order
//!   SPAWNED 0x83  connection job (spawn::wire)           the processes started
//!   ERROR   0xEE  text:utf-8                             the request failed
//! ```
//!
//! A rank sends HELLO and waits for WELCOME (or ERROR: wrong job, rank out of range,
//! rank already connected, or a connecting process that is not the rank's own or one it
//! started, or that runs as another user: `SO_PEERCRED`). Each GATHER joins the rank's next collective; once every rank
//! has joined it, every rank receives one RESULT with all contributions. A barrier is a
//! GATHER of no bytes. Collectives are numbered implicitly, in order: at most one is
//! incomplete at any time, since no rank can start collective k+1 before k completes.
//!
//! A rank has *left* once its process has exited and its connection is closed (a rank
//! may close its connection and connect again, e.g. to create a second bootstrap). When a
//! rank leaves without having joined the incomplete collective, every rank waiting in it,
//! and every later GATHER, gets an ERROR naming the rank; nobody waits forever. When the
//! launcher goes away, ranks see end-of-file.
//!
//! A SPAWN, sent by a rank that is in no collective, is answered by SPAWNED once the
//! launcher has started the processes and opened the connection job, or by an ERROR that
//! says why it could not (module `spawn`).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::spawn::{ConnectionJob, SpawnRequest};
use super::{Bootstrap, ENV_BOOT_SOCKET, ENV_JOB, ENV_RANK, ENV_SIZE};
use pagewire_sys::{Error, Result};

/// Frame encoding shared with the launcher (see the module documentation).
pub(crate) mod wire {
    use std::io::{self, Read, Write};

    /// rank -> launcher: `rank:u64 size:u64 pid:u64 job:bytes`.
    pub(crate) const HELLO: u8 = 0x01;
    /// rank -> launcher: the rank's contribution to its next collective.
    pub(crate) const GATHER: u8 = 0x02;
    /// rank -> launcher: a spawn request (`spawn::wire::encode_request`).
    pub(crate) const SPAWN: u8 = 0x03;
    /// launcher -> rank: the spawn's connection job (`spawn::wire::encode_connection`).
    pub(crate) const SPAWNED: u8 = 0x83;
    /// launcher -> rank: hello accepted.
    pub(crate) const WELCOME: u8 = 0x81;
    /// launcher -> rank: `n:u32 { len:u64 data }*n`.
    pub(crate) const RESULT: u8 = 0x82;
    /// launcher -> rank: UTF-8 error text.
    pub(crate) const ERROR: u8 = 0xEE;
    /// Largest `len` of a frame (tag plus payload).
    pub(crate) const MAX_FRAME: usize = 256 << 20;

    /// Writes one frame with a single `write_all`.
    pub(crate) fn write_frame(w: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
        let len = payload.len() + 1;
        if len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
            ));
        }
        let mut buf = Vec::with_capacity(4 + len);
        buf.extend_from_slice(&(len as u32).to_le_bytes());
        buf.push(tag);
        buf.extend_from_slice(payload);
        w.write_all(&buf)
    }

    /// Reads one frame; `Ok(None)` on end-of-file between frames.
    pub(crate) fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
        let mut header = [0u8; 4];
        let mut got = 0;
        while got < header.len() {
            match r.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let len = u32::from_le_bytes(header) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad frame length {len}"),
            ));
        }
        // Memory grows with the bytes that arrive, not with the length a peer claims.
        let mut body = Vec::with_capacity(len.min(64 << 10));
        r.take(len as u64).read_to_end(&mut body)?;
        if body.len() != len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let tag = body.remove(0);
        Ok(Some((tag, body)))
    }

    /// A decoded HELLO.
    #[derive(Debug, PartialEq, Eq)]
    pub(crate) struct Hello {
        pub(crate) rank: u64,
        pub(crate) size: u64,
        pub(crate) pid: u64,
        pub(crate) job: String,
    }

    /// Payload of a HELLO.
    pub(crate) fn encode_hello(rank: u64, size: u64, pid: u64, job: &str) -> Vec<u8> {
        let mut p = Vec::with_capacity(24 + job.len());
        p.extend_from_slice(&rank.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        p.extend_from_slice(&pid.to_le_bytes());
        p.extend_from_slice(job.as_bytes());
        p
    }

    /// Parses a HELLO payload; `None` if malformed.
    pub(crate) fn decode_hello(p: &[u8]) -> Option<Hello> {
        if p.len() < 24 {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(p[i * 8..i * 8 + 8].try_into().unwrap());
        Some(Hello {
            rank: word(0),
            size: word(1),
            pid: word(2),
            job: String::from_utf8(p[24..].to_vec()).ok()?,
        })
    }

    /// Payload of a RESULT, or `None` if it would not fit in a frame.
    pub(crate) fn encode_result<'a>(
        parts: impl ExactSizeIterator<Item = &'a [u8]> + Clone,
    ) -> Option<Vec<u8>> {
        let total = parts.clone().map(|d| 8 + d.len()).sum::<usize>() + 4;
        if total + 1 > MAX_FRAME {
            return None;
        }
        let mut p = Vec::with_capacity(total);
        p.extend_from_slice(&(parts.len() as u32).to_le_bytes());
        for d in parts {
            p.extend_from_slice(&(d.len() as u64).to_le_bytes());
            p.extend_from_slice(d);
        }
        Some(p)
    }

    /// Parses a RESULT payload; `None` if malformed.
    pub(crate) fn decode_result(p: &[u8]) -> Option<Vec<Vec<u8>>> {
        let n = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
        let mut rest = &p[4..];
        let mut out = Vec::with_capacity(n.min(rest.len() / 8));
        for _ in 0..n {
            let len = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
            let len = usize::try_from(len).ok()?;
            let data = rest.get(8..8usize.checked_add(len)?)?;
            out.push(data.to_vec());
            rest = &rest[8 + len..];
        }
        rest.is_empty().then_some(out)
    }
}

/// How long [`PwrunBootstrap::connect`] keeps retrying while the launcher refuses
/// connections (listen backlog full). A missing socket fails at once: the launcher
/// creates it before starting any rank.
const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

/// The bootstrap of a rank started by `pwrun` (or by [`super::launch`]).
///
/// Holds one connection to the launcher; collectives from several threads are serialised.
#[derive(Debug)]
pub struct PwrunBootstrap {
    rank: usize,
    size: usize,
    job: String,
    socket: PathBuf,
    conn: Mutex<UnixStream>,
}

impl PwrunBootstrap {
    /// Connects to the launcher named by `PAGEWIRE_BOOT_SOCKET`, as the rank given by
    /// `PAGEWIRE_RANK` of `PAGEWIRE_SIZE` in job `PAGEWIRE_JOB`.
    ///
    /// Fails with [`Error::Bootstrap`] naming the variable when one is missing or garbled,
    /// and with the launcher's reason when it refuses the connection.
    pub fn connect_from_env() -> Result<Self> {
        let job = env_var(ENV_JOB)?;
        if job.is_empty()
            || !job
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        {
            return Err(Error::Bootstrap(format!(
                "{ENV_JOB}={job:?} is not a job id (expected [0-9a-z]+)"
            )));
        }
        let size = env_number(ENV_SIZE, "rank count")?;
        let rank = env_number(ENV_RANK, "rank")?;
        if size == 0 {
            return Err(Error::Bootstrap(format!(
                "{ENV_SIZE}=0: a job has at least one rank"
            )));
        }
        if rank >= size {
            return Err(Error::Bootstrap(format!(
                "{ENV_RANK}={rank} is out of range for {ENV_SIZE}={size}"
            )));
        }
        let path = std::env::var_os(ENV_BOOT_SOCKET).ok_or_else(|| {
            Error::Bootstrap(format!(
                "{ENV_BOOT_SOCKET} is not set; is this process running under pwrun?"
            ))
        })?;
        if path.is_empty() {
            return Err(Error::Bootstrap(format!("{ENV_BOOT_SOCKET} is empty")));
        }
        Self::connect(Path::new(&path), &job, rank, size)
    }

    /// Connects to the launcher socket at `socket` as `rank` of `size` in job `job`.
    pub fn connect(socket: &Path, job: &str, rank: usize, size: usize) -> Result<Self> {
        let mut stream = connect_with_retry(socket)?;
        let hello = wire::encode_hello(rank as u64, size as u64, std::process::id().into(), job);
        wire::write_frame(&mut stream, wire::HELLO, &hello).map_err(|e| lost(socket, e))?;
        match wire::read_frame(&mut stream) {
            Ok(Some((wire::WELCOME, _))) => {}
            Ok(Some((wire::ERROR, text))) => {
                return Err(Error::Bootstrap(
                    String::from_utf8_lossy(&text).into_owned(),
                ))
            }
            Ok(Some((tag, _))) => return Err(unexpected(tag, "hello")),
            Ok(None) => return Err(went_away()),
            Err(e) => return Err(lost(socket, e)),
        }
        Ok(PwrunBootstrap {
            rank,
            size,
            job: job.to_string(),
            socket: socket.to_path_buf(),
            conn: Mutex::new(stream),
        })
    }
}

impl Bootstrap for PwrunBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn job_id(&self) -> &str {
        &self.job
    }

    fn starter(&self) -> String {
        format!("pwrun, job {}", self.job)
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if mine.len() + 1 > wire::MAX_FRAME {
            return Err(Error::Bootstrap(format!(
                "allgather contribution of {} bytes exceeds the {}-byte frame limit",
                mine.len(),
                wire::MAX_FRAME - 1
            )));
        }
        let mut conn = self.conn.lock();
        let stream = &mut *conn;
        wire::write_frame(stream, wire::GATHER, mine).map_err(|e| lost(&self.socket, e))?;
        match wire::read_frame(stream) {
            Ok(Some((wire::RESULT, payload))) => match wire::decode_result(&payload) {
                Some(all) if all.len() == self.size => Ok(all),
                Some(all) => Err(Error::Bootstrap(format!(
                    "launcher returned {} contributions for a job of {} ranks",
                    all.len(),
                    self.size
                ))),
                None => Err(Error::Bootstrap(
                    "malformed allgather result from the launcher".into(),
                )),
            },
            Ok(Some((wire::ERROR, text))) => Err(Error::Bootstrap(
                String::from_utf8_lossy(&text).into_owned(),
            )),
            Ok(Some((tag, _))) => Err(unexpected(tag, "allgather")),
            Ok(None) => Err(went_away()),
            Err(e) => Err(lost(&self.socket, e)),
        }
    }

    fn spawn(&self, request: &SpawnRequest) -> Result<ConnectionJob> {
        let mut conn = self.conn.lock();
        let stream = &mut *conn;
        let payload = super::spawn::wire::encode_request(request);
        wire::write_frame(stream, wire::SPAWN, &payload).map_err(|e| lost(&self.socket, e))?;
        match wire::read_frame(stream) {
            Ok(Some((wire::SPAWNED, payload))) => super::spawn::wire::decode_connection(&payload)
                .ok_or_else(|| Error::Bootstrap("malformed spawn answer from the launcher".into())),
            Ok(Some((wire::ERROR, text))) => {
                Err(Error::Launcher(String::from_utf8_lossy(&text).into_owned()))
            }
            Ok(Some((tag, _))) => Err(unexpected(tag, "spawn")),
            Ok(None) => Err(went_away()),
            Err(e) => Err(lost(&self.socket, e)),
        }
    }
}

/// The value of environment variable `name`, or a `Bootstrap` error naming it.
fn env_var(name: &str) -> Result<String> {
    match std::env::var(name) {
        Ok(v) => Ok(v),
        Err(std::env::VarError::NotPresent) => Err(Error::Bootstrap(format!(
            "{name} is not set; is this process running under pwrun?"
        ))),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::Bootstrap(format!("{name}={v:?} is not valid UTF-8")))
        }
    }
}

/// Environment variable `name` parsed as a non-negative integer.
fn env_number(name: &str, what: &str) -> Result<usize> {
    let v = env_var(name)?;
    v.trim().parse().map_err(|_| {
        Error::Bootstrap(format!(
            "{name}={v:?} is not a valid {what} (expected a non-negative integer)"
        ))
    })
}

/// Connects, retrying briefly while the launcher refuses (backlog full).
fn connect_with_retry(socket: &Path) -> Result<UnixStream> {
    let start = Instant::now();
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::WouldBlock
                ) && start.elapsed() < CONNECT_PATIENCE =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                return Err(Error::Bootstrap(format!(
                    "cannot connect to the launcher at {}: {e}",
                    socket.display()
                )))
            }
        }
    }
}

fn went_away() -> Error {
    Error::Bootstrap("launcher went away".into())
}

/// Maps an I/O error on the launcher connection: a closed peer is "launcher went away".
fn lost(socket: &Path, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => went_away(),
        _ => Error::Bootstrap(format!(
            "talking to the launcher at {} failed: {e}",
            socket.display()
        )),
    }
}

fn unexpected(tag: u8, during: &str) -> Error {
    Error::Bootstrap(format!(
        "protocol error: unexpected frame {tag:#04x} from the launcher during {during}"
    ))
}
