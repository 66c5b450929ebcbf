//! Builds a snapshot of the registry at a recorded last-applied without stalling `apply`.
//!
//! [`SnapshotBuilder::start`] runs on the state machine's worker between two applies: it
//! records last-applied and membership and starts a capture (O(1)). `build_snapshot` then
//! exports on a blocking thread through the `meta-store` snapshot writer, paced by the
//! node's rate limiter, while `apply` continues; the capture keeps the export at the
//! recorded point (see `capture.rs`).
//!
//! An export that fails (a full disk, a failing snapshot directory) does not stop the node:
//! openraft treats a builder's error as fatal, but the log still holds every entry after the
//! newest snapshot, so the builder logs the failure and answers with that snapshot, or with "no
//! snapshot" (empty metadata) when none was built yet. openraft ignores a snapshot that is not
//! newer than its own: it keeps its snapshot and purges nothing. Automatic builds pause (10 s,
//! doubling up to 5 min; `build_pauses.rs`) until one succeeds.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use openraft::alias::SnapshotOf;
use openraft::storage::{RaftSnapshotBuilder, Snapshot};

use crate::build_pauses::FailedBuild;
use crate::build_room::BuildRoom;
use crate::capture::Capture;
use crate::codec;
use crate::error::{Error, Result};
use crate::generation::Generation;
use crate::snapshot_data::{snapshot_name, SnapshotData};
use crate::snapshot_format;
use crate::state_machine::SmShared;
use crate::types::{SnapshotMeta, TypeConfig};

/// A snapshot in the making: the point it captures and the capture keeping it.
pub struct SnapshotBuilder {
    shared: Arc<SmShared>,
    meta: SnapshotMeta,
    /// The registry generation the capture reads, and the capture; given up together, so that
    /// a generation retired meanwhile (by an install) can be dropped at once.
    captured: Option<(Arc<Generation>, Arc<Capture>)>,
    /// Why the state could not be captured (committing the deferred batch failed).
    failed: Option<String>,
}

impl SnapshotBuilder {
    /// Captures the current state. Called with `apply` not running (on the state machine),
    /// after the deferred batch was committed; `failed` is that commit's error, if any.
    pub(crate) fn start(shared: Arc<SmShared>, failed: Option<io::Error>) -> SnapshotBuilder {
        let started = Instant::now();
        shared.building.fetch_add(1, Ordering::AcqRel);
        let (last_log_id, last_membership) = shared.applied();
        let generation = shared.registry.current();
        let capture = generation.start_capture();
        shared.stats.builder_started(started.elapsed());
        SnapshotBuilder {
            shared,
            meta: SnapshotMeta {
                last_log_id,
                last_membership,
            },
            captured: Some((generation, capture)),
            failed: failed.map(|e| e.to_string()),
        }
    }

    fn release(&mut self) {
        if let Some((generation, capture)) = self.captured.take() {
            generation.end_capture(&capture);
            // Let go of the generation before collecting: it may be a retired one.
            drop(generation);
            self.shared.building.fetch_sub(1, Ordering::AcqRel);
            self.shared.registry.collect_garbage();
        }
    }

    /// Exports the captured state to a durable snapshot file. Blocking.
    fn build(&mut self) -> Result<(SnapshotMeta, SnapshotData)> {
        let started = Instant::now();
        if let Some(why) = self.failed.take() {
            self.release();
            return Err(Error::Raft(format!("snapshot not captured: {why}")));
        }
        if let Some((meta, data)) = self.shared.current_snapshot() {
            // The file is reused only if it reads back whole (a rotted one is built again).
            let sound = || match data.verify_now() {
                Ok(()) => true,
                Err(why) => {
                    self.shared.report_damage(&data, &why);
                    false
                }
            };
            if meta.last_log_id == self.meta.last_log_id && sound() {
                self.release();
                return Ok((meta, data));
            }
        }
        match self.export(started) {
            Ok(built) => {
                self.shared.builds.succeeded();
                Ok(built)
            }
            Err(e) => {
                self.release();
                if self.shared.closing.load(Ordering::Acquire) {
                    return Err(e);
                }
                match self.shared.current_snapshot() {
                    Some(older) => {
                        self.failed_with(&e, &format!("snapshot {} stands in", older.0));
                        Ok(older)
                    }
                    None => {
                        self.failed_with(&e, "there is no snapshot yet; the log keeps everything");
                        Ok((SnapshotMeta::default(), SnapshotData::absent()))
                    }
                }
            }
        }
    }

    /// Records a failed build and logs it, with what answers in its place.
    fn failed_with(&self, e: &Error, instead: &str) {
        let pause = self.shared.build_failed(FailedBuild::of(e));
        tracing::error!(
            "building snapshot {} failed: {e}; {instead}, and automatic builds pause for \
             {pause:?}",
            snapshot_name(&self.meta)
        );
    }

    /// Writes the captured state to a new snapshot file. Blocking.
    fn export(&mut self, started: Instant) -> Result<(SnapshotMeta, SnapshotData)> {
        let (generation, capture) = self.captured.clone().expect("a builder builds once");
        let meta_bytes =
            codec::encode(&self.meta).map_err(|e| Error::corrupt("snapshot meta", e))?;
        let mut writer = self
            .shared
            .snapshots
            .create(
                &snapshot_name(&self.meta),
                &meta_bytes,
                self.shared.limiter.clone(),
            )
            .map_err(|e| Error::storage("create snapshot", e))?;
        snapshot_format::export(
            &generation.tree,
            &capture,
            &mut BuildRoom::guard(self.shared.build_room.get(), &mut writer),
            &self.shared.closing,
        )?;
        drop((generation, capture));
        self.release();
        let file = writer
            .finish()
            .map_err(|e| Error::storage("finish snapshot", e))?;
        self.shared.stats.built(file.bytes, started.elapsed());
        let data = SnapshotData::stored(file.path, file.bytes);
        self.shared.set_current_snapshot(&self.meta, data.clone());
        tracing::info!(
            "built snapshot {} ({} bytes) in {:?}",
            file.name,
            file.bytes,
            started.elapsed()
        );
        Ok((self.meta.clone(), data))
    }
}

impl Drop for SnapshotBuilder {
    fn drop(&mut self) {
        self.release();
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<TypeConfig, SnapshotData>> {
        let mut this = SnapshotBuilder {
            shared: self.shared.clone(),
            meta: self.meta.clone(),
            captured: self.captured.take(),
            failed: self.failed.take(),
        };
        let (meta, snapshot) = tokio::task::spawn_blocking(move || this.build())
            .await
            .map_err(|e| io::Error::other(format!("snapshot build task failed: {e}")))?
            .map_err(io::Error::from)?;
        Ok(Snapshot { meta, snapshot })
    }
}
