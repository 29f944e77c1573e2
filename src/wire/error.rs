//! [`WireError`]: everything that can be wrong with bytes from a peer.
//!
//! One enum for the whole wire module, so a transport can match on what went
//! wrong (e.g. retry a read on [`WireError::Truncated`], close the connection
//! on anything else). Each message says what was found, what was expected,
//! and where it helps, the likely cause.

use std::fmt;

use super::kind::FrameKind;

/// Why bytes from a peer could not be decoded, or why a peer's handshake was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the frame needs. From the frame decoder, `needed` is
    /// the whole frame's length: a streaming reader can read up to it and try
    /// again.
    #[error("truncated frame: need {needed} bytes, got {got}")]
    Truncated {
        /// Bytes the frame (or its header) needs.
        needed: usize,
        /// Bytes there were.
        got: usize,
    },

    /// The first four bytes are not ringwire's magic, `RGWR`.
    #[error(
        "frame header: bad magic {} (expected \"RGWR\"): this is not a ringwire peer",
        Magic(.0)
    )]
    BadMagic([u8; 4]),

    /// The peer speaks another protocol version.
    #[error(
        "protocol version {got} is not supported (this build speaks version {supported}): \
         run the same ringwire release on every rank"
    )]
    UnsupportedVersion {
        /// The peer's version.
        got: u16,
        /// This build's version.
        supported: u16,
    },

    /// A one-byte enumeration or flag has a value this protocol version does not define.
    #[error(
        "{field}: unknown value {value} (not defined by this protocol version: \
         a corrupt frame or a newer peer)"
    )]
    UnknownField {
        /// The field's name.
        field: &'static str,
        /// The value found.
        value: u8,
    },

    /// A reserved field is not zero.
    #[error("{field}: reserved field is {value:#x}, expected 0 (a corrupt frame or a newer peer)")]
    NonZeroReserved {
        /// The field's name.
        field: &'static str,
        /// The value found.
        value: u32,
    },

    /// The header's pad is a whole frame line or more.
    #[error(
        "frame header: pad of {pad} bytes, at most 63 allowed (a corrupt frame or a newer peer)"
    )]
    PadTooLong {
        /// The pad announced, in bytes.
        pad: u8,
    },

    /// The header announces a payload larger than the receiver accepts.
    #[error(
        "frame header: payload of {len} bytes exceeds the limit of {max} bytes \
         (raise the maximum message size on every rank, or the stream is corrupt)"
    )]
    PayloadTooLarge {
        /// The payload length announced.
        len: u32,
        /// The largest this receiver accepts.
        max: u32,
    },

    /// A control frame announces a payload larger than any valid one.
    #[error("{kind} frame: payload of {len} bytes exceeds the control-frame limit of {max} bytes")]
    ControlPayloadTooLarge {
        /// The control frame's kind.
        kind: FrameKind,
        /// The payload length announced.
        len: u32,
        /// The largest valid payload of a control frame.
        max: u32,
    },

    /// A frame of a kind that may not come at this point of the stream.
    #[error("unexpected {kind} frame ({expected})")]
    UnexpectedKind {
        /// The kind that came.
        kind: FrameKind,
        /// What was expected instead.
        expected: &'static str,
    },

    /// A frame kind that has no payload announces one.
    #[error("{kind} frame: announces a {len}-byte payload, but this kind has none")]
    UnexpectedPayload {
        /// The frame's kind.
        kind: FrameKind,
        /// The payload length announced.
        len: u32,
    },

    /// A control payload ends before its last field.
    #[error("{what} payload: truncated: need {needed} bytes, got {got}")]
    PayloadTruncated {
        /// Which payload.
        what: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes there were.
        got: usize,
    },

    /// A control payload has bytes after its last field.
    #[error("{what} payload: {extra} unexpected byte(s) after the last field")]
    TrailingBytes {
        /// Which payload.
        what: &'static str,
        /// How many bytes follow its last field.
        extra: usize,
    },

    /// A variable-length field is longer than its cap.
    #[error("{field}: length {len} exceeds the limit of {max} bytes")]
    FieldTooLong {
        /// The field's name.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The cap.
        max: usize,
    },

    /// A count differs from the one both sides must share (the members of
    /// an agreement's decision against the communicator's size).
    #[error("{field}: {got}, expected {expected} (a corrupt frame, or ranks of different jobs)")]
    CountMismatch {
        /// What was counted.
        field: &'static str,
        /// The count the peer sent.
        got: u32,
        /// The count this side has.
        expected: u32,
    },

    /// A text field is not UTF-8.
    #[error("{field}: not valid UTF-8")]
    InvalidUtf8 {
        /// The field's name.
        field: &'static str,
    },

    /// The peer's handshake names another job.
    #[error(
        "handshake: peer belongs to job {got:#018x}, expected {expected:#018x} \
         (two jobs share a rendezvous address, or a stale process from an earlier run is connecting)"
    )]
    JobMismatch {
        /// The peer's job id.
        got: u64,
        /// This rank's job id.
        expected: u64,
    },

    /// The peer's handshake names another world size.
    #[error(
        "handshake: peer thinks the world has {got} ranks, expected {expected} \
         (the ranks were launched with different world sizes)"
    )]
    WorldSizeMismatch {
        /// The peer's world size.
        got: u32,
        /// This rank's world size.
        expected: u32,
    },

    /// The peer claims a rank that does not exist.
    #[error("handshake: peer claims rank {rank}, but the world has ranks 0..{world_size}")]
    RankOutOfRange {
        /// The rank claimed.
        rank: u32,
        /// The world size.
        world_size: u32,
    },

    /// The peer claims this rank's own rank.
    #[error(
        "handshake: peer claims rank {rank}, which is this rank \
         (a rank dialed itself, or two processes were launched with the same rank)"
    )]
    SelfConnect {
        /// The rank claimed, this rank's own.
        rank: u32,
    },

    /// The peer stores numbers in the other byte order.
    #[error(
        "handshake: peer is {}-endian but this rank is {}-endian: \
         elements travel in native byte order, so every rank must have the same one",
        endian_name(*.peer_little_endian),
        endian_name(!*.peer_little_endian)
    )]
    EndiannessMismatch {
        /// Whether the peer is little-endian.
        peer_little_endian: bool,
    },
}

fn endian_name(little: bool) -> &'static str {
    if little { "little" } else { "big" }
}

/// Shows four magic bytes as hex and as escaped ASCII, e.g.
/// `0x47455420 (b"GET ")`, which often names the protocol that was reached instead.
struct Magic<'a>(&'a [u8; 4]);

impl fmt::Display for Magic<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "0x{:08x} (b\"{}\")",
            u32::from_be_bytes(*self.0),
            self.0.escape_ascii()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_and_why() {
        let e = WireError::BadMagic(*b"GET ");
        assert_eq!(
            e.to_string(),
            "frame header: bad magic 0x47455420 (b\"GET \") (expected \"RGWR\"): \
             this is not a ringwire peer"
        );
        let e = WireError::BadMagic([0, 0xff, b'\n', b'A']);
        assert!(
            e.to_string().contains("0x00ff0a41 (b\"\\x00\\xff\\nA\")"),
            "{e}"
        );
        let e = WireError::EndiannessMismatch {
            peer_little_endian: false,
        };
        assert!(
            e.to_string()
                .contains("peer is big-endian but this rank is little-endian"),
            "{e}"
        );
        let e = WireError::ControlPayloadTooLarge {
            kind: FrameKind::Abort,
            len: 5000,
            max: 4096,
        };
        assert!(
            e.to_string().starts_with("abort frame: payload of 5000"),
            "{e}"
        );
        let e = WireError::UnsupportedVersion {
            got: 2,
            supported: 1,
        };
        assert!(e.to_string().contains("version 2 is not supported"), "{e}");
    }
}
