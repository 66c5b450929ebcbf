//! A tokio [`AsyncWrite`] adapter that paces the bytes written through it with a
//! [`RateLimiter`], waiting on tokio's timer so that it never blocks the runtime.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, Sleep};

use super::{Pause, RateLimiter, PAUSE_SLICE, TOKIO_TIMER};

/// Writes through to `W`, counting the bytes; once about 1 ms worth (at the limiter's rate) has
/// accumulated it charges them, and the next write (or shutdown) waits out the pause first.
/// Tokio's timer is millisecond-grained: waits under [`TOKIO_TIMER`] are skipped and made up at a
/// later pause, which keeps the average rate exact. A zero-byte write never reads the clock.
/// `poll_flush` is forwarded; `poll_shutdown` (and [`AsyncThrottledWriter::finish`]) settle the
/// bytes still accumulated before they complete. A pause is slept in slices of at most
/// [`PAUSE_SLICE`] and ends early once the limiter's rate changes, as a thread's does: a pause
/// charged at a mistaken tiny rate is undone by raising or lifting it.
///
/// Must be polled inside a tokio runtime with the time driver enabled.
#[derive(Debug)]
pub struct AsyncThrottledWriter<W> {
    inner: W,
    limiter: Arc<RateLimiter>,
    /// Bytes written but not yet charged.
    pending: u64,
    /// Charge once `pending` reaches this; refreshed from the rate at every pause.
    threshold: u64,
    /// A pause still to be waited out before the next write.
    sleep: Option<PendingPause>,
}

/// A pause the writer owes, and whether a caller has been kept waiting on it.
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

impl<W: AsyncWrite + Unpin> AsyncThrottledWriter<W> {
    /// Wraps `inner`, pacing it with `limiter` (which other writers may share).
    pub fn new(inner: W, limiter: Arc<RateLimiter>) -> Self {
        let threshold = limiter.chunk_bytes();
        AsyncThrottledWriter {
            inner,
            limiter,
            pending: 0,
            threshold,
            sleep: None,
        }
    }

    /// The limiter pacing this writer.
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    /// The wrapped writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The wrapped writer. Bytes written to it directly are not paced.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Flushes the wrapped writer, waits out the pause the stream still owes (including the bytes
    /// still accumulated) and returns the wrapped writer without shutting it down.
    pub async fn finish(mut self) -> io::Result<W> {
        self.inner.flush().await?;
        self.charge_pending();
        std::future::poll_fn(|cx| self.poll_pause(cx)).await;
        Ok(self.inner)
    }

    fn charge_pending(&mut self) {
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
    fn poll_pause(&mut self, cx: &mut Context<'_>) -> Poll<()> {
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

impl<W: AsyncWrite + Unpin> AsyncWrite for AsyncThrottledWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pause(cx));
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.pending += written as u64;
        if this.pending >= this.threshold {
            this.charge_pending();
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending > 0 {
            // Wait out any earlier pause first so that the new one starts from a settled stream.
            ready!(this.poll_pause(cx));
            this.charge_pending();
        }
        ready!(this.poll_pause(cx));
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}
