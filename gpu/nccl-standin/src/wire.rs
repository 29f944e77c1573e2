//! Socket helpers shared by the rendezvous and the mesh: reads that give up
//! when the comm is aborted, and the frame format of the mesh.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How often a blocked setup read looks at the abort flag.
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// Fills `buf` from `stream`, checking `stop` between short timed reads:
/// an abort ends the wait with `Interrupted`, a deadline with `TimedOut`.
pub(crate) fn read_full(
    stream: &mut TcpStream,
    buf: &mut [u8],
    stop: &dyn Fn() -> bool,
    deadline: Option<Instant>,
) -> io::Result<()> {
    stream.set_read_timeout(Some(POLL))?;
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if stop() {
                    return Err(io::Error::new(io::ErrorKind::Interrupted, "aborted"));
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
    stream.set_read_timeout(None)
}

/// What a mesh frame carries, which the receiver checks against what it
/// expects: collective frames match by the comm's collective count,
/// point-to-point ones by the count of sends between the two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tag {
    pub(crate) kind: u8,
    pub(crate) dtype: u8,
    pub(crate) seq: u64,
    pub(crate) len: u64,
}

/// `Tag::kind` of point-to-point frames; collectives use 1 to 5.
pub(crate) const KIND_P2P: u8 = 6;
/// `Tag::kind` of the frames `ncclCommShrink` exchanges over the parent's
/// mesh (each staying rank's data port and exclusion list).
pub(crate) const KIND_SHRINK: u8 = 7;

/// The name of a frame kind, for messages.
pub(crate) fn kind_name(kind: u8) -> &'static str {
    match kind {
        1 => "AllReduce",
        2 => "Broadcast",
        3 => "Reduce",
        4 => "AllGather",
        5 => "ReduceScatter",
        KIND_P2P => "Send/Recv",
        KIND_SHRINK => "CommShrink",
        _ => "unknown",
    }
}

const HEADER: usize = 20;

/// Writes one frame: kind, dtype, two zero bytes, seq and length (LE),
/// then the payload.
pub(crate) fn write_frame(stream: &mut TcpStream, tag: Tag, payload: &[u8]) -> io::Result<()> {
    let mut header = [0u8; HEADER];
    header[0] = tag.kind;
    header[1] = tag.dtype;
    header[4..12].copy_from_slice(&tag.seq.to_le_bytes());
    header[12..20].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    stream.write_all(&header)?;
    stream.write_all(payload)
}

/// Reads one frame (blocking); `None` at end of stream or on an error.
pub(crate) fn read_frame(stream: &mut TcpStream) -> Option<(Tag, Vec<u8>)> {
    let mut header = [0u8; HEADER];
    stream.read_exact(&mut header).ok()?;
    let seq = u64::from_le_bytes(header[4..12].try_into().ok()?);
    let len = u64::from_le_bytes(header[12..20].try_into().ok()?);
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    stream.read_exact(&mut payload).ok()?;
    let tag = Tag {
        kind: header[0],
        dtype: header[1],
        seq,
        len,
    };
    Some((tag, payload))
}
