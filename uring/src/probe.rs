//! Is io_uring usable here, and with which operations?

use std::fmt;

/// What the kernel offers, as far as the engine cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// IORING_OP_SEND.
    pub send: bool,
    /// IORING_OP_RECV.
    pub recv: bool,
    /// Zero-copy send (IORING_OP_SEND_ZC), Linux 6.0+.
    pub send_zc: bool,
    /// Reads into registered buffers (IORING_OP_READ_FIXED).
    pub read_fixed: bool,
    /// Ring-to-ring messages (IORING_OP_MSG_RING), for waking engines.
    pub msg_ring: bool,
    /// Multishot receive with provided buffers (IORING_OP_RECV + flag; a
    /// 6.0+ kernel feature the probe cannot see per opcode).
    pub recv_multishot: bool,
    /// Rings for one thread each (SINGLE_ISSUER, DEFER_TASKRUN,
    /// COOP_TASKRUN; Linux 6.1+), what engine threads need (decision 0036).
    pub thread_rings: bool,
}

/// Why io_uring cannot be used in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    /// Why, and what to change.
    pub reason: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unavailable {}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flag = |b: bool, name: &str| {
            if b {
                name.to_string()
            } else {
                format!("no {name}")
            }
        };
        write!(
            f,
            "io_uring on Linux {}: {}, {}, {}, {}, {}",
            self.kernel,
            flag(self.send_zc, "SEND_ZC"),
            flag(self.recv_multishot, "multishot recv"),
            flag(self.read_fixed, "fixed buffers"),
            flag(self.msg_ring, "MSG_RING"),
            flag(self.thread_rings, "single-thread rings"),
        )
    }
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Whether newer-kernel features are present, from `uname -r`.
fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Probes io_uring: creates a small ring and asks the kernel which
/// operations it supports.
///
/// The probe's ring is made on a thread of its own (see
/// `on_a_passing_thread`), which inherits the caller's
/// seccomp filter, so the answer is the caller's.
#[cfg(target_os = "linux")]
pub fn probe() -> Result<Support, Unavailable> {
    on_a_passing_thread(probe_here)
}

#[cfg(target_os = "linux")]
fn probe_here() -> Result<Support, Unavailable> {
    use io_uring::{IoUring, Probe, opcode};
    let kernel = read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "?".into());
    match read_trim("/proc/sys/kernel/io_uring_disabled").as_deref() {
        Some("2") => {
            return Err(Unavailable {
                reason: "io_uring is disabled on this host (sysctl kernel.io_uring_disabled=2)"
                    .into(),
            });
        }
        Some("1") => {
            // 1: only processes in kernel.io_uring_group may use it; try.
        }
        _ => {}
    }
    let ring = IoUring::new(8).map_err(|e| Unavailable {
        reason: match e.raw_os_error() {
            Some(1) => format!(
                "io_uring_setup was refused (EPERM): a seccomp profile (Docker's default blocks io_uring) \
                 or kernel.io_uring_disabled=1 without membership in kernel.io_uring_group: {e}"
            ),
            Some(38) => format!("this kernel ({kernel}) has no io_uring (ENOSYS)"),
            Some(12) => memlock_refusal(&e),
            _ => format!("io_uring_setup failed: {e}"),
        },
    })?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| Unavailable {
            reason: format!("io_uring probe failed (kernel {kernel} too old?): {e}"),
        })?;
    Ok(Support {
        send: probe.is_supported(opcode::Send::CODE),
        recv: probe.is_supported(opcode::Recv::CODE),
        send_zc: probe.is_supported(opcode::SendZc::CODE),
        read_fixed: probe.is_supported(opcode::ReadFixed::CODE),
        msg_ring: probe.is_supported(opcode::MsgRingData::CODE),
        recv_multishot: probe.is_supported(opcode::Recv::CODE) && kernel_at_least(&kernel, 6, 0),
        thread_rings: crate::engine::shard::shard_ring(8).is_ok(),
        kernel,
    })
}

/// Runs `f` on a thread made for it. io_uring ties a ring to the task that
/// creates it, and when the ring goes away it interrupts that task (a
/// blocking socket read with a timeout then fails with EINTR, rustls gives
/// up a handshake): a thread that has exited by then is not disturbed.
pub(crate) fn on_a_passing_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// The words for a ring the kernel would not allocate: for users without
/// CAP_IPC_LOCK, io_uring charges its rings to RLIMIT_MEMLOCK.
pub(crate) fn memlock_refusal(e: &std::io::Error) -> String {
    let advice =
        crate::memlock().map_or_else(|_| "RLIMIT_MEMLOCK unreadable".into(), |m| m.advice());
    format!(
        "io_uring_setup failed ({e}): the kernel charges io_uring rings to the locked-memory limit \
         of users without CAP_IPC_LOCK, and it is too low; {advice}"
    )
}

/// io_uring exists only on Linux.
#[cfg(not(target_os = "linux"))]
pub fn probe() -> Result<Support, Unavailable> {
    Err(Unavailable {
        reason: "io_uring exists only on Linux".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare() {
        assert!(kernel_at_least("6.18.44-fc-v445", 6, 0));
        assert!(kernel_at_least("6.0.0", 6, 0));
        assert!(!kernel_at_least("5.15.0-91-generic", 6, 0));
        assert!(!kernel_at_least("garbage", 6, 0));
    }

    #[test]
    fn probe_answers_either_way() {
        // Where io_uring works the basic socket ops must be there; where it
        // does not, the reason must say what blocked it. CI shows which.
        match probe() {
            Ok(s) => {
                eprintln!("{s}");
                assert!(
                    s.send && s.recv,
                    "a kernel with io_uring but without SEND/RECV: {s:?}"
                );
                if kernel_at_least(&s.kernel, 6, 1) {
                    assert!(s.thread_rings, "Linux 6.1+ takes DEFER_TASKRUN: {s:?}");
                }
            }
            Err(u) => {
                eprintln!("SKIP io_uring checks: {u}");
                assert!(!u.reason.is_empty());
            }
        }
    }
}
