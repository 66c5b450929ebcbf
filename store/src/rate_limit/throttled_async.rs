//! A tokio [`AsyncWrite`] adapter that paces the bytes written through it with a
//! [`RateLimiter`], waiting on tokio's timer so that it never blocks the runtime.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::async_pacing::AsyncPacing;
use super::RateLimiter;

/// Writes through to `W`, counting the bytes; once about 1 ms worth (at the limiter's rate) has
/// accumulated it charges them, and the next write (or shutdown) waits out the pause first.
/// Tokio's timer is millisecond-grained: waits under [`TOKIO_TIMER`](super::TOKIO_TIMER) are skipped and made up at a
/// later pause, which keeps the average rate exact. A zero-byte write never reads the clock.
/// `poll_flush` is forwarded; `poll_shutdown` (and [`AsyncThrottledWriter::finish`]) settle the
/// bytes still accumulated before they complete. A pause is slept in slices of at most
/// [`PAUSE_SLICE`](super::PAUSE_SLICE) and ends early once the limiter's rate changes, as a thread's does: a pause
/// charged at a mistaken tiny rate is undone by raising or lifting it.
///
/// Must be polled inside a tokio runtime with the time driver enabled.
#[derive(Debug)]
pub struct AsyncThrottledWriter<W> {
    inner: W,
    pacing: AsyncPacing,
}

impl<W: AsyncWrite + Unpin> AsyncThrottledWriter<W> {
    /// Wraps `inner`, pacing it with `limiter` (which other writers and readers may share).
    pub fn new(inner: W, limiter: Arc<RateLimiter>) -> Self {
        AsyncThrottledWriter {
            inner,
            pacing: AsyncPacing::new(limiter),
        }
    }

    /// The limiter pacing this writer.
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        self.pacing.limiter()
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
        self.pacing.charge_pending();
        std::future::poll_fn(|cx| self.pacing.poll_pause(cx)).await;
        Ok(self.inner)
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for AsyncThrottledWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.pacing.poll_pause(cx));
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.pacing.passed(written);
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pacing.has_pending() {
            // Wait out any earlier pause first so that the new one starts from a settled stream.
            ready!(this.pacing.poll_pause(cx));
            this.pacing.charge_pending();
        }
        ready!(this.pacing.poll_pause(cx));
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}
