//! Waiters for a barrier: a parked thread (blocking `sync`) or a callback (`on_durable`, and
//! through it `sync_async`), completed once with the barrier's outcome.

use std::sync::Arc;
use std::thread::Thread;

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// Something waiting for a barrier.
pub(crate) enum Waiter {
    Thread(Arc<Parker>),
    Callback(Box<dyn FnOnce(Result<()>) + Send>),
}

impl Waiter {
    pub fn complete(self, outcome: Result<(), String>) {
        match self {
            Waiter::Thread(p) => p.complete(outcome),
            Waiter::Callback(done) => done(outcome.map_err(Error::Poisoned)),
        }
    }
}

/// A parked thread waiting for its outcome.
pub(crate) struct Parker {
    thread: Thread,
    outcome: Mutex<Option<Result<(), String>>>,
}

impl Parker {
    pub fn current() -> Arc<Parker> {
        Arc::new(Parker {
            thread: std::thread::current(),
            outcome: Mutex::new(None),
        })
    }

    pub fn complete(&self, outcome: Result<(), String>) {
        *self.outcome.lock() = Some(outcome);
        self.thread.unpark();
    }

    pub fn wait(&self) -> Result<(), String> {
        loop {
            if let Some(outcome) = self.outcome.lock().take() {
                return outcome;
            }
            std::thread::park();
        }
    }
}
