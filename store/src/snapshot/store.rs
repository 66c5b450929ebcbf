//! The snapshot directory: creating, listing and retiring snapshot files.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::MAX_META_BYTES;
use super::gate::WriterGate;
use super::reader::inspect;
use super::{SnapshotFile, SnapshotReader, SnapshotWriter};
use crate::fs::DescriptorWait;
use crate::rate_limit::RateLimiter;
use crate::{Error, Result};

/// Fsyncs directory `dir`, so that its entries are durable; only its open waits out a shortage
/// of descriptors, never the fsync. `op` names the step in the error.
pub(super) fn sync_dir(op: &'static str, dir: &Path) -> Result<()> {
    DescriptorWait::default()
        .open(op, dir, || fs::File::open(dir))
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(op, dir, e))
}

/// How many snapshots a store keeps unless told otherwise.
pub const DEFAULT_KEEP: usize = 2;
/// The extension of complete snapshot files.
pub(crate) const EXTENSION: &str = "snap";
/// The prefix of temp files (before the snapshot's name); anything with it is removed when the
/// store opens, also the `.tmp-snap-` files of earlier builds.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";
const MAX_NAME_LEN: usize = 200;

/// A directory of snapshot files named `<name>.snap`, where names sort by age (for example a
/// zero-padded log index and term), so the newest snapshot is the last name.
///
/// All methods do blocking file IO: call them from a blocking thread, never on an async runtime
/// worker. The store is a cheap handle (a path and a gate); clones refer to the same directory
/// and share the gate, so [`SnapshotStore::seal`] through any of them seals them all.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    dir: PathBuf,
    keep: usize,
    gate: Arc<WriterGate>,
}

impl SnapshotStore {
    /// Opens the snapshot directory `dir`, creating it if needed, and removes temp files left by
    /// an interrupted write (so open a directory once, at startup, not while a snapshot of it is
    /// being written). Finishing a snapshot keeps the newest `keep` snapshots (at least 1;
    /// [`DEFAULT_KEEP`] is the usual choice) and deletes older ones.
    ///
    /// Contract: on return the directory exists, its entry in its parent is durable, and so are
    /// the entries in it (every snapshot it lists survives a power loss). The
    /// parent is fsynced at every open, not only when the directory is created: one found
    /// existing may come from an open that crashed before its fsync. The parent's own entry is
    /// the caller's to make durable.
    pub fn open(dir: impl AsRef<Path>, keep: usize) -> Result<SnapshotStore> {
        let dir = dir.as_ref().to_path_buf();
        if keep == 0 {
            return Err(Error::InvalidArgument {
                op: "open snapshot store",
                reason: "keep must be at least 1".to_string(),
            });
        }
        fs::create_dir_all(&dir).map_err(|e| Error::io("create snapshot directory", &dir, e))?;
        // Without this a power loss could drop the directory, and the durable snapshots in it,
        // after the log behind them was purged.
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_dir("fsync the snapshot directory's parent", parent)?;
        for entry in read_dir(&dir)? {
            if entry.starts_with(TEMP_PREFIX) {
                let path = dir.join(&entry);
                tracing::info!(path = %path.display(), "removing leftover snapshot temp file");
                fs::remove_file(&path)
                    .map_err(|e| Error::io("remove leftover snapshot temp file", &path, e))?;
            }
        }
        // A snapshot renamed into place by a process that died (or whose directory fsync failed)
        // before the directory was synced is listed now and may be relied on (the log behind it
        // purged): make its name durable first, and the removals above with it.
        sync_dir("fsync the snapshot directory", &dir)?;
        Ok(SnapshotStore {
            dir,
            keep,
            gate: Arc::default(),
        })
    }

    /// Starts a snapshot named `name` (final file `<name>.snap`) with the caller's metadata `meta`
    /// (at most 16 MiB, for example the last log id and membership), paced by `limiter`. The
    /// payload is written through the returned [`SnapshotWriter`]; nothing appears under the final
    /// name until [`SnapshotWriter::finish`] returns. A name may use ASCII letters, digits, `-`,
    /// `_` and `.` (not first), up to 200 characters. An existing snapshot of the same name is
    /// replaced when the new one finishes. Fails with [`Error::Closed`] once the store is sealed.
    pub fn create(
        &self,
        name: &str,
        meta: &[u8],
        limiter: Arc<RateLimiter>,
    ) -> Result<SnapshotWriter> {
        check_name(name)?;
        if meta.len() > MAX_META_BYTES {
            return Err(Error::InvalidArgument {
                op: "create snapshot",
                reason: format!(
                    "metadata of {} bytes exceeds the limit of {MAX_META_BYTES}",
                    meta.len()
                ),
            });
        }
        let passage = WriterGate::enter(&self.gate)?;
        SnapshotWriter::create(self.clone(), name, meta, limiter, passage)
    }

    /// Takes the complete snapshot file at `path` (one the caller verified, such as a snapshot
    /// received from another node) into the store as `name`, by rename: no byte is copied, and
    /// nothing paces it. `path` must be on the store's file system (else an error, with nothing
    /// changed). Fails with [`Error::Closed`] once the store is sealed.
    ///
    /// Contract: on `Ok` the file is durable under its final name (fsynced, renamed, directory
    /// fsynced), older snapshots beyond the retention count are retired as by
    /// [`SnapshotWriter::finish`], and `path` no longer names it. On error no final name
    /// changed, except that an error from the directory fsync leaves the renamed file in place.
    pub fn adopt(&self, path: &Path, name: &str) -> Result<SnapshotFile> {
        check_name(name)?;
        let _passage = WriterGate::enter(&self.gate)?;
        let inspected = inspect(path)?;
        inspected
            .file
            .sync_all()
            .map_err(|e| Error::io("sync adopted snapshot", path, e))?;
        let target = self.path_of(name);
        fs::rename(path, &target).map_err(|e| Error::io("rename snapshot into place", path, e))?;
        sync_dir("sync snapshot directory", &self.dir)?;
        self.retire_old(name);
        Ok(SnapshotFile {
            path: target,
            name: name.to_string(),
            ..inspected.info
        })
    }

    /// Refuses new writers ([`SnapshotStore::create`] fails with [`Error::Closed`]) and waits
    /// until every writer in flight has finished or been dropped. Blocking: as long as the
    /// slowest writer takes to end, so stop their producers first.
    ///
    /// Contract: once it returns, nothing done through this store or its clones creates,
    /// renames or deletes a file in the directory any more, so it may be handed to a later open
    /// (in this process or another). Reads are not affected.
    pub fn seal(&self) {
        self.gate.seal();
    }

    /// The newest complete snapshot (the last by name), if any. Reads its header and trailer;
    /// open it with [`SnapshotFile::open`] to verify the payload.
    pub fn newest(&self) -> Result<Option<SnapshotFile>> {
        match self.names()?.last() {
            Some(name) => Ok(Some(inspect(&self.path_of(name))?.info)),
            None => Ok(None),
        }
    }

    /// Every complete snapshot, oldest first. Reads each one's header and trailer; a damaged
    /// one is an error naming the file.
    pub fn list(&self) -> Result<Vec<SnapshotFile>> {
        self.names()?
            .iter()
            .map(|name| Ok(inspect(&self.path_of(name))?.info))
            .collect()
    }

    /// Opens and fully verifies (magic, version, length, checksum) the snapshot file at `path`;
    /// an error names the file. Same as [`SnapshotReader::open`].
    pub fn open_reader(path: &Path) -> Result<SnapshotReader> {
        SnapshotReader::open(path)
    }

    /// The snapshot directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many snapshots are kept.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// The final path of the snapshot `name`.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.{EXTENSION}"))
    }

    /// The newest complete snapshot whose header and trailer read back, as
    /// [`SnapshotStore::newest`], after setting aside every newer one that does not (a copy cut
    /// short or overwritten): each is renamed to `<name>.snap.damaged` (a free name: `-2` and
    /// so on are added), which keeps it for the operator and out of the store's listing.
    /// Returns the snapshot and the paths the damaged ones now have, newest first. One this
    /// build cannot read ([`Error::Unsupported`]) or cannot open is an error: not damage.
    ///
    /// Contract: on return every rename is durable (the directory is fsynced). On error, the
    /// renames made before it are in place, and may not be durable.
    pub fn newest_setting_aside_damaged(&self) -> Result<(Option<SnapshotFile>, Vec<PathBuf>)> {
        let _passage = WriterGate::enter(&self.gate)?;
        let mut set_aside = Vec::new();
        let mut newest = None;
        for name in self.names()?.iter().rev() {
            let path = self.path_of(name);
            match inspect(&path) {
                Ok(inspected) => {
                    newest = Some(inspected.info);
                    break;
                }
                Err(damage @ Error::Corrupt { .. }) => {
                    let aside = free_name(&path.with_extension(format!("{EXTENSION}.damaged")));
                    fs::rename(&path, &aside)
                        .map_err(|e| Error::io("set aside a damaged snapshot", &path, e))?;
                    tracing::warn!(
                        path = %path.display(),
                        set_aside_as = %aside.display(),
                        "the newest snapshot does not read back ({damage}): set aside, the next \
                         one stands in for it"
                    );
                    set_aside.push(aside);
                }
                Err(e) => return Err(e),
            }
        }
        if !set_aside.is_empty() {
            sync_dir("sync snapshot directory", &self.dir)?;
        }
        Ok((newest, set_aside))
    }

    /// The names of the complete snapshots, oldest first.
    fn names(&self) -> Result<Vec<String>> {
        let suffix = format!(".{EXTENSION}");
        let mut names: Vec<String> = read_dir(&self.dir)?
            .into_iter()
            .filter(|f| !f.starts_with('.'))
            .filter_map(|f| f.strip_suffix(&suffix).map(str::to_string))
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Deletes all but the newest `keep` snapshots, never `just_written`. Called only once the
    /// new snapshot is durable. A failed delete is logged, not returned: the new snapshot is
    /// already in place, and the next retention pass tries again.
    pub(crate) fn retire_old(&self, just_written: &str) {
        let names = match self.names() {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(error = %e, "listing snapshots for retention failed");
                return;
            }
        };
        let excess = names.len().saturating_sub(self.keep);
        for name in names.iter().take(excess).filter(|n| *n != just_written) {
            let path = self.path_of(name);
            match fs::remove_file(&path) {
                Ok(()) => tracing::debug!(path = %path.display(), "deleted old snapshot"),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "deleting old snapshot failed")
                }
            }
        }
    }
}

/// `path`, or the first of `path-2`, `path-3`, .. that names no file.
fn free_name(path: &Path) -> PathBuf {
    let mut candidate = path.to_path_buf();
    let mut n = 1;
    while candidate.symlink_metadata().is_ok() {
        n += 1;
        candidate = PathBuf::from(format!("{}-{n}", path.display()));
    }
    candidate
}

fn check_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op: "create snapshot",
            reason: format!(
                "bad snapshot name {name:?}: use 1 to {MAX_NAME_LEN} ASCII letters, digits, '-', '_' or '.' (not first)"
            ),
        })
    }
}

/// The file names in `dir` (names that are not UTF-8 are skipped).
fn read_dir(dir: &Path) -> Result<Vec<String>> {
    let entries = DescriptorWait::default()
        .open("list snapshot directory", dir, || fs::read_dir(dir))
        .map_err(|e| Error::io("list snapshot directory", dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list snapshot directory", dir, e))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    Ok(names)
}
