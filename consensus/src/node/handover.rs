//! Handing leadership over: before a planned stop, so that a rolling restart costs the cluster a
//! heartbeat or two of leaderless time instead of an election timeout, and to a voter an
//! operator names (to take the leader's load off a node, or before maintenance on it).

use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;

use super::membership::Metrics;
use super::MetaNode;
use crate::error::{Error, Result};
use crate::types::NodeId;
use crate::uncancelled::uncancelled;

impl MetaNode {
    /// If this node leads a cluster with other voters, asks the most caught-up voter it heard
    /// from within the lease to take over (one not short of disk, if any: see
    /// [`MetaNode::note_voters_short_of_disk`]; and not one whose address its last message
    /// found nothing listening at), and waits at most `within` until another node leads and
    /// this node applied every entry of its log (so the requests it took as leader are
    /// answered before it closes); no longer once nothing listens at the voter's address.
    /// Returns that node, or `None` if this node did not lead, had no such voter, or nobody
    /// took over in time; the stop then goes ahead and the others elect a leader after the
    /// election timeout, as after a crash. Changes no data.
    pub async fn hand_over_leadership(&self, within: Duration) -> Result<Option<NodeId>> {
        self.check_open()?;
        // Said in the status from now on: a leader short of disk must not hand the leadership
        // (back) to this node, which is about to close.
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
        let Some(m) = self.leader_view() else {
            return Ok(None);
        };
        let me = self.id();
        // A voter the disk look found short of disk would refuse writes, then hand over again.
        let short = self.inner.voter_rooms.lock().short().clone();
        // One whose address nothing listens at any more stopped too (a whole cluster stopped
        // at once): asked, it would leave this node waiting for nothing.
        let refusals = &self.inner.cfg.peer_refusals;
        let Some(to) = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|&v| v != me && refusals.not_connected_at(v).is_none())
            .map(|v| (v, Self::progress_of(&m, v)))
            .filter(|(_, (_, heard))| heard.is_some_and(|d| d < self.lease()))
            .max_by_key(|(v, (matched, _))| (!short.contains(v), *matched))
            .map(|(v, _)| v)
        else {
            return Ok(None);
        };
        tracing::info!(to, "handing leadership over before stopping");
        let asked = std::time::Instant::now();
        self.trigger_transfer(to).await?;
        let deadline = tokio::time::Instant::now() + within;
        let leader = loop {
            let m = self.inner.raft.metrics().borrow_watched().clone();
            if m.state != ServerState::Leader {
                if let Some(leader) = m.current_leader.filter(|l| *l != me) {
                    break leader;
                }
            }
            if refusals.not_connected_at(to).is_some_and(|at| at >= asked) {
                tracing::info!(
                    to,
                    "node {to} stopped too (nothing listens at its address): stopping without \
                     handing over"
                );
                return Ok(None);
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

    /// Moves the leadership to voter `to`, at an operator's request. Answers once `to` leads,
    /// with its term (at once, and changing nothing, when this node is `to`). Refused with
    /// [`Error::ForwardToLeader`] on a node that knows another leader, [`Error::NoLeader`] on a
    /// leader that is handing its office over already or that no quorum acknowledged for two
    /// election timeouts (it is cut off), [`Error::InvalidArgument`] when `to` is no voter,
    /// and [`Error::Conflict`] when `to` has not, within the lease after the call, both
    /// answered this leader and caught up with the log as it was when asked (openraft's target
    /// ignores a transfer while its log is behind, and the cluster would go without a leader
    /// until an election timeout), at once when `to` was silent for the lease already, or when
    /// another node was elected. [`Error::Timeout`] when no other node leads within two
    /// election timeouts: this node stops leading once it asked (it takes no writes and sends
    /// no heartbeats), so the members then elect a leader as after a crash. Changes no data.
    pub async fn transfer_leadership(&self, to: NodeId) -> Result<(NodeId, u64)> {
        // Not in the middle of a membership change, whose checks assume this node leads.
        let _one = self.inner.changing.lock().await;
        let m = self.transfer_view(to)?;
        let me = self.id();
        if to == me {
            return Ok((me, m.current_term));
        }
        let last = m.last_log_index.unwrap_or(0);
        // Answered since the call (a heartbeat's round at most), not merely within the lease: a
        // voter that stopped a moment ago would be asked, and the cluster left without a leader.
        let asked = std::time::Instant::now();
        let ready = |m: &Metrics| {
            let (matched, _) = Self::progress_of(m, to);
            matched.is_some_and(|i| i >= last) && super::membership::answered_since(m, to, asked)
        };
        let waited = self
            .inner
            .raft
            .wait(Some(self.lease()))
            .metrics(
                |m| m.state == ServerState::Leader && ready(m),
                "target ready",
            )
            .await;
        if waited.is_err() {
            return Err(cannot_take_over(&self.change_view()?, to));
        }
        tracing::info!(to, "handing leadership over, as asked");
        self.trigger_transfer(to).await?;
        let elected = self
            .inner
            .raft
            .wait(Some(self.inner.cfg.election_timeout() * 2))
            .metrics(
                |m| m.state != ServerState::Leader && m.current_leader.is_some_and(|l| l != me),
                "another node leads",
            )
            .await
            .map_err(|_| Error::Timeout)?;
        match elected.current_leader {
            Some(leader) if leader == to => Ok((to, elected.current_term)),
            other => Err(Error::Conflict(format!(
                "node {} was elected instead of node {to}",
                other.map_or("?".to_owned(), |l| l.to_string())
            ))),
        }
    }

    /// Refuses a move of the leadership to `to` at once, as [`MetaNode::transfer_leadership`]
    /// says, where that needs no wait (a node that knows another leader, or none; a leader
    /// handing over or cut off; `to` no voter, or silent for the lease already), so that a
    /// caller can check before asking `to` anything itself (a paused node does not answer).
    /// Returns the leader's view.
    pub fn transfer_view(&self, to: NodeId) -> Result<Metrics> {
        self.check_open()?;
        self.forward_if_follower()?;
        let m = self.change_view()?;
        // A leader handing over (before a stop, or to another target) takes nothing more: it
        // would answer that it leads while it is giving up its office. The caller asks the
        // next leader.
        if self.handing_over() {
            return Err(Error::NoLeader);
        }
        if to == self.id() {
            return Ok(m);
        }
        if !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == to)
        {
            return Err(Error::InvalidArgument(format!(
                "node {to} is not a voter: only a voter can lead"
            )));
        }
        // A target silent for the lease already (stopped, paused or cut off) is refused at
        // once: a leader that has led for the lease heard from every running voter within it.
        let (_, heard) = Self::progress_of(&m, to);
        let led_long = self
            .led_for(m.current_term)
            .is_some_and(|d| d >= self.lease());
        if heard.map_or(led_long, |d| d >= self.lease()) {
            return Err(cannot_take_over(&m, to));
        }
        Ok(m)
    }

    /// Asks voter `to` to take this leader's office over. From then on this node proposes
    /// nothing and sends no heartbeats in its term; its core's refusals count as a hand-over's.
    async fn trigger_transfer(&self, to: NodeId) -> Result<()> {
        self.inner
            .handed_over_in
            .store(self.term(), std::sync::atomic::Ordering::Release);
        let raft = self.inner.raft.clone();
        uncancelled(async move { raft.trigger().transfer_leader(to).await })
            .await
            .map_err(|e| self.fatal(e))
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

/// Why voter `to` cannot take over from the leader whose view is `m`: how much of the log it
/// has, and when the leader last heard from it.
fn cannot_take_over(m: &Metrics, to: NodeId) -> Error {
    let last = m.last_log_index.unwrap_or(0);
    let (matched, heard) = MetaNode::progress_of(m, to);
    let (has, heard) = super::membership::progress_words(matched, last, heard);
    Error::Conflict(format!(
        "node {to} cannot take over: it has {has} and {heard} (check that it runs and is \
         reachable)"
    ))
}
