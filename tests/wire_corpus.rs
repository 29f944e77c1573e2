//! The fuzz seed corpus (`fuzz/corpus/`) as a regression test of the wire
//! decoders, run by plain `cargo test` (no fuzzer needed):
//!
//! - every file in `fuzz/corpus/*/` goes through [`decode_frame`] and the
//!   payload decoders without a panic, and the directories are not empty;
//! - every `valid_*` file decodes `Ok` (with the decoder its name says);
//! - every seed this file generates is committed byte for byte, so the
//!   corpus doubles as golden bytes of the wire format: a change to the
//!   format shows up here. After an intentional change, regenerate with
//!   `cargo test --test wire_corpus -- --ignored regenerate_seed_corpus`.

use std::fs;

#[path = "corpus/mod.rs"]
mod corpus;
use corpus::{corpus_dir, corpus_files};

use ringwire::wire::{
    Abort, Channel, FrameKind, Header, Hello, HelloAck, OpKind, decode_frame, encode_abort,
    encode_heartbeat, encode_hello, encode_hello_ack,
};
use ringwire::{DType, ReduceOp};

/// The `max_payload` the fuzz target uses.
const MAX_PAYLOAD: u32 = 1 << 20;

/// Every seed: (target directory, file name, bytes).
fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let hello = Hello::new(0x5EED_0000_0000_0001, 1, 4);
    let hello_auth = Hello {
        security: ringwire::wire::handshake::SECURITY_SECRET
            | ringwire::wire::handshake::SECURITY_TLS
            | ringwire::wire::handshake::SECURITY_MTLS,
        auth: b"0123456789abcdef0123456789abcdef".to_vec(),
        ..Hello::new(0x5EED_0000_0000_0002, 3, 8)
    };
    let ack_challenge = HelloAck::accept()
        .with_security(ringwire::wire::handshake::SECURITY_SECRET)
        .with_auth([7u8; 64].to_vec());
    let ack_ok = HelloAck::accept();
    let ack_no = HelloAck::reject("world size mismatch: this rank has 4, peer says 8");
    let abort = Abort::new(2, 17, "rank 2: connection to rank 3 reset");
    let all_reduce = Header::data(9, 17, OpKind::AllReduce, DType::F32)
        .with_reduce_op(ReduceOp::Sum)
        .with_step(2, 1)
        .with_payload_len(16)
        .with_count(1024);

    let hello_frame = encode_hello(9, 0, &hello).unwrap();
    let abort_frame = encode_abort(9, 18, &abort);
    let with = |mut bytes: Vec<u8>, at: usize, patch: &[u8]| {
        bytes[at..at + patch.len()].copy_from_slice(patch);
        bytes
    };
    let mut all_reduce_with_payload = all_reduce.encode().to_vec();
    all_reduce_with_payload.extend(1.5f32.to_le_bytes().repeat(4));
    all_reduce_with_payload.resize(128, 0);
    // The same frame with its payload 40 bytes further on, as a sender
    // whose payload sits at 32 mod 64 in memory writes it.
    let padded = all_reduce.with_pad(40);
    let mut all_reduce_padded = padded.encode().to_vec();
    all_reduce_padded.resize(padded.payload_offset(), 0);
    all_reduce_padded.extend(1.5f32.to_le_bytes().repeat(4));
    all_reduce_padded.resize(padded.frame_len(), 0);
    let mut http = b"GET / HTTP/1.1\r\nHost: localhost:29500\r\n".to_vec();
    http.resize(64, b'\n');

    // A hello with an 8-byte pad, one byte of it not zero.
    let hello_bad_pad = {
        let header = Header::decode(&hello_frame, MAX_PAYLOAD)
            .unwrap()
            .with_pad(8);
        let mut frame = header.encode().to_vec();
        frame.extend_from_slice(&[0, 0, 0, 7, 0, 0, 0, 0]);
        frame.extend_from_slice(&hello.encode().unwrap());
        frame.resize(header.frame_len(), 0);
        frame
    };
    let hello_payload = hello.encode().unwrap();
    let ack_payload = ack_no.encode();
    let abort_payload = abort.encode();
    let mut hello_trailing = hello_payload.clone();
    hello_trailing.push(0);

    vec![
        // Whole frames, for `decode_frame`.
        ("frame", "valid_hello.bin", hello_frame.clone()),
        (
            "frame",
            "valid_hello_with_auth.bin",
            encode_hello(9, 0, &hello_auth).unwrap(),
        ),
        (
            "frame",
            "valid_hello_ack_accept.bin",
            encode_hello_ack(9, 0, &ack_ok),
        ),
        (
            "frame",
            "valid_hello_ack_reject.bin",
            encode_hello_ack(9, 0, &ack_no),
        ),
        ("frame", "valid_abort.bin", abort_frame.clone()),
        (
            "frame",
            "valid_heartbeat.bin",
            encode_heartbeat(9, 42).to_vec(),
        ),
        (
            "frame",
            "valid_data_all_reduce_f32_header_only.bin",
            all_reduce.encode().to_vec(),
        ),
        (
            "frame",
            "valid_data_all_reduce_f32_with_payload.bin",
            all_reduce_with_payload,
        ),
        (
            "frame",
            "valid_data_all_reduce_f32_padded.bin",
            all_reduce_padded,
        ),
        (
            "frame",
            "valid_data_broadcast_bf16_root3.bin",
            Header::data(9, 5, OpKind::Broadcast, DType::BF16)
                .with_root(3)
                .with_payload_len(4096)
                .with_count(2048)
                .encode()
                .to_vec(),
        ),
        (
            "frame",
            "valid_data_barrier_no_dtype.bin",
            Header {
                dtype: None,
                ..Header::data(9, 6, OpKind::Barrier, DType::U8)
            }
            .encode()
            .to_vec(),
        ),
        ("frame", "empty.bin", Vec::new()),
        (
            "frame",
            "truncated_header_10_bytes.bin",
            hello_frame[..10].to_vec(),
        ),
        (
            "frame",
            "truncated_hello_payload.bin",
            hello_frame[..hello_frame.len() - 3].to_vec(),
        ),
        ("frame", "bad_magic_http_get.bin", http),
        (
            "frame",
            "bad_version_1.bin",
            with(hello_frame.clone(), 4, &[1, 0]),
        ),
        (
            "frame",
            "pad_64.bin",
            with(all_reduce.encode().to_vec(), 27, &[64]),
        ),
        (
            "frame",
            "nonzero_trailing_padding_abort.bin",
            with(abort_frame.clone(), abort_frame.len() - 1, &[1]),
        ),
        ("frame", "nonzero_pad_hello.bin", hello_bad_pad),
        (
            "frame",
            "unknown_kind_9.bin",
            with(abort_frame.clone(), 6, &[9]),
        ),
        (
            "frame",
            "unknown_dtype_200.bin",
            with(all_reduce.encode().to_vec(), 25, &[200]),
        ),
        (
            "frame",
            "nonzero_reserved2.bin",
            with(all_reduce.encode().to_vec(), 52, &[1]),
        ),
        (
            "frame",
            "huge_payload_len_data.bin",
            with(all_reduce.encode().to_vec(), 36, &u32::MAX.to_le_bytes()),
        ),
        (
            "frame",
            "huge_payload_len_abort_over_control_cap.bin",
            with(abort_frame.clone(), 36, &(1u32 << 19).to_le_bytes()),
        ),
        (
            "frame",
            "heartbeat_with_payload.bin",
            Header::control(FrameKind::Heartbeat, 9, 1, 4)
                .encode()
                .to_vec(),
        ),
        (
            "frame",
            "hello_auth_len_past_payload.bin",
            with(hello_frame.clone(), 56 + 25, &300u16.to_le_bytes()),
        ),
        // Bare payloads, for `Hello::decode`, `HelloAck::decode`, `Abort::decode`.
        ("handshake", "valid_hello_rank1.bin", hello_payload.clone()),
        // A replacement's hello (decision 0040).
        (
            "handshake",
            "valid_hello_incarnation_3.bin",
            Hello {
                incarnation: 3,
                ..hello.clone()
            }
            .encode()
            .unwrap(),
        ),
        (
            "handshake",
            "valid_hello_with_auth.bin",
            hello_auth.encode().unwrap(),
        ),
        ("handshake", "valid_ack_accept.bin", ack_ok.encode()),
        (
            "handshake",
            "valid_ack_secret_challenge.bin",
            ack_challenge.encode(),
        ),
        (
            "handshake",
            "ack_auth_len_over_cap.bin",
            with(ack_challenge.encode(), 5, &513u16.to_le_bytes()),
        ),
        (
            "handshake",
            "hello_unknown_security_bits.bin",
            with(hello_payload.clone(), 3, &[0x80]),
        ),
        ("handshake", "valid_ack_reject.bin", ack_payload.clone()),
        (
            "handshake",
            "valid_ack_reject_unicode.bin",
            HelloAck::reject("rang ✗ refusé").encode(),
        ),
        ("handshake", "valid_abort.bin", abort_payload.clone()),
        (
            "handshake",
            "valid_abort_empty_reason.bin",
            Abort::new(0, 0, "").encode(),
        ),
        ("handshake", "empty.bin", Vec::new()),
        (
            "handshake",
            "hello_truncated_fixed_part.bin",
            hello_payload[..13].to_vec(),
        ),
        ("handshake", "hello_trailing_byte.bin", hello_trailing),
        (
            "handshake",
            "hello_auth_len_over_cap.bin",
            with(hello_payload.clone(), 25, &513u16.to_le_bytes()),
        ),
        (
            "handshake",
            "hello_auth_len_past_end.bin",
            with(hello_payload.clone(), 25, &40u16.to_le_bytes()),
        ),
        (
            "handshake",
            "hello_bad_endian_flag.bin",
            with(hello_payload.clone(), 2, &[2]),
        ),
        // Lanes (decisions 0018, 0034): a main connection asking for four
        // each way, a lane, an unknown channel, an ack taking more than
        // MAX_LANES; a probe (decision 0039).
        (
            "handshake",
            "valid_hello_main_with_lanes.bin",
            Hello {
                channel: Channel::MainWithLanes(4),
                ..hello.clone()
            }
            .encode()
            .unwrap(),
        ),
        (
            "handshake",
            "valid_hello_lane_to_dialer.bin",
            Hello {
                channel: Channel::LaneToDialer(2),
                ..hello_auth.clone()
            }
            .encode()
            .unwrap(),
        ),
        (
            "handshake",
            "valid_hello_main_with_shm.bin",
            Hello {
                channel: Channel::MainWithShm,
                ..hello_auth.clone()
            }
            .encode()
            .unwrap(),
        ),
        (
            "handshake",
            "hello_unknown_channel.bin",
            with(hello_payload, 4, &[6]),
        ),
        (
            "handshake",
            "valid_hello_probe.bin",
            Hello {
                channel: Channel::Probe,
                ..hello_auth.clone()
            }
            .encode()
            .unwrap(),
        ),
        (
            "handshake",
            "valid_ack_accept_lanes.bin",
            HelloAck::accept().with_lanes(4).encode(),
        ),
        (
            "handshake",
            "ack_bad_lanes_flag.bin",
            with(ack_payload.clone(), 2, &[9]),
        ),
        (
            "handshake",
            "ack_bad_accepted_flag.bin",
            with(ack_payload.clone(), 0, &[3]),
        ),
        (
            "handshake",
            "ack_reason_len_u16_max.bin",
            with(ack_payload.clone(), 3, &u16::MAX.to_le_bytes()),
        ),
        (
            "handshake",
            "ack_reason_invalid_utf8.bin",
            with(ack_payload.clone(), 7, &[0xff, 0xfe]),
        ),
        (
            "handshake",
            "abort_truncated_reason.bin",
            abort_payload[..abort_payload.len() - 5].to_vec(),
        ),
    ]
}

#[test]
fn frame_corpus_decodes_without_panic() {
    let files = corpus_files("frame");
    assert!(!files.is_empty(), "fuzz/corpus/frame is empty");
    for (name, bytes) in &files {
        let result = decode_frame(bytes, MAX_PAYLOAD);
        if name.starts_with("valid_") {
            let (frame, used) = result.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(used <= bytes.len(), "{name}");
            assert_eq!(
                frame.encode().unwrap(),
                bytes[..used],
                "{name}: canonical encoding"
            );
        }
        // Every other file may fail; it only must not panic. The payload
        // decoders must not panic on whole frames either.
        let _ = Hello::decode(bytes);
        let _ = HelloAck::decode(bytes);
        let _ = Abort::decode(bytes);
    }
}

#[test]
fn handshake_corpus_decodes_without_panic() {
    let files = corpus_files("handshake");
    assert!(!files.is_empty(), "fuzz/corpus/handshake is empty");
    for (name, bytes) in &files {
        let hello = Hello::decode(bytes);
        let ack = HelloAck::decode(bytes);
        let abort = Abort::decode(bytes);
        let _ = decode_frame(bytes, MAX_PAYLOAD);
        if name.starts_with("valid_hello") {
            assert_eq!(
                hello
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
                    .encode()
                    .unwrap(),
                *bytes
            );
        } else if name.starts_with("valid_ack") {
            assert_eq!(
                ack.unwrap_or_else(|e| panic!("{name}: {e}")).encode(),
                *bytes
            );
        } else if name.starts_with("valid_abort") {
            assert_eq!(
                abort.unwrap_or_else(|e| panic!("{name}: {e}")).encode(),
                *bytes
            );
        } else {
            assert!(
                !name.starts_with("valid_"),
                "{name}: valid_ seed of unknown type"
            );
        }
    }
}

#[test]
fn invalid_seeds_fail() {
    // The non-`valid_` seeds exist to exercise error paths: make sure they do.
    for (target, name, bytes) in seeds() {
        if name.starts_with("valid_") {
            continue;
        }
        let failed = match target {
            "frame" => decode_frame(&bytes, MAX_PAYLOAD).is_err(),
            _ => {
                Hello::decode(&bytes).is_err()
                    && HelloAck::decode(&bytes).is_err()
                    && Abort::decode(&bytes).is_err()
            }
        };
        assert!(
            failed,
            "{target}/{name} decodes, but is meant to be invalid"
        );
    }
}

#[test]
fn committed_seeds_match_the_encoders() {
    for (target, name, bytes) in seeds() {
        let path = corpus_dir(target).join(name);
        let committed = fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; regenerate with \
                 `cargo test --test wire_corpus -- --ignored regenerate_seed_corpus`",
                path.display()
            )
        });
        assert!(
            committed == bytes,
            "{} differs from what the encoders produce now: the wire format changed. \
             If that is intended, regenerate with \
             `cargo test --test wire_corpus -- --ignored regenerate_seed_corpus`",
            path.display()
        );
    }
}

/// Writes the seeds into `fuzz/corpus/`.
#[test]
#[ignore = "writes fuzz/corpus/; run by hand after an intended format change"]
fn regenerate_seed_corpus() {
    for (target, name, bytes) in seeds() {
        let dir = corpus_dir(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn padding_seeds_fail_for_their_reason() {
    use ringwire::wire::WireError;
    let reason = |name: &str| {
        let (_, _, bytes) = seeds().into_iter().find(|s| s.1 == name).unwrap();
        decode_frame(&bytes, MAX_PAYLOAD).unwrap_err()
    };
    assert_eq!(reason("pad_64.bin"), WireError::PadTooLong { pad: 64 });
    for name in [
        "nonzero_pad_hello.bin",
        "nonzero_trailing_padding_abort.bin",
    ] {
        assert!(
            matches!(
                reason(name),
                WireError::NonZeroReserved {
                    field: "frame padding",
                    ..
                }
            ),
            "{name}: {:?}",
            reason(name)
        );
    }
    assert!(matches!(
        reason("bad_version_1.bin"),
        WireError::UnsupportedVersion {
            got: 1,
            supported: 5
        }
    ));
}
