//! The description of one complete snapshot file in the snapshot directory.

use std::path::PathBuf;

use super::SnapshotReader;
use crate::Result;

/// A complete snapshot file, as found by [`super::SnapshotStore::list`] or returned by
/// [`super::SnapshotWriter::finish`]. Listing reads only the header and trailer; the payload is
/// verified when the file is opened with [`SnapshotFile::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    /// The file's path.
    pub path: PathBuf,
    /// The snapshot's name: the file name without the `.snap` extension.
    pub name: String,
    /// The payload length in bytes.
    pub bytes: u64,
    /// The whole file's length in bytes (header and trailer included).
    pub file_bytes: u64,
    /// The caller's metadata from the header.
    pub meta: Vec<u8>,
}

impl SnapshotFile {
    /// Opens the file for reading after verifying it fully (see [`SnapshotReader::open`]).
    pub fn open(&self) -> Result<SnapshotReader> {
        SnapshotReader::open(&self.path)
    }
}
