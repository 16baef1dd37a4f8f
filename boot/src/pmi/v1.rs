//! PMI-1's wire protocol ("simple" PMI), as MPICH's hydra serves it on `PMI_FD` and Slurm's
//! mpi/pmi2 plugin serves it beside PMI-2.
//!
//! Text lines of space-separated `key=value` words, each ending with a newline:
//!
//! ```text
//! cmd=init pmi_version=1 pmi_subversion=1   -> cmd=response_to_init ... rc=0
//! cmd=get_maxes                             -> cmd=maxes kvsname_max=K keylen_max=L vallen_max=V rc=0
//! cmd=get_my_kvsname                        -> cmd=my_kvsname kvsname=NAME rc=0
//! cmd=put kvsname=NAME key=K value=V        -> cmd=put_result rc=0
//! cmd=barrier_in                            -> cmd=barrier_out
//! cmd=get kvsname=NAME key=K                -> cmd=get_result rc=0 value=V
//! cmd=abort exitcode=N                      -> (the job ends)
//! cmd=finalize                              -> cmd=finalize_ack
//! ```
//!
//! Words the client does not know (hydra 4.1 adds `found=TRUE` to a get's answer) are
//! ignored. Values are hex, cut into chunks of at most `vallen_max` characters under keys
//! of the rank, the round and the chunk.

use super::{get_hex, pmi_error, put_hex, Channel};
use crate::kvs::KeyValueStore;
use pagewire_sys::Result;

/// A PMI-1 key-value space.
pub(super) struct Pmi1 {
    channel: Channel,
    kvsname: String,
    vallen_max: usize,
    rank: usize,
}

impl Pmi1 {
    /// Learns the limits and the key-value space's name over `channel`, on which `init` was
    /// answered for PMI-1.
    pub(super) fn start(mut channel: Channel, rank: usize) -> Result<Pmi1> {
        let maxes = channel.call_line("cmd=get_maxes", "maxes")?;
        let vallen_max = maxes
            .get("vallen_max")
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&v| v >= 64)
            .ok_or_else(|| pmi_error(format!("no usable vallen_max in `{}`", maxes.line())))?;
        let name = channel.call_line("cmd=get_my_kvsname", "my_kvsname")?;
        let kvsname = name
            .get("kvsname")
            .filter(|k| !k.is_empty())
            .ok_or_else(|| pmi_error(format!("no kvsname in `{}`", name.line())))?
            .to_string();
        Ok(Pmi1 {
            channel,
            kvsname,
            vallen_max,
            rank,
        })
    }

    /// The key-value space's name, which every rank of the job shares.
    pub(super) fn kvsname(&self) -> &str {
        &self.kvsname
    }

    fn get_text(&mut self, key: &str) -> Result<String> {
        let kvs = &self.kvsname;
        let resp = self
            .channel
            .call_line(&format!("cmd=get kvsname={kvs} key={key}"), "get_result")?;
        resp.get("value")
            .map(str::to_string)
            .ok_or_else(|| pmi_error(format!("no value for {key}")))
    }
}

impl KeyValueStore for Pmi1 {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let (channel, kvs) = (&mut self.channel, &self.kvsname);
        // A value leaves room for nothing else.
        let value_max = self.vallen_max.saturating_sub(2);
        put_hex(key, self.rank, value, value_max, |key, text| {
            channel
                .call_line(
                    &format!("cmd=put kvsname={kvs} key={key} value={text}"),
                    "put_result",
                )
                .map(drop)
        })
    }

    fn fence(&mut self) -> Result<()> {
        self.channel.call_line("cmd=barrier_in", "barrier_out")?;
        Ok(())
    }

    fn get(&mut self, rank: usize, key: &str) -> Result<Vec<u8>> {
        get_hex(key, rank, |key| self.get_text(key))
    }

    fn abort(&mut self, code: i32, _message: &str) {
        // No answer: the process manager ends the job.
        let _ = self
            .channel
            .send_line(&format!("cmd=abort exitcode={code}"));
    }

    fn finalize(&mut self) {
        // Tells the process manager this rank ended in order (hydra reports ranks that
        // exit without it).
        let _ = self.channel.call_line("cmd=finalize", "finalize_ack");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvs::{hex, unhex};
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

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
                let f = super::super::Reply::parse_line(&line);
                let answer = match f.get("cmd").unwrap() {
                    "get_maxes" => {
                        "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0".into()
                    }
                    "get_my_kvsname" => "cmd=my_kvsname kvsname=kvs_42_0 rc=0".into(),
                    "put" => {
                        kv.insert(f.get("key").unwrap().into(), f.get("value").unwrap().into());
                        "cmd=put_result rc=0 msg=success".into()
                    }
                    "barrier_in" => "cmd=barrier_out".into(),
                    // hydra 4.1 adds found=TRUE.
                    "get" => match kv.get(f.get("key").unwrap()) {
                        Some(v) => format!("cmd=get_result rc=0 found=TRUE value={v}"),
                        None => "cmd=get_result rc=-1 msg=key_not_found".into(),
                    },
                    "finalize" => "cmd=finalize_ack".into(),
                    other => panic!("unexpected {other}"),
                };
                w.write_all(format!("{answer}\n").as_bytes()).unwrap();
            }
        });
        let mut store = Pmi1::start(Channel::new(client).unwrap(), 0).unwrap();
        assert_eq!(store.kvsname(), "kvs_42_0");
        store.put("pw0", b"rank zero").unwrap();
        store.fence().unwrap();
        assert_eq!(store.get(1, "pw0").unwrap(), vec![7u8; 700]);
        assert!(store.get(1, "pw9").is_err(), "a missing key is an error");
        store.finalize();
        drop(store);
        let kv = serve.join().unwrap();
        assert_eq!(kv["pw0r0n"], "1");
        assert_eq!(unhex(&kv["pw0r0c0"]).unwrap(), b"rank zero");
    }
}
