//! The frontend's view of a running `pwrun --hosts` job: the frames its agents send and
//! what it does with them (pids, collectives completed through the shared rounds, exits,
//! output), why the job ends, and the end itself: remote shells reaped, hosts of lost agents
//! cleaned, the outcome for pwrun.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::super::launcher::rounds::{Answer, Rounds};
use super::super::launcher::{describe, report_line, signal_name, JobOutcome};
use super::channel::Agent;
use super::relay;
use super::shell_quote;
use pagewire_sys::{Error, Result};

/// How long the clean-up of a host whose agent died may take.
const CLEAN_PATIENCE: Duration = Duration::from_secs(5);
/// The exit status of a job whose agent was lost (ssh's for a lost connection).
const EXIT_AGENT_LOST: i32 = 255;

/// Why the job is ending.
pub(super) enum End {
    Success,
    RankFailed { rank: usize, exit_code: i32 },
    AgentLost,
    StartFailed(String),
    TimedOut(Duration),
    Interrupted(i32),
}

/// The frontend's view of a running job.
pub(super) struct Frontend {
    pub(super) agents: Vec<Agent>,
    /// The host (agent index) of each rank.
    pub(super) host_of: Vec<usize>,
    /// The ranks of each agent, in its order.
    pub(super) ranks_of: Vec<Vec<usize>>,
    pub(super) rounds: Rounds,
    pub(super) pids: Vec<u32>,
    pub(super) exited: Vec<bool>,
    pub(super) end: Option<End>,
    /// Agents whose channel ended without BYE: their hosts are cleaned at the end.
    pub(super) lost: Vec<usize>,
    /// Shared-memory objects the agents removed.
    pub(super) removed: u64,
}

impl Frontend {
    /// Ends the job for `why`, unless it is ending already.
    pub(super) fn end_with(&mut self, why: End) {
        if self.end.is_none() {
            self.end = Some(why);
        }
    }

    /// Handles frame `tag` from agent `i`.
    pub(super) fn on_frame(&mut self, i: usize, tag: u8, payload: &[u8], stdout: &mut impl Write) {
        let mine = |r: usize| self.host_of.get(r) == Some(&i);
        let answer = match tag {
            relay::STARTED => match relay::decode_started(payload) {
                Ok(p) if p.len() == self.ranks_of[i].len() => {
                    for (&r, pid) in self.ranks_of[i].iter().zip(p) {
                        self.pids[r] = pid;
                    }
                    Answer::Wait
                }
                _ => self.protocol_failure(i, "a malformed STARTED"),
            },
            relay::GATHER => match relay::decode_gather(payload) {
                Ok((r, data)) if mine(r) => self.collective(r, Some(data)),
                _ => self.protocol_failure(i, "a malformed GATHER"),
            },
            relay::LEFT => match relay::decode_u64(payload) {
                Ok(r) if mine(r as usize) => self.collective(r as usize, None),
                _ => self.protocol_failure(i, "a malformed LEFT"),
            },
            relay::EXITED => match relay::decode_exited(payload) {
                Ok((r, code, how)) if mine(r) => {
                    self.exited[r] = true;
                    if code != 0 && self.end.is_none() {
                        report_line(&format!(
                            "pwrun: rank {r} (pid {} on {}) {how}",
                            self.pids[r], self.agents[i].host
                        ));
                        self.end_with(End::RankFailed {
                            rank: r,
                            exit_code: code,
                        });
                    }
                    if self.exited.iter().all(|&e| e) {
                        self.end_with(End::Success);
                    }
                    Answer::Wait
                }
                _ => self.protocol_failure(i, "a malformed EXITED"),
            },
            relay::OUTPUT => {
                let _ = stdout.write_all(payload).and_then(|()| stdout.flush());
                Answer::Wait
            }
            relay::BYE => {
                self.agents[i].finished = true;
                self.removed += relay::decode_u64(payload).unwrap_or(0);
                Answer::Wait
            }
            relay::FAILED => {
                self.agents[i].finished = true;
                let text = String::from_utf8_lossy(payload);
                let host = &self.agents[i].host;
                self.end_with(End::StartFailed(format!("on {host}: {text}")));
                Answer::Wait
            }
            tag => self.protocol_failure(i, &format!("an unknown frame {tag:#04x}")),
        };
        self.answer(answer);
    }

    /// Agent `i`'s channel ended (`why`, if it failed).
    pub(super) fn on_end(&mut self, i: usize, why: Option<String>) {
        let agent = &mut self.agents[i];
        agent.gone = true;
        if agent.finished {
            return;
        }
        // Its host is cleaned at the end, whether or not it caused the end.
        self.lost.push(i);
        if self.end.is_none() {
            let status = wait_briefly(&mut agent.child);
            report_line(&format!(
                "pwrun: the agent on {} ended before the job did ({status}{})",
                agent.host,
                why.map(|w| format!("; {w}")).unwrap_or_default()
            ));
            self.end_with(End::AgentLost);
        }
    }

    /// Rank `r` joins the bootstrap's collective with `data`, or (`None`) has left.
    fn collective(&mut self, r: usize, data: Option<Vec<u8>>) -> Answer {
        let Frontend {
            rounds,
            pids,
            agents,
            host_of,
            ..
        } = self;
        let who = |r: usize| format!("pid {} on {}", pids[r], agents[host_of[r]].host);
        match data {
            Some(data) => rounds.join(r, data, who),
            None => rounds.leave(r, who),
        }
    }

    /// An agent broke the protocol: the job ends, naming it.
    fn protocol_failure(&mut self, i: usize, what: &str) -> Answer {
        let host = self.agents[i].host.clone();
        self.end_with(End::StartFailed(format!("the agent on {host} sent {what}")));
        Answer::Wait
    }

    /// Sends a collective's answer to the agents of the ranks it is for, once per agent.
    fn answer(&self, answer: Answer) {
        match answer {
            Answer::Wait => {}
            Answer::Complete(payload) => {
                for a in &self.agents {
                    a.send(relay::RESULT, &payload);
                }
            }
            Answer::Fail { ranks, text } => {
                for (i, a) in self.agents.iter().enumerate() {
                    let mine: Vec<usize> = ranks
                        .iter()
                        .copied()
                        .filter(|&r| self.host_of[r] == i)
                        .collect();
                    if !mine.is_empty() {
                        a.send(relay::ERROR, &relay::encode_error(&mine, &text));
                    }
                }
            }
        }
    }

    /// The remote shells of agents that did not finish in time are killed (an agent whose
    /// channel ends stops its ranks), every remote shell is reaped, and the hosts of lost
    /// agents are cleaned.
    pub(super) fn finish(&mut self, rsh: &[OsString], pwrun: &std::path::Path, job: &str) {
        for a in &mut self.agents {
            drop(a.to.lock().take());
            let deadline = Instant::now() + Duration::from_millis(500);
            while a.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = a.child.kill();
            let _ = a.child.wait();
        }
        for &i in &self.lost {
            self.removed += clean_through(rsh, &self.agents[i].host, pwrun, job);
        }
    }

    /// How the job ended, for pwrun.
    pub(super) fn outcome(self) -> Result<JobOutcome> {
        let note = (self.removed > 0).then(|| {
            format!(
                "removed {} shared-memory objects left by the job",
                self.removed
            )
        });
        let failed = |exit_code, failed_rank| JobOutcome {
            exit_code,
            failed_rank,
            message: note.clone().map(|n| format!("pwrun: {n}")),
        };
        let with_note = |line: String| match &note {
            Some(n) => format!("{line}; {n}"),
            None => line,
        };
        Ok(match self.end.unwrap_or(End::AgentLost) {
            End::Success => JobOutcome {
                exit_code: 0,
                failed_rank: None,
                message: None,
            },
            End::RankFailed { rank, exit_code } => failed(exit_code, Some(rank)),
            End::AgentLost => failed(EXIT_AGENT_LOST, None),
            End::StartFailed(text) => return Err(Error::Launcher(text)),
            End::TimedOut(after) => JobOutcome {
                exit_code: 124,
                failed_rank: None,
                message: Some(with_note(format!(
                    "pwrun: job timed out after {} s",
                    after.as_secs_f64()
                ))),
            },
            End::Interrupted(sig) => JobOutcome {
                exit_code: 128 + sig,
                failed_rank: None,
                message: Some(with_note(format!(
                    "pwrun: received {}, job stopped",
                    signal_name(sig)
                ))),
            },
        })
    }
}

/// How a remote shell ended, waiting for it a moment.
fn wait_briefly(child: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_millis(200);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let (_, how) = describe(status);
                return format!("its remote shell {how}");
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => return "its remote shell still runs".into(),
        }
    }
}

/// Cleans `host` after its agent died, through a new remote shell (at most
/// [`CLEAN_PATIENCE`]); the shared-memory objects it removed.
fn clean_through(rsh: &[OsString], host: &str, pwrun: &std::path::Path, job: &str) -> u64 {
    let child = Command::new(&rsh[0])
        .args(&rsh[1..])
        .arg(host)
        .arg(shell_quote(pwrun.as_os_str()))
        .arg("--agent-clean")
        .arg(job)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let Ok(mut child) = child else {
        report_line(&format!(
            "pwrun: could not clean {host}: its remote shell did not start"
        ));
        return 0;
    };
    let deadline = Instant::now() + CLEAN_PATIENCE;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            report_line(&format!(
                "pwrun: cleaning {host} took over {} s; stopped",
                CLEAN_PATIENCE.as_secs()
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.wait();
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    out.trim().parse().unwrap_or(0)
}
