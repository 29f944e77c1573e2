//! Fuzzes the PyTorch TCPStore reply decoder
//! (`ringwire::store::tcpstore::protocol::decode_reply`): the same bytes as
//! each reply shape. It must not panic; a decoded reply uses no more bytes
//! than it was given; every strict prefix of those bytes is "need more";
//! and a declared length over the cap is refused, never allocated.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringwire::store::tcpstore::protocol::{ReplyShape, decode_reply};

fuzz_target!(|data: &[u8]| {
    // The first byte picks how many values a MULTI_GET reply holds.
    let count = data.first().map_or(0, |&b| usize::from(b % 8));
    for shape in [
        ReplyShape::Bytes,
        ReplyShape::Int,
        ReplyShape::Check,
        ReplyShape::Wait,
        ReplyShape::Values(count),
    ] {
        let Ok(Some((_, used))) = decode_reply(shape, data) else {
            continue;
        };
        assert!(
            used <= data.len(),
            "{shape:?} used {used} of {}",
            data.len()
        );
        for cut in 0..used {
            assert_eq!(
                decode_reply(shape, &data[..cut]),
                Ok(None),
                "{shape:?}: prefix of {cut}"
            );
        }
    }
});
