//! The ring link limit: every rank streams to its ring successor at once
//! over plain TCP sockets (large writes, TCP_NODELAY), or over Unix-domain
//! sockets as ringwire links ranks on one host, while receiving from
//! its predecessor. On loopback the kernel's copies, not a wire, set this
//! limit; it is what any TCP ring can reach on these hosts, and a ring
//! collective's busbw is measured against it.

use ringwire::store::StoreClient;
use ringwire::{Communicator, ReduceOp, env, net};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Bytes per read or write call.
const PIECE: usize = 4 << 20;

/// Takes the predecessor's connection (on the reader thread).
type Accept = Box<dyn FnOnce() -> std::io::Result<Box<dyn Read + Send>> + Send>;
/// Connects to the successor.
type Connect = Box<dyn FnOnce() -> Result<Box<dyn Write>, String>>;

/// One measurement of the ring link limit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LinkLimit {
    /// Bytes/s (as GB/s) of the slowest rank.
    pub(crate) gbps: f64,
    /// CPU seconds (user + system, all ranks) per GB each rank streamed:
    /// the stream's cost per byte of bus traffic, to set beside an op's
    /// CPU per GB divided by its bus factor.
    pub(crate) cpu_s_per_gb: f64,
    /// Cores the ranks kept busy on average (CPU seconds over the
    /// slowest rank's wall time): below the host's cores, the stream is
    /// not CPU-bound.
    pub(crate) cores_busy: f64,
    /// Bytes of the buffers each side streamed from and into.
    pub(crate) buffer: usize,
}

/// The limit, or `None` for a single rank; over TCP, or (`unix`) over
/// Unix-domain sockets as ringwire links ranks on one host. Each side
/// cycles through a `buffer`-byte buffer: one that fits in cache gives the
/// links' own limit; one as large as an op streams memory as that op must.
/// `socket_buffer` sets SO_SNDBUF / SO_RCVBUF on both ends (else the
/// kernel's defaults).
pub(crate) fn measure(
    ctrl: &Communicator,
    bytes: usize,
    unix: bool,
    buffer: usize,
    socket_buffer: Option<usize>,
) -> Result<Option<LinkLimit>, String> {
    let (rank, world) = (ctrl.rank(), ctrl.world_size());
    if world < 2 {
        return Ok(None);
    }
    let launch = env::discover_from_process().map_err(|e| e.to_string())?;
    let store_addrs =
        net::resolve(&launch.master_addr, launch.master_port).map_err(|e| e.to_string())?;
    let store =
        StoreClient::connect(&store_addrs, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    // A run id from rank 0 keeps keys of successive runs apart.
    let nonce = ctrl
        .broadcast(vec![ringwire::testing::Rng::fresh_seed() as i64], 0)
        .wait()
        .map_err(|e| e.to_string())?[0];
    let key = |r: usize| format!("ringwire-bench/link/{nonce}/{r}");
    let lookup = |r: usize| -> Result<String, String> {
        Ok(String::from_utf8_lossy(
            &store
                .get(&key(r), Duration::from_secs(30))
                .map_err(|e| e.to_string())?,
        )
        .into_owned())
    };
    let next = (rank + 1) % world;

    let (accept, connect): (Accept, Connect) = if unix {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
        let name = format!("ringwire-bench/link/{nonce}/{rank}/{}", std::process::id());
        let listener = UnixAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| UnixListener::bind_addr(&a))
            .map_err(|e| e.to_string())?;
        store
            .set(&key(rank), name.as_bytes())
            .map_err(|e| e.to_string())?;
        let theirs = lookup(next)?;
        (
            Box::new(move || accepted(listener.accept()?.0, socket_buffer)),
            Box::new(move || {
                let addr =
                    UnixAddr::from_abstract_name(theirs.as_bytes()).map_err(|e| e.to_string())?;
                let out = UnixStream::connect_addr(&addr)
                    .map_err(|e| format!("connect to unix:@{theirs}: {e}"))?;
                size_buffers(&out, socket_buffer)?;
                Ok(Box::new(out) as Box<dyn Write>)
            }),
        )
    } else {
        let ip = net::choose_local_ip(launch.socket_ifname.as_deref(), &store_addrs)
            .map_err(|e| e.to_string())?;
        let listener = net::bind_listener(ip).map_err(|e| e.to_string())?;
        let me = listener.local_addr().map_err(|e| e.to_string())?;
        store
            .set(&key(rank), me.to_string().as_bytes())
            .map_err(|e| e.to_string())?;
        let next: SocketAddr = lookup(next)?
            .parse()
            .map_err(|e| format!("bad address from the store: {e}"))?;
        (
            Box::new(move || accepted(listener.accept()?.0, socket_buffer)),
            Box::new(move || {
                let out =
                    TcpStream::connect(next).map_err(|e| format!("connect to {next}: {e}"))?;
                out.set_nodelay(true).map_err(|e| e.to_string())?;
                size_buffers(&out, socket_buffer)?;
                Ok(Box::new(out) as Box<dyn Write>)
            }),
        )
    };

    let reader = std::thread::spawn(move || -> Result<Instant, String> {
        let mut s = accept().map_err(|e| e.to_string())?;
        // Written once so every page is mapped before timing starts.
        let mut buf = vec![1u8; buffer];
        let (mut left, mut at) = (bytes, 0);
        while left > 0 {
            let end = (at + left.min(PIECE)).min(buffer);
            let n = s.read(&mut buf[at..end]).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("predecessor closed early".into());
            }
            left -= n;
            at = (at + n) % buffer;
        }
        Ok(Instant::now())
    });
    let mut out = connect()?;
    let source = vec![0x5Au8; buffer];
    ctrl.barrier().wait().map_err(|e| e.to_string())?;
    let cpu_before = crate::cpu_and_rss().0;
    let start = Instant::now();
    let (mut left, mut at) = (bytes, 0);
    while left > 0 {
        let end = (at + left.min(PIECE)).min(buffer);
        out.write_all(&source[at..end]).map_err(|e| e.to_string())?;
        left -= end - at;
        at = end % buffer;
    }
    let sent = Instant::now();
    let received = reader
        .join()
        .map_err(|_| "link-limit reader panicked".to_string())??;
    let secs = sent.max(received).duration_since(start).as_secs_f64();
    // The reader thread has ended, so the process's CPU time includes it.
    let cpu = crate::cpu_and_rss().0 - cpu_before;
    let e = |e: ringwire::Error| e.to_string();
    let slowest = ctrl
        .all_reduce(vec![secs], ReduceOp::Max)
        .wait()
        .map_err(e)?[0];
    let cpu = ctrl
        .all_reduce(vec![cpu], ReduceOp::Sum)
        .wait()
        .map_err(e)?[0];
    let gb = bytes as f64 / 1e9;
    Ok(Some(LinkLimit {
        gbps: gb / slowest,
        cpu_s_per_gb: cpu / gb,
        cores_busy: cpu / slowest,
        buffer,
    }))
}

/// The predecessor's stream, its buffers sized as asked.
fn accepted<S: Read + Send + std::os::fd::AsFd + 'static>(
    stream: S,
    socket_buffer: Option<usize>,
) -> std::io::Result<Box<dyn Read + Send>> {
    size_buffers(&stream, socket_buffer).map_err(std::io::Error::other)?;
    Ok(Box::new(stream))
}

/// Sets both socket buffers to `size`, if given (the kernel doubles it and
/// caps it at net.core.wmem_max / rmem_max).
fn size_buffers(socket: impl std::os::fd::AsFd, size: Option<usize>) -> Result<(), String> {
    let Some(size) = size else { return Ok(()) };
    let socket = socket2::SockRef::from(&socket);
    socket
        .set_send_buffer_size(size)
        .and_then(|()| socket.set_recv_buffer_size(size))
        .map_err(|e| format!("link limit: setting socket buffers to {size} B: {e}"))
}
