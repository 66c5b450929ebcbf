//! Progress lines for the test output, stamped with the time since the test process started, so
//! a failure's output shows where the time went.

use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn lines() -> &'static Mutex<Vec<String>> {
    static LINES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LINES.get_or_init(Mutex::default)
}

/// Prints `text` to standard error (captured by the test harness unless the test fails) and
/// keeps it for [`print_kept`].
pub fn note(text: impl std::fmt::Display) {
    let line = format!("[{:7.2}s] {text}", start().elapsed().as_secs_f64());
    eprintln!("{line}");
    lines().lock().unwrap_or_else(|p| p.into_inner()).push(line);
}

/// Writes every line noted so far straight to standard error, past the test harness's
/// capture: for a test that passed but was slow, whose output the harness would drop.
pub fn print_kept(why: &str) {
    let kept = lines().lock().unwrap_or_else(|p| p.into_inner()).join("\n");
    let _ = writeln!(std::io::stderr(), "--- {why}; its progress:\n{kept}\n---");
}
