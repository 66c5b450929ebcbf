//! The snapshot data openraft moves around: a complete snapshot file on disk.
//!
//! A snapshot is never held in memory: the leader's builder writes a file through the
//! `meta-store` snapshot writer, the transport streams that file to a follower (openraft's
//! `full_snapshot` path), the follower lands the bytes in a file of its own and installs from
//! it. The file's header carries the Raft metadata (last log id and membership).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meta_store::{SnapshotReader, SnapshotStore};

use crate::codec;
use crate::error::{Error, Result};
use crate::types::SnapshotMeta;

/// A complete snapshot file. Cloning shares the file; a received file that was never adopted
/// into the snapshot store is deleted when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct SnapshotData {
    path: PathBuf,
    bytes: u64,
    /// Deletes a received file when the last clone goes (nothing is left to delete once the
    /// file was moved into the snapshot store).
    received: Option<Arc<tempfile::TempPath>>,
    /// What reading the whole file found, once it was read (shared by the clones).
    check: Arc<FileCheck>,
}

/// Whether a snapshot file read whole matched its checksums; see [`SnapshotData::verify`].
#[derive(Debug, Default)]
struct FileCheck {
    /// `Err` names the damage.
    verdict: std::sync::OnceLock<std::result::Result<(), String>>,
    /// A read of the file is under way or done.
    started: std::sync::atomic::AtomicBool,
}

impl SnapshotData {
    pub(crate) fn stored(path: PathBuf, bytes: u64) -> Self {
        SnapshotData {
            path,
            bytes,
            received: None,
            check: Arc::default(),
        }
    }

    /// Stands for "no snapshot" in a failed first build's answer (with empty metadata, which
    /// openraft ignores as not newer than its own): never read.
    pub(crate) fn absent() -> Self {
        SnapshotData {
            path: PathBuf::new(),
            bytes: 0,
            received: None,
            check: Arc::default(),
        }
    }

    /// Opens a received snapshot file, verifies it completely (magic, version, lengths,
    /// checksum) and decodes its metadata. The file is deleted when the returned data is
    /// dropped. Blocking: call off the async runtime.
    pub fn open_received(temp: tempfile::TempPath) -> Result<(SnapshotMeta, SnapshotData)> {
        let (meta, bytes) = read_meta(&temp)?;
        let check = FileCheck::default();
        let _ = check.verdict.set(Ok(()));
        check
            .started
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let data = SnapshotData {
            path: temp.to_path_buf(),
            bytes,
            received: Some(Arc::new(temp)),
            check: Arc::new(check),
        };
        Ok((meta, data))
    }

    /// Whether this is a received file (from [`SnapshotData::open_received`]), which the node
    /// may move into its snapshot store; any other file belongs to someone else.
    pub(crate) fn is_received(&self) -> bool {
        self.received.is_some()
    }

    /// The snapshot file (header, payload and trailer): what a transport sends as is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Payload bytes.
    pub fn payload_bytes(&self) -> u64 {
        self.bytes
    }

    /// Reads the whole file and checks it (magic, lengths, checksums), the first time only:
    /// later calls, also on clones, answer what that read found. `Err` names the damage (bits
    /// that rotted on disk since the file was written). Blocking.
    pub(crate) fn verify(&self) -> std::result::Result<(), String> {
        self.check
            .started
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.check
            .verdict
            .get_or_init(|| read_meta(&self.path).map(drop).map_err(|e| e.to_string()))
            .clone()
    }

    /// Whether a read of the file is under way or done, and takes it on if not: `true` the
    /// first time only, for the caller that is to run [`SnapshotData::verify`].
    pub(crate) fn take_verify(&self) -> bool {
        !self
            .check
            .started
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Whether [`SnapshotData::verify`] found the file damaged (no IO).
    pub(crate) fn found_damaged(&self) -> bool {
        matches!(self.check.verdict.get(), Some(Err(_)))
    }
}

/// Whether `file` and the directory `dir` are on the same file system (a rename can move one
/// into the other); `false` when either cannot be read. Blocking.
pub(crate) fn same_file_system(file: &Path, dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(file), std::fs::metadata(dir)) {
        (Ok(f), Ok(d)) => f.dev() == d.dev(),
        _ => false,
    }
}

/// Verifies the snapshot file at `path` and decodes its Raft metadata. Blocking.
pub(crate) fn read_meta(path: &Path) -> Result<(SnapshotMeta, u64)> {
    let (meta, reader) = open_verified(path)?;
    Ok((meta, reader.payload_len()))
}

/// Opens the snapshot file at `path`, verified completely (one read of the whole file), with
/// its Raft metadata decoded; the reader stands at the start of the payload. Blocking.
pub(crate) fn open_verified(path: &Path) -> Result<(SnapshotMeta, SnapshotReader)> {
    let reader =
        SnapshotStore::open_reader(path).map_err(|e| Error::storage("open snapshot", e))?;
    let meta: SnapshotMeta = codec::decode(reader.meta())
        .map_err(|e| Error::corrupt(format!("snapshot metadata of {}", path.display()), e))?;
    Ok((meta, reader))
}

/// The file name (without extension) of the snapshot with this metadata: names sort by age.
pub(crate) fn snapshot_name(meta: &SnapshotMeta) -> String {
    let (index, term) = meta
        .last_log_id
        .as_ref()
        .map(|l| (l.index, l.leader_id.term))
        .unwrap_or((0, 0));
    format!("snap-{index:020}-{term:020}")
}
