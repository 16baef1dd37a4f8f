//! The frames between `pwrun --hosts` (the frontend) and its agent on each host, over the
//! channel `PAGEWIRE_RSH` opened (the agent's stdin and stdout), framed as the rank
//! bootstrap's (`pwrun_client::wire`: `len:u32 tag:u8 payload`, integers little endian).
//!
//! ```text
//! frontend -> agent
//!   START   0x11  the job and this host's part of it (Start)
//!   RESULT  0x12  a completed collective: the RESULT payload every local rank receives
//!   ERROR   0x13  n:u32 { rank:u64 }*n text:utf-8   these ranks' collective failed
//!   INPUT   0x14  bytes for rank 0's stdin (empty: end of input)
//!   STOP    0x15  stop the ranks, clean /dev/shm, say BYE and exit
//! agent -> frontend
//!   STARTED 0x91  n:u32 { pid:u32 }*n              the ranks run (pids in START's order)
//!   GATHER  0x92  rank:u64 data                   a rank joined its next collective
//!   LEFT    0x93  rank:u64                        a rank left (exited, connection closed)
//!   EXITED  0x94  rank:u64 code:i32 how:utf-8     a rank was reaped
//!   OUTPUT  0x95  bytes                           some of a rank's stdout
//!   BYE     0x96  removed:u64                     stopped; shared-memory objects removed
//!   FAILED  0x97  text:utf-8                      the ranks could not be started
//! ```
//!
//! The agent's stdout starts with [`AGENT_MARK`]; the frontend passes anything before it
//! (what a remote login script printed) to its stderr. Every decoder checks lengths and
//! refuses what does not parse with a reason; a frame either side cannot parse ends the job
//! with that reason.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use super::super::binding::BindTo;

/// What an agent writes first on its stdout, before any frame: the frontend skips what a
/// remote shell printed before it (a login script's greeting) up to this mark.
pub(crate) const AGENT_MARK: &[u8; 8] = b"\0pwagent";
/// The most bytes the frontend skips looking for [`AGENT_MARK`].
pub(crate) const MAX_NOISE: usize = 64 << 10;

pub(crate) const START: u8 = 0x11;
pub(crate) const RESULT: u8 = 0x12;
pub(crate) const ERROR: u8 = 0x13;
pub(crate) const INPUT: u8 = 0x14;
pub(crate) const STOP: u8 = 0x15;
pub(crate) const STARTED: u8 = 0x91;
pub(crate) const GATHER: u8 = 0x92;
pub(crate) const LEFT: u8 = 0x93;
pub(crate) const EXITED: u8 = 0x94;
pub(crate) const OUTPUT: u8 = 0x95;
pub(crate) const BYE: u8 = 0x96;
pub(crate) const FAILED: u8 = 0x97;

/// What an agent is told to start: the job and this host's ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Start {
    pub job: String,
    /// Ranks in the job.
    pub size: u64,
    /// This host's place in `--hosts` (names its bootstrap socket).
    pub host: u32,
    /// The ranks this host runs, in order.
    pub ranks: Vec<u64>,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Every rank's environment, whole (the agent's own is not used).
    pub env: Vec<(OsString, OsString)>,
    /// The working directory.
    pub cwd: PathBuf,
    pub bind: BindTo,
}

/// Builds a payload.
#[derive(Default)]
struct Fields(Vec<u8>);

impl Fields {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(self, b: &[u8]) -> Self {
        let mut s = self.u32(b.len() as u32);
        s.0.extend_from_slice(b);
        s
    }
}

/// Reads a payload; every getter fails (`None`) past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// A count of items each at least `min` bytes long, checked against what is left (a
    /// claimed count cannot make the decoder allocate more than the frame holds).
    fn count(&mut self, min: usize) -> Option<usize> {
        let n = self.u32()? as usize;
        (n.checked_mul(min)? <= self.0.len()).then_some(n)
    }
    fn rest(self) -> &'a [u8] {
        self.0
    }
    fn end(self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

fn bind_code(b: BindTo) -> u8 {
    match b {
        BindTo::Auto => 0,
        BindTo::Core => 1,
        BindTo::Numa => 2,
        BindTo::None => 3,
    }
}

impl Start {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut f = Fields::default()
            .bytes(self.job.as_bytes())
            .u64(self.size)
            .u32(self.host)
            .u32(self.ranks.len() as u32);
        for &r in &self.ranks {
            f = f.u64(r);
        }
        f = f
            .bytes(self.program.as_os_str().as_bytes())
            .u32(self.args.len() as u32);
        for a in &self.args {
            f = f.bytes(a.as_bytes());
        }
        f = f.u32(self.env.len() as u32);
        for (k, v) in &self.env {
            f = f.bytes(k.as_bytes()).bytes(v.as_bytes());
        }
        let mut out = f.bytes(self.cwd.as_os_str().as_bytes()).0;
        out.push(bind_code(self.bind));
        out
    }

    pub(crate) fn decode(p: &[u8]) -> Result<Start, &'static str> {
        Self::parse(p).ok_or("a malformed START")
    }

    fn parse(p: &[u8]) -> Option<Start> {
        let mut r = Reader(p);
        let job = String::from_utf8(r.bytes()?.to_vec()).ok()?;
        if job.is_empty()
            || !job
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        {
            return None;
        }
        let size = r.u64()?;
        let host = r.u32()?;
        let n = r.count(8)?;
        let ranks: Vec<u64> = (0..n).map(|_| r.u64()).collect::<Option<_>>()?;
        if ranks.is_empty() || ranks.iter().any(|&x| x >= size) {
            return None;
        }
        let program = PathBuf::from(OsString::from_vec(r.bytes()?.to_vec()));
        let n = r.count(4)?;
        let args = (0..n)
            .map(|_| r.bytes().map(|b| OsString::from_vec(b.to_vec())))
            .collect::<Option<_>>()?;
        let n = r.count(8)?;
        let env = (0..n)
            .map(|_| {
                let k = OsString::from_vec(r.bytes()?.to_vec());
                let v = OsString::from_vec(r.bytes()?.to_vec());
                Some((k, v))
            })
            .collect::<Option<_>>()?;
        let cwd = PathBuf::from(OsString::from_vec(r.bytes()?.to_vec()));
        let bind = match r.take(1)?[0] {
            0 => BindTo::Auto,
            1 => BindTo::Core,
            2 => BindTo::Numa,
            3 => BindTo::None,
            _ => return None,
        };
        r.end()?;
        Some(Start {
            job,
            size,
            host,
            ranks,
            program,
            args,
            env,
            cwd,
            bind,
        })
    }
}

/// ERROR's payload: the ranks whose collective failed, and why.
pub(crate) fn encode_error(ranks: &[usize], text: &str) -> Vec<u8> {
    let mut f = Fields::default().u32(ranks.len() as u32);
    for &r in ranks {
        f = f.u64(r as u64);
    }
    let mut out = f.0;
    out.extend_from_slice(text.as_bytes());
    out
}

pub(crate) fn decode_error(p: &[u8]) -> Result<(Vec<usize>, String), &'static str> {
    let parse = || {
        let mut r = Reader(p);
        let n = r.count(8)?;
        let ranks = (0..n)
            .map(|_| r.u64().and_then(|x| usize::try_from(x).ok()))
            .collect::<Option<_>>()?;
        let text = String::from_utf8_lossy(r.rest()).into_owned();
        Some((ranks, text))
    };
    parse().ok_or("a malformed ERROR")
}

/// STARTED's payload.
pub(crate) fn encode_started(pids: &[u32]) -> Vec<u8> {
    let mut f = Fields::default().u32(pids.len() as u32);
    for &p in pids {
        f = f.u32(p);
    }
    f.0
}

pub(crate) fn decode_started(p: &[u8]) -> Result<Vec<u32>, &'static str> {
    let parse = || {
        let mut r = Reader(p);
        let n = r.count(4)?;
        let pids = (0..n).map(|_| r.u32()).collect::<Option<_>>()?;
        r.end()?;
        Some(pids)
    };
    parse().ok_or("a malformed STARTED")
}

/// GATHER's payload.
pub(crate) fn encode_gather(rank: usize, data: &[u8]) -> Vec<u8> {
    let mut out = Fields::default().u64(rank as u64).0;
    out.extend_from_slice(data);
    out
}

pub(crate) fn decode_gather(p: &[u8]) -> Result<(usize, Vec<u8>), &'static str> {
    let parse = || {
        let mut r = Reader(p);
        let rank = usize::try_from(r.u64()?).ok()?;
        Some((rank, r.rest().to_vec()))
    };
    parse().ok_or("a malformed GATHER")
}

/// LEFT's and BYE's payload: one number.
pub(crate) fn encode_u64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

pub(crate) fn decode_u64(p: &[u8]) -> Result<u64, &'static str> {
    let mut r = Reader(p);
    let parse = || {
        let v = r.u64()?;
        r.end()?;
        Some(v)
    };
    parse().ok_or("a malformed number")
}

/// EXITED's payload.
pub(crate) fn encode_exited(rank: usize, code: i32, how: &str) -> Vec<u8> {
    let mut out = Fields::default().u64(rank as u64).0;
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(how.as_bytes());
    out
}

pub(crate) fn decode_exited(p: &[u8]) -> Result<(usize, i32, String), &'static str> {
    let parse = || {
        let mut r = Reader(p);
        let rank = usize::try_from(r.u64()?).ok()?;
        let code = r.i32()?;
        Some((rank, code, String::from_utf8_lossy(r.rest()).into_owned()))
    };
    parse().ok_or("a malformed EXITED")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start() -> Start {
        Start {
            job: "0123abcd".into(),
            size: 4,
            host: 1,
            ranks: vec![2, 3],
            program: "/bin/prog".into(),
            args: vec!["-x".into(), OsString::from_vec(vec![0xff, b'a'])],
            env: vec![("A".into(), "1".into()), ("PATH".into(), "/bin".into())],
            cwd: "/home/u".into(),
            bind: BindTo::Core,
        }
    }

    #[test]
    fn frames_round_trip() {
        let s = start();
        assert_eq!(Start::decode(&s.encode()), Ok(s));
        assert_eq!(
            decode_error(&encode_error(&[1, 3], "rank 2 left")),
            Ok((vec![1, 3], "rank 2 left".into()))
        );
        assert_eq!(decode_started(&encode_started(&[7, 9])), Ok(vec![7, 9]));
        assert_eq!(
            decode_gather(&encode_gather(3, b"addr")),
            Ok((3, b"addr".to_vec()))
        );
        assert_eq!(decode_u64(&encode_u64(42)), Ok(42));
        assert_eq!(
            decode_exited(&encode_exited(1, 137, "killed by signal SIGKILL")),
            Ok((1, 137, "killed by signal SIGKILL".into()))
        );
    }

    #[test]
    fn truncated_or_inconsistent_frames_are_refused() {
        let e = start().encode();
        for cut in 0..e.len() {
            assert!(Start::decode(&e[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = e.clone();
        extra.push(0);
        assert!(Start::decode(&extra).is_err());
        // A rank beyond the job's size, a bad job id, a count larger than the frame.
        let mut s = start();
        s.ranks = vec![4];
        assert!(Start::decode(&s.encode()).is_err());
        let mut s = start();
        s.job = "../x".into();
        assert!(Start::decode(&s.encode()).is_err());
        assert!(decode_started(&u32::MAX.to_le_bytes()).is_err());
        assert!(decode_error(&[0xff, 0xff, 0xff, 0x7f]).is_err());
        assert!(decode_u64(&[1, 2, 3]).is_err());
        assert!(decode_gather(&[1]).is_err());
    }
}
