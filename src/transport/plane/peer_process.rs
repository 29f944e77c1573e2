//! The process at the other end of a shared-memory link, watched through a
//! pidfd, so its death is seen even while its socket stays open.
//!
//! A link's socket closes when the peer's process dies, unless another
//! process holds a copy of it: a child the rank forked (a data loader's
//! worker, a `fork`ed helper) keeps every socket of its parent open, and
//! then only the heartbeat timeout (10 s by default) would notice. The
//! pidfd turns readable when the process itself exits, whoever holds its
//! sockets.
//!
//! The peer's pid comes from the socket (`SO_PEERCRED`: the process that
//! connected, or listened), read right after the handshake while the peer
//! is known to be alive, so the pid cannot yet be another process's. Where
//! there is no pid (the peer sits in another pid namespace) or no pidfd
//! (a kernel before 5.3, a seccomp filter), the link is watched by its
//! socket alone, as before.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// A local peer's process, as a pidfd.
pub(super) struct PeerProcess {
    pid: u32,
    fd: OwnedFd,
}

impl PeerProcess {
    /// The process at the other end of `sock`, if it can be watched.
    pub(super) fn of(sock: &UnixStream) -> Option<PeerProcess> {
        use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
        let pid = getsockopt(sock, PeerCredentials).ok()?.pid();
        let watched = rustix::process::Pid::from_raw(pid)
            .ok_or(rustix::io::Errno::SRCH)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()));
        match watched {
            Ok(fd) => Some(PeerProcess {
                pid: pid as u32,
                fd,
            }),
            Err(e) => {
                tracing::debug!(pid, error = %e, "no pidfd for a local peer: its death is seen from its socket alone");
                None
            }
        }
    }

    /// The peer's pid, in this process's pid namespace.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited (never waits).
    pub(super) fn exited(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }

    /// What a sleeper polls (readable once the process exited).
    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_watched_until_its_process_exits() {
        // This process at both ends: alive.
        let (a, _b) = UnixStream::pair().unwrap();
        let me = PeerProcess::of(&a).expect("this kernel has pidfd_open");
        assert_eq!(me.pid(), std::process::id());
        assert!(!me.exited());
        // A child at the other end: exited once it is gone, although this
        // process still holds both ends of its socket.
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let fd = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
            rustix::process::PidfdFlags::empty(),
        )
        .unwrap();
        let watched = PeerProcess {
            pid: child.id(),
            fd,
        };
        assert!(!watched.exited());
        child.wait().unwrap();
        assert!(watched.exited());
    }
}
