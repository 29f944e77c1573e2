//! PyTorch's `TCPStore` wire protocol, client side, without I/O.
//!
//! What torch's client (`torch/csrc/distributed/c10d/TCPStore.cpp`) and its
//! servers (`TCPStoreBackend.cpp`, `TCPStoreLibUvBackend.cpp`) exchange: a
//! request is one command byte and its fields; integers are written in host
//! order (little-endian on every platform torch ships for), a string is a
//! `u64` length and its bytes, a key list a `u64` count and that many strings.
//! Replies carry no tag and no length of their own: their shape follows from
//! the request, so [`decode_reply`] is told which [`ReplyShape`] to expect.
//!
//! Only the commands ringwire uses are here, all from the part of torch's
//! `QueryType` enum that has kept its numbers since `VALIDATE` was added
//! (pytorch#107607, August 2023; tested here with torch 2.2.2 and 2.15.0): later
//! additions (`PING`, the queue commands) are not sent, so the client works
//! with every server since. Servers from before it (around torch 2.1 and
//! older) number their commands from `SET = 0` and would read `VALIDATE` as
//! a `SET` of a huge key: ringwire asks for torch 2.2 or newer.
//!
//! Decoding is total: any bytes give a reply, "need more bytes" or a
//! [`TcpStoreError`], never a panic; a declared length over the caps below is
//! refused as soon as its 8 bytes are in, and nothing is allocated for a
//! value before all of its bytes have arrived. Fuzzed by
//! `fuzz/fuzz_targets/tcpstore.rs`.

use thiserror::Error;

/// What a client sends first so that the server accepts its connection.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Longest key torch's servers take (libuv's `MAX_STRING_LEN`).
pub const MAX_KEY_LEN: usize = 8 * 1024;
/// Longest value torch's servers take (libuv's `MAX_PAYLOAD_LEN`), and so
/// the longest value a reply may declare.
pub const MAX_VALUE_LEN: usize = 8 * 1024 * 1024;
/// Most keys one request may name.
pub const MAX_KEYS: usize = 128 * 1024;

/// Command bytes (torch's `QueryType`), the stable part.
mod query {
    pub(super) const VALIDATE: u8 = 0;
    pub(super) const SET: u8 = 1;
    pub(super) const COMPARE_SET: u8 = 2;
    pub(super) const GET: u8 = 3;
    pub(super) const ADD: u8 = 4;
    pub(super) const CHECK: u8 = 5;
    pub(super) const WAIT: u8 = 6;
    pub(super) const DELETE_KEY: u8 = 8;
    pub(super) const MULTI_GET: u8 = 10;
    pub(super) const CANCEL_WAIT: u8 = 12;
}

/// A request to a TCPStore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// The first message on a connection; the server answers nothing.
    Validate,
    /// Stores `value` under `key`. No reply.
    Set { key: &'a str, value: &'a [u8] },
    /// Sets `key` to `desired` if it holds `expected` (or is missing and
    /// `expected` is empty). Reply: bytes.
    CompareSet {
        key: &'a str,
        expected: &'a [u8],
        desired: &'a [u8],
    },
    /// The value of `key`, which must exist. Reply: bytes.
    Get { key: &'a str },
    /// Adds `delta` to the decimal number at `key`. Reply: the new value.
    Add { key: &'a str, delta: i64 },
    /// Whether every key exists. Reply: a check byte.
    Check { keys: &'a [&'a str] },
    /// Parks the connection until every key exists. Reply: a wait byte,
    /// possibly much later.
    Wait { keys: &'a [&'a str] },
    /// Removes `key`. Reply: how many keys went (0 or 1).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    DeleteKey { key: &'a str },
    /// The values of every key, which must exist. Reply: that many values.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    MultiGet { keys: &'a [&'a str] },
    /// Gives up the connection's pending `Wait`. Reply: a wait byte.
    CancelWait,
}

impl Request<'_> {
    /// What the server answers to this request, or `None` for nothing.
    pub fn reply_shape(&self) -> Option<ReplyShape> {
        match self {
            Request::Validate | Request::Set { .. } => None,
            Request::CompareSet { .. } | Request::Get { .. } => Some(ReplyShape::Bytes),
            Request::Add { .. } | Request::DeleteKey { .. } => Some(ReplyShape::Int),
            Request::Check { .. } => Some(ReplyShape::Check),
            Request::Wait { .. } | Request::CancelWait => Some(ReplyShape::Wait),
            Request::MultiGet { keys } => Some(ReplyShape::Values(keys.len())),
        }
    }

    /// The command's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Validate => "VALIDATE",
            Request::Set { .. } => "SET",
            Request::CompareSet { .. } => "COMPARE_SET",
            Request::Get { .. } => "GET",
            Request::Add { .. } => "ADD",
            Request::Check { .. } => "CHECK",
            Request::Wait { .. } => "WAIT",
            Request::DeleteKey { .. } => "DELETE_KEY",
            Request::MultiGet { .. } => "MULTI_GET",
            Request::CancelWait => "CANCEL_WAIT",
        }
    }
}

/// The shape of a reply, known from its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyShape {
    /// A `u64` length and that many bytes.
    Bytes,
    /// An `i64`.
    Int,
    /// One byte: 0 ready, 1 not ready.
    Check,
    /// One byte: 0 stop waiting (the keys exist), 1 wait cancelled.
    Wait,
    /// This many byte strings, one after another.
    Values(usize),
}

/// A decoded reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A value (`GET`, `COMPARE_SET`).
    Bytes(Vec<u8>),
    /// A number (`ADD`, `DELETE_KEY`).
    Int(i64),
    /// `CHECK`: whether every key exists.
    Ready(bool),
    /// `WAIT` / `CANCEL_WAIT`: true when the keys exist (`STOP_WAITING`),
    /// false when the wait was cancelled (`WAIT_CANCELED`).
    StopWaiting(bool),
    /// `MULTI_GET`: the values, in the order of the keys asked for.
    Values(Vec<Vec<u8>>),
}

/// Why a request could not be encoded or a reply decoded.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TcpStoreError {
    /// A key, value or key list is over torch's limits.
    #[error("{what} of {len} is over the TCPStore's limit of {cap}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its size.
        len: u64,
        /// torch's limit.
        cap: usize,
    },
    /// A status byte that is none of the values its reply may hold.
    #[error("the TCPStore answered {byte:#04x} where a {what} byte (0 or 1) belongs")]
    BadStatus {
        /// Which status.
        what: &'static str,
        /// The byte that came.
        byte: u8,
    },
    /// A well-formed reply that does not answer the request sent.
    #[error("the TCPStore answered a {request} request with {reply}")]
    Unexpected {
        /// The request sent.
        request: &'static str,
        /// The reply that came, described.
        reply: String,
    },
}

/// Appends `req`'s bytes to `out`. Keys, values and key lists over torch's
/// limits are refused before anything is written (the server would close
/// the connection on them).
pub fn encode_request(req: &Request<'_>, out: &mut Vec<u8>) -> Result<(), TcpStoreError> {
    match *req {
        Request::Validate => {
            out.push(query::VALIDATE);
            out.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
        }
        Request::Set { key, value } => {
            out.push(query::SET);
            put_key(out, key)?;
            put_value(out, value)?;
        }
        Request::CompareSet {
            key,
            expected,
            desired,
        } => {
            out.push(query::COMPARE_SET);
            put_key(out, key)?;
            put_value(out, expected)?;
            put_value(out, desired)?;
        }
        Request::Get { key } => {
            out.push(query::GET);
            put_key(out, key)?;
        }
        Request::Add { key, delta } => {
            out.push(query::ADD);
            put_key(out, key)?;
            out.extend_from_slice(&delta.to_le_bytes());
        }
        Request::Check { keys } => put_keys(out, query::CHECK, keys)?,
        Request::Wait { keys } => put_keys(out, query::WAIT, keys)?,
        Request::DeleteKey { key } => {
            out.push(query::DELETE_KEY);
            put_key(out, key)?;
        }
        Request::MultiGet { keys } => put_keys(out, query::MULTI_GET, keys)?,
        Request::CancelWait => out.push(query::CANCEL_WAIT),
    }
    Ok(())
}

fn put_bytes(
    out: &mut Vec<u8>,
    bytes: &[u8],
    what: &'static str,
    cap: usize,
) -> Result<(), TcpStoreError> {
    if bytes.len() > cap {
        return Err(TcpStoreError::TooLarge {
            what,
            len: bytes.len() as u64,
            cap,
        });
    }
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

fn put_key(out: &mut Vec<u8>, key: &str) -> Result<(), TcpStoreError> {
    put_bytes(out, key.as_bytes(), "a key", MAX_KEY_LEN)
}

fn put_value(out: &mut Vec<u8>, value: &[u8]) -> Result<(), TcpStoreError> {
    put_bytes(out, value, "a value", MAX_VALUE_LEN)
}

fn put_keys(out: &mut Vec<u8>, command: u8, keys: &[&str]) -> Result<(), TcpStoreError> {
    if keys.len() > MAX_KEYS {
        return Err(TcpStoreError::TooLarge {
            what: "a key list",
            len: keys.len() as u64,
            cap: MAX_KEYS,
        });
    }
    let start = out.len();
    out.push(command);
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for key in keys {
        if let Err(e) = put_key(out, key) {
            out.truncate(start);
            return Err(e);
        }
    }
    Ok(())
}

/// Decodes one reply of `shape` from the front of `buf`: `Ok(None)` when
/// more bytes are needed, else the reply and how many bytes it used.
pub fn decode_reply(
    shape: ReplyShape,
    buf: &[u8],
) -> Result<Option<(Reply, usize)>, TcpStoreError> {
    match shape {
        ReplyShape::Bytes => Ok(take_bytes(buf)?.map(|(v, used)| (Reply::Bytes(v.to_vec()), used))),
        ReplyShape::Int => Ok(take_array::<8>(buf).map(|b| (Reply::Int(i64::from_le_bytes(b)), 8))),
        ReplyShape::Check => {
            status(buf, "CHECK reply").map(|s| s.map(|(ready, used)| (Reply::Ready(ready), used)))
        }
        ReplyShape::Wait => status(buf, "WAIT reply")
            .map(|s| s.map(|(stop, used)| (Reply::StopWaiting(stop), used))),
        ReplyShape::Values(n) => {
            // Find the end first, so nothing is copied until all is in.
            let mut used = 0;
            for _ in 0..n {
                match take_bytes(&buf[used..])? {
                    Some((_, len)) => used += len,
                    None => return Ok(None),
                }
            }
            let mut values = Vec::with_capacity(n.min(MAX_KEYS));
            let mut at = 0;
            while at < used {
                let (v, len) = take_bytes(&buf[at..])?.expect("measured above");
                values.push(v.to_vec());
                at += len;
            }
            Ok(Some((Reply::Values(values), used)))
        }
    }
}

/// A 0/1 status byte: 0 means yes (ready, stop waiting).
fn status(buf: &[u8], what: &'static str) -> Result<Option<(bool, usize)>, TcpStoreError> {
    match buf.first() {
        None => Ok(None),
        Some(0) => Ok(Some((true, 1))),
        Some(1) => Ok(Some((false, 1))),
        Some(&byte) => Err(TcpStoreError::BadStatus { what, byte }),
    }
}

fn take_array<const N: usize>(buf: &[u8]) -> Option<[u8; N]> {
    buf.get(..N).map(|b| b.try_into().expect("N bytes"))
}

/// A length-prefixed value: its bytes and the bytes used, once all are in.
fn take_bytes(buf: &[u8]) -> Result<Option<(&[u8], usize)>, TcpStoreError> {
    let Some(len) = take_array::<8>(buf).map(u64::from_le_bytes) else {
        return Ok(None);
    };
    if len > MAX_VALUE_LEN as u64 {
        return Err(TcpStoreError::TooLarge {
            what: "a value in a reply",
            len,
            cap: MAX_VALUE_LEN,
        });
    }
    let end = 8 + len as usize;
    Ok(buf.get(8..end).map(|v| (v, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(req: Request<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_request(&req, &mut out).unwrap();
        out
    }

    #[test]
    fn requests_are_torchs_bytes() {
        assert_eq!(bytes(Request::Validate), [0, 0xCE, 0xF7, 0x85, 0x3C]);
        let mut set = vec![1];
        set.extend(1u64.to_le_bytes());
        set.push(b'k');
        set.extend(2u64.to_le_bytes());
        set.extend(b"vv");
        assert_eq!(
            bytes(Request::Set {
                key: "k",
                value: b"vv"
            }),
            set
        );
        let mut add = vec![4];
        add.extend(1u64.to_le_bytes());
        add.push(b'n');
        add.extend((-3i64).to_le_bytes());
        assert_eq!(
            bytes(Request::Add {
                key: "n",
                delta: -3
            }),
            add
        );
        let mut wait = vec![6];
        wait.extend(2u64.to_le_bytes());
        for k in ["a", "bc"] {
            wait.extend((k.len() as u64).to_le_bytes());
            wait.extend(k.as_bytes());
        }
        assert_eq!(bytes(Request::Wait { keys: &["a", "bc"] }), wait);
        assert_eq!(bytes(Request::CancelWait), [12]);
        assert_eq!(bytes(Request::Get { key: "" }), [3, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn oversized_requests_write_nothing() {
        let key = "k".repeat(MAX_KEY_LEN + 1);
        let mut out = vec![7];
        let keys = ["ok", key.as_str()];
        assert!(matches!(
            encode_request(&Request::Check { keys: &keys }, &mut out),
            Err(TcpStoreError::TooLarge { what: "a key", .. })
        ));
        assert_eq!(out, [7]);
        let value = vec![0; MAX_VALUE_LEN + 1];
        assert!(
            encode_request(
                &Request::Set {
                    key: "k",
                    value: &value
                },
                &mut Vec::new()
            )
            .is_err()
        );
    }

    #[test]
    fn every_prefix_of_a_reply_needs_more() {
        let mut multi = Vec::new();
        for v in [&b"one"[..], b"", b"three"] {
            multi.extend((v.len() as u64).to_le_bytes());
            multi.extend(v);
        }
        let mut value = 5u64.to_le_bytes().to_vec();
        value.extend(b"hello");
        let cases = [
            (ReplyShape::Bytes, value, Reply::Bytes(b"hello".to_vec())),
            (
                ReplyShape::Int,
                42i64.to_le_bytes().to_vec(),
                Reply::Int(42),
            ),
            (ReplyShape::Check, vec![1], Reply::Ready(false)),
            (ReplyShape::Wait, vec![0], Reply::StopWaiting(true)),
            (
                ReplyShape::Values(3),
                multi,
                Reply::Values(vec![b"one".to_vec(), Vec::new(), b"three".to_vec()]),
            ),
        ];
        for (shape, mut wire, reply) in cases {
            for cut in 0..wire.len() {
                assert_eq!(
                    decode_reply(shape, &wire[..cut]),
                    Ok(None),
                    "{shape:?} cut at {cut}"
                );
            }
            let used = wire.len();
            wire.extend(b"next");
            assert_eq!(
                decode_reply(shape, &wire),
                Ok(Some((reply, used))),
                "{shape:?}"
            );
        }
        assert_eq!(
            decode_reply(ReplyShape::Values(0), &[]),
            Ok(Some((Reply::Values(Vec::new()), 0)))
        );
    }

    #[test]
    fn hostile_replies_are_refused_early() {
        // A declared length over the cap is refused from its 8 bytes alone.
        let huge = u64::MAX.to_le_bytes();
        assert!(matches!(
            decode_reply(ReplyShape::Bytes, &huge),
            Err(TcpStoreError::TooLarge { len: u64::MAX, .. })
        ));
        let mut second_bad = 0u64.to_le_bytes().to_vec();
        second_bad.extend(((MAX_VALUE_LEN + 1) as u64).to_le_bytes());
        assert!(decode_reply(ReplyShape::Values(2), &second_bad).is_err());
        assert_eq!(
            decode_reply(ReplyShape::Wait, &[7]),
            Err(TcpStoreError::BadStatus {
                what: "WAIT reply",
                byte: 7
            })
        );
        // A huge count asked for allocates nothing before its values arrive.
        assert_eq!(decode_reply(ReplyShape::Values(usize::MAX), &[]), Ok(None));
    }
}
