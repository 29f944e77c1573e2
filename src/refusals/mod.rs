//! Connections this process refused, kept so that a wait that then times
//! out can say so.
//!
//! A rank whose peer never shows up usually blames the peer ("rank 1 never
//! published its address"). When the peer did try, and this process turned
//! it away (another job secret, TLS mode or CA, another job id, ...), that
//! refusal is the real cause. The store server and the transports' link
//! listeners record each refusal here, which also logs it at once
//! (`tracing` warning, with the address, where and why); a rendezvous or an
//! op whose wait times out appends [`describe_since`] to its error.
//!
//! The ledger is process-wide and bounded: a count per (peer, place, reason)
//! for at most [`MAX_ENTRIES`] of them, the oldest given up (and counted)
//! when a new one needs room. A TCP peer is told apart by its IP address,
//! not its port, so a peer that retries fills one entry. Recording
//! allocates nothing; only describing (on an error path) does.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

mod reason;

pub(crate) use reason::Reason;

/// Distinct (peer, place, reason) entries kept; older ones are counted only.
pub const MAX_ENTRIES: usize = 64;

/// At most this many entries are listed in one description.
const LISTED: usize = 6;

/// Who was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// A TCP peer (the address of its last refused connection).
    Tcp(SocketAddr),
    /// A process on this host, over a Unix socket.
    Local { pid: i32, uid: u32 },
    /// A peer whose address could not be read.
    Unknown,
}

impl Peer {
    /// What tells one peer from another: a TCP peer's port changes with
    /// every connection, its IP address does not.
    fn key(self) -> PeerKey {
        match self {
            Peer::Tcp(a) => PeerKey::Ip(a.ip()),
            Peer::Local { pid, .. } => PeerKey::Pid(pid),
            Peer::Unknown => PeerKey::Unknown,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PeerKey {
    Ip(IpAddr),
    Pid(i32),
    Unknown,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(a) => write!(f, "{a}"),
            Peer::Local { pid, uid } => write!(f, "local process {pid} (uid {uid})"),
            Peer::Unknown => f.write_str("a peer of unknown address"),
        }
    }
}

/// Where the connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// The rendezvous store (in a rank, or `ringwire-store`).
    Store,
    /// The link listeners (TCP and Unix) of world rank `rank`, whose TCP
    /// listener has port `port` (not shown: it tells apart the transports
    /// of one process, as in-process tests run them).
    Link { rank: usize, port: u16 },
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Store => f.write_str("the store"),
            Place::Link { rank, .. } => write!(f, "rank {rank}'s link listener"),
        }
    }
}

/// One (peer, place, reason) and how often it happened.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The last refused connection's peer (its port, for TCP).
    peer: Peer,
    place: Place,
    reason: Reason,
    count: u64,
    /// When the first and the last of its refusals happened.
    began: Instant,
    last: Instant,
}

/// A bounded ledger of refusals; the process keeps one ([`record`]).
#[derive(Debug)]
pub(crate) struct Ledger {
    entries: [Option<Entry>; MAX_ENTRIES],
    /// Refusals whose entries were given up for room, and when the first
    /// and the last of them happened.
    dropped: u64,
    dropped_began: Option<Instant>,
    dropped_last: Option<Instant>,
}

impl Ledger {
    pub(crate) const fn new() -> Ledger {
        Ledger {
            entries: [None; MAX_ENTRIES],
            dropped: 0,
            dropped_began: None,
            dropped_last: None,
        }
    }

    /// Counts a refusal at `now`; returns how many times its entry has
    /// been refused (1 for a new one).
    pub(crate) fn add(&mut self, peer: Peer, place: Place, reason: Reason, now: Instant) -> u64 {
        let same = |e: &Entry| e.peer.key() == peer.key() && e.place == place && e.reason == reason;
        if let Some(e) = self.entries.iter_mut().flatten().find(|e| same(e)) {
            e.peer = peer;
            e.count += 1;
            e.last = now;
            return e.count;
        }
        let fresh = Entry {
            peer,
            place,
            reason,
            count: 1,
            began: now,
            last: now,
        };
        // A free slot, else the one refused longest ago.
        let slot = match self.entries.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let (i, oldest) = self
                    .entries
                    .iter()
                    .enumerate()
                    .filter_map(|(i, e)| e.map(|e| (i, e)))
                    .min_by_key(|(_, e)| e.last)
                    .expect("the ledger is full");
                self.dropped += oldest.count;
                self.dropped_began = Some(
                    self.dropped_began
                        .map_or(oldest.began, |d| d.min(oldest.began)),
                );
                self.dropped_last = Some(
                    self.dropped_last
                        .map_or(oldest.last, |d| d.max(oldest.last)),
                );
                i
            }
        };
        self.entries[slot] = Some(fresh);
        1
    }

    /// The refusals whose last occurrence is at or after `since`, those at
    /// `first` (if given) and then the most recent first, or `None` if
    /// there were none.
    pub(crate) fn describe_since(
        &self,
        since: Instant,
        now: Instant,
        first: Option<Place>,
    ) -> Option<String> {
        let mut recent: Vec<&Entry> = self
            .entries
            .iter()
            .flatten()
            .filter(|e| e.last >= since)
            .collect();
        // An entry or the dropped ones that began before `since` hold
        // refusals from before it too, how many is not kept: those count
        // as one, and the total is then a lower bound.
        let mut exact = true;
        let mut in_window = |began: Instant, count: u64| {
            if began >= since {
                count
            } else {
                exact = false;
                1
            }
        };
        let dropped = match (self.dropped_began, self.dropped_last) {
            (Some(began), Some(last)) if last >= since => in_window(began, self.dropped),
            _ => 0,
        };
        if recent.is_empty() && dropped == 0 {
            return None;
        }
        recent.sort_by_key(|e| (Some(e.place) != first, std::cmp::Reverse(e.last)));
        let total: u64 = recent
            .iter()
            .map(|e| in_window(e.began, e.count))
            .sum::<u64>()
            + dropped;
        let mut text = format!(
            "meanwhile {}{total} connection{} {} refused: ",
            if exact { "" } else { "at least " },
            if total == 1 { "" } else { "s" },
            if total == 1 { "was" } else { "were" },
        );
        for (i, e) in recent.iter().take(LISTED).enumerate() {
            if i > 0 {
                text.push_str("; ");
            }
            let ago = now.saturating_duration_since(e.last).as_secs_f64();
            let times = match e.count {
                1 => String::new(),
                n if e.began >= since => format!("{n} times, last "),
                n => format!(
                    "{n} times since {:.1} s ago, last ",
                    now.saturating_duration_since(e.began).as_secs_f64()
                ),
            };
            text.push_str(&format!(
                "{} at {} ({times}{ago:.1} s ago): {}",
                e.peer, e.place, e.reason
            ));
        }
        let unlisted: u64 = recent
            .iter()
            .skip(LISTED)
            .map(|e| if e.began >= since { e.count } else { 1 })
            .sum::<u64>()
            + dropped;
        if unlisted > 0 {
            text.push_str(&format!("; and {unlisted} more"));
        }
        Some(text)
    }
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger::new()
    }
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger::new());

/// Counts a refused connection and logs it: a warning for each of a
/// peer's first few refusals (for a given place and reason), then only at
/// the 2^k-th (debug otherwise), so a peer knocking in a loop does not
/// flood the log. `detail` is the full message (logged, not kept).
pub(crate) fn record(peer: Peer, place: Place, reason: Reason, detail: &str) {
    let count = LEDGER.lock().unwrap_or_else(PoisonError::into_inner).add(
        peer,
        place,
        reason,
        Instant::now(),
    );
    if count <= 3 || count.is_power_of_two() {
        if count == 1 {
            tracing::warn!(
                %detail,
                "refused a connection from {peer} at {place}: {reason}"
            );
        } else {
            tracing::warn!(
                %detail,
                "refused a connection from {peer} at {place} ({count} times so far): {reason}"
            );
        }
    } else {
        tracing::debug!(%peer, %place, count, %detail, "refused a connection: {reason}");
    }
}

#[cfg(any(test, feature = "internals"))]
/// The connections this process refused since `since` (the ones whose
/// last refusal came then or later): how many, from whom, where, and why,
/// e.g. "meanwhile 2 connections were refused: 127.0.0.1:41234 at the
/// store (2 times, last 0.4 s ago): wrong job secret (...)". `None` if
/// there were none. For the error of a wait that timed out.
pub fn describe_since(since: Instant) -> Option<String> {
    describe(since, None)
}

/// [`describe_since`] as a suffix for an error message: `"; meanwhile
/// ..."`, or `""` if nothing was refused.
pub fn suffix_since(since: Instant) -> String {
    suffix(describe(since, None))
}

/// [`suffix_since`], listing the refusals at `place` first.
pub(crate) fn suffix_since_at(since: Instant, place: Place) -> String {
    suffix(describe(since, Some(place)))
}

fn describe(since: Instant, first: Option<Place>) -> Option<String> {
    LEDGER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .describe_since(since, Instant::now(), first)
}

fn suffix(description: Option<String>) -> String {
    description.map_or_else(String::new, |d| format!("; {d}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::handshake::{SECURITY_MTLS, SECURITY_SECRET, SECURITY_TLS};
    use std::time::Duration;

    fn tcp(last: u8, port: u16) -> Peer {
        Peer::Tcp(SocketAddr::from(([10, 0, 0, last], port)))
    }

    #[test]
    fn one_entry_per_peer_place_and_reason_and_the_text_names_them() {
        let t0 = Instant::now();
        let mut l = Ledger::new();
        assert_eq!(l.describe_since(t0, t0, None), None);
        // A retrying peer: new ports, one entry, the last port shown.
        assert_eq!(
            l.add(tcp(1, 40000), Place::Store, Reason::WrongSecret, t0),
            1
        );
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(
            l.add(tcp(1, 40001), Place::Store, Reason::WrongSecret, t1),
            2
        );
        // Another reason, another place: entries of their own.
        assert_eq!(l.add(tcp(1, 40002), Place::Store, Reason::OtherJob, t1), 1);
        let link = Place::Link { rank: 3, port: 1 };
        assert_eq!(l.add(tcp(1, 40003), link, Reason::WrongSecret, t1), 1);
        let now = t0 + Duration::from_secs(2);
        let text = l.describe_since(t0, now, None).unwrap();
        assert!(
            text.starts_with("meanwhile 4 connections were refused: "),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.1:40001 at the store (2 times, last 1.5 s ago): wrong job secret (the peer's RINGWIRE_SECRET differs"),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.1:40002 at the store (1.5 s ago): another job id"),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.1:40003 at rank 3's link listener"),
            "{text}"
        );
        assert!(!text.contains("40000"), "{text}");
        // Only what happened since: the entries last refused at t1 or later.
        // The retrying peer's began before t1: of its 2, only the one at t1
        // is known to be in the window, so the total is a lower bound.
        let text = l.describe_since(t1, now, None).unwrap();
        assert!(
            text.starts_with("meanwhile at least 3 connections were refused: "),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.1:40001 at the store (2 times since 2.0 s ago, last 1.5 s ago)"),
            "{text}"
        );
        assert_eq!(
            l.describe_since(t1 + Duration::from_millis(1), now, None),
            None
        );
        // One refusal: singular.
        let mut l = Ledger::new();
        l.add(
            Peer::Local { pid: 7, uid: 0 },
            link,
            Reason::TlsRequired,
            t0,
        );
        let text = l.describe_since(t0, t0, None).unwrap();
        assert!(
            text.starts_with("meanwhile 1 connection was refused: local process 7 (uid 0) at rank 3's link listener (0.0 s ago): plaintext at a TLS listener"),
            "{text}"
        );
    }

    #[test]
    fn memory_is_bounded_and_nothing_is_lost_from_the_count() {
        let t0 = Instant::now();
        let mut l = Ledger::new();
        let n = 3 * MAX_ENTRIES as u8;
        for i in 0..n {
            let at = t0 + Duration::from_millis(u64::from(i));
            l.add(tcp(i, 1000), Place::Store, Reason::Malformed, at);
        }
        assert_eq!(l.entries.iter().flatten().count(), MAX_ENTRIES);
        // The newest are kept; the oldest counted.
        let kept: Vec<u8> = l
            .entries
            .iter()
            .flatten()
            .map(|e| match e.peer {
                Peer::Tcp(a) => match a.ip() {
                    IpAddr::V4(v4) => v4.octets()[3],
                    IpAddr::V6(_) => unreachable!(),
                },
                _ => unreachable!(),
            })
            .collect();
        assert!(kept.iter().all(|&k| k >= n - MAX_ENTRIES as u8), "{kept:?}");
        assert_eq!(l.dropped, u64::from(n) - MAX_ENTRIES as u64);
        let text = l
            .describe_since(t0, t0 + Duration::from_secs(1), None)
            .unwrap();
        assert!(
            text.starts_with(&format!("meanwhile {n} connections were refused")),
            "{text}"
        );
        // At most LISTED named; the rest summed.
        assert_eq!(text.matches(" at the store ").count(), LISTED, "{text}");
        assert!(
            text.ends_with(&format!("; and {} more", u64::from(n) - LISTED as u64)),
            "{text}"
        );
        // Most recent first.
        let newest = format!("10.0.0.{}:1000", n - 1);
        assert!(
            text.starts_with(&format!("meanwhile {n} connections were refused: {newest}")),
            "{text}"
        );
        // Refusals given up for room before `since` do not count.
        let late = t0 + Duration::from_millis(u64::from(n) - MAX_ENTRIES as u64);
        let text = l.describe_since(late, late, None).unwrap();
        assert!(
            text.starts_with(&format!("meanwhile {MAX_ENTRIES} connections")),
            "{text}"
        );
    }

    #[test]
    fn a_waiters_own_listener_comes_first() {
        let t0 = Instant::now();
        let ms = |m: u8| t0 + Duration::from_millis(u64::from(m));
        let mut l = Ledger::new();
        // Two transports of one process, both rank 1 (tests run such).
        let mine = Place::Link { rank: 1, port: 7 };
        let other = Place::Link { rank: 1, port: 8 };
        l.add(tcp(1, 1), mine, Reason::OtherJob, t0);
        for i in 0..LISTED as u8 {
            l.add(tcp(10 + i, 1), other, Reason::Malformed, ms(1 + i));
        }
        let now = t0 + Duration::from_secs(1);
        let text = l.describe_since(t0, now, None).unwrap();
        assert!(!text.contains("10.0.0.1:1 "), "{text}");
        assert!(text.ends_with("; and 1 more"), "{text}");
        let text = l.describe_since(t0, now, Some(mine)).unwrap();
        let total = LISTED + 1;
        assert!(
            text.starts_with(&format!(
                "meanwhile {total} connections were refused: 10.0.0.1:1 at rank 1's link listener (1.0 s ago): another job id"
            )),
            "{text}"
        );
    }

    #[test]
    fn security_bits_name_the_side_that_differs() {
        let s = SECURITY_SECRET;
        let (t, m) = (SECURITY_TLS, SECURITY_TLS | SECURITY_MTLS);
        assert_eq!(Reason::of_security(s, s), None);
        assert_eq!(Reason::of_security(0, s), Some(Reason::MissingSecret));
        assert_eq!(Reason::of_security(s, 0), Some(Reason::UnexpectedSecret));
        assert_eq!(Reason::of_security(0, t), Some(Reason::TlsRequired));
        assert_eq!(Reason::of_security(t, 0), Some(Reason::TlsUnexpected));
        assert_eq!(Reason::of_security(t, m), Some(Reason::TlsModeDiffers));
        assert_eq!(
            Reason::of_security(m | s, t),
            Some(Reason::UnexpectedSecret)
        );
    }
}
