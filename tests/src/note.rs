//! Progress lines for the test output, stamped with the time since the test process started, so
//! a failure's output shows where the time went.

use std::sync::OnceLock;
use std::time::Instant;

fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Prints `text` to standard error (captured by the test harness unless the test fails).
pub fn note(text: impl std::fmt::Display) {
    eprintln!("[{:7.2}s] {text}", start().elapsed().as_secs_f64());
}
