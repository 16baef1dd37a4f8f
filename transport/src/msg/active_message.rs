//! Contexts whose messages this rank's progress engine answers itself: active messages, as
//! MPICH's CH4 and UCX's `ucp_am` carry what the NIC cannot do at the target (a window's
//! accumulates of any type and operation, applied by the target, one round trip).
//!
//! A rank hands a context and a handler to [`PointToPoint::handle_context`]. From then on an
//! eager message that arrives in that context does not enter matching: the next progress
//! pass gives its payload to the handler, whose reply goes back to the sender with the same
//! tag in the handler's reply context, where the sender receives it as any message. A
//! handler may answer [`Handled::Later`] (the memory it works on is busy); the message is
//! handed to it again on later passes, in arrival order. Messages of a context are handled
//! in the order they arrived, so one sender's requests are applied in its order.
//!
//! The handler runs only inside this rank's own calls (progress); a rank that computes
//! without calling pagewire answers nothing meanwhile, as in MPICH without its progress
//! thread. Senders keep such messages within the eager limit: a larger one would wait in
//! the handled context's matching for ever.

use std::collections::{HashMap, VecDeque};

use super::matching::Envelope;
use super::{PointToPoint, RequestId};
use crate::error::{Error, Result};

/// What a handler did with a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// Done: this payload goes back to the sender.
    Reply(Vec<u8>),
    /// Not now: hand the message over again on a later progress pass.
    Later,
}

/// Answers the messages of a context ([`PointToPoint::handle_context`]).
pub trait ActiveMessageHandler: Send {
    /// The message `payload` from rank `source` with `tag`.
    fn handle(&mut self, source: usize, tag: i32, payload: &[u8]) -> Handled;
}

/// A message waiting for its handler.
struct Arrived {
    context: u32,
    source: usize,
    tag: i32,
    payload: Vec<u8>,
}

/// The handled contexts of one rank and their messages in flight.
#[derive(Default)]
pub(crate) struct ActiveMessages {
    /// By context: the reply context and the handler.
    handlers: HashMap<u32, (u32, Box<dyn ActiveMessageHandler>)>,
    /// Messages not yet handled, oldest first.
    arrived: VecDeque<Arrived>,
    /// Replies sent and not yet complete, with their bytes (`raw.rs`'s `send_owned`).
    pub(crate) sending: Vec<(RequestId, Vec<u8>)>,
}

impl ActiveMessages {
    /// Whether messages of `context` go to a handler.
    pub(crate) fn handles(&self, context: u32) -> bool {
        !self.handlers.is_empty() && self.handlers.contains_key(&context)
    }

    /// Whether a progress pass has anything to do here.
    pub(crate) fn busy(&self) -> bool {
        !self.arrived.is_empty() || !self.sending.is_empty()
    }
}

impl PointToPoint {
    /// Answers every later eager message in `context` with `handler`, the replies going back
    /// in `reply_context` (see the module documentation). Fails if `context` is handled
    /// already.
    pub fn handle_context(
        &mut self,
        context: u32,
        reply_context: u32,
        handler: Box<dyn ActiveMessageHandler>,
    ) -> Result<()> {
        if self.active_messages.handles(context) {
            return Err(Error::invalid_argument(format!(
                "context {context:#x} already has a handler"
            )));
        }
        self.active_messages
            .handlers
            .insert(context, (reply_context, handler));
        Ok(())
    }

    /// Stops answering `context`; its messages not yet handled are dropped. Returns the
    /// handler.
    pub fn stop_handling(&mut self, context: u32) -> Option<Box<dyn ActiveMessageHandler>> {
        let am = &mut self.active_messages;
        am.arrived.retain(|m| m.context != context);
        am.handlers.remove(&context).map(|(_, h)| h)
    }

    /// An eager message of a handled context arrived: it waits for the next pass.
    pub(crate) fn active_message_arrived(&mut self, env: Envelope, payload: Vec<u8>) {
        self.active_messages.arrived.push_back(Arrived {
            context: env.context,
            source: env.source,
            tag: env.tag,
            payload,
        });
    }

    /// Hands waiting messages to their handlers (each context's in order, stopping at the
    /// first one put off), sends the replies and reaps the replies sent. Returns the
    /// messages handled and replies reaped.
    pub(crate) fn advance_active_messages(&mut self) -> usize {
        let mut events = 0;
        let mut put_off: Vec<u32> = Vec::new();
        let mut waiting = std::mem::take(&mut self.active_messages.arrived);
        let mut replies = Vec::new();
        for m in waiting.drain(..) {
            let handler = self.active_messages.handlers.get_mut(&m.context);
            let Some((reply_context, handler)) = handler else {
                continue;
            };
            if put_off.contains(&m.context) {
                self.active_messages.arrived.push_back(m);
                continue;
            }
            match handler.handle(m.source, m.tag, &m.payload) {
                Handled::Reply(bytes) => {
                    events += 1;
                    replies.push((m.source, m.tag, *reply_context, bytes));
                }
                Handled::Later => {
                    put_off.push(m.context);
                    self.active_messages.arrived.push_back(m);
                }
            }
        }
        for (dest, tag, context, bytes) in replies {
            // A sender that is gone gets no reply; nothing else waits for it.
            let _ = self.send_owned(dest, tag, context, bytes);
        }
        events + self.reap_owned_sends()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unhandled_context_is_not_handled() {
        let am = ActiveMessages::default();
        assert!(!am.handles(3));
        assert!(!am.busy());
    }
}
