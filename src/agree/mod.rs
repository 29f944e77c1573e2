//! Fault-tolerant agreement among the members of a communicator (issue 45,
//! decision 0039): the survivors of a failure decide together who goes on
//! and, for `agree`, the AND of their values, such that every member that
//! decides, decides the same, and a minority cut off by a partition cannot
//! decide apart from the majority.
//!
//! - `protocol`: one member's agreement as a pure state machine (messages
//!   in, messages out; single-decree Paxos with majority quorums).
//! - `codec`: its messages as bytes (decoding total and canonical, fuzzed
//!   by the `agree` target).
//! - `sim` (tests): a deterministic simulator that crashes members at
//!   every step, delays and partitions links, and checks agreement,
//!   validity and termination on every run, and that a broken protocol
//!   fails them.
//!
//! Not yet wired to the transport: revoking a communicator, carrying these
//! messages on its links and `Communicator::shrink`/`agree` come next.

internal_module!(codec);
internal_module!(protocol);
#[cfg(test)]
mod sim;
