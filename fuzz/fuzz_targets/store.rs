//! Fuzzes the rendezvous store's wire protocol (`ringwire::store::protocol`):
//! the same bytes go to `decode_request` and `decode_response`. Neither may
//! panic; each must agree with its frame-length function
//! (`request_frame_len` / `response_frame_len`); every strict prefix of a
//! decoded frame must be "need more bytes"; and whatever decodes must
//! re-encode to exactly the bytes it was decoded from, and decode again to the
//! same value.
//!
//! One exception, by design of the codec: an `Error` response's message is
//! decoded with `String::from_utf8_lossy`, so a message that is not UTF-8
//! still decodes (with U+FFFD in place of the bad bytes) but re-encodes to
//! different bytes. For those the target checks the lossy decoding instead,
//! and that one more encode/decode round is then a fixed point.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringwire::store::protocol::{
    HEADER_LEN, MAX_ERROR_LEN, ProtocolError, Response, decode_request, decode_response,
    encode_request, encode_response, request_frame_len, response_frame_len,
};

/// Bytes before an `Error` response's message: header, tag, message length.
const ERROR_MESSAGE_START: usize = HEADER_LEN + 1 + 4;

fuzz_target!(|data: &[u8]| {
    check_request(data);
    check_response(data);
});

fn check_request(data: &[u8]) {
    let decoded = decode_request(data);
    check_framing(data, "request", used_of(&decoded), request_frame_len(data));
    let Ok(Some((req, used))) = decoded else {
        return;
    };
    for cut in 0..used {
        assert_eq!(
            decode_request(&data[..cut]),
            Ok(None),
            "prefix of {cut} bytes"
        );
    }
    let bytes = encode_request(&req).expect("a decoded request always re-encodes");
    assert_eq!(bytes, data[..used], "request encoding is canonical");
    assert_eq!(decode_request(&bytes), Ok(Some((req, used))));
}

fn check_response(data: &[u8]) {
    let decoded = decode_response(data);
    check_framing(
        data,
        "response",
        used_of(&decoded),
        response_frame_len(data),
    );
    let Ok(Some((resp, used))) = decoded else {
        return;
    };
    for cut in 0..used {
        assert_eq!(
            decode_response(&data[..cut]),
            Ok(None),
            "prefix of {cut} bytes"
        );
    }
    let frame = &data[..used];
    let bytes = encode_response(&resp).expect("a decoded response always re-encodes");
    match &resp {
        Response::Error(msg) if std::str::from_utf8(&frame[ERROR_MESSAGE_START..]).is_err() => {
            // Not canonical: the message bytes were decoded lossily.
            let raw = &frame[ERROR_MESSAGE_START..];
            assert_eq!(*msg, String::from_utf8_lossy(raw), "lossy error message");
            let (again, used_again) = decode_response(&bytes)
                .expect("re-encoded response decodes")
                .expect("re-encoded response is complete");
            assert_eq!(used_again, bytes.len());
            if msg.len() <= MAX_ERROR_LEN {
                assert_eq!(again, resp);
            }
            // (A longer lossy message is cut at a character boundary when
            // encoded; from then on it is stable.)
            assert_eq!(
                encode_response(&again).expect("re-encodes"),
                bytes,
                "second round is a fixed point"
            );
        }
        _ => {
            assert_eq!(bytes, frame, "response encoding is canonical");
            assert_eq!(decode_response(&bytes), Ok(Some((resp, used))));
        }
    }
}

/// A decoder's answer reduced to how many bytes it used.
fn used_of<T>(
    decoded: &Result<Option<(T, usize)>, ProtocolError>,
) -> Result<Option<usize>, &ProtocolError> {
    match decoded {
        Ok(some) => Ok(some.as_ref().map(|(_, used)| *used)),
        Err(e) => Err(e),
    }
}

/// Checks a decoder's answer against its frame-length function on the same
/// bytes.
fn check_framing(
    data: &[u8],
    what: &str,
    decoded: Result<Option<usize>, &ProtocolError>,
    frame_len: Result<Option<usize>, ProtocolError>,
) {
    match (decoded, frame_len) {
        // A decoded frame is exactly as long as its header says, and has at
        // least the command / tag byte.
        (Ok(Some(used)), Ok(Some(len))) => {
            assert_eq!(used, len, "{what}: bytes used vs frame length");
            assert!(
                HEADER_LEN < used && used <= data.len(),
                "{what}: used {used}"
            );
        }
        // "Need more bytes": the header is not in yet...
        (Ok(None), Ok(None)) => assert!(data.len() < HEADER_LEN, "{what}"),
        // ...or the frame is not complete yet.
        (Ok(None), Ok(Some(len))) => assert!(len > data.len(), "{what}: frame of {len}"),
        // A declared length over the cap is refused by both, alike.
        (Err(e), Err(len_err)) => {
            assert!(matches!(len_err, ProtocolError::FrameTooLarge { .. }));
            assert_eq!(*e, len_err, "{what}");
        }
        // Any other error comes from a frame whose header is acceptable.
        (Err(e), Ok(Some(_))) => assert!(
            !matches!(e, ProtocolError::FrameTooLarge { .. }),
            "{what}: {e:?}"
        ),
        (decoded, frame_len) => {
            panic!("{what}: decoder says {decoded:?} but frame length says {frame_len:?}")
        }
    }
}
