//! The ringwire wire format: what goes over a TCP connection between two ranks.
//!
//! Every frame starts with a fixed 56-byte [`Header`] (all integers little
//! endian, no padding, no alignment requirement) that says what the frame is
//! ([`FrameKind`]), which communicator and collective it belongs to, and how
//! many payload bytes follow, after a pad of its own size; zero bytes end the
//! frame on a multiple of [`FRAME_ALIGN`]. Data frames carry a chunk of a user buffer, whose
//! bytes the transport reads straight into place; control frames
//! ([`Hello`], [`HelloAck`], [`Abort`], heartbeats) carry a small, self-describing
//! payload that this module decodes.
//!
//! Decoding is *total*: any byte string yields either a value or a typed
//! [`WireError`], never a panic, and nothing is allocated on the strength of a
//! length read from the wire until that length has been checked against a cap
//! and against the bytes actually present. The header's `payload_len` is checked
//! against a caller-chosen limit, and control payloads have a small fixed cap
//! of their own ([`MAX_CONTROL_PAYLOAD`]). Encoding is canonical: a decoded
//! frame re-encodes to exactly the bytes it was decoded from, which the fuzz
//! targets in `fuzz/` check.
//!
//! Layout:
//! - [`header`] holds the fixed frame header ([`RawHeader`] on the wire, [`Header`] validated);
//! - [`kind`] holds the [`FrameKind`] and [`OpKind`] bytes of the header;
//! - [`handshake`] holds the [`Hello`] / [`HelloAck`] exchanged right after connect;
//! - [`control`] holds the [`Abort`] payload (heartbeats have none);
//! - [`frame`] holds [`decode_frame`] over a whole frame, and the control-frame encoders;
//! - [`error`] holds [`WireError`].

mod codec;
pub mod control;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod header;
pub mod kind;

pub use control::Abort;
pub use error::WireError;
pub use frame::{encode_abort, encode_heartbeat};
// The total decoder of whole frames (fuzzed) and the hello encoders serve
// the tests and fuzz targets; links parse headers and payloads in place.
#[cfg(any(test, feature = "internals"))]
pub use frame::{Frame, decode_frame, encode_hello, encode_hello_ack};
pub use handshake::{Channel, Hello, HelloAck, validate_hello};
pub use header::{Header, RawHeader, aligning_pad};
#[cfg(any(test, feature = "internals"))]
pub use header::trail_len;
pub use kind::{FrameKind, OpKind};

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"RGWR";

/// The protocol version this build speaks, carried in every header and in [`Hello`].
/// Version 2 added the header's `pad` and whole 64-byte frames (decision 0016);
/// version 3 the hello's channel and the ack's lanes (decision 0018);
/// version 4 several lanes each way, numbered in the hello, and laned
/// payloads as pieces that name their frame and offset (decision 0034);
/// version 5 the hello's incarnation (decision 0040).
pub const PROTOCOL_VERSION: u16 = 5;

/// Most lanes a link has each way (decision 0034).
pub const MAX_LANES: u8 = 8;

/// Size of the fixed frame header in bytes (56).
pub const HEADER_LEN: usize = size_of::<RawHeader>();

/// Every frame is a whole number of these bytes, and the header's `pad` is
/// below it (see [`header`]).
pub const FRAME_ALIGN: usize = 64;

/// Largest `auth` field a [`Hello`] may carry, in bytes.
pub const MAX_AUTH_LEN: usize = 512;

/// Largest human-readable `reason` a [`HelloAck`] or [`Abort`] may carry, in bytes.
pub const MAX_REASON_LEN: usize = 1024;

/// Largest payload of a control frame (handshake, ack, abort), whatever limit
/// the caller sets for data frames. Every valid control payload fits well
/// inside it.
pub const MAX_CONTROL_PAYLOAD: u32 = 4096;

const _: () = assert!(HEADER_LEN == 56, "the frame header is 56 bytes on the wire");
