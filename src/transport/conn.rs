//! One connected stream socket of a link: TCP, or a Unix-domain socket to a
//! rank on the same host (same kernel and network namespace), which moves
//! bytes without the TCP stack (decision 0009).
//!
//! Everything above (handshake, security checks, frames, both data planes)
//! treats the two alike; only dialing, accepting and socket options differ.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// SO_SNDBUF / SO_RCVBUF of Unix-domain links whose plane asks for large
/// buffers (the engine's, `PlaneKind::large_unix_buffers`) unless
/// RINGWIRE_SOCKET_BUFFER_BYTES says otherwise (decision 0015). A Unix
/// stream socket does not autotune: the kernel's 208 KiB default lets a
/// 1 MiB chunk through only in pieces, each a wake-up of the receiver on a
/// shared core. The kernel doubles the value and caps it at wmem_max.
pub(crate) const LARGE_UNIX_SOCKET_BUFFER: usize = 1 << 20;

/// A link's SO_SNDBUF / SO_RCVBUF: the configured size (0: the kernel's
/// defaults), else [`LARGE_UNIX_SOCKET_BUFFER`] on Unix links that want
/// large buffers, else `None` (kernel defaults; TCP autotunes, which an explicit
/// size would stop: 4 MiB on the engine's TCP links measured level with
/// autotuning once lanes carried only whole chunks, perf.md, thirteenth
/// session).
fn socket_buffer_for(configured: Option<usize>, large_unix: bool, kind: ConnKind) -> Option<usize> {
    if let Some(size) = configured {
        return (size > 0).then_some(size);
    }
    (large_unix && kind == ConnKind::Unix).then_some(LARGE_UNIX_SOCKET_BUFFER)
}

/// A link's socket.
#[derive(Debug)]
pub(crate) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// What kind of socket carries a link (for logs, errors and
/// `Communicator::link_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnKind {
    Tcp,
    Unix,
}

impl ConnKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ConnKind::Tcp => "tcp",
            ConnKind::Unix => "unix",
        }
    }
}

impl Conn {
    pub(crate) fn kind(&self) -> ConnKind {
        match self {
            Conn::Tcp(_) => ConnKind::Tcp,
            Conn::Unix(_) => ConnKind::Unix,
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.shutdown(how),
            Conn::Unix(s) => s.shutdown(how),
        }
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(t),
            Conn::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_write_timeout(t),
            Conn::Unix(s) => s.set_write_timeout(t),
        }
    }

    /// Latency over throughput for TCP (frames are written whole); socket
    /// buffers as [`socket_buffer_for`] says.
    pub(crate) fn configure(&self, configured: Option<usize>, large_unix: bool) -> io::Result<()> {
        if let Conn::Tcp(s) = self {
            s.set_nodelay(true)?;
        }
        if let Some(size) = socket_buffer_for(configured, large_unix, self.kind()) {
            let sock = socket2::SockRef::from(self);
            sock.set_send_buffer_size(size)?;
            sock.set_recv_buffer_size(size)?;
        }
        Ok(())
    }

    /// Reads the first byte waiting, without consuming it.
    pub(crate) fn peek_byte(&self) -> io::Result<Option<u8>> {
        let mut b = [0u8; 1];
        let n = match self {
            Conn::Tcp(s) => s.peek(&mut b)?,
            Conn::Unix(s) => loop {
                use nix::sys::socket::{MsgFlags, recv};
                match recv(s.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other.map_err(io::Error::from)?,
                }
            },
        };
        Ok((n == 1).then_some(b[0]))
    }

    /// Who is at the other end, for logs and refusals: an address for TCP,
    /// the process (pid, uid) for a Unix socket.
    pub(crate) fn describe_peer(&self) -> String {
        match self {
            Conn::Tcp(s) => s
                .peer_addr()
                .map_or_else(|e| format!("an unknown TCP peer ({e})"), |a| a.to_string()),
            Conn::Unix(s) => {
                match nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials) {
                    Ok(c) => format!(
                        "local process {} (uid {}) on a unix socket",
                        c.pid(),
                        c.uid()
                    ),
                    Err(e) => format!("a local process on a unix socket ({e})"),
                }
            }
        }
    }

    /// Who is at the other end, for the refusal ledger.
    pub(crate) fn refusal_peer(&self) -> crate::refusals::Peer {
        use crate::refusals::Peer;
        match self {
            Conn::Tcp(s) => s.peer_addr().map_or(Peer::Unknown, Peer::Tcp),
            Conn::Unix(s) => {
                match nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials) {
                    Ok(c) => Peer::Local {
                        pid: c.pid(),
                        uid: c.uid(),
                    },
                    Err(_) => Peer::Unknown,
                }
            }
        }
    }

    /// The TCP peer address, if this is TCP (TLS checks certificates
    /// against it).
    pub(crate) fn tcp(&self) -> Option<(&TcpStream, SocketAddr)> {
        match self {
            Conn::Tcp(s) => s.peer_addr().ok().map(|a| (s, a)),
            Conn::Unix(_) => None,
        }
    }
}

impl Conn {
    /// The Unix socket, if the link is one.
    pub(crate) fn unix(&self) -> Option<&UnixStream> {
        match self {
            Conn::Unix(s) => Some(s),
            Conn::Tcp(_) => None,
        }
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Conn::Tcp(s) => s.as_fd(),
            Conn::Unix(s) => s.as_fd(),
        }
    }
}

impl From<Conn> for OwnedFd {
    fn from(c: Conn) -> OwnedFd {
        match c {
            Conn::Tcp(s) => s.into(),
            Conn::Unix(s) => s.into(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }

    /// One `readv`: a frame's pad, payload and trailing zeros in one call.
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read_vectored(bufs),
            Conn::Unix(s) => s.read_vectored(bufs),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write_vectored(bufs),
            Conn::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_buffer(conn: &Conn) -> usize {
        socket2::SockRef::from(conn).send_buffer_size().unwrap()
    }

    /// What the kernel reports after SO_SNDBUF = `size`: doubled, capped at
    /// net.core.wmem_max (root may not raise past it without FORCE).
    fn granted(size: usize) -> usize {
        let max: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        2 * size.min(max)
    }

    #[test]
    fn only_the_engines_unix_links_get_a_default_socket_buffer() {
        let unix = || Conn::Unix(UnixStream::pair().unwrap().0);
        let kernel_default = send_buffer(&unix());

        let engine_link = unix();
        engine_link.configure(None, true).unwrap();
        assert_eq!(send_buffer(&engine_link), granted(LARGE_UNIX_SOCKET_BUFFER));
        assert_ne!(send_buffer(&engine_link), kernel_default);

        // The portable plane keeps the kernel's default.
        let portable_link = unix();
        portable_link.configure(None, false).unwrap();
        assert_eq!(send_buffer(&portable_link), kernel_default);

        // RINGWIRE_SOCKET_BUFFER_BYTES wins on either plane.
        for engine in [true, false] {
            let link = unix();
            link.configure(Some(64 << 10), engine).unwrap();
            assert_eq!(send_buffer(&link), granted(64 << 10));
        }

        // TCP keeps autotuning: no explicit size on the engine's links.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = Conn::Tcp(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        let before = send_buffer(&tcp);
        tcp.configure(None, true).unwrap();
        assert_eq!(send_buffer(&tcp), before);
        assert_eq!(socket_buffer_for(None, true, ConnKind::Tcp), None);
        // 0 asks for the kernel's defaults on any link.
        let unix_link = unix();
        unix_link.configure(Some(0), true).unwrap();
        assert_eq!(send_buffer(&unix_link), kernel_default);
        assert_eq!(socket_buffer_for(Some(0), true, ConnKind::Tcp), None);
    }
}
