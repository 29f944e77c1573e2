//! Fuzzes `decode_frame`: any input must decode or fail with a typed error,
//! never panic; and a decoded frame must re-encode to exactly the bytes it
//! was decoded from, and decode again to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringwire::wire::{Frame, HEADER_LEN, decode_frame};

const MAX_PAYLOAD: u32 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok((frame, used)) = decode_frame(data, MAX_PAYLOAD) else {
        return;
    };
    assert!(used >= HEADER_LEN && used <= data.len());
    assert!(frame.header().payload_len <= MAX_PAYLOAD);
    if matches!(frame, Frame::Data(_)) {
        assert_eq!(used, HEADER_LEN, "data frames consume the header only");
    }
    let bytes = frame.encode().expect("a decoded frame always re-encodes");
    assert_eq!(bytes, data[..used], "encoding is canonical");
    let (again, used_again) = decode_frame(&bytes, MAX_PAYLOAD).expect("re-encoded frame decodes");
    assert_eq!(again, frame);
    assert_eq!(used_again, used);
});
