//! `pwrun --agent`: one host's part of a `pwrun --hosts` job, started by the frontend
//! through `PAGEWIRE_RSH`, as MPICH's hydra starts a proxy per host.
//!
//! The agent reads START on its stdin, starts this host's ranks as the local launcher does
//! (the same [`Job`]: a bootstrap socket, credential checks, binding, parent-death
//! signals), and relays: its ranks' contributions and departures go up to the frontend,
//! which completes the job's collectives and sends the answers back (`relay.rs`); each
//! rank's stdout goes up in OUTPUT frames (stderr goes straight to the agent's, which the
//! channel carries), and INPUT frames feed rank 0's stdin. It reports every rank's exit.
//!
//! It stops when the frontend says STOP (SIGTERM to ranks still running, SIGKILL after 2
//! s, then this host's `/dev/shm/pagewire-<job>-*` removed and BYE), and in the same way,
//! without BYE, when the channel ends (the frontend or the connection died) or the agent
//! receives SIGINT, SIGTERM or SIGHUP. Its ranks die with it if it is killed
//! (`PR_SET_PDEATHSIG`); the frontend then cleans this host ([`super::clean_host`]).

use std::io::{self, Read, Write};
use std::process::{ChildStdin, ChildStdout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::super::launcher::rounds::Answer;
use super::super::launcher::{
    describe, report_line, Job, LaunchConfig, Placement, Relay, Server, POLL_INTERVAL,
};
use super::super::pwrun_client::wire;
use super::super::sys;
use super::relay::{self, Start};

/// Bytes of a rank's stdout per OUTPUT frame, at most.
const OUTPUT_CHUNK: usize = 64 << 10;
/// How long the agent waits, at the end, for its ranks' stdout to drain.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);

/// The channel to the frontend (this process's stdout): whole frames, one writer at a time.
struct Upstream {
    out: Mutex<io::Stdout>,
    /// A write failed: the frontend is gone.
    broken: AtomicBool,
}

impl Upstream {
    fn frame(&self, tag: u8, payload: &[u8]) {
        let mut out = self.out.lock();
        let sent = wire::write_frame(&mut *out, tag, payload).and_then(|()| out.flush());
        if sent.is_err() {
            self.broken.store(true, SeqCst);
        }
    }
}

impl Relay for Upstream {
    fn joined(&self, rank: usize, data: &[u8]) {
        self.frame(relay::GATHER, &relay::encode_gather(rank, data));
    }

    fn left(&self, rank: usize) {
        self.frame(relay::LEFT, &relay::encode_u64(rank as u64));
    }
}

/// What the frontend said, as the reader thread saw it.
#[derive(Default)]
struct Told {
    stop: AtomicBool,
    /// The channel ended or carried garbage: the frontend is gone.
    lost: AtomicBool,
}

/// Runs the agent on this process's stdin and stdout; returns its exit status (0 after a
/// STOP, 1 when the frontend went away or the ranks could not be started).
pub fn run_agent() -> i32 {
    let up = Arc::new(Upstream {
        out: Mutex::new(io::stdout()),
        broken: AtomicBool::new(false),
    });
    {
        let mut out = up.out.lock();
        if out
            .write_all(relay::AGENT_MARK)
            .and_then(|()| out.flush())
            .is_err()
        {
            return 1;
        }
    }
    let fail = |text: String| {
        report_line(&format!("pwrun agent: {text}"));
        up.frame(relay::FAILED, text.as_bytes());
        1
    };
    let mut input = io::stdin().lock();
    let start = match wire::read_frame(&mut input) {
        Ok(Some((relay::START, p))) => match Start::decode(&p) {
            Ok(s) => s,
            Err(why) => return fail(format!("the frontend sent {why}")),
        },
        Ok(Some((tag, _))) => return fail(format!("expected START, got frame {tag:#04x}")),
        Ok(None) => return 1,
        Err(e) => return fail(format!("reading START: {e}")),
    };
    drop(input);
    let signals = match sys::SignalGuard::install() {
        Ok(s) => s,
        Err(e) => return fail(format!("sigaction(SIGINT/SIGTERM/SIGHUP) failed: {e}")),
    };
    if let Err(e) = std::env::set_current_dir(&start.cwd) {
        return fail(format!(
            "cannot enter the working directory {} on this host: {e} (pwrun --hosts runs \
             every rank in the frontend's directory: the hosts must share it)",
            start.cwd.display()
        ));
    }
    let ranks: Vec<usize> = start.ranks.iter().map(|&r| r as usize).collect();
    let cfg = LaunchConfig {
        ranks: ranks.len(),
        program: start.program.clone(),
        args: start.args.clone(),
        timeout: None,
        env: start.env.clone(),
        bind: start.bind,
    };
    let placement = Placement {
        socket_path: std::env::temp_dir()
            .join(format!("pagewire-{}-h{}.sock", start.job, start.host)),
        job_id: start.job.clone(),
        size: start.size as usize,
        ranks: ranks.clone(),
        relay: Some(up.clone() as Arc<dyn Relay>),
        piped: true,
        clear_env: true,
    };
    let mut job = match Job::start(&cfg, placement) {
        Ok(j) => j,
        Err(e) => return fail(e.to_string()),
    };
    let pids: Vec<u32> = job.children.iter().flatten().map(|c| c.id()).collect();
    up.frame(relay::STARTED, &relay::encode_started(&pids));

    // Each rank's stdout, up; rank 0's stdin, down.
    let draining = Arc::new(AtomicUsize::new(0));
    let mut rank0_stdin = None;
    for child in job.children.iter_mut().flatten() {
        if let Some(out) = child.stdout.take() {
            draining.fetch_add(1, SeqCst);
            let (up, draining) = (up.clone(), draining.clone());
            std::thread::spawn(move || forward_output(out, &up, &draining));
        }
        if let Some(inp) = child.stdin.take() {
            rank0_stdin = Some(inp);
        }
    }
    let (input_tx, input_rx) = mpsc::channel::<Vec<u8>>();
    if let Some(inp) = rank0_stdin {
        std::thread::spawn(move || feed_input(inp, &input_rx));
    }
    let told = Arc::new(Told::default());
    {
        let (server, told) = (job.server.clone(), told.clone());
        std::thread::spawn(move || {
            let why = read_frontend(&server, &told, &input_tx);
            if let Some(why) = why {
                report_line(&format!("pwrun agent: {why}"));
            }
        });
    }

    let mut reported = vec![false; ranks.len()];
    while !told.stop.load(SeqCst) && !told.lost.load(SeqCst) && !up.broken.load(SeqCst) {
        if signals.pending().is_some() {
            break;
        }
        if let Err(e) = job.serve_for(POLL_INTERVAL) {
            report_line(&format!("pwrun agent: {e}"));
            break;
        }
        for (local, &rank) in ranks.iter().enumerate() {
            match job.try_reap(local) {
                Ok(Some(status)) if !reported[local] => {
                    reported[local] = true;
                    let (code, how) = describe(status);
                    up.frame(relay::EXITED, &relay::encode_exited(rank, code, &how));
                }
                Ok(_) => {}
                Err(e) => report_line(&format!("pwrun agent: {e}")),
            }
        }
    }
    let removed = job.finish(true);
    drop(job);
    let deadline = Instant::now() + OUTPUT_DRAIN;
    while draining.load(SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if told.stop.load(SeqCst) {
        up.frame(relay::BYE, &relay::encode_u64(removed as u64));
        0
    } else {
        1
    }
}

/// Sends a rank's stdout up in OUTPUT frames until it closes.
fn forward_output(mut out: ChildStdout, up: &Upstream, draining: &AtomicUsize) {
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    loop {
        match out.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => up.frame(relay::OUTPUT, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    draining.fetch_sub(1, SeqCst);
}

/// Writes INPUT frames' bytes into rank 0's stdin; an empty one (or the frontend's end)
/// closes it.
fn feed_input(mut inp: ChildStdin, rx: &mpsc::Receiver<Vec<u8>>) {
    while let Ok(bytes) = rx.recv() {
        if bytes.is_empty() || inp.write_all(&bytes).is_err() {
            break;
        }
    }
}

/// Reads the frontend's frames until STOP or the channel's end; the reason, if the
/// channel failed.
fn read_frontend(server: &Server, told: &Told, input: &mpsc::Sender<Vec<u8>>) -> Option<String> {
    let mut stdin = io::stdin().lock();
    let why = loop {
        let (tag, payload) = match wire::read_frame(&mut stdin) {
            Ok(Some(f)) => f,
            Ok(None) => break None,
            Err(e) => break Some(format!("the channel to the frontend failed: {e}")),
        };
        match tag {
            relay::RESULT => server.answer(Answer::Complete(payload)),
            relay::ERROR => match relay::decode_error(&payload) {
                Ok((ranks, text)) => server.answer(Answer::Fail { ranks, text }),
                Err(why) => break Some(format!("the frontend sent {why}")),
            },
            relay::INPUT => {
                let _ = input.send(payload);
            }
            relay::STOP => {
                told.stop.store(true, SeqCst);
                return None;
            }
            tag => break Some(format!("the frontend sent an unknown frame {tag:#04x}")),
        }
    };
    told.lost.store(true, SeqCst);
    why
}
