//! The snapshot data openraft moves around: a complete snapshot file on disk.
//!
//! A snapshot is never held in memory: the leader's builder writes a file through the
//! `meta-store` snapshot writer, the transport streams that file to a follower (openraft's
//! `full_snapshot` path), the follower lands the bytes in a file of its own and installs from
//! it. The file's header carries the Raft metadata (last log id and membership).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meta_store::{SnapshotReader, SnapshotStore};

use crate::codec;
use crate::error::{Error, Result};
use crate::snapshot_format::{self, ImportRecords};
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
    /// When the file was last read whole, and what that found (shared by the clones).
    check: Arc<FileCheck>,
}

/// Whether a snapshot file read whole matched its checksums; see [`SnapshotData::verify`].
#[derive(Debug, Default)]
struct FileCheck {
    /// When the file was last read whole, and what that found (`Err` names the damage).
    last: parking_lot::Mutex<Option<(Instant, std::result::Result<(), String>)>>,
    /// A background read ([`SnapshotData::claim_check`]) is under way.
    running: AtomicBool,
    /// The records the file's import writes, once counted ([`SnapshotData::import_records`]).
    records: std::sync::OnceLock<ImportRecords>,
}

/// How long a read that found a file sound is trusted: bits may rot later, so a file asked
/// for again after this is read again (at most one read per file in this time).
const CHECK_FRESH_FOR: Duration = Duration::from_secs(1);

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
    /// checksum), decodes its metadata and counts the records its import writes, in one read.
    /// The file is deleted when the returned data is dropped, also when this fails. Blocking:
    /// call off the async runtime.
    pub(crate) fn open_received(
        temp: tempfile::TempPath,
    ) -> Result<(SnapshotMeta, SnapshotData, ImportRecords)> {
        let (meta, mut reader) = open_streamed(&temp)?;
        let bytes = reader.payload_len();
        let records = snapshot_format::count_records(&mut reader)?;
        let check = FileCheck::default();
        *check.last.lock() = Some((Instant::now(), Ok(())));
        let _ = check.records.set(records);
        let data = SnapshotData {
            path: temp.to_path_buf(),
            bytes,
            received: Some(Arc::new(temp)),
            check: Arc::new(check),
        };
        Ok((meta, data, records))
    }

    /// The records importing this snapshot writes: counted from the file once (a read of it
    /// whole, which also verifies it), then known to every clone. What a leader announces with
    /// the snapshot, so that a member without room for them refuses it before it arrives.
    /// Blocking.
    pub fn import_records(&self) -> Result<ImportRecords> {
        if let Some(records) = self.check.records.get() {
            return Ok(*records);
        }
        let (_, mut reader) = open_streamed(&self.path)?;
        let records = snapshot_format::count_records(&mut reader)?;
        *self.check.last.lock() = Some((Instant::now(), Ok(())));
        Ok(*self.check.records.get_or_init(|| records))
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

    /// Reads the whole file and checks it (magic, lengths, checksums), unless a read less than
    /// [`CHECK_FRESH_FOR`] ago found it sound, or any earlier read found it damaged: those
    /// answer from memory, also on clones. `Err` names the damage (bits that rotted on disk
    /// since the file was written). Blocking.
    pub(crate) fn verify(&self) -> std::result::Result<(), String> {
        match self.known() {
            Some(known) => known,
            None => self.read_whole(),
        }
    }

    /// [`SnapshotData::verify`], but reads a file found sound however lately it was (before a
    /// snapshot asked for is answered with this file rather than a new one). Blocking.
    pub(crate) fn verify_now(&self) -> std::result::Result<(), String> {
        match self.known() {
            Some(Err(damage)) => Err(damage),
            _ => self.read_whole(),
        }
    }

    fn read_whole(&self) -> std::result::Result<(), String> {
        let found = read_meta(&self.path).map(drop).map_err(|e| e.to_string());
        *self.check.last.lock() = Some((Instant::now(), found.clone()));
        found
    }

    /// What a read of the file found, while it stands: damage for good, soundness for
    /// [`CHECK_FRESH_FOR`].
    fn known(&self) -> Option<std::result::Result<(), String>> {
        match &*self.check.last.lock() {
            Some((_, Err(e))) => Some(Err(e.clone())),
            Some((at, Ok(()))) if at.elapsed() < CHECK_FRESH_FOR => Some(Ok(())),
            _ => None,
        }
    }

    /// Whether the file is due a read ([`SnapshotData::verify`] would read it) and no background
    /// read is under way; if so, the caller runs one and then calls
    /// [`SnapshotData::end_check`].
    pub(crate) fn claim_check(&self) -> bool {
        self.known().is_none() && !self.check.running.swap(true, Ordering::AcqRel)
    }

    /// Whether `other` stands for the same file as this (clones of one snapshot do; a file
    /// built again under the same name does not).
    pub(crate) fn same_file_as(&self, other: &SnapshotData) -> bool {
        Arc::ptr_eq(&self.check, &other.check)
    }

    /// Ends a background read claimed with [`SnapshotData::claim_check`].
    pub(crate) fn end_check(&self) {
        self.check.running.store(false, Ordering::Release);
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
    Ok((decode_meta(&reader, path)?, reader))
}

/// Opens the snapshot file at `path` with its header checked and its Raft metadata decoded; its
/// payload checksum is checked as it is read (`SnapshotReader::open_streaming`), so a caller
/// that reads it to the end has verified it in that one read. Blocking.
fn open_streamed(path: &Path) -> Result<(SnapshotMeta, SnapshotReader)> {
    let reader =
        SnapshotReader::open_streaming(path).map_err(|e| Error::storage("open snapshot", e))?;
    Ok((decode_meta(&reader, path)?, reader))
}

/// The Raft metadata in the header `reader` read from `path`.
fn decode_meta(reader: &SnapshotReader, path: &Path) -> Result<SnapshotMeta> {
    codec::decode(reader.meta())
        .map_err(|e| Error::corrupt(format!("snapshot metadata of {}", path.display()), e))
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
