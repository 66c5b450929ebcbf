//! When automatic snapshot builds pause: after a failed build they wait, longer with each
//! failure in a row, until one succeeds; a requested build (`MetaNode::snapshot_now`) runs
//! regardless. Plain bookkeeping, tested without a runtime; the state machine asks it before
//! it hands openraft a builder.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::Error;

/// The pause of automatic snapshot builds after a first failed one.
const FIRST_BUILD_PAUSE: Duration = Duration::from_secs(10);
/// The longest pause after failed builds in a row.
const LONGEST_BUILD_PAUSE: Duration = Duration::from_secs(300);

/// The last failed snapshot build: when, why, and how many failed in a row.
#[derive(Debug)]
struct Failure {
    at: Instant,
    why: FailedBuild,
    in_a_row: u32,
}

/// Why a snapshot build failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedBuild {
    /// The error, in words.
    pub(crate) why: String,
    /// The data dir's file system ran out of space (or quota) during the build.
    pub(crate) out_of_space: bool,
}

impl FailedBuild {
    pub(crate) fn of(e: &Error) -> FailedBuild {
        FailedBuild {
            why: e.to_string(),
            out_of_space: e.is_out_of_space(),
        }
    }

    /// The error that answers a requested build that failed so.
    pub(crate) fn into_error(self) -> Error {
        if self.out_of_space {
            Error::NoRoomToBuildSnapshot(self.why)
        } else {
            Error::Snapshot(format!("building a snapshot failed: {}", self.why))
        }
    }
}

impl Failure {
    /// How long automatic builds pause after this failure: [`FIRST_BUILD_PAUSE`], doubling
    /// with each failure in a row, at most [`LONGEST_BUILD_PAUSE`].
    fn pause(&self) -> Duration {
        FIRST_BUILD_PAUSE
            .saturating_mul(1 << (self.in_a_row.saturating_sub(1)).min(16))
            .min(LONGEST_BUILD_PAUSE)
    }
}

/// The failed builds in a row and a pending request for a build; shared by the state machine
/// and its builders.
#[derive(Debug, Default)]
pub(crate) struct BuildPauses {
    /// The last failed build, until a build succeeds.
    failure: Mutex<Option<Failure>>,
    /// A build was requested: the next one runs even while automatic ones pause. openraft asks
    /// for every builder, requested or not, as one that may be deferred.
    requested: AtomicBool,
}

impl BuildPauses {
    /// Records a build that failed at `at`; returns how long automatic builds now pause.
    pub(crate) fn failed(&self, why: FailedBuild, at: Instant) -> Duration {
        let mut failure = self.failure.lock();
        let in_a_row = failure.as_ref().map_or(0, |f| f.in_a_row) + 1;
        let f = Failure { at, why, in_a_row };
        let pause = f.pause();
        *failure = Some(f);
        pause
    }

    /// Forgets failed builds (one succeeded).
    pub(crate) fn succeeded(&self) {
        self.failure.lock().take();
    }

    /// Why a build that failed at or after `since` failed, if one did.
    pub(crate) fn failed_since(&self, since: Instant) -> Option<FailedBuild> {
        let failure = self.failure.lock();
        failure
            .as_ref()
            .filter(|f| f.at >= since)
            .map(|f| f.why.clone())
    }

    /// Failed builds in a row (0 after a success).
    #[cfg(test)]
    pub(crate) fn in_a_row(&self) -> u32 {
        self.failure.lock().as_ref().map_or(0, |f| f.in_a_row)
    }

    /// Makes the next build run even while automatic builds pause.
    pub(crate) fn request(&self) {
        self.requested.store(true, Ordering::Release);
    }

    /// Whether a build may start at `now`: a forced or requested one always (this takes the
    /// request), an automatic one unless the pause after the last failure still runs.
    pub(crate) fn may_build(&self, force: bool, now: Instant) -> bool {
        let requested = self.requested.swap(false, Ordering::AcqRel);
        if force || requested {
            return true;
        }
        self.failure
            .lock()
            .as_ref()
            .is_none_or(|f| now.saturating_duration_since(f.at) >= f.pause())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(why: impl Into<String>) -> FailedBuild {
        FailedBuild {
            why: why.into(),
            out_of_space: false,
        }
    }

    #[test]
    fn each_failure_in_a_row_doubles_the_pause_up_to_the_longest() {
        let pauses = BuildPauses::default();
        let t0 = Instant::now();
        assert!(pauses.may_build(false, t0), "no failure, no pause");
        let mut expected = FIRST_BUILD_PAUSE;
        for n in 1..=8 {
            assert_eq!(pauses.failed(failure(format!("failure {n}")), t0), expected);
            assert_eq!(pauses.in_a_row(), n);
            expected = (expected * 2).min(LONGEST_BUILD_PAUSE);
        }
        assert_eq!(expected, LONGEST_BUILD_PAUSE, "the pause reached its cap");
        let pause = pauses.failed(failure("again"), t0);
        assert_eq!(pause, LONGEST_BUILD_PAUSE);
        assert!(!pauses.may_build(false, t0 + pause - Duration::from_millis(1)));
        assert!(pauses.may_build(false, t0 + pause), "the pause ends");
        pauses.succeeded();
        assert_eq!(pauses.in_a_row(), 0);
        assert_eq!(
            pauses.failed(failure("after a success"), t0),
            FIRST_BUILD_PAUSE,
            "a success starts the doubling over"
        );
    }

    #[test]
    fn a_forced_or_requested_build_runs_during_a_pause_and_a_request_is_taken_once() {
        let pauses = BuildPauses::default();
        let t0 = Instant::now();
        pauses.failed(failure("disk full"), t0);
        assert!(!pauses.may_build(false, t0), "automatic builds pause");
        assert!(pauses.may_build(true, t0), "a forced one runs");
        pauses.request();
        assert!(pauses.may_build(false, t0), "a requested one runs");
        assert!(!pauses.may_build(false, t0), "the request was taken");
    }

    #[test]
    fn only_a_failure_at_or_after_the_time_asked_is_reported() {
        let pauses = BuildPauses::default();
        let t0 = Instant::now();
        pauses.failed(failure("old failure"), t0);
        let asked = t0 + Duration::from_secs(1);
        assert_eq!(pauses.failed_since(asked), None);
        pauses.failed(failure("new failure"), asked);
        assert_eq!(pauses.failed_since(asked), Some(failure("new failure")));
        pauses.succeeded();
        assert_eq!(pauses.failed_since(t0), None, "a success clears it");
    }

    #[test]
    fn a_requested_build_that_ran_out_of_space_is_answered_as_such() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let e = Error::storage("finish snapshot", meta_store::Error::io("write", "f", full));
        let pauses = BuildPauses::default();
        let t0 = Instant::now();
        pauses.failed(FailedBuild::of(&e), t0);
        let answer = pauses.failed_since(t0).unwrap().into_error();
        assert!(
            matches!(&answer, Error::NoRoomToBuildSnapshot(why) if why.contains("finish snapshot")),
            "{answer:?}"
        );
        let other = failure("a snapshot dir that is a file").into_error();
        assert!(matches!(other, Error::Snapshot(_)), "{other:?}");
    }
}
