//! A doorbell for the loom models: a flag and a condition variable, as a
//! link's socket is to its sleeper.

use loom::sync::{Condvar, Mutex};

#[derive(Default)]
pub(crate) struct Bell {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Bell {
    pub(crate) fn ring(&self) {
        *self.rung.lock().unwrap() = true;
        self.cv.notify_one();
    }

    pub(crate) fn sleep(&self) {
        let mut rung = self.rung.lock().unwrap();
        while !*rung {
            rung = self.cv.wait(rung).unwrap();
        }
        *rung = false;
    }
}
