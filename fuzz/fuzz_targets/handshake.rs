//! Fuzzes the control-payload decoders (`Hello`, `HelloAck`, `Abort`) on the
//! same bytes: none may panic, and whatever decodes must re-encode to exactly
//! the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringwire::wire::{Abort, Hello, HelloAck};

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = Hello::decode(data) {
        let bytes = hello.encode().expect("a decoded hello always re-encodes");
        assert_eq!(bytes, data);
        assert_eq!(Hello::decode(&bytes).as_ref(), Ok(&hello));
    }
    if let Ok(ack) = HelloAck::decode(data) {
        assert_eq!(ack.encode(), data);
    }
    if let Ok(abort) = Abort::decode(data) {
        assert_eq!(abort.encode(), data);
    }
});
