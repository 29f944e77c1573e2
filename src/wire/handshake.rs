//! The connection handshake: [`Hello`] (payload of a `Handshake` frame, sent
//! by the dialing rank right after connect) and [`HelloAck`] (payload of the
//! `HandshakeAck` frame the accepting rank answers with).
//!
//! The hello tells the acceptor who is calling, so that it can file the
//! connection under the right peer rank and refuse callers that belong to
//! another job, another world size, or do not exist ([`validate_hello`]). The
//! ack carries the verdict and, on refusal, a reason the dialer can log.
//!
//! Both carry the sender's security mode ([`SECURITY_SECRET`],
//! [`SECURITY_TLS`], [`SECURITY_MTLS`] bits), which must match
//! ([`security_mismatch`]). With a job secret, the exchange has four
//! messages (see `crate::security`):
//!
//! 1. dialer: `Hello` with `auth` = its 32-byte nonce;
//! 2. acceptor: `HelloAck` with `auth` = its nonce and its proof (32 + 32 bytes);
//! 3. dialer: `HelloAck` (accepted) with `auth` = its proof, or empty if the
//!    acceptor's proof was wrong;
//! 4. acceptor: `HelloAck` with the final verdict.
//!
//! Without one, only the first two (with empty `auth`).
//!
//! A hello also says which [`Channel`] of the link the connection is: its
//! main connection, or one of the one-way lanes a TCP link may add for the
//! payloads of large frames (docs/decisions/0018, 0034), numbered. Each
//! lane runs the whole handshake, secret included. The acceptor's ack to a
//! main connection that asks for lanes says how many it takes each way
//! (`lanes`: at most as many as asked, 0 for none).
//!
//! Wire layout (little endian, no padding):
//!
//! ```text
//! Hello:    protocol_version u16 | little_endian u8 (0/1) | security u8 | channel u8
//!           | job_id u64 | rank u32 | world_size u32 | incarnation u32 | auth_len u16
//!           | auth [auth_len]
//! HelloAck: accepted u8 (0/1) | security u8 | lanes u8 (0-8) | reason_len u16
//!           | auth_len u16 | reason [reason_len] (UTF-8) | auth [auth_len]
//! ```
//!
//! The incarnation says which process of its rank the sender is: 0 for
//! the one started with the job, raised by each replacement that took the
//! rank's place (decision 0040). An acceptor links only with a rank's
//! current incarnation, so a process that was excluded as hung and wakes
//! up cannot link in its replacement's place.
//!
//! The channel byte is a kind in its low 3 bits (0 main, 1 main with
//! lanes, 2 lane from the dialer, 3 lane to the dialer, 4 main with shared
//! memory) and a number above them: the lanes asked for each way (1 to
//! [`MAX_LANES`]), or a lane's index (below it); 0 for the others.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::codec::{decode_bool, decode_str, len_u16, split_fixed, split_last_field, truncate_str};
use super::{MAX_AUTH_LEN, MAX_LANES, MAX_REASON_LEN, PROTOCOL_VERSION, WireError};

/// The dialing rank's introduction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    /// The sender's [`PROTOCOL_VERSION`].
    pub protocol_version: u16,
    /// Whether the sender is little endian (elements travel in native order).
    pub little_endian: bool,
    /// Identifies the job, so that two jobs sharing a rendezvous never mix.
    pub job_id: u64,
    /// The sender's rank.
    pub rank: u32,
    /// The sender's idea of the world size.
    pub world_size: u32,
    /// Which process of its rank the sender is: 0 at launch, one more for
    /// each replacement (decision 0040).
    pub incarnation: u32,
    /// The sender's security mode: [`SECURITY_SECRET`] | [`SECURITY_TLS`] | [`SECURITY_MTLS`].
    pub security: u8,
    /// Which connection of the link this is.
    pub channel: Channel,
    /// Authentication data, at most [`MAX_AUTH_LEN`] bytes: the dialer's
    /// nonce when the job has a secret, else empty.
    pub auth: Vec<u8>,
}

/// Which of a link's connections a hello opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// The link's main connection (every frame, both ways).
    Main,
    /// The main connection of a link that asks for this many lanes each
    /// way (1 to [`MAX_LANES`]): once accepted with `lanes` > 0, the dialer
    /// opens that many each way before using the link.
    MainWithLanes(u8),
    /// Lane `i` of those the dialer writes and the acceptor reads.
    LaneFromDialer(u8),
    /// Lane `i` of those the acceptor writes and the dialer reads.
    LaneToDialer(u8),
    /// The main connection of a link between ranks on one host that asks
    /// for shared memory: once accepted with the ack's `lanes` at 1 (here:
    /// "takes what the channel asks for"), the dialer offers a segment on
    /// it before the link carries frames (`ringwire_shm`); otherwise it is
    /// a plain main connection.
    MainWithShm,
    /// Not a link: a rank asks whether this one's process is alive (the
    /// agreement of survivors asks a lower rank it never linked with,
    /// decision 0039). Any rank may send it; it is answered, checked like
    /// any hello (job, secret, TLS), and closed.
    Probe,
}

impl Channel {
    fn encode(self) -> u8 {
        let (kind, n) = match self {
            Channel::Main => (0, 0),
            Channel::MainWithLanes(n) => (1, n),
            Channel::LaneFromDialer(i) => (2, i),
            Channel::LaneToDialer(i) => (3, i),
            Channel::MainWithShm => (4, 0),
            Channel::Probe => (5, 0),
        };
        kind | (n << 3)
    }

    fn decode(byte: u8) -> Result<Channel, WireError> {
        let n = byte >> 3;
        Ok(match (byte & 7, n) {
            (0, 0) => Channel::Main,
            (1, 1..=MAX_LANES) => Channel::MainWithLanes(n),
            (2, 0..MAX_LANES) => Channel::LaneFromDialer(n),
            (3, 0..MAX_LANES) => Channel::LaneToDialer(n),
            (4, 0) => Channel::MainWithShm,
            (5, 0) => Channel::Probe,
            _ => {
                return Err(WireError::UnknownField {
                    field: "hello.channel",
                    value: byte,
                });
            }
        })
    }

    /// Whether this is one of the lanes (not a main connection).
    pub fn is_lane(self) -> bool {
        matches!(self, Channel::LaneFromDialer(_) | Channel::LaneToDialer(_))
    }
}

/// Security mode bit: the sender authenticates with a job secret.
pub const SECURITY_SECRET: u8 = 1;
/// Security mode bit: the connection runs inside TLS.
pub const SECURITY_TLS: u8 = 2;
/// Security mode bit: the TLS is mutual (both sides show certificates).
pub const SECURITY_MTLS: u8 = 4;
const SECURITY_KNOWN: u8 = SECURITY_SECRET | SECURITY_TLS | SECURITY_MTLS;

fn decode_security(field: &'static str, byte: u8) -> Result<u8, WireError> {
    if byte & !SECURITY_KNOWN != 0 {
        return Err(WireError::UnknownField { field, value: byte });
    }
    Ok(byte)
}

/// A readable name of a security mode ("plaintext", "secret+mtls", ...).
pub fn security_name(flags: u8) -> String {
    let tls = if flags & SECURITY_MTLS != 0 {
        "mtls"
    } else if flags & SECURITY_TLS != 0 {
        "tls"
    } else {
        "plaintext"
    };
    if flags & SECURITY_SECRET != 0 {
        format!("{tls}+secret")
    } else {
        tls.to_string()
    }
}

/// Why a peer with security mode `theirs` cannot talk to this side (mode
/// `mine`), or `None` if the modes match.
pub fn security_mismatch(theirs: u8, mine: u8) -> Option<String> {
    if theirs == mine {
        return None;
    }
    let mut why = Vec::new();
    if (theirs ^ mine) & SECURITY_SECRET != 0 {
        why.push(if mine & SECURITY_SECRET != 0 {
            "this side requires the job secret but the peer has none (set the same RINGWIRE_SECRET everywhere)"
        } else {
            "the peer uses a job secret but this side has none (set the same RINGWIRE_SECRET everywhere)"
        });
    }
    if (theirs ^ mine) & (SECURITY_TLS | SECURITY_MTLS) != 0 {
        why.push("the TLS modes differ (set the same RINGWIRE_TLS everywhere)");
    }
    Some(format!(
        "security mode mismatch: peer uses {}, this side {}: {}",
        security_name(theirs),
        security_name(mine),
        why.join("; ")
    ))
}

/// The accepting rank's answer to a [`Hello`] (and, with a job secret, the
/// dialer's proof; see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HelloAck {
    pub accepted: bool,
    /// The sender's security mode (as [`Hello::security`]).
    pub security: u8,
    /// Why the hello was refused (empty when accepted). At most
    /// [`MAX_REASON_LEN`] bytes on the wire: [`HelloAck::encode`] truncates longer ones.
    pub reason: String,
    /// Authentication data (nonce and proof), at most [`MAX_AUTH_LEN`] bytes;
    /// [`HelloAck::encode`] truncates longer ones.
    pub auth: Vec<u8>,
    /// What the acceptor takes of what the hello's channel asked for: how
    /// many lanes each way of a [`Channel::MainWithLanes`] (at most as many
    /// as asked; 0: none), or 1 for the shared memory of a
    /// [`Channel::MainWithShm`].
    pub lanes: u8,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawHello {
    protocol_version: U16,
    little_endian: u8,
    security: u8,
    channel: u8,
    job_id: U64,
    rank: U32,
    world_size: U32,
    incarnation: U32,
    auth_len: U16,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawHelloAck {
    accepted: u8,
    security: u8,
    lanes: u8,
    reason_len: U16,
    auth_len: U16,
}

impl Hello {
    /// A hello from this process: current protocol version, native
    /// endianness, plaintext, no auth data.
    pub fn new(job_id: u64, rank: u32, world_size: u32) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            little_endian: cfg!(target_endian = "little"),
            job_id,
            rank,
            world_size,
            incarnation: 0,
            security: 0,
            channel: Channel::Main,
            auth: Vec::new(),
        }
    }

    /// The payload bytes. Fails only if `auth` is longer than [`MAX_AUTH_LEN`]
    /// (a token cannot be truncated the way a reason can).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        if self.auth.len() > MAX_AUTH_LEN {
            return Err(WireError::FieldTooLong {
                field: "hello.auth",
                len: self.auth.len(),
                max: MAX_AUTH_LEN,
            });
        }
        let raw = RawHello {
            protocol_version: U16::new(self.protocol_version),
            little_endian: u8::from(self.little_endian),
            security: self.security,
            channel: self.channel.encode(),
            job_id: U64::new(self.job_id),
            rank: U32::new(self.rank),
            world_size: U32::new(self.world_size),
            incarnation: U32::new(self.incarnation),
            auth_len: len_u16(self.auth.len()),
        };
        let mut out = Vec::with_capacity(size_of::<RawHello>() + self.auth.len());
        out.extend_from_slice(raw.as_bytes());
        out.extend_from_slice(&self.auth);
        Ok(out)
    }

    /// Decodes a payload; exactly the payload, no trailing bytes.
    pub fn decode(payload: &[u8]) -> Result<Hello, WireError> {
        let (raw, rest) = split_fixed::<RawHello>("hello", payload)?;
        let little_endian = decode_bool("hello.little_endian", raw.little_endian)?;
        let security = decode_security("hello.security", raw.security)?;
        let channel = Channel::decode(raw.channel)?;
        let auth = split_last_field(
            "hello",
            "hello.auth",
            size_of::<RawHello>(),
            rest,
            raw.auth_len,
            MAX_AUTH_LEN,
        )?;
        Ok(Hello {
            protocol_version: raw.protocol_version.get(),
            little_endian,
            job_id: raw.job_id.get(),
            rank: raw.rank.get(),
            world_size: raw.world_size.get(),
            incarnation: raw.incarnation.get(),
            security,
            channel,
            auth: auth.to_vec(),
        })
    }
}

impl HelloAck {
    /// An acceptance.
    pub fn accept() -> HelloAck {
        HelloAck {
            accepted: true,
            security: 0,
            reason: String::new(),
            auth: Vec::new(),
            lanes: 0,
        }
    }

    /// A refusal, saying why.
    pub fn reject(reason: impl Into<String>) -> HelloAck {
        HelloAck {
            accepted: false,
            security: 0,
            reason: reason.into(),
            auth: Vec::new(),
            lanes: 0,
        }
    }

    /// Sets the security mode.
    #[must_use]
    pub fn with_security(mut self, security: u8) -> HelloAck {
        self.security = security;
        self
    }

    /// Sets what the acceptor takes of what was asked for (see
    /// [`HelloAck::lanes`]).
    #[must_use]
    pub fn with_lanes(mut self, lanes: u8) -> HelloAck {
        self.lanes = lanes;
        self
    }

    /// Sets the authentication data.
    #[must_use]
    pub fn with_auth(mut self, auth: impl Into<Vec<u8>>) -> HelloAck {
        self.auth = auth.into();
        self
    }

    /// The payload bytes; a reason over [`MAX_REASON_LEN`] bytes is cut at
    /// the last character boundary that fits.
    pub fn encode(&self) -> Vec<u8> {
        let reason = truncate_str(&self.reason, MAX_REASON_LEN);
        let auth = &self.auth[..self.auth.len().min(MAX_AUTH_LEN)];
        let raw = RawHelloAck {
            accepted: u8::from(self.accepted),
            security: self.security,
            lanes: self.lanes,
            reason_len: len_u16(reason.len()),
            auth_len: len_u16(auth.len()),
        };
        let mut out = Vec::with_capacity(size_of::<RawHelloAck>() + reason.len() + auth.len());
        out.extend_from_slice(raw.as_bytes());
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(auth);
        out
    }

    /// Decodes a payload; exactly the payload, no trailing bytes. The reason
    /// must be UTF-8.
    pub fn decode(payload: &[u8]) -> Result<HelloAck, WireError> {
        let (raw, rest) = split_fixed::<RawHelloAck>("hello_ack", payload)?;
        let accepted = decode_bool("hello_ack.accepted", raw.accepted)?;
        let security = decode_security("hello_ack.security", raw.security)?;
        let lanes = raw.lanes;
        if lanes > MAX_LANES {
            return Err(WireError::UnknownField {
                field: "hello_ack.lanes",
                value: lanes,
            });
        }
        let reason_len = usize::from(raw.reason_len.get());
        if reason_len > MAX_REASON_LEN {
            return Err(WireError::FieldTooLong {
                field: "hello_ack.reason",
                len: reason_len,
                max: MAX_REASON_LEN,
            });
        }
        let Some((reason, rest)) = rest.split_at_checked(reason_len) else {
            return Err(WireError::PayloadTruncated {
                what: "hello_ack",
                needed: size_of::<RawHelloAck>() + reason_len,
                got: payload.len(),
            });
        };
        let auth = split_last_field(
            "hello_ack",
            "hello_ack.auth",
            size_of::<RawHelloAck>() + reason_len,
            rest,
            raw.auth_len,
            MAX_AUTH_LEN,
        )?;
        Ok(HelloAck {
            accepted,
            security,
            reason: decode_str("hello_ack.reason", reason)?,
            auth: auth.to_vec(),
            lanes,
        })
    }
}

/// Checks a [`Hello`] received by rank `my_rank` of job `expected_job` with
/// `expected_world` ranks: same protocol version and endianness, same job and
/// world size, a rank that exists and is not this one.
pub fn validate_hello(
    hello: &Hello,
    expected_job: u64,
    expected_world: u32,
    my_rank: u32,
) -> Result<(), WireError> {
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(WireError::UnsupportedVersion {
            got: hello.protocol_version,
            supported: PROTOCOL_VERSION,
        });
    }
    if hello.little_endian != cfg!(target_endian = "little") {
        return Err(WireError::EndiannessMismatch {
            peer_little_endian: hello.little_endian,
        });
    }
    if hello.job_id != expected_job {
        return Err(WireError::JobMismatch {
            got: hello.job_id,
            expected: expected_job,
        });
    }
    if hello.world_size != expected_world {
        return Err(WireError::WorldSizeMismatch {
            got: hello.world_size,
            expected: expected_world,
        });
    }
    if hello.rank >= expected_world {
        return Err(WireError::RankOutOfRange {
            rank: hello.rank,
            world_size: expected_world,
        });
    }
    if hello.rank == my_rank {
        return Err(WireError::SelfConnect { rank: hello.rank });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::header::tests::XorShift;

    fn hello() -> Hello {
        Hello {
            auth: b"token".to_vec(),
            incarnation: 2,
            ..Hello::new(0xDEAD_BEEF_0000_0001, 3, 8)
        }
    }

    #[test]
    fn hello_layout() {
        let bytes = hello().encode().unwrap();
        assert_eq!(size_of::<RawHello>(), 27);
        assert_eq!(bytes.len(), 27 + 5);
        assert_eq!(bytes[0..2], [5, 0]);
        assert_eq!(bytes[2], u8::from(cfg!(target_endian = "little")));
        assert_eq!(bytes[3], 0);
        assert_eq!(bytes[4], 0); // Channel::Main
        assert_eq!(bytes[5..13], 0xDEAD_BEEF_0000_0001u64.to_le_bytes());
        assert_eq!(bytes[13..17], 3u32.to_le_bytes());
        assert_eq!(bytes[17..21], 8u32.to_le_bytes());
        assert_eq!(bytes[21..25], 2u32.to_le_bytes());
        assert_eq!(bytes[25..27], 5u16.to_le_bytes());
        assert_eq!(&bytes[27..], b"token");
        for (channel, byte) in [
            (Channel::MainWithLanes(1), 1 | 1 << 3),
            (Channel::MainWithLanes(8), 1 | 8 << 3),
            (Channel::LaneFromDialer(0), 2),
            (Channel::LaneToDialer(0), 3),
            (Channel::LaneToDialer(7), 3 | 7 << 3),
            (Channel::MainWithShm, 4),
            (Channel::Probe, 5),
        ] {
            let bytes = Hello { channel, ..hello() }.encode().unwrap();
            assert_eq!(bytes[4], byte, "{channel:?}");
            assert_eq!(Hello::decode(&bytes).unwrap().channel, channel);
        }
        // No lanes asked for, or more than MAX_LANES; a lane index past
        // it; a number on a channel that takes none; an unknown kind.
        for byte in [1, 1 | 9 << 3, 2 | 8 << 3, 1 << 3, 4 | 1 << 3, 5 | 1 << 3, 6] {
            let mut bytes = hello().encode().unwrap();
            bytes[4] = byte;
            assert_eq!(
                Hello::decode(&bytes),
                Err(WireError::UnknownField {
                    field: "hello.channel",
                    value: byte
                })
            );
        }
        let ack = HelloAck::accept().with_lanes(4).encode();
        assert_eq!(size_of::<RawHelloAck>(), 7);
        assert_eq!(ack[..3], [1, 0, 4]);
    }

    #[test]
    fn round_trips() {
        for h in [
            hello(),
            Hello::new(0, 0, 1),
            Hello {
                protocol_version: u16::MAX,
                little_endian: false,
                job_id: u64::MAX,
                rank: u32::MAX,
                world_size: u32::MAX,
                incarnation: u32::MAX,
                security: SECURITY_SECRET | SECURITY_TLS | SECURITY_MTLS,
                channel: Channel::LaneToDialer(MAX_LANES - 1),
                auth: vec![0xff; MAX_AUTH_LEN],
            },
            Hello {
                channel: Channel::MainWithLanes(MAX_LANES),
                ..hello()
            },
            Hello {
                channel: Channel::LaneFromDialer(3),
                ..hello()
            },
        ] {
            let bytes = h.encode().unwrap();
            assert_eq!(Hello::decode(&bytes), Ok(h));
        }
        for ack in [
            HelloAck::accept(),
            HelloAck::accept().with_lanes(1),
            HelloAck::accept().with_lanes(MAX_LANES),
            HelloAck::reject("world size mismatch: 4 vs 8"),
            HelloAck::reject("ünïcödé ✓"),
            HelloAck::reject("x".repeat(MAX_REASON_LEN)),
            HelloAck::accept()
                .with_security(SECURITY_SECRET | SECURITY_TLS)
                .with_auth(vec![7; 64]),
            HelloAck::reject("wrong secret")
                .with_security(SECURITY_SECRET)
                .with_auth(vec![1; MAX_AUTH_LEN]),
        ] {
            let bytes = ack.encode();
            assert_eq!(HelloAck::decode(&bytes), Ok(ack));
        }
    }

    #[test]
    fn long_reason_is_truncated_on_a_char_boundary() {
        // 3-byte chars: 1024 is not a multiple of 3, so the cut falls mid-char.
        let ack = HelloAck::reject("€".repeat(400));
        let decoded = HelloAck::decode(&ack.encode()).unwrap();
        assert_eq!(decoded.reason, "€".repeat(341));
    }

    #[test]
    fn hello_errors() {
        let too_long = Hello {
            auth: vec![0; MAX_AUTH_LEN + 1],
            ..hello()
        };
        let long = Err(WireError::FieldTooLong {
            field: "hello.auth",
            len: 513,
            max: 512,
        });
        assert_eq!(too_long.encode(), long);

        let valid = hello().encode().unwrap();
        assert_eq!(
            Hello::decode(&valid[..26]),
            Err(WireError::PayloadTruncated {
                what: "hello",
                needed: 27,
                got: 26
            })
        );
        assert_eq!(
            Hello::decode(&valid[..30]),
            Err(WireError::PayloadTruncated {
                what: "hello",
                needed: 32,
                got: 30
            })
        );
        let mut trailing = valid.clone();
        trailing.push(0);
        assert_eq!(
            Hello::decode(&trailing),
            Err(WireError::TrailingBytes {
                what: "hello",
                extra: 1
            })
        );
        let mut bad_bool = valid.clone();
        bad_bool[2] = 2;
        assert_eq!(
            Hello::decode(&bad_bool),
            Err(WireError::UnknownField {
                field: "hello.little_endian",
                value: 2
            })
        );
        let mut unknown_mode = valid.clone();
        unknown_mode[3] = 9;
        assert_eq!(
            Hello::decode(&unknown_mode),
            Err(WireError::UnknownField {
                field: "hello.security",
                value: 9
            })
        );
        let mut unknown_channel = valid.clone();
        unknown_channel[4] = 6;
        assert_eq!(
            Hello::decode(&unknown_channel),
            Err(WireError::UnknownField {
                field: "hello.channel",
                value: 6
            })
        );
        // A huge length is refused before anything is allocated for it.
        let mut huge = valid.clone();
        huge[25..27].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            Hello::decode(&huge),
            Err(WireError::FieldTooLong {
                field: "hello.auth",
                len: 65535,
                max: 512
            })
        );
    }

    #[test]
    fn ack_errors() {
        let valid = HelloAck::reject("nope").encode();
        assert_eq!(
            HelloAck::decode(&[]),
            Err(WireError::PayloadTruncated {
                what: "hello_ack",
                needed: 7,
                got: 0
            })
        );
        let mut bad = valid.clone();
        bad[0] = 7;
        assert_eq!(
            HelloAck::decode(&bad),
            Err(WireError::UnknownField {
                field: "hello_ack.accepted",
                value: 7
            })
        );
        let mut bad = valid.clone();
        bad[1] = 8;
        assert_eq!(
            HelloAck::decode(&bad),
            Err(WireError::UnknownField {
                field: "hello_ack.security",
                value: 8
            })
        );
        let mut bad = valid.clone();
        bad[2] = MAX_LANES + 1;
        assert_eq!(
            HelloAck::decode(&bad),
            Err(WireError::UnknownField {
                field: "hello_ack.lanes",
                value: MAX_LANES + 1
            })
        );
        let mut bad = valid.clone();
        bad[7] = 0xff;
        assert_eq!(
            HelloAck::decode(&bad),
            Err(WireError::InvalidUtf8 {
                field: "hello_ack.reason"
            })
        );
        let mut bad = valid.clone();
        bad[3..5].copy_from_slice(&1025u16.to_le_bytes());
        assert!(matches!(
            HelloAck::decode(&bad),
            Err(WireError::FieldTooLong { len: 1025, .. })
        ));
        assert!(matches!(
            HelloAck::decode(&valid[..8]),
            Err(WireError::PayloadTruncated {
                needed: 11,
                got: 8,
                ..
            })
        ));
        let mut bad = valid.clone();
        bad[5..7].copy_from_slice(&513u16.to_le_bytes());
        assert!(matches!(
            HelloAck::decode(&bad),
            Err(WireError::FieldTooLong {
                field: "hello_ack.auth",
                len: 513,
                ..
            })
        ));
        let mut bad = valid.clone();
        bad[5..7].copy_from_slice(&3u16.to_le_bytes());
        assert!(matches!(
            HelloAck::decode(&bad),
            Err(WireError::PayloadTruncated {
                needed: 14,
                got: 11,
                ..
            })
        ));
        let mut trailing = valid.clone();
        trailing.extend_from_slice(b"!!");
        assert_eq!(
            HelloAck::decode(&trailing),
            Err(WireError::TrailingBytes {
                what: "hello_ack",
                extra: 2
            })
        );
    }

    #[test]
    fn security_modes_must_match() {
        assert_eq!(security_mismatch(0, 0), None);
        let m = SECURITY_SECRET | SECURITY_TLS | SECURITY_MTLS;
        assert_eq!(security_mismatch(m, m), None);
        let e = security_mismatch(0, SECURITY_SECRET).unwrap();
        assert!(e.contains("requires the job secret"), "{e}");
        let e = security_mismatch(SECURITY_TLS, SECURITY_TLS | SECURITY_MTLS).unwrap();
        assert!(e.contains("peer uses tls, this side mtls"), "{e}");
        assert_eq!(security_name(m), "mtls+secret");
    }

    #[test]
    fn validate_hello_errors() {
        let h = Hello::new(7, 3, 8);
        assert_eq!(validate_hello(&h, 7, 8, 0), Ok(()));
        assert_eq!(
            validate_hello(
                &Hello {
                    protocol_version: 1,
                    ..h.clone()
                },
                7,
                8,
                0
            ),
            Err(WireError::UnsupportedVersion {
                got: 1,
                supported: 5
            })
        );
        let foreign = Hello {
            little_endian: !h.little_endian,
            ..h.clone()
        };
        assert_eq!(
            validate_hello(&foreign, 7, 8, 0),
            Err(WireError::EndiannessMismatch {
                peer_little_endian: foreign.little_endian
            })
        );
        assert_eq!(
            validate_hello(&h, 8, 8, 0),
            Err(WireError::JobMismatch {
                got: 7,
                expected: 8
            })
        );
        assert_eq!(
            validate_hello(&h, 7, 4, 0),
            Err(WireError::WorldSizeMismatch {
                got: 8,
                expected: 4
            })
        );
        let out_of_range = Hello::new(7, 8, 8);
        assert_eq!(
            validate_hello(&out_of_range, 7, 8, 0),
            Err(WireError::RankOutOfRange {
                rank: 8,
                world_size: 8
            })
        );
        assert_eq!(
            validate_hello(&h, 7, 8, 3),
            Err(WireError::SelfConnect { rank: 3 })
        );
    }

    #[test]
    fn mutated_payloads_never_panic() {
        let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
        let seeds = [
            hello().encode().unwrap(),
            HelloAck::reject("rank 3 is already connected").encode(),
        ];
        for i in 0..20_000 {
            let mut bytes = seeds[i % seeds.len()].clone();
            rng.mutate(&mut bytes);
            if let Ok(h) = Hello::decode(&bytes) {
                assert_eq!(h.encode().unwrap(), bytes, "hello re-encodes exactly");
            }
            if let Ok(ack) = HelloAck::decode(&bytes) {
                assert_eq!(ack.encode(), bytes, "ack re-encodes exactly");
            }
        }
    }
}
