//! The small file-system trait behind which all log file access sits, so that tests can swap in
//! a faulty in-memory file system that models crashes, torn writes and failed syncs.
//!
//! - [`OsFileSystem`]: the real thing (positional reads and writes, `fdatasync`, `fallocate`).
//! - [`FaultyFileSystem`]: in memory; loses unsynced bytes on [`FaultyFileSystem::crash`], can tear
//!   the last write, fail syncs, and hold syncs on a gate.
//! - [`SlowSyncFileSystem`]: another file system with every sync slower by a fixed delay, to
//!   emulate a slower disk in benchmarks.
//! - [`DescriptorWait`]: retries an open that failed for want of file descriptors.

mod descriptor_wait;
mod faulty;
mod os;
mod slow;

use std::fmt;
use std::io;
use std::path::Path;

pub use descriptor_wait::{is_descriptor_shortage, DescriptorWait, DEFAULT_DESCRIPTOR_WAIT};
pub use faulty::{CrashPoint, FaultyFileSystem, SyncGate};
pub use os::OsFileSystem;
pub use slow::SlowSyncFileSystem;

/// Directory-level operations. Paths are passed through unchanged; implementations are shared
/// between threads (`Arc<dyn FileSystem>`).
pub trait FileSystem: Send + Sync + fmt::Debug + 'static {
    /// Creates `dir` and its parents if missing. On return the directory exists (its entry is not
    /// necessarily durable).
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Returns the names (not paths) of the entries in `dir`, in no particular order.
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates a new file for reading and writing; fails if it exists. On return the file exists
    /// but neither it nor its directory entry is durable.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>>;
    /// Removes a file. On return it is gone from the directory; durable after [`Self::sync_dir`].
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries (created and removed files) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// One open file. All calls are positional, so one handle serves a writer, a barrier and readers
/// at once without a seek position to share.
pub trait FileHandle: Send + Sync + fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns fewer only at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`. On return the bytes are readable, not durable.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: on success every byte written before the call is durable, with the file size
    /// if the data needs it.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`: like [`Self::sync_data`] plus all metadata.
    fn sync_all(&self) -> io::Result<()>;
    /// The current size of the file in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Truncates or extends the file to `len` bytes (not durable until synced).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Preallocates space so the file is at least `len` bytes long (zero filled), so that later
    /// writes inside it need not change the file size. `ErrorKind::Unsupported` if the file system
    /// cannot.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// Asks the kernel to drop the file's clean cached pages, so that later reads come from the
    /// disk. After a failed writeback Linux may keep the failed pages cached as clean, holding
    /// bytes the disk does not: recovery drops them before it reads a segment. A hint: it never
    /// fails. The default does nothing.
    fn drop_cache(&self) {}

    /// Reads exactly `buf.len()` bytes at `offset`, failing with `UnexpectedEof` past the end.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
