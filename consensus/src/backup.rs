//! [`Backup`]: a snapshot file (a backup downloaded from a node) opened offline, to read its
//! content without a running node: what a restore into a new cluster replays.
//!
//! Opening verifies the whole file (magic, version, lengths, checksum) and imports it into a
//! registry of its own in a temporary directory, checking every record as a follower
//! installing it would; nothing of a running node is touched. The reads then page through the
//! content as the node's listings do.

use std::path::Path;

use crate::error::{Error, Result};
use crate::records::RestoreMark;
use crate::registry::Registry;
use crate::snapshot_data::open_verified;
use crate::snapshot_format;
use crate::types::SnapshotMeta;
use crate::view::{DatanodeInfo, KvEntry, Page, ShardEntry};

/// The sled cache of a backup's registry: it is read once, in order.
const CACHE_BYTES: u64 = 16 << 20;

/// A snapshot file's content, readable offline. Blocking: from async code, use
/// `spawn_blocking`.
pub struct Backup {
    meta: SnapshotMeta,
    registry: Registry,
    replicas: u64,
    keys: u64,
    /// Holds the registry's files; removed when the backup is dropped.
    _dir: tempfile::TempDir,
}

impl Backup {
    /// Opens the snapshot file at `path`, verified completely, with its content imported into
    /// a registry in a new temporary directory under `scratch`.
    ///
    /// Contract: on `Ok` every record of the file was checked as a follower's install checks it
    /// (record shapes, the trailer's counts, each datanode's replica count). A file that is not a
    /// snapshot, is truncated or corrupt fails with [`Error::Snapshot`], [`Error::Corrupt`] or
    /// [`Error::Storage`] naming it.
    pub fn open(path: &Path, scratch: &Path) -> Result<Backup> {
        let (meta, mut reader) = open_verified(path)?;
        let dir = tempfile::Builder::new()
            .prefix("backup-")
            .tempdir_in(scratch)
            .map_err(|e| Error::io("create a directory for the backup", scratch, e))?;
        let registry = Registry::open(dir.path(), CACHE_BYTES)?;
        let replacement = registry.begin_replace()?;
        let trailer = match snapshot_format::import(&mut reader, replacement.tree(), &meta, None) {
            Ok(t) => t,
            Err(e) => {
                registry.abort_replace(replacement);
                return Err(e);
            }
        };
        registry.finish_replace(replacement)?;
        Ok(Backup {
            meta,
            registry,
            replicas: trailer.replicas,
            keys: trailer.kvs,
            _dir: dir,
        })
    }

    /// The last log index the backup covers.
    pub fn index(&self) -> u64 {
        self.meta.last_log_id.as_ref().map_or(0, |l| l.index)
    }

    /// How many replicas it holds.
    pub fn replicas(&self) -> u64 {
        self.replicas
    }

    /// How many keys it holds.
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// Every datanode, by id.
    pub fn datanodes(&self) -> Result<Vec<DatanodeInfo>> {
        self.registry.datanodes()
    }

    /// The highest epoch floor the backup holds (0: none): the old cluster's, and those it kept
    /// for the ids of removed datanodes. A restore passes it, as it passes every datanode's
    /// epoch.
    pub fn highest_epoch_floor(&self) -> Result<u64> {
        self.registry.highest_epoch_floor()
    }

    /// The mark of a restore that had not ended when the backup was taken (`None`: none): the
    /// backup then holds what that restore had written, part of its own backup perhaps.
    pub fn restore_mark(&self) -> Result<Option<RestoreMark>> {
        self.registry.current().restore_mark()
    }

    /// One datanode's replicas by shard id, `limit` at a time (at most [`crate::MAX_PAGE`]);
    /// `after` is the previous page's `next`.
    pub fn datanode_shards(
        &self,
        datanode: u64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ShardEntry>> {
        self.registry.datanode_shards(datanode, after, limit)
    }

    /// The entries of the key-value space (key, value, revision) in key order, paged like
    /// [`Backup::datanode_shards`]: at most `limit` entries, and no more once their values
    /// reach `max_bytes` (a page holds at least one entry, however large).
    pub fn kv_entries(
        &self,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page<KvEntry>> {
        self.registry.kv_scan("", after, limit, max_bytes)
    }
}
