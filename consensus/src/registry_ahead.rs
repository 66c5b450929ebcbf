//! A registry that applied entries its log no longer holds, found when a node opens, and what
//! the node does about it.
//!
//! A member applies entries a quorum holds durably, also before its own log's barrier covered
//! them, and its registry's writes reach the disk on their own schedule: after a power loss
//! the registry may keep entries whose log records were lost, and a log damaged on disk (a
//! cut or zeroed tail) loses records the registry applied. openraft cannot start from that
//! state (it refuses a purge point past the snapshot), and the log cannot give those entries
//! back.
//!
//! In a cluster of several voters the registry is rebuilt from the snapshot and the log, and
//! the leader sends the rest again: every applied entry was committed, so a quorum holds it.
//! The sole voter of a cluster has no one to get them from: its registry is the only copy of
//! entries it acknowledged. It keeps the registry and snapshots it (the log is purged up to
//! the registry's last entry, as after a snapshot install), as long as its log still holds a
//! vote of the registry's last term; without one (the log lost its vote, or is gone) it
//! refuses to start, keeping everything as it is, since a vote of an older term would let it
//! lead a term whose entries it holds already.

use openraft::storage::RaftLogStorage;

use crate::error::{Error, Result};
use crate::log_store::LogStore;
use crate::sole_voter;
use crate::state_machine::StateMachine;
use crate::types::{LogId, NodeId};

/// A registry ahead of its log and newest snapshot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegistryAhead {
    /// The last entry the registry applied.
    pub(crate) applied: LogId,
    /// The highest index the log or the newest snapshot holds.
    pub(crate) held: u64,
}

/// What a node does with a registry ahead of its log.
#[derive(Debug)]
pub(crate) enum Remedy {
    /// Delete it and rebuild it from the snapshot and the log (several voters).
    Rebuild,
    /// Keep it, as a snapshot that the log is purged up to (the sole voter).
    Keep,
}

impl RegistryAhead {
    /// The registry's state against the log's, if it is ahead.
    pub(crate) fn of(sm: &StateMachine, log: &LogStore) -> Option<RegistryAhead> {
        let applied = sm.shared().applied().0?;
        let logged = log.summary().0.map_or(0, |l| l.index);
        let snapshot = sm.shared().last_snapshot().map_or(0, |s| s.index);
        let held = logged.max(snapshot);
        (applied.index > held).then_some(RegistryAhead { applied, held })
    }

    /// What node `me` does with it: [`Remedy::Keep`] when the registry's membership has `me`
    /// as its only voter, else [`Remedy::Rebuild`]. The only voter keeps it only with a vote of
    /// the registry's last term, which `sole_voter::check_vote` requires of it before anything
    /// is changed.
    pub(crate) fn remedy(&self, sm: &StateMachine, me: NodeId) -> Remedy {
        if sole_voter::is_sole_voter(&sm.shared().applied().1, me) {
            Remedy::Keep
        } else {
            Remedy::Rebuild
        }
    }

    /// Keeps the registry: snapshots it, then purges the log up to its last entry. Before Raft
    /// starts. On return the newest snapshot holds every entry the registry applied, durably.
    pub(crate) async fn keep(&self, sm: &mut StateMachine, log: &LogStore) -> Result<()> {
        tracing::warn!(
            applied = self.applied.index,
            held = self.held,
            "the registry applied entries that neither the log nor a snapshot holds (its log \
             files were damaged or cut); this node is its cluster's only voter, so the registry \
             is their only copy: keeping it, as a snapshot the log is purged up to"
        );
        let built = sm.snapshot_before_raft("the registry kept").await?;
        if built != Some(self.applied) {
            return Err(Error::Raft(format!(
                "snapshot the registry kept: the build ended at {built:?}, not at the registry's \
                 last entry {}",
                self.applied
            )));
        }
        log.clone()
            .purge(self.applied)
            .await
            .map_err(|e| Error::Raft(format!("purge the log up to the registry kept: {e}")))
    }
}
