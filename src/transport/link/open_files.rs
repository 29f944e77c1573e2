//! The process's open-file limit, and room in it for a link to every peer.
//!
//! A link holds up to three descriptors (a TCP link of the engine with a
//! lane each way; a portable link's socket, its reader's clone and its
//! writer's), or one more per lane past the first, so an all-to-all among a few hundred ranks passes the soft
//! `RLIMIT_NOFILE` of 1024 that many shells and services start with, and
//! every dial or accept past it fails with EMFILE mid-job. As Go's runtime
//! and many servers do, a transport raises its process's soft limit at
//! start, only as far as a full mesh needs and the hard limit allows,
//! and says once what to raise when the hard limit is too low.

use nix::errno::Errno;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use std::io;

/// Descriptors one link holds at most with one lane each way.
pub(crate) const PER_LINK: u64 = 3;

/// Room for what else a rank's process holds open: listeners, the store's
/// connection, strangers' handshakes, the caller's own files.
const SPARE: u64 = 256;

/// What a rank of a `world`-rank job would need with a link to every peer,
/// each with `lanes` lanes each way.
pub(crate) fn needed(world: usize, lanes: u8) -> u64 {
    let per_link = PER_LINK.max(1 + 2 * u64::from(lanes));
    (world.saturating_sub(1) as u64) * per_link + SPARE
}

/// What `make_room` did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// The soft limit was high enough already.
    Enough { soft: u64 },
    /// The soft limit was raised from `from` to `to`.
    Raised { from: u64, to: u64 },
    /// The hard limit is below what is needed; the soft limit is at it now
    /// (raised from `from` if it was lower).
    Short { from: u64, hard: u64, need: u64 },
}

/// Raises the soft open-file limit to `need` if it is lower, up to the
/// hard limit.
pub(crate) fn make_room(need: u64) -> io::Result<Room> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft >= need {
        return Ok(Room::Enough { soft });
    }
    let to = need.min(hard);
    if to > soft {
        setrlimit(Resource::RLIMIT_NOFILE, to, hard).map_err(io::Error::from)?;
    }
    Ok(match to < need {
        true => Room::Short {
            from: soft,
            hard,
            need,
        },
        false => Room::Raised { from: soft, to },
    })
}

/// Makes room for a link to each of `world - 1` peers and logs what it
/// did (once per transport).
pub(crate) fn make_room_for_links(me: usize, world: usize, lanes: u8) {
    let need = needed(world, lanes);
    match make_room(need) {
        Ok(Room::Enough { .. }) => {}
        Ok(Room::Raised { from, to }) => tracing::debug!(
            rank = me,
            from,
            to,
            "raised the soft open-file limit (RLIMIT_NOFILE) so links to all {} peers fit",
            world - 1
        ),
        Ok(Room::Short { hard, need, .. }) => tracing::warn!(
            rank = me,
            "the open-file limit (RLIMIT_NOFILE) is {hard}, and links to all {} peers may need \
             {need} ({PER_LINK} per link): ops that link many peers (all_to_all) may fail with \
             \"too many open files\"; raise the hard limit (`ulimit -Hn`, or LimitNOFILE= for \
             a systemd service)",
            world - 1
        ),
        Err(e) => tracing::debug!(rank = me, error = %e, "could not read or raise RLIMIT_NOFILE"),
    }
}

/// Whether `e` says the process (EMFILE) or the system (ENFILE) ran out
/// of file descriptors.
pub(crate) fn ran_out(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EMFILE | Errno::ENFILE)
    )
}

/// `e`, with a hint when it says the process ran out of descriptors.
pub(crate) fn describe(e: &io::Error) -> String {
    match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EMFILE) => {
            let limit = getrlimit(Resource::RLIMIT_NOFILE)
                .map(|(soft, hard)| format!("soft {soft}, hard {hard}"))
                .unwrap_or_else(|_| "unknown".into());
            format!(
                "{e}: this process is at its open-file limit (RLIMIT_NOFILE: {limit}; a link \
                 holds up to {PER_LINK}); raise it with `ulimit -n`"
            )
        }
        Some(Errno::ENFILE) => format!(
            "{e}: the system's open-file table is full: raise fs.file-max (sysctl) or close files elsewhere"
        ),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_mesh_needs_three_per_peer_and_some_spare() {
        assert_eq!(needed(1, 1), SPARE);
        assert_eq!(needed(2, 1), PER_LINK + SPARE);
        assert_eq!(needed(1000, 0), 999 * PER_LINK + SPARE);
        // Eight lanes each way: the main connection and sixteen lanes.
        assert_eq!(needed(3, 8), 2 * 17 + SPARE);
    }

    #[test]
    fn running_out_of_descriptors_says_which_limit_to_raise() {
        let text = describe(&io::Error::from_raw_os_error(Errno::EMFILE as i32));
        assert!(
            text.contains("RLIMIT_NOFILE") && text.contains("ulimit -n"),
            "{text}"
        );
        let other = describe(&io::Error::from_raw_os_error(Errno::ECONNREFUSED as i32));
        assert!(!other.contains("RLIMIT_NOFILE"), "{other}");
        assert!(ran_out(&io::Error::from_raw_os_error(Errno::ENFILE as i32)));
        assert!(!ran_out(&io::Error::from_raw_os_error(
            Errno::ECONNREFUSED as i32
        )));
    }

    /// Set in the child of `the_soft_limit_rises_only_as_far_as_needed_and_allowed`.
    const CHILD: &str = "RINGWIRE_TEST_OPEN_FILES_CHILD";

    #[test]
    fn the_soft_limit_rises_only_as_far_as_needed_and_allowed() {
        // Limits are the process's: the checks run in a child.
        if std::env::var_os(CHILD).is_some() {
            let limit = || getrlimit(Resource::RLIMIT_NOFILE).unwrap();
            setrlimit(Resource::RLIMIT_NOFILE, 64, 500).expect("lower the limits");
            assert_eq!(make_room(50).unwrap(), Room::Enough { soft: 64 });
            assert_eq!(limit(), (64, 500));
            assert_eq!(make_room(300).unwrap(), Room::Raised { from: 64, to: 300 });
            assert_eq!(limit(), (300, 500));
            assert_eq!(
                make_room(800).unwrap(),
                Room::Short {
                    from: 300,
                    hard: 500,
                    need: 800
                }
            );
            assert_eq!(limit(), (500, 500));
            return;
        }
        crate::testing::in_a_child(
            "transport::link::open_files::tests::the_soft_limit_rises_only_as_far_as_needed_and_allowed",
            CHILD,
        );
    }
}
