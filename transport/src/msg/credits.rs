//! The eager protocol's flow control with one peer, as a type of its own.
//!
//! Each rank posts `given` receive slots for a peer's data messages (eager payloads and
//! RTS) and gives it that many credits: a data message spends one. The receiver owes a
//! credit back for each slot it reposts and returns them on any message it sends to that
//! peer, or in a message of their own once half are owed. An unexpected eager message is
//! copied out of its slot while the peer's unexpected bytes stay within the budget; past it
//! the slot is held and its credit withheld, so a flood of unexpected messages stops the
//! sender instead of growing memory. Control messages use slots of their own and no credit.
//! (The local path's rings are their own flow control and use none of this.)

/// The credits between this rank and one peer, both ways, and the peer's unexpected bytes.
#[derive(Debug)]
pub(crate) struct Credits {
    /// The credits each side gives the other: the data slots it posts for it.
    given: u32,
    /// Data messages this rank may still send to the peer.
    available: u32,
    /// Credits this rank owes the peer (data slots reposted since it last said so).
    owed: u32,
    /// Bytes of the peer's unexpected eager data copied out of their slots.
    unexpected_bytes: usize,
}

impl Credits {
    /// Flow control with a peer that was given `given` credits and gave as many.
    pub(crate) fn new(given: u32) -> Credits {
        Credits {
            given,
            available: given,
            owed: 0,
            unexpected_bytes: 0,
        }
    }

    /// Whether a data message may go to the peer now.
    #[inline]
    pub(crate) fn can_send(&self) -> bool {
        self.available > 0
    }

    /// A data message went to the peer.
    #[inline]
    pub(crate) fn spend(&mut self) {
        debug_assert!(self.available > 0, "a data message sent without a credit");
        self.available -= 1;
    }

    /// The peer returned `n` credits (on any message). More than it was ever given is
    /// something no correct peer does: `Err(why)`, and nothing changes.
    #[inline]
    pub(crate) fn returned(&mut self, n: u16) -> Result<(), &'static str> {
        match self.available.checked_add(u32::from(n)) {
            Some(c) if c <= self.given => {
                self.available = c;
                Ok(())
            }
            _ => Err("more credits returned than were given"),
        }
    }

    /// A data slot of the peer's went back to the NIC: one more credit owed. True when half
    /// are owed, so they go back even with nothing else to carry them.
    #[inline]
    pub(crate) fn slot_reposted(&mut self) -> bool {
        self.owed += 1;
        self.owes_half()
    }

    /// Whether half the credits are owed: enough to send them in a message of their own.
    #[inline]
    pub(crate) fn owes_half(&self) -> bool {
        self.owed >= self.given / 2
    }

    /// The credits the next message to the peer carries back.
    #[inline]
    pub(crate) fn to_carry(&self) -> u16 {
        self.owed.min(u32::from(u16::MAX)) as u16
    }

    /// A message carrying `n` credits (what [`Self::to_carry`] said) left.
    #[inline]
    pub(crate) fn carried(&mut self, n: u16) {
        self.owed -= u32::from(n);
    }

    /// Whether an unexpected eager message of `size` bytes may be copied out of its slot
    /// (`budget`: the bytes of unexpected data a peer may have copied out at once).
    #[inline]
    pub(crate) fn unexpected_fits(&self, size: usize, budget: usize) -> bool {
        self.unexpected_bytes + size <= budget
    }

    /// `size` bytes of unexpected data were copied out of their slot (or cell).
    #[inline]
    pub(crate) fn copied_out(&mut self, size: usize) {
        self.unexpected_bytes += size;
    }

    /// A receive took `size` bytes copied out before.
    #[inline]
    pub(crate) fn delivered(&mut self, size: usize) {
        self.unexpected_bytes -= size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_stops_when_its_credits_are_spent_and_goes_on_when_they_return() {
        let mut c = Credits::new(4);
        for _ in 0..4 {
            assert!(c.can_send());
            c.spend();
        }
        assert!(!c.can_send(), "the peer's four slots are taken");
        c.returned(1).unwrap();
        assert!(c.can_send());
        c.returned(3).unwrap();
        assert_eq!(c.available, 4);
    }

    #[test]
    fn a_peer_returning_more_than_it_was_given_breaks_the_protocol() {
        let mut c = Credits::new(4);
        c.spend();
        assert_eq!(c.returned(2), Err("more credits returned than were given"));
        assert_eq!(c.available, 3, "nothing changed");
        assert!(c.returned(u16::MAX).is_err());
        c.returned(1).unwrap();
        assert!(c.returned(0).is_ok());
    }

    #[test]
    fn owed_credits_ride_on_messages_and_go_alone_at_half() {
        let mut c = Credits::new(8);
        assert_eq!(c.to_carry(), 0);
        assert!(!c.slot_reposted());
        assert!(!c.slot_reposted());
        assert!(!c.slot_reposted());
        assert!(c.slot_reposted(), "4 of 8 owed: time to send them");
        // A message carries them back.
        let n = c.to_carry();
        assert_eq!(n, 4);
        c.carried(n);
        assert!(!c.owes_half());
        assert_eq!(c.to_carry(), 0);
    }

    #[test]
    fn at_most_a_header_field_of_credits_rides_at_once() {
        let mut c = Credits::new(u32::MAX);
        c.owed = 70_000;
        assert_eq!(c.to_carry(), u16::MAX);
        c.carried(c.to_carry());
        assert_eq!(u32::from(c.to_carry()), 70_000 - 65_535);
    }

    #[test]
    fn unexpected_data_is_copied_out_within_the_budget_only() {
        let mut c = Credits::new(16);
        assert!(c.unexpected_fits(1000, 1500));
        c.copied_out(1000);
        assert!(c.unexpected_fits(500, 1500));
        assert!(
            !c.unexpected_fits(501, 1500),
            "past the budget: the slot is held"
        );
        c.delivered(1000);
        assert!(c.unexpected_fits(1500, 1500));
    }
}
