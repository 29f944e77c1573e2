//! Socket calls the driver makes outside the ring: resetting a lane,
//! reading what it holds unacknowledged and its busy time and bytes
//! acknowledged (`TCP_INFO`), and setting `TCP_NOTSENT_LOWAT`.

use super::*;

/// Resets a TCP connection (`connect` to `AF_UNSPEC`: the kernel's
/// `tcp_disconnect`): what it holds unsent or unacknowledged is dropped and
/// the peer gets a reset. The descriptor stays open, shared as before.
pub(super) fn reset(socket: &SharedFd) {
    // SAFETY: `sockaddr` is plain old data; all-zero with the family set is
    // an `AF_UNSPEC` address, passed by pointer and length for the call only.
    let rc = unsafe {
        let mut unspec: libc::sockaddr = std::mem::zeroed();
        unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            socket.as_raw_fd(),
            &unspec,
            size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "resetting a lane");
    }
}

/// Bytes a TCP socket holds that its peer has not acknowledged (sent or
/// not: `SIOCOUTQ`); 0 if it cannot say.
pub(super) fn unacknowledged(socket: &SharedFd) -> u64 {
    let mut bytes: libc::c_int = 0;
    // SAFETY: `TIOCOUTQ` (`SIOCOUTQ` on a socket) writes one `c_int` into
    // `bytes`, a live local.
    let done = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    if done == 0 { bytes.max(0) as u64 } else { 0 }
}

/// What the kernel has counted of a TCP socket since it connected: its
/// busy time and the bytes its peer acknowledged (`lanes::Progress`);
/// `None` where the kernel fills too little of `tcp_info` (before 4.10).
pub(super) fn progress(socket: &SharedFd) -> Option<lanes::Progress> {
    // SAFETY: `tcp_info` is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `TCP_INFO` writes at most `len` bytes into `info`, a live
    // local of that size, and the length into `len`.
    let done = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // An older kernel fills less of the struct: the busy time (after the
    // bytes acknowledged) must be in it.
    let busy_end = std::mem::offset_of!(libc::tcp_info, tcpi_busy_time) + size_of::<u64>();
    if done != 0 || (len as usize) < busy_end {
        return None;
    }
    Some(lanes::Progress {
        busy_us: info.tcpi_busy_time,
        acked: info.tcpi_bytes_acked,
    })
}

/// Sets `TCP_NOTSENT_LOWAT` on a send lane; a socket that takes no such
/// option (not TCP) keeps its default.
pub(super) fn set_notsent_lowat(socket: &SharedFd, bytes: libc::c_int) {
    // SAFETY: `setsockopt` reads `size_of::<c_int>()` bytes from `bytes`,
    // a live local, and touches no other memory.
    let _ = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&bytes as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Caps what a socket sends per second (`SO_MAX_PACING_RATE`, which TCP
/// honours by pacing itself): a slow lane, for the engine's tests.
#[cfg(test)]
pub(crate) fn pace_for_tests(socket: &impl AsRawFd, bytes_per_sec: u64) {
    // SAFETY: `setsockopt` reads `size_of::<u64>()` bytes from a live local.
    let done = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&bytes_per_sec as *const u64).cast(),
            size_of::<u64>() as libc::socklen_t,
        )
    };
    assert_eq!(done, 0, "{}", io::Error::last_os_error());
}
