//! Adding processes to a running job (`MPI_Comm_spawn`, `MPI_Comm_spawn_multiple`) under
//! `pwrun`: what a spawning group asks the launcher for, what it gets back, and what the
//! started processes find in their environment.
//!
//! The launcher starts the new processes as a job of their own (their world, job `B`) and
//! opens a *connection job* `C` of the spawning group's `N` processes and the `M` new ones:
//! ranks `0..N` of `C` are the spawning group in its order, ranks `N..N+M` the new processes
//! in the order of the commands. Both sides join `C` through the launcher's bootstrap as they
//! join any job and bring up a second message layer on it; the intercommunicator between the
//! two groups is a communicator of that second layer. MPICH's hydra and Open MPI's PRRTE do
//! the same in their way: the children are a new job whose processes connect to the
//! parents' through a port the launcher hands out.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use pagewire_sys::{Error, Result};

/// Set in a spawned process: the connection job's id.
pub const ENV_SPAWN_JOB: &str = "PAGEWIRE_SPAWN_JOB";
/// Set in a spawned process: the connection job's bootstrap socket.
pub const ENV_SPAWN_BOOT: &str = "PAGEWIRE_SPAWN_BOOT";
/// Set in a spawned process: its rank in the connection job.
pub const ENV_SPAWN_RANK: &str = "PAGEWIRE_SPAWN_RANK";
/// Set in a spawned process: the connection job's size (spawning group and spawned).
pub const ENV_SPAWN_SIZE: &str = "PAGEWIRE_SPAWN_SIZE";
/// Set in a spawned process: how many of the connection job's ranks, the first ones, are
/// the spawning group.
pub const ENV_SPAWN_PARENTS: &str = "PAGEWIRE_SPAWN_PARENTS";
/// Set in a spawned process: the index of its command among those spawned together
/// (`MPI_APPNUM`).
pub const ENV_APPNUM: &str = "PAGEWIRE_APPNUM";

/// One command of a spawn and how many processes run it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpawnCommand {
    /// The program, looked up in `PATH` if it has no slash.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Changes to the launcher's environment: a value to set, or `None` to remove.
    pub env: Vec<(OsString, Option<OsString>)>,
    /// The working directory; `None`: the launcher's.
    pub dir: Option<PathBuf>,
    /// Processes that run it (at least 1).
    pub count: usize,
}

/// What a spawning group's root asks the launcher for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpawnRequest {
    /// The spawning group: the bootstrap ranks (of the job the request goes to) of its
    /// processes, in the group's order. They become ranks `0..N` of the connection job.
    pub group: Vec<usize>,
    /// The commands, in order.
    pub commands: Vec<SpawnCommand>,
}

/// The connection job the launcher opened for a spawn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionJob {
    /// Its job id.
    pub job: String,
    /// Its bootstrap socket.
    pub socket: PathBuf,
    /// Ranks `0..parents` are the spawning group.
    pub parents: usize,
    /// Ranks `parents..parents + children` are the spawned processes.
    pub children: usize,
}

impl ConnectionJob {
    /// Ranks in the connection job.
    pub fn size(&self) -> usize {
        self.parents + self.children
    }

    /// The connection job of a process the launcher spawned, and its rank in it; `None` for
    /// a process that was not spawned. A half-set or garbled environment is an error.
    pub fn from_env() -> Result<Option<(ConnectionJob, usize)>> {
        let Some(job) = std::env::var_os(ENV_SPAWN_JOB) else {
            return Ok(None);
        };
        let job = job
            .into_string()
            .ok()
            .filter(|j| !j.is_empty() && j.bytes().all(|b| b.is_ascii_alphanumeric()))
            .ok_or_else(|| Error::Bootstrap(format!("{ENV_SPAWN_JOB} is not a job id")))?;
        let number = |name: &str| -> Result<usize> {
            let v = std::env::var(name).map_err(|_| {
                Error::Bootstrap(format!(
                    "{ENV_SPAWN_JOB} is set but {name} is not: a spawned process's environment \
                     is incomplete"
                ))
            })?;
            v.trim().parse().map_err(|_| {
                Error::Bootstrap(format!("{name}={v:?} is not a non-negative integer"))
            })
        };
        let (rank, size, parents) = (
            number(ENV_SPAWN_RANK)?,
            number(ENV_SPAWN_SIZE)?,
            number(ENV_SPAWN_PARENTS)?,
        );
        if parents == 0 || rank < parents || rank >= size {
            return Err(Error::Bootstrap(format!(
                "{ENV_SPAWN_RANK}={rank}, {ENV_SPAWN_SIZE}={size}, {ENV_SPAWN_PARENTS}={parents}: \
                 a spawned process's rank lies after the spawning group's and inside the job"
            )));
        }
        let socket = std::env::var_os(ENV_SPAWN_BOOT)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                Error::Bootstrap(format!(
                    "{ENV_SPAWN_JOB} is set but {ENV_SPAWN_BOOT} is not"
                ))
            })?;
        let conn = ConnectionJob {
            job,
            socket: PathBuf::from(socket),
            parents,
            children: size - parents,
        };
        Ok(Some((conn, rank)))
    }

    /// The environment of the spawned process of connection rank `rank` running command
    /// number `appnum`.
    pub fn child_env(&self, rank: usize, appnum: usize) -> Vec<(OsString, OsString)> {
        [
            (ENV_SPAWN_JOB, self.job.clone().into()),
            (ENV_SPAWN_BOOT, self.socket.clone().into_os_string()),
            (ENV_SPAWN_RANK, rank.to_string().into()),
            (ENV_SPAWN_SIZE, self.size().to_string().into()),
            (ENV_SPAWN_PARENTS, self.parents.to_string().into()),
            (ENV_APPNUM, appnum.to_string().into()),
        ]
        .into_iter()
        .map(|(k, v)| (OsString::from(k), v))
        .collect()
    }
}

impl SpawnCommand {
    /// `count` processes of `command` as the caller built it: program, arguments, the
    /// environment changes and the working directory it holds.
    pub fn from_command(command: &std::process::Command, count: usize) -> SpawnCommand {
        SpawnCommand {
            program: command.get_program().to_os_string(),
            args: command.get_args().map(|a| a.to_os_string()).collect(),
            env: command
                .get_envs()
                .map(|(k, v)| (k.to_os_string(), v.map(|v| v.to_os_string())))
                .collect(),
            dir: command.get_current_dir().map(|d| d.to_path_buf()),
            count,
        }
    }
}

impl ConnectionJob {
    /// Its encoding, as the launcher sends it (for the spawning root to pass on).
    pub fn to_bytes(&self) -> Vec<u8> {
        wire::encode_connection(self)
    }

    /// A connection job from [`ConnectionJob::to_bytes`]; `None` if garbled.
    pub fn from_bytes(bytes: &[u8]) -> Option<ConnectionJob> {
        wire::decode_connection(bytes)
    }
}

/// This process's `MPI_APPNUM`: the index of its command in the spawn that started it.
pub fn appnum() -> Option<i32> {
    std::env::var(ENV_APPNUM).ok()?.trim().parse().ok()
}

/// Byte encodings of the launcher protocol's SPAWN and SPAWNED frames: lengths and numbers
/// as little-endian `u64`, strings as a length and their bytes.
pub(crate) mod wire {
    use super::*;

    struct Writer(Vec<u8>);

    impl Writer {
        fn number(&mut self, n: usize) {
            self.0.extend_from_slice(&(n as u64).to_le_bytes());
        }
        fn bytes(&mut self, b: &[u8]) {
            self.number(b.len());
            self.0.extend_from_slice(b);
        }
        /// 0 for none, else 1 and the bytes.
        fn optional(&mut self, b: Option<&[u8]>) {
            self.number(usize::from(b.is_some()));
            if let Some(b) = b {
                self.bytes(b);
            }
        }
    }

    struct Reader<'a>(&'a [u8]);

    impl Reader<'_> {
        fn number(&mut self) -> Option<usize> {
            let (head, rest) = self.0.split_at_checked(8)?;
            self.0 = rest;
            usize::try_from(u64::from_le_bytes(head.try_into().ok()?)).ok()
        }
        fn bytes(&mut self) -> Option<Vec<u8>> {
            let len = self.number()?;
            let (head, rest) = self.0.split_at_checked(len)?;
            self.0 = rest;
            Some(head.to_vec())
        }
        fn os(&mut self) -> Option<OsString> {
            self.bytes().map(OsString::from_vec)
        }
        /// What [`Writer::optional`] wrote: `Some(None)` for none, `None` if garbled.
        fn optional_os(&mut self) -> Option<Option<OsString>> {
            match self.number()? {
                0 => Some(None),
                1 => self.os().map(Some),
                _ => None,
            }
        }
        /// A count of items each taking at least `min_bytes`, bounded by what is left.
        fn count(&mut self, min_bytes: usize) -> Option<usize> {
            self.number().filter(|&n| n <= self.0.len() / min_bytes)
        }
    }

    /// The payload of a SPAWN frame.
    pub(crate) fn encode_request(r: &SpawnRequest) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.number(r.group.len());
        r.group.iter().for_each(|&g| w.number(g));
        w.number(r.commands.len());
        for c in &r.commands {
            w.number(c.count);
            w.bytes(c.program.as_bytes());
            w.number(c.args.len());
            c.args.iter().for_each(|a| w.bytes(a.as_bytes()));
            w.number(c.env.len());
            for (k, v) in &c.env {
                w.bytes(k.as_bytes());
                w.optional(v.as_deref().map(OsStrExt::as_bytes));
            }
            w.optional(c.dir.as_deref().map(|d| d.as_os_str().as_bytes()));
        }
        w.0
    }

    /// A SPAWN frame's request; `None` if malformed.
    pub(crate) fn decode_request(p: &[u8]) -> Option<SpawnRequest> {
        let mut r = Reader(p);
        let n = r.count(8)?;
        let group = (0..n).map(|_| r.number()).collect::<Option<Vec<_>>>()?;
        let n = r.count(40)?;
        let mut commands = Vec::with_capacity(n);
        for _ in 0..n {
            let count = r.number()?;
            let program = r.os()?;
            let n_args = r.count(8)?;
            let args = (0..n_args).map(|_| r.os()).collect::<Option<Vec<_>>>()?;
            let n_env = r.count(16)?;
            let mut env = Vec::with_capacity(n_env);
            for _ in 0..n_env {
                let k = r.os()?;
                env.push((k, r.optional_os()?));
            }
            let dir = r.optional_os()?.map(PathBuf::from);
            commands.push(SpawnCommand {
                program,
                args,
                env,
                dir,
                count,
            });
        }
        r.0.is_empty().then_some(SpawnRequest { group, commands })
    }

    /// The payload of a SPAWNED frame.
    pub(crate) fn encode_connection(c: &ConnectionJob) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.bytes(c.job.as_bytes());
        w.bytes(c.socket.as_os_str().as_bytes());
        w.number(c.parents);
        w.number(c.children);
        w.0
    }

    /// A SPAWNED frame's connection job; `None` if malformed.
    pub(crate) fn decode_connection(p: &[u8]) -> Option<ConnectionJob> {
        let mut r = Reader(p);
        let job = String::from_utf8(r.bytes()?).ok()?;
        let socket = PathBuf::from(r.os()?);
        let (parents, children) = (r.number()?, r.number()?);
        r.0.is_empty().then_some(ConnectionJob {
            job,
            socket,
            parents,
            children,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> SpawnRequest {
        SpawnRequest {
            group: vec![2, 0, 1],
            commands: vec![
                SpawnCommand {
                    program: "/bin/prog".into(),
                    args: vec!["a".into(), OsString::from_vec(vec![0xff, b'x'])],
                    env: vec![("K".into(), Some("v".into())), ("GONE".into(), None)],
                    dir: Some("/tmp".into()),
                    count: 2,
                },
                SpawnCommand {
                    program: "other".into(),
                    args: vec![],
                    env: vec![],
                    dir: None,
                    count: 1,
                },
            ],
        }
    }

    #[test]
    fn requests_and_connections_round_trip_and_truncations_are_refused() {
        let r = request();
        let bytes = wire::encode_request(&r);
        assert_eq!(wire::decode_request(&bytes), Some(r));
        for cut in 0..bytes.len() {
            assert_eq!(wire::decode_request(&bytes[..cut]), None, "cut at {cut}");
        }
        let c = ConnectionJob {
            job: "abc123".into(),
            socket: "/tmp/pagewire-abc123.sock".into(),
            parents: 3,
            children: 4,
        };
        let bytes = wire::encode_connection(&c);
        assert_eq!(wire::decode_connection(&bytes), Some(c.clone()));
        assert_eq!(wire::decode_connection(&bytes[..bytes.len() - 1]), None);
        assert_eq!(c.size(), 7);
    }

    #[test]
    fn a_huge_claimed_count_is_refused_without_allocating_it() {
        let mut bytes = (u64::MAX / 2).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        assert_eq!(wire::decode_request(&bytes), None);
    }
}
