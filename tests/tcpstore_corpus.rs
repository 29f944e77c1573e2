//! The TCPStore fuzz seed corpus (`fuzz/corpus/tcpstore/`) as a regression
//! test run by plain `cargo test`: every file goes through the reply decoder
//! as every shape without a panic, and the seeds named for a shape decode
//! (or are refused) as their names say.

#[path = "corpus/mod.rs"]
mod corpus;
use corpus::corpus_files;

use ringwire::store::tcpstore::protocol::{Reply, ReplyShape, TcpStoreError, decode_reply};

#[test]
fn every_seed_decodes_totally() {
    let files = corpus_files("tcpstore");
    assert!(!files.is_empty());
    for (name, bytes) in &files {
        for shape in [
            ReplyShape::Bytes,
            ReplyShape::Int,
            ReplyShape::Check,
            ReplyShape::Wait,
            ReplyShape::Values(3),
        ] {
            if let Ok(Some((_, used))) = decode_reply(shape, bytes) {
                assert!(used <= bytes.len(), "{name} as {shape:?}");
                for cut in 0..used {
                    assert_eq!(decode_reply(shape, &bytes[..cut]), Ok(None), "{name}");
                }
            }
        }
    }
}

#[test]
fn named_seeds_mean_what_they_say() {
    let files = corpus_files("tcpstore");
    let seed = |n: &str| &files.iter().find(|(name, _)| name == n).expect(n).1;
    assert_eq!(
        decode_reply(ReplyShape::Bytes, seed("value_hello")),
        Ok(Some((Reply::Bytes(b"hello".to_vec()), 13)))
    );
    assert_eq!(
        decode_reply(ReplyShape::Int, seed("int_42")),
        Ok(Some((Reply::Int(42), 8)))
    );
    assert_eq!(
        decode_reply(ReplyShape::Check, seed("status_ready")),
        Ok(Some((Reply::Ready(true), 1)))
    );
    assert!(matches!(
        decode_reply(ReplyShape::Wait, seed("status_bad")),
        Err(TcpStoreError::BadStatus { byte: 7, .. })
    ));
    // The first byte is the fuzz target's count; the values follow.
    let three = &seed("values_three")[1..];
    assert!(matches!(
        decode_reply(ReplyShape::Values(3), three),
        Ok(Some((Reply::Values(v), _))) if v.len() == 3
    ));
    assert!(matches!(
        decode_reply(ReplyShape::Bytes, seed("huge_length")),
        Err(TcpStoreError::TooLarge { .. })
    ));
    assert_eq!(decode_reply(ReplyShape::Bytes, seed("cut_value")), Ok(None));
}
