//! Handing leadership over before a planned stop, so that a rolling restart costs the cluster a
//! heartbeat or two of leaderless time instead of an election timeout.

use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;

use super::MetaNode;
use crate::error::Result;
use crate::types::NodeId;
use crate::uncancelled::uncancelled;

impl MetaNode {
    /// If this node leads a cluster with other voters, asks the most caught-up voter it heard
    /// from within the lease to take over, and waits at most `within` until another node leads
    /// and this node applied every entry of its log (so the requests it took as leader are
    /// answered before it closes). Returns that node, or `None` if this node did not lead, had
    /// no such voter, or nobody took over in time; the stop then goes ahead and the others
    /// elect a leader after the election timeout, as after a crash. Changes no data.
    pub async fn hand_over_leadership(&self, within: Duration) -> Result<Option<NodeId>> {
        self.check_open()?;
        let Some(m) = self.leader_view() else {
            return Ok(None);
        };
        let me = self.id();
        let Some(to) = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|&v| v != me)
            .map(|v| (v, Self::progress_of(&m, v)))
            .filter(|(_, (_, heard))| heard.is_some_and(|d| d < self.lease()))
            .max_by_key(|(_, (matched, _))| *matched)
            .map(|(v, _)| v)
        else {
            return Ok(None);
        };
        tracing::info!(to, "handing leadership over before stopping");
        self.inner
            .handed_over_in
            .store(self.term(), std::sync::atomic::Ordering::Release);
        let raft = self.inner.raft.clone();
        uncancelled(async move { raft.trigger().transfer_leader(to).await })
            .await
            .map_err(|e| self.fatal(e))?;
        let deadline = tokio::time::Instant::now() + within;
        let leader = loop {
            let m = self.inner.raft.metrics().borrow_watched().clone();
            if m.state != ServerState::Leader {
                if let Some(leader) = m.current_leader.filter(|l| *l != me) {
                    break leader;
                }
            }
            if self.await_metrics_change(deadline).await.is_err() {
                return Ok(None);
            }
        };
        // Requests this node took as leader are answered when it applies their entries, and it
        // learns that the new leader committed them only from the new leader's appends, which
        // stop once this node begins to close: wait (within the same time) until it applied
        // everything in its log, so that they are answered, not timed out.
        loop {
            let m = self.inner.raft.metrics().borrow_watched().clone();
            let applied = m.last_applied.as_ref().map_or(0, |l| l.index);
            if applied >= m.last_log_index.unwrap_or(0) {
                break;
            }
            if self.await_metrics_change(deadline).await.is_err() {
                tracing::warn!(
                    applied,
                    last_log_index = m.last_log_index,
                    "handed over, but not every entry of this node's log applied in time"
                );
                break;
            }
        }
        Ok(Some(leader))
    }

    /// Whether this node asked a voter to take its leadership over in its current term: its
    /// core's refusals then come from the hand-over, not from a lost quorum.
    pub(super) fn handing_over(&self) -> bool {
        let term = self
            .inner
            .handed_over_in
            .load(std::sync::atomic::Ordering::Acquire);
        term != 0 && term == self.term()
    }

    /// This node stops: it no longer starts elections (a member whose port is closed hears no
    /// leader, and would otherwise campaign while its requests drain). Changes no data.
    pub fn stop_elections(&self) {
        self.set_election_holds(|h| h.stopped = true);
    }
}
