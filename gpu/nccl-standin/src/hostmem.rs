//! Raw host memory: the buffers C hands to NCCL calls and to
//! `standinMemcpyAsync`, read and written later on a stream's worker
//! thread. Besides `abi`, the only module with `unsafe`: the callers of the
//! constructors vouch for the memory, and every access is a bounded copy.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr;

/// `len` readable bytes at a C address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostIn {
    addr: usize,
    len: usize,
}

impl HostIn {
    /// # Safety
    /// `src` must be valid for reads of `len` bytes whenever [`read`] is
    /// called, from any thread, until the work holding it has run.
    ///
    /// [`read`]: HostIn::read
    pub(crate) unsafe fn new(src: *const c_void, len: usize) -> HostIn {
        HostIn {
            addr: src.expose_provenance(),
            len,
        }
    }

    /// A copy of the bytes as they are now.
    pub(crate) fn read(&self) -> Vec<u8> {
        if self.len == 0 {
            return Vec::new();
        }
        let src = ptr::with_exposed_provenance::<u8>(self.addr);
        // SAFETY: `new`'s contract: `len` readable bytes at `src`; the copy
        // goes to a fresh Vec, which cannot overlap them.
        unsafe { std::slice::from_raw_parts(src, self.len) }.to_vec()
    }
}

/// `len` writable bytes at a C address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostOut {
    addr: usize,
    len: usize,
}

impl HostOut {
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes whenever [`write_at`]
    /// is called, from any thread, until the work holding it has run.
    ///
    /// [`write_at`]: HostOut::write_at
    pub(crate) unsafe fn new(dst: *mut c_void, len: usize) -> HostOut {
        HostOut {
            addr: dst.expose_provenance(),
            len,
        }
    }

    /// Copies `bytes` to offset `at`; false (nothing written) if they would
    /// not fit.
    pub(crate) fn write_at(&self, at: usize, bytes: &[u8]) -> bool {
        if at.checked_add(bytes.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        if bytes.is_empty() {
            return true;
        }
        let dst = ptr::with_exposed_provenance_mut::<u8>(self.addr);
        // SAFETY: `new`'s contract makes `len` bytes at `dst` writable and
        // the check above keeps `at..at + bytes.len()` inside them; `copy`
        // allows overlap, although `bytes` is always our own buffer.
        unsafe { ptr::copy(bytes.as_ptr(), dst.add(at), bytes.len()) };
        true
    }
}

/// A `standinMemcpyAsync`: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostCopy {
    src: HostIn,
    dst: HostOut,
}

impl HostCopy {
    /// # Safety
    /// As [`HostIn::new`] for `src` and [`HostOut::new`] for `dst`.
    pub(crate) unsafe fn new(dst: *mut c_void, src: *const c_void, len: usize) -> HostCopy {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            HostCopy {
                src: HostIn::new(src, len),
                dst: HostOut::new(dst, len),
            }
        }
    }

    /// Does the copy (as `memmove`: the ranges may overlap).
    pub(crate) fn run(&self) {
        self.dst.write_at(0, &self.src.read());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_within_bounds() {
        let src = [1u8, 2, 3, 4];
        let mut dst = [0u8; 4];
        // SAFETY: both arrays outlive the copies below.
        let (input, output) = unsafe {
            (
                HostIn::new(src.as_ptr().cast(), 4),
                HostOut::new(dst.as_mut_ptr().cast(), 4),
            )
        };
        assert_eq!(input.read(), vec![1, 2, 3, 4]);
        assert!(output.write_at(1, &[9, 9]));
        assert!(!output.write_at(3, &[9, 9]));
        assert_eq!(dst, [0, 9, 9, 0]);
    }
}
