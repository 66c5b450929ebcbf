//! The Raft state machine: applies committed registry commands to the sled registry, builds
//! snapshots from a point-in-time capture and installs received ones.
//!
//! Contracts:
//! - `apply` executes the entries, then answers the waiting clients. Their writes join the
//!   *deferred batch*: applied writes held in memory and committed to sled together (ONE
//!   atomic commit with their last log id and the newest membership) once the batch is
//!   [`DEFER_MAX_AGE`] old or holds [`DEFER_MAX_KEYS`] keys, at a membership change, and before
//!   any listing of the registry, snapshot or shutdown (point reads read through it; an
//!   apply call with much work commits the batch and then itself, at once). So a shard
//!   registered again and again costs one bucket write per batch, not one per registration.
//!   Nothing is flushed on this path: sled flushes in the background, and after a crash
//!   openraft re-applies from the stored last-applied up to the committed id recorded in the
//!   log (which holds every entry after the newest snapshot, and a snapshot commits the
//!   deferred batch first). Entries at or below the stored last-applied are skipped, so
//!   re-applying is idempotent.
//! - A snapshot builder is created in O(1) (a capture starts; `apply` continues at once); the
//!   export runs on a blocking thread, paced by the node's rate limiter, and is durable (temp
//!   file, fsync, rename) when `build_snapshot` returns.
//! - `install_snapshot` verifies the file and every record, imports into a fresh registry
//!   generation, keeps a local copy in the snapshot store, and then switches to the new
//!   registry atomically; when it returns the switch is flushed to disk.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, TryStreamExt};
use meta_store::{RateLimiter, SnapshotStore};
use openraft::alias::SnapshotOf;
use openraft::storage::{EntryResponder, RaftStateMachine, Snapshot};
use openraft::EntryPayload;
use parking_lot::Mutex;

use crate::apply_batch::ApplyBatch;
use crate::codec;
use crate::command::{Command, CommandResult};
use crate::error::{Error, Result};
use crate::keys;
use crate::records::{DatanodeRecord, KvRecord};
use crate::registry::{datanode_info, kv_entry, Generation, Registry};
use crate::sm_stats::SmStats;
use crate::snapshot_builder::SnapshotBuilder;
use crate::snapshot_data::{read_meta, snapshot_name, SnapshotData};
use crate::snapshot_format;
use crate::types::{Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::view::{DatanodeInfo, KvEntry, ShardInfo, SnapshotInfo};

/// An entry touching more records than this is heavy: its apply call commits the deferred batch
/// and then itself at once, on a blocking thread (a storm's 1,000-shard registrations).
const HEAVY_ENTRY_OPS: usize = 64;
/// An apply call of light entries touching more records than this in total runs on a blocking
/// thread (but still joins the deferred batch), and so does any call that commits the batch.
const INLINE_APPLY_OPS: usize = 1024;
/// The deferred batch is committed once it is this old (checked when entries are applied)...
pub(crate) const DEFER_MAX_AGE: Duration = Duration::from_millis(100);
/// ...or once it writes this many keys.
pub(crate) const DEFER_MAX_KEYS: usize = 4096;

/// Applied writes not yet committed to sled, and the registry generation they belong to.
struct Deferred {
    generation: Arc<Generation>,
    batch: ApplyBatch,
    since: Instant,
}

impl Deferred {
    fn due(&self, now: Instant, max_age: Duration) -> bool {
        self.batch.keys() >= DEFER_MAX_KEYS || now.duration_since(self.since) >= max_age
    }
}

/// State shared by the state machine (owned by openraft), its snapshot builders and the node.
pub(crate) struct SmShared {
    pub(crate) registry: Registry,
    pub(crate) snapshots: SnapshotStore,
    pub(crate) limiter: Arc<RateLimiter>,
    pub(crate) stats: SmStats,
    applied: Mutex<(Option<LogId>, StoredMembership)>,
    replicas: AtomicU64,
    datanodes: AtomicU64,
    /// The deferred batch (see the module comment). Held while entries execute and while a
    /// batch commits, so a read that commits it first sees every applied entry.
    deferred: Mutex<Option<Deferred>>,
    /// Set when a commit of the deferred batch failed: its writes are lost, so applying or
    /// reading further would serve a registry behind last-applied.
    failed: AtomicBool,
    /// [`DEFER_MAX_AGE`]; tests stretch it.
    defer_max_age: Duration,
    /// Snapshot builders running.
    pub(crate) building: AtomicUsize,
    /// Set when the node shuts down: running snapshot exports stop early.
    pub(crate) closing: AtomicBool,
    /// The newest snapshot (index, payload bytes), for status.
    last_snapshot: Mutex<Option<SnapshotInfo>>,
}

/// The registry state machine handed to openraft.
pub struct StateMachine {
    shared: Arc<SmShared>,
}

fn to_io(e: Error) -> io::Error {
    e.into()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("blocking task failed: {e}")))?
        .map_err(to_io)
}

impl StateMachine {
    /// Opens the registry in `registry_dir` and the snapshot store in `snapshot_dir`.
    /// Blocking (opens files).
    pub fn open(
        registry_dir: &Path,
        snapshot_dir: &Path,
        cache_bytes: u64,
        snapshots_to_keep: usize,
        limiter: Arc<RateLimiter>,
    ) -> Result<StateMachine> {
        let registry = Registry::open(registry_dir, cache_bytes)?;
        let snapshots = SnapshotStore::open(snapshot_dir, snapshots_to_keep)
            .map_err(|e| Error::storage("open snapshot store", e))?;
        let last_snapshot = snapshots
            .newest()
            .map_err(|e| Error::storage("find newest snapshot", e))?
            .map(|f| -> Result<SnapshotInfo> {
                let meta: SnapshotMeta = codec::decode(&f.meta).map_err(|e| {
                    Error::corrupt(format!("snapshot metadata of {}", f.path.display()), e)
                })?;
                Ok(SnapshotInfo {
                    index: meta.last_log_id.map(|l| l.index).unwrap_or(0),
                    bytes: f.bytes,
                })
            })
            .transpose()?;
        let gen = registry.current();
        let applied = gen.applied()?;
        let replicas = gen.replica_count()?;
        drop(gen);
        let datanodes = registry.datanode_count()?;
        Ok(StateMachine {
            shared: Arc::new(SmShared {
                registry,
                snapshots,
                limiter,
                stats: SmStats::default(),
                applied: Mutex::new(applied),
                replicas: AtomicU64::new(replicas),
                datanodes: AtomicU64::new(datanodes),
                deferred: Mutex::new(None),
                failed: AtomicBool::new(false),
                defer_max_age: DEFER_MAX_AGE,
                building: AtomicUsize::new(0),
                closing: AtomicBool::new(false),
                last_snapshot: Mutex::new(last_snapshot),
            }),
        })
    }

    pub(crate) fn shared(&self) -> Arc<SmShared> {
        self.shared.clone()
    }
}

/// How much work an entry is, in records touched.
fn weight(e: &Entry) -> usize {
    match &e.payload {
        EntryPayload::Normal(Command::RegisterShards { shards, .. }) => shards.len() * 2 + 1,
        EntryPayload::Normal(Command::DeregisterShards { shards, .. }) => shards.len() * 2 + 1,
        EntryPayload::Normal(Command::RemoveDatanode { .. }) => HEAVY_ENTRY_OPS,
        // Commits the deferred batch at once, however large: not on the async runtime.
        EntryPayload::Membership(_) => HEAVY_ENTRY_OPS + 1,
        _ => 1,
    }
}

/// Whether an apply call commits at once instead of joining the deferred batch: when one of its
/// entries is heavy. Decided per entry: many light entries in one call (the registrations of 64
/// clients, applied together) still join the batch; counted together they would commit on
/// every call.
fn is_heavy(entries: &[Entry]) -> bool {
    entries.iter().any(|e| weight(e) > HEAVY_ENTRY_OPS)
}

/// Records an apply call touches.
fn work(entries: &[Entry]) -> usize {
    entries.iter().map(weight).sum()
}

impl SmShared {
    /// Last applied log id and membership.
    pub(crate) fn applied(&self) -> (Option<LogId>, StoredMembership) {
        self.applied.lock().clone()
    }

    /// The newest snapshot this node built or installed.
    pub(crate) fn last_snapshot(&self) -> Option<SnapshotInfo> {
        self.last_snapshot.lock().clone()
    }

    pub(crate) fn set_last_snapshot(&self, meta: &SnapshotMeta, bytes: u64) {
        *self.last_snapshot.lock() = Some(SnapshotInfo {
            index: meta.last_log_id.as_ref().map(|l| l.index).unwrap_or(0),
            bytes,
        });
    }

    pub(crate) fn replicas(&self) -> u64 {
        self.replicas.load(Ordering::Relaxed)
    }

    pub(crate) fn datanodes(&self) -> u64 {
        self.datanodes.load(Ordering::Relaxed)
    }

    fn check_failed(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(Error::Raft(
                "a registry commit failed earlier; the node must restart".into(),
            ));
        }
        Ok(())
    }

    /// Commits the deferred batch, if any. Blocking (sled).
    ///
    /// Contract: when this returns `Ok`, every applied entry's writes are visible to readers
    /// of the registry (not yet durable: sled flushes in the background).
    pub(crate) fn commit_deferred(&self) -> Result<()> {
        let mut deferred = self.deferred.lock();
        self.check_failed()?;
        Self::commit_taken(&self.failed, deferred.take())
    }

    fn commit_taken(failed: &AtomicBool, deferred: Option<Deferred>) -> Result<()> {
        let Some(d) = deferred else {
            return Ok(());
        };
        let committed = d.batch.finish().and_then(|w| d.generation.commit(w));
        if committed.is_err() {
            failed.store(true, Ordering::Release);
        }
        committed
    }

    /// One key as applied, without committing the deferred batch: `from_batch` answers when
    /// the batch writes the key (`Some`), else `from_registry`. The batch's lock is held while
    /// `from_batch` runs, so no commit is half done: a key the batch does not write is as
    /// applied in the registry (or newer, if a commit follows). Blocking (sled).
    fn read_through<T>(
        &self,
        from_batch: impl FnOnce(&ApplyBatch) -> Result<Option<T>>,
        from_registry: impl FnOnce(&Registry) -> Result<T>,
    ) -> Result<T> {
        self.check_failed()?;
        let pending = match self.deferred.lock().as_ref() {
            Some(d) => from_batch(&d.batch)?,
            None => None,
        };
        match pending {
            Some(v) => Ok(v),
            None => from_registry(&self.registry),
        }
    }

    /// Shard `id` as applied (see [`Self::read_through`]).
    pub(crate) fn shard(&self, id: u64) -> Result<Option<ShardInfo>> {
        let b = keys::bucket_of(id);
        self.read_through(
            |batch| {
                Ok(batch
                    .pending_bucket(b)
                    .map(|bucket| Registry::shard_in(id, bucket)))
            },
            |registry| registry.shard(id),
        )
    }

    /// Datanode `id` as applied (see [`Self::read_through`]).
    pub(crate) fn datanode(&self, id: u64) -> Result<Option<DatanodeInfo>> {
        self.read_through(
            |batch| {
                let pending = batch.pending::<DatanodeRecord>(&keys::datanode(id), "datanode")?;
                Ok(pending.map(|r| r.map(|r| datanode_info(id, r))))
            },
            |registry| registry.datanode(id),
        )
    }

    /// Key `key` as applied (see [`Self::read_through`]).
    pub(crate) fn kv_get(&self, key: &str) -> Result<Option<KvEntry>> {
        self.read_through(
            |batch| {
                let pending = batch.pending::<KvRecord>(&keys::kv(key), "kv")?;
                Ok(pending.map(|r| r.map(|r| kv_entry(key, r))))
            },
            |registry| registry.kv_get(key),
        )
    }

    /// Whether applying now would commit the deferred batch.
    fn commit_due(&self) -> bool {
        let now = Instant::now();
        self.deferred
            .lock()
            .as_ref()
            .is_some_and(|d| d.due(now, self.defer_max_age))
    }

    /// Applies `entries` into the deferred batch, committing it when due; returns one result
    /// per entry. A `heavy` call (much work, as in a registration storm) instead commits the
    /// deferred batch and then executes and commits on its own, without holding the batch's
    /// lock: point reads meanwhile read the registry (each key old or new) instead of waiting
    /// for the whole execution. Blocking (sled).
    fn apply_entries(&self, entries: &[Entry], heavy: bool) -> Result<Vec<CommandResult>> {
        let started = Instant::now();
        let mut deferred = self.deferred.lock();
        self.check_failed()?;
        let (applied, _) = self.applied();
        if heavy {
            Self::commit_taken(&self.failed, deferred.take())?;
            drop(deferred);
            let generation = self.registry.current();
            let mut batch = ApplyBatch::new(generation.tree.clone(), self.replicas());
            let (results, last, membership) = self
                .execute(&mut batch, applied, entries)
                .inspect_err(|_| self.failed.store(true, Ordering::Release))?;
            let Some(last) = last else {
                return Ok(results);
            };
            batch.set_applied(&last);
            let (replicas, added) = (batch.replicas(), batch.datanodes_delta());
            let deferred = Deferred {
                generation,
                batch,
                since: started,
            };
            Self::commit_taken(&self.failed, Some(deferred))?;
            self.publish(last, membership, replicas, added);
            self.stats.applied(entries.len(), started.elapsed());
            return Ok(results);
        }
        let d = match deferred.as_mut() {
            Some(d) => d,
            None => {
                let generation = self.registry.current();
                let batch = ApplyBatch::new(generation.tree.clone(), self.replicas());
                deferred.insert(Deferred {
                    generation,
                    batch,
                    since: started,
                })
            }
        };
        let datanodes_before = d.batch.datanodes_delta();
        let executed = self.execute(&mut d.batch, applied, entries);
        let (results, last, membership) = match executed {
            Ok(x) => x,
            Err(e) => {
                // The batch may hold part of an entry: drop it and refuse to go on.
                deferred.take();
                self.failed.store(true, Ordering::Release);
                return Err(e);
            }
        };
        let Some(last) = last else {
            return Ok(results);
        };
        d.batch.set_applied(&last);
        let replicas = d.batch.replicas();
        let added = d.batch.datanodes_delta() - datanodes_before;
        if membership.is_some() || d.due(started, self.defer_max_age) {
            Self::commit_taken(&self.failed, deferred.take())?;
        }
        self.publish(last, membership, replicas, added);
        self.stats.applied(entries.len(), started.elapsed());
        Ok(results)
    }

    /// Makes an apply's outcome the state machine's: last-applied, membership and counters.
    fn publish(
        &self,
        last: LogId,
        membership: Option<StoredMembership>,
        replicas: u64,
        datanodes_added: i64,
    ) {
        {
            let mut a = self.applied.lock();
            a.0 = Some(last);
            if let Some(m) = membership {
                a.1 = m;
            }
        }
        self.replicas.store(replicas, Ordering::Relaxed);
        let datanodes = self.datanodes().saturating_add_signed(datanodes_added);
        self.datanodes.store(datanodes, Ordering::Relaxed);
    }

    /// Executes the entries after `applied` into `batch`; returns one result per entry, the
    /// last executed log id and the newest membership among them.
    #[allow(clippy::type_complexity)]
    fn execute(
        &self,
        batch: &mut ApplyBatch,
        applied: Option<LogId>,
        entries: &[Entry],
    ) -> Result<(Vec<CommandResult>, Option<LogId>, Option<StoredMembership>)> {
        let mut results = Vec::with_capacity(entries.len());
        let mut last = None;
        let mut membership = None;
        for e in entries {
            if applied.as_ref().is_some_and(|a| e.log_id.index <= a.index) {
                results.push(CommandResult::Empty);
                continue;
            }
            let result = match &e.payload {
                EntryPayload::Blank => CommandResult::Empty,
                EntryPayload::Normal(cmd) => batch.execute(e.log_id.index, cmd)?,
                EntryPayload::Membership(m) => {
                    let stored = StoredMembership::new(Some(e.log_id), m.clone());
                    batch.set_membership(&stored)?;
                    membership = Some(stored);
                    CommandResult::Empty
                }
            };
            results.push(result);
            last = Some(e.log_id);
        }
        Ok((results, last, membership))
    }

    /// The newest snapshot file and its metadata. Blocking (reads the file's header).
    pub(crate) fn current_snapshot(&self) -> Result<Option<(SnapshotMeta, SnapshotData)>> {
        let Some(file) = self
            .snapshots
            .newest()
            .map_err(|e| Error::storage("find newest snapshot", e))?
        else {
            return Ok(None);
        };
        let meta: SnapshotMeta = codec::decode(&file.meta).map_err(|e| {
            Error::corrupt(format!("snapshot metadata of {}", file.path.display()), e)
        })?;
        Ok(Some((meta, SnapshotData::stored(file.path, file.bytes))))
    }

    /// Replaces the registry by the snapshot in `data`. Blocking.
    fn install(&self, meta: &SnapshotMeta, data: &SnapshotData) -> Result<()> {
        let started = Instant::now();
        // The snapshot supersedes the deferred writes, but an install that fails must leave
        // the registry at last-applied: commit them to the old generation first.
        self.commit_deferred()?;
        let (file_meta, _) = read_meta(data.path())?;
        if &file_meta != meta {
            return Err(Error::Snapshot(format!(
                "metadata mismatch: file says {file_meta}, installer was told {meta}"
            )));
        }
        let mut reader = SnapshotStore::open_reader(data.path())
            .map_err(|e| Error::storage("open snapshot", e))?;
        let own = data.path().parent() == Some(self.snapshots.dir());
        let mut copy = if own {
            None
        } else {
            let meta_bytes = codec::encode(meta).map_err(|e| Error::corrupt("snapshot meta", e))?;
            Some(
                self.snapshots
                    .create(&snapshot_name(meta), &meta_bytes, self.limiter.clone())
                    .map_err(|e| Error::storage("create snapshot copy", e))?,
            )
        };
        let replacement = self.registry.begin_replace()?;
        let imported = snapshot_format::import(
            &mut reader,
            replacement.tree(),
            meta,
            copy.as_mut().map(|w| w as &mut dyn io::Write),
        );
        let trailer = match imported {
            Ok(t) => t,
            Err(e) => {
                self.registry.abort_replace(replacement);
                return Err(e);
            }
        };
        if let Some(w) = copy {
            if let Err(e) = w.finish() {
                self.registry.abort_replace(replacement);
                return Err(Error::storage("finish snapshot copy", e));
            }
        }
        self.registry.finish_replace(replacement)?;
        self.set_last_snapshot(meta, data.payload_bytes());
        *self.applied.lock() = (meta.last_log_id, meta.last_membership.clone());
        self.replicas.store(trailer.replicas, Ordering::Relaxed);
        self.datanodes.store(trailer.datanodes, Ordering::Relaxed);
        self.stats.installed(started.elapsed());
        tracing::info!(
            "installed snapshot {meta}: {} datanodes, {} replicas, {} keys",
            trailer.datanodes,
            trailer.replicas,
            trailer.kvs
        );
        Ok(())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        Ok(self.shared.applied())
    }

    async fn apply<Strm>(&mut self, entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + Send,
    {
        let items: Vec<EntryResponder<TypeConfig>> = entries.try_collect().await?;
        let (entries, responders): (Vec<_>, Vec<_>) = items.into_iter().unzip();
        let heavy = is_heavy(&entries);
        let results = if !heavy && work(&entries) <= INLINE_APPLY_OPS && !self.shared.commit_due() {
            self.shared.apply_entries(&entries, false).map_err(to_io)?
        } else {
            let shared = self.shared.clone();
            blocking(move || shared.apply_entries(&entries, heavy)).await?
        };
        for (responder, result) in responders.into_iter().zip(results) {
            if let Some(r) = responder {
                r.send(result);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<SnapshotBuilder> {
        if !force && self.shared.building.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.get_snapshot_builder().await)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        // The capture must see every applied entry: commit the deferred batch first. A
        // failure is kept by the builder and reported when it builds.
        let shared = self.shared.clone();
        let committed = blocking(move || shared.commit_deferred()).await;
        SnapshotBuilder::start(self.shared.clone(), committed.err())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        let shared = self.shared.clone();
        let meta = meta.clone();
        blocking(move || shared.install(&meta, &snapshot)).await
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<TypeConfig, SnapshotData>>> {
        let shared = self.shared.clone();
        let current = blocking(move || shared.current_snapshot()).await?;
        Ok(current.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

impl Drop for SmShared {
    /// Commits applied writes still deferred, as sled flushes its buffers when dropped: a state
    /// machine dropped without a shutdown (the last handle of an in-process node) keeps what
    /// it applied. A crash loses them instead, and they are applied again from the log.
    fn drop(&mut self) {
        if let Err(e) = self.commit_deferred() {
            tracing::warn!("applied writes not committed when the state machine closed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::vote::leader_id_adv::LeaderId;

    use super::*;
    use crate::command::ShardReport;
    use openraft::storage::RaftSnapshotBuilder;

    /// A state machine whose deferred batch waits for an hour (or a reader), however slow the
    /// machine running the test.
    fn open(dir: &Path) -> StateMachine {
        let mut sm = StateMachine::open(
            &dir.join("registry"),
            &dir.join("snapshots"),
            1 << 20,
            2,
            Arc::new(RateLimiter::unlimited()),
        )
        .unwrap();
        Arc::get_mut(&mut sm.shared).unwrap().defer_max_age = Duration::from_secs(3600);
        sm
    }

    fn entry(index: u64, cmd: Command) -> Entry {
        Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Normal(cmd),
        }
    }

    /// A datanode, then one shard per entry, each applied alone; the kv `k` last.
    fn workload() -> Vec<Entry> {
        let mut out = vec![entry(
            1,
            Command::RegisterDatanode {
                id: 7,
                addr: "a".into(),
            },
        )];
        for i in 0..20u64 {
            out.push(entry(
                2 + i,
                Command::RegisterShards {
                    datanode: 7,
                    epoch: 1,
                    shards: vec![ShardReport {
                        id: i,
                        generation: 1,
                        size: 1,
                    }],
                },
            ));
        }
        out.push(entry(
            22,
            Command::Put {
                key: "k".into(),
                value: b"v".to_vec(),
                if_revision: None,
            },
        ));
        out
    }

    #[test]
    fn applied_writes_wait_in_memory_until_a_reader_commits_them() {
        let dir = tempfile::tempdir().unwrap();
        let sm = open(dir.path());
        let shared = sm.shared();
        let mut results = Vec::new();
        for e in workload() {
            results.extend(shared.apply_entries(&[e], false).unwrap());
        }
        // Every entry was answered from the batch (each shard was new), and the counters moved.
        let accepted =
            |r: &CommandResult| matches!(r, CommandResult::ShardsRegistered { accepted: 1, .. });
        assert_eq!(results.iter().filter(|r| accepted(r)).count(), 20);
        assert_eq!((shared.replicas(), shared.datanodes()), (20, 1));
        assert_eq!(shared.applied().0.map(|l| l.index), Some(22));
        // Nothing reached sled yet, and point reads see it all.
        assert!(shared.registry.content().unwrap().is_empty());
        assert_eq!(shared.shard(19).unwrap().unwrap().replicas.len(), 1);
        assert!(shared.shard(20).unwrap().is_none());
        assert_eq!(shared.datanode(7).unwrap().unwrap().shards, 20);
        assert_eq!(shared.kv_get("k").unwrap().unwrap().value, b"v");
        assert!(shared.kv_get("other").unwrap().is_none());
        shared.commit_deferred().unwrap();
        assert_eq!(
            shared.registry.shard(19).unwrap().unwrap().replicas.len(),
            1
        );
        assert!(shared.registry.kv_get("k").unwrap().is_some());
        // A deferred removal hides what the registry still holds.
        let gone = [
            entry(
                23,
                Command::DeregisterShards {
                    datanode: 7,
                    shards: vec![19],
                },
            ),
            entry(
                24,
                Command::Delete {
                    key: "k".into(),
                    if_revision: None,
                },
            ),
        ];
        shared.apply_entries(&gone, false).unwrap();
        assert!(shared.registry.shard(19).unwrap().is_some());
        assert!(shared.shard(19).unwrap().is_none());
        assert!(shared.kv_get("k").unwrap().is_none());
        assert_eq!(shared.datanode(7).unwrap().unwrap().shards, 19);
        shared.commit_deferred().unwrap();
        let content = shared.registry.content().unwrap();
        // Reopened, the registry holds the same state at the same last-applied.
        drop(shared);
        drop(sm);
        let sm = open(dir.path());
        assert_eq!(sm.shared().registry.content().unwrap(), content);
        assert_eq!(sm.shared().applied().0.map(|l| l.index), Some(24));
        assert_eq!((sm.shared().replicas(), sm.shared().datanodes()), (19, 1));
    }

    /// Entry `index`: datanode 7 (epoch 1) registers the shards `ids`.
    fn register(index: u64, ids: std::ops::Range<u64>) -> Entry {
        entry(
            index,
            Command::RegisterShards {
                datanode: 7,
                epoch: 1,
                shards: ids
                    .map(|id| ShardReport {
                        id,
                        generation: 1,
                        size: 1,
                    })
                    .collect(),
            },
        )
    }

    #[test]
    fn heavy_is_decided_per_entry() {
        let single = |index: u64| register(index, index..index + 1);
        // Sixty single-shard registrations in one call are light, however much they touch
        // together; one entry of a hundred shards is heavy, alone or among light ones.
        let light: Vec<Entry> = (1..=60).map(single).collect();
        assert!(work(&light) > HEAVY_ENTRY_OPS);
        assert!(!is_heavy(&light));
        let big = register(61, 1000..1100);
        assert!(is_heavy(std::slice::from_ref(&big)));
        let mut mixed = light.clone();
        mixed.push(big);
        assert!(is_heavy(&mixed));
    }

    #[test]
    fn a_heavy_apply_commits_the_deferred_batch_and_then_itself() {
        let dir = tempfile::tempdir().unwrap();
        let sm = open(dir.path());
        let shared = sm.shared();
        let entries = workload();
        for e in &entries[..5] {
            shared
                .apply_entries(std::slice::from_ref(e), false)
                .unwrap();
        }
        assert!(shared.registry.content().unwrap().is_empty());
        let heavy = register(23, 1000..1100);
        shared.apply_entries(&[heavy], true).unwrap();
        // Both are in the registry without a reader committing anything.
        assert!(shared.deferred.lock().is_none());
        assert!(shared.registry.shard(3).unwrap().is_some());
        assert!(shared.registry.shard(1099).unwrap().is_some());
        assert_eq!(shared.registry.current().replica_count().unwrap(), 104);
        assert_eq!(shared.applied().0.map(|l| l.index), Some(23));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_right_after_applies_holds_every_applied_entry() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open(a.path());
        for e in workload() {
            sm.shared().apply_entries(&[e], false).unwrap();
        }
        let snapshot = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(22));
        let other = open(b.path());
        let shared = other.shared();
        let meta = snapshot.meta.clone();
        tokio::task::spawn_blocking(move || shared.install(&meta, &snapshot.snapshot))
            .await
            .unwrap()
            .unwrap();
        let want = sm.shared().registry.content().unwrap();
        assert_eq!(want.len(), 1 + 1 + 1, "a datanode, one bucket, one key");
        assert_eq!(other.shared().registry.content().unwrap(), want);
        assert_eq!(
            (other.shared().replicas(), other.shared().datanodes()),
            (20, 1)
        );
    }
}
