//! Fuzzes the agreement's messages: the first byte picks the communicator's
//! size (1 to 64), the rest is a message's payload. Decoding must not
//! panic; whatever decodes must re-encode to exactly the input; and a
//! decoded message handed to a member's state machine, as a peer's, must
//! not panic it either, nor make it decide something no quorum chose.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringwire::agree::codec::{decode, encode};
use ringwire::agree::protocol::Agreement;

fuzz_target!(|data: &[u8]| {
    let Some((&first, payload)) = data.split_first() else {
        return;
    };
    let size = 1 + usize::from(first % 64);
    let Ok(message) = decode(payload, size) else {
        return;
    };
    assert_eq!(encode(&message, size), payload);
    if size >= 2 {
        // A member that is not the leader (member 0 is), and the leader.
        for me in [0, size - 1] {
            let mut member = Agreement::new(me, size, Agreement::majority(size), u64::MAX);
            let from = if me == 0 { size - 1 } else { 0 };
            member.receive(from, message.clone());
            while member.next_message().is_some() {}
            // Only a decision passed on (a Decide) may decide on one
            // peer's word: anything else needs a quorum.
            if member.decision().is_some() {
                assert!(
                    matches!(message, ringwire::agree::protocol::Message::Decide { .. }),
                    "{message:?} decided at once"
                );
            }
        }
    }
});
