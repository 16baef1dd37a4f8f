//! The frontend's end of the channel to each host's agent: the remote shell the agent runs
//! in, the frames sent down it, the thread that reads the agent's frames (after any login
//! noise) and the one that forwards this process's stdin to rank 0's agent.

use std::io::{self, Read, Write};
use std::process::{Child, ChildStdin};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

use super::super::pwrun_client::wire;
use super::relay;

/// A host's agent as the frontend holds it.
pub(super) struct Agent {
    pub(super) host: String,
    pub(super) child: Child,
    pub(super) to: Arc<Mutex<Option<ChildStdin>>>,
    /// Its channel has ended.
    pub(super) gone: bool,
    /// It said BYE (or failed to start its ranks, and said so).
    pub(super) finished: bool,
    pub(super) stop_sent: bool,
}

impl Agent {
    pub(super) fn send(&self, tag: u8, payload: &[u8]) {
        let mut to = self.to.lock();
        if let Some(w) = to.as_mut() {
            if wire::write_frame(w, tag, payload)
                .and_then(|()| w.flush())
                .is_err()
            {
                *to = None;
            }
        }
    }

    pub(super) fn stop(&mut self) {
        if !self.stop_sent && !self.gone {
            self.stop_sent = true;
            self.send(relay::STOP, &[]);
        }
    }
}

/// What an agent's reader thread saw.
pub(super) enum Event {
    Frame(u8, Vec<u8>),
    /// The channel ended (cleanly or not).
    End(Option<String>),
}

/// Reads agent `i`'s frames into the frontend's queue until its channel ends.
pub(super) fn read_agent(
    i: usize,
    mut out: std::process::ChildStdout,
    tx: &mpsc::Sender<(usize, Event)>,
) {
    if let Err(why) = skip_to_mark(&mut out) {
        let _ = tx.send((i, Event::End(why)));
        return;
    }
    let why = loop {
        match wire::read_frame(&mut out) {
            Ok(Some((tag, payload))) => {
                if tx.send((i, Event::Frame(tag, payload))).is_err() {
                    return;
                }
            }
            Ok(None) => break None,
            Err(e) => break Some(format!("its channel failed: {e}")),
        }
    };
    let _ = tx.send((i, Event::End(why)));
}

/// Reads an agent's stdout up to [`relay::AGENT_MARK`], passing what came before it (a
/// remote login script's output) to this process's stderr; the reason if the mark never
/// comes.
fn skip_to_mark(out: &mut impl Read) -> std::result::Result<(), Option<String>> {
    let mark = relay::AGENT_MARK;
    let mut seen: Vec<u8> = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(mark) {
        match out.read(&mut byte) {
            Ok(0) => {
                let _ = io::stderr().write_all(&seen);
                return Err(None);
            }
            Ok(_) => seen.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Some(format!("its channel failed: {e}"))),
        }
        if seen.len() > relay::MAX_NOISE {
            return Err(Some(format!(
                "it printed {} bytes without starting the protocol (a remote login script \
                 writing to stdout?)",
                seen.len()
            )));
        }
    }
    let noise = &seen[..seen.len() - mark.len()];
    if !noise.is_empty() {
        let _ = io::stderr().write_all(noise);
    }
    Ok(())
}

/// Sends this process's stdin to rank 0's agent in INPUT frames, and its end as an empty
/// one.
pub(super) fn forward_input(to: &Mutex<Option<ChildStdin>>) {
    let mut stdin = io::stdin();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        let mut to = to.lock();
        let Some(w) = to.as_mut() else { return };
        if wire::write_frame(w, relay::INPUT, &buf[..n])
            .and_then(|()| w.flush())
            .is_err()
            || n == 0
        {
            return;
        }
    }
}
