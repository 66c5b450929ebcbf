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
/// log (its segment size over four) rather than in files of their own (which sled never
/// fsyncs).
const REDO_MAX_BYTES: usize = 96 * 1024;

/// Large commits of more writes than this are written in parts, not as one sled batch: sled's
/// memory grows with the writes of one batch far past their size when they are many (a follower
/// catching up on a log of 1 million replicas with scattered shard ids peaked at 0.95 GB with
/// batches, 0.6 GB with plain inserts, against 0.5 GB on the leader that applied it entry by
/// entry).
const BATCH_MAX_WRITES: usize = 512;

/// The key, inside a redo record, whose value names the parts of a commit written in parts
/// (`(seq, parts)`); the parts are under [`part_key`]. Never written to the tree as such.
const PARTS_MARKER: &[u8] = b"mredo/";

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
    /// Numbers the commits written in parts, so that a commit's parts never share a key with
    /// the previous one's.
    parted: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
thread_local! {
    /// Tests: a parted commit stops, as a crash would, before its sled operation of this number.
    pub(crate) static CUT_PARTED_AT: std::cell::Cell<Option<usize>> =
        const { std::cell::Cell::new(None) };
}

/// Counts a parted commit's sled operations (tests cut it at one, see [`CUT_PARTED_AT`]).
struct Steps(usize);

impl Steps {
    fn next(&mut self) -> Result<()> {
        #[cfg(test)]
        if CUT_PARTED_AT.with(|c| c.get()) == Some(self.0) {
            let cut = std::io::Error::other("cut by the test");
            return Err(Error::io("parted commit", "registry", cut));
        }
        self.0 += 1;
        Ok(())
    }
}

/// The key of part `i` of the parted commit numbered `seq`.
fn part_key(seq: u64, i: u32) -> Vec<u8> {
    let mut k = PARTS_MARKER.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&i.to_be_bytes());
    k
}

impl Generation {
    pub(crate) fn new(tree: sled::Tree, number: u64) -> Self {
        Generation {
            tree,
            number,
            captures: Mutex::new(Vec::new()),
            view: RwLock::new(()),
            parted: std::sync::atomic::AtomicU64::new(0),
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
    /// a file of its own. Its fixed cost does not matter for a commit that large. But one of
    /// more than [`BATCH_MAX_WRITES`] small writes goes in parts ([`Generation::write_in_parts`]):
    /// sled's memory grows with the writes of one batch.
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
            // Parts of at most REDO_MAX_BYTES each need every write to fit in one.
            let parted = writes.len() > BATCH_MAX_WRITES
                && writes
                    .iter()
                    .all(|w| writes_bytes(std::slice::from_ref(w)) <= REDO_MAX_BYTES / 2);
            return match parted {
                true => self.write_in_parts(writes),
                false => self.write_batch(writes),
            };
        }
        self.write_redo(&writes)?;
        write_data(&self.tree, writes)
    }

    /// Writes a large commit of many writes as plain inserts, crash-atomically: its write list
    /// first goes in parts of at most [`REDO_MAX_BYTES`], then a redo record naming the parts
    /// replaces the previous one (from here on a reopen redoes the commit), then the writes, then
    /// a redo record of the last-applied record alone (which lives there, as for small
    /// commits), and the parts go. A crash before the record names them leaves parts that the
    /// reopen drops: the previous commit's record still stands.
    fn write_in_parts(&self, writes: Writes) -> Result<()> {
        let seq = self
            .parted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut steps = Steps(0);
        let mut parts = 0u32;
        let mut start = 0;
        while start < writes.len() {
            let mut end = start;
            let mut bytes = 0;
            // Each write also costs its encoding's lengths and tag (at most 8 bytes here).
            let cost = |w: &[(Vec<u8>, Option<Vec<u8>>)]| writes_bytes(w) + 8;
            while end < writes.len()
                && (end == start || bytes + cost(&writes[end..=end]) <= REDO_MAX_BYTES)
            {
                bytes += cost(&writes[end..=end]);
                end += 1;
            }
            let part = codec::encode(&writes[start..end])
                .map_err(|e| Error::corrupt("encode redo part", e))?;
            steps.next()?;
            self.tree
                .insert(part_key(seq, parts), part)
                .map_err(|e| Error::registry("write redo part", e))?;
            parts += 1;
            start = end;
        }
        let marker =
            codec::encode(&(seq, parts)).map_err(|e| Error::corrupt("encode redo parts", e))?;
        steps.next()?;
        self.write_redo(&vec![(PARTS_MARKER.to_vec(), Some(marker))])?;
        let (applied, data): (Writes, Writes) = writes
            .into_iter()
            .partition(|(k, _)| k == keys::META_APPLIED);
        for write in data {
            steps.next()?;
            put_all(&self.tree, [write])?;
        }
        steps.next()?;
        self.write_redo(&applied)?;
        for i in 0..parts {
            steps.next()?;
            self.tree
                .remove(part_key(seq, i))
                .map_err(|e| Error::registry("drop redo part", e))?;
        }
        Ok(())
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
        if let Some(writes) = self.redo_record()? {
            match self.parts_of(&writes)? {
                Some(all) => {
                    let applied: Writes = all
                        .iter()
                        .filter(|(k, _)| k == keys::META_APPLIED)
                        .cloned()
                        .collect();
                    put_all(&self.tree, all)?;
                    // The record names the parts no more, before they go.
                    self.write_redo(&applied)?;
                }
                None => put_all(&self.tree, writes)?,
            }
        }
        // Parts of a parted commit that a crash cut short (before its record named them), or
        // after the record of the next commit replaced its own.
        for item in self.tree.scan_prefix(PARTS_MARKER) {
            let (k, _) = item.map_err(|e| Error::registry("find redo parts", e))?;
            self.tree
                .remove(k)
                .map_err(|e| Error::registry("drop redo part", e))?;
        }
        self.tree
            .flush()
            .map(|_| ())
            .map_err(|e| Error::registry("flush redone commit", e))
    }

    /// The whole write list of a parted commit whose redo record is `writes`, read from its
    /// parts; `None` for an ordinary record.
    fn parts_of(&self, writes: &Writes) -> Result<Option<Writes>> {
        let Some((_, Some(marker))) = writes.iter().find(|(k, _)| k == PARTS_MARKER) else {
            return Ok(None);
        };
        let (seq, parts): (u64, u32) =
            codec::decode(marker).map_err(|e| Error::corrupt("redo parts", e))?;
        let mut all = Writes::new();
        for i in 0..parts {
            let part = self
                .tree
                .get(part_key(seq, i))
                .map_err(|e| Error::registry("read redo part", e))?
                .ok_or_else(|| {
                    let missing =
                        format!("the redo record names {parts} parts; part {i} is missing");
                    Error::io(
                        "redo last commit",
                        "registry",
                        std::io::Error::new(std::io::ErrorKind::InvalidData, missing),
                    )
                })?;
            let part: Writes = codec::decode(&part).map_err(|e| Error::corrupt("redo part", e))?;
            all.extend(part);
        }
        Ok(Some(all))
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

    /// The restore's mark stored in this generation (`None`: no restore under way or cut off).
    pub(crate) fn restore_mark(&self) -> Result<Option<crate::records::RestoreMark>> {
        self.get(keys::RESTORE_MARK, "restore mark")
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
