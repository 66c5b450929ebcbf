//! A tokio [`AsyncRead`] adapter that paces the bytes read through it with a [`RateLimiter`],
//! waiting on tokio's timer so that it never blocks the runtime.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use super::async_pacing::AsyncPacing;
use super::RateLimiter;

/// Reads through from `R`, counting the bytes; once about 1 ms worth (at the limiter's rate) has
/// accumulated it charges them, and the next read waits out the pause first. A read takes no
/// more than what may pass before the next charge, whatever the size of the caller's buffer. At the end of the
/// stream it charges what is left and waits that out before it reports the end, so a whole
/// stream of N bytes takes at least N / rate. A read into a full buffer never reads the clock.
/// Pauses behave as [`super::AsyncThrottledWriter`]'s: on tokio's timer, in slices, ended early
/// by a change of the limiter's rate.
///
/// Must be polled inside a tokio runtime with the time driver enabled.
#[derive(Debug)]
pub struct AsyncThrottledReader<R> {
    inner: R,
    pacing: AsyncPacing,
}

impl<R: AsyncRead + Unpin> AsyncThrottledReader<R> {
    /// Wraps `inner`, pacing it with `limiter` (which other readers and writers may share).
    pub fn new(inner: R, limiter: Arc<RateLimiter>) -> Self {
        AsyncThrottledReader {
            inner,
            pacing: AsyncPacing::new(limiter),
        }
    }

    /// The limiter pacing this reader.
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        self.pacing.limiter()
    }

    /// The wrapped reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for AsyncThrottledReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.pacing.poll_pause(cx));
        let read = match this.pacing.room() {
            Some(room) if room < buf.remaining() => {
                // At most what may pass before the next charge: a read buffer of 256 KiB at
                // 1,000 bytes a second would otherwise send minutes' worth at once.
                let mut part = ReadBuf::new(buf.initialize_unfilled_to(room));
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut part))?;
                let read = part.filled().len();
                buf.advance(read);
                read
            }
            _ => {
                let before = buf.filled().len();
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                buf.filled().len() - before
            }
        };
        if read > 0 {
            this.pacing.passed(read);
        } else if buf.remaining() > 0 && this.pacing.has_pending() {
            // The end of the stream: settle the rest before saying so. A pause still owed
            // makes the next poll wait it out and read the end again.
            this.pacing.charge_pending();
            ready!(this.pacing.poll_pause(cx));
        }
        Poll::Ready(Ok(()))
    }
}
