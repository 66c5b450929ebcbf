//! How often a log line that repeats is written. Some events recur for as long as their cause
//! lasts: a member that refuses snapshots (for want of room, say) is sent the same one again
//! about twice a second, and a node wiped and restarted with `--init` by mistake sends its
//! former peers several messages a second that they refuse as another cluster's. One line per
//! cause, then one every [`REPEAT_EVERY`] with the count of the events in between, says as much
//! as a line per event without burying everything else. Plain bookkeeping, tested without a
//! runtime.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two lines for the same cause.
pub(crate) const REPEAT_EVERY: Duration = Duration::from_secs(30);

/// The most causes remembered at once: past it, the oldest line is forgotten (its cause, if it
/// recurs, is logged again at once). Causes come from peers, so their number is bounded here
/// rather than trusted.
const MAX_CAUSES: usize = 64;

/// The last line written for one cause.
#[derive(Debug)]
struct Told<T> {
    /// What the line said that makes a change worth a line at once (the snapshot file sent).
    detail: T,
    at: Instant,
    /// The events since that line that were not logged.
    unlogged: u64,
}

/// The lines written per cause `K`; a cause whose `T` changes is logged again at once. Shared
/// by whatever logs the events (every connection to a member, every request a route refuses).
#[derive(Debug)]
pub(crate) struct LogThrottle<K, T = ()> {
    told: Mutex<HashMap<K, Told<T>>>,
}

impl<K, T> Default for LogThrottle<K, T> {
    fn default() -> Self {
        LogThrottle {
            told: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, T: PartialEq> LogThrottle<K, T> {
    /// Notes an event of `cause`, with `detail`, at `now`. `Some(n)` if it deserves a line (the
    /// first of its cause, one whose detail changed, or one [`REPEAT_EVERY`] after the last
    /// line), `n` being the events of the cause left unlogged since that line; `None` if it
    /// does not (log it at debug, if at all).
    pub(crate) fn note(&self, cause: K, detail: T, now: Instant) -> Option<u64> {
        let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = told.get_mut(&cause) {
            if last.detail == detail {
                if now.saturating_duration_since(last.at) < REPEAT_EVERY {
                    last.unlogged += 1;
                    return None;
                }
                last.at = now;
                return Some(std::mem::take(&mut last.unlogged));
            }
        } else if told.len() >= MAX_CAUSES {
            let oldest = told
                .iter()
                .min_by_key(|(_, t)| t.at)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                told.remove(&oldest);
            }
        }
        let first = Told {
            detail,
            at: now,
            unlogged: 0,
        };
        told.insert(cause, first);
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn each_cause_is_told_once_then_at_most_every_repeat() {
        let throttle = LogThrottle::<u64, PathBuf>::default();
        let t0 = Instant::now();
        let (a, b) = (PathBuf::from("snap-a"), PathBuf::from("snap-b"));
        assert_eq!(throttle.note(2, a.clone(), t0), Some(0), "the first event");
        assert_eq!(throttle.note(3, a.clone(), t0), Some(0), "another cause");
        let half = Duration::from_millis(500);
        for n in 1..=10 {
            assert_eq!(
                throttle.note(2, a.clone(), t0 + half * n),
                None,
                "event {n}"
            );
        }
        assert_eq!(
            throttle.note(2, a.clone(), t0 + REPEAT_EVERY),
            Some(10),
            "after the pause, with the events since"
        );
        assert_eq!(throttle.note(2, a.clone(), t0 + REPEAT_EVERY + half), None);
        assert_eq!(
            throttle.note(2, b, t0 + REPEAT_EVERY + half),
            Some(0),
            "a changed detail is told at once"
        );
        assert_eq!(throttle.note(3, a, t0 + half), None, "cause 3 unchanged");
    }

    #[test]
    fn causes_past_the_bound_forget_the_oldest() {
        let throttle = LogThrottle::<usize>::default();
        let t0 = Instant::now();
        let step = Duration::from_millis(1);
        for cause in 0..MAX_CAUSES {
            assert_eq!(throttle.note(cause, (), t0 + step * cause as u32), Some(0));
        }
        let later = t0 + step * MAX_CAUSES as u32;
        assert_eq!(throttle.note(MAX_CAUSES, (), later), Some(0), "one more");
        assert_eq!(throttle.told.lock().unwrap().len(), MAX_CAUSES, "bounded");
        assert_eq!(throttle.note(1, (), later), None, "a newer cause is kept");
        assert_eq!(
            throttle.note(0, (), later),
            Some(0),
            "the oldest was forgotten"
        );
    }
}
