//! Handles given to C (`ncclComm_t`, the host streams and events) are
//! numbers in a table, not addresses of Rust objects: a stale or foreign
//! handle is then an error code instead of undefined behaviour, and no
//! pointer is ever dereferenced to find the object.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One counter for every table, so a handle of one kind is never valid as
/// another. Starts away from 0 and steps by 16, like heap addresses.
static NEXT: AtomicUsize = AtomicUsize::new(0x5757_0000_1000);

/// Objects of one kind, by handle.
pub(crate) struct Table<T> {
    objects: Mutex<Option<HashMap<usize, Arc<T>>>>,
}

impl<T> Table<T> {
    pub(crate) const fn new() -> Table<T> {
        Table {
            objects: Mutex::new(None),
        }
    }

    /// Stores `object` and returns its new handle.
    pub(crate) fn insert(&self, object: Arc<T>) -> *mut c_void {
        let id = NEXT.fetch_add(16, Ordering::Relaxed);
        self.lock()
            .get_or_insert_with(HashMap::new)
            .insert(id, object);
        std::ptr::without_provenance_mut(id)
    }

    /// The object of `handle`, if it is live.
    pub(crate) fn get(&self, handle: *const c_void) -> Option<Arc<T>> {
        self.lock().as_ref()?.get(&handle.addr()).cloned()
    }

    /// Takes `handle`'s object out: the handle is dead from now on.
    pub(crate) fn remove(&self, handle: *const c_void) -> Option<Arc<T>> {
        self.lock().as_mut()?.remove(&handle.addr())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<usize, Arc<T>>>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_distinct_and_die_on_remove() {
        let a: Table<u32> = Table::new();
        let b: Table<u32> = Table::new();
        let ha = a.insert(Arc::new(1));
        let hb = b.insert(Arc::new(2));
        assert_ne!(ha, hb);
        assert!(!ha.is_null());
        assert_eq!(a.get(ha).as_deref(), Some(&1));
        assert!(a.get(hb).is_none());
        assert!(a.get(std::ptr::null()).is_none());
        assert_eq!(a.remove(ha).as_deref(), Some(&1));
        assert!(a.get(ha).is_none());
    }
}
