//! The agreement's fuzz seed corpus (`fuzz/corpus/agree/`) as a regression
//! test run by plain `cargo test`: every file decodes totally (a message or
//! an error, canonical when a message), and the seeds this file makes are
//! committed byte for byte, so the corpus is also the golden bytes of the
//! agreement's wire format (`RINGWIRE_BLESS=1 cargo test --test
//! agree_corpus` rewrites them after an intentional change). A file's first
//! byte picks the communicator's size, as the fuzz target reads it.

#[path = "corpus/mod.rs"]
mod corpus;
use corpus::{corpus_dir, corpus_files};

use ringwire::agree::codec::{decode, encode};
use ringwire::agree::protocol::{Agreement, Ballot, Decision, Message};

/// A seed: the size byte, then the payload.
fn seed(size: u8, message: &Message) -> Vec<u8> {
    let mut bytes = vec![size - 1];
    bytes.extend(encode(message, usize::from(size)));
    bytes
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let b = |round, rank| Ballot { round, rank };
    let d = Decision {
        value: 0xFFFF_FFFF_FFFF_FFF7,
        members: vec![0, 2, 3],
    };
    let mut stray = seed(
        4,
        &Message::Decide {
            decision: d.clone(),
        },
    );
    *stray.last_mut().unwrap() |= 0x80;
    let truncated = seed(
        4,
        &Message::Accept {
            ballot: b(2, 1),
            decision: d.clone(),
        },
    );
    vec![
        (
            "valid_prepare",
            seed(4, &Message::Prepare { ballot: b(1, 0) }),
        ),
        (
            "valid_promise",
            seed(
                4,
                &Message::Promise {
                    ballot: b(1, 0),
                    accepted: None,
                    input: u64::MAX,
                },
            ),
        ),
        (
            "valid_promise_accepted",
            seed(
                4,
                &Message::Promise {
                    ballot: b(3, 1),
                    accepted: Some((b(2, 0), d.clone())),
                    input: 7,
                },
            ),
        ),
        ("valid_nack", seed(4, &Message::Nack { promised: b(9, 3) })),
        (
            "valid_accept",
            seed(
                4,
                &Message::Accept {
                    ballot: b(2, 1),
                    decision: d.clone(),
                },
            ),
        ),
        (
            "valid_accepted",
            seed(4, &Message::Accepted { ballot: b(2, 1) }),
        ),
        (
            "valid_decide",
            seed(
                4,
                &Message::Decide {
                    decision: d.clone(),
                },
            ),
        ),
        ("bad_tag", vec![3, 0xEE, 1, 2, 3]),
        ("stray_member_bit", stray),
        ("cut_accept", truncated[..truncated.len() - 2].to_vec()),
    ]
}

#[test]
fn the_seeds_are_committed_byte_for_byte() {
    let dir = corpus_dir("agree");
    if std::env::var_os("RINGWIRE_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let files = corpus_files("agree");
    for (name, bytes) in seeds() {
        let found = files.iter().find(|(n, _)| n == name);
        assert_eq!(
            found.map(|(_, b)| b),
            Some(&bytes),
            "fuzz/corpus/agree/{name} differs from this test's seed: after an intentional \
             change, `RINGWIRE_BLESS=1 cargo test --test agree_corpus`"
        );
    }
}

#[test]
fn every_file_decodes_totally_and_the_named_ones_as_named() {
    let files = corpus_files("agree");
    assert!(files.len() >= 10);
    for (name, bytes) in &files {
        let Some((&first, payload)) = bytes.split_first() else {
            continue;
        };
        let size = 1 + usize::from(first % 64);
        match decode(payload, size) {
            Ok(message) => {
                assert_eq!(encode(&message, size), payload, "{name}");
                // As a peer's message to a member and to the leader, as
                // the fuzz target does (the regression seeds once
                // overflowed a round here).
                if size >= 2 {
                    for me in [0, size - 1] {
                        let mut member = Agreement::new(me, size, Agreement::majority(size), 1);
                        member.receive(if me == 0 { size - 1 } else { 0 }, message.clone());
                        while member.next_message().is_some() {}
                    }
                }
                assert!(
                    !name.starts_with("bad") && !name.starts_with("cut"),
                    "{name} decoded"
                );
            }
            Err(e) => assert!(!name.starts_with("valid"), "{name}: {e}"),
        }
    }
}
