//! Wire format of the rendezvous store: how requests and responses are framed
//! and encoded as bytes.
//!
//! This module does no I/O. The server and client read bytes from their
//! sockets and hand them to [`decode_request`] / [`decode_response`]; the
//! decoders are total (any input gives a value or a [`ProtocolError`], never a
//! panic) so they can be fed hostile bytes directly, e.g. from a fuzz target.
//!
//! # Framing
//!
//! Every message is a frame: a `u32` little-endian body length, then the body.
//! Within a body, byte strings are a `u32` LE length followed by the bytes, and
//! numbers are fixed-width little-endian (`u64` timeouts, `i64` deltas).
//!
//! A request body is a command byte followed by that command's fields:
//!
//! | command        | byte | fields                                        |
//! |----------------|------|-----------------------------------------------|
//! | `Set`          | 1    | key, value                                    |
//! | `Get`          | 2    | key, timeout_ms: u64                          |
//! | `TryGet`       | 3    | key                                           |
//! | `Add`          | 4    | key, delta: i64                               |
//! | `CompareSet`   | 5    | key, expected, desired                        |
//! | `Delete`       | 6    | key                                           |
//! | `Wait`         | 7    | count: u32, count keys, timeout_ms: u64       |
//! | `NumKeys`      | 8    | (none)                                        |
//!
//! A response body is a tag byte saying both the status and the shape of the
//! payload:
//!
//! | response       | byte | payload                                       |
//! |----------------|------|-----------------------------------------------|
//! | `Done`         | 0    | (none): ok, nothing to return                 |
//! | `Value`        | 1    | bytes: ok, a stored value                     |
//! | `Int`          | 2    | i64: ok, the result of an add                 |
//! | `Bool`         | 3    | u8 0 or 1: ok, whether a delete removed a key |
//! | `Count`        | 4    | u64: ok, the number of keys                   |
//! | `NotFound`     | 5    | (none)                                        |
//! | `Timeout`      | 6    | count: u32, count keys still missing          |
//! | `Error`        | 7    | message (UTF-8)                               |
//!
//! # Limits
//!
//! Keys are at most [`MAX_KEY_LEN`] bytes, values at most [`MAX_VALUE_LEN`]
//! bytes and a wait names at most [`MAX_KEYS_IN_WAIT`] keys. The decoders check
//! a frame's declared length against [`MAX_REQUEST_BODY`] /
//! [`MAX_RESPONSE_BODY`] as soon as the 4-byte header is in, and every field
//! length against its cap before anything is allocated, so a hostile length
//! can neither make a reader allocate a huge buffer nor wait for gigabytes.

use thiserror::Error;

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// Longest value, in bytes (64 MiB).
pub const MAX_VALUE_LEN: usize = 64 * 1024 * 1024;
/// Most keys one `Wait` request (or `Timeout` response) may name.
pub const MAX_KEYS_IN_WAIT: usize = 4096;
/// Longest error message in an `Error` response, in bytes. Longer messages are
/// cut (at a character boundary) when encoded.
pub const MAX_ERROR_LEN: usize = 64 * 1024;
/// Length of the frame header (the `u32` body length).
pub const HEADER_LEN: usize = 4;

/// Largest request body: a `CompareSet` with a maximal key and two maximal
/// values.
pub const MAX_REQUEST_BODY: usize = 1 + (4 + MAX_KEY_LEN) + 2 * (4 + MAX_VALUE_LEN);

/// Largest response body: a `Value` of maximal length (larger than a maximal
/// `Timeout` key list or `Error` message; checked at compile time below).
pub const MAX_RESPONSE_BODY: usize = 1 + 4 + MAX_VALUE_LEN;

const MAX_WAIT_BODY: usize = 1 + 4 + MAX_KEYS_IN_WAIT * (4 + MAX_KEY_LEN) + 8;
const _: () = assert!(MAX_WAIT_BODY <= MAX_REQUEST_BODY);
const _: () = assert!(1 + 4 + MAX_KEYS_IN_WAIT * (4 + MAX_KEY_LEN) <= MAX_RESPONSE_BODY);
const _: () = assert!(1 + 4 + MAX_ERROR_LEN <= MAX_RESPONSE_BODY);
// Body lengths travel as u32.
const _: () = assert!(MAX_REQUEST_BODY <= u32::MAX as usize);

/// Why bytes could not be decoded (or a message could not be encoded).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A frame header declares a body longer than any valid message.
    #[error(
        "store message declares a body of {len} bytes, over the limit of {cap} bytes \
         (is the peer a ringwire store client/server of the same version?)"
    )]
    FrameTooLarge {
        /// The length declared.
        len: u64,
        /// The limit.
        cap: usize,
    },
    /// A key, value, key list or message exceeds its cap.
    #[error("{what} {len} exceeds the limit of {cap}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        cap: usize,
    },
    /// The command byte of a request is not one this version knows.
    #[error("unknown store command byte {0:#04x} (is the peer a ringwire store client?)")]
    UnknownCommand(u8),
    /// The tag byte of a response is not one this version knows.
    #[error("unknown store response byte {0:#04x} (is the peer a ringwire store server?)")]
    UnknownResponse(u8),
    /// A field runs past the end of its frame.
    #[error("store message ends in the middle of its {what}")]
    Truncated {
        /// The field cut short.
        what: &'static str,
    },
    /// A frame has bytes left over after its last field.
    #[error("store message has {extra} unexpected bytes after its last field")]
    TrailingBytes {
        /// How many bytes are left over.
        extra: usize,
    },
    /// A key is not valid UTF-8.
    #[error("{what} is not valid UTF-8")]
    NotUtf8 {
        /// The field.
        what: &'static str,
    },
    /// A boolean byte is neither 0 nor 1.
    #[error("store message has {0} where a boolean (0 or 1) belongs")]
    BadBool(u8),
    /// The response is well-formed but does not answer the request sent.
    #[error("store answered a {request} request with a {response} response")]
    UnexpectedResponse {
        /// The request sent.
        request: &'static str,
        /// The response that came.
        response: &'static str,
    },
}

/// A request from a client to the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Store `value` under `key`, replacing any previous value.
    Set { key: String, value: Vec<u8> },
    /// Wait until `key` exists (or `timeout_ms` passes), then return its value.
    Get { key: String, timeout_ms: u64 },
    /// Return the value of `key` if it exists, without waiting.
    TryGet { key: String },
    /// Add `delta` to the decimal integer stored at `key` (missing counts as
    /// 0) and return the new value.
    Add { key: String, delta: i64 },
    /// Set `key` to `desired` if its value is `expected` (or if it is missing
    /// and `expected` is empty); return the value stored afterwards.
    CompareSet {
        key: String,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    /// Remove `key`; answers whether it existed.
    Delete { key: String },
    /// Wait until every key exists (or `timeout_ms` passes).
    Wait { keys: Vec<String>, timeout_ms: u64 },
    /// Count the keys in the store.
    NumKeys,
}

/// A response from the store to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// Success with nothing to return (`Set`, `Wait`).
    Done,
    /// Success with a value (`Get`, `TryGet`, `CompareSet`).
    Value(Vec<u8>),
    /// Success with the new value of an `Add`.
    Int(i64),
    /// Success with whether a `Delete` removed a key.
    Bool(bool),
    /// Success with the number of keys (`NumKeys`).
    Count(u64),
    /// `TryGet` of a missing key.
    NotFound,
    /// A `Get` or `Wait` timed out; these keys were still missing.
    Timeout { missing: Vec<String> },
    /// The request was refused or malformed.
    Error(String),
}

const CMD_SET: u8 = 1;
const CMD_GET: u8 = 2;
const CMD_TRY_GET: u8 = 3;
const CMD_ADD: u8 = 4;
const CMD_COMPARE_SET: u8 = 5;
const CMD_DELETE: u8 = 6;
const CMD_WAIT: u8 = 7;
const CMD_NUM_KEYS: u8 = 8;

const RESP_DONE: u8 = 0;
const RESP_VALUE: u8 = 1;
const RESP_INT: u8 = 2;
const RESP_BOOL: u8 = 3;
const RESP_COUNT: u8 = 4;
const RESP_NOT_FOUND: u8 = 5;
const RESP_TIMEOUT: u8 = 6;
const RESP_ERROR: u8 = 7;

impl Request {
    /// The command's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Set { .. } => "set",
            Request::Get { .. } => "get",
            Request::TryGet { .. } => "try_get",
            Request::Add { .. } => "add",
            Request::CompareSet { .. } => "compare_set",
            Request::Delete { .. } => "delete",
            Request::Wait { .. } => "wait",
            Request::NumKeys => "num_keys",
        }
    }

    /// The keys this request waits for and for how long, if it waits.
    pub fn awaited_keys(&self) -> Option<(&[String], u64)> {
        match self {
            Request::Get { key, timeout_ms } => Some((std::slice::from_ref(key), *timeout_ms)),
            Request::Wait { keys, timeout_ms } => Some((keys, *timeout_ms)),
            _ => None,
        }
    }

    fn command(&self) -> u8 {
        match self {
            Request::Set { .. } => CMD_SET,
            Request::Get { .. } => CMD_GET,
            Request::TryGet { .. } => CMD_TRY_GET,
            Request::Add { .. } => CMD_ADD,
            Request::CompareSet { .. } => CMD_COMPARE_SET,
            Request::Delete { .. } => CMD_DELETE,
            Request::Wait { .. } => CMD_WAIT,
            Request::NumKeys => CMD_NUM_KEYS,
        }
    }

    /// Checks every field against its cap.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        match self {
            Request::Set { key, value } => {
                check_key(key)?;
                check_len("value length", value.len(), MAX_VALUE_LEN)
            }
            Request::Get { key, .. }
            | Request::TryGet { key }
            | Request::Add { key, .. }
            | Request::Delete { key } => check_key(key),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                check_key(key)?;
                check_len("expected value length", expected.len(), MAX_VALUE_LEN)?;
                check_len("desired value length", desired.len(), MAX_VALUE_LEN)
            }
            Request::Wait { keys, .. } => {
                check_len("number of keys in one wait", keys.len(), MAX_KEYS_IN_WAIT)?;
                keys.iter().try_for_each(|k| check_key(k))
            }
            Request::NumKeys => Ok(()),
        }
    }

    /// Appends this request as one frame to `out`. On error (a field over its
    /// cap) nothing is appended.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        self.validate()?;
        let start = begin_frame(out);
        out.push(self.command());
        match self {
            Request::Set { key, value } => {
                put_bytes(out, key.as_bytes());
                put_bytes(out, value);
            }
            Request::Get { key, timeout_ms } => {
                put_bytes(out, key.as_bytes());
                out.extend_from_slice(&timeout_ms.to_le_bytes());
            }
            Request::TryGet { key } | Request::Delete { key } => put_bytes(out, key.as_bytes()),
            Request::Add { key, delta } => {
                put_bytes(out, key.as_bytes());
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_bytes(out, key.as_bytes());
                put_bytes(out, expected);
                put_bytes(out, desired);
            }
            Request::Wait { keys, timeout_ms } => {
                put_keys(out, keys);
                out.extend_from_slice(&timeout_ms.to_le_bytes());
            }
            Request::NumKeys => {}
        }
        finish_frame(out, start);
        Ok(())
    }
}

impl Response {
    /// The response's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Response::Done => "done",
            Response::Value(_) => "value",
            Response::Int(_) => "integer",
            Response::Bool(_) => "boolean",
            Response::Count(_) => "count",
            Response::NotFound => "not-found",
            Response::Timeout { .. } => "timeout",
            Response::Error(_) => "error",
        }
    }

    /// Appends this response as one frame to `out`. An over-long `Error`
    /// message is cut to [`MAX_ERROR_LEN`]; an over-long value or key list is
    /// an error, and then nothing is appended.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        match self {
            Response::Value(v) => check_len("value length", v.len(), MAX_VALUE_LEN)?,
            Response::Timeout { missing } => {
                check_len(
                    "number of keys in one wait",
                    missing.len(),
                    MAX_KEYS_IN_WAIT,
                )?;
                missing.iter().try_for_each(|k| check_key(k))?;
            }
            _ => {}
        }
        let start = begin_frame(out);
        match self {
            Response::Done => out.push(RESP_DONE),
            Response::Value(v) => {
                out.push(RESP_VALUE);
                put_bytes(out, v);
            }
            Response::Int(i) => {
                out.push(RESP_INT);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Response::Bool(b) => {
                out.push(RESP_BOOL);
                out.push(u8::from(*b));
            }
            Response::Count(n) => {
                out.push(RESP_COUNT);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Response::NotFound => out.push(RESP_NOT_FOUND),
            Response::Timeout { missing } => {
                out.push(RESP_TIMEOUT);
                put_keys(out, missing);
            }
            Response::Error(msg) => {
                out.push(RESP_ERROR);
                put_bytes(out, truncate_at_char(msg, MAX_ERROR_LEN).as_bytes());
            }
        }
        finish_frame(out, start);
        Ok(())
    }
}

/// Encodes `req` as a new frame.
pub fn encode_request(req: &Request) -> Result<Vec<u8>, ProtocolError> {
    let mut out = Vec::new();
    req.encode(&mut out)?;
    Ok(out)
}

// The server writes responses in place; tests and the fuzz target use this.
#[cfg(any(test, feature = "internals"))]
/// Encodes `resp` as a new frame.
pub fn encode_response(resp: &Response) -> Result<Vec<u8>, ProtocolError> {
    let mut out = Vec::new();
    resp.encode(&mut out)?;
    Ok(out)
}

/// The total length (header plus body) of the request frame starting at
/// `buf[0]`, once its header is in: `Ok(None)` means fewer than
/// [`HEADER_LEN`] bytes are available. Fails if the declared body is over
/// [`MAX_REQUEST_BODY`], so a reader can refuse a hostile length before
/// buffering anything.
pub fn request_frame_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
    frame_len(buf, MAX_REQUEST_BODY)
}

/// Like [`request_frame_len`] for response frames (cap
/// [`MAX_RESPONSE_BODY`]).
pub fn response_frame_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
    frame_len(buf, MAX_RESPONSE_BODY)
}

/// Decodes the request frame at the start of `buf`.
///
/// Returns `Ok(None)` if `buf` holds only part of a frame (read more and call
/// again), or the request and the number of bytes it used. Errors are final:
/// the stream cannot be resynchronised and should be closed. A hostile frame
/// length or unknown command is reported as soon as the first 5 bytes are in.
pub fn decode_request(buf: &[u8]) -> Result<Option<(Request, usize)>, ProtocolError> {
    let Some(total) = request_frame_len(buf)? else {
        return Ok(None);
    };
    match buf.get(HEADER_LEN) {
        Some(&cmd) if !(CMD_SET..=CMD_NUM_KEYS).contains(&cmd) => {
            return Err(ProtocolError::UnknownCommand(cmd));
        }
        _ => {}
    }
    let Some(body) = buf.get(HEADER_LEN..total) else {
        return Ok(None);
    };
    let mut r = Reader { buf: body };
    let req = match r.u8("command")? {
        CMD_SET => Request::Set {
            key: r.key()?,
            value: r.bytes("value length", MAX_VALUE_LEN)?.to_vec(),
        },
        CMD_GET => Request::Get {
            key: r.key()?,
            timeout_ms: r.u64("timeout")?,
        },
        CMD_TRY_GET => Request::TryGet { key: r.key()? },
        CMD_ADD => Request::Add {
            key: r.key()?,
            delta: r.i64("delta")?,
        },
        CMD_COMPARE_SET => Request::CompareSet {
            key: r.key()?,
            expected: r.bytes("expected value length", MAX_VALUE_LEN)?.to_vec(),
            desired: r.bytes("desired value length", MAX_VALUE_LEN)?.to_vec(),
        },
        CMD_DELETE => Request::Delete { key: r.key()? },
        CMD_WAIT => Request::Wait {
            keys: r.keys()?,
            timeout_ms: r.u64("timeout")?,
        },
        CMD_NUM_KEYS => Request::NumKeys,
        other => return Err(ProtocolError::UnknownCommand(other)),
    };
    r.finish()?;
    Ok(Some((req, total)))
}

/// Decodes the response frame at the start of `buf`; see [`decode_request`]
/// for the contract.
pub fn decode_response(buf: &[u8]) -> Result<Option<(Response, usize)>, ProtocolError> {
    let Some(total) = response_frame_len(buf)? else {
        return Ok(None);
    };
    match buf.get(HEADER_LEN) {
        Some(&tag) if tag > RESP_ERROR => return Err(ProtocolError::UnknownResponse(tag)),
        _ => {}
    }
    let Some(body) = buf.get(HEADER_LEN..total) else {
        return Ok(None);
    };
    let mut r = Reader { buf: body };
    let resp = match r.u8("response tag")? {
        RESP_DONE => Response::Done,
        RESP_VALUE => Response::Value(r.bytes("value length", MAX_VALUE_LEN)?.to_vec()),
        RESP_INT => Response::Int(r.i64("integer")?),
        RESP_BOOL => match r.u8("boolean")? {
            0 => Response::Bool(false),
            1 => Response::Bool(true),
            other => return Err(ProtocolError::BadBool(other)),
        },
        RESP_COUNT => Response::Count(r.u64("count")?),
        RESP_NOT_FOUND => Response::NotFound,
        RESP_TIMEOUT => Response::Timeout { missing: r.keys()? },
        RESP_ERROR => {
            let msg = r.bytes("error message length", MAX_ERROR_LEN)?;
            Response::Error(String::from_utf8_lossy(msg).into_owned())
        }
        other => return Err(ProtocolError::UnknownResponse(other)),
    };
    r.finish()?;
    Ok(Some((resp, total)))
}

fn frame_len(buf: &[u8], cap: usize) -> Result<Option<usize>, ProtocolError> {
    let Some(header) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*header);
    match usize::try_from(len) {
        Ok(len) if len <= cap => Ok(Some(HEADER_LEN + len)),
        _ => Err(ProtocolError::FrameTooLarge {
            len: u64::from(len),
            cap,
        }),
    }
}

fn check_len(what: &'static str, len: usize, cap: usize) -> Result<(), ProtocolError> {
    if len > cap {
        return Err(ProtocolError::TooLarge { what, len, cap });
    }
    Ok(())
}

fn check_key(key: &str) -> Result<(), ProtocolError> {
    check_len("key length", key.len(), MAX_KEY_LEN)
}

/// Reserves the header and returns where the frame starts.
fn begin_frame(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    start
}

/// Fills in the header reserved by [`begin_frame`]. Callers have checked every
/// field against its cap, so the body fits in a u32 (see the const asserts).
fn finish_frame(out: &mut [u8], start: usize) {
    let body = out.len() - start - HEADER_LEN;
    let len = u32::try_from(body).unwrap_or(u32::MAX);
    out[start..start + HEADER_LEN].copy_from_slice(&len.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Lengths are capped far below u32::MAX by `validate`.
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_keys(out: &mut Vec<u8>, keys: &[String]) {
    let count = u32::try_from(keys.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for key in keys {
        put_bytes(out, key.as_bytes());
    }
}

fn truncate_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A cursor over one complete frame body.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtocolError> {
        if n > self.buf.len() {
            return Err(ProtocolError::Truncated { what });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtocolError> {
        let Some((head, tail)) = self.buf.split_first_chunk::<N>() else {
            return Err(ProtocolError::Truncated { what });
        };
        self.buf = tail;
        Ok(*head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, ProtocolError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, ProtocolError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed byte string whose length is checked against `cap`
    /// before it is taken.
    fn bytes(&mut self, what: &'static str, cap: usize) -> Result<&'a [u8], ProtocolError> {
        let len = self.u32(what)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        check_len(what, len, cap)?;
        self.take(len, what)
    }

    fn key(&mut self) -> Result<String, ProtocolError> {
        let bytes = self.bytes("key length", MAX_KEY_LEN)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(ProtocolError::NotUtf8 { what: "key" }),
        }
    }

    fn keys(&mut self) -> Result<Vec<String>, ProtocolError> {
        let count = self.u32("number of keys in one wait")?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        check_len("number of keys in one wait", count, MAX_KEYS_IN_WAIT)?;
        let mut keys = Vec::with_capacity(count);
        for _ in 0..count {
            keys.push(self.key()?);
        }
        Ok(keys)
    }

    fn finish(self) -> Result<(), ProtocolError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::TrailingBytes {
                extra: self.buf.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Set {
                key: "k".into(),
                value: b"v\0\xff".to_vec(),
            },
            Request::Set {
                key: String::new(),
                value: Vec::new(),
            },
            Request::Get {
                key: "rank/3/addr".into(),
                timeout_ms: 1500,
            },
            Request::TryGet { key: "é".into() },
            Request::Add {
                key: "counter".into(),
                delta: -7,
            },
            Request::CompareSet {
                key: "leader".into(),
                expected: Vec::new(),
                desired: b"2".to_vec(),
            },
            Request::Delete { key: "x".into() },
            Request::Wait {
                keys: vec!["a".into(), "b".into(), String::new()],
                timeout_ms: u64::MAX,
            },
            Request::Wait {
                keys: Vec::new(),
                timeout_ms: 0,
            },
            Request::NumKeys,
        ]
    }

    fn all_responses() -> Vec<Response> {
        vec![
            Response::Done,
            Response::Value(b"hello".to_vec()),
            Response::Value(Vec::new()),
            Response::Int(i64::MIN),
            Response::Bool(true),
            Response::Bool(false),
            Response::Count(42),
            Response::NotFound,
            Response::Timeout {
                missing: vec!["a".into(), "b".into()],
            },
            Response::Error("something broke".into()),
        ]
    }

    #[test]
    fn requests_round_trip() {
        for req in all_requests() {
            let bytes = encode_request(&req).unwrap();
            assert_eq!(request_frame_len(&bytes), Ok(Some(bytes.len())));
            assert_eq!(decode_request(&bytes), Ok(Some((req.clone(), bytes.len()))));
            // Every strict prefix is "need more bytes", never an error.
            for cut in 0..bytes.len() {
                assert_eq!(
                    decode_request(&bytes[..cut]),
                    Ok(None),
                    "{req:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn responses_round_trip() {
        for resp in all_responses() {
            let bytes = encode_response(&resp).unwrap();
            assert_eq!(
                decode_response(&bytes),
                Ok(Some((resp.clone(), bytes.len())))
            );
            for cut in 0..bytes.len() {
                assert_eq!(
                    decode_response(&bytes[..cut]),
                    Ok(None),
                    "{resp:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn back_to_back_frames_decode_one_at_a_time() {
        let mut buf = Vec::new();
        for req in all_requests() {
            req.encode(&mut buf).unwrap();
        }
        let mut rest = &buf[..];
        let mut decoded = Vec::new();
        while let Some((req, used)) = decode_request(rest).unwrap() {
            decoded.push(req);
            rest = &rest[used..];
        }
        assert!(rest.is_empty());
        assert_eq!(decoded, all_requests());
    }

    #[test]
    fn hostile_frame_length_is_refused_from_the_header_alone() {
        let header = u32::MAX.to_le_bytes();
        assert_eq!(
            decode_request(&header),
            Err(ProtocolError::FrameTooLarge {
                len: u64::from(u32::MAX),
                cap: MAX_REQUEST_BODY
            })
        );
        let just_over = u32::try_from(MAX_RESPONSE_BODY + 1).unwrap().to_le_bytes();
        assert!(matches!(
            decode_response(&just_over),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn unknown_command_and_response_are_refused_early() {
        // Declares a 100-byte body but only the tag is here.
        let mut buf = 100u32.to_le_bytes().to_vec();
        buf.push(0xee);
        assert_eq!(
            decode_request(&buf),
            Err(ProtocolError::UnknownCommand(0xee))
        );
        assert_eq!(
            decode_response(&buf),
            Err(ProtocolError::UnknownResponse(0xee))
        );
        buf[4] = 0;
        assert_eq!(decode_request(&buf), Err(ProtocolError::UnknownCommand(0)));
    }

    #[test]
    fn empty_body_is_truncated() {
        let buf = 0u32.to_le_bytes();
        assert_eq!(
            decode_request(&buf),
            Err(ProtocolError::Truncated { what: "command" })
        );
        assert_eq!(
            decode_response(&buf),
            Err(ProtocolError::Truncated {
                what: "response tag"
            })
        );
    }

    /// A frame with the given body.
    fn frame(body: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn field_running_past_the_frame_is_truncated() {
        // Set whose key claims 10 bytes but the body ends after 2.
        let mut body = vec![CMD_SET];
        body.extend_from_slice(&10u32.to_le_bytes());
        body.extend_from_slice(b"ab");
        assert_eq!(
            decode_request(&frame(&body)),
            Err(ProtocolError::Truncated { what: "key length" })
        );
        // Get missing its timeout.
        let mut body = vec![CMD_GET];
        body.extend_from_slice(&1u32.to_le_bytes());
        body.push(b'k');
        body.extend_from_slice(&[1, 2, 3]);
        assert_eq!(
            decode_request(&frame(&body)),
            Err(ProtocolError::Truncated { what: "timeout" })
        );
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = encode_request(&Request::NumKeys).unwrap();
        bytes.extend_from_slice(&[9, 9]);
        bytes[..4].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            decode_request(&bytes),
            Err(ProtocolError::TrailingBytes { extra: 2 })
        );
        let mut bytes = encode_response(&Response::Int(5)).unwrap();
        bytes.push(0);
        bytes[..4].copy_from_slice(&10u32.to_le_bytes());
        assert_eq!(
            decode_response(&bytes),
            Err(ProtocolError::TrailingBytes { extra: 1 })
        );
    }

    #[test]
    fn oversized_fields_are_refused_before_allocation() {
        // A key length over the cap inside an otherwise short frame.
        let mut body = vec![CMD_TRY_GET];
        body.extend_from_slice(&u32::try_from(MAX_KEY_LEN + 1).unwrap().to_le_bytes());
        assert_eq!(
            decode_request(&frame(&body)),
            Err(ProtocolError::TooLarge {
                what: "key length",
                len: MAX_KEY_LEN + 1,
                cap: MAX_KEY_LEN
            })
        );
        // A value length over the cap.
        let mut body = vec![CMD_SET];
        body.extend_from_slice(&1u32.to_le_bytes());
        body.push(b'k');
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_request(&frame(&body)),
            Err(ProtocolError::TooLarge {
                what: "value length",
                ..
            })
        ));
        // A wait with too many keys.
        let mut body = vec![CMD_WAIT];
        body.extend_from_slice(&u32::try_from(MAX_KEYS_IN_WAIT + 1).unwrap().to_le_bytes());
        assert!(matches!(
            decode_request(&frame(&body)),
            Err(ProtocolError::TooLarge {
                what: "number of keys in one wait",
                ..
            })
        ));
        // An error message over its cap.
        let mut body = vec![RESP_ERROR];
        body.extend_from_slice(&u32::try_from(MAX_ERROR_LEN + 1).unwrap().to_le_bytes());
        assert!(matches!(
            decode_response(&frame(&body)),
            Err(ProtocolError::TooLarge {
                what: "error message length",
                ..
            })
        ));
    }

    #[test]
    fn encoders_refuse_oversized_fields_and_append_nothing() {
        let mut out = vec![1, 2, 3];
        let long_key = "k".repeat(MAX_KEY_LEN + 1);
        let cases = [
            Request::TryGet {
                key: long_key.clone(),
            },
            Request::Set {
                key: "k".into(),
                value: vec![0; MAX_VALUE_LEN + 1],
            },
            Request::CompareSet {
                key: "k".into(),
                expected: Vec::new(),
                desired: vec![0; MAX_VALUE_LEN + 1],
            },
            Request::Wait {
                keys: vec![String::new(); MAX_KEYS_IN_WAIT + 1],
                timeout_ms: 1,
            },
            Request::Wait {
                keys: vec![long_key],
                timeout_ms: 1,
            },
        ];
        for req in cases {
            assert!(matches!(
                req.encode(&mut out),
                Err(ProtocolError::TooLarge { .. })
            ));
            assert_eq!(out, [1, 2, 3]);
        }
        assert!(matches!(
            Response::Value(vec![0; MAX_VALUE_LEN + 1]).encode(&mut out),
            Err(ProtocolError::TooLarge { .. })
        ));
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn maximal_key_and_key_list_are_accepted() {
        let req = Request::Wait {
            keys: vec!["k".repeat(MAX_KEY_LEN); 3],
            timeout_ms: 5,
        };
        let bytes = encode_request(&req).unwrap();
        assert_eq!(decode_request(&bytes).unwrap().unwrap().0, req);
    }

    #[test]
    fn long_error_messages_are_cut_at_a_char_boundary() {
        let msg = "é".repeat(MAX_ERROR_LEN); // 2 bytes per char
        let bytes = encode_response(&Response::Error(msg)).unwrap();
        let Some((Response::Error(got), _)) = decode_response(&bytes).unwrap() else {
            panic!("not an error response");
        };
        assert_eq!(got.len(), MAX_ERROR_LEN);
        assert!(got.chars().all(|c| c == 'é'));
    }

    #[test]
    fn non_utf8_key_is_refused() {
        let mut body = vec![CMD_DELETE];
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(&[0xc3, 0x28]);
        assert_eq!(
            decode_request(&frame(&body)),
            Err(ProtocolError::NotUtf8 { what: "key" })
        );
    }

    #[test]
    fn bad_bool_is_refused() {
        let bytes = frame(&[RESP_BOOL, 2]);
        assert_eq!(decode_response(&bytes), Err(ProtocolError::BadBool(2)));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small deterministic sweep standing in for the fuzz target.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 24) as usize;
            let mut buf: Vec<u8> = (0..len)
                .map(|i| (state >> (i % 8 * 8)) as u8 ^ i as u8)
                .collect();
            if len >= 4 {
                // Keep declared lengths small so frames are often complete.
                let declared = u32::from(buf[0] % 20);
                buf[..4].copy_from_slice(&declared.to_le_bytes());
            }
            let _ = decode_request(&buf);
            let _ = decode_response(&buf);
        }
    }

    #[test]
    fn awaited_keys() {
        let get = Request::Get {
            key: "a".into(),
            timeout_ms: 3,
        };
        assert_eq!(get.awaited_keys(), Some((&["a".to_string()][..], 3)));
        assert_eq!(Request::NumKeys.awaited_keys(), None);
    }
}
