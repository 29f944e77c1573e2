//! The fixed 56-byte header at the start of every frame.
//!
//! [`RawHeader`] is the exact wire layout: a `#[repr(C)]` struct of bytes and
//! little-endian integers with no padding and alignment 1, so it is read from
//! and written to a byte buffer by zerocopy without copying field by field and
//! without `unsafe`. [`Header`] is the validated form the rest of the crate
//! uses: enumerations decoded, reserved fields checked, the payload length
//! checked against the receiver's limit.
//!
//! | offset | size | field         | meaning                                             |
//! |-------:|-----:|---------------|-----------------------------------------------------|
//! |      0 |    4 | `magic`       | `b"RGWR"`                                           |
//! |      4 |    2 | `version`     | [`PROTOCOL_VERSION`]                                |
//! |      6 |    1 | `kind`        | [`FrameKind`]                                       |
//! |      7 |    1 | `flags`       | reserved for extensions; passed through unchecked   |
//! |      8 |    8 | `comm_id`     | communicator the frame belongs to                   |
//! |     16 |    8 | `seq`         | collective sequence number within the communicator  |
//! |     24 |    1 | `op`          | [`OpKind`] (0 for control frames)                   |
//! |     25 |    1 | `dtype`       | [`DType`] byte, 0 for none                          |
//! |     26 |    1 | `reduce_op`   | [`ReduceOp`] byte, 0 for none                       |
//! |     27 |    1 | `pad`         | zero bytes between header and payload, 0..=63       |
//! |     28 |    4 | `step`        | schedule step the frame belongs to                  |
//! |     32 |    4 | `chunk`       | chunk index within the step                         |
//! |     36 |    4 | `payload_len` | bytes that follow the header                        |
//! |     40 |    4 | `root`        | root rank for rooted collectives                    |
//! |     44 |    8 | `count`       | element count of the whole collective               |
//! |     52 |    4 | `reserved2`   | must be 0                                           |
//!
//! A frame is the header, `pad` zero bytes, `payload_len` payload bytes, and
//! zero bytes up to the next multiple of [`FRAME_ALIGN`] (64). The sender
//! picks `pad` so that the payload lies at the same offset within a 64-byte
//! line in the socket's buffer as in its own memory
//! ([`aligning_pad`]): the kernel's copy of a payload runs up to 15x
//! slower when its destination sits 1-15 bytes past its source modulo
//! 4 KiB, and a fixed 56-byte header put it there for some source offsets
//! (docs/decisions/0016). Whole frames keep the next frame's start
//! aligned too, whatever came before it on the socket.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::kind::{FrameKind, OpKind};
use super::{FRAME_ALIGN, HEADER_LEN, MAGIC, PROTOCOL_VERSION, WireError};
use crate::dtype::{DType, ReduceOp};

/// The frame header exactly as it is on the wire. Use [`Header`] unless you
/// are writing the codec itself: nothing in a `RawHeader` has been checked.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct RawHeader {
    pub magic: [u8; 4],
    pub version: U16,
    pub kind: u8,
    pub flags: u8,
    pub comm_id: U64,
    pub seq: U64,
    pub op: u8,
    pub dtype: u8,
    pub reduce_op: u8,
    pub pad: u8,
    pub step: U32,
    pub chunk: U32,
    pub payload_len: U32,
    pub root: U32,
    pub count: U64,
    pub reserved2: U32,
}

/// A validated frame header. The magic, version and reserved fields are
/// implied: [`Header::encode`] writes them and [`Header::decode`] checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    pub kind: FrameKind,
    /// Extension bits; none are defined yet. Carried through unchanged.
    pub flags: u8,
    pub comm_id: u64,
    pub seq: u64,
    pub op: OpKind,
    pub dtype: Option<DType>,
    pub reduce_op: Option<ReduceOp>,
    pub step: u32,
    pub chunk: u32,
    /// Zero bytes between the header and the payload (below
    /// [`FRAME_ALIGN`]); see [`aligning_pad`].
    pub pad: u8,
    /// Bytes of payload that follow the header and the pad.
    pub payload_len: u32,
    pub root: u32,
    pub count: u64,
}

impl Header {
    /// A control-frame header (no op, dtype or reduce op; everything else 0).
    pub const fn control(kind: FrameKind, comm_id: u64, seq: u64, payload_len: u32) -> Header {
        Header {
            kind,
            flags: 0,
            comm_id,
            seq,
            op: OpKind::None,
            dtype: None,
            reduce_op: None,
            step: 0,
            chunk: 0,
            pad: 0,
            payload_len,
            root: 0,
            count: 0,
        }
    }

    /// A data-frame header for collective `op` over elements of `dtype`, with
    /// everything else 0; set the rest with the `with_*` methods or struct syntax.
    pub const fn data(comm_id: u64, seq: u64, op: OpKind, dtype: DType) -> Header {
        Header {
            kind: FrameKind::Data,
            op,
            dtype: Some(dtype),
            ..Header::control(FrameKind::Data, comm_id, seq, 0)
        }
    }

    /// Sets the reduce operator.
    #[cfg(any(test, feature = "internals"))]
    #[must_use]
    pub const fn with_reduce_op(mut self, reduce_op: ReduceOp) -> Header {
        self.reduce_op = Some(reduce_op);
        self
    }

    /// Sets the schedule position (`step`, `chunk`).
    #[must_use]
    pub const fn with_step(mut self, step: u32, chunk: u32) -> Header {
        self.step = step;
        self.chunk = chunk;
        self
    }

    /// Sets the payload length in bytes.
    #[must_use]
    pub const fn with_payload_len(mut self, payload_len: u32) -> Header {
        self.payload_len = payload_len;
        self
    }

    /// Sets the root rank.
    #[must_use]
    pub const fn with_root(mut self, root: u32) -> Header {
        self.root = root;
        self
    }

    /// Sets the collective's total element count.
    #[must_use]
    pub const fn with_count(mut self, count: u64) -> Header {
        self.count = count;
        self
    }

    /// The payload length as a `usize`, for sizing reads.
    pub fn payload_len_usize(&self) -> usize {
        usize::try_from(self.payload_len).unwrap_or(usize::MAX)
    }

    /// Sets the pad between header and payload (below [`FRAME_ALIGN`]).
    #[must_use]
    pub const fn with_pad(mut self, pad: u8) -> Header {
        self.pad = pad;
        self
    }

    /// Where the payload starts, counted from the frame's first byte.
    pub fn payload_offset(&self) -> usize {
        HEADER_LEN + usize::from(self.pad)
    }

    /// The whole frame in bytes: header, pad, payload and the zero bytes
    /// that round it up to a multiple of [`FRAME_ALIGN`].
    pub fn frame_len(&self) -> usize {
        self.payload_offset()
            .saturating_add(self.payload_len_usize())
            .saturating_add(FRAME_ALIGN - 1)
            / FRAME_ALIGN
            * FRAME_ALIGN
    }

    /// The zero bytes after the payload.
    pub fn trail_len(&self) -> usize {
        trail_len(self.payload_offset() + self.payload_len_usize())
    }

    /// The raw wire form.
    pub fn to_raw(&self) -> RawHeader {
        RawHeader {
            magic: MAGIC,
            version: U16::new(PROTOCOL_VERSION),
            kind: self.kind as u8,
            flags: self.flags,
            comm_id: U64::new(self.comm_id),
            seq: U64::new(self.seq),
            op: self.op as u8,
            dtype: self.dtype.map_or(0, |d| d as u8),
            reduce_op: self.reduce_op.map_or(0, |r| r as u8),
            pad: self.pad,
            step: U32::new(self.step),
            chunk: U32::new(self.chunk),
            payload_len: U32::new(self.payload_len),
            root: U32::new(self.root),
            count: U64::new(self.count),
            reserved2: U32::new(0),
        }
    }

    /// The 56 wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        zerocopy::transmute!(self.to_raw())
    }

    /// Decodes and validates the header at the start of `bytes` (bytes past
    /// [`HEADER_LEN`] are ignored). `max_payload` is the largest `payload_len`
    /// the caller accepts.
    pub fn decode(bytes: &[u8], max_payload: u32) -> Result<Header, WireError> {
        let Ok((raw, _)) = RawHeader::read_from_prefix(bytes) else {
            return Err(WireError::Truncated {
                needed: HEADER_LEN,
                got: bytes.len(),
            });
        };
        Header::from_raw(&raw, max_payload)
    }

    /// Validates a raw header; see [`Header::decode`]. Checks magic and
    /// version first, so a foreign or newer peer gets the error that says so
    /// rather than one about a field it laid out differently.
    pub fn from_raw(raw: &RawHeader, max_payload: u32) -> Result<Header, WireError> {
        if raw.magic != MAGIC {
            return Err(WireError::BadMagic(raw.magic));
        }
        if raw.version.get() != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion {
                got: raw.version.get(),
                supported: PROTOCOL_VERSION,
            });
        }
        let unknown = |field, value| WireError::UnknownField { field, value };
        let kind = FrameKind::from_u8(raw.kind).ok_or(unknown("header.kind", raw.kind))?;
        let op = OpKind::from_u8(raw.op).ok_or(unknown("header.op", raw.op))?;
        let dtype = match raw.dtype {
            0 => None,
            b => Some(DType::from_u8(b).ok_or(unknown("header.dtype", b))?),
        };
        let reduce_op = match raw.reduce_op {
            0 => None,
            b => Some(ReduceOp::from_u8(b).ok_or(unknown("header.reduce_op", b))?),
        };
        if usize::from(raw.pad) >= FRAME_ALIGN {
            return Err(WireError::PadTooLong { pad: raw.pad });
        }
        if raw.reserved2.get() != 0 {
            return Err(WireError::NonZeroReserved {
                field: "header.reserved2",
                value: raw.reserved2.get(),
            });
        }
        let payload_len = raw.payload_len.get();
        if payload_len > max_payload {
            return Err(WireError::PayloadTooLarge {
                len: payload_len,
                max: max_payload,
            });
        }
        Ok(Header {
            kind,
            flags: raw.flags,
            comm_id: raw.comm_id.get(),
            seq: raw.seq.get(),
            op,
            dtype,
            reduce_op,
            step: raw.step.get(),
            chunk: raw.chunk.get(),
            pad: raw.pad,
            payload_len,
            root: raw.root.get(),
            count: raw.count.get(),
        })
    }
}

/// The pad that puts a payload starting at memory address `payload_address`
/// at the same offset within a [`FRAME_ALIGN`]-byte line of the frame as it
/// has in memory (`HEADER_LEN + pad ≡ payload_address`, mod 64). Frames
/// start aligned in the socket's buffer, so the kernel then copies the
/// payload between equally aligned addresses.
pub fn aligning_pad(payload_address: usize) -> u8 {
    // Below FRAME_ALIGN (64), so it fits a byte.
    (payload_address.wrapping_sub(HEADER_LEN) % FRAME_ALIGN) as u8
}

/// The zero bytes that round `len` (header, pad and payload) up to a whole
/// frame.
pub fn trail_len(len: usize) -> usize {
    (FRAME_ALIGN - len % FRAME_ALIGN) % FRAME_ALIGN
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Tiny xorshift64 PRNG for the mutation loops (no `rand` dependency).
    pub(crate) struct XorShift(pub(crate) u64);

    impl XorShift {
        pub(crate) fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        /// A value in `0..n` (`n > 0`).
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        /// Flips, overwrites, truncates or extends `bytes` a few times.
        pub(crate) fn mutate(&mut self, bytes: &mut Vec<u8>) {
            for _ in 0..1 + self.below(4) {
                match self.below(6) {
                    0 | 1 if !bytes.is_empty() => {
                        let i = self.below(bytes.len());
                        bytes[i] ^= 1 << self.below(8);
                    }
                    2 if !bytes.is_empty() => {
                        let i = self.below(bytes.len());
                        bytes[i] = self.next() as u8;
                    }
                    3 => {
                        let len = self.below(bytes.len() + 1);
                        bytes.truncate(len);
                    }
                    4 => {
                        let extra = self.below(8);
                        bytes.extend((0..extra).map(|_| self.next() as u8));
                    }
                    _ if bytes.len() >= 4 => {
                        // Write an extreme little-endian u32 at a random spot,
                        // which is how lengths go wrong.
                        let i = self.below(bytes.len() - 3);
                        let v = [0, 1, u32::MAX, u32::MAX / 2, 0x8000_0000][self.below(5)];
                        bytes[i..i + 4].copy_from_slice(&v.to_le_bytes());
                    }
                    _ => {}
                }
            }
        }
    }

    fn sample() -> Header {
        Header::data(0x0102_0304_0506_0708, 42, OpKind::AllReduce, DType::F32)
            .with_reduce_op(ReduceOp::Sum)
            .with_step(3, 7)
            .with_payload_len(4096)
            .with_root(2)
            .with_count(1 << 40)
            .with_pad(9)
    }

    #[test]
    fn layout_is_56_bytes_little_endian() {
        assert_eq!(HEADER_LEN, 56);
        assert_eq!(align_of::<RawHeader>(), 1);
        let bytes = sample().encode();
        assert_eq!(&bytes[0..4], b"RGWR");
        assert_eq!(bytes[4..6], [5, 0]);
        assert_eq!(bytes[6], FrameKind::Data as u8);
        assert_eq!(bytes[7], 0);
        assert_eq!(bytes[8..16], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(bytes[16..24], 42u64.to_le_bytes());
        assert_eq!(bytes[24..28], [1, 1, 1, 9]);
        assert_eq!(bytes[28..32], 3u32.to_le_bytes());
        assert_eq!(bytes[32..36], 7u32.to_le_bytes());
        assert_eq!(bytes[36..40], 4096u32.to_le_bytes());
        assert_eq!(bytes[40..44], 2u32.to_le_bytes());
        assert_eq!(bytes[44..52], (1u64 << 40).to_le_bytes());
        assert_eq!(bytes[52..56], [0; 4]);
    }

    #[test]
    fn round_trips_every_kind_op_dtype_reduce_op() {
        let dtypes = DType::ALL.map(Some).into_iter().chain([None]);
        for dtype in dtypes {
            let reduce_ops = ReduceOp::ALL.map(Some).into_iter().chain([None]);
            for reduce_op in reduce_ops {
                for kind in FrameKind::ALL {
                    for op in OpKind::ALL {
                        let h = Header {
                            kind,
                            op,
                            dtype,
                            reduce_op,
                            flags: 0x5a,
                            ..sample()
                        };
                        let bytes = h.encode();
                        assert_eq!(Header::decode(&bytes, u32::MAX), Ok(h));
                        assert_eq!(Header::decode(&bytes, 4096), Ok(h));
                        // Canonical: re-encoding the decoded header gives the same bytes.
                        assert_eq!(Header::decode(&bytes, u32::MAX).unwrap().encode(), bytes);
                    }
                }
            }
        }
    }

    #[test]
    fn extremes_round_trip() {
        let h = Header {
            flags: u8::MAX,
            comm_id: u64::MAX,
            seq: u64::MAX,
            step: u32::MAX,
            chunk: u32::MAX,
            payload_len: u32::MAX,
            root: u32::MAX,
            count: u64::MAX,
            ..Header::control(FrameKind::Data, 0, 0, 0)
        };
        assert_eq!(Header::decode(&h.encode(), u32::MAX), Ok(h));
        assert_eq!(h.payload_len_usize(), u32::MAX as usize);
        // Rounded up to whole 64-byte lines: 56 + 2^32 - 1 bytes.
        assert_eq!(h.frame_len(), (1 << 32) + 64);
        assert_eq!(h.trail_len(), 9);
        let padded = h.with_pad(63);
        assert_eq!(Header::decode(&padded.encode(), u32::MAX), Ok(padded));
        assert_eq!(padded.frame_len(), (1 << 32) + 128);
    }

    #[test]
    fn frames_are_whole_lines_and_the_pad_keeps_the_payload_aligned() {
        for len in [0u32, 1, 7, 8, 63, 64, 65, 4096, 1 << 20] {
            for pad in [0u8, 1, 8, 55, 63] {
                let h = sample().with_payload_len(len).with_pad(pad);
                let end = h.payload_offset() + len as usize;
                assert_eq!(h.payload_offset(), 56 + pad as usize);
                assert_eq!(h.frame_len() % FRAME_ALIGN, 0, "len {len} pad {pad}");
                assert!(h.frame_len() >= end && h.frame_len() < end + FRAME_ALIGN);
                assert_eq!(h.trail_len(), h.frame_len() - end);
            }
        }
        assert_eq!(sample().with_payload_len(8).with_pad(0).frame_len(), 64);
        // The payload lands at its own address's offset within a line.
        for address in [0usize, 16, 41, 48, 55, 56, 57, 63, 64, 4095, 4096 + 44] {
            let pad = aligning_pad(address);
            assert!(usize::from(pad) < FRAME_ALIGN);
            assert_eq!(
                (HEADER_LEN + usize::from(pad)) % 64,
                address % 64,
                "{address}"
            );
        }
        assert_eq!(aligning_pad(56), 0);
        assert_eq!(aligning_pad(48), 56);
        assert_eq!(aligning_pad(16), 24);
    }

    #[test]
    fn trailing_bytes_are_ignored() {
        let mut bytes = sample().encode().to_vec();
        bytes.extend_from_slice(b"payload");
        assert_eq!(Header::decode(&bytes, u32::MAX), Ok(sample()));
    }

    /// `sample()` encoded, with byte `at` set to `value`.
    fn patched(at: usize, value: u8) -> [u8; HEADER_LEN] {
        let mut bytes = sample().encode();
        bytes[at] = value;
        bytes
    }

    #[test]
    fn each_error() {
        let bytes = sample().encode();
        for len in 0..HEADER_LEN {
            assert_eq!(
                Header::decode(&bytes[..len], u32::MAX),
                Err(WireError::Truncated {
                    needed: 56,
                    got: len
                })
            );
        }
        assert_eq!(
            Header::decode(&patched(0, b'G'), u32::MAX),
            Err(WireError::BadMagic(*b"GGWR"))
        );
        assert_eq!(
            Header::decode(&patched(4, 1), u32::MAX),
            Err(WireError::UnsupportedVersion {
                got: 1,
                supported: 5
            })
        );
        assert_eq!(
            Header::decode(&patched(5, 1), u32::MAX),
            Err(WireError::UnsupportedVersion {
                got: 261,
                supported: 5
            })
        );
        let unknown = |field, value| Err(WireError::UnknownField { field, value });
        assert_eq!(
            Header::decode(&patched(6, 0), u32::MAX),
            unknown("header.kind", 0)
        );
        assert_eq!(
            Header::decode(&patched(6, 6), u32::MAX),
            unknown("header.kind", 6)
        );
        assert_eq!(
            Header::decode(&patched(24, 11), u32::MAX),
            unknown("header.op", 11)
        );
        assert_eq!(
            Header::decode(&patched(25, 8), u32::MAX),
            unknown("header.dtype", 8)
        );
        assert_eq!(
            Header::decode(&patched(26, 6), u32::MAX),
            unknown("header.reduce_op", 6)
        );
        assert_eq!(
            Header::decode(&patched(27, 64), u32::MAX),
            Err(WireError::PadTooLong { pad: 64 })
        );
        assert_eq!(
            Header::decode(&patched(27, 255), u32::MAX),
            Err(WireError::PadTooLong { pad: 255 })
        );
        assert_eq!(
            Header::decode(&patched(55, 0x80), u32::MAX),
            Err(WireError::NonZeroReserved {
                field: "header.reserved2",
                value: 0x8000_0000
            })
        );
        assert_eq!(
            Header::decode(&bytes, 4095),
            Err(WireError::PayloadTooLarge {
                len: 4096,
                max: 4095
            })
        );
    }

    #[test]
    fn mutated_headers_never_panic() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let valid = sample().encode();
        let mut ok = 0;
        for _ in 0..20_000 {
            let mut bytes = valid.to_vec();
            rng.mutate(&mut bytes);
            if let Ok(h) = Header::decode(&bytes, 1 << 20) {
                ok += 1;
                assert!(h.payload_len <= 1 << 20);
                assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
            }
        }
        assert!(ok > 0, "some mutations (e.g. of comm_id) stay valid");
    }
}
