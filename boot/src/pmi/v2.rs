//! PMI-2's wire protocol, as Slurm's mpi/pmi2 plugin and MPICH's hydra serve it.
//!
//! After the PMI-1-style `init` line asking for version 2, every command is a frame: the
//! body's length in six ASCII digits (padded with spaces), then `cmd=NAME;` and `key=value;`
//! fields, each ended by `;` (there is no escape: values never hold `;`):
//!
//! ```text
//! cmd=fullinit;pmijobid=J;pmirank=R;threaded=FALSE;  -> cmd=fullinit-response;rc=0;rank=R;size=N;...
//! cmd=job-getid;                                     -> cmd=job-getid-response;rc=0;jobid=J;
//! cmd=info-getjobattr;key=PMI_process_mapping;       -> cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,2,2));
//! cmd=kvs-put;key=K;value=V;                         -> cmd=kvs-put-response;rc=0;
//! cmd=kvs-fence;                                     -> cmd=kvs-fence-response;rc=0;
//! cmd=kvs-get;jobid=J;srcid=R;key=K;                 -> cmd=kvs-get-response;rc=0;found=TRUE;value=V;
//! cmd=abort;isworld=TRUE;msg=M;exitcode=C;message=M; -> (the job ends)
//! cmd=finalize;                                      -> cmd=finalize-response;rc=0;
//! ```
//!
//! Slurm's fence is a collective of the whole step (its gets are local lookups); hydra's
//! returns at once and its gets wait for the key, or, for a key no one puts, for every rank
//! to fence (so a barrier is a fence and such a get). Values are hex, at most 1,024 characters
//! each (the limit both servers declare), chunked as PMI-1's are.

use super::{get_hex, pmi_error, put_hex, Channel};
use crate::kvs::KeyValueStore;
use pagewire_sys::Result;

/// The longest value both servers accept.
const VALUE_MAX: usize = 1024;

/// A PMI-2 key-value space.
pub(super) struct Pmi2 {
    channel: Channel,
    jobid: String,
    rank: usize,
    /// The node of each rank, from `PMI_process_mapping` (`None` where the server gave
    /// none, or one this client does not read).
    nodes: Option<Vec<usize>>,
}

impl Pmi2 {
    /// Completes the start-up over `channel`, on which `init` was answered for PMI-2.
    pub(super) fn start(mut channel: Channel, rank: usize, size: usize) -> Result<Pmi2> {
        let pmijobid = std::env::var("PMI_JOBID").unwrap_or_else(|_| "0".into());
        let init = channel.call_frame(
            &format!("cmd=fullinit;pmijobid={pmijobid};pmirank={rank};threaded=FALSE;"),
            "fullinit-response",
        )?;
        let said = |k: &str| init.get(k).and_then(|v| v.parse::<usize>().ok());
        if said("rank") != Some(rank) || said("size") != Some(size) {
            return Err(pmi_error(format!(
                "the process manager says rank {:?} of {:?}, the environment rank {rank} of \
                 {size} (PMI_RANK, PMI_SIZE): `{}`",
                init.get("rank"),
                init.get("size"),
                init.line()
            )));
        }
        let jobid = channel
            .call_frame("cmd=job-getid;", "job-getid-response")?
            .get("jobid")
            .filter(|j| !j.is_empty())
            .map(str::to_string)
            .ok_or_else(|| pmi_error("no job id in the answer to job-getid"))?;
        let mapping = channel
            .call_frame(
                "cmd=info-getjobattr;key=PMI_process_mapping;",
                "info-getjobattr-response",
            )
            .ok()
            .filter(|r| r.get("found") == Some("TRUE"))
            .and_then(|r| r.get("value").map(str::to_string));
        let nodes = mapping.and_then(|m| nodes_of_ranks(&m, size));
        Ok(Pmi2 {
            channel,
            jobid,
            rank,
            nodes,
        })
    }

    /// The job's id as the process manager names it (Slurm: `JOB.STEP`).
    pub(super) fn jobid(&self) -> &str {
        &self.jobid
    }

    /// Where the ranks run, from the process mapping, in words.
    pub(super) fn placement(&self) -> String {
        match &self.nodes {
            Some(nodes) => {
                let count = nodes.iter().max().map_or(0, |n| n + 1);
                let here = nodes.iter().filter(|&&n| n == nodes[self.rank]).count();
                format!(
                    "job {}, {} ranks on {}, {here} on this one",
                    self.jobid,
                    nodes.len(),
                    crate::kvs::count_of(count as u64, "node")
                )
            }
            None => format!("job {}, no process mapping", self.jobid),
        }
    }

    fn get_text(&mut self, rank: usize, key: &str) -> Result<String> {
        let reply = self.channel.call_frame(
            &format!("cmd=kvs-get;jobid={};srcid={rank};key={key};", self.jobid),
            "kvs-get-response",
        )?;
        match (reply.get("found"), reply.get("value")) {
            (Some("TRUE") | None, Some(v)) => Ok(v.to_string()),
            _ => Err(pmi_error(format!(
                "rank {rank} put no {key}: `{}`",
                reply.line()
            ))),
        }
    }
}

/// The node of every rank from a PMI process mapping, `(vector,(N,C,R),...)`: each block
/// gives nodes `N..N+C` `R` consecutive ranks each, and the blocks repeat in order until
/// every rank has a node. `None` if the text is not that form or does not cover `size`
/// ranks.
fn nodes_of_ranks(mapping: &str, size: usize) -> Option<Vec<usize>> {
    let inner = mapping.trim().strip_prefix("(vector,")?.strip_suffix(')')?;
    let mut blocks = Vec::new();
    for block in inner.split("),") {
        let block = block.trim().trim_start_matches('(').trim_end_matches(')');
        let n: Vec<usize> = block
            .split(',')
            .map(|v| v.trim().parse().ok())
            .collect::<Option<_>>()?;
        let [first, count, per] = n[..] else {
            return None;
        };
        blocks.push((first, count, per));
    }
    if blocks.iter().all(|&(_, c, p)| c == 0 || p == 0) {
        return None;
    }
    let mut nodes = Vec::with_capacity(size);
    while nodes.len() < size {
        for &(first, count, per) in &blocks {
            for node in first..first + count {
                for _ in 0..per {
                    if nodes.len() < size {
                        nodes.push(node);
                    }
                }
            }
        }
    }
    Some(nodes)
}

impl KeyValueStore for Pmi2 {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let channel = &mut self.channel;
        put_hex(key, self.rank, value, VALUE_MAX, |key, text| {
            channel
                .call_frame(
                    &format!("cmd=kvs-put;key={key};value={text};"),
                    "kvs-put-response",
                )
                .map(drop)
        })
    }

    fn fence(&mut self) -> Result<()> {
        self.channel
            .call_frame("cmd=kvs-fence;", "kvs-fence-response")?;
        Ok(())
    }

    /// Slurm's fence is a collective, hydra's is not: there a get of a key no one puts
    /// waits until every rank has fenced, then fails (what MPICH's own barrier does).
    fn barrier(&mut self) -> Result<()> {
        self.fence()?;
        self.channel
            .call_frame_unchecked("cmd=kvs-get;key=pw-nobody-puts-this;", "kvs-get-response")?;
        Ok(())
    }

    fn get(&mut self, rank: usize, key: &str) -> Result<Vec<u8>> {
        get_hex(key, rank, |key| self.get_text(rank, key))
    }

    fn abort(&mut self, code: i32, message: &str) {
        // Slurm reads isworld and msg, hydra exitcode and message; neither answers. Values
        // hold no `;` and are never empty.
        let message: String = message
            .chars()
            .map(|c| if c == ';' || c.is_control() { ' ' } else { c })
            .collect();
        let message = if message.trim().is_empty() {
            "abort".to_string()
        } else {
            message
        };
        let _ = self.channel.send_frame(&format!(
            "cmd=abort;isworld=TRUE;msg={message};exitcode={code};message={message};"
        ));
    }

    fn finalize(&mut self) {
        let _ = self
            .channel
            .call_frame("cmd=finalize;", "finalize-response");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvs::{hex, unhex};
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn process_mappings_give_each_rank_its_node() {
        // Block: 4 ranks, 2 per node on 2 nodes.
        assert_eq!(
            nodes_of_ranks("(vector,(0,2,2))", 4),
            Some(vec![0, 0, 1, 1])
        );
        // Cyclic, as Slurm writes it: every round explicitly.
        assert_eq!(
            nodes_of_ranks("(vector,(0,2,1),(0,2,1))", 4),
            Some(vec![0, 1, 0, 1])
        );
        // 3 ranks over 2 nodes, 2 and 1.
        assert_eq!(
            nodes_of_ranks("(vector,(0,1,2),(1,1,1))", 3),
            Some(vec![0, 0, 1])
        );
        // A compact form repeats its blocks.
        assert_eq!(
            nodes_of_ranks("(vector,(0,2,1))", 4),
            Some(vec![0, 1, 0, 1])
        );
        assert_eq!(nodes_of_ranks("[0,1]x2", 4), None);
        assert_eq!(nodes_of_ranks("(vector,(0,2))", 4), None);
        assert_eq!(nodes_of_ranks("(vector,(0,0,0))", 4), None);
    }

    /// A PMI-2 server on a socket pair playing Slurm (replies padded on the right) for rank
    /// 1 of 2, whose peer put 3,000 bytes: more than one value's worth.
    #[test]
    fn a_rank_starts_puts_fences_and_gets_over_frames() {
        let (client, mut server) = UnixStream::pair().unwrap();
        let peer = vec![0x5au8; 3000];
        let serve = std::thread::spawn(move || {
            let text = hex(&peer);
            let chunks: Vec<String> = text
                .as_bytes()
                .chunks(VALUE_MAX)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect();
            let mut kv: HashMap<String, String> = HashMap::new();
            kv.insert("pw0r0n".into(), chunks.len().to_string());
            for (i, c) in chunks.into_iter().enumerate() {
                kv.insert(format!("pw0r0c{i}"), c);
            }
            let mut commands = Vec::new();
            loop {
                let mut len = [0u8; 6];
                if server.read_exact(&mut len).is_err() {
                    return (kv, commands);
                }
                let n: usize = std::str::from_utf8(&len).unwrap().trim().parse().unwrap();
                let mut body = vec![0u8; n];
                server.read_exact(&mut body).unwrap();
                let body = String::from_utf8(body).unwrap();
                assert!(body.ends_with(';'), "{body}");
                let r = super::super::Reply::parse_frame(&body);
                let cmd = r.get("cmd").unwrap().to_string();
                commands.push(cmd.clone());
                let answer = match cmd.as_str() {
                    "fullinit" => {
                        assert_eq!(r.get("pmirank"), Some("1"));
                        assert_eq!(r.get("threaded"), Some("FALSE"));
                        "cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=1;\
                         size=2;appnum=-1;debugged=FALSE;pmiverbose=FALSE;"
                            .to_string()
                    }
                    "job-getid" => "cmd=job-getid-response;rc=0;jobid=77.0;".into(),
                    "info-getjobattr" => "cmd=info-getjobattr-response;rc=0;found=TRUE;\
                                          value=(vector,(0,2,1));"
                        .into(),
                    "kvs-put" => {
                        kv.insert(r.get("key").unwrap().into(), r.get("value").unwrap().into());
                        "cmd=kvs-put-response;rc=0;".into()
                    }
                    "kvs-fence" => "cmd=kvs-fence-response;rc=0;".into(),
                    "kvs-get" => match kv.get(r.get("key").unwrap()) {
                        Some(v) => format!("cmd=kvs-get-response;rc=0;found=TRUE;value={v};"),
                        None => "cmd=kvs-get-response;rc=0;found=FALSE;".into(),
                    },
                    "finalize" => "cmd=finalize-response;rc=0;".into(),
                    other => panic!("unexpected {other}"),
                };
                server
                    .write_all(format!("{:<6}{answer}", answer.len()).as_bytes())
                    .unwrap();
            }
        });
        let mut store = Pmi2::start(Channel::new(client).unwrap(), 1, 2).unwrap();
        assert_eq!(store.jobid(), "77.0");
        assert_eq!(
            store.placement(),
            "job 77.0, 2 ranks on 2 nodes, 1 on this one"
        );
        store.put("pw0", b"rank one").unwrap();
        store.fence().unwrap();
        assert_eq!(store.get(0, "pw0").unwrap(), vec![0x5au8; 3000]);
        let e = store.get(0, "pw9").unwrap_err().to_string();
        assert!(e.contains("found=FALSE"), "{e}");
        store.finalize();
        drop(store);
        let (kv, commands) = serve.join().unwrap();
        assert_eq!(kv["pw0r1n"], "1");
        assert_eq!(unhex(&kv["pw0r1c0"]).unwrap(), b"rank one");
        assert_eq!(
            commands[..4],
            ["fullinit", "job-getid", "info-getjobattr", "kvs-put"]
        );
        assert_eq!(commands.last().map(String::as_str), Some("finalize"));
    }
}
