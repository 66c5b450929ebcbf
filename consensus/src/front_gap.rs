//! A log whose oldest entries are gone though it records no purge of them (its oldest segment
//! was deleted or lost), found when a node opens, and what the node does about it.
//!
//! openraft reads a log as the entries after its purge point, so it cannot start from such a
//! log (it fails with "log entry not found" at the first missing index, naming no file). When
//! the newest snapshot or the registry holds every entry before the log's first one, nothing
//! is missing: the node purges the log up to the snapshot (first building one of the
//! registry, if the snapshot falls short), as after a snapshot install. Otherwise the start is
//! refused, naming the log dir and the missing entries, and nothing is changed.

use std::path::Path;

use openraft::storage::RaftLogStorage;

use crate::error::{Error, Result};
use crate::log_store::LogStore;
use crate::state_machine::StateMachine;
use crate::types::LogId;

/// The start of a log that lacks its oldest entries, and what covers them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FrontGap {
    /// The log's first entry.
    first: u64,
    /// The newest snapshot's last entry, when it reaches the entry before `first`; else the
    /// registry does, and is snapshotted first.
    snapshot: Option<LogId>,
}

impl FrontGap {
    /// The gap at the front of `log` (in `log_dir`), if there is one. `Ok(None)`: the log
    /// begins right after its purge point, or at entry 0. [`Error::LogDamaged`] when neither the newest
    /// snapshot nor the registry holds the entries before the log's first one.
    pub(crate) fn of(
        sm: &StateMachine,
        log: &LogStore,
        log_dir: &Path,
    ) -> Result<Option<FrontGap>> {
        let Some((from, to)) = log.lost_front() else {
            return Ok(None);
        };
        let first = to + 1;
        let snapshot = sm
            .shared()
            .current_snapshot()
            .and_then(|(meta, _)| meta.last_log_id);
        let applied = sm.shared().applied().0;
        let reaches = |l: &Option<LogId>| l.is_some_and(|l| l.index + 1 >= first);
        if reaches(&snapshot) {
            return Ok(Some(FrontGap { first, snapshot }));
        }
        if reaches(&applied) {
            return Ok(Some(FrontGap {
                first,
                snapshot: None,
            }));
        }
        let held = |l: Option<LogId>| l.map_or("none".to_string(), |l| l.index.to_string());
        Err(Error::LogDamaged {
            path: log_dir.to_path_buf(),
            reason: format!(
                "lacks entries {from} to {to} (its oldest segment was deleted or lost: the log \
                 begins at entry {first}, and records no purge of them), and neither the newest \
                 snapshot (last entry: {}) nor the registry (last entry: {}) holds them. The \
                 log is left as it is. Put the missing segment back; or replace this member's \
                 data dir (remove it from the voters, wipe the dir, add it again as a learner)",
                held(snapshot),
                held(applied),
            ),
        })
    }

    /// Closes the gap: snapshots the registry if the newest snapshot falls short, then purges
    /// the log up to the snapshot. Before Raft starts. On return the log's purge point is
    /// durably at or past the entry before its former first one, and the newest snapshot
    /// reaches it.
    pub(crate) async fn close(&self, sm: &mut StateMachine, log: &LogStore) -> Result<()> {
        tracing::warn!(
            first = self.first,
            "the log begins at entry {} and records no purge of the entries before it (its \
             oldest segment was deleted or lost); the {} holds them: purging the log up to it",
            self.first,
            if self.snapshot.is_some() {
                "newest snapshot"
            } else {
                "registry, snapshotted now,"
            }
        );
        let upto = match self.snapshot {
            Some(s) => Some(s),
            None => {
                sm.snapshot_before_raft("the registry over a log's lost front")
                    .await?
            }
        };
        let Some(upto) = upto.filter(|u| u.index + 1 >= self.first) else {
            return Err(Error::Raft(format!(
                "snapshot the registry over a log's lost front: the build ended at {upto:?}, \
                 before entry {}",
                self.first - 1
            )));
        };
        log.clone()
            .purge(upto)
            .await
            .map_err(|e| Error::Raft(format!("purge the log over its lost front: {e}")))
    }
}
