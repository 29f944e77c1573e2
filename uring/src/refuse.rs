//! Makes io_uring unavailable to the calling thread (and the threads it
//! starts afterwards) the way Docker's default seccomp profile does: a
//! filter answers `io_uring_setup` with EPERM. For tests of the fallback to
//! the portable transport, which CI (root, io_uring enabled) cannot
//! otherwise see. Filters cannot be removed: call it on a thread made for
//! the purpose.
#![allow(unsafe_code)]

use std::io;

/// Classic BPF instruction (`struct sock_filter`).
#[repr(C)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `struct sock_fprog`.
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

/// BPF_LD | BPF_W | BPF_ABS (BPF_LD and BPF_W are 0).
const BPF_LD_W_ABS: u16 = 0x20;
/// BPF_JMP | BPF_JEQ | BPF_K (BPF_K is 0).
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
/// BPF_RET | BPF_K.
const BPF_RET_K: u16 = 0x06;
/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// Installs the filter on this thread; fails on other architectures.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn refuse_io_uring_on_this_thread() -> io::Result<()> {
    refuse_syscall_on_this_thread(libc::SYS_io_uring_setup)
}

/// Makes `memfd_create` fail with EPERM on this thread (and the threads it
/// starts), as a sandbox that forbids shared memory does: for tests of the
/// shared-memory plane's fallback to Unix links.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn refuse_memfd_on_this_thread() -> io::Result<()> {
    refuse_syscall_on_this_thread(libc::SYS_memfd_create)
}

/// A filter answering system call `nr` with EPERM, on this thread.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn refuse_syscall_on_this_thread(nr: libc::c_long) -> io::Result<()> {
    let setup = nr as u32;
    let errno = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let program = [
        // Another architecture's syscall numbers mean other things: allow.
        SockFilter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: ARCH_OFFSET,
        },
        SockFilter {
            code: BPF_JMP_JEQ_K,
            jt: 0,
            jf: 3,
            k: AUDIT_ARCH,
        },
        SockFilter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: NR_OFFSET,
        },
        SockFilter {
            code: BPF_JMP_JEQ_K,
            jt: 0,
            jf: 1,
            k: setup,
        },
        SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: errno,
        },
        SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let fprog = SockFprog {
        len: program.len() as u16,
        filter: program.as_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at `program`, a valid BPF program that both
    // outlive the call (the kernel copies the filter).
    let set = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const SockFprog,
            0,
            0,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn refuse_io_uring_on_this_thread() -> io::Result<()> {
    Err(io::Error::other(
        "the test filter knows x86_64 and aarch64 only",
    ))
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn refuse_memfd_on_this_thread() -> io::Result<()> {
    Err(io::Error::other(
        "the test filter knows x86_64 and aarch64 only",
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_sees_the_refusal_and_blames_seccomp() {
        std::thread::spawn(|| {
            super::refuse_io_uring_on_this_thread().unwrap();
            let why = crate::probe().unwrap_err().to_string();
            assert!(why.contains("seccomp"), "{why}");
        })
        .join()
        .unwrap();
        // Other threads are untouched.
        assert!(crate::probe().is_ok());
    }
}
