//! Fuzzes what a link's lanes take from a peer and keep for the kernel
//! (decisions 0034, 0035): piece headers checked against the frame being
//! received (`fit_piece`: nothing lands outside its frame, no frame is
//! over-claimed, a received frame takes no more), piece sizes, and a send
//! lane's header slots under any order of completions and notifications
//! (no slot handed out while the kernel may still read it). The checks live
//! in `ringwire_uring::fuzzing`, beside the code they guard.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ringwire_uring::fuzzing::pieces(data);
    ringwire_uring::fuzzing::head_slots(data);
});
