//! The only voter of a cluster elects itself, so its log's vote is all that keeps it from
//! leading a term older than entries it holds: a node whose registry or newest snapshot
//! reaches an entry of a later term than its log's vote (the log is gone, or lost its newest
//! entries with the vote; a vote lost with the oldest segment alone is restored from the
//! newest entry, `LogStore::restore_lost_vote`) would lead an older term over them and wedge its log for good ("inverted
//! log order" at every later start). Such a node refuses to start instead. A member of several
//! voters needs no such check: the others hold the newer terms, and a node that lost its log
//! learns the term from them before it votes (`rejoin_marker.rs`).

use std::path::Path;

use openraft::vote::RaftLeaderId;

use crate::error::{Error, Result};
use crate::log_store::LogStore;
use crate::state_machine::StateMachine;
use crate::types::{LogId, NodeId, StoredMembership};

/// Whether `me` is the only voter of `membership` (not in the middle of a change).
pub(crate) fn is_sole_voter(membership: &StoredMembership, me: NodeId) -> bool {
    let config = membership.membership();
    config.get_joint_config().len() == 1 && config.voter_ids().eq(std::iter::once(me))
}

/// The newest entry this node holds outside its log (the registry's last applied one, or the
/// newest snapshot's last one, whichever is later), with the membership as of it.
fn newest_outside_the_log(sm: &StateMachine) -> Option<(LogId, StoredMembership)> {
    let (applied, membership) = sm.shared().applied();
    let applied = applied.map(|a| (a, membership));
    let snapshot = sm
        .shared()
        .current_snapshot()
        .and_then(|(meta, _)| meta.last_log_id.map(|l| (l, meta.last_membership)));
    match (applied, snapshot) {
        (Some(a), Some(s)) => Some(if s.0 > a.0 { s } else { a }),
        (a, s) => a.or(s),
    }
}

/// `Ok` unless node `me` is, as of the newest entry it holds outside its log, its cluster's only
/// voter and its log (in `log_dir`) holds no vote of that entry's term or later; then
/// [`Error::LogBehindRegistry`], and the node must not start.
pub(crate) fn check_vote(
    sm: &StateMachine,
    log: &LogStore,
    log_dir: &Path,
    me: NodeId,
) -> Result<()> {
    let Some((newest, membership)) = newest_outside_the_log(sm) else {
        return Ok(());
    };
    if !is_sole_voter(&membership, me) {
        return Ok(());
    }
    let term = newest.leader_id.term;
    let voted = log.vote().map(|v| v.leader_id().term());
    if voted.is_some_and(|t| t >= term) {
        return Ok(());
    }
    let vote = match voted {
        Some(t) => format!("holds a vote of term {t} only"),
        None => "holds no vote".to_string(),
    };
    Err(Error::LogBehindRegistry {
        path: log_dir.to_path_buf(),
        reason: format!(
            "{vote}, though this node's registry or newest snapshot reaches entry {} of term \
             {term} and this node is its cluster's only voter: started, it would lead an older \
             term over entries it holds. The registry and the snapshots are kept. Put back the \
             log that holds the vote, or take the data dir aside and restore a backup into a \
             fresh one",
            newest.index
        ),
    })
}
