//! torchrun's error file: how a failed rank tells its launcher why.
//!
//! torchrun gives each worker a path in `TORCHELASTIC_ERROR_FILE` and, when
//! the worker exits non-zero, reads the JSON found there into the "Root
//! Cause" of its failure report (`torch.distributed.elastic.multiprocessing
//! .errors`). A Python worker writes it from its `@record` decorator; without
//! one torchrun prints `error_file: <N/A>` and the cause is lost in the
//! worker's interleaved stderr. [`record_error`] writes the same JSON for a
//! Rust program, and [`main`] wraps a whole `main` so that any error ends
//! the process with it recorded.

use std::fmt::{Display, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

/// The variable torchrun sets to the file each worker reports its error in.
pub const ERROR_FILE_VAR: &str = "TORCHELASTIC_ERROR_FILE";

/// Writes `error` to the file `TORCHELASTIC_ERROR_FILE` names, in the form
/// torchrun reads (the form Python's `@record` writes), and returns the
/// path; `Ok(None)` when the variable is not set (not under torchrun).
///
/// The message is `error`'s `Display`, which for a [`crate::Error`] names
/// the op, its sequence number, the peer and the cause.
pub fn record_error(error: &dyn Display) -> std::io::Result<Option<PathBuf>> {
    let Some(path) = std::env::var_os(ERROR_FILE_VAR).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    std::fs::write(&path, error_json(&error.to_string(), seconds))?;
    Ok(Some(path))
}

/// Runs a program's body: on `Ok` the process succeeds; on `Err` the error
/// is printed to stderr (prefixed with the program and rank), recorded for
/// torchrun ([`record_error`]), and the process fails.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     ringwire::error_file::main(|| {
///         let comm = ringwire::Communicator::from_env().wait()?;
///         comm.barrier().wait()?;
///         Ok::<(), ringwire::Error>(())
///     })
/// }
/// ```
pub fn main<E: Display>(body: impl FnOnce() -> Result<(), E>) -> ExitCode {
    match body() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

/// Prints `error` to stderr, named by program and rank, and records it for
/// torchrun (a failure to write the file is printed too).
pub fn report(error: &dyn Display) {
    let program = std::env::args()
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "ringwire".into());
    // The rank as setup reads it; none where the environment gives none
    // (or is what failed).
    let rank = crate::env::discover_from_process()
        .map_or_else(|_| String::new(), |c| format!(" rank {}", c.rank));
    eprintln!("{program}{rank}: {error}");
    if let Err(e) = record_error(error) {
        eprintln!(
            "{program}{rank}: could not write the error to {ERROR_FILE_VAR}={}: {e}",
            std::env::var(ERROR_FILE_VAR).unwrap_or_default()
        );
    }
}

/// `{"message": {"message": ..., "extraInfo": {"timestamp": "..."}}}`:
/// what torchrun's `ProcessFailure` reads (it shows `py_callstack` if
/// present, else `message`, and orders failures by `timestamp`).
fn error_json(message: &str, unix_seconds: u64) -> String {
    let mut out = String::from(r#"{"message": {"message": "#);
    json_string(&mut out, message);
    let _ = write!(
        out,
        r#", "extraInfo": {{"timestamp": "{unix_seconds}"}}}}}}"#
    );
    out
}

/// Appends `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_what_json_must() {
        assert_eq!(
            error_json("op \"all_reduce\" #3\n\tpeer\\1 \u{1}é", 42),
            r#"{"message": {"message": "op \"all_reduce\" #3\n\tpeer\\1 \u0001é", "extraInfo": {"timestamp": "42"}}}"#
        );
    }
}
