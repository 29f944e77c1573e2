//! The stand-in's environment variables, and per-thread overrides of them.
//!
//! The overrides exist for in-process tests where ranks are threads: the
//! environment is shared by every thread (and setting it is `unsafe` in
//! edition 2024), but a fault must hit one rank of one test only. A value
//! set here for the calling thread wins over the process environment for
//! the reads that thread makes (comm init reads on the thread that calls
//! `ncclCommInitRank*`).

use std::cell::RefCell;
use std::collections::HashMap;

/// Faults to inject: `hang:<rank>:<op>`, `error:<rank>:<op>:<code>`,
/// `initfail:<rank>`, `initstall:<rank>`, `shrinkfail:<rank>`,
/// `shrinkstall:<rank>`, comma-separated.
pub const FAULT: &str = "RINGWIRE_STANDIN_NCCL_FAULT";
/// How many `ncclCommGetAsyncError` polls of a non-blocking comm report
/// `ncclInProgress` even when its setup has finished (default 2).
pub const INPROGRESS_POLLS: &str = "RINGWIRE_STANDIN_NCCL_INPROGRESS_POLLS";
/// "X.Y.Z": the version `ncclGetVersion` reports (default 2.30.7).
pub const VERSION: &str = "RINGWIRE_STANDIN_NCCL_VERSION";

/// The default of [`INPROGRESS_POLLS`].
pub const DEFAULT_INPROGRESS_POLLS: u32 = 2;

thread_local! {
    static OVERRIDES: RefCell<HashMap<String, Option<String>>> = RefCell::new(HashMap::new());
}

/// Makes the calling thread read `value` for `name` instead of the process
/// environment (`None`: as if unset), until [`clear_thread_overrides`].
pub fn set_thread_override(name: &str, value: Option<&str>) {
    OVERRIDES.with(|o| {
        o.borrow_mut()
            .insert(name.to_string(), value.map(str::to_string))
    });
}

/// Drops every override of the calling thread.
pub fn clear_thread_overrides() {
    OVERRIDES.with(|o| o.borrow_mut().clear());
}

/// `name`'s value for this thread: its override, else the environment.
pub(crate) fn var(name: &str) -> Option<String> {
    if let Some(value) = OVERRIDES.with(|o| o.borrow().get(name).cloned()) {
        return value;
    }
    std::env::var(name).ok()
}

/// [`INPROGRESS_POLLS`], or its default when unset or not a number.
pub(crate) fn inprogress_polls() -> u32 {
    var(INPROGRESS_POLLS)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_INPROGRESS_POLLS)
}
