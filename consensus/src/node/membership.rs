//! Cluster membership: initializing a cluster once, adding and removing learners, changing
//! voters and members' addresses. The leader refuses a change that could leave the cluster
//! without a quorum: a node becomes a voter only as a learner that is reachable and caught up,
//! and no two members share an address. One change at a time, its checks included: each runs
//! under the node's membership lock, first finishes a change that a caller left half done
//! (openraft changes voters in two steps, through a joint membership that needs a majority of
//! both voter sets), and checks the leader's view again after any wait; a change that meets an
//! uncommitted one waits for it, up to the request timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{InitializeError, RaftError};
use openraft::{ChangeMembers, ServerState};

use super::{blocking, sync_dir, MetaNode, INITIALIZED};
use crate::error::{Error, Result};
use crate::types::{LogId, Node, NodeId};
use crate::uncancelled::uncancelled;
use crate::untold_removals::UntoldRemovals;

/// How long a learner's refusal of the leader's snapshot for want of room is named when it
/// cannot be promoted: the leader sends the snapshot again at least every 30 s.
pub(super) const ROOM_REFUSAL_RECENT: std::time::Duration = std::time::Duration::from_secs(60);

impl MetaNode {
    fn marker(&self) -> PathBuf {
        self.inner.cfg.data_dir.join(INITIALIZED)
    }

    /// Whether this node belongs to an initialized cluster (it initialized one, or holds any
    /// log, vote or membership).
    pub async fn is_initialized(&self) -> Result<bool> {
        self.check_open()?;
        if self.marker().exists() {
            return Ok(true);
        }
        let raft = self.inner.raft.clone();
        uncancelled(async move { raft.is_initialized().await })
            .await
            .map_err(|e| self.fatal(e))
    }

    /// Forms a new cluster of `members` (which must include this node). Only ever once: a
    /// node that was initialized, or that holds any Raft state, answers
    /// [`Error::AlreadyInitialized`]; the fact is persisted in the data dir.
    pub async fn initialize(&self, members: BTreeMap<NodeId, Node>) -> Result<()> {
        // One initialize at a time: the id recorded below must be the one the cluster forms
        // with.
        let _changing = self.inner.changing.lock().await;
        if self.is_initialized().await? {
            return Err(Error::AlreadyInitialized);
        }
        if !members.contains_key(&self.id()) {
            return Err(Error::InvalidArgument(format!(
                "members {:?} must include this node ({})",
                members.keys().collect::<Vec<_>>(),
                self.id()
            )));
        }
        // The cluster's id is recorded before the cluster exists, so every message it sends
        // carries it. Always a fresh one: an id recorded by a node without Raft state was
        // adopted from another cluster's message (the probe of an add that then failed), or
        // recorded by an initialize that stopped before it formed its cluster (no member has
        // that one). A new cluster under another cluster's id would pass its checks.
        let cluster = self.inner.cfg.cluster_id.clone();
        let id = crate::cluster_id::ClusterId::fresh();
        let dir = self.inner.cfg.data_dir.clone();
        blocking(move || cluster.record_new(&dir, id)).await?;
        let raft = self.inner.raft.clone();
        match uncancelled(async move { raft.initialize(members).await }).await {
            Ok(()) => {}
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                return Err(Error::AlreadyInitialized)
            }
            Err(RaftError::APIError(e)) => return Err(Error::InvalidArgument(e.to_string())),
            Err(RaftError::Fatal(f)) => return Err(self.fatal(f)),
        }
        if self.inner.cfg.raise_version_at_formation {
            self.raise_version_at_formation();
        }
        let marker = self.marker();
        let dir = self.inner.cfg.data_dir.clone();
        blocking(move || {
            std::fs::write(&marker, b"initialized\n")
                .and_then(|_| std::fs::File::open(&marker)?.sync_all())
                .map_err(|e| Error::io("write initialized marker", &marker, e))?;
            sync_dir(&dir)
        })
        .await
    }

    /// Adds a learner and starts replicating to it; returns once the membership change is
    /// committed, without waiting for the learner to catch up. Adding a learner again at the
    /// same address changes nothing; [`Error::Conflict`] if `id` is a voter, or a learner at
    /// another address (remove it first), [`Error::LearnerTooOld`] if it answered recently as
    /// a build older than the cluster's version, [`Error::LearnerNotHeard`] if it did not
    /// answer recently and the cluster's version is past the base one (`node/versions.rs`).
    pub async fn add_learner(&self, id: NodeId, node: Node) -> Result<()> {
        if node.addr.is_empty() {
            return Err(Error::InvalidArgument("learner address is empty".into()));
        }
        let check = |m: &Metrics| learner_addable(m, id, &node.addr);
        let _one = self.one_change().await?;
        let add = async {
            self.checked_change(check, |raft| {
                let node = node.clone();
                async move { raft.add_learner(id, node, false).await }
            })
            .await
        };
        self.unless_too_old(id, add).await
    }

    /// The checks of [`MetaNode::add_learner`] that need no answer from the node, against the
    /// membership this node sees as leader (on another node, a forward or
    /// [`Error::NoLeader`]), so that a caller can refuse before it asks the node who it is.
    /// Advice only: `add_learner` checks again under the lock that orders membership changes.
    pub fn check_learner(&self, id: NodeId, addr: &str) -> Result<()> {
        learner_addable(&self.change_view()?, id, addr)
    }

    /// Removes learner `id` from the cluster (replication to it stops). [`Error::NotFound`] if
    /// it is not a learner, [`Error::Conflict`] if it is a voter (change the voters first).
    pub async fn remove_learner(&self, id: NodeId) -> Result<()> {
        let check = |m: &Metrics| {
            let membership = m.membership_config.membership();
            if membership.voter_ids().any(|v| v == id) {
                return Err(Error::Conflict(format!(
                    "node {id} is a voter: change the voters first"
                )));
            }
            if !membership.learner_ids().any(|l| l == id) {
                return Err(Error::NotFound(format!("node {id} is not a learner")));
            }
            Ok(())
        };
        let _one = self.one_change().await?;
        self.checked_change(check, |raft| {
            let change = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
            async move { raft.change_membership(change, false).await }
        })
        .await
    }

    /// Moves member `id` to `addr` (it was restarted there): the members send it their messages
    /// there from when the change is committed. The caller has made sure that node `id` of this
    /// cluster, holding its data, answers at `addr` and no longer at its old address (`meta-http`
    /// asks both), which is what keeps this safe: a wrong address would give another process
    /// the member's vote. Another member the membership still names at `addr` is therefore
    /// stale (two members that swapped addresses move one after the other); messages to it are
    /// refused there until it moves too. [`Error::NotFound`] if `id` is no member; no change if
    /// it is at `addr` already; on a node that does not know itself the leader, a forward or
    /// [`Error::NoLeader`] (openraft would add an id it does not know as a new member).
    pub async fn change_address(&self, id: NodeId, addr: String) -> Result<()> {
        if addr.is_empty() {
            return Err(Error::InvalidArgument("the address is empty".into()));
        }
        let _one = self.one_change().await?;
        if self.member_address(id)? == addr {
            return Ok(());
        }
        let check = |m: &Metrics| address_in(m, id).map(|_| ());
        let nodes = BTreeMap::from([(id, Node::new(addr.clone()))]);
        self.checked_change(check, |raft| {
            let change = ChangeMembers::SetNodes(nodes.clone());
            async move { raft.change_membership(change, false).await }
        })
        .await
    }

    /// The address the membership names for member `id` (a voter or a learner), as the leader
    /// sees it: [`Error::NotFound`] if `id` is no member; on a node that does not know itself
    /// the leader, a forward or [`Error::NoLeader`]. Cheap: a caller about to ask something of
    /// a member's new address calls it first, so an id that is no member costs no connection.
    pub fn member_address(&self, id: NodeId) -> Result<String> {
        self.check_open()?;
        self.forward_if_follower()?;
        let Some(m) = self.leader_view() else {
            return Err(self.no_leader());
        };
        address_in(&m, id)
    }

    /// The nodes (id to address) that committed membership changes removed and that this node
    /// last noted as not yet told (`untold_removals.rs`); none if it never noted any. Runs on a
    /// blocking thread.
    pub async fn untold_removals(&self) -> Result<BTreeMap<NodeId, String>> {
        let untold = UntoldRemovals::new(&self.inner.cfg.data_dir);
        blocking(move || untold.load()).await
    }

    /// Notes `untold` as the nodes still to be told they were removed, in place of the last
    /// list. Runs on a blocking thread.
    ///
    /// Contract: on `Ok`, [`MetaNode::untold_removals`] answers this list after a restart, also
    /// after a crash (an empty list: this one or the one before).
    pub async fn keep_untold_removals(&self, untold: BTreeMap<NodeId, String>) -> Result<()> {
        // Once closed, the data dir may be another process's.
        self.check_open()?;
        let list = UntoldRemovals::new(&self.inner.cfg.data_dir);
        blocking(move || list.save(&untold)).await
    }

    /// Makes `voters` the voting members; removed voters leave the cluster. Each new voter must
    /// be a learner that acknowledged the leader since the call and whose log is at most
    /// `MAX_PROMOTION_LAG` entries behind the leader's, and a majority of `voters` (and of the
    /// current voters) must have acknowledged it since the call (within a lease of waiting for
    /// that; a heartbeat's round when they run), else [`Error::Conflict`] and
    /// nothing changes: a voter that cannot keep up could leave the cluster without a quorum,
    /// and a change without an answering majority of both sets would stall every write.
    pub async fn change_voters(&self, voters: BTreeSet<NodeId>) -> Result<()> {
        if voters.is_empty() {
            return Err(Error::InvalidArgument(
                "the voter set cannot be empty".into(),
            ));
        }
        self.change_voters_from(|_, _| Ok(voters.clone())).await
    }

    /// Makes learner `id` a voter too, the other voters staying as they are: the change that
    /// [`MetaNode::change_voters`] makes with the current voters and `id`, computed by the
    /// leader under its membership lock, so that two such changes made at once both count.
    /// No change if `id` is a voter already.
    pub async fn add_voter(&self, id: NodeId) -> Result<()> {
        self.change_voters_from(|current, _| {
            let mut voters = current.clone();
            voters.insert(id);
            Ok(voters)
        })
        .await
    }

    /// Makes voter `id` leave the cluster, the other voters staying as they are (computed as
    /// [`MetaNode::add_voter`] is). While a change is half done, a voter of the older set only
    /// (one the change replaces) is a voter too: its removal finishes the change.
    /// [`Error::NotFound`] if `id` is not a voter (also when a first call did it),
    /// [`Error::Conflict`] if it is the only one.
    pub async fn remove_voter(&self, id: NodeId) -> Result<()> {
        self.change_voters_from(|current, sets| {
            if !sets.iter().any(|set| set.contains(&id)) {
                return Err(Error::NotFound(format!("node {id} is not a voter")));
            }
            if current.len() == 1 && current.contains(&id) {
                return Err(Error::Conflict(format!(
                    "node {id} is the only voter: a cluster needs one (add and promote another \
                     member first)"
                )));
            }
            let mut voters = current.clone();
            voters.remove(&id);
            Ok(voters)
        })
        .await
    }

    /// Changes the voters to what `target` makes of the current ones (the newer set, while a
    /// change is half done) and of every voter set (two while a change is half done), checked
    /// as [`MetaNode::change_voters`] says. No change when that is the current set and no
    /// change is half done.
    async fn change_voters_from(
        &self,
        target: impl FnOnce(&BTreeSet<NodeId>, &[BTreeSet<NodeId>]) -> Result<BTreeSet<NodeId>>,
    ) -> Result<()> {
        // Not `one_change`: from a joint membership openraft goes to these voters itself (a
        // joint of the newer set and these, then these), keeping any node of either set that
        // they name; finishing the half-done change first would make its replaced voters leave.
        self.check_open()?;
        self.forward_if_follower()?;
        let _one = self.inner.changing.lock().await;
        let view = self.change_view()?;
        let sets = view.membership_config.membership().get_joint_config();
        let current = sets.last().cloned().unwrap_or_default();
        let voters = target(&current, sets)?;
        if sets.len() == 1 && voters == current {
            return Ok(());
        }
        // The voters and learners the checks below count must have answered since this call
        // (a heartbeat's round), not merely within the lease: one that stopped a moment ago
        // was heard from within it, and a change counting it could not commit, leaving the
        // cluster in a joint membership that takes no write until that node returns. Give
        // them a lease to answer before the checks refuse the change for want of a majority or
        // of a caught-up learner (a node that is no learner is refused at once).
        let asked = std::time::Instant::now();
        let _ = self
            .inner
            .raft
            .wait(Some(self.lease()))
            .metrics(
                |m| {
                    let promotable = match self.check_promotable(m, &voters, asked) {
                        Ok(()) | Err(Error::InvalidArgument(_)) => true,
                        Err(_) => false,
                    };
                    promotable && self.check_majorities_answer(m, &voters, asked).is_ok()
                },
                "a majority of each voter set answers, and the learners it adds caught up",
            )
            .await;
        let change = self.checked_change(
            |m| {
                self.check_promotable(m, &voters, asked)?;
                self.check_majorities_answer(m, &voters, asked)
            },
            |raft| {
                let change = ChangeMembers::ReplaceAllVoters(voters.clone());
                async move { raft.change_membership(change, false).await }
            },
        );
        if voters.contains(&self.id()) {
            return change.await;
        }
        // A leader that removes itself may step down before it applies the change, and then
        // never answers it: openraft answers a change once it applied it, and a removed node
        // learns no commit index, so the caller waited out the request timeout (seen under
        // load, 3 times in 25). The change is made once this node's committed membership is it.
        let since = *view.committed_membership_config.log_id();
        tokio::select! {
            changed = change => changed,
            () = self.until_committed(&voters, since) => Ok(()),
        }
    }

    /// Returns once this node's committed membership, newer than the one committed at `since`,
    /// is `voters` alone (not joint), or never.
    async fn until_committed(&self, voters: &BTreeSet<NodeId>, since: Option<LogId>) {
        let committed = self
            .inner
            .raft
            .wait(Some(self.inner.cfg.request_timeout))
            .metrics(
                |m| {
                    let committed = &m.committed_membership_config;
                    *committed.log_id() > since
                        && committed.membership().get_joint_config().as_slice()
                            == std::slice::from_ref(voters)
                },
                "the change is committed",
            )
            .await;
        if committed.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Takes the membership lock for one change of learners or addresses (refused on a node
    /// that is closed or knows another leader: the change goes there) and finishes a voter
    /// change a caller left half done.
    async fn one_change(&self) -> Result<tokio::sync::MutexGuard<'_, ()>> {
        self.check_open()?;
        self.forward_if_follower()?;
        let one = self.inner.changing.lock().await;
        self.finish_joint().await?;
        Ok(one)
    }

    /// A voter change whose caller went away between openraft's two steps (a timeout, a
    /// dropped request) leaves a joint membership: every commit then needs a majority of both
    /// voter sets, and openraft does not finish it by itself. The next change finishes it first
    /// (the step openraft would have taken: to the newer voter set alone).
    async fn finish_joint(&self) -> Result<()> {
        let joint = self
            .change_view()
            .is_ok_and(|m| m.membership_config.membership().get_joint_config().len() > 1);
        if !joint {
            return Ok(());
        }
        tracing::warn!("finishing a voter change that was left half done (joint membership)");
        let written = self
            .membership_call(
                |raft| async move {
                    let change = ChangeMembers::AddVoterIds(BTreeSet::new());
                    raft.change_membership(change, false).await
                },
                || Ok(()),
            )
            .await?;
        self.until_shown(&written).await;
        Ok(())
    }

    /// Runs `call`, a membership change, once `check` passes on the leader's view, and checks
    /// again after any wait for an uncommitted change (a learner may have fallen behind
    /// meanwhile). Call with the membership lock held ([`MetaNode::one_change`]).
    async fn checked_change<F, Fut>(
        &self,
        check: impl Fn(&Metrics) -> Result<()>,
        call: F,
    ) -> Result<()>
    where
        F: FnMut(crate::types::Raft) -> Fut,
        Fut: std::future::Future<
                Output = std::result::Result<
                    Written,
                    RaftError<
                        crate::types::TypeConfig,
                        openraft::error::ClientWriteError<crate::types::TypeConfig>,
                    >,
                >,
            > + Send
            + 'static,
    {
        let recheck = || check(&self.change_view()?);
        recheck()?;
        let written = self.membership_call(call, recheck).await?;
        self.until_shown(&written).await;
        Ok(())
    }

    /// Waits, at most the request timeout, until this node's metrics show the membership that
    /// `written` set. openraft answers a change once its entry is applied, and may publish its
    /// metrics only after: the caller's next status (the answer to an HTTP change shows the
    /// members), or the next change's checks, would see the membership from before.
    async fn until_shown(&self, written: &Written) {
        let index = written.log_id.index;
        let shown = self
            .inner
            .raft
            .wait(Some(self.inner.cfg.request_timeout))
            .metrics(
                |m| {
                    m.membership_config
                        .log_id()
                        .as_ref()
                        .is_some_and(|l| l.index >= index)
                },
                "the metrics show the new membership",
            )
            .await;
        if let Err(e) = shown {
            tracing::warn!("a membership change committed, but {e}");
        }
    }
}

/// What openraft answers a membership change with: its entry's log id, and the membership.
type Written = openraft::raft::ClientWriteResponse<crate::types::TypeConfig>;

impl MetaNode {
    /// The leader's view, for a membership change to be checked against and proposed on.
    /// Refused on a node whose metrics do not show it leading rather than left unchecked: its
    /// core may have just won an election, and would take a change nobody checked. Refused with
    /// [`Error::Removed`] on a leader whose membership no longer names it: openraft lets a
    /// leader that removed itself lead on until it steps down (150 ms after the removal
    /// commits, so the followers learn of it), and a membership change proposed there meant a
    /// membership entry from a leader of no cluster (a debug build's core panics on it).
    pub(super) fn change_view(&self) -> Result<Metrics> {
        let Some(m) = self.leader_view() else {
            return Err(self.not_leading());
        };
        if let Some(members) = self.removed(&m) {
            return Err(Error::Removed { members });
        }
        // A leader no quorum acknowledged for two election timeouts is cut off: it refuses at
        // once, as it does writes and reads (a change would wait out its checks, then be
        // refused for a majority that does not answer), unless it stood still lately and has
        // not read the acknowledgements yet.
        if self.unacknowledged_for().is_some() && !self.stalled_lately() {
            return Err(Error::NoLeader);
        }
        Ok(m)
    }
}

/// A leader's Raft metrics.
pub(super) type Metrics = openraft::RaftMetrics<crate::types::TypeConfig>;

/// Whether the leader whose metrics are `m` heard from member `id` after `asked`.
pub(super) fn answered_since(m: &Metrics, id: NodeId, asked: std::time::Instant) -> bool {
    MetaNode::progress_of(m, id)
        .1
        .is_some_and(|d| d < asked.elapsed())
}

/// Whether `m`'s membership may take node `id` at `addr` as a learner: [`Error::Conflict`] for
/// a voter, a learner at another address, or an address another member has.
fn learner_addable(m: &Metrics, id: NodeId, addr: &str) -> Result<()> {
    let membership = m.membership_config.membership();
    if membership.voter_ids().any(|v| v == id) {
        return Err(Error::Conflict(format!("node {id} is a voter already")));
    }
    if let Some(known) = membership.get_node(&id) {
        if known.addr != addr {
            return Err(Error::Conflict(format!(
                "learner {id} is at {}; remove it before adding it at {addr}",
                known.addr
            )));
        }
    }
    check_address_free(membership, id, addr)
}

/// The address `m`'s membership names for member `id`; [`Error::NotFound`] if it is no member.
fn address_in(m: &Metrics, id: NodeId) -> Result<String> {
    match m.membership_config.membership().get_node(&id) {
        Some(known) => Ok(known.addr.clone()),
        None => Err(Error::NotFound(format!("node {id} is not a member"))),
    }
}

/// [`Error::Conflict`] if a member other than `id` is at `addr`: one process cannot be two
/// members (it would hold two votes, and stopping it would cost the cluster two).
fn check_address_free(
    membership: &openraft::Membership<NodeId, Node>,
    id: NodeId,
    addr: &str,
) -> Result<()> {
    match membership
        .nodes()
        .find(|(other, n)| **other != id && n.addr == addr)
    {
        Some((other, _)) => Err(Error::Conflict(format!(
            "{addr} is the address of node {other} already: each member needs its own"
        ))),
        None => Ok(()),
    }
}

/// How many entries behind the leader's last log index a learner may be when it becomes a voter.
pub const MAX_PROMOTION_LAG: u64 = 1000;

impl MetaNode {
    /// [`Error::ForwardToLeader`] when this node's metrics name another leader: a membership
    /// call goes to the leader (openraft logs one made on a follower as an error).
    pub(super) fn forward_if_follower(&self) -> Result<()> {
        match self.leader_elsewhere() {
            Some(forward) => Err(forward),
            None => Ok(()),
        }
    }

    /// This node's Raft metrics if it leads, else `None`: only the leader's view of the
    /// membership and of its followers is current. Elsewhere the change is refused with
    /// [`Error::ForwardToLeader`] and checked by the leader.
    pub(super) fn leader_view(&self) -> Option<openraft::RaftMetrics<crate::types::TypeConfig>> {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        (m.state == ServerState::Leader).then_some(m)
    }

    /// What a leader's metrics `m` say of member `id`: the highest log index known replicated to
    /// it, and how long ago it last acknowledged the leader (`None`: never).
    pub(super) fn progress_of(
        m: &openraft::RaftMetrics<crate::types::TypeConfig>,
        id: NodeId,
    ) -> (Option<u64>, Option<std::time::Duration>) {
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned().flatten())
            .map(|l| l.index);
        let heard = m
            .heartbeat
            .as_ref()
            .and_then(|h| h.get(&id).cloned().flatten())
            .map(|t| openraft::Instant::elapsed(&*t));
        (matched, heard)
    }

    /// Checks that every voter set the change needs a majority of has a majority that
    /// acknowledged the leader since `asked`: the current voters (two sets while a change is
    /// half done) and `voters`. openraft commits the change, and every write after it, only with
    /// a majority of each, so removing a voter that answers while others are down would stall
    /// the cluster until they return.
    fn check_majorities_answer(
        &self,
        m: &Metrics,
        voters: &BTreeSet<NodeId>,
        asked: std::time::Instant,
    ) -> Result<()> {
        let answers = |id: NodeId| id == m.id || answered_since(m, id, asked);
        let current = m.membership_config.membership().get_joint_config();
        for set in current.iter().chain(std::iter::once(voters)) {
            let silent: Vec<NodeId> = set.iter().copied().filter(|&id| !answers(id)).collect();
            if (set.len() - silent.len()) * 2 > set.len() {
                continue;
            }
            let which = if set == voters { "new" } else { "current" };
            return Err(Error::Conflict(format!(
                "the {which} voters {set:?} lack a majority that answers: the leader has not \
                 heard from {silent:?} in the {} ms since the request, and the change commits \
                 only with a majority of both the current and the new voters (every write would \
                 wait behind it); bring those nodes back first, or keep answering voters in the \
                 new set",
                asked.elapsed().as_millis()
            )));
        }
        Ok(())
    }

    /// Checks that every node `voters` adds is a learner the leader heard from since `asked`
    /// and whose log is caught up to within [`MAX_PROMOTION_LAG`] entries.
    fn check_promotable(
        &self,
        m: &Metrics,
        voters: &BTreeSet<NodeId>,
        asked: std::time::Instant,
    ) -> Result<()> {
        let membership = m.membership_config.membership();
        let last = m.last_log_index.unwrap_or(0);
        for &id in voters {
            if membership.voter_ids().any(|v| v == id) {
                continue;
            }
            if !membership.learner_ids().any(|l| l == id) {
                return Err(Error::InvalidArgument(format!(
                    "node {id} is neither a voter nor a learner: add it as a learner first"
                )));
            }
            let (matched, heard) = Self::progress_of(m, id);
            let caught_up = matched.is_some_and(|i| last.saturating_sub(i) <= MAX_PROMOTION_LAG);
            let reachable = answered_since(m, id, asked);
            if !(caught_up && reachable) {
                let short = self
                    .inner
                    .cfg
                    .peer_refusals
                    .snapshot_refusal(id, ROOM_REFUSAL_RECENT);
                if let Some(why) = short {
                    return Err(Error::Conflict(format!(
                        "learner {id} cannot become a voter yet: it refuses the leader's snapshot, \
                         which it needs to catch up: {why}")));
                }
                let (has, heard) = progress_words(matched, last, heard);
                return Err(Error::Conflict(format!(
                    "learner {id} cannot become a voter yet: it has {has} and {heard}; a voter that cannot keep up could leave the cluster without a \
                     quorum (wait until it catches up, or check that it runs, is reachable, and \
                     has room for the leader's snapshot: its own GET /v1/cluster names a refusal \
                     in `snapshot_refused`)"
                )));
            }
        }
        Ok(())
    }
}

/// A member's progress as [`MetaNode::progress_of`] gives it, in words for an error: how much
/// of the log it is known to have, against the leader's `last` index, and when the leader last
/// heard from it (`never`).
pub(super) fn progress_words(
    matched: Option<u64>,
    last: u64,
    heard: Option<std::time::Duration>,
) -> (String, String) {
    (
        matched.map_or(
            format!("none of the log yet (the leader's reaches index {last})"),
            |i| format!("the log up to index {i} of the leader's {last}"),
        ),
        heard.map_or("was never heard from".to_owned(), |d| {
            format!("was last heard from {} ms ago", d.as_millis())
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::progress_words;

    #[test]
    fn progress_reads_as_words() {
        let (has, heard) = progress_words(None, 817, None);
        assert_eq!(has, "none of the log yet (the leader's reaches index 817)");
        assert_eq!(heard, "was never heard from");
        let (has, heard) = progress_words(Some(5), 817, Some(std::time::Duration::from_millis(9)));
        assert_eq!(has, "the log up to index 5 of the leader's 817");
        assert_eq!(heard, "was last heard from 9 ms ago");
    }
}
