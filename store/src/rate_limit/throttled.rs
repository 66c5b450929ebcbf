//! A [`std::io::Write`] adapter that paces the bytes written through it with a [`RateLimiter`],
//! sleeping the calling thread.

use std::io::{self, Write};
use std::sync::Arc;

use super::RateLimiter;

/// Writes through to `W`, counting the bytes, and pauses once about 1 ms worth (at the limiter's
/// rate) has accumulated. A zero-byte write is forwarded and costs one comparison: it never reads
/// the clock. `flush` is forwarded and does not pause. [`ThrottledWriter::finish`] settles the
/// bytes still accumulated; dropping the writer without it leaves them uncharged.
///
/// This blocks the calling thread: use it from a blocking context (a dedicated thread or tokio's
/// `spawn_blocking`), or use [`super::AsyncThrottledWriter`] on the runtime.
#[derive(Debug)]
pub struct ThrottledWriter<W> {
    inner: W,
    limiter: Arc<RateLimiter>,
    /// Bytes written but not yet charged.
    pending: u64,
    /// Charge once `pending` reaches this; refreshed from the rate at every pause.
    threshold: u64,
}

impl<W: Write> ThrottledWriter<W> {
    /// Wraps `inner`, pacing it with `limiter` (which other writers may share).
    pub fn new(inner: W, limiter: Arc<RateLimiter>) -> Self {
        let threshold = limiter.chunk_bytes();
        ThrottledWriter {
            inner,
            limiter,
            pending: 0,
            threshold,
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

    /// Flushes the wrapped writer, then charges (and sleeps for) the bytes still accumulated, and
    /// returns the wrapped writer. When it returns, the stream as a whole kept to the rate.
    pub fn finish(mut self) -> io::Result<W> {
        self.inner.flush()?;
        self.settle();
        Ok(self.inner)
    }

    fn settle(&mut self) {
        let bytes = std::mem::take(&mut self.pending);
        if bytes > 0 {
            self.limiter.pause(bytes);
        }
        self.threshold = self.limiter.chunk_bytes();
    }
}

impl<W: Write> Write for ThrottledWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.pending += written as u64;
        if self.pending >= self.threshold {
            self.settle();
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
