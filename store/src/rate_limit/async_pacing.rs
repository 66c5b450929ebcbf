//! The pacing state the async adapters share: bytes accumulated since the last charge, and the
//! pause still owed, slept on tokio's timer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

use super::{Pause, RateLimiter, PAUSE_SLICE, TOKIO_TIMER};

/// Counts the bytes that passed, charges them once about 1 ms worth (at the limiter's rate) has
/// accumulated, and holds the pause owed until [`AsyncPacing::poll_pause`] has waited it out.
/// Tokio's timer is millisecond-grained: waits under [`TOKIO_TIMER`] are skipped and made up at a
/// later pause, which keeps the average rate exact. A pause is slept in slices of at most
/// [`PAUSE_SLICE`] and ends early once the limiter's rate changes, as a thread's does: a pause
/// charged at a mistaken tiny rate is undone by raising or lifting it.
#[derive(Debug)]
pub(crate) struct AsyncPacing {
    limiter: Arc<RateLimiter>,
    /// Bytes passed but not yet charged.
    pending: u64,
    /// Charge once `pending` reaches this; refreshed from the rate at every charge.
    threshold: u64,
    /// A pause still to be waited out before the next bytes pass.
    sleep: Option<PendingPause>,
}

/// A pause owed, and whether a caller has been kept waiting on it.
#[derive(Debug)]
struct PendingPause {
    /// The current slice of the pause.
    sleep: Pin<Box<Sleep>>,
    /// When the whole pause ends.
    end: Instant,
    /// The rate it was charged at: another one ends it.
    rate: u64,
    pause: Pause,
    /// Set once a poll found the sleep unfinished. Only then does its end measure the timer's
    /// lateness; a sleep found finished at its first poll ended while the caller was elsewhere,
    /// and that time is idle time, not oversleep.
    waited: bool,
}

impl AsyncPacing {
    pub(crate) fn new(limiter: Arc<RateLimiter>) -> Self {
        let threshold = limiter.chunk_bytes();
        AsyncPacing {
            limiter,
            pending: 0,
            threshold,
            sleep: None,
        }
    }

    pub(crate) fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    /// Counts `bytes` that passed; charges them once enough has accumulated. Zero bytes cost one
    /// comparison and never read the clock.
    pub(crate) fn passed(&mut self, bytes: usize) {
        self.pending += bytes as u64;
        if self.pending >= self.threshold {
            self.charge_pending();
        }
    }

    /// How many bytes may pass before the next charge (at least 1); `None` when unlimited.
    /// A reader reads no more than this at once, so that a large read buffer does not take
    /// in a burst what the rate would spread over seconds.
    pub(crate) fn room(&self) -> Option<usize> {
        if self.limiter.is_unlimited() {
            return None;
        }
        let room = self.threshold.saturating_sub(self.pending).max(1);
        Some(usize::try_from(room).unwrap_or(usize::MAX))
    }

    /// Whether bytes have passed that are not charged yet.
    pub(crate) fn has_pending(&self) -> bool {
        self.pending > 0
    }

    /// Charges the bytes accumulated so far, whatever their count.
    pub(crate) fn charge_pending(&mut self) {
        let bytes = std::mem::take(&mut self.pending);
        if bytes > 0 {
            let rate = self.limiter.rate();
            let pause = self.limiter.charge(bytes, TOKIO_TIMER);
            if !pause.is_zero() {
                let now = Instant::now();
                let end = now + pause.wait;
                self.sleep = Some(PendingPause {
                    sleep: Box::pin(tokio::time::sleep_until(end.min(now + PAUSE_SLICE))),
                    end,
                    rate,
                    pause,
                    waited: false,
                });
            }
        }
        self.threshold = self.limiter.chunk_bytes();
    }

    /// Waits out the pause owed, slice by slice; a rate change ends it.
    pub(crate) fn poll_pause(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while let Some(pending) = self.sleep.as_mut() {
            if pending.sleep.as_mut().poll(cx).is_pending() {
                pending.waited = true;
                return Poll::Pending;
            }
            if self.limiter.rate() != pending.rate {
                // The new rate started a new schedule: nothing charged before is owed.
                self.sleep = None;
                break;
            }
            let now = Instant::now();
            if now < pending.end {
                let next = pending.end.min(now + PAUSE_SLICE);
                pending.sleep.as_mut().reset(next);
                continue;
            }
            if pending.waited {
                self.limiter.woke(pending.pause);
            }
            self.sleep = None;
        }
        Poll::Ready(())
    }
}
