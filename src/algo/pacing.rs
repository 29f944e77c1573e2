//! Pacing where ranks share cores (decision 0024): before a rank sends to a
//! peer it waits for that peer's word that it has reached the op (an empty
//! frame), so ranks that finish a rooted op early (the root of a broadcast
//! or scatter, the leaves of a reduce) cannot run ops ahead and take the
//! cores from the ranks still in it. Open MPI's rendezvous above its eager
//! limit does the same to its senders.

use super::{Action, Step};

/// The step number of the "ready" frames, beyond every schedule's own.
pub const READY_STEP: u32 = 7 << 20;
/// The step number of the "here" frames (see [`pace`]).
pub const HERE_STEP: u32 = READY_STEP + 1;

/// Rooted ops on a crowded host are paced from this many bytes...
pub const PACE_FROM_BYTES: usize = 256 << 10;
/// ...up to below this many (larger ones gain nothing measurable).
pub const PACE_BELOW_BYTES: usize = 16 << 20;

/// Whether a broadcast, tree reduce or scatter of `bytes` (its largest
/// buffer) is paced: where some host runs more ranks than it has cores,
/// from 256 KiB to below 16 MiB. Measured at 3-4 ranks on 2 cores: 1.1-2.9x
/// there; 0.6-0.9x at 64 KiB for broadcast and scatter; on hosts that are
/// not crowded 0.5-0.97x (each rank has a core, and the word costs a round
/// trip); a chain reduce from 4 MiB 0.86-0.87x, so only the tree is paced.
pub fn pacing_pays(crowded: bool, bytes: usize) -> bool {
    crowded && (PACE_FROM_BYTES..PACE_BELOW_BYTES).contains(&bytes)
}

/// Rewrites `steps` (any schedule) so that the rank first tells every peer
/// it receives from that it is ready (an empty frame, [`READY_STEP`]), and
/// takes that word from a peer it sends to before any other step with it.
/// Every rank paces its own schedule, so each word goes to a peer that
/// expects it, first on the link. A rank also tells every peer it sends to
/// that it is there ([`HERE_STEP`], sent at once, taken by the peer before
/// its data): ranks that disagree on pacing (on the op's size across a
/// bound) then fail on the first frame, instead of a paced sender waiting
/// for a word its receiver never sends. `split` is where the work buffer starts
/// in the schedule's index space (the words land there, empty). `spare`
/// and `marks` are scratch the caller keeps: nothing is allocated once
/// they have grown.
pub fn pace(
    steps: &mut Vec<Step>,
    spare: &mut Vec<Step>,
    marks: &mut Vec<u8>,
    world: usize,
    split: usize,
) {
    const FROM: u8 = 1;
    const TO: u8 = 2;
    const TOLD: u8 = 4;
    marks.clear();
    marks.resize(world, 0);
    for step in steps.iter() {
        match step {
            Step::Recv { peer, .. } => marks[*peer] |= FROM,
            Step::Send { peer, .. } => marks[*peer] |= TO,
        }
    }
    spare.clear();
    // Every "ready", then every "here": a peer takes them in that order.
    for (flag, step) in [(FROM, READY_STEP), (TO, HERE_STEP)] {
        for (peer, _) in marks.iter().enumerate().filter(|(_, m)| **m & flag != 0) {
            spare.push(Step::Send {
                peer,
                range: 0..0,
                step,
                chunk: 0,
            });
        }
    }
    let word = |peer, step| Step::Recv {
        peer,
        range: split..split,
        step,
        chunk: 0,
        action: Action::Copy,
    };
    for step in steps.drain(..) {
        let peer = match &step {
            Step::Send { peer, .. } | Step::Recv { peer, .. } => *peer,
        };
        if marks[peer] & TOLD == 0 {
            marks[peer] |= TOLD;
            if marks[peer] & TO != 0 {
                spare.push(word(peer, READY_STEP));
            }
            if marks[peer] & FROM != 0 {
                spare.push(word(peer, HERE_STEP));
            }
        }
        spare.push(step);
    }
    std::mem::swap(steps, spare);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_is_for_crowded_hosts_from_256_kib_to_below_16_mib() {
        assert!(pacing_pays(true, PACE_FROM_BYTES));
        assert!(pacing_pays(true, PACE_BELOW_BYTES - 1));
        assert!(!pacing_pays(true, PACE_FROM_BYTES - 1));
        assert!(!pacing_pays(true, PACE_BELOW_BYTES));
        assert!(!pacing_pays(false, 1 << 20));
    }

    #[test]
    fn a_sender_waits_for_the_word_and_a_receiver_gives_it_first() {
        // A chain's middle rank: receives from 0, sends to 2.
        let mut steps = super::super::schedule(|o| super::super::broadcast_chain(o, 1, 3, 0, 8, 4));
        let (mut spare, mut marks) = (Vec::new(), Vec::new());
        pace(&mut steps, &mut spare, &mut marks, 3, 0);
        let at = |want: &dyn Fn(&Step) -> bool| steps.iter().position(want).unwrap();
        // It says "ready" to 0 and "here" to 2 first of all...
        assert_eq!(
            at(&|s| matches!(
                s,
                Step::Send {
                    peer: 0,
                    step: READY_STEP,
                    ..
                }
            )),
            0
        );
        assert_eq!(
            at(&|s| matches!(
                s,
                Step::Send {
                    peer: 2,
                    step: HERE_STEP,
                    ..
                }
            )),
            1
        );
        // ...and takes each peer's word before that peer's data.
        let ready_from_2 = at(&|s| {
            matches!(
                s,
                Step::Recv {
                    peer: 2,
                    step: READY_STEP,
                    ..
                }
            )
        });
        let data_to_2 = at(&|s| {
            matches!(
                s,
                Step::Send {
                    peer: 2,
                    step: 0,
                    ..
                }
            )
        });
        let here_from_0 = at(&|s| {
            matches!(
                s,
                Step::Recv {
                    peer: 0,
                    step: HERE_STEP,
                    ..
                }
            )
        });
        let data_from_0 = at(&|s| {
            matches!(
                s,
                Step::Recv {
                    peer: 0,
                    step: 0,
                    ..
                }
            )
        });
        assert!(
            ready_from_2 < data_to_2 && here_from_0 < data_from_0,
            "{steps:?}"
        );
    }
}
