//! The clock a rate limiter reads and sleeps on: the system's monotonic clock in production, a
//! fake one in tests.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// A monotonic time source that can also block the calling thread.
pub trait Clock: Send + Sync + Debug {
    /// The current time, on a monotonic scale with an arbitrary origin.
    fn now(&self) -> Duration;
    /// Blocks the calling thread for about `duration` (it may oversleep).
    fn sleep(&self, duration: Duration);
}

/// The system's monotonic clock ([`Instant`]) and [`std::thread::sleep`].
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}
