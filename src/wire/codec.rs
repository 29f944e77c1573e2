//! Small checked readers and writers shared by the control payloads.
//!
//! Every payload is a fixed little-endian prefix (a zerocopy struct that ends
//! in a `U16` length) followed by that many bytes of one variable field. These
//! helpers keep the checks in one place: a prefix shorter than its struct, a
//! length over its cap, a length past the end of the payload, and trailing
//! bytes all become typed [`WireError`]s, and the variable field is only
//! copied (allocated) after its length has passed both checks.

use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, KnownLayout, Unaligned};

use super::WireError;

/// Splits the fixed prefix `T` off a payload.
pub(crate) fn split_fixed<'a, T>(
    what: &'static str,
    payload: &'a [u8],
) -> Result<(&'a T, &'a [u8]), WireError>
where
    T: FromBytes + KnownLayout + Immutable + Unaligned,
{
    T::ref_from_prefix(payload).map_err(|_| WireError::PayloadTruncated {
        what,
        needed: size_of::<T>(),
        got: payload.len(),
    })
}

/// Splits the variable field of `len` bytes off `rest`, which starts `offset`
/// bytes into the payload; then checks nothing follows it.
pub(crate) fn split_last_field<'a>(
    what: &'static str,
    field: &'static str,
    offset: usize,
    rest: &'a [u8],
    len: U16,
    max: usize,
) -> Result<&'a [u8], WireError> {
    let len = usize::from(len.get());
    if len > max {
        return Err(WireError::FieldTooLong { field, len, max });
    }
    let Some((value, trailing)) = rest.split_at_checked(len) else {
        return Err(WireError::PayloadTruncated {
            what,
            needed: offset.saturating_add(len),
            got: offset.saturating_add(rest.len()),
        });
    };
    if !trailing.is_empty() {
        return Err(WireError::TrailingBytes {
            what,
            extra: trailing.len(),
        });
    }
    Ok(value)
}

/// A wire boolean: exactly 0 or 1.
pub(crate) fn decode_bool(field: &'static str, byte: u8) -> Result<bool, WireError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(WireError::UnknownField { field, value }),
    }
}

/// Copies a UTF-8 field (already length-checked) into a `String`.
pub(crate) fn decode_str(field: &'static str, bytes: &[u8]) -> Result<String, WireError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| WireError::InvalidUtf8 { field })
}

/// The longest prefix of `s` that is at most `max` bytes and ends on a char boundary.
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The `U16` length of a field already capped to fit one.
pub(crate) fn len_u16(len: usize) -> U16 {
    debug_assert!(len <= usize::from(u16::MAX), "field length {len} over u16");
    U16::new(u16::try_from(len).unwrap_or(u16::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_on_char_boundary() {
        assert_eq!(truncate_str("héllo", 2), "h");
        assert_eq!(truncate_str("héllo", 3), "hé");
        assert_eq!(truncate_str("abc", 10), "abc");
        assert_eq!(truncate_str("€", 2), "");
    }

    #[test]
    fn last_field_checks() {
        fn f(rest: &[u8], len: u16) -> Result<&[u8], WireError> {
            split_last_field("t", "t.f", 4, rest, U16::new(len), 8)
        }
        assert_eq!(f(b"abc", 3), Ok(&b"abc"[..]));
        assert_eq!(
            f(b"abc", 9),
            Err(WireError::FieldTooLong {
                field: "t.f",
                len: 9,
                max: 8
            })
        );
        assert_eq!(
            f(b"abc", 5),
            Err(WireError::PayloadTruncated {
                what: "t",
                needed: 9,
                got: 7
            })
        );
        assert_eq!(
            f(b"abc", 1),
            Err(WireError::TrailingBytes {
                what: "t",
                extra: 2
            })
        );
    }
}
