//! Why a link failed, as a type: the cause [`crate::Error::PeerLost`] and
//! [`crate::Error::Connect`] carry, so a user can match on "the peer closed"
//! against "its heartbeats stopped" against "it sent a bad frame". The
//! sentences in errors are made from it in one place ([`Loss`]), whichever
//! plane or thread saw the failure.

use crate::wire::WireError;
use std::fmt;
use std::io;
use std::time::Duration;

/// What may keep a peer from reading what this rank sends, for errors.
pub(crate) const WHY_A_PEER_STOPS_READING: &str = "it is stuck; or it fell behind this rank by \
     more than its run-ahead limits (RINGWIRE_RUN_AHEAD_BYTES per peer, \
     RINGWIRE_RUN_AHEAD_TOTAL_BYTES in all) and did not catch up in time; or it is sending to \
     this rank too, before receiving (use send_recv for such exchanges, or order them)";

/// Why a link to a peer failed, or could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkFailure {
    /// The peer closed the connection: its process exited or crashed.
    Closed,
    /// The peer's process exited (its pidfd said so) while another process
    /// still holds its end of the link: a child it forked, say. (A local
    /// shared-memory link; elsewhere such a death is a heartbeat timeout.)
    Exited {
        /// The peer's process id.
        pid: u32,
    },
    /// Nothing came from the peer, not even heartbeats, for `silent`: its
    /// process is stopped or hung, or the network partitioned.
    HeartbeatTimeout {
        /// How long the link was silent.
        silent: Duration,
    },
    /// The peer stopped reading: a send blocked past the write timeout.
    StoppedReading,
    /// The peer sent bytes that are not a valid frame; the link was closed.
    /// (Boxed: errors stay small on the success path.)
    BadFrame(Box<WireError>),
    /// A socket call failed: while sending (`sending`), or else while
    /// receiving or connecting. `errno` where the system gave one.
    Io {
        /// Whether the call was a send.
        sending: bool,
        /// The system's error number, where it gave one.
        errno: Option<i32>,
        /// The error in words.
        message: String,
    },
    /// The peer refused the link in its handshake (another job, secret or
    /// TLS setting, a rank it did not expect), or failed this side's
    /// checks; `reason` says which.
    Refused {
        /// Which check failed, in words.
        reason: String,
    },
    /// The handshake itself failed (TLS, a cut or garbled answer, a
    /// timeout) before either side could say yes or no.
    Handshake {
        /// What went wrong, in words.
        reason: String,
    },
    /// The peer, which dials this rank, did not connect in time.
    NotDialed,
    /// This process closed its transport (its last communicator went).
    TransportClosed,
    /// ringwire broke one of its own rules (a bug; `detail` says which).
    Internal {
        /// Which rule broke.
        detail: String,
    },
}

impl From<WireError> for LinkFailure {
    fn from(e: WireError) -> LinkFailure {
        LinkFailure::BadFrame(Box::new(e))
    }
}

impl LinkFailure {
    /// The failure of an I/O error `e`: end of stream is the peer closing.
    pub(crate) fn of_io(e: &io::Error, sending: bool) -> LinkFailure {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => LinkFailure::Closed,
            _ => LinkFailure::Io {
                sending,
                errno: e.raw_os_error(),
                message: e.to_string(),
            },
        }
    }

    /// A short, stable label (`closed`, `heartbeat_timeout`, ...), as
    /// [`crate::Error::kind`] is for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            LinkFailure::Closed => "closed",
            LinkFailure::Exited { .. } => "exited",
            LinkFailure::HeartbeatTimeout { .. } => "heartbeat_timeout",
            LinkFailure::StoppedReading => "stopped_reading",
            LinkFailure::BadFrame(_) => "bad_frame",
            LinkFailure::Io { .. } => "io",
            LinkFailure::Refused { .. } => "refused",
            LinkFailure::Handshake { .. } => "handshake",
            LinkFailure::NotDialed => "not_dialed",
            LinkFailure::TransportClosed => "transport_closed",
            LinkFailure::Internal { .. } => "internal",
        }
    }
}

/// [`LinkFailure`] of the link to world rank `peer`: the sentence errors
/// and logs show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Loss {
    pub(crate) peer: usize,
    pub(crate) failure: LinkFailure,
}

impl Loss {
    pub(crate) fn new(peer: usize, failure: LinkFailure) -> Loss {
        Loss { peer, failure }
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let peer = self.peer;
        match &self.failure {
            LinkFailure::Closed => write!(
                f,
                "rank {peer} closed the connection (did its process exit or crash?)"
            ),
            LinkFailure::Exited { pid } => write!(
                f,
                "rank {peer}'s process (pid {pid}) exited; another process still holds its end of \
                 the link (a child it forked?)"
            ),
            LinkFailure::HeartbeatTimeout { silent } => write!(
                f,
                "rank {peer} sent nothing, not even heartbeats, for {:.1} s (process stopped or \
                 hung, or the network partitioned?)",
                silent.as_secs_f64()
            ),
            LinkFailure::StoppedReading => write!(
                f,
                "rank {peer} stopped reading (a send blocked past the op timeout): {}",
                WHY_A_PEER_STOPS_READING
            ),
            LinkFailure::BadFrame(e) => write!(f, "rank {peer} sent a bad frame: {e}"),
            LinkFailure::Io {
                sending: true,
                message,
                ..
            } => write!(f, "send to rank {peer} failed: {message}"),
            LinkFailure::Io { message, .. } => {
                write!(f, "connection to rank {peer} failed: {message}")
            }
            LinkFailure::Refused { reason } => write!(f, "{reason}"),
            LinkFailure::Handshake { reason } => write!(f, "{reason}"),
            LinkFailure::NotDialed => write!(
                f,
                "rank {peer} did not connect to this rank in time (is it running and calling the \
                 same collectives?)"
            ),
            LinkFailure::TransportClosed => write!(f, "transport closed"),
            LinkFailure::Internal { detail } => write!(f, "{detail}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameKind;

    #[test]
    fn each_failure_reads_as_a_sentence_naming_the_peer() {
        let say = |failure| Loss::new(3, failure).to_string();
        assert_eq!(
            say(LinkFailure::Closed),
            "rank 3 closed the connection (did its process exit or crash?)"
        );
        let silent = say(LinkFailure::HeartbeatTimeout {
            silent: Duration::from_millis(2500),
        });
        assert!(silent.starts_with("rank 3 sent nothing, not even heartbeats, for 2.5 s"));
        let bad = say(LinkFailure::BadFrame(Box::new(
            WireError::ControlPayloadTooLarge {
                kind: FrameKind::Abort,
                len: 9000,
                max: 4096,
            },
        )));
        assert!(bad.starts_with("rank 3 sent a bad frame: abort frame: payload of 9000"));
        assert!(say(LinkFailure::StoppedReading).starts_with("rank 3 stopped reading"));
        assert!(
            say(LinkFailure::Exited { pid: 77 }).starts_with("rank 3's process (pid 77) exited")
        );
    }

    #[test]
    fn io_errors_keep_their_errno_and_end_of_stream_is_a_close() {
        let reset = io::Error::from_raw_os_error(104);
        match LinkFailure::of_io(&reset, true) {
            LinkFailure::Io {
                sending: true,
                errno: Some(104),
                ..
            } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(
            LinkFailure::of_io(&io::ErrorKind::UnexpectedEof.into(), false),
            LinkFailure::Closed
        );
        let reading = Loss::new(1, LinkFailure::of_io(&reset, false)).to_string();
        assert!(
            reading.starts_with("connection to rank 1 failed: "),
            "{reading}"
        );
    }
}
