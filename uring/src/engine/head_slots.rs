//! What the kernel may still read on one send lane when its pieces go by
//! SEND_ZC, as rules with no I/O (issue 33, part 3).
//!
//! A zero-copy send's completion says the kernel has the bytes; it may read
//! them (the piece's header and the caller's payload) until a second
//! completion, the notification, which for TCP comes once the peer has
//! acknowledged them. So a piece's header stays in its slot until every
//! notification of its sends has come, and a laned frame whose pieces are
//! all out keeps its caller (the payload's owner) waiting, on the side,
//! until no lane holds a notification of it: the next frame goes on
//! meanwhile, and no notification is waited for before the next send.

/// Header slots per send lane. A lane with none free takes no piece until
/// a notification frees one (the driver's turn that reaps it places again).
pub(crate) const HEAD_SLOTS: usize = 8;

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// The laned frame whose piece the slot holds.
    frame: u32,
    /// The piece is not wholly sent yet.
    sending: bool,
    /// Its SEND_ZC sends whose notification has yet to come.
    notifications: u32,
    /// Notifications that came before their send's own completion (an
    /// engine thread passes completions on in order, but one whose
    /// delivery failed is retried, and its notification may overtake it).
    early: u32,
}

impl Slot {
    fn is_free(&self) -> bool {
        !self.sending && self.notifications == 0
    }
}

/// One send lane's header slots and the notifications owed on each.
#[derive(Debug, Default)]
pub(crate) struct HeadSlots {
    slots: [Slot; HEAD_SLOTS],
}

impl HeadSlots {
    /// A free slot for a piece of `frame`, now taken; `None` if every slot's
    /// piece is still being sent or still owed a notification.
    pub(crate) fn take(&mut self, frame: u32) -> Option<usize> {
        let i = self.slots.iter().position(Slot::is_free)?;
        self.slots[i] = Slot {
            frame,
            sending: true,
            ..Slot::default()
        };
        Some(i)
    }

    /// A SEND_ZC of slot `i`'s piece completed and its notification is to
    /// come (its completion was flagged "more"): true if it is now owed,
    /// false if it came already.
    pub(crate) fn expect_notification(&mut self, i: usize) -> bool {
        let slot = &mut self.slots[i];
        if slot.early > 0 {
            slot.early -= 1;
            return false;
        }
        slot.notifications += 1;
        true
    }

    /// A notification for slot `i` came: the frame it was of. One not
    /// expected yet is kept for its send's completion.
    pub(crate) fn notified(&mut self, i: usize) -> u32 {
        let slot = &mut self.slots[i];
        match slot.notifications {
            0 => slot.early += 1,
            _ => slot.notifications -= 1,
        }
        slot.frame
    }

    /// Slot `i`'s piece is wholly sent; its notifications may still come.
    pub(crate) fn piece_sent(&mut self, i: usize) {
        self.slots[i].sending = false;
    }

    /// Whether the kernel may still read bytes of laned frame `frame` sent
    /// on this lane.
    pub(crate) fn holds(&self, frame: u32) -> bool {
        self.slots
            .iter()
            .any(|s| s.frame == frame && s.notifications > 0)
    }

    /// Whether a notification is owed for slot `i`.
    pub(crate) fn owes(&self, i: usize) -> bool {
        self.slots[i].notifications > 0
    }

    /// Whether any notification is owed on this lane.
    pub(crate) fn owed(&self) -> bool {
        self.slots.iter().any(|s| s.notifications > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_before_its_sends_completion_is_not_owed_again() {
        let mut slots = HeadSlots::default();
        let a = slots.take(5).unwrap();
        assert_eq!(slots.notified(a), 5);
        assert!(!slots.expect_notification(a), "it came already");
        slots.piece_sent(a);
        assert!(!slots.holds(5) && !slots.owed());
        assert_eq!(slots.take(6), Some(a));
        // In order, it is owed until it comes.
        assert!(slots.expect_notification(a));
        slots.piece_sent(a);
        assert!(slots.holds(6));
        slots.notified(a);
        assert!(!slots.holds(6));
    }

    #[test]
    fn a_plain_piece_frees_its_slot_once_sent() {
        let mut slots = HeadSlots::default();
        let a = slots.take(7).unwrap();
        let b = slots.take(7).unwrap();
        assert_ne!(a, b, "a slot in use is not handed out again");
        slots.piece_sent(a);
        assert!(!slots.holds(7), "no notification owed for a plain send");
        assert_eq!(slots.take(8), Some(a), "a sent plain piece's slot is free");
    }

    #[test]
    fn a_zero_copy_piece_keeps_its_slot_and_its_frame_until_every_notification() {
        let mut slots = HeadSlots::default();
        let a = slots.take(3).unwrap();
        // Sent in two SEND_ZCs (a short write), each owing a notification.
        slots.expect_notification(a);
        slots.expect_notification(a);
        slots.piece_sent(a);
        assert!(slots.holds(3) && slots.owed());
        assert!(!slots.holds(4));
        assert_eq!(slots.notified(a), 3);
        assert!(slots.holds(3), "one notification still owed");
        let others: Vec<_> = (0..HEAD_SLOTS - 1).map(|_| slots.take(4)).collect();
        assert!(others.iter().all(Option::is_some));
        assert_eq!(slots.take(4), None, "every slot busy or owed");
        assert_eq!(slots.notified(a), 3);
        assert!(!slots.holds(3));
        assert_eq!(slots.take(5), Some(a));
    }

    #[test]
    fn a_notification_before_the_piece_is_sent_leaves_the_slot_taken() {
        let mut slots = HeadSlots::default();
        let a = slots.take(1).unwrap();
        slots.expect_notification(a);
        slots.notified(a);
        assert!(!slots.holds(1));
        assert_ne!(slots.take(2), Some(a), "its piece has bytes left to send");
        slots.piece_sent(a);
        assert_eq!(slots.take(2), Some(a));
    }

    #[test]
    fn an_unexpected_notification_does_not_underflow() {
        let mut slots = HeadSlots::default();
        let a = slots.take(1).unwrap();
        slots.notified(a);
        slots.piece_sent(a);
        assert!(!slots.owed());
        assert_eq!(slots.take(2), Some(a));
    }
}
