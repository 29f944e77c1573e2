//! The store fuzz seed corpus (`fuzz/corpus/store/`) as a regression test of
//! the rendezvous store's wire protocol, run by plain `cargo test` (no fuzzer
//! needed):
//!
//! - every file in `fuzz/corpus/store/` goes through [`decode_request`] and
//!   [`decode_response`] without a panic, and the directory is not empty;
//! - every `valid_request_*` file decodes as one complete request and every
//!   `valid_response_*` file as one complete response, re-encoding to the
//!   same bytes;
//! - no other seed decodes as a complete frame of either kind;
//! - every seed this file generates is committed byte for byte, so the
//!   corpus doubles as golden bytes of the store's wire format. After an
//!   intentional change, regenerate with
//!   `cargo test --test store_corpus -- --ignored regenerate_store_corpus`.

use std::fs;

#[path = "corpus/mod.rs"]
mod corpus;
use corpus::{corpus_dir, corpus_files};

use ringwire::store::protocol::{
    MAX_ERROR_LEN, MAX_KEY_LEN, MAX_REQUEST_BODY, Request, Response, decode_request,
    decode_response, encode_request, encode_response, request_frame_len, response_frame_len,
};

/// Every seed: (file name, bytes).
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let req = |r: Request| encode_request(&r).unwrap();
    let resp = |r: Response| encode_response(&r).unwrap();
    let with = |mut bytes: Vec<u8>, at: usize, patch: &[u8]| {
        bytes[at..at + patch.len()].copy_from_slice(patch);
        bytes
    };
    /// A frame with the given body.
    fn frame(body: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }
    let u32_le = |n: usize| u32::try_from(n).unwrap().to_le_bytes();

    let compare_set = req(Request::CompareSet {
        key: "leader".into(),
        expected: Vec::new(),
        desired: b"rank-2".to_vec(),
    });
    let timeout = resp(Response::Timeout {
        missing: vec!["rank/2/addr".into(), "rank/3/addr".into()],
    });
    let num_keys = req(Request::NumKeys);
    let mut num_keys_trailing = num_keys.clone();
    num_keys_trailing.extend_from_slice(&[9, 9]);
    let num_keys_trailing = with(num_keys_trailing, 0, &3u32.to_le_bytes());

    vec![
        // One of every request.
        (
            "valid_request_set.bin",
            req(Request::Set {
                key: "rank/0/addr".into(),
                value: b"10.0.0.1:29500\0\xff".to_vec(),
            }),
        ),
        (
            "valid_request_get.bin",
            req(Request::Get {
                key: "rank/3/addr".into(),
                timeout_ms: 30_000,
            }),
        ),
        (
            "valid_request_try_get.bin",
            req(Request::TryGet {
                key: "clé/é".into(),
            }),
        ),
        (
            "valid_request_add.bin",
            req(Request::Add {
                key: "barrier/0".into(),
                delta: -1,
            }),
        ),
        ("valid_request_compare_set.bin", compare_set.clone()),
        (
            "valid_request_delete.bin",
            req(Request::Delete {
                key: "barrier/0".into(),
            }),
        ),
        (
            "valid_request_wait.bin",
            req(Request::Wait {
                keys: vec!["a".into(), "b".into(), String::new()],
                timeout_ms: u64::MAX,
            }),
        ),
        ("valid_request_num_keys.bin", num_keys.clone()),
        // One of every response.
        ("valid_response_done.bin", resp(Response::Done)),
        (
            "valid_response_value.bin",
            resp(Response::Value(b"10.0.0.1:29500".to_vec())),
        ),
        ("valid_response_int.bin", resp(Response::Int(i64::MIN))),
        ("valid_response_bool.bin", resp(Response::Bool(true))),
        ("valid_response_count.bin", resp(Response::Count(42))),
        ("valid_response_not_found.bin", resp(Response::NotFound)),
        ("valid_response_timeout.bin", timeout.clone()),
        (
            "valid_response_error.bin",
            resp(Response::Error("key too long: refusé".into())),
        ),
        // Broken ones, named after what is wrong with them.
        ("empty.bin", Vec::new()),
        (
            "truncated_request_compare_set.bin",
            compare_set[..compare_set.len() - 1].to_vec(),
        ),
        (
            "truncated_response_timeout.bin",
            timeout[..timeout.len() - 3].to_vec(),
        ),
        // 9 is neither a command nor a response tag.
        ("unknown_command_byte_9.bin", with(num_keys, 4, &[9])),
        (
            "unknown_response_byte_200.bin",
            with(resp(Response::Count(7)), 4, &[200]),
        ),
        (
            "frame_len_over_cap_u32_max.bin",
            with(frame(&[8]), 0, &u32::MAX.to_le_bytes()),
        ),
        (
            "frame_len_one_over_request_cap.bin",
            u32_le(MAX_REQUEST_BODY + 1).to_vec(),
        ),
        (
            "key_len_over_cap_try_get.bin",
            frame(&[[3].as_slice(), &u32_le(MAX_KEY_LEN + 1)].concat()),
        ),
        (
            "error_message_len_over_cap.bin",
            frame(&[[7].as_slice(), &u32_le(MAX_ERROR_LEN + 1)].concat()),
        ),
        ("trailing_bytes_num_keys.bin", num_keys_trailing),
        (
            "bad_utf8_key_delete.bin",
            frame(&[6, 2, 0, 0, 0, 0xc3, 0x28]),
        ),
        ("bad_bool_2.bin", frame(&[3, 2])),
    ]
}

#[test]
fn store_corpus_decodes_without_panic() {
    let files = corpus_files("store");
    assert!(!files.is_empty(), "fuzz/corpus/store is empty");
    for (name, bytes) in &files {
        let request = decode_request(bytes);
        let response = decode_response(bytes);
        let _ = request_frame_len(bytes);
        let _ = response_frame_len(bytes);
        if name.starts_with("valid_request_") {
            let (req, used) = request
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .unwrap_or_else(|| panic!("{name}: incomplete request"));
            assert_eq!(used, bytes.len(), "{name}: one whole frame");
            assert_eq!(request_frame_len(bytes), Ok(Some(used)), "{name}");
            assert_eq!(encode_request(&req).unwrap(), *bytes, "{name}: canonical");
        } else if name.starts_with("valid_response_") {
            let (resp, used) = response
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .unwrap_or_else(|| panic!("{name}: incomplete response"));
            assert_eq!(used, bytes.len(), "{name}: one whole frame");
            assert_eq!(response_frame_len(bytes), Ok(Some(used)), "{name}");
            assert_eq!(encode_response(&resp).unwrap(), *bytes, "{name}: canonical");
        } else {
            // Any other file may fail (libFuzzer finds saved here by hand
            // too); it only must not panic.
            assert!(
                !name.starts_with("valid_"),
                "{name}: valid_ seed of unknown type"
            );
        }
    }
}

#[test]
fn every_request_and_response_variant_has_a_valid_seed() {
    let names: Vec<&str> = seeds().iter().map(|(name, _)| *name).collect();
    for kind in [
        "set",
        "get",
        "try_get",
        "add",
        "compare_set",
        "delete",
        "wait",
        "num_keys",
    ] {
        let name = format!("valid_request_{kind}.bin");
        assert!(names.contains(&name.as_str()), "no seed {name}");
    }
    for kind in [
        "done",
        "value",
        "int",
        "bool",
        "count",
        "not_found",
        "timeout",
        "error",
    ] {
        let name = format!("valid_response_{kind}.bin");
        assert!(names.contains(&name.as_str()), "no seed {name}");
    }
    // And each is the variant its name says.
    for (name, bytes) in seeds() {
        if let Some(kind) = name
            .strip_prefix("valid_request_")
            .and_then(|n| n.strip_suffix(".bin"))
        {
            let (req, _) = decode_request(&bytes).unwrap().unwrap();
            assert_eq!(req.name(), kind, "{name}");
        }
        if let Some(kind) = name
            .strip_prefix("valid_response_")
            .and_then(|n| n.strip_suffix(".bin"))
        {
            let (resp, _) = decode_response(&bytes).unwrap().unwrap();
            let expected = match resp {
                Response::Done => "done",
                Response::Value(_) => "value",
                Response::Int(_) => "int",
                Response::Bool(_) => "bool",
                Response::Count(_) => "count",
                Response::NotFound => "not_found",
                Response::Timeout { .. } => "timeout",
                Response::Error(_) => "error",
            };
            assert_eq!(expected, kind, "{name}");
        }
    }
}

#[test]
fn invalid_seeds_fail() {
    // The non-`valid_` seeds exist to exercise error (or "need more bytes")
    // paths: make sure neither decoder takes them for a complete frame.
    for (name, bytes) in seeds() {
        if name.starts_with("valid_") {
            continue;
        }
        let request = decode_request(&bytes);
        let response = decode_response(&bytes);
        assert!(
            !matches!(request, Ok(Some(_))),
            "{name} decodes as a request ({request:?}), but is meant to be invalid"
        );
        assert!(
            !matches!(response, Ok(Some(_))),
            "{name} decodes as a response ({response:?}), but is meant to be invalid"
        );
        if name.starts_with("truncated_") || name == "empty.bin" {
            assert_eq!(request, Ok(None), "{name}: need more bytes");
            assert_eq!(response, Ok(None), "{name}: need more bytes");
        } else {
            assert!(
                request.is_err() && response.is_err(),
                "{name}: meant to be refused by both decoders, got {request:?} / {response:?}"
            );
        }
    }
}

#[test]
fn committed_seeds_match_the_encoders() {
    for (name, bytes) in seeds() {
        let path = corpus_dir("store").join(name);
        let committed = fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; regenerate with \
                 `cargo test --test store_corpus -- --ignored regenerate_store_corpus`",
                path.display()
            )
        });
        assert!(
            committed == bytes,
            "{} differs from what the encoders produce now: the store wire format changed. \
             If that is intended, regenerate with \
             `cargo test --test store_corpus -- --ignored regenerate_store_corpus`",
            path.display()
        );
    }
}

/// Writes the seeds into `fuzz/corpus/store/`.
#[test]
#[ignore = "writes fuzz/corpus/store/; run by hand after an intended format change"]
fn regenerate_store_corpus() {
    let dir = corpus_dir("store");
    fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds() {
        fs::write(dir.join(name), bytes).unwrap();
    }
}
