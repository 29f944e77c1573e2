//! Shared-memory segments: anonymous memfd files, sized, backed, and sealed
//! against resizing, then mapped.
//!
//! No name anywhere, so nothing is left behind when a process is killed
//! (the kernel frees the pages when the last mapping goes) and no other
//! process can open it: it travels only as a descriptor over an
//! authenticated Unix socket (`fdpass`). Not on /dev/shm, so Docker's
//! 64 MiB limit does not apply (the memory cgroup still counts it). The
//! backing is allocated up front (`fallocate`), so a memory limit fails
//! here, not as a SIGBUS later; and the seals mean no process can shrink
//! the file under the others' mappings.

use crate::mapping::Mapping;
use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fallocate, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::stat::fstat;
use nix::unistd::ftruncate;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

/// The seals every segment carries: it can neither shrink nor grow, and
/// the seals themselves are final.
fn seals() -> SealFlag {
    SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL
}

/// A mapped segment, and its descriptor while it may still be passed on.
#[derive(Debug)]
pub struct Segment {
    mapping: Mapping,
    fd: Option<OwnedFd>,
}

impl Segment {
    /// Makes a segment of `len` bytes, zeroed.
    pub fn create(len: usize) -> io::Result<Segment> {
        let fd = memfd_create(
            c"ringwire-shm",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        let size = i64::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        ftruncate(&fd, size)?;
        fallocate(&fd, FallocateFlags::empty(), 0, size)?;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals()))?;
        let mapping = Mapping::map(fd.as_fd(), len)?;
        Ok(Segment {
            mapping,
            fd: Some(fd),
        })
    }

    /// Maps a segment another process made and passed here, after checking
    /// it is one: a sealed memfd (only memfd and shmem files take seals) of
    /// exactly `len` bytes.
    pub fn open(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        let refuse = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let sealed = fcntl(&fd, FcntlArg::F_GET_SEALS)
            .map_err(|e| refuse(format!("the descriptor is not a sealed segment ({e})")))?;
        let want = (SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW).bits();
        if sealed & want != want {
            return Err(refuse(format!(
                "the segment is not sealed against resizing (seals {sealed:#x})"
            )));
        }
        let size = fstat(&fd)?.st_size;
        if usize::try_from(size).ok() != Some(len) {
            return Err(refuse(format!(
                "the segment has {size} bytes, the peer announced {len}"
            )));
        }
        let mapping = Mapping::map(fd.as_fd(), len)?;
        Ok(Segment { mapping, fd: None })
    }

    /// The mapping.
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The mapping alone (the descriptor, if still here, closed).
    pub fn into_mapping(self) -> Mapping {
        self.mapping
    }

    /// The descriptor, to pass on; `None` once taken, or for a segment
    /// opened from one.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fd.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_zeroed_sealed_and_mapped_twice_to_the_same_memory() {
        let mut a = Segment::create(1 << 16).unwrap();
        let mut word = [0u8; 8];
        a.mapping().read(4096, &mut word);
        assert_eq!(word, [0; 8]);
        let fd = a.take_fd().unwrap();
        // It cannot shrink or grow.
        assert!(ftruncate(&fd, 10).is_err());
        assert!(ftruncate(&fd, 1 << 20).is_err());
        let b = Segment::open(fd, 1 << 16).unwrap();
        a.mapping().write(100, b"shared");
        let mut got = [0u8; 6];
        b.mapping().read(100, &mut got);
        assert_eq!(&got, b"shared");
        b.mapping()
            .atomic(8)
            .store(7, std::sync::atomic::Ordering::Release);
        assert_eq!(
            a.mapping()
                .atomic(8)
                .load(std::sync::atomic::Ordering::Acquire),
            7
        );
    }

    #[test]
    fn a_descriptor_that_is_not_a_sealed_segment_of_that_size_is_refused() {
        let mut a = Segment::create(8192).unwrap();
        let fd = a.take_fd().unwrap();
        let e = Segment::open(fd.try_clone().unwrap(), 4096).unwrap_err();
        assert!(e.to_string().contains("8192 bytes"), "{e}");
        // An unsealed memfd.
        let plain = memfd_create(c"plain", MFdFlags::MFD_CLOEXEC).unwrap();
        ftruncate(&plain, 4096).unwrap();
        let e = Segment::open(plain, 4096).unwrap_err();
        assert!(
            e.to_string().contains("not a sealed segment") || e.to_string().contains("not sealed"),
            "{e}"
        );
        // A file that takes no seals at all (a pipe end).
        let (r, _w) = nix::unistd::pipe().unwrap();
        assert!(Segment::open(r, 4096).is_err());
    }

    #[test]
    #[should_panic(expected = "of a 4096-byte mapping")]
    fn an_access_outside_the_mapping_panics_instead_of_touching_other_memory() {
        let a = Segment::create(4096).unwrap();
        a.mapping().write(4090, &[0u8; 8]);
    }
}
