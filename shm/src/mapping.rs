//! A mapping of a shared-memory segment, and the only code of this crate
//! that reaches memory through pointers: the map and unmap, 8-byte words
//! as atomics, and bounded copies in and out.
//!
//! Nothing hands out a `&[u8]` or `&mut [u8]` into the mapping: another
//! process may write any byte of it at any time, so only atomics and copies
//! touch it. Which bytes are quiet when is the protocol's business (a byte
//! range is read only after the atomic that publishes it is seen, and
//! written only by its one owner), and a peer that breaks the protocol can
//! garble data, not this process's memory safety: every access stays inside
//! the mapping, which lives as long as this value.
#![allow(unsafe_code)]

use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap, munmap};
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// A shared, read-write mapping of a whole segment.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is memory no other value of this process owns; all
// access goes through atomics and bounded copies (see the module docs), so
// sharing the handle between threads adds nothing a second process does not.
unsafe impl Send for Mapping {}
// SAFETY: as for Send: `&Mapping` only gives atomics and copies.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-write, pre-faulted, and kept
    /// out of forked children (a fork must not keep a dead job's memory, nor
    /// write into a live one's).
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an empty segment"))?;
        // SAFETY: a fresh mapping chosen by the kernel (no address given),
        // so it overlaps nothing of this process; `fd` is a sealed memfd of
        // at least `len` bytes (checked by the caller), so no access within
        // `len` can fault with SIGBUS.
        let base = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd,
                0,
            )
        }
        .map_err(io::Error::from)?;
        let mapping = Mapping {
            base: base.cast(),
            len,
        };
        // SAFETY: the range is exactly the mapping made above.
        unsafe { madvise(base, len, MmapAdvise::MADV_DONTFORK) }.map_err(io::Error::from)?;
        Ok(mapping)
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: segments are not).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 8 bytes at `off` as an atomic word. Panics if they leave the
    /// mapping or are not 8-aligned: offsets come from the layout's
    /// constants, so that is a bug of this crate.
    pub fn atomic(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off.checked_add(8).is_some_and(|end| end <= self.len),
            "atomic word at {off} of a {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds and aligned (checked; the base is page-aligned);
        // these bytes are only ever accessed as this atomic, in every
        // process (the layout gives each word one use), and the reference
        // cannot outlive the mapping it borrows.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Copies `src` into the mapping at `off`. Panics if it would leave it.
    pub fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: the destination is inside the mapping (checked) and
        // cannot overlap `src`, which is memory of this process borrowed
        // for the call (a mapping is never lent out as a slice).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(off), src.len())
        }
    }

    /// Copies the bytes at `off` into `dst`. Panics if they leave it.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: the source is inside the mapping (checked), `dst` is
        // this process's memory borrowed mutably for the call, and the two
        // cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len),
            "{len} bytes at {off} of a {}-byte mapping",
            self.len
        );
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `map`, unmapped once; no
        // reference into it outlives `self` (atomics borrow `self`).
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}
