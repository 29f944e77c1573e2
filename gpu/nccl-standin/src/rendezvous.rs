//! Bootstrap: the unique id and the root that introduces a comm's ranks.
//!
//! `ncclGetUniqueId` starts a root (a listener on 127.0.0.1 and a thread,
//! as real NCCL starts its bootstrap thread there). The id's 128 bytes are
//! a magic, the root's port (u16 LE), a random nonce (u64 LE) and zeros.
//! Each rank registers (nonce, nranks, rank, its data listener's port);
//! once all nranks have, the root answers everyone with the table of
//! ports, or an error if they disagree on nranks or repeat a rank, and
//! exits: an id serves one comm, as in NCCL.

use crate::codes::{INVALID_USAGE, NcclResult, SYSTEM_ERROR};
use crate::wire;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant, SystemTime};

const ID_MAGIC: &[u8; 8] = b"RWSTNDIN";
const REGISTER_LEN: usize = 26;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a unique id says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BootstrapId {
    pub(crate) port: u16,
    pub(crate) nonce: u64,
}

impl BootstrapId {
    pub(crate) fn to_bytes(self) -> [u8; 128] {
        let mut bytes = [0u8; 128];
        bytes[..8].copy_from_slice(ID_MAGIC);
        bytes[8..10].copy_from_slice(&self.port.to_le_bytes());
        bytes[10..18].copy_from_slice(&self.nonce.to_le_bytes());
        bytes
    }

    /// `None` unless `bytes` came from this stand-in's `ncclGetUniqueId`.
    pub(crate) fn parse(bytes: &[u8; 128]) -> Option<BootstrapId> {
        if &bytes[..8] != ID_MAGIC {
            return None;
        }
        Some(BootstrapId {
            port: u16::from_le_bytes(bytes[8..10].try_into().ok()?),
            nonce: u64::from_le_bytes(bytes[10..18].try_into().ok()?),
        })
    }
}

fn random_nonce() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(now) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}

/// Starts a root and returns its id.
pub(crate) fn start_root() -> io::Result<BootstrapId> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let id = BootstrapId {
        port: listener.local_addr()?.port(),
        nonce: random_nonce(),
    };
    std::thread::Builder::new()
        .name("standin-bootstrap".into())
        .spawn(move || serve(&listener, id.nonce))?;
    Ok(id)
}

struct Member {
    stream: TcpStream,
    rank: u32,
    port: u16,
}

fn refuse(stream: &mut TcpStream, text: &str) {
    let mut reply = vec![1u8];
    reply.extend_from_slice(&u32::try_from(text.len()).unwrap_or(0).to_le_bytes());
    reply.extend_from_slice(text.as_bytes());
    let _ = stream.write_all(&reply);
}

/// The root's thread: one round of registrations, then it exits.
fn serve(listener: &TcpListener, nonce: u64) {
    let mut members: Vec<Member> = Vec::new();
    let mut expected: Option<u32> = None;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let mut msg = [0u8; REGISTER_LEN];
        let _ = stream.set_read_timeout(Some(REGISTER_TIMEOUT));
        if stream.read_exact(&mut msg).is_err() {
            continue;
        }
        let field = |at: usize| u32::from_le_bytes(msg[at..at + 4].try_into().unwrap_or_default());
        let (nranks, rank) = (field(16), field(20));
        let port = u16::from_le_bytes([msg[24], msg[25]]);
        if &msg[..8] != ID_MAGIC || msg[8..16] != nonce.to_le_bytes() {
            refuse(
                &mut stream,
                "stand-in NCCL: bootstrap: not this id's registration",
            );
            continue;
        }
        let first = *expected.get_or_insert(nranks);
        let problem = if nranks != first {
            Some(format!(
                "rank {rank} says there are {nranks} ranks but an earlier rank said {first}"
            ))
        } else if rank >= nranks {
            Some(format!("rank {rank} is out of range for {nranks} ranks"))
        } else if members.iter().any(|m| m.rank == rank) {
            Some(format!("rank {rank} registered twice"))
        } else {
            None
        };
        if let Some(problem) = problem {
            let text = format!("stand-in NCCL: bootstrap: {problem}");
            refuse(&mut stream, &text);
            for member in &mut members {
                refuse(&mut member.stream, &text);
            }
            return;
        }
        members.push(Member { stream, rank, port });
        if members.len() == first as usize {
            members.sort_by_key(|m| m.rank);
            let mut reply = vec![0u8];
            for member in &members {
                reply.extend_from_slice(&member.port.to_le_bytes());
            }
            for member in &mut members {
                let _ = member.stream.write_all(&reply);
            }
            return;
        }
    }
}

/// Registers with `id`'s root and waits (checking `stop`) for the table:
/// every rank's data port, by rank.
pub(crate) fn register(
    id: BootstrapId,
    nranks: usize,
    rank: usize,
    data_port: u16,
    stop: &dyn Fn() -> bool,
) -> Result<Vec<u16>, (NcclResult, String)> {
    let root = SocketAddr::from((Ipv4Addr::LOCALHOST, id.port));
    let system = |what: &str, e: io::Error| {
        (
            SYSTEM_ERROR,
            format!("stand-in NCCL: bootstrap root at {root}: {what}: {e}"),
        )
    };
    let mut stream =
        TcpStream::connect_timeout(&root, CONNECT_TIMEOUT).map_err(|e| system("connect", e))?;
    let mut msg = Vec::with_capacity(REGISTER_LEN);
    msg.extend_from_slice(ID_MAGIC);
    msg.extend_from_slice(&id.nonce.to_le_bytes());
    for n in [nranks, rank] {
        msg.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
    }
    msg.extend_from_slice(&data_port.to_le_bytes());
    stream.write_all(&msg).map_err(|e| system("register", e))?;
    let mut read = |len: usize, deadline: Option<Instant>| {
        let mut buf = vec![0u8; len];
        wire::read_full(&mut stream, &mut buf, stop, deadline).map(|()| buf)
    };
    let status = read(1, None).map_err(|e| system("waiting for the other ranks", e))?;
    let soon = Some(Instant::now() + REGISTER_TIMEOUT);
    if status[0] == 0 {
        let table = read(2 * nranks, soon).map_err(|e| system("reading the table", e))?;
        return Ok(table
            .chunks_exact(2)
            .map(|p| u16::from_le_bytes([p[0], p[1]]))
            .collect());
    }
    let len = read(4, soon).map_err(|e| system("reading its error", e))?;
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let text = read(len.min(4096), soon).map_err(|e| system("reading its error", e))?;
    Err((INVALID_USAGE, String::from_utf8_lossy(&text).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_bytes_round_trip() {
        let id = BootstrapId {
            port: 0xbeef,
            nonce: 0x0123_4567_89ab_cdef,
        };
        let bytes = id.to_bytes();
        assert_eq!(&bytes[..8], b"RWSTNDIN");
        assert_eq!(bytes[8..10], [0xef, 0xbe]);
        assert!(bytes[18..].iter().all(|b| *b == 0));
        assert_eq!(BootstrapId::parse(&bytes), Some(id));
        assert_eq!(BootstrapId::parse(&[0; 128]), None);
    }

    #[test]
    fn root_rejects_disagreeing_ranks() {
        let id = start_root().unwrap();
        let never = || false;
        let a = std::thread::spawn(move || register(id, 2, 0, 1, &never));
        let b = std::thread::spawn(move || register(id, 3, 1, 2, &never));
        for outcome in [a.join().unwrap(), b.join().unwrap()] {
            let (code, text) = outcome.unwrap_err();
            assert_eq!(code, INVALID_USAGE);
            assert!(text.contains("ranks"), "{text}");
        }
    }

    #[test]
    fn root_answers_the_table_in_rank_order() {
        let id = start_root().unwrap();
        let never = || false;
        let a = std::thread::spawn(move || register(id, 2, 1, 1111, &never));
        let b = std::thread::spawn(move || register(id, 2, 0, 2222, &never));
        assert_eq!(a.join().unwrap().unwrap(), vec![2222, 1111]);
        assert_eq!(b.join().unwrap().unwrap(), vec![2222, 1111]);
    }
}
