//! What every handler shares: the node, the metrics, the forwarding client, the token and
//! the readiness latch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use meta_consensus::{ClusterStatus, Consistency, MetaNode, Role};

use crate::answer_budget::AnswerBudget;
use crate::auth::Token;
use crate::cluster_identity::Refused;
use crate::error::ApiError;
use crate::follower_read::{CatchUp, FollowerReads, ReplayedReadIndex};
use crate::forward::Forwarder;
use crate::log_throttle::LogThrottle;
use crate::metrics::Metrics;
use crate::node_metrics::NodeCollector;
use crate::peer_client::PeerClient;
use crate::request::ReadConsistency;

/// What the admin and Raft routers serve from. Cloning is cheap, but it touches every field's
/// reference count: the routers hold it as [`SharedState`], which a request clones with one.
#[derive(Clone)]
pub struct AppState {
    /// The node every request is answered by.
    pub node: MetaNode,
    /// The `/metrics` registry.
    pub metrics: Metrics,
    /// Replays requests at the leader.
    pub forwarder: Forwarder,
    /// Answers a follower's linearizable reads locally, with the leader's read index.
    pub follower_reads: FollowerReads,
    /// The shared secret, if any.
    pub token: Token,
    /// Whether this node has caught up since it started.
    pub readiness: Arc<Readiness>,
    /// How long an admin request's body may take to arrive (default [`BODY_TIMEOUT`]).
    pub body_timeout: Duration,
    /// Watches that may wait at once (default [`WATCH_SLOTS`]): each holds a connection for
    /// up to a minute, and datanodes need connections too.
    pub watch_slots: Arc<tokio::sync::Semaphore>,
    /// The bytes of large answers that may wait to be read at once (`answer_budget.rs`).
    pub answer_budget: AnswerBudget,
    /// The messages between members refused, as logged: once per cause, then at most every
    /// 30 s.
    pub(crate) refusals: Arc<LogThrottle<Refused>>,
    /// A number drawn when this state is made, named in answers to identity questions
    /// (`cluster_identity::INSTANCE`): two addresses that reach this process tell it so.
    pub(crate) instance: u64,
}

/// A number drawn from the standard library's randomly keyed hasher (seeded from the operating
/// system, different per call): unique enough to tell processes apart, with no dependency.
fn random_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// The routers' state: axum clones it for every request, and for each middleware that reads
/// it, so it is one reference-counted pointer to the [`AppState`].
#[derive(Clone)]
pub struct SharedState(Arc<AppState>);

impl SharedState {
    pub fn new(state: AppState) -> Self {
        SharedState(Arc::new(state))
    }
}

impl std::ops::Deref for SharedState {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.0
    }
}

/// Watches that may wait at once unless the server says otherwise (it gives them half its
/// connection slots).
pub const WATCH_SLOTS: usize = 1024;

/// How long an admin request's body (at most 2 MiB) may take to arrive: a client that stalls
/// part way is answered 408 rather than holding a connection slot until it goes away.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

impl AppState {
    /// State for serving `node`, speaking plain HTTP to other members; the node's figures are
    /// added to the metrics registry.
    pub fn new(node: MetaNode, token: Token) -> Self {
        Self::with_peer_client(node, token, PeerClient::plain())
    }

    /// State for serving `node`, speaking to other members with `client` (TLS, when the node
    /// has it).
    pub fn with_peer_client(node: MetaNode, token: Token, client: PeerClient) -> Self {
        let metrics = Metrics::new(Some(Box::new(NodeCollector::new(node.clone()))));
        let readiness = Arc::new(Readiness::new(&node.status()));
        let build = node.config().build_version;
        let cluster = node.config().cluster_id.clone();
        let forwarder = Forwarder::new(node.id(), build, token.clone(), cluster, client);
        AppState {
            follower_reads: FollowerReads::new(
                node.id(),
                build,
                node.config().cluster_id.clone(),
                forwarder.client().clone(),
                token.clone(),
                metrics.clone(),
            ),
            forwarder,
            node,
            metrics,
            token,
            readiness,
            body_timeout: BODY_TIMEOUT,
            watch_slots: Arc::new(tokio::sync::Semaphore::new(WATCH_SLOTS)),
            answer_budget: AnswerBudget::default(),
            refusals: Arc::default(),
            instance: random_instance(),
        }
    }

    /// How the handlers speak to another node as a member of this one's cluster.
    pub fn member_link(&self) -> crate::cluster_identity::MemberLink<'_> {
        crate::cluster_identity::MemberLink {
            client: self.forwarder.client(),
            token: &self.token,
            cluster: &self.node.config().cluster_id,
        }
    }

    /// At most `slots` watches wait at once; more are refused with 503 `overloaded`.
    pub fn with_watch_slots(mut self, slots: usize) -> Self {
        self.watch_slots = Arc::new(tokio::sync::Semaphore::new(slots));
        self
    }

    /// Large answers may hold `bytes` at once while they wait to be read (default
    /// [`crate::answer_budget::DEFAULT_BUDGET_BYTES`]).
    pub fn with_answer_budget(mut self, bytes: usize) -> Self {
        self.answer_budget = AnswerBudget::new(bytes);
        self
    }

    /// How long an admin request's body may take to arrive (default [`BODY_TIMEOUT`]).
    pub fn with_body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// Whether a follower answers linearizable and lease reads itself, with the leader's read
    /// index (the default), or replays each at the leader.
    pub fn with_follower_reads(mut self, enabled: bool) -> Self {
        self.follower_reads = self.follower_reads.with_enabled(enabled);
        self
    }

    /// When a follower answers a read itself rather than replaying it at the leader (default
    /// [`crate::follower_read::CATCH_UP`]).
    pub fn with_follower_read_catch_up(mut self, catch_up: CatchUp) -> Self {
        self.follower_reads = self.follower_reads.with_catch_up(catch_up);
        self
    }

    /// Prepares a read with the consistency a request asked for and returns the consistency
    /// to read the node with (see [`FollowerReads::linearize`]).
    pub async fn read_consistency(
        &self,
        c: ReadConsistency,
        replayed: ReplayedReadIndex,
    ) -> Result<Consistency, ApiError> {
        self.follower_reads
            .linearize(&self.node, c.into(), replayed)
            .await
    }
}

impl FromRef<SharedState> for MetaNode {
    fn from_ref(state: &SharedState) -> MetaNode {
        state.node.clone()
    }
}

impl FromRef<SharedState> for Token {
    fn from_ref(state: &SharedState) -> Token {
        state.token.clone()
    }
}

impl FromRef<SharedState> for Metrics {
    fn from_ref(state: &SharedState) -> Metrics {
        state.metrics.clone()
    }
}

/// `/readyz`: a member of a cluster with a known leader whose applied index has reached the
/// leader's read index (its commit index) asked for then, and the commit index this node knew
/// when it started. The catch-up part latches once reached: a ready node stays ready while it
/// applies a little behind the leader, as followers do.
#[derive(Debug)]
pub struct Readiness {
    start_committed: u64,
    caught_up: AtomicBool,
    stopping: AtomicBool,
}

impl Readiness {
    /// Remembers the commit index known now (at start).
    pub fn new(status: &ClusterStatus) -> Self {
        Readiness {
            start_committed: status.committed.unwrap_or(0),
            caught_up: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    /// The node is about to stop: from now on it reports not ready, while it still serves.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Whether the node caught up once (then the leader's read index is not needed).
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }

    /// Whether `status` says the node is a member with a known leader (the part of readiness
    /// that does not latch).
    pub fn member_with_leader(status: &ClusterStatus) -> Result<(), String> {
        let member = status.voters.contains(&status.id) || status.learners.contains(&status.id);
        membership_wait(
            status.role == Role::Removed,
            member,
            status.rejoin.as_ref(),
            status.leader_id,
            status.applied.unwrap_or(0),
        )
    }

    /// `Ok` when ready, otherwise what the node still waits for; `leader_index` is the
    /// leader's read index, asked for while the node has not caught up yet.
    pub fn check(&self, status: &ClusterStatus, leader_index: Option<u64>) -> Result<(), String> {
        if self.stopping.load(Ordering::Acquire) {
            return Err("stopping".into());
        }
        let waiting = Self::member_with_leader(status)
            .and_then(|()| self.catch_up(status.applied.unwrap_or(0), leader_index));
        with_refusal(waiting, status.snapshot_refused.as_deref())
    }

    fn catch_up(&self, applied: u64, leader_index: Option<u64>) -> Result<(), String> {
        if self.caught_up() {
            return Ok(());
        }
        let target = self.start_committed.max(leader_index.unwrap_or(0));
        if applied < target {
            return Err(format!(
                "catching up: applied {applied} of {target} (the leader's commit index)"
            ));
        }
        self.caught_up.store(true, Ordering::Release);
        Ok(())
    }
}

/// What a node still waits for (`waiting`), and, while it catches up, why it lately refused the
/// leader's snapshot (`refused`), if it did: without room for the snapshot it needs, it never
/// catches up.
fn with_refusal(waiting: Result<(), String>, refused: Option<&str>) -> Result<(), String> {
    match (waiting, refused) {
        (Err(why), Some(refused)) if why.starts_with("catching up") => Err(format!(
            "{why}; it refuses the snapshot it needs: {refused}"
        )),
        (waiting, _) => waiting,
    }
}

/// [`Readiness::member_with_leader`] of a node `removed` or not, `member` of its membership or
/// not, rejoining as `rejoin` says (if it is), led by `leader`, that applied up to `applied`.
fn membership_wait(
    removed: bool,
    member: bool,
    rejoin: Option<&meta_consensus::RejoinStatus>,
    leader: Option<u64>,
    applied: u64,
) -> Result<(), String> {
    if removed {
        return Err("removed from the cluster".into());
    }
    if let Some(why) = rejoin.and_then(|r| r.waiting.as_ref()) {
        // Holds no membership yet either, but a leader contacted it: no init needed.
        return Err(format!(
            "rejoining its cluster: waits for enough voters to tell it the cluster's term \
             ({why})"
        ));
    }
    if !member && rejoin.is_some_and(|r| r.knows_cluster) {
        // A leader that reaches it feeds it the log from the start, whose memberships leave it
        // out until the entry that adds it.
        if leader.is_some() {
            return Err(format!(
                "catching up: replays the cluster's log up to the entry that adds it (applied \
                 {applied})"
            ));
        }
        return Err(
            "rejoining its cluster: waits for the cluster's leader to reach it, which \
                    takes enough of its voters up (it needs no init)"
                .into(),
        );
    }
    if !member {
        return Err("not a member of a cluster".into());
    }
    if leader.is_none() {
        return Err("no leader known".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new or wiped member that a leader reaches replays the log from the start, whose
    /// memberships leave it out until the entry that adds it: it is catching up, not waiting
    /// for a leader to reach it (as it said while its applied index rose by thousands).
    #[test]
    fn a_rejoining_node_a_leader_reaches_is_catching_up() {
        let rejoin = meta_consensus::RejoinStatus {
            knows_cluster: true,
            ..Default::default()
        };
        let waiting = membership_wait(false, false, Some(&rejoin), None, 0).unwrap_err();
        assert!(
            waiting.contains("waits for the cluster's leader"),
            "{waiting}"
        );
        let replaying = membership_wait(false, false, Some(&rejoin), Some(2), 30_216).unwrap_err();
        assert!(
            replaying.contains("catching up") && replaying.contains("30216"),
            "{replaying}"
        );
        assert!(membership_wait(false, true, Some(&rejoin), Some(2), 30_216).is_ok());
        let removed = membership_wait(true, true, None, Some(2), 1).unwrap_err();
        assert!(removed.contains("removed"), "{removed}");
        let alone = membership_wait(false, false, None, None, 0).unwrap_err();
        assert!(alone.contains("not a member"), "{alone}");
    }

    #[test]
    fn readiness_waits_for_the_leaders_index_then_latches() {
        let r = Readiness {
            start_committed: 10,
            caught_up: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        };
        assert!(
            r.catch_up(5, None).is_err(),
            "behind the index known at start"
        );
        // A restarted follower knew little at start; the leader's index counts.
        let err = r.catch_up(201, Some(16_806)).unwrap_err();
        assert!(err.contains("201 of 16806"), "{err}");
        assert!(!r.caught_up());
        // One that refuses the snapshot it needs says why it does not get on.
        let err = with_refusal(r.catch_up(201, Some(16_806)), Some("no room")).unwrap_err();
        assert!(
            err.ends_with("it refuses the snapshot it needs: no room"),
            "{err}"
        );
        r.catch_up(16_806, Some(16_806)).unwrap();
        assert!(r.caught_up());
        r.catch_up(0, Some(99_999)).unwrap();
        let no_leader = with_refusal(Err("no leader known".into()), Some("no room"));
        assert_eq!(no_leader.unwrap_err(), "no leader known");
    }
}
