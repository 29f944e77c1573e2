//! Control payloads outside the handshake: [`Abort`], which a rank sends to
//! its peers when it gives up on a communicator, so that they fail fast with
//! the original cause instead of timing out. Heartbeats carry no payload: a
//! heartbeat is a header of kind `Heartbeat` with `payload_len` 0.
//!
//! Wire layout (little endian, no padding):
//!
//! ```text
//! Abort: origin_rank u32 | seq u64 | reason_len u16 | reason [reason_len] (UTF-8)
//! ```

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::codec::{decode_str, len_u16, split_fixed, split_last_field, truncate_str};
use super::{MAX_REASON_LEN, WireError};

/// A rank abandons the communicator.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Abort {
    /// The rank where the failure happened (which may not be the sender, when
    /// an abort is forwarded).
    pub origin_rank: u32,
    /// Sequence number of the collective that failed.
    pub seq: u64,
    /// What went wrong, for the log. At most [`MAX_REASON_LEN`] bytes on the
    /// wire: [`Abort::encode`] truncates longer ones.
    pub reason: String,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawAbort {
    origin_rank: U32,
    seq: U64,
    reason_len: U16,
}

impl Abort {
    pub fn new(origin_rank: u32, seq: u64, reason: impl Into<String>) -> Abort {
        Abort {
            origin_rank,
            seq,
            reason: reason.into(),
        }
    }

    /// The payload bytes; a reason over [`MAX_REASON_LEN`] bytes is cut at
    /// the last character boundary that fits.
    pub fn encode(&self) -> Vec<u8> {
        let reason = truncate_str(&self.reason, MAX_REASON_LEN);
        let raw = RawAbort {
            origin_rank: U32::new(self.origin_rank),
            seq: U64::new(self.seq),
            reason_len: len_u16(reason.len()),
        };
        let mut out = Vec::with_capacity(size_of::<RawAbort>() + reason.len());
        out.extend_from_slice(raw.as_bytes());
        out.extend_from_slice(reason.as_bytes());
        out
    }

    /// Decodes a payload; exactly the payload, no trailing bytes. The reason
    /// must be UTF-8.
    pub fn decode(payload: &[u8]) -> Result<Abort, WireError> {
        let (raw, rest) = split_fixed::<RawAbort>("abort", payload)?;
        let reason = split_last_field(
            "abort",
            "abort.reason",
            size_of::<RawAbort>(),
            rest,
            raw.reason_len,
            MAX_REASON_LEN,
        )?;
        Ok(Abort {
            origin_rank: raw.origin_rank.get(),
            seq: raw.seq.get(),
            reason: decode_str("abort.reason", reason)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::header::tests::XorShift;

    #[test]
    fn layout_and_round_trip() {
        let abort = Abort::new(5, 0x0102_0304_0506_0708, "timeout");
        let bytes = abort.encode();
        assert_eq!(size_of::<RawAbort>(), 14);
        assert_eq!(bytes[0..4], 5u32.to_le_bytes());
        assert_eq!(bytes[4..12], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(bytes[12..14], 7u16.to_le_bytes());
        assert_eq!(&bytes[14..], b"timeout");
        assert_eq!(Abort::decode(&bytes), Ok(abort));
        for abort in [
            Abort::new(0, 0, ""),
            Abort::new(u32::MAX, u64::MAX, "é".repeat(MAX_REASON_LEN / 2)),
        ] {
            assert_eq!(Abort::decode(&abort.encode()), Ok(abort));
        }
        let long = Abort::new(1, 2, "y".repeat(5000));
        assert_eq!(
            Abort::decode(&long.encode()).unwrap().reason.len(),
            MAX_REASON_LEN
        );
    }

    #[test]
    fn each_error() {
        let valid = Abort::new(1, 2, "peer 3 reset the connection").encode();
        assert_eq!(
            Abort::decode(&valid[..13]),
            Err(WireError::PayloadTruncated {
                what: "abort",
                needed: 14,
                got: 13
            })
        );
        assert_eq!(
            Abort::decode(&valid[..20]),
            Err(WireError::PayloadTruncated {
                what: "abort",
                needed: valid.len(),
                got: 20
            })
        );
        let mut trailing = valid.clone();
        trailing.push(b'x');
        assert_eq!(
            Abort::decode(&trailing),
            Err(WireError::TrailingBytes {
                what: "abort",
                extra: 1
            })
        );
        let mut huge = valid.clone();
        huge[12..14].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            Abort::decode(&huge),
            Err(WireError::FieldTooLong {
                field: "abort.reason",
                len: 65535,
                max: MAX_REASON_LEN
            })
        );
        let mut bad_utf8 = valid.clone();
        bad_utf8[14] = 0xc3; // a lead byte followed by ASCII
        assert_eq!(
            Abort::decode(&bad_utf8),
            Err(WireError::InvalidUtf8 {
                field: "abort.reason"
            })
        );
    }

    #[test]
    fn mutated_payloads_never_panic() {
        let mut rng = XorShift(0xA076_1D64_78BD_642F);
        let valid = Abort::new(2, 99, "rank 2: out of memory").encode();
        for _ in 0..20_000 {
            let mut bytes = valid.clone();
            rng.mutate(&mut bytes);
            if let Ok(abort) = Abort::decode(&bytes) {
                assert_eq!(abort.encode(), bytes, "abort re-encodes exactly");
            }
        }
    }
}
