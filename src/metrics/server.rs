//! The HTTP server behind `RINGWIRE_METRICS_ADDR`: answers `GET /metrics`
//! with [`super::gather`] (every live communicator of the process).
//!
//! Why its own: a scrape endpoint needs one route, HTTP/1.1 with
//! `Connection: close`, and nothing from an async runtime; a few dozen
//! lines on std's `TcpListener` add no dependency to a library that
//! training programs link. It is open to whoever can reach the address,
//! so it binds exactly the address given (a loopback or cluster-internal
//! one; `0.0.0.0` only when asked), reads at most [`MAX_REQUEST_BYTES`] of
//! a request within [`REQUEST_DEADLINE`], serves a few connections at
//! once (each on a short-lived thread; more are closed at once), and
//! answers nothing but its one page: 404 for other paths, 405 for other
//! methods, 400 for what is not HTTP/1.x.

use crate::config::METRICS_ADDR_VAR;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The most bytes of a request (line and headers) read; a longer one is
/// answered 431.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// A request must arrive whole within this long (a client that trickles
/// bytes cannot hold a connection longer); the response must be written
/// within it too.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Connections served at once; more are closed unanswered (a scraper
/// sends one at a time).
const MAX_CONNECTIONS: usize = 8;

/// The bound address, once the first communicator has tried to start the
/// server (`None` inside: not asked for, or it did not bind).
static SERVER: OnceLock<Option<SocketAddr>> = OnceLock::new();

/// Connections being served now.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Where this process serves its metrics: the address the
/// `RINGWIRE_METRICS_ADDR` server bound (with the port the system chose
/// when the variable gave port 0); `None` when the variable was unset at
/// the first communicator's start, or the address did not bind.
pub fn server_addr() -> Option<SocketAddr> {
    SERVER.get().copied().flatten()
}

/// Starts the server if `RINGWIRE_METRICS_ADDR` is set, the first time
/// this is called in the process (each communicator's start calls it).
/// A launcher's ranks on one host share the variable, so a rank whose
/// local rank is known binds the port plus its local rank (port 0 stays 0):
/// every process of the host is served, at ports a scrape config can list.
pub(super) fn start_once(local_rank: Option<usize>) {
    SERVER.get_or_init(|| {
        let addr = std::env::var(METRICS_ADDR_VAR).ok()?;
        let addr = addr.trim();
        if addr.is_empty() {
            return None;
        }
        start(&offset_port(addr, local_rank.unwrap_or(0)))
    });
}

/// `addr` with its port moved up by `by`, when it is an `ip:port` with a
/// nonzero port that has room; else `addr` as given (a host name, port 0,
/// or an address that will fail to bind and be named in the warning).
fn offset_port(addr: &str, by: usize) -> String {
    match addr.parse::<SocketAddr>() {
        Ok(mut a) if a.port() != 0 => {
            match u16::try_from(by)
                .ok()
                .and_then(|by| a.port().checked_add(by))
            {
                Some(port) => {
                    a.set_port(port);
                    a.to_string()
                }
                None => addr.to_owned(),
            }
        }
        _ => addr.to_owned(),
    }
}

fn start(addr: &str) -> Option<SocketAddr> {
    let bound = TcpListener::bind(addr).and_then(|l| Ok((l.local_addr()?, l)));
    let (local, listener) = match bound {
        Ok(bound) => bound,
        Err(e) => {
            tracing::warn!(
                "{METRICS_ADDR_VAR}={addr}: the metrics server cannot bind {addr}: {e}; \
                 metrics are not served (the job runs on)"
            );
            return None;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("ringwire-metrics".into())
        .spawn(move || accept_loop(listener));
    if let Err(e) = spawned {
        tracing::warn!(
            "{METRICS_ADDR_VAR}={addr}: cannot start the metrics server's thread: {e}; \
             metrics are not served"
        );
        return None;
    }
    tracing::info!(
        "serving Prometheus metrics at http://{local}/metrics ({METRICS_ADDR_VAR}={addr})"
    );
    Some(local)
}

fn accept_loop(listener: TcpListener) {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was
                // taken: try again shortly rather than spin.
                tracing::debug!("metrics server: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if ACTIVE.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
            continue; // dropped: closed unanswered
        }
        let spawned = std::thread::Builder::new()
            .name("ringwire-metrics-conn".into())
            .spawn(move || {
                serve(stream);
                ACTIVE.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Answers one request on `stream`, then closes it.
fn serve(mut stream: TcpStream) {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let (status, body, send_body) = match read_request(&mut stream, deadline) {
        Ok(Some(head)) => respond(&head),
        Ok(None) => (431, "request headers too large\n".to_string(), true),
        Err(_) => return, // timed out or closed: nobody to answer
    };
    let _ = stream.set_write_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100)),
    ));
    let content_type = if status == 200 {
        super::CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let mut response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        reason(status),
        body.len()
    );
    if status == 405 {
        response.push_str("Allow: GET, HEAD\r\n");
    }
    response.push_str("\r\n");
    if send_body {
        response.push_str(&body);
    }
    if write_until(&mut stream, response.as_bytes(), deadline).is_ok() {
        // Close gently: stop sending, and take what the client still sends
        // (a body we did not read) for a moment, so the close does not
        // reset the connection before the client has read the response.
        let _ = stream.shutdown(Shutdown::Write);
        drain_until(
            &mut stream,
            Instant::now() + Duration::from_millis(200),
            64 << 10,
        );
    }
}

/// Writes all of `bytes` unless `deadline` passes first (a socket's write
/// timeout bounds each call, not the whole: a client reading a byte at a
/// time must not hold its slot past the request's deadline).
fn write_until(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(bytes) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads and drops what the client still sends, until it closes, `limit`
/// bytes came, or `deadline` passes, whichever is first.
fn drain_until(stream: &mut TcpStream, deadline: Instant, limit: usize) {
    let mut chunk = [0u8; 4096];
    let mut taken = 0;
    while taken < limit {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => taken += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The request's line and headers, read until the blank line that ends
/// them; `None` if they do not fit [`MAX_REQUEST_BYTES`].
fn read_request(stream: &mut TcpStream, deadline: Instant) -> std::io::Result<Option<String>> {
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    loop {
        if let Some(end) = head_end(&buf[..len]) {
            return Ok(Some(String::from_utf8_lossy(&buf[..end]).into_owned()));
        }
        if len == buf.len() {
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[len..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Where the head of a request ends (after its blank line), if it has.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The status and body for a request with this head, and whether to send
/// the body (not for `HEAD`).
fn respond(head: &str) -> (u16, String, bool) {
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split_ascii_whitespace();
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return (400, "bad request line\n".into(), true);
    };
    if !version.starts_with("HTTP/1.") {
        return (400, "HTTP/1.x only\n".into(), true);
    }
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    if path != "/metrics" {
        return (404, "not found: metrics are at /metrics\n".into(), true);
    }
    match method {
        "GET" | "HEAD" => (200, super::gather(), method == "GET"),
        _ => (405, "method not allowed: use GET\n".into(), true),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_rank_moves_the_port_up() {
        assert_eq!(offset_port("127.0.0.1:9464", 0), "127.0.0.1:9464");
        assert_eq!(offset_port("127.0.0.1:9464", 3), "127.0.0.1:9467");
        assert_eq!(offset_port("[::1]:9464", 1), "[::1]:9465");
        // Port 0 (the system picks), no room, or not an ip:port: as given.
        assert_eq!(offset_port("127.0.0.1:0", 3), "127.0.0.1:0");
        assert_eq!(offset_port("127.0.0.1:65535", 1), "127.0.0.1:65535");
        assert_eq!(offset_port("localhost:9464", 2), "localhost:9464");
    }

    #[test]
    fn routes() {
        assert_eq!(respond("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").0, 200);
        assert_eq!(respond("GET /metrics?x=1 HTTP/1.0\r\n\r\n").0, 200);
        assert_eq!(respond("GET / HTTP/1.1\r\n\r\n").0, 404);
        assert_eq!(respond("GET /metricsx HTTP/1.1\r\n\r\n").0, 404);
        assert_eq!(respond("POST /metrics HTTP/1.1\r\n\r\n").0, 405);
        assert_eq!(respond("DELETE /other HTTP/1.1\r\n\r\n").0, 404);
        assert_eq!(respond("GET /metrics\r\n\r\n").0, 400);
        assert_eq!(respond("GET /metrics SPDY/3\r\n\r\n").0, 400);
        assert_eq!(respond("").0, 400);
    }

    #[test]
    fn request_heads_end_at_the_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody"), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
    }
}
