//! What a send's completion means, on a link's main connection (`sent`)
//! or a lane (`lane_sent`), SEND_ZC notifications included.

use super::*;

impl Driver {
    pub(super) fn sent(
        &mut self,
        link: usize,
        result: i32,
        flags: u32,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        let always = self.zero_copy_always;
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        // A SEND_ZC completes twice: its result (flagged "more"), then a
        // notification once the kernel no longer reads the bytes. The send
        // stays in flight until the second.
        if io_uring::cqueue::more(flags) {
            l.zc_result = Some(result);
            return;
        }
        let was_probing = l.zero_copy == ZeroCopy::Probing;
        let result = if io_uring::cqueue::notif(flags) {
            // The notification's own result carries the usage report.
            let copied = result as u32 & NOTIF_USAGE_ZC_COPIED != 0;
            let result = l.zc_result.take().unwrap_or(0);
            if was_probing && result >= 0 {
                l.zero_copy = match copied && !always {
                    true => ZeroCopy::Off,
                    false => ZeroCopy::On,
                };
                tracing::debug!(
                    link,
                    copied,
                    "SEND_ZC probe: the kernel {}; {} sends on this link from now on",
                    if copied {
                        "copied anyway"
                    } else {
                        "sent in place"
                    },
                    if copied { "plain" } else { "zero-copy" },
                );
            }
            result
        } else {
            result
        };
        if was_probing && result < 0 && result != -libc::ECANCELED {
            // This socket takes no SEND_ZC (AF_UNIX, say): nothing went
            // out; send it plainly.
            l.zero_copy = ZeroCopy::Off;
            l.send_in_flight = false;
            tracing::debug!(link, result, "SEND_ZC refused; plain sends on this link");
            return;
        }
        l.send_in_flight = false;
        let withdrawing = std::mem::take(&mut l.withdrawing);
        let Some(req) = l.sending.as_mut() else {
            return;
        };
        if l.dead.is_some() || l.send_error.is_some() {
            // Failed by `fail_dead_work` once no piece of it is in flight.
            return;
        }
        if result == -libc::ECANCELED {
            if withdrawing && req.sent == 0 {
                let req = l.take_unsent().expect("checked");
                finished.push((req.id, Outcome::Withdrawn));
            }
            // Else nothing went out; sent again next turn (see `received`).
            return;
        }
        if result > 0 {
            req.sent += result as usize;
            if let Some(req) = l.take_finished_send() {
                finished.push((req.id, Outcome::Sent(Ok(()))));
            }
            return;
        }
        let error = if result == 0 {
            io::Error::from(io::ErrorKind::WriteZero)
        } else {
            io::Error::from_raw_os_error(-result)
        };
        // The send fails (`fail_dead_work`); the link once its receiving
        // side ends.
        self.stop_sending(link, error);
    }

    /// A send on lane `lane` of `link`, of the piece in header slot `slot`,
    /// completed: its piece goes on, or is out, which may finish the laned
    /// send. Or a SEND_ZC's notification came: the kernel let the slot's
    /// bytes go, which may finish a laned send waiting for it.
    pub(super) fn lane_sent(
        &mut self,
        link: usize,
        (lane, slot): (usize, usize),
        result: i32,
        flags: u32,
        finished: &mut Vec<(u64, Outcome)>,
    ) {
        let always = self.zero_copy_always;
        let Some(l) = self.links.get_mut(link).and_then(|l| l.as_mut()) else {
            return;
        };
        let Some(s) = l.send_lanes.get_mut(lane) else {
            return;
        };
        let counter = l.counters.as_ref().and_then(|c| c.get(lane));
        if io_uring::cqueue::notif(flags) {
            let copied = result as u32 & NOTIF_USAGE_ZC_COPIED != 0;
            if s.slots.owes(slot) {
                self.lane_notifications -= 1;
            }
            s.slots.notified(slot);
            if let Some(c) = counter.filter(|_| copied) {
                c.copied_sends.fetch_add(1, Ordering::Relaxed);
            }
            let before = s.zero_copy;
            s.zero_copy = match before {
                ZeroCopy::Probing | ZeroCopy::On if copied && !always => ZeroCopy::Off,
                ZeroCopy::Probing => ZeroCopy::On,
                other => other,
            };
            if s.zero_copy != before {
                tracing::debug!(link, lane, copied, zero_copy = ?s.zero_copy, "SEND_ZC on a lane");
            }
            // On a failed link, `fail_dead_work` lets them go.
            if l.dead.is_none() {
                while let Some(req) = l.take_notified() {
                    finished.push((req.id, Outcome::Sent(Ok(()))));
                }
            }
            return;
        }
        s.in_flight = false;
        // A failed SEND_ZC may still owe a notification (flagged "more").
        if io_uring::cqueue::more(flags) && s.slots.expect_notification(slot) {
            self.lane_notifications += 1;
        }
        let refused = result < 0 && result != -libc::ECANCELED;
        if s.posted_zero_copy && refused && s.zero_copy == ZeroCopy::Probing {
            // This socket takes no SEND_ZC: nothing went out; the piece
            // goes again, plainly, as the lane's pieces do from now on.
            s.zero_copy = ZeroCopy::Off;
            tracing::debug!(link, lane, result, "SEND_ZC refused on a lane; plain sends");
            return;
        }
        if let Some(c) = counter.filter(|_| s.posted_zero_copy && result >= 0) {
            c.zero_copy_sends.fetch_add(1, Ordering::Relaxed);
        }
        // A dead link's send fails in `fail_dead_work`; a cancel that moved
        // nothing is posted again.
        if l.dead.is_some() || l.send_error.is_some() || result == -libc::ECANCELED {
            return;
        }
        if result <= 0 {
            let error = if result == 0 {
                io::Error::from(io::ErrorKind::WriteZero)
            } else {
                io::Error::from_raw_os_error(-result)
            };
            self.stop_sending(link, error);
            return;
        }
        let Some(piece) = s.piece.as_mut() else {
            return;
        };
        piece.sent += result as usize;
        l.loads[lane].took(result as usize);
        if let Some(c) = counter {
            c.bytes.fetch_add(result as u64, Ordering::Relaxed);
        }
        if piece.sent < PIECE_HEADER + piece.len {
            return;
        }
        s.slots.piece_sent(piece.slot);
        s.piece = None;
        l.loads[lane].finish();
        if let Some(c) = counter {
            c.pieces.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(spread) = &mut l.spread {
            spread.open -= 1;
        }
        if let Some(req) = l.take_finished_send() {
            finished.push((req.id, Outcome::Sent(Ok(()))));
        }
    }
}

/// `LinkIo::take_notified` over the two fields it needs, for a caller
/// that holds others of the link borrowed.
pub(super) fn take_notified(
    later: &mut Vec<(u32, SendRequest)>,
    lanes: &[SendLane],
) -> Option<SendRequest> {
    let i = later
        .iter()
        .position(|(frame, _)| !lanes.iter().any(|l| l.slots.holds(*frame)))?;
    Some(later.swap_remove(i).1)
}
