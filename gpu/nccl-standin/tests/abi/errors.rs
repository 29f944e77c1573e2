//! Error strings, the version, and argument checks.

use crate::common::*;
use ringwire_nccl_standin::abi::*;
use ringwire_nccl_standin::codes::{INVALID_ARGUMENT, SUCCESS};
use ringwire_nccl_standin::envcfg;
use std::ffi::{CStr, c_int};

#[test]
fn error_strings_match_nccl_2_30() {
    let table = [
        (0, "no error"),
        (
            1,
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        ),
        (
            2,
            "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ),
        (
            3,
            "internal error - please report this issue to the NCCL developers",
        ),
        (4, "invalid argument (run with NCCL_DEBUG=WARN for details)"),
        (5, "invalid usage (run with NCCL_DEBUG=WARN for details)"),
        (6, "remote process exited or there was a network error"),
        (7, "NCCL operation in progress"),
        (8, "timeout"),
        (9, "unknown result code"),
        (-1, "unknown result code"),
    ];
    for (code, text) in table {
        // SAFETY: a static NUL-terminated string.
        let got = unsafe { CStr::from_ptr(ncclGetErrorString(code)) };
        assert_eq!(got.to_str().unwrap(), text, "code {code}");
    }
}

#[test]
fn version_defaults_to_2_30_7_and_can_be_overridden() {
    let version = || {
        let mut v = 0;
        // SAFETY: a writable int.
        assert_eq!(unsafe { ncclGetVersion(&mut v) }, SUCCESS);
        v
    };
    envcfg::set_thread_override(envcfg::VERSION, None);
    assert_eq!(version(), 23007);
    envcfg::set_thread_override(envcfg::VERSION, Some("2.12.0"));
    assert_eq!(version(), 21200);
    envcfg::set_thread_override(envcfg::VERSION, Some("2.8.4"));
    assert_eq!(version(), 2804);
    envcfg::clear_thread_overrides();
    // SAFETY: NULL is rejected unused.
    let code = unsafe { ncclGetVersion(std::ptr::null_mut()) };
    assert_eq!(code, INVALID_ARGUMENT);
}

#[test]
fn bad_arguments_are_invalid_and_named() {
    let _guard = lock_process_errors();
    let r = Rank::init(unique_id(), 1, 0);
    let mut buf = [0u8; 64];
    let p = buf.as_mut_ptr().cast();
    let call = |dtype: c_int, op: c_int, comm: NcclComm| {
        // SAFETY: `buf` outlives the stream sync below; bad calls enqueue
        // nothing.
        unsafe { ncclAllReduce(p, p, 4, dtype, op, comm, r.stream()) }
    };
    assert_eq!(call(7, 0, std::ptr::null_mut()), INVALID_ARGUMENT);
    assert!(last_error(0).contains("comm is NULL"), "{}", last_error(0));
    assert_eq!(call(7, 0, handle(0x42_4240)), INVALID_ARGUMENT);
    assert_eq!(call(10, 0, r.comm()), INVALID_ARGUMENT);
    assert!(last_error(r.comm_addr()).contains("invalid data type 10"));
    assert_eq!(call(7, 5, r.comm()), INVALID_ARGUMENT);
    assert!(last_error(r.comm_addr()).contains("invalid reduction operation 5"));
    // SAFETY: as above.
    let bad_root = unsafe { ncclBroadcast(p, p, 4, 7, 1, r.comm(), r.stream()) };
    assert_eq!(bad_root, INVALID_ARGUMENT);
    assert!(last_error(r.comm_addr()).contains("invalid root 1"));
    // SAFETY: as above.
    let bad_peer = unsafe { ncclSend(p, 4, 7, -1, r.comm(), r.stream()) };
    assert_eq!(bad_peer, INVALID_ARGUMENT);
    assert!(last_error(r.comm_addr()).contains("invalid peer -1"));
    // SAFETY: NULL buffers are rejected unless the count is 0.
    let null_buffers = unsafe {
        [
            ncclAllReduce(std::ptr::null(), p, 4, 7, 0, r.comm(), r.stream()),
            ncclAllReduce(
                std::ptr::null(),
                std::ptr::null_mut(),
                0,
                7,
                0,
                r.comm(),
                r.stream(),
            ),
        ]
    };
    assert_eq!(null_buffers, [INVALID_ARGUMENT, SUCCESS]);
    // SAFETY: a config with the wrong magic is read and rejected.
    let bad_magic = unsafe {
        let mut comm = std::ptr::null_mut();
        let mut config = NcclConfig {
            size: size_of::<NcclConfig>(),
            magic: 0,
            version: 0,
            blocking: 0,
            cga_cluster_size: 0,
            min_ctas: 0,
            max_ctas: 0,
            net_name: std::ptr::null(),
            split_share: 0,
        };
        ncclCommInitRankConfig(&mut comm, 1, unique_id(), 0, &mut config)
    };
    assert_eq!(bad_magic, INVALID_ARGUMENT);
    assert!(last_error(0).contains("magic"));
    r.sync();
    r.destroy();
    assert_eq!(ncclCommDestroy(std::ptr::null_mut()), SUCCESS);
    assert_eq!(ncclCommDestroy(handle(0x42_4240)), INVALID_ARGUMENT);
}
