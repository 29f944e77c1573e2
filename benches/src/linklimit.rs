//! The ring link limit: every rank streams to its ring successor at once
//! over plain TCP sockets (large writes, TCP_NODELAY), while receiving from
//! its predecessor. On loopback the kernel's copies, not a wire, set this
//! limit; it is what any TCP ring can reach on these hosts, and a ring
//! collective's busbw is measured against it.

use ringwire::store::StoreClient;
use ringwire::{Communicator, ReduceOp, env, net};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Bytes/s (as GB/s) of the slowest rank, or `None` for a single rank.
pub(crate) fn measure(ctrl: &Communicator, bytes: usize) -> Result<Option<f64>, String> {
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

    let ip = net::choose_local_ip(launch.socket_ifname.as_deref(), &store_addrs)
        .map_err(|e| e.to_string())?;
    let listener = net::bind_listener(ip).map_err(|e| e.to_string())?;
    let me = listener.local_addr().map_err(|e| e.to_string())?;
    store
        .set(&key(rank), me.to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let next: SocketAddr = String::from_utf8_lossy(
        &store
            .get(&key((rank + 1) % world), Duration::from_secs(30))
            .map_err(|e| e.to_string())?,
    )
    .parse()
    .map_err(|e| format!("bad address from the store: {e}"))?;

    let reader = std::thread::spawn(move || -> Result<Instant, String> {
        let (mut s, _) = listener.accept().map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = s
                .read(&mut buf[..left.min(4 << 20)])
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("predecessor closed early".into());
            }
            left -= n;
        }
        Ok(Instant::now())
    });
    let mut out = TcpStream::connect(next).map_err(|e| format!("connect to {next}: {e}"))?;
    out.set_nodelay(true).map_err(|e| e.to_string())?;
    ctrl.barrier().wait().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let chunk = vec![0x5Au8; 4 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        out.write_all(&chunk[..n]).map_err(|e| e.to_string())?;
        left -= n;
    }
    let sent = Instant::now();
    let received = reader
        .join()
        .map_err(|_| "link-limit reader panicked".to_string())??;
    let secs = sent.max(received).duration_since(start).as_secs_f64();
    let rate = bytes as f64 / secs / 1e9;
    let slowest = ctrl
        .all_reduce(vec![rate], ReduceOp::Min)
        .wait()
        .map_err(|e| e.to_string())?[0];
    Ok(Some(slowest))
}
