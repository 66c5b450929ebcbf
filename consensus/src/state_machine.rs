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
//!   generation, keeps the file in the snapshot store (a received file is moved in; another
//!   node's file, or one on another file system, is copied; unpaced either way), and then
//!   switches to the new registry atomically; when it returns the switch is flushed to disk.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, TryStreamExt};
use meta_store::{RateLimiter, SnapshotStore};
use openraft::alias::SnapshotOf;
use openraft::storage::{EntryResponder, RaftStateMachine, Snapshot};
use openraft::EntryPayload;
use parking_lot::Mutex;

use crate::apply_batch::ApplyBatch;
use crate::build_pauses::{BuildPauses, FailedBuild};
use crate::build_room::BuildRoom;
use crate::change_feed::{ChangeFeed, DEFAULT_HISTORY};
use crate::cluster_version::BUILD_VERSION;
use crate::codec;
use crate::command::{Command, CommandResult};
use crate::error::{Error, Result};
use crate::generation::Generation;
use crate::keys;
use crate::rebuild_source::RebuildSource;
use crate::records::{DatanodeRecord, KvRecord};
use crate::registry::{datanode_info, kv_entry, Registry};
use crate::sm_stats::SmStats;
use crate::snapshot_builder::SnapshotBuilder;
use crate::snapshot_data::SnapshotData;
use crate::types::{Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::view::{DatanodeInfo, KvEntry, ShardInfo, SnapshotInfo};

/// An entry touching more records than this is heavy: its apply call commits the deferred batch
/// and then itself at once, on a blocking thread (a storm's 1,000-shard registrations).
const HEAVY_ENTRY_OPS: usize = 64;
/// An apply call of light entries touching more records than this in total runs on a blocking
/// thread (but still joins the deferred batch), and so does any call that finds the batch due.
/// A call on the async runtime never commits: a batch it makes due is committed by the next
/// call (on a blocking thread) or by a reader.
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
    /// What applied entries changed, for watchers.
    pub(crate) feed: ChangeFeed,
    applied: Mutex<(Option<LogId>, StoredMembership)>,
    replicas: AtomicU64,
    datanodes: AtomicU64,
    /// The cluster's version as applied (`cluster_version.rs`), and the highest this build
    /// applies (`NodeConfig::build_version`).
    cluster_version: AtomicU32,
    build_version: AtomicU32,
    /// The cluster's epoch floor as applied (for the status; the registry is the record).
    epoch_floor: AtomicU64,
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
    /// The newest snapshot's metadata and file, kept here so that openraft's requests for it
    /// open and list nothing (a node short of file descriptors must still answer them).
    current: Mutex<Option<(SnapshotMeta, SnapshotData)>>,
    /// Failed snapshot builds and requested ones: when automatic builds pause.
    pub(crate) builds: BuildPauses,
    /// Notified when the newest snapshot's file was found damaged: the node builds a new one.
    pub(crate) damaged: Arc<tokio::sync::Notify>,
    /// Where the open set aside newest snapshots that did not read back, newest first.
    pub(crate) set_aside: Vec<PathBuf>,
    /// The room builds leave on the disk (`build_room.rs`); none until the node sets it.
    pub(crate) build_room: std::sync::OnceLock<BuildRoom>,
    /// Tests: the next apply stops at this gate (`ApplyGate`).
    #[cfg(test)]
    pub(crate) apply_gate: Mutex<Option<ApplyGate>>,
}

/// Tests: holds openraft's state machine worker in an apply. The apply reports on `reached`
/// that it stopped, and goes on once `release` is sent to or dropped.
#[cfg(test)]
pub(crate) struct ApplyGate {
    pub(crate) reached: tokio::sync::oneshot::Sender<()>,
    pub(crate) release: tokio::sync::oneshot::Receiver<()>,
}

/// The registry state machine handed to openraft.
pub struct StateMachine {
    shared: Arc<SmShared>,
    /// Dropped with the state machine: tells [`StateMachine::released`]'s receiver that
    /// openraft's worker, which owns it, stopped.
    release: Option<tokio::sync::oneshot::Sender<()>>,
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
    /// Builds a snapshot of the registry as it is, before Raft starts (`what` names it in
    /// errors), and answers the last entry it holds. On return the snapshot is durable and the
    /// newest.
    pub(crate) async fn snapshot_before_raft(&mut self, what: &str) -> Result<Option<LogId>> {
        use openraft::storage::RaftSnapshotBuilder;
        let built = self
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .map_err(|e| Error::Raft(format!("snapshot {what}: {e}")))?;
        Ok(built.meta.last_log_id)
    }

    /// Opens the registry in `registry_dir` and the snapshot store in `snapshot_dir`, for a log
    /// purged up to entry `purged` (`None`: never purged). Blocking (opens files). The snapshot
    /// store opens first: a registry that is not to be reopened is deleted only when the newest
    /// snapshot reaches `purged` (see `rebuild_source.rs`), and a newest snapshot whose ends
    /// do not read back is set aside before then.
    pub fn open(
        purged: Option<u64>,
        registry_dir: &Path,
        snapshot_dir: &Path,
        cache_bytes: u64,
        snapshots_to_keep: usize,
        limiter: Arc<RateLimiter>,
    ) -> Result<StateMachine> {
        let snapshots = SnapshotStore::open(snapshot_dir, snapshots_to_keep)
            .map_err(|e| Error::storage("open snapshot store", e))?;
        // A newest snapshot whose ends do not read back (a copy cut short) is set aside, kept
        // for the operator: the checks below say whether the rest suffices.
        let (newest, set_aside) = snapshots
            .newest_setting_aside_damaged()
            .map_err(|e| Error::storage("find newest snapshot", e))?;
        let current = newest
            .map(|f| -> Result<(SnapshotMeta, SnapshotData)> {
                let meta: SnapshotMeta = codec::decode(&f.meta).map_err(|e| {
                    Error::corrupt(format!("snapshot metadata of {}", f.path.display()), e)
                })?;
                Ok((meta, SnapshotData::stored(f.path, f.bytes)))
            })
            .transpose()?;
        let source = RebuildSource {
            purged,
            snapshot: current
                .as_ref()
                .and_then(|(meta, _)| meta.last_log_id.map(|l| l.index)),
            snapshot_file: current.as_ref().map(|(_, data)| data.path().to_path_buf()),
            set_aside: set_aside.clone(),
        };
        let registry = Registry::open_rebuildable(registry_dir, cache_bytes, &source)?;
        let gen = registry.current();
        let applied = gen.applied()?;
        let replicas = gen.replica_count()?;
        let cluster_version = gen.cluster_version()?;
        let epoch_floor = gen.epoch_floor()?;
        drop(gen);
        let datanodes = registry.datanode_count()?;
        let feed = ChangeFeed::new(applied.0.map_or(0, |l| l.index), DEFAULT_HISTORY);
        Ok(StateMachine {
            shared: Arc::new(SmShared {
                registry,
                snapshots,
                limiter,
                stats: SmStats::default(),
                feed,
                applied: Mutex::new(applied),
                replicas: AtomicU64::new(replicas),
                datanodes: AtomicU64::new(datanodes),
                cluster_version: AtomicU32::new(cluster_version),
                build_version: AtomicU32::new(BUILD_VERSION),
                epoch_floor: AtomicU64::new(epoch_floor),
                deferred: Mutex::new(None),
                failed: AtomicBool::new(false),
                defer_max_age: DEFER_MAX_AGE,
                building: AtomicUsize::new(0),
                closing: AtomicBool::new(false),
                current: Mutex::new(current),
                builds: BuildPauses::default(),
                damaged: Arc::default(),
                set_aside,
                build_room: std::sync::OnceLock::new(),
                #[cfg(test)]
                apply_gate: Mutex::new(None),
            }),
            release: None,
        })
    }

    /// A receiver that completes (with an error: nothing is ever sent) once this state machine
    /// is dropped. openraft's state machine worker owns it and outlives the Raft core: it
    /// still applies what was queued for it, then drops it.
    pub(crate) fn released(&mut self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.release = Some(tx);
        rx
    }

    pub(crate) fn shared(&self) -> Arc<SmShared> {
        self.shared.clone()
    }

    /// Makes this state machine one of a build of `version` (tests play older builds): it
    /// refuses to apply, or install, a cluster version above it.
    pub fn set_build_version(&self, version: u32) {
        self.shared.build_version.store(version, Ordering::Relaxed);
    }

    /// Makes snapshot builds stop short of filling the disk (see `build_room.rs`).
    pub(crate) fn set_build_room(&self, room: BuildRoom) {
        let _ = self.shared.build_room.set(room);
    }
}

/// How much work an entry is, in records touched.
fn weight(e: &Entry) -> usize {
    match &e.payload {
        EntryPayload::Normal(Command::RegisterShards { shards, .. }) => shards.len() * 2 + 1,
        EntryPayload::Normal(
            Command::DeregisterShards { shards, .. } | Command::DeregisterShardsOf { shards, .. },
        ) => shards.len() * 2 + 1,
        // Their work is not in the entry: up to a datanode's every replica, or a piece's 1,024
        // buckets. Heavy: on a blocking thread, without holding the deferred batch.
        EntryPayload::Normal(
            Command::RemoveDatanode { .. }
            | Command::PruneReplicas { .. }
            | Command::RemoveDatanodePiece { .. },
        ) => HEAVY_ENTRY_OPS + 1,
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

/// How an apply call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// On the async runtime: joins the deferred batch and never commits it.
    Inline,
    /// On a blocking thread: joins the deferred batch and commits it when due.
    Deferred,
    /// On a blocking thread: commits the deferred batch, then executes and commits on its own.
    Heavy,
}

/// How an apply call of `entries` runs; `due` is whether the deferred batch is due.
fn mode(entries: &[Entry], due: bool) -> Mode {
    if is_heavy(entries) {
        Mode::Heavy
    } else if due || work(entries) > INLINE_APPLY_OPS {
        Mode::Deferred
    } else {
        Mode::Inline
    }
}

impl SmShared {
    /// The cluster's version as applied here (`cluster_version.rs`).
    pub(crate) fn cluster_version(&self) -> u32 {
        self.cluster_version.load(Ordering::Acquire)
    }

    /// The cluster's epoch floor as applied here (`Command::RaiseEpochFloor`), 0 until first
    /// raised.
    pub(crate) fn epoch_floor(&self) -> u64 {
        self.epoch_floor.load(Ordering::Acquire)
    }

    /// [`Error::BuildTooOld`] if this build cannot apply a log or registry of cluster version
    /// `cluster`.
    pub(crate) fn check_build(&self, cluster: u32) -> Result<()> {
        let build = self.build_version.load(Ordering::Relaxed);
        if cluster > build {
            return Err(Error::BuildTooOld { build, cluster });
        }
        Ok(())
    }

    /// Last applied log id and membership.
    pub(crate) fn applied(&self) -> (Option<LogId>, StoredMembership) {
        self.applied.lock().clone()
    }

    /// The newest snapshot this node built or installed.
    pub(crate) fn last_snapshot(&self) -> Option<SnapshotInfo> {
        self.current
            .lock()
            .as_ref()
            .map(|(meta, data)| SnapshotInfo {
                index: meta.last_log_id.as_ref().map(|l| l.index).unwrap_or(0),
                bytes: data.payload_bytes(),
            })
    }

    /// Records a snapshot that is durable in the snapshot store as the current one, unless a
    /// newer one is (a build that began before a newer snapshot was installed).
    pub(crate) fn set_current_snapshot(&self, meta: &SnapshotMeta, data: SnapshotData) {
        let mut current = self.current.lock();
        if current
            .as_ref()
            .is_some_and(|(newest, _)| newest.last_log_id > meta.last_log_id)
        {
            return;
        }
        *current = Some((meta.clone(), data));
    }

    /// Records a failed snapshot build (and counts it); returns how long automatic builds now
    /// pause.
    pub(crate) fn build_failed(&self, why: FailedBuild) -> Duration {
        self.stats.build_failed();
        self.builds.failed(why, Instant::now())
    }

    /// The newest snapshot file and its metadata. Does no IO: the file is kept from when it
    /// was built, installed or found at open, and retention never deletes the newest.
    pub(crate) fn current_snapshot(&self) -> Option<(SnapshotMeta, SnapshotData)> {
        self.current.lock().clone()
    }

    /// Reads the newest snapshot's file whole, off the caller's path, when it is asked for (to
    /// be sent) and was not read lately (`SnapshotData::verify`): a file whose bits rotted on
    /// disk since it was written would be sent, and refused by every member, for ever. One
    /// found damaged is reported ([`SmShared::report_damage`]); meanwhile it is still handed
    /// out, and refused.
    pub(crate) fn check_in_background(&self, data: &SnapshotData) {
        if !data.claim_check() {
            return;
        }
        let data = data.clone();
        let damaged = self.damaged.clone();
        tokio::task::spawn_blocking(move || {
            let found = data.verify();
            data.end_check();
            if let Err(why) = found {
                report_damage(&damaged, &data, &why);
            }
        });
    }

    /// Logs that the newest snapshot's file is damaged (`why`) and notifies
    /// [`SmShared::damaged`], so that the node builds a new one, which the builder does even at
    /// the same log index (it reuses a file only if `SnapshotData::verify` finds it sound).
    pub(crate) fn report_damage(&self, data: &SnapshotData, why: &str) {
        report_damage(&self.damaged, data, why);
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
        self.commit_taken(deferred.take())
    }

    fn commit_taken(&self, deferred: Option<Deferred>) -> Result<()> {
        let Some(d) = deferred else {
            return Ok(());
        };
        let committed = d.batch.finish().and_then(|w| d.generation.commit(w));
        if committed.is_err() {
            self.fail();
        }
        committed
    }

    /// Whether a commit of the deferred batch failed: the node serves nothing more until it
    /// restarts (and rebuilds the registry).
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Applying failed part way: refuse to apply or read further, and have the next start
    /// rebuild the registry rather than trust what sled kept of it.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.registry.distrust();
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
                let Some(Some(r)) = pending else {
                    return Ok(pending.map(|_| None));
                };
                // A command that writes the mark writes the record too, but not always the
                // other way round: a mark the batch does not write is as in the registry.
                let mark_key = keys::epoch_floor(id);
                let mark = match batch.pending::<u64>(&mark_key, "removal mark")? {
                    Some(mark) => mark,
                    None => self.registry.removal_mark(id)?,
                };
                Ok(Some(Some(datanode_info(id, r, mark))))
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

    /// Applies `entries` into the deferred batch, committing it when due (not [`Mode::Inline`],
    /// which leaves a due batch to the next call) or at a membership change; returns one result
    /// per entry. A [`Mode::Heavy`] call (much work, as in a registration storm) instead
    /// commits the deferred batch and then executes and commits on its own, without holding
    /// the batch's lock: point reads meanwhile read the registry (each key old or new) instead
    /// of waiting for the whole execution. Blocking (sled), but an inline call does no commit.
    fn apply_entries(&self, entries: &[Entry], mode: Mode) -> Result<Vec<CommandResult>> {
        let started = Instant::now();
        let mut deferred = self.deferred.lock();
        self.check_failed()?;
        let (applied, _) = self.applied();
        if mode == Mode::Heavy {
            self.commit_taken(deferred.take())?;
            drop(deferred);
            let generation = self.registry.current();
            let mut batch = ApplyBatch::resuming(generation.tree.clone(), self.replicas(), applied);
            let (results, last, membership) = self
                .execute(&mut batch, applied, entries)
                .inspect_err(|_| self.fail())?;
            let Some(last) = last else {
                return Ok(results);
            };
            batch.set_applied(&last);
            let changes = batch.take_changes();
            let (replicas, added) = (batch.replicas(), batch.datanodes_delta());
            let deferred = Deferred {
                generation,
                batch,
                since: started,
            };
            self.commit_taken(Some(deferred))?;
            self.publish(last, membership, replicas, added);
            self.feed.record(changes, last.index);
            self.stats.applied(entries.len(), started.elapsed());
            return Ok(results);
        }
        let d = match deferred.as_mut() {
            Some(d) => d,
            None => {
                // Seeded with last-applied: committed before it executes anything (every entry
                // of this call was applied already), the batch keeps last-applied.
                let generation = self.registry.current();
                let batch = ApplyBatch::resuming(generation.tree.clone(), self.replicas(), applied);
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
                self.fail();
                return Err(e);
            }
        };
        let Some(last) = last else {
            return Ok(results);
        };
        d.batch.set_applied(&last);
        let changes = d.batch.take_changes();
        let replicas = d.batch.replicas();
        let added = d.batch.datanodes_delta() - datanodes_before;
        let due = mode != Mode::Inline && d.due(started, self.defer_max_age);
        if membership.is_some() || due {
            self.commit_taken(deferred.take())?;
        }
        self.publish(last, membership, replicas, added);
        // Under the batch's lock still: events are recorded in log order.
        self.feed.record(changes, last.index);
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
                EntryPayload::Normal(cmd) => {
                    // A member whose build is older stops at the raise past its version, before
                    // it meets a command it cannot decode (the leader raised the version while
                    // it ran a newer build). Any other command past it is never met: the leader
                    // proposes one only in a cluster of its version.
                    self.check_build(cmd.required_version())?;
                    let result = batch.execute(e.log_id.index, cmd)?;
                    if let Command::SetClusterVersion { version } = cmd {
                        self.cluster_version.fetch_max(*version, Ordering::AcqRel);
                    }
                    if let CommandResult::EpochFloor { floor } = result {
                        self.epoch_floor.fetch_max(floor, Ordering::AcqRel);
                    }
                    result
                }
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
        #[cfg(test)]
        {
            let gate = self.shared.apply_gate.lock().take();
            if let Some(gate) = gate {
                let _ = gate.reached.send(());
                let _ = gate.release.await;
            }
        }
        let (entries, responders): (Vec<_>, Vec<_>) = items.into_iter().unzip();
        let mode = mode(&entries, self.shared.commit_due());
        let results = if mode == Mode::Inline {
            self.shared.apply_entries(&entries, mode).map_err(to_io)?
        } else {
            let shared = self.shared.clone();
            blocking(move || shared.apply_entries(&entries, mode)).await?
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
        // After a failed build, automatic ones pause; a requested one still runs.
        if !self.shared.builds.may_build(force, Instant::now()) {
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
        let current = self.shared.current_snapshot();
        if let Some((_, data)) = &current {
            self.shared.check_in_background(data);
        }
        Ok(current.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

fn report_damage(damaged: &tokio::sync::Notify, data: &SnapshotData, why: &str) {
    tracing::error!(
        "the newest snapshot {} is damaged ({why}); building a new one, which the members that \
         need a snapshot get instead",
        data.path().display()
    );
    damaged.notify_one();
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

mod settings;
mod snapshot_install;

#[cfg(test)]
mod batching_tests;
#[cfg(test)]
mod capture_tests;
#[cfg(test)]
mod tests;
