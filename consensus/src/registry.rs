//! The shard registry in sled: the tree that holds it, the reads the API serves (with cursor
//! pagination), atomic commits of applied batches, and the atomic replacement of the whole
//! registry by an installed snapshot.
//!
//! The registry lives in one sled tree (a *generation*, named `reg-<n>`); the default tree
//! names the active generation. Installing a snapshot imports into a fresh generation and then
//! flips that name in one insert, so a crash leaves either the old registry or the new one,
//! never a mix. Retired generations are dropped once no export still reads them (and at open).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::codec;
use crate::error::{Error, Result};
use crate::generation::Generation;
use crate::keys;
use crate::node::validation::MAX_KEY_BYTES;
use crate::rebuild_source::RebuildSource;
use crate::records::{DatanodeRecord, KvRecord, ReplicaBucket};
use crate::trust_marker::TrustMarker;
use crate::view::{DatanodeInfo, KvEntry, KvKey, Page, ReplicaInfo, ShardEntry, ShardInfo};

/// Name of the default-tree key that names the active generation.
const ACTIVE: &[u8] = b"active-generation";
/// Prefix of generation tree names.
const GENERATION_PREFIX: &str = "reg-";
/// Largest page a listing returns.
pub const MAX_PAGE: usize = 10_000;

/// The registry database of one node.
pub(crate) struct Registry {
    db: sled::Db,
    trust: TrustMarker,
    current: RwLock<Arc<Generation>>,
    retired: Mutex<Vec<Arc<Generation>>>,
    /// Tests: the next [`Registry::finish_replace`] fails as a full disk would.
    #[cfg(test)]
    pub(crate) fail_next_activation: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
thread_local! {
    /// Tests: the next [`Registry::open`] on this thread fails to redo the last commit, as a
    /// full disk would.
    pub(crate) static FAIL_NEXT_REDO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Tests: sled panics in the next open of a registry on this thread, as it does on some
    /// damaged pages.
    pub(crate) static PANIC_IN_NEXT_OPEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A registry being imported into a fresh generation; becomes active with
/// [`Registry::finish_replace`], or is dropped with [`Registry::abort_replace`].
pub(crate) struct Replacement {
    generation: Arc<Generation>,
    name: String,
}

impl Replacement {
    pub(crate) fn tree(&self) -> &sled::Tree {
        &self.generation.tree
    }

    /// The cluster's version the imported registry holds.
    pub(crate) fn cluster_version(&self) -> Result<u32> {
        self.generation.cluster_version()
    }

    /// The cluster's epoch floor the imported registry holds.
    pub(crate) fn epoch_floor(&self) -> Result<u64> {
        self.generation.epoch_floor()
    }
}

fn generation_name(n: u64) -> String {
    format!("{GENERATION_PREFIX}{n}")
}

/// How long [`open_db`] waits for a closing instance in this process to release sled's lock.
const LOCK_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Opens the sled database in `dir`. Blocking.
///
/// The caller holds the data dir's `LOCK` (see `data_dir.rs`), which no other process and
/// no other open instance can hold at the same time. sled's own lock on its files can
/// still be held for a moment by a node of this process that was shut down: sled releases it
/// with the last handle to that node, which a caller, or a task finishing a call into the
/// node, may drop after the shutdown returned. So lock contention here is waited out, for at
/// most [`LOCK_RELEASE_WAIT`]; any other error is returned at once.
fn open_db(dir: &Path, cache_bytes: u64) -> Result<sled::Db> {
    open_db_waiting(dir, cache_bytes, LOCK_RELEASE_WAIT, || {})
}

/// [`open_db`] waiting at most `wait`; `on_contention` runs each time the lock was held.
fn open_db_waiting(
    dir: &Path,
    cache_bytes: u64,
    wait: Duration,
    mut on_contention: impl FnMut(),
) -> Result<sled::Db> {
    remove_unfinished_sled_snapshots(dir)?;
    let deadline = Instant::now() + wait;
    loop {
        // sled 0.34 panics on some damaged pages ("tried to serialize Uninitialized") rather
        // than answering `Corruption`: either way its files cannot be read.
        let opened = std::panic::catch_unwind(|| {
            #[cfg(test)]
            if PANIC_IN_NEXT_OPEN.with(|f| f.replace(false)) {
                panic!("tried to serialize Uninitialized");
            }
            sled::Config::new()
                .path(dir)
                .cache_capacity(cache_bytes)
                .flush_every_ms(Some(500))
                .open()
        });
        let opened = match opened {
            Ok(Err(e @ sled::Error::Corruption { .. })) => {
                return Err(Error::RegistryUnreadable {
                    path: dir.to_path_buf(),
                    reason: e.to_string(),
                })
            }
            Ok(opened) => opened,
            Err(panic) => {
                let reason = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                return Err(Error::RegistryUnreadable {
                    path: dir.to_path_buf(),
                    reason: format!("sled panicked reading it: {reason}"),
                });
            }
        };
        match opened {
            Err(e) if is_lock_contention(&e) && Instant::now() < deadline => {
                on_contention();
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if is_lock_contention(&e) => {
                return Err(Error::registry(
                    "open (sled's lock on it is still held: a node of this process that was \
                     shut down is still referenced, or another process opened it)",
                    e,
                ))
            }
            // The file system's refusal names the dir (sled's does not).
            Err(sled::Error::Io(e)) => return Err(Error::io("open registry", dir, e)),
            other => return other.map_err(|e| Error::registry("open", e)),
        }
    }
}

/// Removes `snap.<lsn>.generating` files: sled 0.34 writes its snapshot to such a file, fsyncs
/// it and renames it to `snap.<lsn>`, but its reader (`get_snapshot_files`) does not skip the
/// unfinished name. A snapshot write that failed (a full disk: sled writes one at every open)
/// leaves an empty or short `.generating` file that sorts after the real snapshot, and every
/// later open fails with "Read corrupted data", also once space is freed. Such a file is never a
/// complete snapshot, so deleting it loses nothing.
fn remove_unfinished_sled_snapshots(dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("list registry directory", dir, e)),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(path = %entry.path().display(), "removing an unfinished sled snapshot");
            std::fs::remove_file(entry.path())
                .map_err(|e| Error::io("remove unfinished sled snapshot", entry.path(), e))?;
        }
    }
    Ok(())
}

/// sled reports a held lock as an `Other` IO error with this message (sled 0.34).
fn is_lock_contention(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().starts_with("could not acquire lock"))
}

impl Drop for Registry {
    /// A registry that failed a write is abandoned, not closed ([`abandon`]).
    fn drop(&mut self) {
        if self.trust.revoked() {
            abandon(&self.db);
        }
    }
}

/// Leaves `db` open until the process exits. sled flushes a tree when its last handle goes, and
/// after a write failed for want of space that flush waits for ever for a buffer it never
/// writes: a node restarted on a full disk hung there, bound to its port, ignoring SIGTERM,
/// before it could say why it stopped. A registry that failed a write is deleted and rebuilt
/// at the next start anyway; the process exits soon after (its Raft core stopped), so what is
/// kept is not kept long.
fn abandon(db: &sled::Db) {
    std::mem::forget(db.clone());
}

impl Registry {
    /// Opens a scratch registry (a backup's, a test's), which nothing rebuilds: as
    /// [`Registry::open_rebuildable`] with nothing to check.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<Registry> {
        Self::open_rebuildable(dir, cache_bytes, &RebuildSource::default())
    }

    /// Opens (creating if needed) the registry in `dir` with a page cache of `cache_bytes`.
    /// Generations other than the active one (left by a crash during an install) are dropped.
    ///
    /// A registry that failed a write, was left open in an earlier boot, or cannot be read is
    /// deleted first (see `trust_marker.rs`): the node then rebuilds it from the newest snapshot
    /// and the log. When those do not hold every entry (`source`), it is an error instead
    /// ([`Error::RegistryNotRebuildable`]), and the registry is left as it is.
    pub(crate) fn open_rebuildable(
        dir: &Path,
        cache_bytes: u64,
        source: &RebuildSource,
    ) -> Result<Registry> {
        let trust = TrustMarker::check(dir, source)?;
        let db = match open_db(dir, cache_bytes) {
            // The registry holds nothing that the newest snapshot and the log do not: one that
            // cannot be read is rebuilt from them, like one that failed a write.
            Err(e @ Error::RegistryUnreadable { .. }) => {
                source.check(dir, &format!("cannot be read ({e})"))?;
                tracing::error!(
                    "{e}: deleting it; it is rebuilt from the newest snapshot and the log"
                );
                std::fs::remove_dir_all(dir)
                    .map_err(|e| Error::io("delete unreadable registry", dir, e))?;
                open_db(dir, cache_bytes)?
            }
            opened => opened?,
        };
        trust.opened()?;
        // Open's own writes are writes like any other: one that fails distrusts the registry.
        let written = |e: Error| {
            trust.revoke();
            abandon(&db);
            e
        };
        let number = match db.get(ACTIVE).map_err(|e| Error::registry("open", e))? {
            Some(v) => {
                codec::decode::<u64>(&v).map_err(|e| Error::corrupt("active generation", e))?
            }
            None => {
                let v = codec::encode(&0u64).map_err(|e| Error::corrupt("active generation", e))?;
                db.insert(ACTIVE, v)
                    .map_err(|e| written(Error::registry("open", e)))?;
                0
            }
        };
        let active = generation_name(number);
        for name in db.tree_names() {
            let name_str = String::from_utf8_lossy(&name);
            if name_str.starts_with(GENERATION_PREFIX) && name_str != active {
                db.drop_tree(&name)
                    .map_err(|e| written(Error::registry("drop stale generation", e)))?;
            }
        }
        let tree = db
            .open_tree(&active)
            .map_err(|e| written(Error::registry("open", e)))?;
        let generation = Generation::new(tree, number);
        #[cfg(test)]
        if FAIL_NEXT_REDO.with(|f| f.replace(false)) {
            let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(written(Error::registry("flush redone commit", full.into())));
        }
        generation.redo_last_commit().map_err(written)?;
        trust.set()?;
        Ok(Registry {
            db,
            trust,
            current: RwLock::new(Arc::new(generation)),
            retired: Mutex::new(Vec::new()),
            #[cfg(test)]
            fail_next_activation: Default::default(),
        })
    }

    /// The active generation.
    pub(crate) fn current(&self) -> Arc<Generation> {
        self.current.read().clone()
    }

    /// Writes everything to disk. Blocking: call off the async runtime.
    pub(crate) fn flush(&self) -> Result<()> {
        self.db.flush().map(|_| ()).map_err(|e| {
            self.distrust();
            Error::registry("flush", e)
        })
    }

    /// Flushes the registry, and once that succeeded records that it was closed cleanly (see
    /// `trust_marker.rs`): call it last, when nothing writes to the registry any more. Blocking.
    /// A registry that failed a write is not flushed (the next start rebuilds it anyway, and
    /// sled's flush after a write failed on a full disk waits for a buffer it never writes: a
    /// node whose core stopped so took its whole close bound to exit).
    ///
    /// Contract: when this returns `Ok`, every write is durable and a later boot of the machine
    /// reopens the registry; when it fails, the next start rebuilds it.
    pub(crate) fn close(&self) -> Result<()> {
        if self.trust.revoked() {
            return Err(Error::Raft(
                "the registry failed a write: not flushed, the next start rebuilds it".into(),
            ));
        }
        self.flush()?;
        self.trust.closed();
        Ok(())
    }

    /// The registry failed a write: the next start rebuilds it instead of reopening it.
    pub(crate) fn distrust(&self) {
        self.trust.revoke();
    }

    /// The registry is to be rebuilt at the next open (it applied entries that its log lost);
    /// unlike [`Registry::distrust`], nothing failed.
    pub(crate) fn rebuild_next(&self) {
        self.trust.rebuild_next();
    }

    /// Starts importing a whole registry into a fresh, empty generation.
    pub(crate) fn begin_replace(&self) -> Result<Replacement> {
        let number = self.current().number + 1;
        let name = generation_name(number);
        self.db
            .drop_tree(name.as_bytes())
            .map_err(|e| Error::registry("prepare generation", e))?;
        let tree = self
            .db
            .open_tree(&name)
            .map_err(|e| Error::registry("prepare generation", e))?;
        Ok(Replacement {
            generation: Arc::new(Generation::new(tree, number)),
            name,
        })
    }

    /// Makes an imported generation the registry, atomically (one insert names it), flushes it
    /// to disk and retires the previous one. Blocking: call off the async runtime.
    pub(crate) fn finish_replace(&self, r: Replacement) -> Result<()> {
        r.generation
            .tree
            .flush()
            .map_err(|e| Error::registry("flush imported generation", e))?;
        let v = codec::encode(&r.generation.number)
            .map_err(|e| Error::corrupt("active generation", e))?;
        #[cfg(test)]
        if self
            .fail_next_activation
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(Error::registry("activate generation", full.into()));
        }
        let old = {
            let mut cur = self.current.write();
            self.db
                .insert(ACTIVE, v)
                .map_err(|e| Error::registry("activate generation", e))?;
            std::mem::replace(&mut *cur, r.generation)
        };
        self.flush()?;
        self.retired.lock().push(old);
        self.collect_garbage();
        Ok(())
    }

    /// Drops an unfinished import. A drop that fails is a failed write: the registry is
    /// distrusted (the import's leftovers are dropped at the next open either way).
    pub(crate) fn abort_replace(&self, r: Replacement) {
        let Replacement { generation, name } = r;
        drop(generation);
        if let Err(e) = self.db.drop_tree(name.as_bytes()) {
            tracing::warn!("dropping aborted generation {name}: {e}");
            self.distrust();
        }
    }

    /// Tests: how many retired generations are still kept (read by an export).
    #[cfg(test)]
    pub(crate) fn retired_count(&self) -> usize {
        self.retired.lock().len()
    }

    /// Drops retired generations that no export reads any more.
    pub(crate) fn collect_garbage(&self) {
        let mut retired = self.retired.lock();
        retired.retain(|g| {
            if Arc::strong_count(g) > 1 {
                return true;
            }
            let name = generation_name(g.number);
            if let Err(e) = self.db.drop_tree(name.as_bytes()) {
                tracing::warn!("dropping retired generation {name}: {e}");
            }
            false
        });
    }

    // ---- reads ----

    /// The value under datanode `id`'s epoch floor key: with its record, the epoch its removal
    /// raised it to (see [`crate::records::being_removed`]).
    pub(crate) fn removal_mark(&self, id: u64) -> Result<Option<u64>> {
        let g = self.current();
        let _view = g.reading();
        g.get::<u64>(&keys::epoch_floor(id), "removal mark")
    }

    pub(crate) fn datanode(&self, id: u64) -> Result<Option<DatanodeInfo>> {
        let g = self.current();
        let _view = g.reading();
        let Some(r) = g.get::<DatanodeRecord>(&keys::datanode(id), "datanode")? else {
            return Ok(None);
        };
        let mark = g.get::<u64>(&keys::epoch_floor(id), "removal mark")?;
        Ok(Some(datanode_info(id, r, mark)))
    }

    pub(crate) fn datanodes(&self) -> Result<Vec<DatanodeInfo>> {
        let g = self.current();
        let _view = g.reading();
        let mut out = Vec::new();
        for item in g.tree.scan_prefix([keys::DATANODE]) {
            let (k, v) = item.map_err(|e| Error::registry("list datanodes", e))?;
            let id = keys::one_id(&k).ok_or_else(|| bad_key("datanode", &k))?;
            let rec: DatanodeRecord =
                codec::decode(&v).map_err(|e| Error::corrupt(format!("datanode {id}"), e))?;
            let mark = g.get::<u64>(&keys::epoch_floor(id), "removal mark")?;
            out.push(datanode_info(id, rec, mark));
        }
        Ok(out)
    }

    /// Registered datanodes by id, after the cursor (the hex of the last id of the previous
    /// page): at most `limit` of them.
    pub(crate) fn datanode_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<DatanodeInfo>> {
        let limit = check_limit(limit)?;
        let start = match after {
            None => keys::datanode(0).to_vec(),
            Some(c) => {
                let raw = cursor_bytes(c, 8)?;
                keys::successor(&keys::datanode(u64::from_be_bytes(
                    raw.try_into().expect("8 bytes"),
                )))
            }
        };
        let g = self.current();
        let _view = g.reading();
        let mut items = Vec::new();
        let mut more = false;
        for item in g.tree.range(start..) {
            let (k, v) = item.map_err(|e| Error::registry("list datanodes", e))?;
            if k.first() != Some(&keys::DATANODE) {
                break;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            let id = keys::one_id(&k).ok_or_else(|| bad_key("datanode", &k))?;
            let rec: DatanodeRecord =
                codec::decode(&v).map_err(|e| Error::corrupt(format!("datanode {id}"), e))?;
            let mark = g.get::<u64>(&keys::epoch_floor(id), "removal mark")?;
            items.push(datanode_info(id, rec, mark));
        }
        let next = more.then(|| {
            let last = items.last().map(|d| d.id).unwrap_or(0);
            keys::to_hex(&last.to_be_bytes())
        });
        Ok(Page { items, next })
    }

    /// The highest epoch floor the registry keeps: the cluster's (`Command::RaiseEpochFloor`)
    /// and those of removed datanodes' ids; 0 if none.
    pub(crate) fn highest_epoch_floor(&self) -> Result<u64> {
        let g = self.current();
        let _view = g.reading();
        let mut highest = g.epoch_floor()?;
        for item in g.tree.scan_prefix([keys::EPOCH_FLOOR]) {
            let (k, v) = item.map_err(|e| Error::registry("list epoch floors", e))?;
            let id = keys::one_id(&k).ok_or_else(|| bad_key("epoch floor", &k))?;
            let floor: u64 = codec::decode(&v)
                .map_err(|e| Error::corrupt(format!("epoch floor of datanode {id}"), e))?;
            highest = highest.max(floor);
        }
        Ok(highest)
    }

    pub(crate) fn datanode_count(&self) -> Result<u64> {
        let g = self.current();
        let _view = g.reading();
        Ok(g.tree.scan_prefix([keys::DATANODE]).count() as u64)
    }

    fn replica_bucket(g: &Generation, b: u64) -> Result<ReplicaBucket> {
        Ok(
            g.get::<ReplicaBucket>(&keys::replica_bucket(b), "replica bucket")?
                .unwrap_or_default(),
        )
    }

    pub(crate) fn shard(&self, id: u64) -> Result<Option<ShardInfo>> {
        let g = self.current();
        let _view = g.reading();
        Ok(Self::shard_in(
            id,
            Self::replica_bucket(&g, keys::bucket_of(id))?,
        ))
    }

    /// Shard `id` as `bucket` (its bucket) holds it.
    pub(crate) fn shard_in(id: u64, bucket: ReplicaBucket) -> Option<ShardInfo> {
        let replicas: Vec<ReplicaInfo> = bucket
            .into_iter()
            .filter(|e| e.shard == id)
            .map(|e| ReplicaInfo {
                datanode: e.datanode,
                generation: e.replica.generation,
                size: e.replica.size,
                epoch: e.replica.epoch,
            })
            .collect();
        (!replicas.is_empty()).then_some(ShardInfo { id, replicas })
    }

    /// All replicas ordered by (shard, datanode), after the cursor.
    pub(crate) fn shards(&self, after: Option<&str>, limit: usize) -> Result<Page<ShardEntry>> {
        let limit = check_limit(limit)?;
        let after = match after {
            None => None,
            Some(c) => {
                let raw = cursor_bytes(c, 16)?;
                let shard = u64::from_be_bytes(raw[..8].try_into().expect("8 bytes"));
                let dn = u64::from_be_bytes(raw[8..].try_into().expect("8 bytes"));
                Some((shard, dn))
            }
        };
        let start = keys::replica_bucket(after.map(|(s, _)| keys::bucket_of(s)).unwrap_or(0));
        let g = self.current();
        let _view = g.reading();
        let mut items = Vec::new();
        let mut more = false;
        'buckets: for item in g.tree.range(start..) {
            let (k, v) = item.map_err(|e| Error::registry("list shards", e))?;
            if k.first() != Some(&keys::REPLICA) {
                break;
            }
            let bucket: ReplicaBucket = codec::decode(&v)
                .map_err(|e| Error::corrupt(format!("replica bucket {}", keys::to_hex(&k)), e))?;
            for e in bucket {
                if after.is_some_and(|a| (e.shard, e.datanode) <= a) {
                    continue;
                }
                if items.len() == limit {
                    more = true;
                    break 'buckets;
                }
                items.push(ShardEntry {
                    shard: e.shard,
                    datanode: e.datanode,
                    generation: e.replica.generation,
                    size: e.replica.size,
                });
            }
        }
        let next = more.then(|| {
            let last = items.last().expect("a full page is not empty");
            let mut raw = last.shard.to_be_bytes().to_vec();
            raw.extend_from_slice(&last.datanode.to_be_bytes());
            keys::to_hex(&raw)
        });
        Ok(Page { items, next })
    }

    /// A datanode's replicas ordered by shard id, after the cursor.
    pub(crate) fn datanode_shards(
        &self,
        datanode: u64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ShardEntry>> {
        let limit = check_limit(limit)?;
        let after = match after {
            None => None,
            Some(c) => Some(u64::from_be_bytes(
                cursor_bytes(c, 8)?.try_into().expect("8 bytes"),
            )),
        };
        let prefix = keys::by_datanode_prefix(datanode);
        let start = keys::by_datanode(datanode, after.map(keys::bucket_of).unwrap_or(0));
        let g = self.current();
        let _view = g.reading();
        let mut items = Vec::new();
        let mut more = false;
        'buckets: for item in g.tree.range(start..) {
            let (k, _) = item.map_err(|e| Error::registry("list datanode shards", e))?;
            if !k.starts_with(&prefix) {
                break;
            }
            let (_, b) = keys::two_ids(&k).ok_or_else(|| bad_key("index", &k))?;
            // The index and the bucket are written in one batch; a concurrent change between
            // the two reads only shows on this page as the newer bucket.
            for e in Self::replica_bucket(&g, b)? {
                if e.datanode != datanode || after.is_some_and(|a| e.shard <= a) {
                    continue;
                }
                if items.len() == limit {
                    more = true;
                    break 'buckets;
                }
                items.push(ShardEntry {
                    shard: e.shard,
                    datanode,
                    generation: e.replica.generation,
                    size: e.replica.size,
                });
            }
        }
        let next = more.then(|| {
            let last = items.last().map(|e| e.shard).unwrap_or(0);
            keys::to_hex(&last.to_be_bytes())
        });
        Ok(Page { items, next })
    }

    pub(crate) fn kv_get(&self, key: &str) -> Result<Option<KvEntry>> {
        let g = self.current();
        let _view = g.reading();
        Ok(g.get::<KvRecord>(&keys::kv(key), "kv")?
            .map(|r| kv_entry(key, r)))
    }

    /// Keys starting with `prefix`, in byte order, after the cursor. Values are dropped as
    /// they are read: a page holds keys and revisions only.
    pub(crate) fn kv_list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<KvKey>> {
        self.kv_walk(prefix, after, limit, usize::MAX, |key, r| KvKey {
            key,
            revision: r.revision,
        })
    }

    /// Entries (with their values) whose keys start with `prefix`, in byte order, after the
    /// cursor: at most `limit` of them, and no more once their values reach `max_bytes` (a
    /// page holds at least one entry, however large).
    pub(crate) fn kv_scan(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page<KvEntry>> {
        self.kv_walk(prefix, after, limit, max_bytes, |key, r| KvEntry {
            key,
            value: r.value,
            revision: r.revision,
        })
    }

    /// The page of [`Self::kv_scan`], each entry (its key and record) kept as `keep` makes it.
    fn kv_walk<T>(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
        mut keep: impl FnMut(String, KvRecord) -> T,
    ) -> Result<Page<T>> {
        let limit = check_limit(limit)?;
        let full_prefix = keys::kv(prefix);
        let mut start = full_prefix.clone();
        if let Some(c) = after {
            let raw = kv_cursor(c)?;
            let mut k = vec![keys::KV];
            k.extend_from_slice(&raw);
            let k = keys::successor(&k);
            if k > start {
                start = k;
            }
        }
        let g = self.current();
        let _view = g.reading();
        let mut items: Vec<T> = Vec::new();
        let mut last: Option<sled::IVec> = None;
        let mut bytes = 0;
        let mut more = false;
        for item in g.tree.range(start..) {
            let (k, v) = item.map_err(|e| Error::registry("list keys", e))?;
            if !k.starts_with(&full_prefix) {
                break;
            }
            if items.len() == limit || (!items.is_empty() && bytes >= max_bytes) {
                more = true;
                break;
            }
            let key = String::from_utf8(k[1..].to_vec()).map_err(|_| bad_key("kv", &k))?;
            let r: KvRecord =
                codec::decode(&v).map_err(|e| Error::corrupt(format!("kv {key:?}"), e))?;
            bytes += r.value.len();
            items.push(keep(key, r));
            last = Some(k);
        }
        let next = more.then(|| keys::to_hex(&last.expect("a page ends after an entry")[1..]));
        Ok(Page { items, next })
    }

    /// The primary data (datanodes, replicas, keys, settings, epoch floors) of the active generation as a
    /// map; the content two replicas of the registry must agree on.
    pub(crate) fn content(&self) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        let mut out = BTreeMap::new();
        let g = self.current();
        let _view = g.reading();
        for item in g.tree.iter() {
            let (k, v) = item.map_err(|e| Error::registry("read all", e))?;
            if keys::is_primary(&k) {
                out.insert(k.to_vec(), v.to_vec());
            }
        }
        Ok(out)
    }
}

/// Datanode `id`'s record `r` as a view; `mark` is the value under its id's epoch floor key
/// (see [`crate::records::being_removed`]).
pub(crate) fn datanode_info(id: u64, r: DatanodeRecord, mark: Option<u64>) -> DatanodeInfo {
    DatanodeInfo {
        id,
        removing: crate::records::being_removed(&r, mark),
        addr: r.addr,
        epoch: r.epoch,
        registered_index: r.registered_index,
        shards: r.shards,
    }
}

pub(crate) fn kv_entry(key: &str, r: KvRecord) -> KvEntry {
    KvEntry {
        key: key.to_string(),
        value: r.value,
        revision: r.revision,
    }
}

fn bad_key(what: &str, key: &[u8]) -> Error {
    Error::corrupt(
        format!("{what} key {}", keys::to_hex(key)),
        crate::codec::CodecError::Decode("malformed key".into()),
    )
}

fn check_limit(limit: usize) -> Result<usize> {
    if limit == 0 {
        return Err(Error::InvalidArgument("limit must be at least 1".into()));
    }
    Ok(limit.min(MAX_PAGE))
}

fn cursor_bytes(c: &str, len: usize) -> Result<Vec<u8>> {
    match keys::from_hex(c) {
        Some(raw) if raw.len() == len => Ok(raw),
        _ => Err(Error::InvalidArgument(format!("bad cursor {c:?}"))),
    }
}

/// The key a key listing's cursor names: the hex of a key as the API takes one (1 to
/// [`MAX_KEY_BYTES`] bytes of UTF-8 without control characters), so that a cursor no page
/// handed out is refused rather than read as some place in the key space.
fn kv_cursor(c: &str) -> Result<Vec<u8>> {
    keys::from_hex(c)
        .filter(|raw| (1..=MAX_KEY_BYTES).contains(&raw.len()))
        .filter(|raw| std::str::from_utf8(raw).is_ok_and(|k| !k.chars().any(char::is_control)))
        .ok_or_else(|| Error::InvalidArgument(format!("bad cursor {c:?}")))
}

#[cfg(test)]
mod tests;
