//! The write path: routing a command to the leader, proposing it through the admission
//! window, and mapping openraft's answers (forward to leader, lease refusals) to errors.

use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{ChangeMembershipError, ClientWriteError, ForwardToLeader, RaftError};

use super::validation::validate;
use super::MetaNode;
use crate::command::{Command, CommandResult, ShardReport};
use crate::error::{Error, Result};
use crate::types::{NodeId, Raft, TypeConfig};
use crate::uncancelled::uncancelled;
use crate::view::Written;

impl MetaNode {
    /// Maps openraft's routing information to [`Error::ForwardToLeader`] (or `NoLeader`).
    pub(super) fn forward(&self, f: &ForwardToLeader<TypeConfig>) -> Error {
        // Openraft names the leader once this node's vote is committed; until then the metrics
        // may already know it.
        let leader = f
            .leader_id
            .or_else(|| self.inner.raft.metrics().borrow_watched().current_leader);
        let removed = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            self.removed(&*m)
        };
        if let Some(members) = removed {
            return Error::Removed { members };
        }
        let Some(leader) = leader else {
            return self.no_leader();
        };
        let addr = f.leader_node.as_ref().map(|n| n.addr.clone()).or_else(|| {
            let m = self
                .inner
                .raft
                .metrics()
                .borrow_watched()
                .membership_config
                .clone();
            m.get_node(&leader).map(|n| n.addr.clone())
        });
        match addr {
            Some(leader_addr) if leader != self.id() => Error::ForwardToLeader {
                leader_id: leader,
                leader_addr,
            },
            _ => self.no_leader(),
        }
    }

    /// Why this node knows no leader: it is in no cluster ([`Error::NotMember`]), was removed
    /// from its cluster ([`Error::Removed`]), too many of its voters refuse its messages as
    /// another cluster's ([`Error::RefusedByMembers`]), or it waits for an election
    /// ([`Error::NoLeader`]).
    pub(super) fn no_leader(&self) -> Error {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        if membership.voter_ids().next().is_none() {
            return self.rejoin_wait().unwrap_or(Error::NotMember);
        }
        if let Some(members) = self.removed(&*m) {
            return Error::Removed { members };
        }
        let refusing = self.refused_by();
        if !refusing.is_empty() {
            let voters = membership.voter_ids().collect();
            if crate::peer_refusals::no_quorum_left(&voters, &refusing) {
                let refusing = refusing.intersection(&voters).copied().collect();
                return Error::RefusedByMembers { refusing };
            }
        }
        Error::NoLeader
    }

    /// The members whose answers lately refused this node's messages as another cluster's
    /// (`peer_refusals.rs`), within its `RECENT` (30 s): a candidate asks for
    /// votes every election timeout, and a leader asks such a member every few seconds, so an
    /// older refusal is one no later message repeated (the member was not asked again). A
    /// member that takes a message is off the list at once.
    pub fn refused_by(&self) -> std::collections::BTreeSet<NodeId> {
        self.inner
            .cfg
            .peer_refusals
            .within(crate::peer_refusals::RECENT)
    }

    /// The members whose answers lately refused this node's token (401), within the same
    /// `RECENT` as [`MetaNode::refused_by`]: one side was started with another `--token`.
    pub fn token_refused_by(&self) -> std::collections::BTreeSet<NodeId> {
        self.inner
            .cfg
            .peer_refusals
            .token_within(crate::peer_refusals::RECENT)
    }

    /// The voters whose address this node's last message found nothing listening at (they
    /// stopped, or their host is down), and that have not answered since.
    pub fn voters_not_listening(&self) -> std::collections::BTreeSet<NodeId> {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let voters: std::collections::BTreeSet<NodeId> =
            m.membership_config.membership().voter_ids().collect();
        let gone = self.inner.cfg.peer_refusals.not_connected();
        voters.intersection(&gone).copied().collect()
    }

    /// Whether this node is a member of a cluster that has not removed it and whose voters
    /// take its messages: one that knows no leader waits for an election, and may learn of one.
    pub fn in_cluster(&self) -> bool {
        !matches!(
            self.no_leader(),
            Error::NotMember | Error::Removed { .. } | Error::RefusedByMembers { .. }
        )
    }

    /// The leader this node's metrics name: itself when it leads, else as
    /// [`MetaNode::leader_to_forward_to`].
    pub fn known_leader(&self) -> Option<NodeId> {
        self.known_leader_and_term().0
    }

    /// [`MetaNode::known_leader`], and the term this node is in, read together (from the
    /// server metrics that [`MetaNode::leader_after`] watches).
    pub fn known_leader_and_term(&self) -> (Option<NodeId>, u64) {
        let metrics = self.inner.raft.server_metrics();
        let m = metrics.borrow_watched();
        let term = m.vote.leader_id().term;
        if m.state == openraft::ServerState::Leader {
            return (Some(self.id()), term);
        }
        (self.other_leader(&m).map(|(id, _)| id), term)
    }

    /// `ForwardToLeader` when this node's metrics already name another node as leader, so a
    /// follower forwards a request without a round trip through its Raft core. `None`: this
    /// node may lead; ask the core (which answers `ForwardToLeader` itself if it does not).
    pub(super) fn leader_elsewhere(&self) -> Option<Error> {
        self.leader_to_forward_to()
            .map(|(leader_id, leader_addr)| Error::ForwardToLeader {
                leader_id,
                leader_addr,
            })
    }

    /// Checks `cmd` as [`MetaNode::write`] would ([`Error::InvalidArgument`] for bad input) and
    /// says where it should be proposed: `Ok(None)` here (this node may lead, or knows no
    /// leader: `write` asks the Raft core), `Ok(Some((id, addr)))` at the leader this node's
    /// metrics name. Changes nothing.
    pub fn route(&self, cmd: &Command) -> Result<Option<(NodeId, String)>> {
        self.check_open()?;
        validate(cmd)?;
        Ok(self.leader_to_forward_to())
    }

    /// This node's current term.
    pub fn term(&self) -> u64 {
        self.inner.raft.metrics().borrow_watched().current_term
    }

    /// Waits, at most `within`, for this node to know a leader other than `stale`, the leader
    /// that refused a write in `term` without acting on it (it no longer leads, could not be
    /// reached, hands its leadership over, or has no quorum; this node, if it led when its own
    /// core refused: see [`MetaNode::led_before`]): another node, or the same one elected again
    /// in a later term (`Some(Some((id, addr)))`), this node (`Some(None)`: write here), or
    /// `None` if none is known in time. With no `stale` leader, any leader will do.
    /// `None` at once, too, once this node begins to close ([`MetaNode::begin_close`]): a
    /// request waiting here would hold its drain (a whole cluster stopped at once waited out
    /// the request timeout for a leader none of its stopping members would become), and its
    /// client does better to ask another member.
    pub async fn next_leader(
        &self,
        stale: Option<NodeId>,
        term: u64,
        within: Duration,
    ) -> Option<Option<(NodeId, String)>> {
        tokio::select! {
            next = tokio::time::timeout(within, self.leader_after(stale, term)) => {
                next.ok().flatten()
            }
            () = self.closing() => None,
        }
    }

    /// [`MetaNode::next_leader`] without a bound: `None` only once the Raft core stopped. It
    /// wakes on changes of this node's role, vote, leader and membership (openraft's server
    /// metrics), not on every write: many requests wait in it at once under load.
    pub async fn leader_after(
        &self,
        stale: Option<NodeId>,
        term: u64,
    ) -> Option<Option<(NodeId, String)>> {
        let mut metrics = self.inner.raft.server_metrics();
        loop {
            {
                let m = metrics.borrow_and_update();
                let later = m.vote.leader_id().term > term;
                // A leader that refused a write itself takes writes again only once it is
                // elected again.
                if m.state == openraft::ServerState::Leader {
                    if stale != Some(self.id()) || later {
                        return Some(None);
                    }
                } else if let Some(named) = self
                    .other_leader(&m)
                    .filter(|(l, _)| stale != Some(*l) || later)
                {
                    return Some(Some(named));
                }
            }
            metrics.changed().await.ok()?;
        }
    }

    /// How long this node has led in `term` (`None`: it does not lead in that term, or its
    /// election is not recorded yet).
    pub(super) fn led_for(&self, term: u64) -> Option<std::time::Duration> {
        let led = *self.inner.led_since.lock();
        led.filter(|(t, _)| *t == term)
            .map(|(_, since)| since.elapsed())
    }

    /// Whether this node leads, and has led since before `at` in its current term: a write its
    /// core refused after `at` was refused by a leader (one handing its leadership over, or
    /// without a quorum), not by a node still campaigning, which may lead a moment later.
    pub fn led_before(&self, at: std::time::Instant) -> bool {
        let (leads, term) = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            (m.state == openraft::ServerState::Leader, m.current_term)
        };
        leads
            && self
                .inner
                .led_since
                .lock()
                .is_some_and(|(t, since)| t == term && since <= at)
    }

    /// Whether a `no_leader` refusal that this node's core gave after `at` comes from a leader
    /// without a quorum: it led since before `at` (see [`MetaNode::led_before`]), is not
    /// handing its leadership over (whose refusals end with the next leader's election), and
    /// did not stand still lately (a paused leader that resumes lacks the acknowledgements it
    /// could not read, and learns a moment later that another leads: the requests it held go
    /// on to that leader, rather than answered `no_leader`). Such a refusal is answered at
    /// once, so that clients try another member.
    pub fn lacks_quorum_since(&self, at: std::time::Instant) -> bool {
        self.led_before(at) && !self.handing_over() && !self.stalled_lately()
    }

    /// The leader (id and address) this node's metrics name, when that is another node (a
    /// follower's view: it may be stale). `None` on a leader or when no leader is known.
    pub fn leader_to_forward_to(&self) -> Option<(NodeId, String)> {
        let metrics = self.inner.raft.server_metrics();
        let m = metrics.borrow_watched();
        self.other_leader(&m)
    }

    /// The other node that server metrics `m` name as leader, with its address; `None` when
    /// this node leads, no leader is known, or this node was removed (its view of the leader
    /// is stale: it refuses instead, `no_leader`). A rejoining node takes the address the
    /// leader's own messages name (`note_member_address`): the membership it replays may be
    /// from before the leader moved, or before it joined.
    fn other_leader(
        &self,
        m: &openraft::metrics::RaftServerMetrics<TypeConfig>,
    ) -> Option<(NodeId, String)> {
        if m.state == openraft::ServerState::Leader {
            return None;
        }
        let leader = m.current_leader.filter(|l| *l != self.id())?;
        if self.removed(m).is_some() {
            return None;
        }
        let noted = self.noted_address(leader);
        let addr = match noted {
            Some(addr) => addr,
            None => m
                .membership_config
                .membership()
                .get_node(&leader)?
                .addr
                .clone(),
        };
        Some((leader, addr))
    }

    fn write_error(&self, e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Error {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => self.forward(&f),
            RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => {
                Error::OutcomeUnknown(format!(
                    "entry discarded on leader change (leader now {:?})",
                    f.leader_id
                ))
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => match e {
                ChangeMembershipError::InProgress(_) => Error::Conflict(
                    "a membership change is under way; retry once it has completed".into(),
                ),
                ChangeMembershipError::LearnerNotFound(l) => Error::InvalidArgument(format!(
                    "node {} is neither a voter nor a learner: add it as a learner first",
                    l.node_id
                )),
                other => Error::InvalidArgument(other.to_string()),
            },
            // A membership change whose second step found the membership changed since its
            // first (one made around this node's lock, or by a former leader).
            RaftError::APIError(ClientWriteError::PreconditionFailed(p)) => Error::Conflict(
                format!("the membership changed while this change was made ({p}): look at it and ask again"),
            ),
            // The core stopped (shut down, storage failed) with the write submitted: it may have
            // reached the followers, and the next leader would commit it. Not `Shutdown`,
            // which says the request was not acted on and may be sent again as it is.
            RaftError::Fatal(f) => {
                self.log_core_stopped(&f);
                Error::OutcomeUnknown(format!(
                    "this node's Raft stopped while the write was under way ({f}): it may \
                     still commit under the next leader"
                ))
            }
        }
    }

    /// Whether openraft refused because this leader's lease is not (yet, or any more) backed by
    /// a quorum: a fresh leader answers so until its first quorum acknowledgement.
    fn lease_refusal(e: &RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> bool {
        matches!(
            e,
            RaftError::APIError(ClientWriteError::ForwardToLeader(f))
                if f.reason == openraft::error::ForwardReason::LeaseExpired && f.leader_id.is_none()
        )
    }

    /// Waits, at most until `deadline`, until the newest membership this node knows is
    /// committed, or this node no longer leads (a change asked of it then goes elsewhere).
    async fn await_membership_committed(&self, deadline: tokio::time::Instant) {
        let mut rx = self.inner.raft.metrics();
        let mut waited = false;
        loop {
            let done = {
                let m = rx.borrow_and_update();
                let committed =
                    m.membership_config.log_id() == m.committed_membership_config.log_id();
                committed || m.state != openraft::ServerState::Leader
            };
            if done {
                if !waited {
                    // openraft refused the change as one under way, yet its metrics show none:
                    // they may lag behind it. They get a moment before it is asked again.
                    let _ = self.await_metrics_change(deadline).await;
                }
                return;
            }
            waited = true;
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    }

    /// Waits (at most until `deadline`, and at most 100 ms) for the Raft metrics to change.
    pub(super) async fn await_metrics_change(&self, deadline: tokio::time::Instant) -> Result<()> {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout);
        }
        let mut rx = self.inner.raft.metrics();
        // A new receiver takes the value sent last as not seen yet, and would end the wait at
        // once: its callers looked at that value already.
        drop(rx.borrow_and_update());
        let until = deadline.min(tokio::time::Instant::now() + Duration::from_millis(100));
        let _ = tokio::time::timeout_at(until, rx.changed()).await;
        Ok(())
    }

    /// Runs `call` until it answers something other than openraft's lease refusal (a fresh
    /// leader waiting for its first quorum acknowledgement, `is_lease_refusal`; reads also
    /// retry while no leader is known), for at most [`MetaNode::lease_wait`] from the first
    /// refusal (then [`Error::NoLeader`]) and at most the request timeout (then
    /// [`Error::Timeout`]). Returns that other answer. A call the caller gives up on runs to
    /// its end (`uncancelled.rs`).
    pub(super) async fn retry_lease_refusal<T, E, F, Fut>(
        &self,
        mut call: F,
        is_lease_refusal: impl Fn(&E) -> bool,
    ) -> Result<std::result::Result<T, E>>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnMut(Raft) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, E>> + Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + self.inner.cfg.request_timeout;
        // Counted from the first refusal, not from the call: a process that was paused since
        // the call began (SIGSTOP, a stalled VM) had no time to learn of a new leader.
        let mut lease_deadline = None;
        loop {
            let attempt = uncancelled(call(self.inner.raft.clone()));
            let res = tokio::time::timeout_at(deadline, attempt)
                .await
                .map_err(|_| Error::Timeout)?;
            match res {
                Err(e) if is_lease_refusal(&e) => {
                    let now = tokio::time::Instant::now();
                    let until = *lease_deadline
                        .get_or_insert_with(|| deadline.min(now + self.lease_wait()));
                    // No election makes a node that is not a member lead: say so at once. Nor
                    // does waiting help a leader no quorum acknowledged for two election
                    // timeouts (it is cut off): its clients do better to ask another member.
                    let why = self.no_leader();
                    // Nor one that has known no leader for that long (too few voters answer
                    // to elect one).
                    let cut_off =
                        self.unacknowledged_for().is_some() || self.long_leaderless().is_some();
                    if !matches!(why, Error::NoLeader) || now >= until || cut_off {
                        return Err(why);
                    }
                    // Also woken once no leader has been named for too long: the call is
                    // refused then, with the requests that arrive later.
                    tokio::select! {
                        _ = self.await_metrics_change(until) => {}
                        _ = self.leaderless_silenced() => {}
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// Runs a client-write-like call through [`MetaNode::retry_lease_refusal`]. A call under
    /// way when this leader's quorum falls silent ([`MetaNode::quorum_silenced`]) is answered
    /// [`Error::OutcomeUnknown`] then, not at the request timeout: its client asks another
    /// member sooner.
    pub(super) async fn leader_call<T, F, Fut>(&self, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(Raft) -> Fut,
        Fut: std::future::Future<
                Output = std::result::Result<
                    T,
                    RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
                >,
            > + Send
            + 'static,
    {
        // A leader already unacknowledged takes no write (openraft refuses it once the lease
        // ran out, `NoLeader`): only writes it took before are told of the silence.
        let acknowledged = self.unacknowledged_for().is_none();
        let called = self.retry_lease_refusal(call, Self::lease_refusal);
        tokio::select! {
            res = called => res?.map_err(|e| self.write_error(e)),
            silence = self.quorum_silenced(), if acknowledged => Err(Error::OutcomeUnknown(format!(
                "no quorum of voters has acknowledged this leader for {} ms while the write \
                 was under way (it is cut off from them, or they stopped): another leader may \
                 be elected without it, or commit it; read it back before writing it again",
                silence.as_millis()
            ))),
            () = self.until_removed_and_not_leading() => Err(Error::OutcomeUnknown(
                "this node was removed from the voters and stepped down while the write was \
                 under way: it learns no more of the log, and the new voters may still commit it"
                    .into(),
            )),
        }
    }

    /// Resolves once this node does not lead and a membership leaves it out (a voter change
    /// removed it): nobody replicates to it any more, so openraft never answers a write it
    /// proposed that is still uncommitted (one that followed the membership that removed it).
    /// A removed leader leads on until that membership commits, and answers the writes before it.
    /// Never, for a node removed before the call.
    async fn until_removed_and_not_leading(&self) {
        let mut metrics = self.inner.raft.server_metrics();
        let gone = |m: &openraft::metrics::RaftServerMetrics<TypeConfig>| {
            m.state != openraft::ServerState::Leader && self.removed(m).is_some()
        };
        // Removed before the call: the call refuses it itself (`Removed`).
        let before = gone(&metrics.borrow_and_update());
        if !before {
            while metrics.changed().await.is_ok() {
                if gone(&metrics.borrow_and_update()) {
                    return;
                }
            }
        }
        std::future::pending().await
    }

    /// Runs a membership call through [`MetaNode::leader_call`], and while openraft refuses it
    /// because the previous membership change is not committed yet, waits for that commit and
    /// asks again, for at most the request timeout (then [`Error::Conflict`]). A fresh leader
    /// is in that state until it commits its first entry, so without this an operator who adds
    /// a learner right after the cluster forms (or two operators at once) got a conflict for
    /// a change that would have gone through milliseconds later.
    /// `recheck` runs after each wait: what the caller checked may have changed meanwhile.
    pub(super) async fn membership_call<T, F, Fut>(
        &self,
        mut call: F,
        recheck: impl Fn() -> Result<()>,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(Raft) -> Fut,
        Fut: std::future::Future<
                Output = std::result::Result<
                    T,
                    RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
                >,
            > + Send
            + 'static,
    {
        let deadline = tokio::time::Instant::now() + self.inner.cfg.request_timeout;
        loop {
            let res = self
                .retry_lease_refusal(&mut call, Self::lease_refusal)
                .await?;
            match res {
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(_),
                ))) if tokio::time::Instant::now() < deadline => {
                    self.await_membership_committed(deadline).await;
                    recheck()?;
                }
                other => return other.map_err(|e| self.write_error(e)),
            }
        }
    }

    /// Proposes `cmd` and returns once it is committed (durable on a quorum) and applied here.
    /// On a follower: [`Error::ForwardToLeader`]. Bad input: [`Error::InvalidArgument`], nothing
    /// proposed.
    ///
    /// Writes wait for room in the admission window (`max_pending_shards`; small writes in a
    /// lane of their own, `admission.rs`) before they are proposed, for at most the request
    /// timeout ([`Error::Timeout`]); the write itself then has the request timeout again.
    ///
    /// A removal (`RemoveDatanode`) may be answered with its first piece only (`removal.rs`).
    pub async fn write(&self, cmd: Command) -> Result<Written> {
        match cmd {
            Command::RemoveDatanode { id } => self.remove_datanode(id).await,
            cmd => self.write_one(cmd).await,
        }
    }

    /// [`MetaNode::write`] of one entry.
    pub(super) async fn write_one(&self, cmd: Command) -> Result<Written> {
        self.check_open()?;
        validate(&cmd)?;
        if let Some(forward) = self.leader_elsewhere() {
            return Err(forward);
        }
        self.check_free_space(&cmd)?;
        self.ensure_version(&cmd).await?;
        let deadline = tokio::time::Instant::now() + self.inner.cfg.request_timeout;
        let room = self.inner.admission.room(cmd.weight());
        let room = tokio::time::timeout_at(deadline, room)
            .await
            .map_err(|_| Error::Timeout)?
            .map_err(|_| self.closed())?;
        self.check_version(&cmd)?;
        // The room and the liveness record go with the proposal, which runs to its end even
        // when this caller gives up (`uncancelled.rs`): a write that timed out holds its room
        // until openraft answers it (else retries let unbounded work in exactly when the
        // window matters), and a registration that commits after its caller gave up is still
        // recorded (else the datanode read as down). A registration is marked proposed until
        // then: it is applied, and read, a moment before it is recorded.
        let proposed = match &cmd {
            Command::RegisterDatanode { id, .. } | Command::RegisterDatanodeAtLeast { id, .. } => {
                self.proposing_registration(*id)
            }
            _ => None,
        };
        let room = std::sync::Arc::new((room, proposed));
        let r = self
            .leader_call(|raft| {
                let cmd = cmd.clone();
                let room = room.clone();
                let node = self.clone();
                async move {
                    let removing = match cmd {
                        Command::RemoveDatanode { id }
                        | Command::RemoveDatanodePiece { id, .. } => Some(id),
                        _ => None,
                    };
                    let answer = raft.client_write(cmd).await;
                    if let Ok(r) = &answer {
                        match (&r.data, removing) {
                            (CommandResult::DatanodeRegistered { id, .. }, _) => {
                                node.note_registration(*id, r.log_id.index, r.log_id.leader_id.term)
                            }
                            // Its heartbeats no longer count it alive (it was, until a liveness
                            // read or the timeout).
                            (CommandResult::DatanodeRemoved { .. }, Some(id))
                            | (CommandResult::RemovalPiece { gone: true, .. }, Some(id)) => {
                                node.inner.liveness.lock().forget(id, r.log_id.index)
                            }
                            _ => {}
                        }
                    }
                    drop(room);
                    answer
                }
            })
            .await?;
        Ok(Written {
            index: r.log_id.index,
            result: r.data,
        })
    }

    /// Shards that proposed writes hold in the admission window (`max_pending_shards`) and
    /// the small writes' lane (`admission.rs`): those of writes openraft has not answered yet,
    /// including writes whose callers gave up.
    pub fn pending_shards(&self) -> u64 {
        self.inner.admission.pending()
    }

    /// Registers (or re-registers) a datanode; the result carries its new epoch.
    pub async fn register_datanode(&self, id: u64, addr: impl Into<String>) -> Result<Written> {
        self.write(Command::RegisterDatanode {
            id,
            addr: addr.into(),
        })
        .await
    }

    /// Registers a batch of replicas of `datanode` under incarnation `epoch`.
    pub async fn register_shards(
        &self,
        datanode: u64,
        epoch: u64,
        shards: Vec<ShardReport>,
    ) -> Result<Written> {
        self.write(Command::RegisterShards {
            datanode,
            epoch,
            shards,
        })
        .await
    }
}
