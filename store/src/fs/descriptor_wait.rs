//! Waiting out a shortage of file descriptors.
//!
//! Opening a file fails with `EMFILE` (the process holds as many descriptors as its limit
//! allows) or `ENFILE` (the system does) while something else briefly holds too many, for
//! example a burst of connections. Nothing was opened or written, so trying again is safe, and a
//! log or snapshot that gave up at once would turn a passing shortage into a stopped node.
//! [`DescriptorWait`] retries such an open with a growing pause, up to a bound. It only ever
//! wraps a call that opens something: an fsync never fails with these errors, and a failed fsync
//! is never retried.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long an open waits for descriptors unless told otherwise.
pub const DEFAULT_DESCRIPTOR_WAIT: Duration = Duration::from_secs(10);
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// Retries opens that fail for want of descriptors, for at most `max` in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescriptorWait {
    max: Duration,
}

impl Default for DescriptorWait {
    fn default() -> Self {
        DescriptorWait::new(DEFAULT_DESCRIPTOR_WAIT)
    }
}

impl DescriptorWait {
    /// Waits at most `max` (zero: never retries).
    pub fn new(max: Duration) -> Self {
        DescriptorWait { max }
    }

    /// Runs `open` (an operation named `op` on `path` that opens one file or directory) until it
    /// succeeds, fails with another error, or descriptors stayed short for the bound; then
    /// returns its last result. Blocks the calling thread while it waits: call it where blocking
    /// file IO is allowed.
    pub fn open<T>(
        &self,
        op: &str,
        path: &Path,
        mut open: impl FnMut() -> io::Result<T>,
    ) -> io::Result<T> {
        let mut started: Option<Instant> = None;
        let mut pause = FIRST_PAUSE;
        loop {
            match open() {
                Err(e) if is_descriptor_shortage(&e) => {
                    let since = *started.get_or_insert_with(|| {
                        tracing::warn!(
                            op,
                            path = %path.display(),
                            error = %e,
                            wait_secs = self.max.as_secs_f64(),
                            "out of file descriptors; waiting for some to close"
                        );
                        Instant::now()
                    });
                    let left = self.max.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        tracing::error!(op, path = %path.display(), error = %e, "still out of file descriptors; giving up");
                        return Err(e);
                    }
                    std::thread::sleep(pause.min(left));
                    pause = (pause * 2).min(LONGEST_PAUSE);
                }
                result => {
                    if let Some(since) = started {
                        tracing::info!(op, path = %path.display(), waited_ms = since.elapsed().as_millis() as u64, "file descriptors available again");
                    }
                    return result;
                }
            }
        }
    }
}

/// Whether `e` says the process or the system is out of file descriptors.
pub fn is_descriptor_shortage(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(libc::EMFILE)
    }

    #[test]
    fn a_passing_shortage_is_waited_out() {
        let mut calls = 0;
        let got = DescriptorWait::new(Duration::from_secs(60)).open("open", Path::new("f"), || {
            calls += 1;
            if calls <= 3 {
                Err(emfile())
            } else {
                Ok(calls)
            }
        });
        assert_eq!(got.unwrap(), 4);
        let mut calls = 0;
        let got = DescriptorWait::default().open("open", Path::new("f"), || {
            calls += 1;
            if calls == 1 {
                Err(io::Error::from_raw_os_error(libc::ENFILE))
            } else {
                Ok(())
            }
        });
        assert!(got.is_ok());
        assert_eq!(calls, 2);
    }

    #[test]
    fn other_errors_are_returned_at_once() {
        for e in [
            io::Error::from(io::ErrorKind::NotFound),
            io::Error::from_raw_os_error(libc::EIO),
            io::Error::from_raw_os_error(libc::ENOSPC),
        ] {
            let kind = e.kind();
            let mut e = Some(e);
            let mut calls = 0;
            let got: io::Result<()> =
                DescriptorWait::default().open("open", Path::new("f"), || {
                    calls += 1;
                    Err(e.take().expect("called once"))
                });
            assert_eq!(got.unwrap_err().kind(), kind);
            assert_eq!(calls, 1);
        }
    }

    #[test]
    fn a_lasting_shortage_fails_after_the_bound() {
        let bound = Duration::from_millis(30);
        let started = Instant::now();
        let mut calls = 0;
        let got: io::Result<()> = DescriptorWait::new(bound).open("open", Path::new("f"), || {
            calls += 1;
            Err(emfile())
        });
        assert!(is_descriptor_shortage(&got.unwrap_err()));
        assert!(started.elapsed() >= bound);
        assert!(calls > 1, "retried before giving up");
        let mut calls = 0;
        let got: io::Result<()> =
            DescriptorWait::new(Duration::ZERO).open("open", Path::new("f"), || {
                calls += 1;
                Err(emfile())
            });
        assert!(got.is_err());
        assert_eq!(calls, 1, "a zero bound never retries");
    }
}
