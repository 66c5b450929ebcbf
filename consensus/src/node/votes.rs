//! Answering vote requests. A node that holds no Raft state cannot tell a new member from one
//! whose data dir was lost; it votes only in a cluster's first election, so that a voter that
//! lost its log and its votes cannot help elect a candidate that misses acknowledged writes;
//! once it holds part of the log it does not stand for election either. That lasts until it
//! holds the log again, also after restarts (`rejoin_marker.rs`): a leader's first message
//! gives it a term long before it has the log.
//!
//! A leader serves lease reads (`Consistency::Lease`) without asking a quorum while a quorum
//! acknowledged it within the lease, because a node that acknowledged a leader votes for no
//! other until that lease has passed. openraft keeps that promise in memory only: a node it
//! restarts votes at once. So a node whose stored vote names another node as its term's leader
//! votes for no candidate, and stands for no election itself, for one lease after it opened (a
//! leadership transfer excepted, as openraft excepts it): a follower that restarted fast can
//! neither help elect a new leader nor become one while the old one still serves lease reads
//! that would miss the new leader's writes.

use openraft::async_runtime::watch::WatchReceiver;
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::vote::RaftLeaderId;

use std::sync::atomic::Ordering;

use super::MetaNode;
use crate::error::{Error, Result};
use crate::rejoin_marker::RejoinMarker;
use crate::removal_notice::Removal;
use crate::types::{StoredMembership, TypeConfig};
use crate::uncancelled::uncancelled;

/// The metrics that carry both this node's membership and its committed one (openraft's full
/// metrics and its server metrics).
pub(super) trait Memberships {
    /// The last membership in this node's log, and the last committed one.
    fn memberships(&self) -> (&StoredMembership, &StoredMembership);
}

impl Memberships for openraft::RaftMetrics<TypeConfig> {
    fn memberships(&self) -> (&StoredMembership, &StoredMembership) {
        (&self.membership_config, &self.committed_membership_config)
    }
}

impl Memberships for openraft::metrics::RaftServerMetrics<TypeConfig> {
    fn memberships(&self) -> (&StoredMembership, &StoredMembership) {
        (&self.membership_config, &self.committed_membership_config)
    }
}

impl MetaNode {
    /// Answers a vote request. Refused with [`Error::NotVoting`] (the candidate counts it as no
    /// answer) from when this node opened with no Raft state (no log, never voted) until it
    /// holds an entry committed in its current term, if the candidate's log holds more than the
    /// cluster's initial membership: a member that lost its data dir must not count toward a
    /// quorum until a leader has fed it the log again.
    pub async fn vote(&self, rpc: VoteRequest<TypeConfig>) -> Result<VoteResponse<TypeConfig>> {
        self.check_vote(&rpc)?;
        let raft = self.inner.raft.clone();
        uncancelled(async move { raft.vote(rpc).await })
            .await
            .map_err(|e| Error::Raft(e.to_string()))
    }

    /// Answers a pre-vote request, under the rule of [`MetaNode::vote`].
    pub async fn pre_vote(&self, rpc: VoteRequest<TypeConfig>) -> Result<VoteResponse<TypeConfig>> {
        self.check_vote(&rpc)?;
        let raft = self.inner.raft.clone();
        uncancelled(async move { raft.pre_vote(rpc).await })
            .await
            .map_err(|e| Error::Raft(e.to_string()))
    }

    /// The notice for a candidate that this node knows was removed (see `removal_notice.rs`):
    /// its committed membership names the candidate neither as voter nor as learner, and the
    /// candidate's log ends before that membership's entry, so the candidate cannot know.
    /// `None` otherwise. The transport sends the notice back with the answer to the request.
    pub fn removal_of(&self, rpc: &VoteRequest<TypeConfig>) -> Option<Removal> {
        let removal = self.removal_for(*rpc.vote.leader_id().node_id())?;
        let knows = rpc
            .last_log_id
            .as_ref()
            .is_some_and(|l| l.index >= removal.membership_index);
        (!knows).then_some(removal)
    }

    /// The notice for node `id` if this node's committed membership (of a cluster) leaves it
    /// out, and so does its newest membership (a change not yet known committed may name the
    /// node again): the leader sends it to the members a membership change removed, since it
    /// stops replicating to them before they could learn it from the log.
    ///
    /// Read from openraft's server metrics, which it publishes before the full metrics: a
    /// caller woken by a change of the server metrics (the leader's notices are) finds that
    /// change here, where the full metrics may not show it yet.
    pub fn removal_for(&self, id: crate::types::NodeId) -> Option<Removal> {
        let metrics = self.inner.raft.server_metrics();
        let m = metrics.borrow_watched();
        let committed = &m.committed_membership_config;
        let index = committed.log_id().as_ref()?.index;
        let membership = committed.membership();
        if membership.voter_ids().next().is_none()
            || membership.get_node(&id).is_some()
            || m.membership_config.membership().get_node(&id).is_some()
        {
            return None;
        }
        Some(Removal {
            membership_index: index,
            members: membership.nodes().map(|(id, _)| *id).collect(),
        })
    }

    /// The members of the cluster this node was removed from, if it was: its own membership
    /// names others but not it, although a committed one named it before (a learner that is
    /// catching up holds memberships from before it was added until it reaches the entry that
    /// adds it), or a member's notice is about a newer membership than its own.
    pub(super) fn removed(&self, m: &impl Memberships) -> Option<Vec<crate::types::NodeId>> {
        self.removal(m).map(|r| r.members)
    }

    /// [`Error::Removed`] on a node removed from the cluster, [`Error::RefusedByMembers`] on
    /// one too many of whose voters refuse its messages as another cluster's. Nothing brings
    /// such a node up to date again, so it answers no read, not even a local one (stale by
    /// contract, but here falling further behind for good, or another cluster's state), and no
    /// watch (which would never see another event). [`Error::NotMember`] on a node in no
    /// cluster yet: its empty state is no cluster's.
    pub(super) fn check_serving(&self) -> Result<()> {
        let metrics = self.inner.raft.metrics();
        let (removed, member) = {
            let m = metrics.borrow_watched();
            let member = m
                .membership_config
                .membership()
                .voter_ids()
                .next()
                .is_some();
            (self.removed(&*m), member)
        };
        if let Some(members) = removed {
            return Err(Error::Removed { members });
        }
        if !member {
            return Err(self.rejoin_wait().unwrap_or(Error::NotMember));
        }
        drop(metrics);
        // Cheap while no member refuses, as always but on a misconfigured node.
        if self.inner.cfg.peer_refusals.any() {
            if let refused @ Error::RefusedByMembers { .. } = self.no_leader() {
                return Err(refused);
            }
        }
        Ok(())
    }

    /// As [`MetaNode::removed`], with the log index of the membership that left this node out.
    pub(super) fn removal(&self, m: &impl Memberships) -> Option<Removal> {
        let (config, committed) = m.memberships();
        let membership = config.membership();
        let named = membership.get_node(&self.id()).is_some();
        let was_named = self.note_named(committed);
        let own = config.log_id().as_ref().map(|l| l.index);
        if removed_from(membership.voter_ids().next().is_some(), named, was_named) {
            return Some(Removal {
                membership_index: own.unwrap_or(0),
                members: membership.nodes().map(|(id, _)| *id).collect(),
            });
        }
        self.inner.cfg.removal_notice.applying_to(own)
    }

    /// Whether a membership named this node before, noting it if `committed` (its committed
    /// membership) does now. Only a committed one counts: an uncommitted entry that adds this
    /// node can be lost with its leader's office, and the next leader's log then truncates it
    /// away, leaving a membership that names others but not this node (it was never removed).
    /// Nor does any while this node rejoins: it replays the cluster's history, whose
    /// memberships named its former self (a member wiped and added again replays its earlier
    /// addition, then its removal); a rejoining node removed for real learns it from the
    /// members' notices.
    pub(super) fn note_named(&self, committed: &StoredMembership) -> bool {
        if self.is_rejoining() {
            return false;
        }
        let named = committed.membership().get_node(&self.id()).is_some();
        self.inner.was_named.fetch_or(named, Ordering::Relaxed) || named
    }

    /// Notes whether the membership this node opened with counts as naming it: any that has
    /// voters does, so that a node removed before it stopped knows it once it restarts. Not
    /// while it rejoins: it started with no Raft state, so a membership that leaves it out is
    /// one it replays from before it was added (a learner restarted while it catches up); one
    /// removed meanwhile learns it from the members' notices.
    pub(super) fn note_membership_at_open(&self) {
        if self.is_rejoining() {
            return;
        }
        let has_voters = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            let voters = m
                .membership_config
                .membership()
                .voter_ids()
                .next()
                .is_some();
            voters
        };
        self.inner.was_named.fetch_or(has_voters, Ordering::Relaxed);
    }

    /// Records a member's notice that this node was removed (the transport calls this).
    pub fn note_removal(&self, removal: Removal) {
        self.inner.cfg.removal_notice.note(removal);
    }

    fn check_vote(&self, rpc: &VoteRequest<TypeConfig>) -> Result<()> {
        // Not passed to a core that stopped or is stopping: openraft logs an error for each.
        self.check_open()?;
        self.check_lease_given(rpc)?;
        // A node with no Raft state at open set the marker (`rejoining`), so this covers it too.
        let rejoining = self.inner.rejoining.load(Ordering::Acquire)
            && !self.rejoined(&self.inner.raft.metrics().borrow_watched());
        // `initialize` writes the membership at index 0; a first leader's entries follow it.
        let established = rpc.last_log_id.as_ref().is_some_and(|l| l.index > 0);
        if rejoining && established {
            // A candidate asks again every election timeout: a warning at most every 30 s.
            let warn = super::free_space::due(
                &mut self.inner.vote_refusal_warned.lock(),
                std::time::Instant::now(),
                std::time::Duration::from_secs(30),
            );
            if warn {
                tracing::warn!(
                    candidate = %rpc.vote,
                    "refusing to vote: this node started with no Raft state and does not hold \
                     the cluster's log yet; if it was a voter and stays so, its data dir was \
                     lost: remove it from the voters and add it back as a learner"
                );
            }
            return Err(Error::NotVoting(
                "this node started with no Raft state and votes only in a cluster's first \
                 election until it holds the cluster's log"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Refuses a vote while a lease this node may have given before it opened could still run
    /// (see the module's comment).
    fn check_lease_given(&self, rpc: &VoteRequest<TypeConfig>) -> Result<()> {
        let Some(until) = self.inner.lease_given_until else {
            return Ok(());
        };
        if rpc.leadership_transfer || std::time::Instant::now() >= until {
            return Ok(());
        }
        tracing::info!(
            candidate = %rpc.vote,
            "refusing to vote: this node followed a leader before it restarted, and votes for \
             no other until that leader's lease has passed"
        );
        Err(Error::NotVoting(
            "this node followed a leader before it restarted and votes for no other until that \
             leader's lease has passed"
                .into(),
        ))
    }

    /// Keeps this node from standing for election until `until` (see the module's comment).
    /// openraft's elections are turned off, not its answers: it still follows a leader that
    /// reaches it.
    pub(super) fn hold_elections_until(&self, until: std::time::Instant) {
        self.set_election_holds(|h| h.lease = true);
        // A weak handle: a node shut down meanwhile is not kept alive for this.
        let inner = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            tokio::time::sleep_until(until.into()).await;
            if let Some(inner) = inner.upgrade() {
                MetaNode { inner }.set_election_holds(|h| h.lease = false);
            }
        });
    }

    /// Records, while this node rejoins, the commit index of the first message that reaches it
    /// from the leader of each newer term (called for every AppendEntries request, before
    /// openraft sees it). Every entry this node's former self may have helped commit is at or
    /// below the one of the current term's leader: that leader committed them before, or they
    /// precede its term's first entry. A deposed leader's message (an older term: it was cut
    /// off and does not know) may arrive first; its commit index says nothing of what the
    /// newer leader committed, so the newer term's first message replaces it.
    pub(super) fn note_leader_commit(&self, vote: &crate::types::Vote, leader_commit: Option<u64>) {
        if !self.inner.rejoining.load(Ordering::Acquire) {
            return;
        }
        let seen = RejoinTarget {
            term: vote.leader_id().term,
            commit: leader_commit.unwrap_or(0),
        };
        let mut target = self.inner.rejoin_target.lock();
        if target.is_none_or(|t| seen.term > t.term) {
            *target = Some(seen);
        }
    }

    /// Whether this node, rejoining, holds the cluster's log again (see [`caught_up`]).
    fn rejoined(&self, m: &openraft::RaftMetrics<TypeConfig>) -> bool {
        let durable = self.inner.raft.watch_log_progress().get();
        let durable = durable.and_then(|f| f.last_log_id);
        caught_up(m, durable.as_ref(), *self.inner.rejoin_target.lock())
    }

    /// Ends the rejoin (see `rejoin_marker.rs`) once this node holds the cluster's log again:
    /// clears the flag and removes the marker. Until then, once it holds entries past the
    /// cluster's initial membership, it stands for no election: its log may lack entries its
    /// former self helped commit, and another stale node would vote for it. Runs until the
    /// rejoin ends, or until Raft stops.
    pub(super) fn end_rejoin_when_caught_up(&self) {
        let node = self.clone();
        let mut metrics = self.inner.raft.metrics();
        let mut durable = self.inner.raft.watch_log_progress();
        tokio::spawn(async move {
            // A rejoining node opens with elections held (`MetaNode::open`): a log it replays
            // may make it the only voter before this task first looks. The append path sets
            // the hold too (`hold_before_sole_membership`), under the same lock: judged under
            // it, the hold cannot be lifted on a look that missed the entries it holds for.
            loop {
                if node.rejoined(&metrics.borrow_watched()) {
                    break;
                }
                node.set_election_holds(|h| {
                    let m = metrics.borrow_watched();
                    h.rejoin =
                        node.sole_membership_unseen(&m) || rejoin_holds_elections(&m, node.id());
                });
                // A flush may complete without any change to the metrics.
                let changed = tokio::select! {
                    m = metrics.changed() => m.is_ok(),
                    d = durable.changed() => d.is_ok(),
                };
                if !changed {
                    return;
                }
            }
            let dir = node.inner.cfg.data_dir.clone();
            let cleared =
                tokio::task::spawn_blocking(move || RejoinMarker::new(&dir).clear()).await;
            match cleared {
                Ok(Ok(())) => {
                    node.set_election_holds(|h| {
                        node.inner.rejoining.store(false, Ordering::Release);
                        h.rejoin = false;
                    });
                    let voter = node
                        .inner
                        .raft
                        .metrics()
                        .borrow_watched()
                        .membership_config
                        .membership()
                        .voter_ids()
                        .any(|v| v == node.id());
                    let then = match voter {
                        true => "it votes and stands for election",
                        false => "as a voter, it would vote and stand for election",
                    };
                    tracing::info!(
                        "this node holds the cluster's log: {then} (a node that starts with no \
                         Raft state, new or with its data dir lost, first gets the log)"
                    );
                }
                Ok(Err(e)) => tracing::warn!("ending the rejoin: {e}"),
                Err(e) => tracing::warn!("ending the rejoin: {e}"),
            }
        });
    }
}

/// Whether a rejoining node stands for no election: it does not lead, and either its log holds
/// entries past the cluster's initial membership (index 0; a log of that alone wins only a
/// cluster's first election, which a node that never held more may stand for) and it has
/// other voters or follows another node's leadership, or it is its membership's only voter
/// and follows another node's leadership.
///
/// The last: a membership in which this node is the only voter, in a log another leader gave
/// it, is one it replays from the cluster's history (its former self, with the same id, once
/// led alone: a cluster started as one node, from its initial membership on, or shrunk to one
/// voter), not its cluster's now. openraft elects a sole voter at once, asking no one, and it
/// would lead with a log that ends there, cutting the real voters' newer entries back to it.
/// Only a node that follows no one leads a one-voter cluster: its own (a restart before its
/// first rejoin ended).
fn rejoin_holds_elections(m: &openraft::RaftMetrics<TypeConfig>, me: crate::types::NodeId) -> bool {
    use openraft::vote::RaftLeaderId;
    let membership = m.membership_config.membership();
    let others_vote = membership.voter_ids().any(|v| v != me);
    let alone = membership.voter_ids().eq([me]);
    let follows_another = m.vote.is_committed() && *m.vote.leader_id().node_id() != me;
    let past_initial = m.last_log_index.is_some_and(|i| i > 0);
    m.state != openraft::ServerState::Leader
        && ((past_initial && (others_vote || follows_another)) || (alone && follows_another))
}

/// One past the highest log index of a membership in `entries` in which node `me` is the only
/// voter, if any.
pub(super) fn sole_membership_end(
    entries: &[crate::types::Entry],
    me: crate::types::NodeId,
) -> Option<u64> {
    entries
        .iter()
        .filter(|e| match &e.payload {
            openraft::EntryPayload::Membership(m) => m.voter_ids().eq([me]),
            _ => false,
        })
        .map(|e| e.log_id.index + 1)
        .max()
}

impl MetaNode {
    /// Holds elections at once, before openraft takes a leader's entries (or snapshot), while
    /// this node rejoins and they hold a membership in which it is the only voter (`end`: one
    /// past that entry's index, see [`sole_membership_end`]), until its metrics show it (then
    /// `rejoin_holds_elections` judges): openraft elects a sole voter at its next tick, without
    /// an election timeout, sooner than the task that follows the metrics could hold them.
    pub(super) fn hold_before_sole_membership(&self, end: Option<u64>) {
        let Some(end) = end else {
            return;
        };
        // Under the holds' lock, as the rejoin's end is: a hold set after that end would stay.
        self.set_election_holds(|h| {
            if self.is_rejoining() {
                self.inner
                    .sole_membership_end
                    .fetch_max(end, Ordering::AcqRel);
                h.rejoin = true;
            }
        });
    }

    /// Whether a leader sent this rejoining node a membership naming it its only voter that
    /// its metrics `m` do not show yet.
    fn sole_membership_unseen(&self, m: &openraft::RaftMetrics<TypeConfig>) -> bool {
        let shown = m.last_log_index.map_or(0, |i| i + 1);
        self.inner.sole_membership_end.load(Ordering::Acquire) > shown
    }
}

/// What a rejoining node must have committed (see [`MetaNode::note_leader_commit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RejoinTarget {
    /// The term of the leader whose first message set it.
    pub term: u64,
    /// That message's commit index.
    pub commit: u64,
}

/// Whether a rejoining node holds the cluster's log again: its log durably holds an entry of
/// its current term (`durable` is its last entry on disk, as openraft counts it flushed) at or
/// past the commit index the first message of that term's leader carried (the `target`, see
/// [`MetaNode::note_leader_commit`]); or it leads (its own log then decides what is
/// committed). An entry of term T comes from T's leader, and the log up to it is that leader's
/// log up to it: every entry committed before T (T's leader held them all when it was elected,
/// and its entries of T follow them), and every entry of T committed up to the target (entries
/// its former self may have acknowledged). Nor is an older term's target enough: a deposed
/// leader's commit index says nothing of what the newer one committed.
///
/// Knowing the entry committed is not needed, and waiting for that could keep the node from
/// ever voting: in a new cluster whose first leader stops right after its first entry reached
/// this node but before the commit index did, nobody is left to tell it, and the other
/// survivor needs its vote.
fn caught_up(
    m: &openraft::RaftMetrics<TypeConfig>,
    durable: Option<&crate::types::LogId>,
    target: Option<RejoinTarget>,
) -> bool {
    let of_term = |l: &crate::types::LogId| l.leader_id.term == m.current_term;
    if m.state == openraft::ServerState::Leader {
        return m.local_committed.as_ref().is_some_and(of_term);
    }
    let Some(target) = target.filter(|t| t.term == m.current_term) else {
        return false;
    };
    durable.is_some_and(|l| of_term(l) && l.index >= target.commit)
}

/// Whether a node was removed, by its membership alone: the membership has voters, leaves the
/// node out, and a membership named it before (else it is a learner catching up).
fn removed_from(has_voters: bool, named: bool, was_named: bool) -> bool {
    has_voters && !named && was_named
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use openraft::vote::leader_id_adv::LeaderId;
    use openraft::{EntryPayload, Membership, RaftMetrics, ServerState};

    use super::{rejoin_holds_elections, removed_from, sole_membership_end};
    use crate::types::{Entry, LogId, StoredMembership, TypeConfig, Vote};

    fn log_id(index: u64) -> LogId {
        LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        )
    }

    fn membership(voters: &[u64]) -> Membership<u64, crate::Node> {
        let set: BTreeSet<u64> = voters.iter().copied().collect();
        let nodes: BTreeMap<u64, crate::Node> = voters
            .iter()
            .map(|v| (*v, crate::Node::new(format!("n{v}"))))
            .collect();
        Membership::new(vec![set], nodes).unwrap()
    }

    /// Node 1's metrics: its log up to `last`, a membership of `voters`, and `vote`.
    fn metrics(last: Option<u64>, voters: &[u64], vote: Vote) -> RaftMetrics<TypeConfig> {
        let mut m = RaftMetrics::new_initial(1);
        m.last_log_index = last;
        m.vote = vote;
        if !voters.is_empty() {
            m.membership_config = Arc::new(StoredMembership::new(
                Some(log_id(last.unwrap_or(0))),
                membership(voters),
            ));
        }
        m
    }

    #[test]
    fn a_rejoining_node_stands_for_no_election_it_would_win_from_a_replayed_membership() {
        let follows_2 = Vote::new_committed(2, 2);
        let own = Vote::new(1, 1);
        let hold =
            |last, voters: &[u64], vote| rejoin_holds_elections(&metrics(last, voters, vote), 1);
        // Nothing yet: no membership, no election to stand for.
        assert!(!hold(None, &[], follows_2));
        // The initial membership of a cluster that started as this node alone, replayed from
        // another leader: openraft would elect it at once, at its next tick.
        assert!(hold(Some(0), &[1], follows_2));
        assert!(hold(Some(7), &[1], follows_2));
        // A new cluster's first election: a member holding only the initial membership stands.
        assert!(!hold(Some(0), &[1, 2, 3], follows_2));
        // Past it, it waits for the log, whoever it follows.
        assert!(hold(Some(7), &[1, 2, 3], own));
        // Its own one-voter cluster (restarted before its first rejoin ended) it leads.
        assert!(!hold(Some(0), &[1], own));
        assert!(!hold(Some(7), &[1], own));
        // A leader has nothing to hold.
        let mut leading = metrics(Some(7), &[1], follows_2);
        leading.state = ServerState::Leader;
        assert!(!rejoin_holds_elections(&leading, 1));
    }

    #[test]
    fn a_membership_naming_a_node_its_only_voter_is_found_among_entries() {
        let entry = |index, voters: &[u64]| Entry {
            log_id: log_id(index),
            payload: EntryPayload::Membership(membership(voters)),
        };
        let blank = Entry {
            log_id: log_id(9),
            payload: EntryPayload::Blank,
        };
        assert_eq!(
            sole_membership_end(&[entry(0, &[1]), blank.clone()], 1),
            Some(1)
        );
        assert_eq!(
            sole_membership_end(&[entry(3, &[1]), entry(5, &[1])], 1),
            Some(6)
        );
        assert_eq!(
            sole_membership_end(&[entry(0, &[1, 2]), blank.clone()], 1),
            None
        );
        assert_eq!(sole_membership_end(&[entry(0, &[2])], 1), None);
        assert_eq!(sole_membership_end(&[blank], 1), None);
    }

    #[test]
    fn a_node_is_removed_only_from_a_membership_that_named_it_before() {
        // A learner catching up: the memberships before the one that adds it leave it out.
        assert!(!removed_from(true, false, false));
        // Named now, or no cluster yet.
        assert!(!removed_from(true, true, true));
        assert!(!removed_from(false, false, true));
        // Named before, left out now.
        assert!(removed_from(true, false, true));
    }
}
