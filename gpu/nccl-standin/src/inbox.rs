//! Frames that have arrived from each peer and not yet been consumed. The
//! mesh's reader threads push here as data comes in, so a sender never
//! waits for its receiver; an op takes the frame it expects by sequence
//! number, and a frame with that number but another kind, type or length
//! is a mismatched collective.

use crate::wire::{KIND_P2P, KIND_SHRINK, Tag};
use std::collections::VecDeque;

/// Frames from one peer, in arrival order.
type Queue = VecDeque<(Tag, Vec<u8>)>;

/// Per peer, three queues: collectives, point-to-point, and the setup
/// frames of shrinks (which must not be taken for a hung op's data).
pub(crate) struct Inbox {
    queues: Vec<[Queue; 3]>,
}

fn class(kind: u8) -> usize {
    match kind {
        KIND_P2P => 1,
        KIND_SHRINK => 2,
        _ => 0,
    }
}

impl Inbox {
    pub(crate) fn new(nranks: usize) -> Inbox {
        Inbox {
            queues: (0..nranks).map(|_| Default::default()).collect(),
        }
    }

    /// Stores a frame from `peer`.
    pub(crate) fn push(&mut self, peer: usize, tag: Tag, payload: Vec<u8>) {
        if let Some(queues) = self.queues.get_mut(peer) {
            queues[class(tag.kind)].push_back((tag, payload));
        }
    }

    /// The frame from `peer` with `expected`'s class and sequence number:
    /// `None` if it has not arrived, `Err(actual tag)` if it differs in
    /// kind, data type or length (it is consumed either way).
    pub(crate) fn take(&mut self, peer: usize, expected: Tag) -> Option<Result<Vec<u8>, Tag>> {
        let queue = &mut self.queues.get_mut(peer)?[class(expected.kind)];
        let at = queue.iter().position(|(tag, _)| tag.seq == expected.seq)?;
        let (tag, payload) = queue.remove(at)?;
        Some(if tag == expected {
            Ok(payload)
        } else {
            Err(tag)
        })
    }

    /// The shrink frame number `seq` from `peer`, whatever its length.
    pub(crate) fn take_shrink(&mut self, peer: usize, seq: u64) -> Option<Vec<u8>> {
        let queue = &mut self.queues.get_mut(peer)?[class(KIND_SHRINK)];
        let at = queue.iter().position(|(tag, _)| tag.seq == seq)?;
        queue.remove(at).map(|(_, payload)| payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(kind: u8, seq: u64, len: u64) -> Tag {
        Tag {
            kind,
            dtype: 7,
            seq,
            len,
        }
    }

    #[test]
    fn matches_by_class_and_sequence() {
        let mut inbox = Inbox::new(2);
        inbox.push(1, tag(KIND_P2P, 0, 1), vec![9]);
        inbox.push(1, tag(1, 1, 1), vec![2]);
        inbox.push(1, tag(1, 0, 1), vec![1]);
        assert_eq!(inbox.take(1, tag(1, 0, 1)), Some(Ok(vec![1])));
        assert_eq!(inbox.take(1, tag(1, 2, 1)), None);
        assert_eq!(inbox.take(1, tag(2, 1, 1)), Some(Err(tag(1, 1, 1))));
        assert_eq!(inbox.take(1, tag(KIND_P2P, 0, 1)), Some(Ok(vec![9])));
        assert_eq!(inbox.take(0, tag(1, 0, 1)), None);
        assert_eq!(inbox.take(5, tag(1, 0, 1)), None);
    }

    #[test]
    fn shrink_frames_are_a_class_of_their_own() {
        let mut inbox = Inbox::new(2);
        inbox.push(1, tag(KIND_SHRINK, 0, 6), vec![1; 6]);
        inbox.push(1, tag(1, 0, 4), vec![2; 4]);
        assert_eq!(inbox.take_shrink(1, 1), None);
        assert_eq!(inbox.take_shrink(1, 0), Some(vec![1; 6]));
        assert_eq!(inbox.take(1, tag(1, 0, 4)), Some(Ok(vec![2; 4])));
        assert_eq!(inbox.take_shrink(1, 0), None);
    }
}
