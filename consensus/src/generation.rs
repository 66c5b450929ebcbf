//! One generation of the registry: a sled tree that holds the whole registry, its crash-atomic
//! commits (a redo record, or one sled batch for large commits) and the captures of the
//! exports that read it. `registry.rs` names the active generation and swaps in new ones.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::apply_batch::{writes_bytes, Writes};
use crate::capture::Capture;
use crate::codec;
use crate::error::{Error, Result};
use crate::keys;
use crate::records::AppliedRecord;
use crate::types::{LogId, StoredMembership};

/// Commits larger than this (keys plus values) skip the redo record; see [`Generation::commit`].
/// The record of a commit this large stays below sled's 128 KiB limit for values kept in its
/// log (its segment size over four) rather than in files of their own.
const REDO_MAX_BYTES: usize = 96 * 1024;

/// One generation of the registry: a sled tree plus the captures of running exports.
#[derive(Debug)]
pub(crate) struct Generation {
    pub(crate) tree: sled::Tree,
    pub(crate) number: u64,
    captures: Mutex<Vec<Arc<Capture>>>,
    /// Held for writing through a commit's writes, and for reading through a read of the
    /// registry ([`Generation::reading`]). sled makes one operation atomic, not a commit of
    /// several, and its iterators are no snapshot: a listing would otherwise show keys it
    /// reaches after a commit as the commit left them, and the keys before as they were.
    view: RwLock<()>,
}

impl Generation {
    pub(crate) fn new(tree: sled::Tree, number: u64) -> Self {
        Generation {
            tree,
            number,
            captures: Mutex::new(Vec::new()),
            view: RwLock::new(()),
        }
    }

    /// Writes `writes` atomically with respect to crashes, first recording pre-images of their
    /// keys for every running capture. Callers serialize commits (the state machine applies one
    /// batch at a time).
    ///
    /// Contract: when this returns, every write is visible to readers (not yet durable: sled
    /// flushes in the background); a reader that holds [`Generation::reading`] sees none of
    /// them or all. After a crash at any point, reopening the registry yields either none or
    /// all of `writes`.
    ///
    /// How: every commit first inserts its whole write list under [`keys::META_REDO`] (replacing
    /// the previous commit's), then performs the writes as plain inserts. sled recovers a prefix
    /// of its log, so a recovered tree holding any write of a commit also holds that commit's
    /// record, and [`Registry::open`] redoes the record it finds (redoing a complete commit
    /// changes nothing: the writes are absolute values and no later commit exists). The
    /// last-applied record is written only through the redo record, so a small commit costs as
    /// many sled inserts as it has data keys plus one. This replaces `sled::Tree::apply_batch`,
    /// which seals and writes sled's log buffer twice per call on sled's IO pool (waking every
    /// pool thread each time): with one small commit per registration that was the largest
    /// single source of context switches on every node.
    ///
    /// A commit of more than [`REDO_MAX_BYTES`] goes through `sled::Tree::apply_batch` instead,
    /// which also writes the last-applied record and deletes the redo record: a large redo
    /// record would double a large commit's bytes, and sled stores any value over 128 KiB as
    /// a file of its own. Its fixed cost does not matter for a commit that large.
    pub(crate) fn commit(&self, writes: Writes) -> Result<()> {
        {
            let captures = self.captures.lock();
            for c in captures.iter() {
                c.record(&self.tree, writes.iter().map(|(k, _)| k.as_slice()))
                    .map_err(|e| Error::registry("record pre-images", e))?;
            }
        }
        let _view = self.view.write();
        if writes_bytes(&writes) > REDO_MAX_BYTES {
            return self.write_batch(writes);
        }
        self.write_redo(&writes)?;
        write_data(&self.tree, writes)
    }

    /// A consistent view for a read of several keys (a listing, or a point read that must not
    /// see part of a commit): commits wait until the guard is dropped, so the read sees each
    /// one whole or not at all. Hold it only for the read: commits, and so `apply`, wait.
    /// Not while a commit runs on this thread (it would wait for itself).
    pub(crate) fn reading(&self) -> RwLockReadGuard<'_, ()> {
        self.view.read()
    }

    /// Writes `writes`, the last-applied record among them, as one atomic sled batch that also
    /// deletes the redo record (which would otherwise be redone over them at the next open).
    fn write_batch(&self, writes: Writes) -> Result<()> {
        let mut batch = sled::Batch::default();
        batch.remove(keys::META_REDO);
        for (k, v) in writes {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        self.tree
            .apply_batch(batch)
            .map_err(|e| Error::registry("write batch", e))
    }

    fn write_redo(&self, writes: &Writes) -> Result<()> {
        let record = codec::encode(writes).map_err(|e| Error::corrupt("encode redo record", e))?;
        self.tree
            .insert(keys::META_REDO, record)
            .map(|_| ())
            .map_err(|e| Error::registry("write redo record", e))
    }

    /// The redo record (the last commit's writes), if the tree holds one.
    fn redo_record(&self) -> Result<Option<Writes>> {
        self.tree
            .get(keys::META_REDO)
            .map_err(|e| Error::registry("read redo record", e))?
            .map(|record| codec::decode(&record).map_err(|e| Error::corrupt("redo record", e)))
            .transpose()
    }

    /// Redoes the last commit from its redo record, if there is one: finishes a commit that a
    /// crash interrupted and writes the last-applied record. Blocking; flushes.
    pub(crate) fn redo_last_commit(&self) -> Result<()> {
        let Some(writes) = self.redo_record()? else {
            return Ok(());
        };
        put_all(&self.tree, writes)?;
        self.tree
            .flush()
            .map(|_| ())
            .map_err(|e| Error::registry("flush redone commit", e))
    }

    /// Test hook: writes the redo record and the first `done` data writes of a commit, then
    /// stops, as a crash between two sled inserts would leave the tree.
    #[cfg(test)]
    pub(crate) fn commit_interrupted(&self, writes: Writes, done: usize) -> Result<()> {
        self.write_redo(&writes)?;
        write_data(&self.tree, writes.into_iter().take(done).collect())
    }

    /// Starts a point-in-time capture at the current state. O(1).
    pub(crate) fn start_capture(&self) -> Arc<Capture> {
        let c = Arc::new(Capture::new());
        self.captures.lock().push(c.clone());
        c
    }

    /// Ends a capture; later commits stop recording pre-images for it.
    pub(crate) fn end_capture(&self, capture: &Arc<Capture>) {
        self.captures.lock().retain(|c| !Arc::ptr_eq(c, capture));
    }

    pub(crate) fn get<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        what: &str,
    ) -> Result<Option<T>> {
        match self.tree.get(key).map_err(|e| Error::registry("read", e))? {
            None => Ok(None),
            Some(v) => codec::decode(&v)
                .map(Some)
                .map_err(|e| Error::corrupt(what.to_string(), e)),
        }
    }

    /// The last-applied record: the one in the redo record if there is one (the key itself is
    /// written only when a commit is redone, see [`Generation::commit`]), else the key's.
    fn applied_record(&self) -> Result<Option<AppliedRecord>> {
        let redone = self.redo_record()?.and_then(|writes| {
            writes
                .into_iter()
                .find(|(k, _)| k == keys::META_APPLIED)
                .and_then(|(_, v)| v)
        });
        match redone {
            Some(v) => codec::decode(&v)
                .map(Some)
                .map_err(|e| Error::corrupt("last applied", e)),
            None => self.get::<AppliedRecord>(keys::META_APPLIED, "last applied"),
        }
    }

    /// Last applied log id and membership as stored in this generation.
    pub(crate) fn applied(&self) -> Result<(Option<LogId>, StoredMembership)> {
        let applied = self.applied_record()?.and_then(|r| r.applied);
        let membership = self
            .get::<StoredMembership>(keys::META_MEMBERSHIP, "membership")?
            .unwrap_or_default();
        Ok((applied, membership))
    }

    /// The cluster's version stored in this generation (`cluster_version.rs`).
    pub(crate) fn cluster_version(&self) -> Result<u32> {
        Ok(self
            .get::<u32>(keys::CLUSTER_VERSION, "cluster version")?
            .unwrap_or(crate::cluster_version::BASE_VERSION))
    }

    /// The cluster's epoch floor stored in this generation (0: never raised).
    pub(crate) fn epoch_floor(&self) -> Result<u64> {
        Ok(self
            .get::<u64>(keys::CLUSTER_EPOCH_FLOOR, "cluster epoch floor")?
            .unwrap_or(0))
    }

    pub(crate) fn replica_count(&self) -> Result<u64> {
        Ok(self.applied_record()?.map(|r| r.replicas).unwrap_or(0))
    }
}

/// Performs the data writes of a commit as individual sled operations; the last-applied record
/// stays in the redo record (see [`Generation::commit`]).
fn write_data(tree: &sled::Tree, writes: Writes) -> Result<()> {
    put_all(
        tree,
        writes.into_iter().filter(|(k, _)| k != keys::META_APPLIED),
    )
}

/// Inserts (or, for `None`, removes) every key of `writes`, one sled operation each.
fn put_all(
    tree: &sled::Tree,
    writes: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
) -> Result<()> {
    for (k, v) in writes {
        match v {
            Some(v) => tree.insert(k, v),
            None => tree.remove(k),
        }
        .map_err(|e| Error::registry("write", e))?;
    }
    Ok(())
}
