//! Passing a descriptor (and a few bytes about it) over a Unix socket
//! (SCM_RIGHTS): how a segment travels to a peer whose link is already
//! authenticated. Nothing else can get it: the segment has no name.
#![allow(unsafe_code)]

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Sends `fd` with the bytes `data` (at least one: a descriptor travels
/// with data).
pub fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(data)];
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != data.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} bytes with the descriptor", data.len()),
        ));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and the descriptor sent with them, if
/// one was. Descriptors beyond the first are closed.
pub fn recv_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut got = None;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: SCM_RIGHTS installed this descriptor in this
                // process for this message; nothing else knows its number,
                // so this is its only owner.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if got.is_none() {
                    got = Some(owned);
                }
            }
        }
    }
    let n = msg.bytes;
    Ok((n, got))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Segment;

    #[test]
    fn a_segment_travels_with_its_description() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut seg = Segment::create(4096).unwrap();
        seg.mapping().write(0, b"hello");
        let fd = seg.take_fd().unwrap();
        send_fd(&a, std::os::fd::AsFd::as_fd(&fd), b"4096").unwrap();
        let mut buf = [0u8; 16];
        let (n, got) = recv_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"4096");
        let other = Segment::open(got.expect("a descriptor"), 4096).unwrap();
        let mut word = [0u8; 5];
        other.mapping().read(0, &mut word);
        assert_eq!(&word, b"hello");
        // Plain bytes come without one.
        io::Write::write_all(&mut &a, b"x").unwrap();
        let (n, none) = recv_fd(&b, &mut buf).unwrap();
        assert_eq!((n, none.is_none()), (1, true));
    }
}
