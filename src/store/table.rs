//! The store's key-value table and what each request does to it.
//!
//! This is the store's semantics without sockets, threads or waiting, so it can
//! be tested directly. The server holds one [`Table`] behind a mutex; for `Get`
//! and `Wait` it first waits (on a condvar) until [`Table::missing`] is empty
//! and only then calls [`Table::execute`].

use std::collections::HashMap;

use super::protocol::{Request, Response};

/// Longest excerpt of a non-integer value quoted in an `add` error.
const QUOTE_LEN: usize = 64;

/// The keys and values of one store.
#[derive(Debug, Default)]
pub(crate) struct Table {
    map: HashMap<String, Vec<u8>>,
}

impl Table {
    /// The keys of `keys` that are not in the table, in the order given.
    pub(crate) fn missing(&self, keys: &[String]) -> Vec<String> {
        keys.iter()
            .filter(|k| !self.map.contains_key(k.as_str()))
            .cloned()
            .collect()
    }

    /// Whether every key of `keys` is in the table.
    pub(crate) fn has_all(&self, keys: &[String]) -> bool {
        keys.iter().all(|k| self.map.contains_key(k.as_str()))
    }

    /// Applies `req` and returns the response and whether a key was added or
    /// changed (so waiters should be woken).
    ///
    /// `Get` and `Wait` do not wait here: a `Get` of a missing key answers
    /// `NotFound` and a `Wait` answers `Done`. The caller waits first.
    pub(crate) fn execute(&mut self, req: Request) -> (Response, bool) {
        match req {
            Request::Set { key, value } => {
                self.map.insert(key, value);
                (Response::Done, true)
            }
            Request::Get { key, .. } | Request::TryGet { key } => match self.map.get(&key) {
                Some(v) => (Response::Value(v.clone()), false),
                None => (Response::NotFound, false),
            },
            Request::Add { key, delta } => self.add(key, delta),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => self.compare_set(key, &expected, desired),
            Request::Delete { key } => (Response::Bool(self.map.remove(&key).is_some()), false),
            Request::Wait { .. } => (Response::Done, false),
            Request::NumKeys => (
                Response::Count(u64::try_from(self.map.len()).unwrap_or(u64::MAX)),
                false,
            ),
        }
    }

    fn add(&mut self, key: String, delta: i64) -> (Response, bool) {
        let current = match self.map.get(&key) {
            None => 0,
            Some(bytes) => match std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()) {
                Some(n) => n,
                None => {
                    let msg = format!(
                        "add on key {key:?}: its value {:?} is not a decimal integer \
                         (add only works on keys written by add, or set to decimal ASCII)",
                        quote(bytes)
                    );
                    return (Response::Error(msg), false);
                }
            },
        };
        let Some(new) = i64::checked_add(current, delta) else {
            let msg = format!("add on key {key:?}: {current} + {delta} overflows a 64-bit integer");
            return (Response::Error(msg), false);
        };
        self.map.insert(key, new.to_string().into_bytes());
        (Response::Int(new), true)
    }

    fn compare_set(&mut self, key: String, expected: &[u8], desired: Vec<u8>) -> (Response, bool) {
        match self.map.get(&key) {
            Some(current) if current.as_slice() != expected => {
                (Response::Value(current.clone()), false)
            }
            // Missing key and non-empty expected: nothing is stored, and the
            // empty answer says so (torch's TCPStore answers `expected` here,
            // which a retry loop cannot tell apart from a stale read).
            None if !expected.is_empty() => (Response::Value(Vec::new()), false),
            _ => {
                self.map.insert(key, desired.clone());
                (Response::Value(desired), true)
            }
        }
    }
}

/// A short, printable excerpt of a value for error messages.
fn quote(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(QUOTE_LEN)];
    let mut s = String::from_utf8_lossy(head).into_owned();
    if bytes.len() > QUOTE_LEN {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(t: &mut Table, k: &str, v: &[u8]) {
        let req = Request::Set {
            key: k.into(),
            value: v.to_vec(),
        };
        assert_eq!(t.execute(req), (Response::Done, true));
    }

    fn cas(t: &mut Table, k: &str, expected: &[u8], desired: &[u8]) -> Response {
        t.execute(Request::CompareSet {
            key: k.into(),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        })
        .0
    }

    fn add(t: &mut Table, k: &str, delta: i64) -> Response {
        t.execute(Request::Add {
            key: k.into(),
            delta,
        })
        .0
    }

    #[test]
    fn set_get_delete_count() {
        let mut t = Table::default();
        let get = |k: &str| Request::TryGet { key: k.into() };
        assert_eq!(t.execute(get("a")).0, Response::NotFound);
        set(&mut t, "a", b"1");
        set(&mut t, "b", b"2");
        set(&mut t, "a", b"3");
        assert_eq!(t.execute(get("a")).0, Response::Value(b"3".to_vec()));
        assert_eq!(t.execute(Request::NumKeys).0, Response::Count(2));
        let del = |k: &str| Request::Delete { key: k.into() };
        assert_eq!(t.execute(del("a")).0, Response::Bool(true));
        assert_eq!(t.execute(del("a")).0, Response::Bool(false));
        assert_eq!(t.execute(Request::NumKeys).0, Response::Count(1));
    }

    #[test]
    fn add_counts_from_zero_in_decimal_ascii() {
        let mut t = Table::default();
        assert_eq!(add(&mut t, "n", 5), Response::Int(5));
        assert_eq!(add(&mut t, "n", -7), Response::Int(-2));
        assert_eq!(
            t.execute(Request::TryGet { key: "n".into() }).0,
            Response::Value(b"-2".to_vec())
        );
        set(&mut t, "m", b"40");
        assert_eq!(add(&mut t, "m", 2), Response::Int(42));
    }

    #[test]
    fn add_refuses_non_integers_and_overflow() {
        let mut t = Table::default();
        set(&mut t, "s", b"hello");
        let Response::Error(msg) = add(&mut t, "s", 1) else {
            panic!("expected an error");
        };
        assert!(
            msg.contains("\"s\"") && msg.contains("not a decimal integer"),
            "{msg}"
        );
        set(&mut t, "big", i64::MAX.to_string().as_bytes());
        let Response::Error(msg) = add(&mut t, "big", 1) else {
            panic!("expected an error");
        };
        assert!(msg.contains("overflows"), "{msg}");
        // The failed adds changed nothing.
        assert_eq!(
            t.execute(Request::TryGet { key: "s".into() }).0,
            Response::Value(b"hello".to_vec())
        );
    }

    #[test]
    fn compare_set_semantics() {
        let mut t = Table::default();
        // Missing key, non-empty expected: nothing stored.
        assert_eq!(cas(&mut t, "k", b"x", b"y"), Response::Value(Vec::new()));
        assert!(!t.has_all(&["k".into()]));
        // Missing key, empty expected: set.
        assert_eq!(
            cas(&mut t, "k", b"", b"first"),
            Response::Value(b"first".to_vec())
        );
        // Mismatch: unchanged, current returned.
        assert_eq!(
            cas(&mut t, "k", b"", b"second"),
            Response::Value(b"first".to_vec())
        );
        assert_eq!(
            cas(&mut t, "k", b"nope", b"second"),
            Response::Value(b"first".to_vec())
        );
        // Match: swapped.
        assert_eq!(
            cas(&mut t, "k", b"first", b"second"),
            Response::Value(b"second".to_vec())
        );
    }

    #[test]
    fn missing_and_has_all() {
        let mut t = Table::default();
        set(&mut t, "b", b"");
        let keys: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
        assert_eq!(t.missing(&keys), ["a", "c"]);
        assert!(!t.has_all(&keys));
        assert!(t.has_all(&keys[1..2]));
        assert!(t.has_all(&[]));
    }
}
