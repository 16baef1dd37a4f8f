//! PMI clients: the bootstrap of a program built without the `mpi` feature and started by a
//! process manager that serves PMI on the descriptor named by `PMI_FD`: MPICH's `mpiexec`
//! (hydra) and Slurm's `srun --mpi=pmi2`. No MPI library is involved, so nothing of MPI's is
//! started, nor finalized, in the ranks.
//!
//! The client asks for PMI-2's wire protocol ([`v2`]: length-prefixed `;`-separated
//! commands, a fence that is a collective, job attributes) and takes PMI-1's ([`v1`]: text
//! lines) where the server offers only that; `PAGEWIRE_BOOT=pmi1` or `pmi2` asks for one.
//! Both are a [`KeyValueStore`](super::kvs::KeyValueStore) under the same allgather.
//!
//! A rank that fails asks the server to end the job (PMI's abort); a rank that dies without
//! a word ends the job under hydra (it sees the connection close), and under Slurm the
//! survivors see the dead peer in the message layer and abort.

mod v1;
mod v2;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;

use super::kvs::{hex, job_id_of, unhex, KvsBootstrap};
use pagewire_sys::{Error, Result};

/// Which PMI wire protocol a rank asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmiVersion {
    /// PMI-2 where the server offers it, else PMI-1.
    Any,
    /// PMI-1 only.
    V1,
    /// PMI-2 only.
    V2,
}

fn pmi_error(what: impl std::fmt::Display) -> Error {
    Error::Bootstrap(format!(
        "PMI (the process manager's key-value service): {what}"
    ))
}

/// A reply's `key=value` fields, split at each field's first `=`.
#[derive(Debug)]
struct Reply {
    text: String,
    fields: Vec<(String, String)>,
}

impl Reply {
    /// A PMI-1 line: space-separated words.
    fn parse_line(line: &str) -> Reply {
        Reply::parse(line, |c| c.is_ascii_whitespace())
    }

    /// A PMI-2 body: `;`-separated (and terminated) fields.
    fn parse_frame(body: &str) -> Reply {
        Reply::parse(body, |c| c == ';')
    }

    fn parse(text: &str, sep: impl Fn(char) -> bool) -> Reply {
        let fields = text
            .split(sep)
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Reply {
            text: text.trim().to_string(),
            fields,
        }
    }

    /// The value of `key`, if the reply has it (words the client does not know are
    /// ignored).
    fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The reply as received, for error messages.
    fn line(&self) -> &str {
        &self.text
    }

    /// Checks that the reply is to command `expect` and did not fail (`rc` other than 0; a
    /// missing `rc` is success, as hydra omits it in some replies).
    fn check(self, request: &str, expect: &str) -> Result<Reply> {
        if self.get("cmd") != Some(expect) {
            return Err(pmi_error(format!(
                "`{}` was answered `{}`, not {expect}",
                request.trim(),
                self.line()
            )));
        }
        match self.get("rc") {
            None | Some("0") => Ok(self),
            Some(_) => Err(pmi_error(format!(
                "`{}` failed: {}",
                request.trim(),
                self.line()
            ))),
        }
    }
}

/// The connection to the PMI server: one request, one reply, in either wire format.
#[derive(Debug)]
struct Channel {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Channel {
    fn new(stream: UnixStream) -> Result<Channel> {
        let writer = stream
            .try_clone()
            .map_err(|e| pmi_error(format!("duplicating PMI_FD: {e}")))?;
        Ok(Channel {
            reader: BufReader::new(stream),
            writer,
        })
    }

    fn closed(request: &str) -> Error {
        pmi_error(format!(
            "the process manager closed the connection during `{}` (a rank of the job ended?)",
            request.trim()
        ))
    }

    /// Sends one PMI-1 line (one write: servers read a request with one read).
    fn send_line(&mut self, line: &str) -> Result<()> {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| pmi_error(format!("sending `{line}`: {e}")))
    }

    /// Sends one PMI-1 line and reads one reply line, checking its `cmd` and `rc`.
    fn call_line(&mut self, line: &str, expect: &str) -> Result<Reply> {
        self.send_line(line)?;
        let mut resp = String::new();
        match self.reader.read_line(&mut resp) {
            Ok(0) => Err(Self::closed(line)),
            Ok(_) => Reply::parse_line(&resp).check(line, expect),
            Err(e) => Err(pmi_error(format!("reading the answer to `{line}`: {e}"))),
        }
    }

    /// Sends one PMI-2 command: its body's length in six characters, then the body.
    fn send_frame(&mut self, body: &str) -> Result<()> {
        if body.len() > 999_999 {
            return Err(pmi_error(format!(
                "a PMI-2 command of {} bytes",
                body.len()
            )));
        }
        self.writer
            .write_all(format!("{:<6}{body}", body.len()).as_bytes())
            .map_err(|e| pmi_error(format!("sending `{body}`: {e}")))
    }

    /// Sends one PMI-2 command and reads one reply, checking its `cmd` and `rc`. The
    /// reply's length may be padded on either side (Slurm pads on the right, hydra on the
    /// left).
    fn call_frame(&mut self, body: &str, expect: &str) -> Result<Reply> {
        self.call_frame_unchecked(body, expect)?.check(body, expect)
    }

    /// [`Channel::call_frame`] accepting any `rc` (the reply must still be to `expect`).
    fn call_frame_unchecked(&mut self, body: &str, expect: &str) -> Result<Reply> {
        self.send_frame(body)?;
        let mut len = [0u8; 6];
        self.reader
            .read_exact(&mut len)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Self::closed(body),
                _ => pmi_error(format!("reading the answer to `{body}`: {e}")),
            })?;
        let n: usize = std::str::from_utf8(&len)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| {
                pmi_error(format!(
                    "the answer to `{body}` has no length: {:?}",
                    String::from_utf8_lossy(&len)
                ))
            })?;
        let mut reply = vec![0u8; n];
        self.reader
            .read_exact(&mut reply)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Self::closed(body),
                _ => pmi_error(format!("reading the answer to `{body}`: {e}")),
            })?;
        let reply = String::from_utf8(reply)
            .map_err(|_| pmi_error(format!("the answer to `{body}` is not text")))?;
        let reply = Reply::parse_frame(&reply);
        if reply.get("cmd") != Some(expect) {
            return Err(pmi_error(format!(
                "`{body}` was answered `{}`, not {expect}",
                reply.line()
            )));
        }
        Ok(reply)
    }
}

/// Stores `value`, rank `rank`'s, as the text protocols carry bytes: hex, cut into values of
/// at most `value_max` characters under keys of `key`, the rank and the chunk (`KEYrRn`: the
/// count, `KEYrRcI`: chunk I), each through `put_one(key, text)`.
fn put_hex(
    key: &str,
    rank: usize,
    value: &[u8],
    value_max: usize,
    mut put_one: impl FnMut(&str, &str) -> Result<()>,
) -> Result<()> {
    let text = hex(value);
    let per = (value_max / 2 * 2).max(2);
    let chunks: Vec<&[u8]> = text.as_bytes().chunks(per).collect();
    put_one(&format!("{key}r{rank}n"), &chunks.len().to_string())?;
    for (i, chunk) in chunks.iter().enumerate() {
        let chunk = std::str::from_utf8(chunk).expect("hex is ASCII");
        put_one(&format!("{key}r{rank}c{i}"), chunk)?;
    }
    Ok(())
}

/// The bytes rank `rank` stored by [`put_hex`] under `key`, read through `get_one(key)`.
fn get_hex(
    key: &str,
    rank: usize,
    mut get_one: impl FnMut(&str) -> Result<String>,
) -> Result<Vec<u8>> {
    let n: usize = get_one(&format!("{key}r{rank}n"))?
        .parse()
        .map_err(|_| pmi_error(format!("rank {rank} put a malformed chunk count")))?;
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&get_one(&format!("{key}r{rank}c{i}"))?);
    }
    unhex(&text).ok_or_else(|| pmi_error(format!("rank {rank} put malformed bytes")))
}

fn env_number(var: &str) -> Result<usize> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| pmi_error(format!("{var} is missing or not a number")))
}

/// Who serves PMI here, for messages: Slurm sets `SLURM_JOB_ID` in its tasks.
fn server_name() -> &'static str {
    if std::env::var_os("SLURM_JOB_ID").is_some() {
        "Slurm's srun --mpi=pmi2"
    } else {
        "MPICH's mpiexec (hydra)"
    }
}

/// Connects through `PMI_FD` (set by the process manager for every rank), with `PMI_RANK`
/// and `PMI_SIZE`; says hello in the wire protocol `version` asks for and learns the job's
/// key-value space.
pub(super) fn connect_from_env(version: PmiVersion) -> Result<KvsBootstrap> {
    let fd = env_number("PMI_FD")?;
    let stream = super::sys::inherited_stream(fd as i32)
        .map_err(|e| pmi_error(format!("PMI_FD={fd} is not a usable connection: {e}")))?;
    let rank = env_number("PMI_RANK")?;
    let size = env_number("PMI_SIZE")?;
    if size == 0 || rank >= size {
        return Err(pmi_error(format!(
            "PMI_RANK={rank} is not below PMI_SIZE={size}"
        )));
    }
    let mut channel = Channel::new(stream)?;
    let server = server_name();
    let v2 = match version {
        PmiVersion::V1 => false,
        PmiVersion::V2 => {
            channel.call_line(
                "cmd=init pmi_version=2 pmi_subversion=0",
                "response_to_init",
            )?;
            true
        }
        // Slurm fixes one version per node at the first init and answers another with rc=-1;
        // such a server is then asked for PMI-1.
        PmiVersion::Any => channel
            .call_line(
                "cmd=init pmi_version=2 pmi_subversion=0",
                "response_to_init",
            )
            .is_ok_and(|r| r.get("pmi_version") == Some("2")),
    };
    if v2 {
        let store = v2::Pmi2::start(channel, rank, size)?;
        let starter = format!("{server}, PMI-2 wire protocol, {}", store.placement());
        let job = job_id_of("p", store.jobid());
        return Ok(KvsBootstrap::new(rank, size, job, starter, Box::new(store)));
    }
    channel.call_line(
        "cmd=init pmi_version=1 pmi_subversion=1",
        "response_to_init",
    )?;
    let store = v1::Pmi1::start(channel, rank)?;
    let starter = format!(
        "{server}, PMI-1 wire protocol, key-value space {}",
        store.kvsname()
    );
    let job = job_id_of("p", store.kvsname());
    Ok(KvsBootstrap::new(rank, size, job, starter, Box::new(store)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_of_both_formats_are_read() {
        let line =
            Reply::parse_line("cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n");
        assert_eq!(line.get("vallen_max"), Some("1024"));
        assert_eq!(line.get("cmd"), Some("maxes"));
        assert_eq!(line.get("nope"), None);
        let frame = Reply::parse_frame("cmd=kvs-get-response;rc=0;found=TRUE;value=a=b c;");
        assert_eq!(frame.get("value"), Some("a=b c"));
        assert!(frame
            .check("cmd=kvs-get;key=k;", "kvs-get-response")
            .is_ok());
        let failed = Reply::parse_frame("cmd=kvs-get-response;rc=1;");
        let e = failed
            .check("cmd=kvs-get;key=k;", "kvs-get-response")
            .unwrap_err();
        assert!(e.to_string().contains("rc=1"), "{e}");
        let other = Reply::parse_line("cmd=barrier_out\n");
        assert!(other.check("cmd=get", "get_result").is_err());
    }

    #[test]
    fn frames_carry_their_length_padded_either_way() {
        let (client, mut server) = UnixStream::pair().unwrap();
        let mut channel = Channel::new(client).unwrap();
        let t = std::thread::spawn(move || {
            let mut got = vec![0u8; 6 + 14];
            server.read_exact(&mut got).unwrap();
            // Slurm's padding on the right, then hydra's on the left.
            server
                .write_all(b"28    cmd=kvs-fence-response;rc=0;")
                .unwrap();
            server.read_exact(&mut got).unwrap();
            server
                .write_all(b"    28cmd=kvs-fence-response;rc=0;")
                .unwrap();
            String::from_utf8(got).unwrap()
        });
        channel
            .call_frame("cmd=kvs-fence;", "kvs-fence-response")
            .unwrap();
        channel
            .call_frame("cmd=kvs-fence;", "kvs-fence-response")
            .unwrap();
        assert_eq!(t.join().unwrap(), "14    cmd=kvs-fence;");
        assert!(channel
            .call_frame("cmd=kvs-fence;", "kvs-fence-response")
            .is_err());
    }
}
