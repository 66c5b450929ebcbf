//! One segment file of the log: its name (the first LSN it holds), its header, and the handle
//! that is opened once and kept for writes, barriers and reads.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::segment_bytes::SegmentBytes;
use super::Lsn;
use crate::error::{Error, Result};
use crate::fs::{DescriptorWait, FileHandle, FileSystem};

/// Size of the segment header.
pub(crate) const SEGMENT_HEADER_LEN: u64 = 24;
const MAGIC: &[u8; 8] = b"MSWAL\0v1";
const SUFFIX: &str = ".wal";

/// An open segment. The one handle serves the writer, the barrier and readers (all IO is
/// positional), and syncing is per file anyway.
#[derive(Debug)]
pub(crate) struct Segment {
    /// The LSN of its first record; also its id, mixed into every record checksum.
    pub first_lsn: Lsn,
    pub path: PathBuf,
    pub file: Arc<dyn FileHandle>,
}

/// The file name of the segment whose first record is `first_lsn`.
pub(crate) fn file_name(first_lsn: Lsn) -> String {
    format!("{first_lsn:020}{SUFFIX}")
}

/// The first LSN encoded in a segment file name, or `None` if the name is not a segment's.
pub(crate) fn parse_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_suffix(SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&lsn| lsn > 0)
}

/// The header bytes of the segment starting at `first_lsn`.
pub(crate) fn header(first_lsn: Lsn) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&first_lsn.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..16]);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Whether `bytes` starts with a valid header for the segment starting at `first_lsn`.
pub(crate) fn header_ok(bytes: &[u8], first_lsn: Lsn) -> bool {
    bytes.len() >= SEGMENT_HEADER_LEN as usize
        && bytes[..SEGMENT_HEADER_LEN as usize] == header(first_lsn)
}

impl Segment {
    /// Creates the segment that starts at `first_lsn`: create the file, write its header,
    /// optionally preallocate `prealloc` bytes, fsync the file, fsync the directory.
    ///
    /// Creating the file and opening the directory wait out a shortage of file descriptors
    /// for up to `wait`; the syncs are never retried.
    ///
    /// Contract: on success the file, its header and its directory entry are durable. On failure
    /// a partly created file may remain; recovery deletes a last segment without a valid header.
    pub fn create(
        fs: &dyn FileSystem,
        dir: &Path,
        first_lsn: Lsn,
        prealloc: Option<u64>,
        wait: DescriptorWait,
    ) -> Result<Segment> {
        let path = dir.join(file_name(first_lsn));
        let file: Arc<dyn FileHandle> = wait
            .open("create segment", &path, || fs.create_new(&path))
            .map_err(|e| Error::io("create segment", &path, e))?
            .into();
        file.write_all_at(&header(first_lsn), 0)
            .map_err(|e| Error::io("write segment header", &path, e))?;
        if let Some(len) = prealloc {
            preallocate(&*file, len, &path)?;
        }
        file.sync_all()
            .map_err(|e| Error::io("fsync new segment", &path, e))?;
        // Opening the directory is what can run out of descriptors (an fsync never does).
        wait.open("fsync log directory", dir, || fs.sync_dir(dir))
            .map_err(|e| Error::io("fsync log directory", dir, e))?;
        Ok(Segment {
            first_lsn,
            path,
            file,
        })
    }

    /// Opens an existing segment, dropping its clean cached pages first (see
    /// [`crate::fs::FileHandle::drop_cache`]): what recovery reads is what the disk holds, not
    /// what a failed writeback left in the cache.
    pub fn open(fs: &dyn FileSystem, dir: &Path, first_lsn: Lsn) -> Result<Segment> {
        let path = dir.join(file_name(first_lsn));
        let file: Arc<dyn FileHandle> = fs
            .open(&path)
            .map_err(|e| Error::io("open segment", &path, e))?
            .into();
        file.drop_cache();
        Ok(Segment {
            first_lsn,
            path,
            file,
        })
    }

    /// Reads the whole file, into memory that goes back to the operating system when the
    /// bytes are dropped ([`SegmentBytes`]).
    pub fn read_all(&self) -> Result<SegmentBytes> {
        let len = self
            .file
            .size()
            .map_err(|e| Error::io("stat segment", &self.path, e))?;
        let len = usize::try_from(len).map_err(|_| Error::Corrupt {
            path: self.path.clone(),
            offset: 0,
            reason: "segment too large to read".into(),
        })?;
        let mut buf =
            SegmentBytes::zeroed(len).map_err(|e| Error::io("map memory for", &self.path, e))?;
        self.file
            .read_exact_at(&mut buf, 0)
            .map_err(|e| Error::io("read segment", &self.path, e))?;
        Ok(buf)
    }
}

/// Extends `file` to `len` zero bytes with `fallocate`, so later writes inside need not change the
/// file size. A file system that cannot preallocate is not an error.
pub(crate) fn preallocate(file: &dyn FileHandle, len: u64, path: &Path) -> Result<()> {
    match file.allocate(len) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(()),
        Err(e) => Err(Error::io("preallocate segment", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(parse_name(&file_name(1)), Some(1));
        assert_eq!(parse_name(&file_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_name("00000000000000000001.tmp"), None);
        assert_eq!(parse_name("1.wal"), None);
        assert_eq!(parse_name(&file_name(0)), None);
    }

    #[test]
    fn header_is_bound_to_first_lsn() {
        let h = header(5);
        assert!(header_ok(&h, 5));
        assert!(!header_ok(&h, 6));
        assert!(!header_ok(&[0u8; 24], 5));
    }
}
