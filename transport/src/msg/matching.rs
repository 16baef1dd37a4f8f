//! MPI matching: posted-receive and unexpected-message queues (MPI-4.0 section 3.5, "Semantics
//! of Point-to-Point Communication").
//!
//! A message matches a receive when the contexts are equal and the source and tag are equal
//! or the receive's are wildcards. Messages from one sender are offered to the matcher in
//! the order they were sent (the wire is in order and the layer processes it in order), the
//! posted queue is searched in posting order and the unexpected queue in arrival order, so
//! MPI's non-overtaking rule holds for every (sender, receiver, context).
//!
//! A matched probe (`MPI_Mprobe`/`MPI_Improbe`) takes the first matching unexpected
//! message out of the unexpected queue and parks it under a [`MessageHandle`]: no receive
//! or probe can match it any more, and only [`Matcher::claim`] with that handle
//! (`MPI_Mrecv`) gets it.

use std::collections::VecDeque;

/// Wildcard source (`MPI_ANY_SOURCE`).
pub const ANY_SOURCE: Option<usize> = None;
/// Wildcard tag (`MPI_ANY_TAG`).
pub const ANY_TAG: Option<i32> = None;

/// What a message is labelled with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Sending rank.
    pub source: usize,
    /// Tag.
    pub tag: i32,
    /// Communicator context id.
    pub context: u32,
}

/// What a receive asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selector {
    /// A rank, or `None` for any source.
    pub source: Option<usize>,
    /// A tag, or `None` for any tag.
    pub tag: Option<i32>,
    /// Communicator context id.
    pub context: u32,
}

impl Selector {
    /// Whether a message with envelope `e` matches.
    pub fn matches(&self, e: &Envelope) -> bool {
        self.context == e.context
            && self.source.is_none_or(|s| s == e.source)
            && self.tag.is_none_or(|t| t == e.tag)
    }
}

/// A message taken out of matching by a matched probe (`MPI_Message`). Handles are never
/// reused, so a handle that was claimed finds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MessageHandle(u64);

/// The two queues, and the messages matched probes parked; `R` identifies a posted
/// receive, `U` an unexpected message.
#[derive(Debug)]
pub struct Matcher<R, U> {
    posted: VecDeque<(Selector, R)>,
    unexpected: VecDeque<(Envelope, U)>,
    matched: Vec<(MessageHandle, Envelope, U)>,
    next_handle: u64,
}

impl<R, U> Default for Matcher<R, U> {
    fn default() -> Self {
        Matcher {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            matched: Vec::new(),
            next_handle: 0,
        }
    }
}

impl<R, U> Matcher<R, U> {
    /// An arriving message: the first posted receive that matches, removed; or `None`, and
    /// the message is queued as unexpected with `make_unexpected()`.
    pub fn arrive(&mut self, e: Envelope, make_unexpected: impl FnOnce() -> U) -> Option<R> {
        match self.posted.iter().position(|(s, _)| s.matches(&e)) {
            Some(i) => self.posted.remove(i).map(|(_, r)| r),
            None => {
                self.unexpected.push_back((e, make_unexpected()));
                None
            }
        }
    }

    /// The first posted receive that matches an arriving message, removed (without queueing
    /// the message if there is none; see [`Matcher::push_unexpected`]).
    pub fn take_posted(&mut self, e: &Envelope) -> Option<R> {
        let i = self.posted.iter().position(|(s, _)| s.matches(e))?;
        self.posted.remove(i).map(|(_, r)| r)
    }

    /// Queues a message no posted receive matched.
    pub fn push_unexpected(&mut self, e: Envelope, u: U) {
        self.unexpected.push_back((e, u));
    }

    /// A new receive: the first unexpected message that matches, removed; or `None`, and the
    /// receive is queued as posted.
    pub fn post(&mut self, s: Selector, r: R) -> Option<(Envelope, U)> {
        match self.unexpected.iter().position(|(e, _)| s.matches(e)) {
            Some(i) => self.unexpected.remove(i),
            None => {
                self.posted.push_back((s, r));
                None
            }
        }
    }

    /// The first unexpected message that matches, left in place (`MPI_Iprobe`).
    pub fn probe(&self, s: &Selector) -> Option<&(Envelope, U)> {
        self.unexpected.iter().find(|(e, _)| s.matches(e))
    }

    /// The first unexpected message that matches, removed (`MPI_Improbe`).
    pub fn take_matching(&mut self, s: &Selector) -> Option<(Envelope, U)> {
        let i = self.unexpected.iter().position(|(e, _)| s.matches(e))?;
        self.unexpected.remove(i)
    }

    /// The first unexpected message that matches, removed from matching and parked under a
    /// new handle (`MPI_Improbe`); its envelope and payload are returned for the status.
    pub fn take_matched(&mut self, s: &Selector) -> Option<(MessageHandle, Envelope, &U)> {
        let (e, u) = self.take_matching(s)?;
        let h = MessageHandle(self.next_handle);
        self.next_handle += 1;
        self.matched.push((h, e, u));
        let (_, e, u) = self.matched.last().expect("just pushed");
        Some((h, *e, u))
    }

    /// The message parked under `h`, removed (`MPI_Mrecv`); `None` if there is none.
    pub fn claim(&mut self, h: MessageHandle) -> Option<(Envelope, U)> {
        let i = self.matched.iter().position(|(x, _, _)| *x == h)?;
        let (_, e, u) = self.matched.swap_remove(i);
        Some((e, u))
    }

    /// Messages parked by matched probes and not yet claimed.
    pub fn matched_len(&self) -> usize {
        self.matched.len()
    }

    /// Removes a posted receive that has not matched yet (cancellation).
    pub fn cancel(&mut self, pred: impl Fn(&R) -> bool) -> Option<R> {
        let i = self.posted.iter().position(|(_, r)| pred(r))?;
        self.posted.remove(i).map(|(_, r)| r)
    }

    /// Unexpected messages queued.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }

    /// Mutable access to the unexpected queue's payloads, oldest first.
    pub fn unexpected_mut(&mut self) -> impl Iterator<Item = &mut (Envelope, U)> {
        self.unexpected.iter_mut()
    }

    /// Whether a posted receive could match a message from `source` (any context or tag).
    pub fn expects_from(&self, source: usize) -> bool {
        self.posted
            .iter()
            .any(|(s, _)| s.source.is_none_or(|r| r == source))
    }

    /// Posted receives not yet matched.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(source: usize, tag: i32) -> Envelope {
        Envelope {
            source,
            tag,
            context: 0,
        }
    }

    fn sel(source: Option<usize>, tag: Option<i32>) -> Selector {
        Selector {
            source,
            tag,
            context: 0,
        }
    }

    #[test]
    fn wildcards_and_contexts() {
        assert!(sel(ANY_SOURCE, ANY_TAG).matches(&env(3, 7)));
        assert!(sel(Some(3), ANY_TAG).matches(&env(3, 7)));
        assert!(!sel(Some(2), ANY_TAG).matches(&env(3, 7)));
        assert!(!sel(ANY_SOURCE, Some(6)).matches(&env(3, 7)));
        let other_ctx = Selector {
            context: 1,
            ..sel(ANY_SOURCE, ANY_TAG)
        };
        assert!(!other_ctx.matches(&env(3, 7)));
    }

    #[test]
    fn unexpected_messages_match_in_arrival_order() {
        let mut m: Matcher<u32, &str> = Matcher::default();
        assert_eq!(m.arrive(env(1, 5), || "first"), None);
        assert_eq!(m.arrive(env(1, 5), || "second"), None);
        assert_eq!(m.arrive(env(2, 5), || "other sender"), None);
        // Non-overtaking: the same selector gets the first, then the second.
        assert_eq!(m.post(sel(Some(1), Some(5)), 0).map(|x| x.1), Some("first"));
        assert_eq!(
            m.post(sel(ANY_SOURCE, ANY_TAG), 1).map(|x| x.1),
            Some("second")
        );
        assert_eq!(
            m.post(sel(ANY_SOURCE, Some(5)), 2).map(|x| x.1),
            Some("other sender")
        );
        assert_eq!(m.unexpected_len(), 0);
    }

    #[test]
    fn posted_receives_match_in_posting_order() {
        let mut m: Matcher<u32, ()> = Matcher::default();
        assert!(m.post(sel(ANY_SOURCE, ANY_TAG), 10).is_none());
        assert!(m.post(sel(Some(1), Some(5)), 11).is_none());
        // The wildcard was posted first, so it takes the message.
        assert_eq!(m.arrive(env(1, 5), || ()), Some(10));
        assert_eq!(m.arrive(env(1, 5), || ()), Some(11));
        assert_eq!(m.arrive(env(1, 5), || ()), None);
        assert_eq!(m.unexpected_len(), 1);
    }

    #[test]
    fn probe_leaves_and_take_removes() {
        let mut m: Matcher<u32, u8> = Matcher::default();
        m.arrive(env(4, 9), || 42);
        assert_eq!(m.probe(&sel(Some(4), ANY_TAG)).map(|x| x.1), Some(42));
        assert_eq!(m.unexpected_len(), 1);
        assert_eq!(
            m.take_matching(&sel(ANY_SOURCE, Some(9))).map(|x| x.1),
            Some(42)
        );
        assert!(m.probe(&sel(ANY_SOURCE, ANY_TAG)).is_none());
        assert!(m.post(sel(Some(1), None), 7).is_none());
        assert_eq!(m.cancel(|r| *r == 7), Some(7));
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn a_matched_message_is_out_of_matching_until_claimed() {
        let mut m: Matcher<u32, &str> = Matcher::default();
        m.arrive(env(1, 5), || "a");
        m.arrive(env(2, 5), || "b");
        m.arrive(env(1, 6), || "c");
        let (h, e, u) = m.take_matched(&sel(ANY_SOURCE, Some(5))).unwrap();
        assert_eq!((e, *u), (env(1, 5), "a"));
        // Neither a probe nor a receive sees it any more, not even an exact one.
        assert_eq!(m.probe(&sel(Some(1), Some(5))).map(|x| x.1), None);
        assert_eq!(m.post(sel(Some(1), Some(5)), 0), None);
        assert_eq!(m.posted_len(), 1);
        // A wildcard receive takes the next message instead.
        assert_eq!(m.post(sel(ANY_SOURCE, ANY_TAG), 1).map(|x| x.1), Some("b"));
        // A second matched probe gets a different message and handle.
        let (h2, e2, _) = m.take_matched(&sel(Some(1), ANY_TAG)).unwrap();
        assert_ne!(h, h2);
        assert_eq!(e2, env(1, 6));
        assert_eq!(m.matched_len(), 2);
        // An arriving message that the posted receive wants goes to it, not to a handle.
        assert_eq!(m.arrive(env(1, 5), || "d"), Some(0));
        assert_eq!(m.claim(h), Some((env(1, 5), "a")));
        assert_eq!(m.claim(h), None, "a handle is claimed once");
        assert_eq!(m.claim(h2).map(|x| x.1), Some("c"));
        assert_eq!((m.matched_len(), m.unexpected_len()), (0, 0));
        assert!(m.take_matched(&sel(ANY_SOURCE, ANY_TAG)).is_none());
    }

    #[test]
    fn matched_probes_keep_each_senders_order_and_contexts() {
        let mut m: Matcher<u32, u8> = Matcher::default();
        let other = Envelope {
            context: 7,
            ..env(3, 1)
        };
        m.arrive(other, || 0);
        for i in 1..=3 {
            m.arrive(env(3, 1), || i);
        }
        let ctx0 = sel(Some(3), Some(1));
        let got: Vec<u8> = (0..3)
            .map(|_| {
                let (h, _, _) = m.take_matched(&ctx0).unwrap();
                m.claim(h).unwrap().1
            })
            .collect();
        assert_eq!(got, [1, 2, 3]);
        assert!(m.take_matched(&ctx0).is_none());
        let ctx7 = Selector { context: 7, ..ctx0 };
        assert_eq!(m.take_matched(&ctx7).map(|x| *x.2), Some(0));
    }
}
