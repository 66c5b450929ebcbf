//! Snapshots on request, for backup downloads, and as received from a leader.

use std::path::PathBuf;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::raft::SnapshotResponse;

use super::{blocking, MetaNode};
use crate::error::{Error, Result};
use crate::snapshot_data::SnapshotData;
use crate::snapshot_format::ImportRecords;
use crate::types::{TypeConfig, Vote};
use crate::uncancelled::uncancelled;
use crate::view::SnapshotInfo;

/// How often [`MetaNode::snapshot_now`] asks again for a build while none covers what it waits
/// for.
const RETRIGGER: std::time::Duration = std::time::Duration::from_millis(250);

/// How often [`MetaNode::snapshot_now`] looks whether a snapshot built again at the same index
/// (to replace a damaged file) has landed.
const REBUILD_POLL: std::time::Duration = std::time::Duration::from_millis(20);

impl MetaNode {
    /// Builds a new snapshot whenever the state machine finds the newest one's file damaged
    /// (`SmShared::check_in_background`), until the node closes.
    pub(super) fn rebuild_damaged_snapshots(&self) {
        let damaged = self.inner.sm.damaged.clone();
        let mut closing = self.inner.closing.subscribe();
        // A weak handle: the task must not keep a node that shut down alive.
        let inner = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = damaged.notified() => {}
                    _ = closing.wait_for(|c| *c) => return,
                }
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                if let Err(e) = inner.raft.trigger().snapshot().await {
                    tracing::warn!("asking for a snapshot to replace a damaged one: {e}");
                }
            }
        });
    }

    /// Builds a snapshot of everything applied so far (or returns the newest one if it is
    /// already that recent) and returns once it is durable.
    pub async fn snapshot_now(&self) -> Result<SnapshotInfo> {
        self.check_open()?;
        let raft = &self.inner.raft;
        // The state machine's own last-applied, not openraft's metrics, which may not yet show
        // a write already answered: the snapshot must cover every write answered before.
        let applied = self.inner.sm.applied().0;
        let asked = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + self.inner.cfg.install_snapshot_timeout;
        let mut triggered: Option<tokio::time::Instant> = None;
        // A newest snapshot that is to stand for this one must read back whole: one that rotted
        // on disk is built again at the same index (a new file).
        let mut rotted = if raft.metrics().borrow_watched().snapshot >= applied {
            self.rotted_snapshot().await?
        } else {
            None
        };
        loop {
            if let Some(old) = &rotted {
                let current = self.inner.sm.current_snapshot();
                if current.is_some_and(|(_, data)| !data.same_file_as(old)) {
                    rotted = None;
                }
            }
            if rotted.is_none() && raft.metrics().borrow_watched().snapshot >= applied {
                break;
            }
            // A build that failed while an older snapshot stands in does not advance the
            // metrics: report it rather than wait for the timeout.
            if let Some(failed) = self.inner.sm.builds.failed_since(asked) {
                return Err(failed.into_error());
            }
            self.check_open()?;
            // openraft drops a trigger that arrives while a build runs, and that build may
            // end short of `applied`: ask again until one covers it (a dropped one costs
            // nothing).
            if triggered.is_none_or(|at| at.elapsed() >= RETRIGGER) {
                self.inner.sm.builds.request();
                let raft = raft.clone();
                uncancelled(async move { raft.trigger().snapshot().await })
                    .await
                    .map_err(|e| self.fatal(e))?;
                triggered = Some(tokio::time::Instant::now());
            }
            match rotted {
                // A build at the same index changes no metric: look again in a moment.
                Some(_) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::Timeout);
                    }
                    tokio::time::sleep(REBUILD_POLL).await;
                }
                None => self.await_metrics_change(deadline).await?,
            }
        }
        self.inner
            .sm
            .last_snapshot()
            .ok_or_else(|| Error::Snapshot("no snapshot after building one".into()))
    }

    /// The newest snapshot's file if it no longer reads back whole (reported, so that a new
    /// one is built), read now on a blocking thread.
    async fn rotted_snapshot(&self) -> Result<Option<SnapshotData>> {
        let Some((_, data)) = self.inner.sm.current_snapshot() else {
            return Ok(None);
        };
        let read = data.clone();
        match blocking(move || Ok(read.verify_now())).await? {
            Ok(()) => Ok(None),
            Err(why) => {
                self.inner.sm.report_damage(&data, &why);
                Ok(Some(data))
            }
        }
    }

    /// The newest complete snapshot file (for a backup download). Does no IO here; a file not
    /// read whole in the last second is then read in the background, and one found damaged is
    /// replaced by a new build (the download itself is checked by whoever reads it: the
    /// binary's `snapshot save` does).
    pub fn newest_snapshot_file(&self) -> Option<PathBuf> {
        let (_, data) = self.inner.sm.current_snapshot()?;
        self.inner.sm.check_in_background(&data);
        Some(data.path().to_path_buf())
    }

    /// Creates an empty file, in this node's data dir, for a snapshot a leader streams to it.
    /// The transport writes the snapshot file's bytes into it as received, then passes it to
    /// [`MetaNode::install_received_snapshot`]. Dropping it deletes the file. The file is
    /// created on a blocking thread.
    pub async fn snapshot_receive_file(&self) -> Result<tempfile::TempPath> {
        let dir = self.inner.incoming.clone();
        blocking(move || {
            tempfile::Builder::new()
                .prefix("incoming-")
                .tempfile_in(&dir)
                .map(|f| f.into_temp_path())
                .map_err(|e| Error::io("create incoming snapshot file", &dir, e))
        })
        .await
    }

    /// Admits a snapshot of the leader whose vote is `vote` ([`Self::admit_leader`]): `None` to
    /// go on and install it, the answer for the leader when this node, rejoining, learned that
    /// it was deposed (a higher vote: nothing is installed), [`Error::Rejoining`] while it may
    /// not acknowledge that leader yet.
    pub async fn admit_snapshot(
        &self,
        vote: &Vote,
    ) -> Result<Option<SnapshotResponse<TypeConfig>>> {
        match self.admit_leader(vote).await {
            Ok(()) => Ok(None),
            Err(Error::Deposed { higher, .. }) => Ok(Some(SnapshotResponse::new(higher))),
            Err(e) => Err(e),
        }
    }

    /// Verifies a received snapshot file completely and hands it to Raft, which installs it
    /// if `vote` is still current (replacing the registry atomically). Answers like
    /// `Raft::install_full_snapshot`, or [`Error::NoRoomForSnapshot`] (the file deleted,
    /// nothing else changed) when the data dir lacks room to install it, or
    /// [`Error::Rejoining`] (nothing installed) while this node may not acknowledge that leader
    /// yet; a leader it learned was deposed is answered with a higher vote (nothing installed).
    pub async fn install_received_snapshot(
        &self,
        vote: Vote,
        file: tempfile::TempPath,
    ) -> Result<SnapshotResponse<TypeConfig>> {
        self.check_open()?;
        if let Some(answer) = self.admit_snapshot(&vote).await? {
            return Ok(answer);
        }
        let node = self.clone();
        let (meta, data) = blocking(move || {
            let meta = std::fs::metadata(&file)
                .map_err(|e| Error::io("read received snapshot size", file.to_path_buf(), e))?;
            // What the file takes of the file system: its blocks, more than its bytes.
            let landed = std::os::unix::fs::MetadataExt::blocks(&meta).saturating_mul(512);
            let (bytes, landed) = (meta.len(), landed.max(meta.len()));
            // At once, before the file is read: its bytes alone may be refused.
            node.check_room_for_snapshot(bytes, ImportRecords::default(), landed)?;
            let (meta, data, records) = SnapshotData::open_received(file)?;
            node.check_room_for_snapshot(bytes, records, landed)?;
            // It has room now: an earlier refusal no longer says why it does not catch up.
            *node.inner.room_refused.lock() = None;
            Ok((meta, data))
        })
        .await?;
        // A snapshot from the stretch of history where this node's former self was the only
        // voter makes it one, as such entries do (`votes.rs`).
        let alone = meta
            .last_membership
            .membership()
            .voter_ids()
            .eq([self.id()]);
        let end = meta.last_log_id.as_ref().map(|l| l.index + 1);
        self.hold_before_sole_membership(end.filter(|_| alone));
        let raft = self.inner.raft.clone();
        let snapshot = openraft::storage::Snapshot {
            meta,
            snapshot: data,
        };
        uncancelled(async move { raft.install_full_snapshot(vote, snapshot).await })
            .await
            .map_err(|e| self.fatal(e))
    }
}
