//! RLIMIT_MEMLOCK: how much memory this user may register with the kernel.
//!
//! For users without CAP_IPC_LOCK the kernel charges io_uring rings (and
//! registered buffers, which the engine does not use: decision 0007) to it,
//! summed over the user's processes (8 MiB by default for non-root users on
//! systemd hosts, 64 KiB on older ones; root's CAP_IPC_LOCK hides it). A
//! ring it cannot afford fails with ENOMEM; the probe and the engine then
//! say which limit it was and how to raise it.

/// The soft and hard limits in bytes (`None`: unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemlockLimit {
    /// The soft limit, which applies.
    pub soft: Option<u64>,
    /// The hard limit, up to which the soft one may be raised.
    pub hard: Option<u64>,
}

impl MemlockLimit {
    /// How to raise the limit, for log lines and errors.
    pub fn advice(&self) -> String {
        let show =
            |v: Option<u64>| v.map_or("unlimited".to_string(), |b| format!("{} KiB", b / 1024));
        format!(
            "RLIMIT_MEMLOCK is {} (hard {}); raise it with `ulimit -l <KiB>` (up to the hard limit), \
             `LimitMEMLOCK=` in a systemd unit, `--ulimit memlock=-1` for docker, or memlock lines in \
             /etc/security/limits.conf",
            show(self.soft),
            show(self.hard)
        )
    }
}

/// Reads RLIMIT_MEMLOCK of this process.
#[cfg(target_os = "linux")]
pub fn memlock() -> std::io::Result<MemlockLimit> {
    use nix::sys::resource::{Resource, getrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).map_err(std::io::Error::from)?;
    let finite = |v: u64| (v != nix::sys::resource::RLIM_INFINITY).then_some(v);
    Ok(MemlockLimit {
        soft: finite(soft),
        hard: finite(hard),
    })
}

/// Without Linux there is nothing to register.
#[cfg(not(target_os = "linux"))]
pub fn memlock() -> std::io::Result<MemlockLimit> {
    Ok(MemlockLimit {
        soft: None,
        hard: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_limit_and_explains_how_to_raise_it() {
        let l = memlock().unwrap();
        if let (Some(s), Some(h)) = (l.soft, l.hard) {
            assert!(s <= h);
        }
        let advice = l.advice();
        assert!(
            advice.contains("ulimit -l") && advice.contains("RLIMIT_MEMLOCK"),
            "{advice}"
        );
    }
}
