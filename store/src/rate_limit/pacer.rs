//! The pacing policy of the rate limiter: plain arithmetic on times that the caller passes in, so
//! that it is tested with a fake clock and no sleeps.
//!
//! The policy paces against absolute deadlines. Every charge advances a virtual finish time by
//! `bytes / rate`; the caller sleeps until that time. A sleep that is skipped because the timer
//! cannot honour it leaves the virtual finish time where it was, and so does a sleep that wakes
//! late (the caller reports its wake-up with [`Pacer::woke`]): the following pauses make up the
//! difference and the long-run rate does not drift. Idle time earns credit too, up to
//! [`IDLE_CREDIT`] (or one chunk's time, if longer): a job that pauses between its writes (an
//! export reading the next records, a write held up by the disk) for less than that loses
//! nothing, and takes about max(its unthrottled time, bytes / rate); a stream that resumes after
//! a long break bursts at most that much. Oversleep is credited up to the same bound: a sleep
//! that ended very late (a stalled process) is no licence for a burst.

use std::time::Duration;

/// About this much time's worth of bytes accumulates before the pause logic runs.
pub const CHUNK_TIME: Duration = Duration::from_millis(1);
/// The most credit idle time (or a late wake-up) earns: gaps between a job's writes up to this
/// long cost it nothing. Before, a gap earned one chunk's time (1 ms): a job that computed for
/// 4 ms and then wrote 4 ms worth took 7 ms per round instead of 4.
pub const IDLE_CREDIT: Duration = Duration::from_millis(50);
/// The smallest number of bytes that accumulates before a pause, whatever the rate.
pub const MIN_CHUNK_BYTES: u64 = 4 * 1024;
/// The largest number of bytes that accumulates before a pause, whatever the rate. Also the
/// interval at which an unlimited stream looks at the rate again (without reading the clock).
pub const MAX_CHUNK_BYTES: u64 = 1024 * 1024;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// What a pause asks of the caller: sleep for `wait` (zero: go on at once), until `until` on the
/// clock that was passed to [`Pacer::pause`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pause {
    /// How long to sleep; zero means no sleep.
    pub wait: Duration,
    /// The time the sleep should end.
    pub until: Duration,
}

impl Pause {
    /// Whether the caller need not sleep.
    pub fn is_zero(&self) -> bool {
        self.wait.is_zero()
    }
}

/// The deadline bookkeeping of one limiter. It holds no rate: each pause is told the rate in
/// force, which is how a rate change takes effect at the next pause.
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    /// The virtual finish time of every byte charged so far; `None` before the first charge.
    deadline: Option<Duration>,
    /// Oversleep reported by [`Pacer::woke`] and not made up yet: credit beyond the idle window,
    /// because the lateness was the timer's, not the writer's.
    owed: Duration,
    /// The rate of the last charge. A charge at another rate starts a new schedule: what was
    /// charged at the old rate is not owed at the new one (else raising a tiny rate would still
    /// wait out everything charged at it).
    rate: u64,
}

impl Pacer {
    /// A pacer with no history: the first charge starts its clock.
    pub const fn new() -> Self {
        Pacer {
            deadline: None,
            owed: Duration::ZERO,
            rate: 0,
        }
    }

    /// How many bytes accumulate before the pause logic runs at `rate` bytes per second: about
    /// [`CHUNK_TIME`] worth, clamped to [`MIN_CHUNK_BYTES`]..=[`MAX_CHUNK_BYTES`]. For the unlimited
    /// rate (0) it is [`MAX_CHUNK_BYTES`], so that a writer notices a new rate within that many bytes.
    pub fn chunk_bytes(rate: u64) -> u64 {
        if rate == 0 {
            return MAX_CHUNK_BYTES;
        }
        let per_chunk = (u128::from(rate) * CHUNK_TIME.as_nanos() / NANOS_PER_SEC) as u64;
        per_chunk.clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES)
    }

    /// The time `bytes` take at `rate` (> 0) bytes per second, rounded up to a nanosecond.
    pub fn cost(bytes: u64, rate: u64) -> Duration {
        debug_assert!(rate > 0);
        let rate = u128::from(rate.max(1));
        let nanos = (u128::from(bytes) * NANOS_PER_SEC).div_ceil(rate);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The most credit idle time can earn at `rate`: [`IDLE_CREDIT`], or one chunk's time or
    /// two timer ticks when that is longer (a coarse timer's sleeps come in whole ticks).
    pub fn credit_window(rate: u64, timer: Duration) -> Duration {
        Self::cost(Self::chunk_bytes(rate), rate)
            .max(timer.saturating_mul(2))
            .max(IDLE_CREDIT)
    }

    /// Forgets the schedule: the next charge starts a new one (the rate was set anew).
    pub fn reset(&mut self) {
        *self = Pacer::new();
    }

    /// The virtual finish time of everything charged so far, if anything was.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// Oversleep not yet made up.
    pub fn owed(&self) -> Duration {
        self.owed
    }

    /// Charges `bytes` at `rate` bytes per second and says how long the caller must sleep.
    /// `timer` is the shortest sleep the caller's timer honours: a shorter wait is skipped (zero)
    /// while the deadline still advances, so a later pause makes it up. `now` is the current time
    /// on any monotonic scale; it is called at most once, and never for the unlimited rate (0),
    /// which never waits.
    pub fn pause(
        &mut self,
        bytes: u64,
        rate: u64,
        timer: Duration,
        now: impl FnOnce() -> Duration,
    ) -> Pause {
        if rate == 0 {
            return Pause::default();
        }
        if rate != self.rate {
            self.rate = rate;
            self.deadline = None;
            self.owed = Duration::ZERO;
        }
        let now = now();
        let allowance = Self::credit_window(rate, timer).saturating_add(self.owed);
        let start = match self.deadline {
            Some(deadline) => deadline.max(now.saturating_sub(allowance)),
            None => now,
        };
        let deadline = start.saturating_add(Self::cost(bytes, rate));
        self.deadline = Some(deadline);
        // Whatever oversleep this chunk did not make up stays owed, but never more than the
        // stream is still behind.
        self.owed = self.owed.min(now.saturating_sub(deadline));
        let wait = deadline.saturating_sub(now);
        Pause {
            wait: if wait < timer { Duration::ZERO } else { wait },
            until: deadline,
        }
    }

    /// Records that a sleep asked for by `pause` ended at `now`: time past `pause.until` is the
    /// timer's oversleep, which the following pauses make up (beyond the idle window), up to
    /// [`IDLE_CREDIT`] in all.
    pub fn woke(&mut self, pause: Pause, now: Duration) {
        let late = now.saturating_sub(pause.until);
        self.owed = self.owed.saturating_add(late).min(IDLE_CREDIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_is_one_millisecond_clamped() {
        assert_eq!(Pacer::chunk_bytes(0), MAX_CHUNK_BYTES);
        assert_eq!(Pacer::chunk_bytes(1), MIN_CHUNK_BYTES);
        assert_eq!(Pacer::chunk_bytes(1_000_000), MIN_CHUNK_BYTES);
        assert_eq!(Pacer::chunk_bytes(64_000_000), 64_000);
        assert_eq!(Pacer::chunk_bytes(1_024_000_000), 1_024_000);
        assert_eq!(Pacer::chunk_bytes(u64::MAX), MAX_CHUNK_BYTES);
    }

    #[test]
    fn cost_rounds_up_and_never_overflows() {
        assert_eq!(Pacer::cost(1_000, 1_000_000), Duration::from_millis(1));
        assert_eq!(Pacer::cost(1, 3), Duration::from_nanos(333_333_334));
        assert_eq!(Pacer::cost(u64::MAX, 1), Duration::from_nanos(u64::MAX));
    }
}
