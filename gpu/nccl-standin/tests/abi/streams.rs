//! The host stream API: ordering, events, waits, copies and callbacks.

use crate::common::*;
use ringwire_nccl_standin::abi::*;
use std::ffi::c_void;
use std::sync::{Condvar, Mutex};

/// A gate a host callback blocks on until opened.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

unsafe extern "C" fn wait_at_gate(gate: *mut c_void) {
    // SAFETY: `gate` points to a `Gate` that the test keeps alive until the
    // stream has run this callback.
    let gate = unsafe { &*gate.cast::<Gate>() };
    let mut open = gate.open.lock().unwrap();
    while !*open {
        open = gate.cv.wait(open).unwrap();
    }
}

unsafe extern "C" fn push_seven(log: *mut c_void) {
    // SAFETY: `log` points to a `Mutex<Vec<u8>>` the test keeps alive until
    // the stream has run this callback.
    unsafe { &*log.cast::<Mutex<Vec<u8>>>() }
        .lock()
        .unwrap()
        .push(7);
}

#[test]
fn stream_wait_event_orders_work_across_streams() {
    let (a, b, c) = (new_stream(), new_stream(), new_stream());
    let (gated, copied) = (new_event(), new_event());
    assert!(event_done(gated), "a never-recorded event is complete");
    let gate = Gate::default();
    let src = *b"stand-in";
    let mut dst = [0u8; 8];
    let gate_ptr = std::ptr::from_ref(&gate).cast_mut().cast();
    // SAFETY: `gate` outlives the streams' work (synchronized below).
    let code = unsafe { standinLaunchHostFunc(handle(a), Some(wait_at_gate), gate_ptr) };
    assert_eq!(code, 0);
    assert_eq!(standinEventRecord(handle(gated), handle(a)), 0);
    assert_eq!(standinStreamWaitEvent(handle(b), handle(gated)), 0);
    // SAFETY: `src` and `dst` outlive the copy (synchronized below).
    let code =
        unsafe { standinMemcpyAsync(dst.as_mut_ptr().cast(), src.as_ptr().cast(), 8, handle(b)) };
    assert_eq!(code, 0);
    assert_eq!(standinEventRecord(handle(copied), handle(b)), 0);
    assert_eq!(standinEventQuery(handle(gated)), 600);
    assert_eq!(standinEventQuery(handle(copied)), 600);

    // Re-recording `gated` on an idle stream completes it, but `b` still
    // waits for the recording it was told about.
    assert_eq!(standinEventRecord(handle(gated), handle(c)), 0);
    assert_eq!(standinEventSynchronize(handle(gated)), 0);
    assert!(event_done(gated));
    assert_eq!(standinEventQuery(handle(copied)), 600);
    assert_eq!(dst, [0; 8]);

    gate.open();
    assert_eq!(standinEventSynchronize(handle(copied)), 0);
    assert_eq!(&dst, b"stand-in");
    assert_eq!(standinStreamSynchronize(handle(a)), 0);
    for s in [a, b, c] {
        assert_eq!(standinStreamDestroy(handle(s)), 0);
    }
    for e in [gated, copied] {
        assert_eq!(standinEventDestroy(handle(e)), 0);
    }
}

#[test]
fn callbacks_copies_and_the_default_stream() {
    let log: Mutex<Vec<u8>> = Mutex::default();
    let log_ptr = std::ptr::from_ref(&log).cast_mut().cast();
    let s = new_stream();
    let mut buf = *b"abcdef";
    let base = buf.as_mut_ptr();
    // SAFETY: `log` and `buf` outlive the synchronize below; the copy
    // overlaps itself, which the stand-in allows (memmove).
    unsafe {
        assert_eq!(
            standinLaunchHostFunc(handle(s), Some(push_seven), log_ptr),
            0
        );
        assert_eq!(
            standinMemcpyAsync(base.add(2).cast(), base.cast(), 4, handle(s)),
            0
        );
        assert_eq!(
            standinLaunchHostFunc(std::ptr::null_mut(), Some(push_seven), log_ptr),
            0
        );
    }
    assert_eq!(standinStreamSynchronize(handle(s)), 0);
    assert_eq!(standinStreamSynchronize(std::ptr::null_mut()), 0);
    assert_eq!(&buf, b"ababcd");
    assert_eq!(*log.lock().unwrap(), vec![7, 7]);
    assert_eq!(standinStreamDestroy(handle(s)), 0);
}

#[test]
fn bad_handles_are_invalid_values() {
    let bogus = handle(0x1234_5670);
    assert_eq!(standinStreamDestroy(bogus), 1);
    assert_eq!(standinStreamDestroy(std::ptr::null_mut()), 1);
    assert_eq!(standinStreamSynchronize(bogus), 1);
    assert_eq!(standinEventQuery(bogus), 1);
    assert_eq!(standinEventQuery(std::ptr::null_mut()), 1);
    assert_eq!(standinEventSynchronize(bogus), 1);
    assert_eq!(standinEventRecord(bogus, std::ptr::null_mut()), 1);
    assert_eq!(standinEventDestroy(bogus), 1);
    assert_eq!(standinStreamWaitEvent(std::ptr::null_mut(), bogus), 1);
    // SAFETY: NULL out-pointers and a NULL callback are rejected unused.
    unsafe {
        assert_eq!(standinStreamCreate(std::ptr::null_mut()), 1);
        assert_eq!(standinEventCreate(std::ptr::null_mut()), 1);
        assert_eq!(
            standinLaunchHostFunc(std::ptr::null_mut(), None, std::ptr::null_mut()),
            1
        );
        assert_eq!(
            standinMemcpyAsync(
                std::ptr::null_mut(),
                std::ptr::null(),
                4,
                std::ptr::null_mut()
            ),
            1
        );
    }
    let s = new_stream();
    assert_eq!(standinStreamDestroy(handle(s)), 0);
    assert_eq!(
        standinStreamDestroy(handle(s)),
        1,
        "a destroyed stream is dead"
    );
}
