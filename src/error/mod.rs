//! The one error type of the public API.
//!
//! Every error raised while a collective runs names the op, its sequence
//! number on the communicator and the peer involved, because "which rank and
//! which op" is what a user debugging a stuck job needs first.

pub(crate) mod link;

use crate::wire::OpKind;
pub use link::LinkFailure;
use std::fmt;
use std::time::Duration;

/// Which collective an error belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpContext {
    /// The collective.
    pub op: OpKind,
    /// Its sequence number on the communicator (the same on every rank);
    /// point-to-point ops count per peer pair.
    pub seq: u64,
    /// Element type name.
    pub dtype: &'static str,
    /// Element count of this rank's input.
    pub count: u64,
    /// This rank within the communicator.
    pub rank: usize,
}

impl fmt::Display for OpContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} #{} ({}, {} elements) on rank {}",
            self.op, self.seq, self.dtype, self.count, self.rank
        )
    }
}

/// Everything that can go wrong in ringwire.
///
/// An error of an op names the op, its sequence number and the peer; a
/// lost peer's error carries why as a type, for programs that react to one
/// kind of failure and not another:
///
/// ```no_run
/// use ringwire::{Communicator, Error, LinkFailure, ReduceOp};
///
/// # fn main() -> Result<(), Error> {
/// let comm = Communicator::from_env().wait()?;
/// match comm.all_reduce(vec![1.0f32; 8], ReduceOp::Sum).wait() {
///     Ok(sums) => println!("{sums:?}"),
///     Err(Error::PeerLost { peer, cause: LinkFailure::HeartbeatTimeout { silent }, .. }) => {
///         eprintln!("rank {peer} went silent for {silent:?} (stopped or partitioned)");
///     }
///     Err(e) if e.is_fatal() => {
///         eprintln!("the communicator failed: {e}"); // every later op fails at once
///         comm.dump_flight_record();
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A collective did not finish within its timeout.
    #[error("{ctx} timed out after {waited:?} waiting for rank {peer}{detail}")]
    Timeout {
        /// The op: its kind, number, type, length and this rank.
        ctx: OpContext,
        /// The rank (of this communicator) the op was waiting on.
        peer: usize,
        /// How long the op had run.
        waited: Duration,
        /// Which ranks had not reached the op, when the store could say.
        detail: String,
    },

    /// The connection to a peer broke while an op needed it.
    #[error("{ctx}: lost rank {peer}: {reason}")]
    PeerLost {
        /// The op: its kind, number, type, length and this rank.
        ctx: OpContext,
        /// The rank (of this communicator) whose link broke.
        peer: usize,
        /// What happened to the link (closed, reset, silent past the
        /// heartbeat timeout, a bad frame), in words.
        reason: String,
        /// The same as a type to match on.
        cause: LinkFailure,
    },

    /// Another rank aborted the communicator after a failure it saw (or on
    /// purpose with `Communicator::abort`); `reason` is its own error.
    #[error("{ctx}: aborted by rank {origin} (at its op #{origin_seq}): {reason}")]
    Aborted {
        /// The op: its kind, number, type, length and this rank.
        ctx: OpContext,
        /// The rank that aborted: its rank in this communicator when it is
        /// a member, else (an abort from a rank of another communicator,
        /// which reaches every linked rank) its rank in the world.
        origin: usize,
        /// The op number it was at, on the communicator it failed on.
        origin_seq: u64,
        /// Its own error, or the reason given to `Communicator::abort`.
        reason: String,
    },

    /// Ranks disagree about the collective (kind, size, dtype, root or order).
    #[error("{ctx}: ranks disagree about the collective: {detail}")]
    Mismatch {
        /// The op: its kind, number, type, length and this rank.
        ctx: OpContext,
        /// The rank (of this communicator) that called something else.
        peer: usize,
        /// Both sides' op, type, count, reduce op or root, whichever differ.
        detail: String,
    },

    /// ringwire broke one of its own rules while running an op (a bug; the
    /// detail says which rule). Peers may be out of step.
    #[error("{ctx}: internal error (a bug in ringwire, please report it): {detail}")]
    Internal {
        /// The op: its kind, number, type, length and this rank.
        ctx: OpContext,
        /// Which rule broke.
        detail: String,
    },

    /// The caller passed arguments the op cannot take.
    #[error("{op}: invalid argument: {detail}")]
    InvalidArgument {
        /// The op called.
        op: OpKind,
        /// What is wrong with the arguments.
        detail: String,
    },

    /// An earlier op failed; the communicator refuses new ops. Ranks cannot
    /// tell how far their
    /// peers got, so there is no resuming: restart the job's processes, as
    /// torch.distributed needs after a NCCL error. `first` is the first
    /// failure, as that op reported it.
    #[error("communicator failed earlier and must be rebuilt: {first}")]
    Failed {
        /// The first failure's message.
        first: String,
    },

    /// Connecting to or accepting a peer failed during setup or on demand.
    #[error("connection to rank {peer} at {addr}: {detail}")]
    Connect {
        /// The peer's rank (of this communicator's world).
        peer: usize,
        /// The address dialed or accepted from.
        addr: String,
        /// What went wrong, in words.
        detail: String,
        /// Why, as a type: refused, the handshake failed, the peer never
        /// dialed, a socket error.
        cause: LinkFailure,
    },

    /// Launch environment incomplete or inconsistent.
    #[error(transparent)]
    Env(#[from] crate::env::EnvError),

    /// Address selection failed.
    #[error(transparent)]
    Net(#[from] crate::net::NetError),

    /// Rendezvous store failure.
    #[error("rendezvous: {0}")]
    Store(#[from] crate::store::StoreError),

    /// Two processes claim one rank, or similar setup conflicts.
    #[error("rendezvous: {0}")]
    Rendezvous(String),

    /// An I/O error outside any op (listener, thread spawn).
    #[error("{context}: {source}")]
    Io {
        /// What ringwire was doing.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// An agreement (`agree`, `shrink`) could not decide on this rank: it
    /// reaches fewer members than the quorum, so it may be on the minority
    /// side of a partition, and it must not go on apart from the majority.
    #[error(
        "rank {rank} is cut off from the majority: it reaches {reachable} of {size} members \
         (lost: {lost:?}), and deciding without the others needs {needed}; the members that \
         hold a majority may go on without it, so end this process (or lower the quorum with \
         shrink_with_quorum where no partition can split the job)"
    )]
    QuorumLost {
        /// This rank, of the communicator the agreement ran on.
        rank: usize,
        /// Members this rank still reaches, itself included.
        reachable: usize,
        /// The quorum a decision needs.
        needed: usize,
        /// The communicator's size.
        size: usize,
        /// The members it can no longer reach (ranks of the communicator).
        lost: Vec<usize>,
    },

    /// The other members decided without this rank (they took it for
    /// lost: it was slow, or its links failed during the agreement).
    #[error(
        "rank {rank} was left out: the others agreed to go on as ranks {members:?} (it was \
         taken for lost: slow, stopped or cut off during the agreement); this process cannot \
         rejoin the running job, so end it"
    )]
    Excluded {
        /// This rank, of the communicator the agreement ran on.
        rank: usize,
        /// The members that go on.
        members: Vec<usize>,
    },

    /// An agreement did not decide within the communicator's timeout.
    #[error(
        "agreement #{instance} on rank {rank} did not decide within {waited:?} (members not \
         heard from or lost: {suspected:?}); check that every live member called agree or \
         shrink in the same order, or raise the timeout"
    )]
    AgreementTimeout {
        /// This rank, of the communicator the agreement ran on.
        rank: usize,
        /// Which agreement of the communicator (1 for the first).
        instance: u64,
        /// How long it ran.
        waited: Duration,
        /// The members this rank suspected at the end.
        suspected: Vec<usize>,
    },

    /// The result of this `PendingCollective` was already taken.
    #[error("the result of this PendingCollective was already taken")]
    ResultTaken,

    /// The communicator was shut down while the op was queued.
    #[error("communicator shut down before {0} ran")]
    ShutDown(OpKind),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A short, stable name for the kind of error (`timeout`, `peer_lost`,
    /// `aborted`, `mismatch`, ...): the `kind` label of the
    /// `ringwire_failures_total` metric, fit for logs and alerts. A
    /// variant's name never changes once released.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Timeout { .. } => "timeout",
            Error::PeerLost { .. } => "peer_lost",
            Error::Aborted { .. } => "aborted",
            Error::Mismatch { .. } => "mismatch",
            Error::Internal { .. } => "internal",
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::Failed { .. } => "failed",
            Error::Connect { .. } => "connect",
            Error::Env(_) => "env",
            Error::Net(_) => "net",
            Error::Store(_) => "store",
            Error::Rendezvous(_) => "rendezvous",
            Error::Io { .. } => "io",
            Error::ResultTaken => "result_taken",
            Error::ShutDown(_) => "shut_down",
            Error::QuorumLost { .. } => "quorum_lost",
            Error::Excluded { .. } => "excluded",
            Error::AgreementTimeout { .. } => "agreement_timeout",
        }
    }

    /// True for errors that leave the communicator failed (peers may be out
    /// of step with this rank).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. }
                | Error::PeerLost { .. }
                | Error::Aborted { .. }
                | Error::Mismatch { .. }
                | Error::Connect { .. }
                | Error::Failed { .. }
                | Error::Internal { .. }
        )
    }
}

/// `Result` with ringwire's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
