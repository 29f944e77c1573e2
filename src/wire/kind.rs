//! The one-byte enumerations of the frame header: what a frame is
//! ([`FrameKind`]) and which collective a data frame belongs to ([`OpKind`]).
//!
//! Each enum maps to and from its wire byte explicitly (`from_u8` / `as u8`),
//! so an unknown byte is a typed decoding error rather than undefined
//! behaviour, and the numbering is part of the protocol: never renumber a
//! variant, only add new ones (and bump [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION)
//! if old peers could receive them).

use std::fmt;

/// What a frame is; the `kind` byte of the header. Errors about bytes from
/// a peer ([`WireError`](crate::WireError)) name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum FrameKind {
    /// A chunk of a collective's buffer; the payload is raw elements.
    Data = 1,
    /// The dialing rank's hello, sent right after connect.
    Handshake = 2,
    /// The accepting rank's answer to a hello.
    HandshakeAck = 3,
    /// A rank gives up on the communicator; the payload says why.
    Abort = 4,
    /// Liveness ping; no payload.
    Heartbeat = 5,
}

impl FrameKind {
    /// Every kind, for tests that sweep them.
    #[cfg(any(test, feature = "internals"))]
    pub const ALL: [FrameKind; 5] = [
        FrameKind::Data,
        FrameKind::Handshake,
        FrameKind::HandshakeAck,
        FrameKind::Abort,
        FrameKind::Heartbeat,
    ];

    internal_item! {
        /// The kind for a wire byte, or `None` for an unknown one.
        pub const fn from_u8(byte: u8) -> Option<FrameKind> {
            Some(match byte {
                1 => FrameKind::Data,
                2 => FrameKind::Handshake,
                3 => FrameKind::HandshakeAck,
                4 => FrameKind::Abort,
                5 => FrameKind::Heartbeat,
                _ => return None,
            })
        }
    }

    /// Short lower-case name (`data`, `handshake`, ...), as used in errors.
    pub const fn name(self) -> &'static str {
        match self {
            FrameKind::Data => "data",
            FrameKind::Handshake => "handshake",
            FrameKind::HandshakeAck => "handshake_ack",
            FrameKind::Abort => "abort",
            FrameKind::Heartbeat => "heartbeat",
        }
    }

    /// Whether frames of this kind carry a control payload, decoded whole
    /// (everything but data frames).
    #[cfg(any(test, feature = "internals"))]
    pub const fn is_control(self) -> bool {
        !matches!(self, FrameKind::Data)
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which collective an op is (in errors, [`Stats`](crate::Stats) and the
/// flight record); on the wire, the `op` byte of a frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum OpKind {
    /// Not part of a collective (control frames).
    None = 0,
    /// `all_reduce`.
    AllReduce = 1,
    /// `broadcast`.
    Broadcast = 2,
    /// `reduce`.
    Reduce = 3,
    /// `all_gather` and `all_gather_v`.
    AllGather = 4,
    /// `reduce_scatter`.
    ReduceScatter = 5,
    /// `all_to_all` and `all_to_all_v`.
    AllToAll = 6,
    /// `barrier`.
    Barrier = 7,
    /// Point-to-point send / receive.
    SendRecv = 8,
    // 9 and 10 joined protocol version 3 without a bump: ringwire has not
    // been released, and a build from before them refuses their frames as
    // an unknown `header.op` rather than misreading them.
    /// `gather`.
    Gather = 9,
    /// `scatter`.
    Scatter = 10,
}

impl OpKind {
    /// Every op (metrics and stats list one row each).
    pub const ALL: [OpKind; 11] = [
        OpKind::None,
        OpKind::AllReduce,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::AllToAll,
        OpKind::Barrier,
        OpKind::SendRecv,
        OpKind::Gather,
        OpKind::Scatter,
    ];

    internal_item! {
        /// The op for a wire byte, or `None` for an unknown one.
        pub const fn from_u8(byte: u8) -> Option<OpKind> {
            Some(match byte {
                0 => OpKind::None,
                1 => OpKind::AllReduce,
                2 => OpKind::Broadcast,
                3 => OpKind::Reduce,
                4 => OpKind::AllGather,
                5 => OpKind::ReduceScatter,
                6 => OpKind::AllToAll,
                7 => OpKind::Barrier,
                8 => OpKind::SendRecv,
                9 => OpKind::Gather,
                10 => OpKind::Scatter,
                _ => return None,
            })
        }
    }

    /// Short snake-case name (`all_reduce`, `send_recv`, ...), as used in
    /// errors, metrics and CLIs.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::None => "none",
            OpKind::AllReduce => "all_reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllToAll => "all_to_all",
            OpKind::Barrier => "barrier",
            OpKind::SendRecv => "send_recv",
            OpKind::Gather => "gather",
            OpKind::Scatter => "scatter",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        for kind in FrameKind::ALL {
            assert_eq!(FrameKind::from_u8(kind as u8), Some(kind));
        }
        for op in OpKind::ALL {
            assert_eq!(OpKind::from_u8(op as u8), Some(op));
        }
        let known_kinds = (0..=u8::MAX).filter(|b| FrameKind::from_u8(*b).is_some());
        assert_eq!(known_kinds.count(), FrameKind::ALL.len());
        let known_ops = (0..=u8::MAX).filter(|b| OpKind::from_u8(*b).is_some());
        assert_eq!(known_ops.count(), OpKind::ALL.len());
        assert_eq!(FrameKind::from_u8(0), None);
        assert_eq!(OpKind::from_u8(11), None);
    }

    #[test]
    fn names() {
        assert_eq!(OpKind::AllReduce.to_string(), "all_reduce");
        assert_eq!(OpKind::ReduceScatter.name(), "reduce_scatter");
        assert_eq!(OpKind::AllToAll.name(), "all_to_all");
        assert_eq!(OpKind::SendRecv.to_string(), "send_recv");
        assert_eq!(FrameKind::HandshakeAck.to_string(), "handshake_ack");
        assert!(!FrameKind::Data.is_control());
        assert!(FrameKind::Heartbeat.is_control());
    }
}
