//! The segment and arena exchange that starts a shared-memory link, over
//! its Unix socket right after the handshake: the dialer makes the rings'
//! segment and offers it (SCM_RIGHTS), the acceptor checks and maps it and
//! answers; then each passes its arena (decision 0030). Anything garbled
//! is an error; a segment or arena that cannot be made or mapped is `None`
//! (the link stays a Unix socket, or its collectives run over the links).

use super::RING_BYTES;
use crate::arena::Arena;
use ringwire_shm::arena::ARENA_BYTES;
use ringwire_shm::{RING_HEADER, Segment, recv_fd, send_fd};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// What the dialer sends with the segment: magic, version, ring bytes.
const OFFER_MAGIC: &[u8; 4] = b"RWSM";
const OFFER_VERSION: u32 = 2;
const OFFER_LEN: usize = 16;

/// What a rank sends with its arena: magic, version, arena bytes (0: it
/// has none, and no descriptor comes).
const ARENA_MAGIC: &[u8; 4] = b"RWAR";

/// Passes this process's arena (or says it has none).
pub(super) fn give_arena(sock: &UnixStream, arena: Option<&Arena>) -> io::Result<()> {
    let mut msg = [0u8; OFFER_LEN];
    msg[..4].copy_from_slice(ARENA_MAGIC);
    msg[4..8].copy_from_slice(&OFFER_VERSION.to_le_bytes());
    match arena {
        Some(arena) => {
            msg[8..16].copy_from_slice(&(ARENA_BYTES as u64).to_le_bytes());
            send_fd(sock, arena.fd(), &msg)
        }
        None => io::Write::write_all(&mut &*sock, &msg),
    }
}

/// Takes the peer's arena: mapped if it has one of this build's layout.
/// One that cannot be mapped leaves the link without it (its collectives
/// run over the links: the communicator's vote sees it).
pub(super) fn take_arena(sock: &UnixStream) -> io::Result<Option<Arc<ringwire_shm::Mapping>>> {
    let mut msg = [0u8; OFFER_LEN];
    let (n, fd) = recv_fd(sock, &mut msg)?;
    if n != OFFER_LEN || &msg[..4] != ARENA_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer's arena message is garbled",
        ));
    }
    let len = u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes")) as usize;
    let Some(fd) = fd else {
        return Ok(None);
    };
    if len != ARENA_BYTES {
        tracing::warn!(
            len,
            "a local peer's arena has another layout: collectives with it run over the links"
        );
        return Ok(None);
    }
    match Segment::open(fd, ARENA_BYTES) {
        Ok(segment) if crate::arena::is_arena(segment.mapping()) => {
            Ok(Some(Arc::new(segment.into_mapping())))
        }
        Ok(_) => Ok(None),
        Err(e) => {
            tracing::warn!(error = %e, "could not map a local peer's arena: collectives with it run over the links");
            Ok(None)
        }
    }
}

/// Segment bytes for two rings.
pub(super) fn segment_len() -> usize {
    2 * (RING_HEADER + RING_BYTES)
}

/// The dialer's half: makes the segment and offers it; `None` if it could
/// not (the acceptor is told, and both keep the Unix link).
pub(super) fn offer(sock: &UnixStream) -> io::Result<Option<Segment>> {
    let mut msg = [0u8; OFFER_LEN];
    msg[..4].copy_from_slice(OFFER_MAGIC);
    msg[4..8].copy_from_slice(&OFFER_VERSION.to_le_bytes());
    match Segment::create(segment_len()) {
        Ok(mut segment) => {
            msg[8..16].copy_from_slice(&(RING_BYTES as u64).to_le_bytes());
            let fd = segment.take_fd().expect("a segment made here has its fd");
            send_fd(sock, fd.as_fd(), &msg)?;
            drop(fd);
            let mut answer = [0u8; 1];
            (&*sock).read_exact(&mut answer)?;
            Ok((answer[0] == 1).then_some(segment))
        }
        Err(e) => {
            tracing::warn!(error = %e, "no shared memory for a local link (memfd or mmap refused?): it stays a Unix socket");
            // Ring size 0: no segment comes.
            io::Write::write_all(&mut &*sock, &msg)?;
            Ok(None)
        }
    }
}

/// The acceptor's half: takes and checks the offered segment, and says
/// whether it mapped it.
pub(super) fn take(sock: &UnixStream) -> io::Result<Option<Segment>> {
    let mut msg = [0u8; OFFER_LEN];
    let (n, fd) = recv_fd(sock, &mut msg)?;
    if n != OFFER_LEN || &msg[..4] != OFFER_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer's shared-memory offer is garbled",
        ));
    }
    let version = u32::from_le_bytes(msg[4..8].try_into().expect("4 bytes"));
    let ring = u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes")) as usize;
    let Some(fd) = fd else {
        return Ok(None); // the dialer has none
    };
    let mapped = if version != OFFER_VERSION || ring != RING_BYTES {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the peer offers rings of {ring} bytes (version {version}); this build uses {RING_BYTES} (version {OFFER_VERSION})"
            ),
        ))
    } else {
        Segment::open(fd, segment_len())
    };
    let answer = [u8::from(mapped.is_ok())];
    io::Write::write_all(&mut &*sock, &answer)?;
    match mapped {
        Ok(segment) => Ok(Some(segment)),
        Err(e) => {
            tracing::warn!(error = %e, "could not map a local peer's shared memory: the link stays a Unix socket");
            Ok(None)
        }
    }
}
