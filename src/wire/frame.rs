//! Whole frames: [`decode_frame`] turns the bytes at the front of a buffer
//! into a [`Frame`], and the `encode_*` functions build complete control
//! frames (header and payload) ready to write to a socket.
//!
//! Data frames are returned as their header alone: their payload can be
//! megabytes of elements that the transport reads straight into the user's
//! buffer, so it is never copied here. Control frames are small and are
//! decoded whole, their payload capped at [`MAX_CONTROL_PAYLOAD`] whatever
//! limit the caller sets for data.

use super::control::Abort;
#[cfg(any(test, feature = "internals"))]
use super::handshake::{Hello, HelloAck};
use super::header::Header;
use super::kind::FrameKind;
use super::{FRAME_ALIGN, HEADER_LEN};
#[cfg(any(test, feature = "internals"))]
use super::{MAX_CONTROL_PAYLOAD, WireError};

#[cfg(any(test, feature = "internals"))]
/// A decoded frame. Every variant keeps its header, whose `kind` matches the
/// variant and whose `payload_len` is the length of the (encoded) payload.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// A data frame's header; its `payload_len` bytes follow it on the wire
    /// and are not part of this value.
    Data(Header),
    Hello(Header, Hello),
    HelloAck(Header, HelloAck),
    Abort(Header, Abort),
    Heartbeat(Header),
}

#[cfg(any(test, feature = "internals"))]
impl Frame {
    /// The frame's header.
    pub fn header(&self) -> &Header {
        match self {
            Frame::Data(h)
            | Frame::Hello(h, _)
            | Frame::HelloAck(h, _)
            | Frame::Abort(h, _)
            | Frame::Heartbeat(h) => h,
        }
    }

    /// The frame's kind, as the variant says.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Data(_) => FrameKind::Data,
            Frame::Hello(..) => FrameKind::Handshake,
            Frame::HelloAck(..) => FrameKind::HandshakeAck,
            Frame::Abort(..) => FrameKind::Abort,
            Frame::Heartbeat(_) => FrameKind::Heartbeat,
        }
    }

    /// The frame's bytes: for a data frame its header only (with the header's
    /// `payload_len`), for a control frame header and payload, with the
    /// header's `kind` and `payload_len` taken from the variant and its payload.
    /// A frame returned by [`decode_frame`] encodes to exactly the bytes it
    /// was decoded from. Fails only for a [`Hello`] whose auth is over its cap.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let header = self.header();
        let payload = match self {
            Frame::Data(h) => {
                let h = Header {
                    kind: FrameKind::Data,
                    ..*h
                };
                return Ok(h.encode().to_vec());
            }
            Frame::Hello(_, hello) => hello.encode()?,
            Frame::HelloAck(_, ack) => ack.encode(),
            Frame::Abort(_, abort) => abort.encode(),
            Frame::Heartbeat(_) => Vec::new(),
        };
        Ok(with_payload(
            Header {
                kind: self.kind(),
                ..*header
            },
            &payload,
        ))
    }
}

#[cfg(any(test, feature = "internals"))]
/// Decodes the frame at the front of `bytes`; returns it and the number of
/// bytes it took (the header alone for a data frame, whose pad, payload and
/// trailing zeros the caller reads itself; the whole frame for a control
/// frame, whose pad and trailing bytes must be zero).
///
/// `max_payload` bounds every frame's `payload_len`; control frames are also
/// bounded by [`MAX_CONTROL_PAYLOAD`]. When `bytes` holds less than the frame,
/// the error is [`WireError::Truncated`] with `needed` the frame's full
/// length (or [`HEADER_LEN`] while the header itself is incomplete), so a
/// reader can fill its buffer to that size and call again.
pub fn decode_frame(bytes: &[u8], max_payload: u32) -> Result<(Frame, usize), WireError> {
    let header = Header::decode(bytes, max_payload)?;
    let kind = header.kind;
    match kind {
        FrameKind::Data => return Ok((Frame::Data(header), HEADER_LEN)),
        FrameKind::Heartbeat if header.payload_len != 0 => {
            return Err(WireError::UnexpectedPayload {
                kind,
                len: header.payload_len,
            });
        }
        _ => {}
    }
    if header.payload_len > MAX_CONTROL_PAYLOAD {
        return Err(WireError::ControlPayloadTooLarge {
            kind,
            len: header.payload_len,
            max: MAX_CONTROL_PAYLOAD,
        });
    }
    let total = header.frame_len();
    let Some(frame) = bytes.get(..total) else {
        return Err(WireError::Truncated {
            needed: total,
            got: bytes.len(),
        });
    };
    let start = header.payload_offset();
    let end = start + header.payload_len_usize();
    let mut padding = frame[HEADER_LEN..start].iter().chain(&frame[end..]);
    if let Some(&value) = padding.find(|&&b| b != 0) {
        return Err(WireError::NonZeroReserved {
            field: "frame padding",
            value: u32::from(value),
        });
    }
    let payload = &frame[start..end];
    let frame = match kind {
        FrameKind::Heartbeat => Frame::Heartbeat(header),
        FrameKind::Handshake => Frame::Hello(header, Hello::decode(payload)?),
        FrameKind::HandshakeAck => Frame::HelloAck(header, HelloAck::decode(payload)?),
        _ => Frame::Abort(header, Abort::decode(payload)?),
    };
    Ok((frame, total))
}

#[cfg(any(test, feature = "internals"))]
/// A complete `Handshake` frame carrying `hello`. Fails only if its auth is
/// over [`MAX_AUTH_LEN`](super::MAX_AUTH_LEN).
pub fn encode_hello(comm_id: u64, seq: u64, hello: &Hello) -> Result<Vec<u8>, WireError> {
    let payload = hello.encode()?;
    Ok(control_frame(FrameKind::Handshake, comm_id, seq, &payload))
}

#[cfg(any(test, feature = "internals"))]
/// A complete `HandshakeAck` frame carrying `ack`.
pub fn encode_hello_ack(comm_id: u64, seq: u64, ack: &HelloAck) -> Vec<u8> {
    control_frame(FrameKind::HandshakeAck, comm_id, seq, &ack.encode())
}

/// A complete `Abort` frame carrying `abort`.
pub fn encode_abort(comm_id: u64, seq: u64, abort: &Abort) -> Vec<u8> {
    control_frame(FrameKind::Abort, comm_id, seq, &abort.encode())
}

/// A complete `Heartbeat` frame (a header with no payload, made a whole
/// frame line by zeros).
pub fn encode_heartbeat(comm_id: u64, seq: u64) -> [u8; FRAME_ALIGN] {
    let mut frame = [0; FRAME_ALIGN];
    frame[..HEADER_LEN]
        .copy_from_slice(&Header::control(FrameKind::Heartbeat, comm_id, seq, 0).encode());
    frame
}

fn control_frame(kind: FrameKind, comm_id: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    with_payload(Header::control(kind, comm_id, seq, 0), payload)
}

/// The whole frame: `header` (with its `payload_len` set to
/// `payload.len()`), its pad, `payload` and the trailing zeros.
fn with_payload(header: Header, payload: &[u8]) -> Vec<u8> {
    // Control payloads are a few hundred bytes at most (see MAX_CONTROL_PAYLOAD).
    let header = header.with_payload_len(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    let mut out = Vec::with_capacity(header.frame_len());
    out.extend_from_slice(&header.encode());
    out.resize(header.payload_offset(), 0);
    out.extend_from_slice(payload);
    out.resize(header.frame_len(), 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::wire::header::tests::XorShift;
    use crate::wire::kind::OpKind;
    use crate::wire::{MAX_AUTH_LEN, MAX_REASON_LEN};

    const MAX: u32 = 1 << 20;

    fn control_frames() -> Vec<Vec<u8>> {
        vec![
            encode_hello(7, 1, &Hello::new(0xAB, 2, 4)).unwrap(),
            encode_hello_ack(7, 2, &HelloAck::accept()),
            encode_hello_ack(7, 3, &HelloAck::reject("job id mismatch")),
            encode_abort(7, 4, &Abort::new(1, 9, "connection reset by rank 1")),
            encode_heartbeat(7, 5).to_vec(),
        ]
    }

    #[test]
    fn control_frames_round_trip() {
        let (frame, used) = decode_frame(&control_frames()[0], MAX).unwrap();
        let Frame::Hello(h, hello) = &frame else {
            panic!("not a hello: {frame:?}")
        };
        assert_eq!(
            (h.kind, h.comm_id, h.seq, h.op),
            (FrameKind::Handshake, 7, 1, OpKind::None)
        );
        assert_eq!(*hello, Hello::new(0xAB, 2, 4));
        assert_eq!(used, h.frame_len());
        assert_eq!(used % FRAME_ALIGN, 0);

        let expected_kinds = [
            FrameKind::Handshake,
            FrameKind::HandshakeAck,
            FrameKind::HandshakeAck,
            FrameKind::Abort,
            FrameKind::Heartbeat,
        ];
        for (bytes, kind) in control_frames().iter().zip(expected_kinds) {
            let (frame, used) = decode_frame(bytes, MAX).unwrap();
            assert_eq!(used, bytes.len());
            assert_eq!(frame.kind(), kind);
            assert_eq!(frame.header().kind, kind);
            assert_eq!(frame.encode().unwrap(), *bytes);
        }
        let (frame, _) = decode_frame(&control_frames()[3], MAX).unwrap();
        assert_eq!(
            frame,
            Frame::Abort(
                Header::control(FrameKind::Abort, 7, 4, 14 + 26),
                Abort::new(1, 9, "connection reset by rank 1")
            )
        );
    }

    #[test]
    fn data_frames_return_the_header_only() {
        for op in OpKind::ALL {
            for dtype in DType::ALL {
                let h = Header::data(3, 11, op, dtype)
                    .with_reduce_op(ReduceOp::Max)
                    .with_step(1, 2)
                    .with_payload_len(1000)
                    .with_count(250);
                let mut bytes = h.encode().to_vec();
                // The payload need not be present: the caller reads it.
                assert_eq!(decode_frame(&bytes, MAX), Ok((Frame::Data(h), HEADER_LEN)));
                bytes.extend_from_slice(&[0u8; 1000]);
                assert_eq!(decode_frame(&bytes, MAX), Ok((Frame::Data(h), HEADER_LEN)));
                assert_eq!(Frame::Data(h).encode().unwrap(), h.encode());
            }
        }
    }

    #[test]
    fn stream_of_frames() {
        let frames = control_frames();
        let data = Header::data(1, 1, OpKind::Barrier, DType::U8);
        let mut stream: Vec<u8> = frames.concat();
        stream.extend_from_slice(&data.encode());
        let mut at = 0;
        let mut decoded = Vec::new();
        while at < stream.len() {
            let (frame, used) = decode_frame(&stream[at..], MAX).unwrap();
            decoded.push(frame.kind());
            at += used;
        }
        assert_eq!(decoded.len(), frames.len() + 1);
        assert_eq!(decoded.last(), Some(&FrameKind::Data));
    }

    #[test]
    fn frame_encode_fixes_kind_and_len() {
        let wrong = Header::control(FrameKind::Data, 1, 2, 999);
        let frame = Frame::Abort(wrong, Abort::new(0, 0, "x"));
        let (decoded, _) = decode_frame(&frame.encode().unwrap(), MAX).unwrap();
        assert_eq!(decoded.header().kind, FrameKind::Abort);
        assert_eq!(decoded.header().payload_len, 15);
        let hello = Hello {
            auth: vec![0; MAX_AUTH_LEN + 1],
            ..Hello::new(1, 1, 2)
        };
        assert!(matches!(
            encode_hello(0, 0, &hello),
            Err(WireError::FieldTooLong {
                field: "hello.auth",
                ..
            })
        ));
        assert!(Frame::Hello(wrong, hello).encode().is_err());
    }

    #[test]
    fn each_error() {
        let hello = &control_frames()[0];
        // Truncated header, then truncated payload: `needed` is the whole frame.
        assert_eq!(
            decode_frame(&hello[..10], MAX),
            Err(WireError::Truncated {
                needed: 56,
                got: 10
            })
        );
        assert_eq!(
            decode_frame(&hello[..60], MAX),
            Err(WireError::Truncated {
                needed: hello.len(),
                got: 60
            })
        );
        // Header errors come through.
        let mut bad = hello.clone();
        bad[0..4].copy_from_slice(b"HTTP");
        assert_eq!(decode_frame(&bad, MAX), Err(WireError::BadMagic(*b"HTTP")));
        assert!(matches!(
            decode_frame(hello, 10),
            Err(WireError::PayloadTooLarge { max: 10, .. })
        ));
        // Control frames have their own cap, whatever max_payload says.
        let big = Header::control(FrameKind::Abort, 0, 0, MAX_CONTROL_PAYLOAD + 1).encode();
        assert_eq!(
            decode_frame(&big, u32::MAX),
            Err(WireError::ControlPayloadTooLarge {
                kind: FrameKind::Abort,
                len: 4097,
                max: 4096
            })
        );
        let beat = Header::control(FrameKind::Heartbeat, 0, 0, 1).encode();
        assert_eq!(
            decode_frame(&beat, MAX),
            Err(WireError::UnexpectedPayload {
                kind: FrameKind::Heartbeat,
                len: 1
            })
        );
        // Payload errors come through; the payload is exactly payload_len bytes,
        // so bytes after it belong to the next frame and are not "trailing".
        let mut next = hello.clone();
        next.extend_from_slice(b"next frame");
        assert_eq!(decode_frame(&next, MAX).unwrap().1, hello.len());
        let payload = Hello::new(0xAB, 2, 4).encode().unwrap();
        let short = with_payload(
            Header::control(FrameKind::Handshake, 0, 0, 0),
            &payload[..payload.len() - 1],
        );
        assert!(matches!(
            decode_frame(&short, MAX),
            Err(WireError::PayloadTruncated { what: "hello", .. })
        ));
        let mut ack = encode_hello_ack(0, 0, &HelloAck::reject("ok?"));
        let (h, _) = decode_frame(&ack, MAX).unwrap();
        let last = h.header().payload_offset() + h.header().payload_len_usize() - 1;
        ack[last] = 0xfe;
        assert!(matches!(
            decode_frame(&ack, MAX),
            Err(WireError::InvalidUtf8 { .. })
        ));
        // The largest valid control payloads fit the control cap.
        let hello = Hello {
            auth: vec![1; MAX_AUTH_LEN],
            ..Hello::new(1, 1, 2)
        };
        let reason = "r".repeat(MAX_REASON_LEN);
        for bytes in [
            encode_hello(0, 0, &hello).unwrap(),
            encode_hello_ack(0, 0, &HelloAck::reject(reason.clone())),
            encode_abort(0, 0, &Abort::new(0, 0, reason)),
        ] {
            assert!(bytes.len() - HEADER_LEN <= MAX_CONTROL_PAYLOAD as usize);
            assert!(decode_frame(&bytes, MAX).is_ok());
        }
    }

    #[test]
    fn control_frames_are_padded_with_zeros_only() {
        let abort = Abort::new(1, 2, "x");
        let padded = with_payload(
            Header::control(FrameKind::Abort, 3, 4, 0).with_pad(5),
            &abort.encode(),
        );
        let (frame, used) = decode_frame(&padded, MAX).unwrap();
        assert_eq!(used, padded.len());
        assert_eq!(used, 128, "56 + 5 + 15 rounds up to two lines");
        assert_eq!(
            frame,
            Frame::Abort(
                Header::control(FrameKind::Abort, 3, 4, 15).with_pad(5),
                abort
            )
        );
        assert_eq!(frame.encode().unwrap(), padded);
        for at in [HEADER_LEN, HEADER_LEN + 4, used - 1] {
            let mut bad = padded.clone();
            bad[at] = 7;
            assert_eq!(
                decode_frame(&bad, MAX),
                Err(WireError::NonZeroReserved {
                    field: "frame padding",
                    value: 7
                }),
                "byte {at}"
            );
        }
        // A heartbeat is one line: its header and 8 zeros.
        assert_eq!(
            decode_frame(&encode_heartbeat(1, 2)[..HEADER_LEN], MAX),
            Err(WireError::Truncated {
                needed: 64,
                got: 56
            })
        );
    }

    #[test]
    fn mutated_frames_never_panic() {
        let mut rng = XorShift(0xD1B5_4A32_D192_ED03);
        let mut seeds = control_frames();
        seeds.push(
            Header::data(5, 6, OpKind::AllGather, DType::BF16)
                .with_payload_len(64)
                .encode()
                .to_vec(),
        );
        let mut ok = 0;
        for i in 0..30_000 {
            let mut bytes = seeds[i % seeds.len()].clone();
            rng.mutate(&mut bytes);
            if let Ok((frame, used)) = decode_frame(&bytes, MAX) {
                ok += 1;
                assert!(used <= bytes.len());
                assert_eq!(
                    frame.encode().unwrap(),
                    bytes[..used],
                    "canonical re-encoding"
                );
            }
        }
        assert!(ok > 0);
    }
}
