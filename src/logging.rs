//! Printing ringwire's log (warnings by default) from a program: the
//! binaries and examples call [`init_from_env`] first thing.
//!
//! ringwire logs through `tracing` and, as a library, installs nothing
//! itself. A program that sets up its own subscriber sees the same events.
//! This module needs the `logging` feature (on by default).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The variable [`init_from_env`] reads: a `tracing` env-filter such as
/// `info`, `ringwire=debug` or `warn,ringwire::refusals=debug`.
pub const LOG_VAR: &str = "RINGWIRE_LOG";

/// What is printed when [`LOG_VAR`] is unset: warnings and errors, such as
/// a connection refused for another job secret (`ringwire::refusals`).
pub const DEFAULT_FILTER: &str = "warn";

/// Installs a global `tracing` subscriber that prints to stderr, filtered
/// by `RINGWIRE_LOG` (warnings and errors if it is unset or empty; a value
/// that does not parse is named in a warning and the default used). Colors
/// only when stderr is a terminal. Returns false, changing nothing, if the
/// process already has a global subscriber.
pub fn init_from_env() -> bool {
    let var = std::env::var(LOG_VAR).ok().filter(|v| !v.trim().is_empty());
    let (filter, bad) = match var.as_deref().map(EnvFilter::try_new) {
        None => (EnvFilter::new(DEFAULT_FILTER), None),
        Some(Ok(f)) => (f, None),
        Some(Err(e)) => (EnvFilter::new(DEFAULT_FILTER), Some(e)),
    };
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .is_ok();
    if let (true, Some(e), Some(v)) = (installed, bad, var) {
        tracing::warn!("{LOG_VAR}={v:?} is not a valid filter ({e}); printing warnings only");
    }
    installed
}
