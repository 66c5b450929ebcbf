//! What an operator command says on stderr while it waits for the cluster. A command may have
//! many requests in flight at once (a restore writes 32 keys at a time), each of which would
//! say the same: a notice is printed once, and again only after [`QUIET`] without it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use std::sync::Mutex;

/// How long a notice printed keeps the same notice from being printed again.
pub const QUIET: Duration = Duration::from_secs(10);

/// The notices printed lately, with when.
#[derive(Debug, Default)]
pub struct Notices {
    printed: Mutex<HashMap<String, Instant>>,
}

impl Notices {
    /// Prints `text` on stderr, unless it was printed less than [`QUIET`] ago.
    pub fn say(&self, text: String) {
        if self.fresh(&text, Instant::now()) {
            eprintln!("{text}");
        }
    }

    /// Whether `text` is to be printed at `now` (it was not in the [`QUIET`] before), noting it
    /// as printed if so.
    fn fresh(&self, text: &str, now: Instant) -> bool {
        let mut printed = self.printed.lock().unwrap_or_else(|e| e.into_inner());
        printed.retain(|_, at| now.saturating_duration_since(*at) < QUIET);
        if printed.contains_key(text) {
            return false;
        }
        printed.insert(text.to_owned(), now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same notice is printed once within the quiet time, and again after it; another
    /// notice is printed at once.
    #[test]
    fn a_notice_is_printed_once_a_while() {
        let notices = Notices::default();
        let t0 = Instant::now();
        assert!(notices.fresh("a", t0));
        assert!(!notices.fresh("a", t0 + Duration::from_secs(1)));
        assert!(notices.fresh("b", t0 + Duration::from_secs(1)));
        assert!(!notices.fresh("a", t0 + QUIET - Duration::from_millis(1)));
        assert!(notices.fresh("a", t0 + QUIET));
        assert!(!notices.fresh("a", t0 + QUIET + Duration::from_secs(1)));
    }
}
