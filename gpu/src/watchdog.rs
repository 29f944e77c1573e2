//! One thread per process that watches every GPU communicator, as
//! PyTorch's ProcessGroupNCCL watchdog does, because a caller may never
//! call `wait` or `is_completed`: it completes finished ops (waking
//! `.await`ers), and fails a communicator on NCCL's async error, an op past
//! its deadline, or its CPU communicator's failure (another rank's abort).
//! It never ends the process. It polls every 200 µs while any op is in
//! flight and every 20 ms otherwise; [`wake`] cuts an idle sleep short.

use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

/// What the watchdog drives: a communicator's ops in flight.
pub(crate) trait Watched: Send + Sync {
    /// Completes finished ops and fails the communicator on an error or a
    /// passed deadline; never blocks on a busy communicator.
    fn progress(&self);
    /// Whether any op is in flight (the watchdog then polls often).
    fn busy(&self) -> bool;
}

struct Watchdog {
    comms: Mutex<Vec<Weak<dyn Watched>>>,
    kick: Mutex<bool>,
    kicked: Condvar,
}

fn watchdog() -> &'static Watchdog {
    static WATCHDOG: OnceLock<&'static Watchdog> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let dog: &'static Watchdog = Box::leak(Box::new(Watchdog {
            comms: Mutex::new(Vec::new()),
            kick: Mutex::new(false),
            kicked: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("ringwire-gpu-watchdog".into())
            .spawn(move || run(dog));
        if let Err(e) = spawned {
            // Waiters still drive progress themselves; only detached ops'
            // deadlines go unwatched.
            tracing::error!(error = %e, "could not start the GPU watchdog thread");
        }
        dog
    })
}

/// Watches `comm` until it is dropped.
pub(crate) fn register(comm: &Arc<impl Watched + 'static>) {
    let dog = watchdog();
    dog.comms
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(comm) as Weak<dyn Watched>);
    wake();
}

/// Ends an idle sleep: an op was queued.
pub(crate) fn wake() {
    let dog = watchdog();
    *dog.kick.lock().unwrap_or_else(|e| e.into_inner()) = true;
    dog.kicked.notify_one();
}

fn run(dog: &'static Watchdog) {
    loop {
        let comms: Vec<Arc<dyn Watched>> = {
            let mut list = dog.comms.lock().unwrap_or_else(|e| e.into_inner());
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        let mut busy = false;
        for comm in &comms {
            comm.progress();
            busy |= comm.busy();
        }
        // Released before sleeping; if a user dropped a communicator
        // meanwhile, its close (bounded) runs here.
        drop(comms);
        let nap = if busy {
            Duration::from_micros(200)
        } else {
            Duration::from_millis(20)
        };
        let mut kick = dog.kick.lock().unwrap_or_else(|e| e.into_inner());
        if !*kick {
            kick = dog
                .kicked
                .wait_timeout(kick, nap)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        *kick = false;
    }
}
