//! Fuzzes the handshake: the control-payload decoders (`Hello`, `HelloAck`,
//! `Abort`) on the same bytes, and the acceptor's pure decision on a decoded
//! hello (`validate_hello`, `security_mismatch`). None may panic; whatever
//! decodes must re-encode to exactly the input; a hello is accepted only when
//! it is consistent with the acceptor. (The socket-bound parts of the
//! handshake are exercised with hostile bytes by tests/failures.rs and
//! tests/security.rs.)

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringwire::wire::handshake::security_mismatch;
use ringwire::wire::{Abort, Hello, HelloAck, PROTOCOL_VERSION, validate_hello};

const JOB: u64 = 0x5EED_0000_0000_0001;
const WORLD: u32 = 4;

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = Hello::decode(data) {
        let bytes = hello.encode().expect("a decoded hello always re-encodes");
        assert_eq!(bytes, data);
        assert_eq!(Hello::decode(&bytes).as_ref(), Ok(&hello));
        for me in [0, 1, WORLD - 1] {
            if validate_hello(&hello, JOB, WORLD, me).is_ok() {
                assert_eq!(hello.job_id, JOB);
                assert_eq!(hello.world_size, WORLD);
                assert_eq!(hello.protocol_version, PROTOCOL_VERSION);
                assert!(hello.rank < WORLD && hello.rank != me);
            }
        }
        assert_eq!(security_mismatch(hello.security, hello.security), None);
        for mine in 0..8u8 {
            if mine != hello.security {
                assert!(security_mismatch(hello.security, mine).is_some());
            }
        }
    }
    if let Ok(ack) = HelloAck::decode(data) {
        assert_eq!(ack.encode(), data);
    }
    if let Ok(abort) = Abort::decode(data) {
        assert_eq!(abort.encode(), data);
    }
});
