//! The room a snapshot build leaves on its disk. A build stops, failing as a full disk fails
//! it, once the data dir's file system has less than a quarter of `min_free_bytes` free: run on
//! to the last byte, it failed anyway and a log append or registry write at that moment failed
//! too, which stops the node. It may take the rest of the reserve, since the log it lets the
//! node purge may free more than the snapshot takes.

use std::io::{self, Write};
use std::path::PathBuf;

use crate::free_space::FreeSpace;

/// Bytes a build writes between two looks at the free space (one `statvfs` each).
const CHECK_EVERY: u64 = 256 << 10;

/// Where a build looks for room, and the free bytes it leaves.
#[derive(Clone)]
pub(crate) struct BuildRoom {
    free_space: FreeSpace,
    dir: PathBuf,
    /// A build stops below this many free bytes; 0: never.
    floor: u64,
}

impl BuildRoom {
    /// Builds on the file system of `dir` stop below a quarter of `min_free_bytes` free.
    pub(crate) fn new(free_space: FreeSpace, dir: PathBuf, min_free_bytes: u64) -> BuildRoom {
        BuildRoom {
            free_space,
            dir,
            floor: min_free_bytes / 4,
        }
    }

    /// `StorageFull` when the file system has less than the floor free. A file system whose
    /// free space cannot be read refuses nothing.
    fn check(&self) -> io::Result<()> {
        match self.free_space.of(&self.dir) {
            Ok(free) if free < self.floor => Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "the data dir's file system has {free} bytes free, below a quarter of \
                     --min-free-bytes ({} bytes): the build stops there, leaving the rest to \
                     the log and the registry",
                    self.floor
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `out`, which fails a write once the free space is below the floor of `room` (looked at
    /// before the first write and every [`CHECK_EVERY`] bytes); no room set: never.
    pub(crate) fn guard<W: Write>(room: Option<&BuildRoom>, out: W) -> Guarded<'_, W> {
        Guarded {
            out,
            room,
            unchecked: CHECK_EVERY,
        }
    }
}

/// A writer that stops when its file system runs short ([`BuildRoom::guard`]).
pub(crate) struct Guarded<'a, W> {
    out: W,
    room: Option<&'a BuildRoom>,
    /// Bytes written since the last look.
    unchecked: u64,
}

impl<W: Write> Write for Guarded<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(room) = self
            .room
            .filter(|r| r.floor > 0 && self.unchecked >= CHECK_EVERY)
        {
            room.check()?;
            self.unchecked = 0;
        }
        let n = self.out.write(buf)?;
        self.unchecked += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A guarded writer over a file system whose free space falls as bytes are written.
    #[test]
    fn a_guarded_writer_stops_below_the_floor() {
        let free = Arc::new(AtomicU64::new(10 << 20));
        let probe = free.clone();
        let space = FreeSpace::with(move |_| Ok(probe.load(Ordering::SeqCst)));
        // Reserve 8 MiB: the floor is 2 MiB.
        let room = BuildRoom::new(space, PathBuf::from("/d"), 8 << 20);
        let mut sink = Vec::new();
        let mut out = BuildRoom::guard(Some(&room), &mut sink);
        let chunk = vec![0u8; 64 << 10];
        let mut written = 0u64;
        let err = loop {
            match out.write_all(&chunk) {
                Ok(()) => {
                    written += chunk.len() as u64;
                    free.fetch_sub(chunk.len() as u64, Ordering::SeqCst);
                }
                Err(e) => break e,
            }
            assert!(written <= 16 << 20, "never stopped");
        };
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
        // It stopped within one look of the floor: 8 MiB written, and at most 256 KiB more.
        assert!(
            (8 << 20..=(8 << 20) + CHECK_EVERY).contains(&written),
            "{written}"
        );

        // Without a reserve, nothing is checked.
        let none = BuildRoom::new(FreeSpace::fixed(0), PathBuf::from("/d"), 0);
        BuildRoom::guard(Some(&none), Vec::new())
            .write_all(&chunk)
            .unwrap();
        BuildRoom::guard(None, Vec::new())
            .write_all(&chunk)
            .unwrap();
        // Short from the start: the first write fails.
        let short = BuildRoom::new(FreeSpace::fixed(1), PathBuf::from("/d"), 8 << 20);
        let e = BuildRoom::guard(Some(&short), Vec::new())
            .write(&chunk)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    }
}
