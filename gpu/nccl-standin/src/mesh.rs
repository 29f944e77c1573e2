//! The full mesh of TCP connections between a comm's ranks. The lower rank
//! of each pair dials the higher one's data listener and introduces itself
//! (magic, the id's nonce, its rank); each connection then gets a reader
//! thread that moves incoming frames into the comm's inbox, so writes
//! always drain and two ranks sending to each other cannot deadlock.

use crate::wire::{self, Tag};
use std::io::{self, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const HELLO_MAGIC: &[u8; 8] = b"RWSTHELO";
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// One rank's connections to its peers (none to itself).
pub(crate) struct Mesh {
    /// For sending; a frame is written whole under the lock.
    links: Vec<Option<Mutex<TcpStream>>>,
    /// Clones of the same sockets, to shut them down even while a writer
    /// holds the lock.
    closers: Vec<TcpStream>,
}

impl Mesh {
    /// Writes one frame to `peer`; errors are ignored (see `Comm::send`).
    pub(crate) fn send(&self, peer: usize, tag: Tag, payload: &[u8]) {
        if let Some(Some(link)) = self.links.get(peer) {
            let mut stream = link.lock().unwrap_or_else(|e| e.into_inner());
            let _ = wire::write_frame(&mut stream, tag, payload);
        }
    }

    /// Shuts every connection down: `Write` lets the peers read what was
    /// sent (a clean destroy), `Both` also ends this side's reader threads.
    pub(crate) fn close(&self, how: Shutdown) {
        for stream in &self.closers {
            let _ = stream.shutdown(how);
        }
    }
}

fn hello(nonce: u64, rank: usize) -> [u8; 20] {
    let mut msg = [0u8; 20];
    msg[..8].copy_from_slice(HELLO_MAGIC);
    msg[8..16].copy_from_slice(&nonce.to_le_bytes());
    msg[16..20].copy_from_slice(&u32::try_from(rank).unwrap_or(u32::MAX).to_le_bytes());
    msg
}

fn system(what: &str, e: &io::Error) -> String {
    format!("stand-in NCCL: mesh setup: {what}: {e}")
}

/// Where a reader thread hands each frame from `peer`: the comm's inbox.
pub(crate) type Deliver = Arc<dyn Fn(usize, Tag, Vec<u8>) + Send + Sync>;

/// Connects `rank` to every other rank (whose data listeners are at
/// `ports` on localhost) and starts the reader threads, which hand what
/// arrives to `deliver`. Waits (checking `stop`) for the lower ranks to
/// dial in.
pub(crate) fn build(
    listener: &TcpListener,
    ports: &[u16],
    rank: usize,
    nonce: u64,
    deliver: &Deliver,
    stop: &dyn Fn() -> bool,
) -> Result<Mesh, String> {
    let nranks = ports.len();
    let mut streams: Vec<Option<TcpStream>> = (0..nranks).map(|_| None).collect();
    for (peer, &port) in ports.iter().enumerate().skip(rank + 1) {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut stream = TcpStream::connect_timeout(&addr, DIAL_TIMEOUT)
            .map_err(|e| system(&format!("dialing rank {peer} at {addr}"), &e))?;
        stream
            .write_all(&hello(nonce, rank))
            .map_err(|e| system(&format!("greeting rank {peer}"), &e))?;
        streams[peer] = Some(stream);
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| system("listener", &e))?;
    let mut waiting = rank;
    while waiting > 0 {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if stop() {
                    return Err("stand-in NCCL: mesh setup aborted".into());
                }
                std::thread::sleep(wire::POLL / 4);
                continue;
            }
            Err(e) => return Err(system("accepting a peer", &e)),
        };
        stream
            .set_nonblocking(false)
            .map_err(|e| system("peer socket", &e))?;
        let mut msg = [0u8; 20];
        let deadline = Some(Instant::now() + HELLO_TIMEOUT);
        if wire::read_full(&mut stream, &mut msg, stop, deadline).is_err() {
            if stop() {
                return Err("stand-in NCCL: mesh setup aborted".into());
            }
            continue; // not one of ours, or too slow to introduce itself
        }
        let peer = u32::from_le_bytes(msg[16..20].try_into().unwrap_or_default()) as usize;
        if msg[..16] != hello(nonce, 0)[..16] || peer >= rank || streams[peer].is_some() {
            continue;
        }
        streams[peer] = Some(stream);
        waiting -= 1;
    }
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| system("cloning a socket", &e));
    let mut readers = Vec::new();
    let mut closers = Vec::new();
    for (peer, stream) in streams.iter().enumerate() {
        if let Some(stream) = stream {
            let _ = stream.set_nodelay(true);
            readers.push((peer, clone(stream)?));
            closers.push(clone(stream)?);
        }
    }
    let mesh = Mesh {
        links: streams.into_iter().map(|s| s.map(Mutex::new)).collect(),
        closers,
    };
    for (peer, mut reader) in readers {
        let deliver = Arc::clone(deliver);
        let started = std::thread::Builder::new()
            .name(format!("standin-recv-{peer}"))
            .spawn(move || {
                while let Some((tag, payload)) = wire::read_frame(&mut reader) {
                    deliver(peer, tag, payload);
                }
            });
        if let Err(e) = started {
            mesh.close(Shutdown::Both);
            return Err(system("starting a reader thread", &e));
        }
    }
    Ok(mesh)
}
