//! A PMI-1 client: the bootstrap of a program built without the `mpi` feature
//! and started by MPICH's `mpiexec` (hydra), which serves the PMI-1 "simple" wire protocol
//! on the descriptor named by `PMI_FD`. No MPI library is involved, so nothing of MPI's
//! is started, nor finalized, in the ranks.
//!
//! # Protocol (PMI-1 wire, as hydra's proxy speaks it)
//!
//! Text lines of `key=value` words, each ending with a newline:
//!
//! ```text
//! cmd=init pmi_version=1 pmi_subversion=1   -> cmd=response_to_init ... rc=0
//! cmd=get_maxes                             -> cmd=maxes kvsname_max=K keylen_max=L vallen_max=V rc=0
//! cmd=get_my_kvsname                        -> cmd=my_kvsname kvsname=NAME rc=0
//! cmd=put kvsname=NAME key=K value=V        -> cmd=put_result rc=0
//! cmd=barrier_in                            -> cmd=barrier_out
//! cmd=get kvsname=NAME key=K                -> cmd=get_result rc=0 value=V
//! cmd=finalize                              -> cmd=finalize_ack
//! ```
//!
//! An allgather puts this rank's bytes (hex, cut to fit `vallen_max`) under keys of the
//! round and the rank, passes a barrier, and gets every rank's. A barrier is `barrier_in`.
//! A rank that dies makes hydra end the job; the others see the connection close and fail
//! with [`Error::Bootstrap`] instead of waiting.
//!
//! Slurm's `srun --mpi=pmi2` speaks PMI-2's wire protocol, which this client does not; the
//! error for such a launch says so.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use parking_lot::Mutex;

use super::Bootstrap;
use crate::error::{Error, Result};

/// The connection to the PMI server and what it said at start-up.
#[derive(Debug)]
pub struct PmiBootstrap {
    rank: usize,
    size: usize,
    job: String,
    kvsname: String,
    vallen_max: usize,
    conn: Mutex<Conn>,
}

#[derive(Debug)]
struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Collectives completed, naming the keys of the next.
    round: u64,
}

fn pmi_error(what: impl std::fmt::Display) -> Error {
    Error::Bootstrap(format!("PMI-1 (mpiexec's process manager): {what}"))
}

/// The value of `key` in a response line's words.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn env_number(var: &str) -> Result<usize> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| pmi_error(format!("{var} is missing or not a number")))
}

impl Conn {
    /// Sends one command line and reads one response line, checking its `cmd` and `rc`.
    fn call(&mut self, line: &str, expect: &str) -> Result<String> {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| pmi_error(format!("sending `{line}`: {e}")))?;
        let mut resp = String::new();
        match self.reader.read_line(&mut resp) {
            Ok(0) => {
                return Err(pmi_error(format!(
                    "the process manager closed the connection during `{line}` (a rank of \
                     the job ended?)"
                )))
            }
            Ok(_) => {}
            Err(e) => return Err(pmi_error(format!("reading the answer to `{line}`: {e}"))),
        }
        if field(&resp, "cmd") != Some(expect) {
            return Err(pmi_error(format!(
                "`{line}` was answered `{}`, not {expect}",
                resp.trim()
            )));
        }
        if let Some(rc) = field(&resp, "rc") {
            if rc != "0" {
                return Err(pmi_error(format!("`{line}` failed: {}", resp.trim())));
            }
        }
        Ok(resp)
    }
}

impl PmiBootstrap {
    /// Connects through `PMI_FD` (set by hydra for every rank), with `PMI_RANK` and
    /// `PMI_SIZE`; says hello and learns the job's key-value space.
    pub fn connect_from_env() -> Result<PmiBootstrap> {
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
        let writer = stream
            .try_clone()
            .map_err(|e| pmi_error(format!("duplicating PMI_FD: {e}")))?;
        let mut conn = Conn {
            reader: BufReader::new(stream),
            writer,
            round: 0,
        };
        conn.call(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "response_to_init",
        )?;
        let maxes = conn.call("cmd=get_maxes", "maxes")?;
        let vallen_max = field(&maxes, "vallen_max")
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&v| v >= 64)
            .ok_or_else(|| pmi_error(format!("no usable vallen_max in `{}`", maxes.trim())))?;
        let name = conn.call("cmd=get_my_kvsname", "my_kvsname")?;
        let kvsname = field(&name, "kvsname")
            .filter(|k| !k.is_empty())
            .ok_or_else(|| pmi_error(format!("no kvsname in `{}`", name.trim())))?
            .to_string();
        Ok(PmiBootstrap {
            rank,
            size,
            job: job_id_of(&kvsname),
            kvsname,
            vallen_max,
            conn: Mutex::new(conn),
        })
    }
}

/// A job id (`[0-9a-z]`, at most 24 characters) from the key-value space's name, which
/// every rank of the job shares and no other job has (hydra: `kvs_PID_N`).
fn job_id_of(kvsname: &str) -> String {
    let mut id: String = kvsname
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    id.truncate(24);
    if id.is_empty() {
        id.push_str("pmi");
    }
    format!("p{id}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Bootstrap for PmiBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn job_id(&self) -> &str {
        &self.job
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut c = self.conn.lock();
        let round = c.round;
        c.round += 1;
        let kvs = &self.kvsname;
        // Hex digits per value, even, leaving room for nothing else.
        let per = (self.vallen_max.saturating_sub(2) / 2 * 2).max(2);
        let text = hex(mine);
        let chunks: Vec<&str> = if text.is_empty() {
            Vec::new()
        } else {
            text.as_bytes()
                .chunks(per)
                .map(|c| std::str::from_utf8(c).expect("hex is ASCII"))
                .collect()
        };
        let me = self.rank;
        c.call(
            &format!(
                "cmd=put kvsname={kvs} key=pw{round}r{me}n value={}",
                chunks.len()
            ),
            "put_result",
        )?;
        for (i, chunk) in chunks.iter().enumerate() {
            c.call(
                &format!("cmd=put kvsname={kvs} key=pw{round}r{me}c{i} value={chunk}"),
                "put_result",
            )?;
        }
        c.call("cmd=barrier_in", "barrier_out")?;
        let mut all = Vec::with_capacity(self.size);
        for r in 0..self.size {
            if r == me {
                all.push(mine.to_vec());
                continue;
            }
            let get = |c: &mut Conn, key: String| -> Result<String> {
                let resp = c.call(&format!("cmd=get kvsname={kvs} key={key}"), "get_result")?;
                field(&resp, "value")
                    .map(str::to_string)
                    .ok_or_else(|| pmi_error(format!("no value for {key}")))
            };
            let n: usize = get(&mut c, format!("pw{round}r{r}n"))?
                .parse()
                .map_err(|_| pmi_error(format!("rank {r} put a malformed chunk count")))?;
            let mut text = String::new();
            for i in 0..n {
                text.push_str(&get(&mut c, format!("pw{round}r{r}c{i}"))?);
            }
            all.push(
                unhex(&text).ok_or_else(|| pmi_error(format!("rank {r} put malformed bytes")))?,
            );
        }
        Ok(all)
    }

    fn barrier(&self) -> Result<()> {
        self.conn
            .lock()
            .call("cmd=barrier_in", "barrier_out")
            .map(|_| ())
    }
}

impl Drop for PmiBootstrap {
    fn drop(&mut self) {
        // Tells hydra this rank ended in order (it reports ranks that exit without it).
        let mut c = self.conn.lock();
        let _ = c.call("cmd=finalize", "finalize_ack");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_hex_and_job_ids() {
        let line = "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n";
        assert_eq!(field(line, "vallen_max"), Some("1024"));
        assert_eq!(field(line, "cmd"), Some("maxes"));
        assert_eq!(field(line, "nope"), None);
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&bytes)).unwrap(), bytes);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(job_id_of("kvs_1234_0"), "pkvs12340");
        assert!(job_id_of("kvs_1234_0")
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()));
        assert_eq!(job_id_of("__"), "ppmi");
    }

    /// A PMI-1 server on a socket pair playing hydra for one rank of two: the client's
    /// allgather puts its bytes, passes the barrier and reads the other rank's.
    #[test]
    fn an_allgather_goes_through_put_barrier_and_get() {
        let (client, server) = UnixStream::pair().unwrap();
        let peer_bytes = vec![7u8; 700]; // more than one 1024-digit value
        let serve = std::thread::spawn(move || {
            let mut r = BufReader::new(server.try_clone().unwrap());
            let mut w = server;
            let mut kv = std::collections::HashMap::new();
            let text = hex(&peer_bytes);
            let chunks: Vec<String> = text
                .as_bytes()
                .chunks(1022)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect();
            kv.insert("pw0r1n".to_string(), chunks.len().to_string());
            for (i, c) in chunks.iter().enumerate() {
                kv.insert(format!("pw0r1c{i}"), c.clone());
            }
            let mut line = String::new();
            loop {
                line.clear();
                if r.read_line(&mut line).unwrap() == 0 {
                    return kv;
                }
                let answer = match field(&line, "cmd").unwrap() {
                    "init" => {
                        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0".to_string()
                    }
                    "get_maxes" => {
                        "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0".into()
                    }
                    "get_my_kvsname" => "cmd=my_kvsname kvsname=kvs_42_0 rc=0".into(),
                    "put" => {
                        kv.insert(
                            field(&line, "key").unwrap().into(),
                            field(&line, "value").unwrap().into(),
                        );
                        "cmd=put_result rc=0 msg=success".into()
                    }
                    "barrier_in" => "cmd=barrier_out".into(),
                    "get" => match kv.get(field(&line, "key").unwrap()) {
                        Some(v) => format!("cmd=get_result rc=0 value={v}"),
                        None => "cmd=get_result rc=-1 msg=key_not_found".into(),
                    },
                    "finalize" => "cmd=finalize_ack".into(),
                    other => panic!("unexpected {other}"),
                };
                w.write_all(format!("{answer}\n").as_bytes()).unwrap();
            }
        });
        let writer = client.try_clone().unwrap();
        let mut conn = Conn {
            reader: BufReader::new(client),
            writer,
            round: 0,
        };
        conn.call(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "response_to_init",
        )
        .unwrap();
        conn.call("cmd=get_maxes", "maxes").unwrap();
        conn.call("cmd=get_my_kvsname", "my_kvsname").unwrap();
        let b = PmiBootstrap {
            rank: 0,
            size: 2,
            job: job_id_of("kvs_42_0"),
            kvsname: "kvs_42_0".into(),
            vallen_max: 1024,
            conn: Mutex::new(conn),
        };
        let all = b.allgather(b"rank zero").unwrap();
        assert_eq!(all[0], b"rank zero");
        assert_eq!(all[1], vec![7u8; 700]);
        drop(b);
        let kv = serve.join().unwrap();
        assert_eq!(kv["pw0r0n"], "1");
        assert_eq!(unhex(&kv["pw0r0c0"]).unwrap(), b"rank zero");
    }
}
