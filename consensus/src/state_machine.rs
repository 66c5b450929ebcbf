//! The Raft state machine: applies committed registry commands to the sled registry, builds
//! snapshots from a point-in-time capture and installs received ones.
//!
//! Contracts:
//! - `apply` writes all entries of the call, their last log id and the newest membership as
//!   ONE atomic sled batch, then answers the waiting clients. Nothing is flushed on this path:
//!   sled flushes in the background, and after a crash openraft re-applies from the stored
//!   last-applied up to the committed id recorded in the log. Entries at or below the stored
//!   last-applied are skipped, so re-applying is idempotent.
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
use std::time::Instant;

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
use crate::registry::Registry;
use crate::sm_stats::SmStats;
use crate::snapshot_builder::SnapshotBuilder;
use crate::snapshot_data::{read_meta, snapshot_name, SnapshotData};
use crate::snapshot_format;
use crate::types::{Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::view::SnapshotInfo;

/// Apply calls with more work than this (in records touched) run on a blocking thread.
const INLINE_APPLY_OPS: usize = 64;

/// State shared by the state machine (owned by openraft), its snapshot builders and the node.
pub(crate) struct SmShared {
    pub(crate) registry: Registry,
    pub(crate) snapshots: SnapshotStore,
    pub(crate) limiter: Arc<RateLimiter>,
    pub(crate) stats: SmStats,
    applied: Mutex<(Option<LogId>, StoredMembership)>,
    replicas: AtomicU64,
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
        Ok(StateMachine {
            shared: Arc::new(SmShared {
                registry,
                snapshots,
                limiter,
                stats: SmStats::default(),
                applied: Mutex::new(applied),
                replicas: AtomicU64::new(replicas),
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
        EntryPayload::Normal(Command::RemoveDatanode { .. }) => INLINE_APPLY_OPS,
        _ => 1,
    }
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

    /// Applies `entries` as one atomic batch; returns one result per entry. Blocking (sled).
    fn apply_entries(&self, entries: &[Entry]) -> Result<Vec<CommandResult>> {
        let started = Instant::now();
        let (applied, _) = self.applied();
        let gen = self.registry.current();
        let mut batch = ApplyBatch::new(&gen.tree, self.replicas());
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
        let Some(last) = last else {
            return Ok(results);
        };
        batch.set_applied(&last);
        let replicas = batch.replicas();
        gen.commit(batch.finish()?)?;
        {
            let mut a = self.applied.lock();
            a.0 = Some(last);
            if let Some(m) = membership {
                a.1 = m;
            }
        }
        self.replicas.store(replicas, Ordering::Relaxed);
        self.stats.applied(entries.len(), started.elapsed());
        Ok(results)
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
        let work: usize = entries.iter().map(weight).sum();
        let results = if work <= INLINE_APPLY_OPS {
            self.shared.apply_entries(&entries).map_err(to_io)?
        } else {
            let shared = self.shared.clone();
            blocking(move || shared.apply_entries(&entries)).await?
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
        SnapshotBuilder::start(self.shared.clone())
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
