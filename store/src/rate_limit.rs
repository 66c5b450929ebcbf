//! An accumulating byte-rate limiter, and the writers that use it.
//!
//! Reading the clock and considering a sleep on every call costs far more than it saves when the
//! calls are small or empty (a flush makes a zero-byte call): a limiter built that way, asked for
//! 50 MB/s, delivered about 8 MB/s. So the writers here accumulate bytes without touching the
//! limiter and run the pause logic only once about 1 ms worth has built up (see [`Pacer`]), and a
//! zero-byte call costs one branch and never reads the clock.
//!
//! - [`RateLimiter`]: the shared, runtime-adjustable rate and its deadline bookkeeping.
//! - [`ThrottledWriter`]: a [`std::io::Write`] adapter that sleeps the calling thread.
//! - [`AsyncThrottledWriter`]: a tokio `AsyncWrite` adapter that sleeps on tokio's timer.
//! - [`AsyncThrottledReader`]: its `AsyncRead` counterpart (a snapshot download).

mod async_pacing;
mod clock;
mod pacer;
mod throttled;
mod throttled_async;
mod throttled_async_reader;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

pub use clock::{Clock, SystemClock};
pub use pacer::{Pacer, Pause, CHUNK_TIME, IDLE_CREDIT, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES};
pub use throttled::ThrottledWriter;
pub use throttled_async::AsyncThrottledWriter;
pub use throttled_async_reader::AsyncThrottledReader;

/// The shortest sleep [`std::thread::sleep`] is asked for; shorter waits are skipped (and made up
/// at the next pause), because the sleep's own overhead (tens of microseconds) would dominate.
pub const THREAD_TIMER: Duration = Duration::from_micros(100);
/// The longest single sleep of [`RateLimiter::pause`]; between slices it looks at the rate.
pub const PAUSE_SLICE: Duration = Duration::from_millis(50);
/// The shortest sleep tokio's timer is asked for: it has millisecond granularity.
pub const TOKIO_TIMER: Duration = Duration::from_millis(1);

/// A byte-rate limit shared by any number of writers (as `Arc<RateLimiter>`); their bytes count
/// against one budget. The rate is in bytes per second, 0 meaning unlimited, and can be changed
/// at any time with [`RateLimiter::set_rate`]; a change takes effect at each writer's next pause,
/// ends a running [`RateLimiter::pause`] early, and starts a new schedule (bytes charged at the
/// old rate are not owed at the new one).
///
/// Writers accumulate bytes locally and call [`RateLimiter::charge`] (or [`RateLimiter::pause`])
/// once they hold [`RateLimiter::chunk_bytes`]; only then is the clock read. At the unlimited
/// rate the clock is never read and nothing sleeps.
pub struct RateLimiter {
    rate: AtomicU64,
    pacer: Mutex<Pacer>,
    clock: Arc<dyn Clock>,
    pauses: AtomicU64,
    paused_nanos: AtomicU64,
}

impl RateLimiter {
    /// A limiter at `bytes_per_sec` (0 = unlimited) on the system clock.
    pub fn new(bytes_per_sec: u64) -> Self {
        Self::with_clock(bytes_per_sec, Arc::new(SystemClock::new()))
    }

    /// A limiter that never sleeps (until its rate is set).
    pub fn unlimited() -> Self {
        Self::new(0)
    }

    /// A limiter at `bytes_per_sec` (0 = unlimited) that reads and sleeps on `clock`.
    pub fn with_clock(bytes_per_sec: u64, clock: Arc<dyn Clock>) -> Self {
        RateLimiter {
            rate: AtomicU64::new(bytes_per_sec),
            pacer: Mutex::new(Pacer::new()),
            clock,
            pauses: AtomicU64::new(0),
            paused_nanos: AtomicU64::new(0),
        }
    }

    /// Sets the rate in bytes per second (0 = unlimited). Bytes already accumulated by a writer
    /// are charged at the rate in force at that writer's next pause. A new rate starts a new
    /// schedule, also one set back to an earlier rate (through unlimited, say): what was charged
    /// before is not owed after.
    pub fn set_rate(&self, bytes_per_sec: u64) {
        if self.rate.swap(bytes_per_sec, Ordering::Relaxed) != bytes_per_sec {
            self.pacer.lock().reset();
        }
    }

    /// The rate in bytes per second; 0 means unlimited.
    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Whether the rate is unlimited.
    pub fn is_unlimited(&self) -> bool {
        self.rate() == 0
    }

    /// How many bytes a writer should accumulate before it calls [`RateLimiter::charge`]: about
    /// 1 ms worth at the current rate, clamped to 4 KiB..=1 MiB (1 MiB when unlimited).
    pub fn chunk_bytes(&self) -> u64 {
        Pacer::chunk_bytes(self.rate())
    }

    /// How many times this limiter asked a writer to sleep.
    pub fn pauses(&self) -> u64 {
        self.pauses.load(Ordering::Relaxed)
    }

    /// The total time this limiter asked writers to sleep, in nanoseconds.
    pub fn paused_nanos(&self) -> u64 {
        self.paused_nanos.load(Ordering::Relaxed)
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Charges `bytes` (already written) against the budget and says how long the caller must
    /// wait before writing more; it does not sleep itself. `timer` is the shortest sleep the
    /// caller's timer honours ([`THREAD_TIMER`], [`TOKIO_TIMER`]); shorter waits come back as
    /// zero and are made up at a later pause. Reads the clock once, and not at all when
    /// unlimited. A caller that sleeps should report the end of its sleep with
    /// [`RateLimiter::woke`], so that an oversleep is made up.
    pub fn charge(&self, bytes: u64, timer: Duration) -> Pause {
        let rate = self.rate();
        if rate == 0 {
            return Pause::default();
        }
        let pause = self
            .pacer
            .lock()
            .pause(bytes, rate, timer, || self.clock.now());
        if !pause.is_zero() {
            self.pauses.fetch_add(1, Ordering::Relaxed);
            let nanos = u64::try_from(pause.wait.as_nanos()).unwrap_or(u64::MAX);
            self.paused_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
        pause
    }

    /// Reports that the sleep for `pause` has ended (reads the clock once), so that the time the
    /// timer overslept is made up by the following pauses rather than lost.
    pub fn woke(&self, pause: Pause) {
        let now = self.clock.now();
        self.pacer.lock().woke(pause, now);
    }

    /// Charges `bytes` and blocks the calling thread (on the limiter's clock) for as long as the
    /// budget requires. Never call it on an async runtime thread; use [`AsyncThrottledWriter`].
    ///
    /// The sleep is taken in slices of at most [`PAUSE_SLICE`] and ends early once the rate
    /// changes: a pause charged at a tiny rate (a mistake, 1 byte/s) would otherwise sleep for
    /// days after the rate was raised or lifted, and hold a closing node (which lifts it).
    pub fn pause(&self, bytes: u64) {
        let rate = self.rate();
        let pause = self.charge(bytes, THREAD_TIMER);
        let mut left = pause.wait;
        while !left.is_zero() {
            let slice = left.min(PAUSE_SLICE);
            self.clock.sleep(slice);
            left -= slice;
            if self.rate() != rate {
                break;
            }
        }
        if !pause.is_zero() {
            self.woke(pause);
        }
    }
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::unlimited()
    }
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("rate", &self.rate())
            .field("pauses", &self.pauses())
            .field("paused_nanos", &self.paused_nanos())
            .finish_non_exhaustive()
    }
}
