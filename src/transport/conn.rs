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
    /// buffer sizes when configured.
    pub(crate) fn configure(&self, buffer: Option<usize>) -> io::Result<()> {
        if let Conn::Tcp(s) = self {
            s.set_nodelay(true)?;
        }
        if let Some(size) = buffer {
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

    /// The TCP peer address, if this is TCP (TLS checks certificates
    /// against it).
    pub(crate) fn tcp(&self) -> Option<(&TcpStream, SocketAddr)> {
        match self {
            Conn::Tcp(s) => s.peer_addr().ok().map(|a| (s, a)),
            Conn::Unix(_) => None,
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
