//! Installing a snapshot: the registry replaced by the snapshot's, in a fresh generation that
//! becomes the active one only once every record was imported and checked.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use meta_store::RateLimiter;

use super::SmShared;
use crate::codec;
use crate::error::{Error, Result};
use crate::snapshot_data::{open_verified, same_file_system, snapshot_name, SnapshotData};
use crate::snapshot_format;
use crate::types::SnapshotMeta;

impl SmShared {
    /// Replaces the registry by the snapshot in `data`. Blocking.
    ///
    /// Contract: on `Ok` the registry is the snapshot's, at its last log id. On an error of
    /// the registry (sled failed a write: a full disk, say) the state machine refuses to apply
    /// or read further and the next start rebuilds the registry, as after a failed apply:
    /// what sled kept of the writes before the failure cannot be trusted. On other errors (a
    /// corrupt snapshot, a cluster version past this build) the registry is as it was.
    pub(super) fn install(&self, meta: &SnapshotMeta, data: &SnapshotData) -> Result<()> {
        let installed = self.replace_registry(meta, data);
        if let Err(Error::Registry { .. }) = &installed {
            self.fail();
        }
        installed
    }

    /// The body of [`SmShared::install`].
    fn replace_registry(&self, meta: &SnapshotMeta, data: &SnapshotData) -> Result<()> {
        let started = Instant::now();
        // The snapshot supersedes the deferred writes, but an install that fails must leave
        // the registry at last-applied: commit them to the old generation first.
        self.commit_deferred()?;
        let (file_meta, mut reader) = open_verified(data.path())?;
        if &file_meta != meta {
            return Err(Error::Snapshot(format!(
                "metadata mismatch: file says {file_meta}, installer was told {meta}"
            )));
        }
        // A snapshot from elsewhere is kept in the snapshot store: a received one is taken in
        // by rename once imported, when it is on the store's file system; any other file (not
        // this node's to move) is copied as it is read. Neither is paced: the limiter paces
        // exports, and a member installing a snapshot is catching up, which it should do as
        // fast as its disk allows.
        let own = data.path().parent() == Some(self.snapshots.dir());
        let adopt =
            !own && data.is_received() && same_file_system(data.path(), self.snapshots.dir());
        let mut copy = if own || adopt {
            None
        } else {
            let meta_bytes = codec::encode(meta).map_err(|e| Error::corrupt("snapshot meta", e))?;
            let unpaced = Arc::new(RateLimiter::unlimited());
            Some(
                self.snapshots
                    .create(&snapshot_name(meta), &meta_bytes, unpaced)
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
        let checked = imported.and_then(|t| {
            let version = replacement.cluster_version()?;
            self.check_build(version)?;
            Ok((t, version, replacement.epoch_floor()?))
        });
        let (trailer, cluster_version, epoch_floor) = match checked {
            Ok(x) => x,
            Err(e) => {
                self.registry.abort_replace(replacement);
                return Err(e);
            }
        };
        let stored = match copy {
            None if adopt => match self.snapshots.adopt(data.path(), &snapshot_name(meta)) {
                Ok(file) => SnapshotData::stored(file.path, file.bytes),
                Err(e) => {
                    self.registry.abort_replace(replacement);
                    return Err(Error::storage("keep received snapshot", e));
                }
            },
            None => data.clone(),
            Some(w) => match w.finish() {
                Ok(file) => SnapshotData::stored(file.path, file.bytes),
                Err(e) => {
                    self.registry.abort_replace(replacement);
                    return Err(Error::storage("finish snapshot copy", e));
                }
            },
        };
        self.registry.finish_replace(replacement)?;
        self.set_current_snapshot(meta, stored);
        *self.applied.lock() = (meta.last_log_id, meta.last_membership.clone());
        self.feed
            .restart_at(meta.last_log_id.as_ref().map_or(0, |l| l.index));
        self.replicas.store(trailer.replicas, Ordering::Relaxed);
        self.datanodes.store(trailer.datanodes, Ordering::Relaxed);
        self.cluster_version
            .store(cluster_version, Ordering::Release);
        self.epoch_floor.store(epoch_floor, Ordering::Release);
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
