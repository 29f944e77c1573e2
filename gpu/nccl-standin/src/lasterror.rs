//! `ncclGetLastError`'s text. Every message is interned in leaked storage,
//! so a pointer handed to C stays valid forever (even after the comm that
//! logged it is destroyed); the set of distinct messages is small.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, OnceLock};

/// The process's last error, as `ncclGetLastError(NULL)` reports it.
static PROCESS_LAST: Mutex<Option<&'static CStr>> = Mutex::new(None);

/// `text` as a C string that lives forever (NULs become spaces).
pub(crate) fn intern(text: &str) -> &'static CStr {
    static TABLE: OnceLock<Mutex<HashMap<String, &'static CStr>>> = OnceLock::new();
    let mut table = TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(found) = table.get(text) {
        return found;
    }
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    let leaked: &'static CStr = Box::leak(c.into_boxed_c_str());
    table.insert(text.to_string(), leaked);
    leaked
}

/// Records `text` as the process's last error and returns it interned (for
/// a comm to keep as its own too). Printed to stderr as NCCL would when
/// `NCCL_DEBUG` is WARN, INFO or TRACE.
pub(crate) fn set(text: &str) -> &'static CStr {
    let interned = intern(text);
    *PROCESS_LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some(interned);
    if let Ok(level) = std::env::var("NCCL_DEBUG")
        && matches!(
            level.to_ascii_uppercase().as_str(),
            "WARN" | "INFO" | "TRACE"
        )
    {
        eprintln!("NCCL WARN {text}");
    }
    interned
}

/// The process's last error, "" if none yet.
pub(crate) fn process_last() -> &'static CStr {
    PROCESS_LAST
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or(c"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interned_strings_are_shared_and_stable() {
        let a = intern("stand-in NCCL: x");
        let b = intern("stand-in NCCL: x");
        assert_eq!(a.as_ptr(), b.as_ptr());
        assert_eq!(a.to_str().unwrap(), "stand-in NCCL: x");
        assert_eq!(intern("a\0b").to_str().unwrap(), "a b");
    }
}
