//! The agreement's messages as bytes: the payload of an agreement frame.
//! Decoding is total (any bytes give a message or a typed [`WireError`],
//! never a panic or an allocation sized by the peer beyond
//! [`MAX_MEMBERS`]) and canonical (a decoded message encodes to exactly the
//! bytes it came from); the `agree` fuzz target holds it to both.
//!
//! Little-endian, a tag byte first:
//!
//! | tag | message | then |
//! |---|---|---|
//! | 1 | `Prepare` | ballot |
//! | 2 | `Promise` | ballot, input (u64), 0 or 1, then (ballot, decision) if 1 |
//! | 3 | `Nack` | ballot |
//! | 4 | `Accept` | ballot, decision |
//! | 5 | `Accepted` | ballot |
//! | 6 | `Decide` | decision |
//!
//! A ballot is its round then its rank (u32 each); a decision its value
//! (u64), the communicator's size (u32) and one bit per member (rank r is
//! bit r % 8 of byte r / 8), the unused bits of the last byte zero.

use super::protocol::{Ballot, Decision, Message};
use crate::wire::WireError;

/// Most members a decision may name: its member bits then fill 8 KiB.
pub const MAX_MEMBERS: usize = 1 << 16;

/// The longest payload an agreement message has.
pub const MAX_PAYLOAD: usize = 1 + 8 + 8 + 1 + 8 + 8 + 4 + MAX_MEMBERS / 8;

const WHAT: &str = "agreement";

/// Encodes `message` of a communicator of `size` members.
///
/// # Panics
/// If a decision names a member not below `size`, or `size` is over
/// [`MAX_MEMBERS`]: the caller's own bug, never a peer's.
pub fn encode(message: &Message, size: usize) -> Vec<u8> {
    assert!(size <= MAX_MEMBERS, "{size} members");
    let mut out = Vec::new();
    let ballot = |out: &mut Vec<u8>, b: &Ballot| {
        out.extend_from_slice(&b.round.to_le_bytes());
        out.extend_from_slice(&b.rank.to_le_bytes());
    };
    let decision = |out: &mut Vec<u8>, d: &Decision| {
        out.extend_from_slice(&d.value.to_le_bytes());
        out.extend_from_slice(&(size as u32).to_le_bytes());
        let mut bits = vec![0u8; size.div_ceil(8)];
        for &m in &d.members {
            assert!(m < size, "member {m} of {size}");
            bits[m / 8] |= 1 << (m % 8);
        }
        out.extend_from_slice(&bits);
    };
    match message {
        Message::Prepare { ballot: b } => {
            out.push(1);
            ballot(&mut out, b);
        }
        Message::Promise {
            ballot: b,
            accepted,
            input,
        } => {
            out.push(2);
            ballot(&mut out, b);
            out.extend_from_slice(&input.to_le_bytes());
            match accepted {
                None => out.push(0),
                Some((ab, d)) => {
                    out.push(1);
                    ballot(&mut out, ab);
                    decision(&mut out, d);
                }
            }
        }
        Message::Nack { promised } => {
            out.push(3);
            ballot(&mut out, promised);
        }
        Message::Accept {
            ballot: b,
            decision: d,
        } => {
            out.push(4);
            ballot(&mut out, b);
            decision(&mut out, d);
        }
        Message::Accepted { ballot: b } => {
            out.push(5);
            ballot(&mut out, b);
        }
        Message::Decide { decision: d } => {
            out.push(6);
            decision(&mut out, d);
        }
    }
    out
}

/// Reads fields off the front of a payload, every read checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(WireError::PayloadTruncated {
                what: WHAT,
                needed: self.at.saturating_add(n),
                got: self.bytes.len(),
            });
        };
        let field = &self.bytes[self.at..end];
        self.at = end;
        Ok(field)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn ballot(&mut self) -> Result<Ballot, WireError> {
        Ok(Ballot {
            round: self.u32()?,
            rank: self.u32()?,
        })
    }

    /// A decision of a communicator of `size` members.
    fn decision(&mut self, size: usize) -> Result<Decision, WireError> {
        let value = self.u64()?;
        let theirs = self.u32()? as usize;
        if theirs != size {
            return Err(WireError::CountMismatch {
                field: "agreement: the members' communicator size",
                got: theirs as u32,
                expected: size as u32,
            });
        }
        let bits = self.take(size.div_ceil(8))?;
        if !size.is_multiple_of(8) && bits[bits.len() - 1] >> (size % 8) != 0 {
            return Err(WireError::NonZeroReserved {
                field: "agreement: member bits past the last member",
                value: u32::from(bits[bits.len() - 1]),
            });
        }
        let members = (0..size)
            .filter(|&m| bits[m / 8] & (1 << (m % 8)) != 0)
            .collect();
        Ok(Decision { value, members })
    }

    fn finish<T>(self, value: T) -> Result<T, WireError> {
        match self.bytes.len() - self.at {
            0 => Ok(value),
            extra => Err(WireError::TrailingBytes { what: WHAT, extra }),
        }
    }
}

/// Decodes an agreement message of a communicator of `size` members.
pub fn decode(bytes: &[u8], size: usize) -> Result<Message, WireError> {
    if size > MAX_MEMBERS {
        return Err(WireError::FieldTooLong {
            field: "agreement members",
            len: size,
            max: MAX_MEMBERS,
        });
    }
    let mut r = Reader { bytes, at: 0 };
    let message = match r.u8()? {
        1 => Message::Prepare { ballot: r.ballot()? },
        2 => {
            let ballot = r.ballot()?;
            let input = r.u64()?;
            let accepted = match r.u8()? {
                0 => None,
                1 => Some((r.ballot()?, r.decision(size)?)),
                other => {
                    return Err(WireError::UnknownField {
                        field: "agreement: accepted flag",
                        value: other,
                    });
                }
            };
            Message::Promise {
                ballot,
                accepted,
                input,
            }
        }
        3 => Message::Nack {
            promised: r.ballot()?,
        },
        4 => Message::Accept {
            ballot: r.ballot()?,
            decision: r.decision(size)?,
        },
        5 => Message::Accepted {
            ballot: r.ballot()?,
        },
        6 => Message::Decide {
            decision: r.decision(size)?,
        },
        tag => {
            return Err(WireError::UnknownField {
                field: "agreement message",
                value: tag,
            });
        }
    };
    r.finish(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    fn random_message(rng: &mut Rng, size: usize) -> Message {
        let ballot = |rng: &mut Rng| Ballot {
            round: rng.below(1 << 20) as u32,
            rank: rng.below(size as u64) as u32,
        };
        let decision = |rng: &mut Rng| Decision {
            value: rng.next_u64(),
            members: (0..size).filter(|_| rng.below(3) != 0).collect(),
        };
        match rng.below(7) {
            0 => Message::Prepare { ballot: ballot(rng) },
            1 => Message::Promise {
                ballot: ballot(rng),
                accepted: None,
                input: rng.next_u64(),
            },
            2 => Message::Promise {
                ballot: ballot(rng),
                accepted: Some((ballot(rng), decision(rng))),
                input: rng.next_u64(),
            },
            3 => Message::Nack {
                promised: ballot(rng),
            },
            4 => Message::Accept {
                ballot: ballot(rng),
                decision: decision(rng),
            },
            5 => Message::Accepted { ballot: ballot(rng) },
            _ => Message::Decide {
                decision: decision(rng),
            },
        }
    }

    #[test]
    fn every_message_round_trips_and_every_prefix_is_refused() {
        let mut rng = Rng::new(Rng::fresh_seed());
        for _ in 0..2000 {
            let size = 1 + rng.below(40) as usize;
            let m = random_message(&mut rng, size);
            let bytes = encode(&m, size);
            assert!(bytes.len() <= MAX_PAYLOAD);
            assert_eq!(decode(&bytes, size), Ok(m.clone()));
            for cut in 0..bytes.len() {
                assert!(
                    matches!(
                        decode(&bytes[..cut], size),
                        Err(WireError::PayloadTruncated { .. })
                    ),
                    "{m:?} cut at {cut}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(matches!(
                decode(&longer, size),
                Err(WireError::TrailingBytes { extra: 1, .. })
            ));
        }
    }

    #[test]
    fn bad_tags_sizes_and_stray_bits_are_refused() {
        assert!(matches!(
            decode(&[9], 4),
            Err(WireError::UnknownField { value: 9, .. })
        ));
        let decide = Message::Decide {
            decision: Decision {
                value: 7,
                members: vec![0, 2],
            },
        };
        let bytes = encode(&decide, 3);
        // Read as a communicator of another size.
        assert!(matches!(
            decode(&bytes, 4),
            Err(WireError::CountMismatch {
                got: 3,
                expected: 4,
                ..
            })
        ));
        // A bit for a fourth member of three.
        let mut stray = bytes.clone();
        *stray.last_mut().unwrap() |= 1 << 3;
        assert!(matches!(
            decode(&stray, 3),
            Err(WireError::NonZeroReserved { .. })
        ));
        assert!(matches!(
            decode(&[6], MAX_MEMBERS + 1),
            Err(WireError::FieldTooLong { .. })
        ));
        // The largest decision fits the payload bound.
        let all = Message::Decide {
            decision: Decision {
                value: 0,
                members: (0..MAX_MEMBERS).collect(),
            },
        };
        let bytes = encode(&all, MAX_MEMBERS);
        assert!(bytes.len() <= MAX_PAYLOAD);
        assert_eq!(decode(&bytes, MAX_MEMBERS), Ok(all));
    }
}
