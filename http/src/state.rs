//! What every handler shares: the node, the metrics, the forwarding client, the token and
//! the readiness latch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use meta_consensus::{ClusterStatus, Consistency, MetaNode};

use crate::auth::Token;
use crate::error::ApiError;
use crate::follower_read::{CatchUp, FollowerReads, ReplayedReadIndex};
use crate::forward::Forwarder;
use crate::metrics::Metrics;
use crate::node_metrics::NodeCollector;
use crate::request::ReadConsistency;

/// The state of the admin and Raft routers. Cloning is cheap.
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
}

/// How long an admin request's body (at most 2 MiB) may take to arrive: a client that stalls
/// part way is answered 408 rather than holding a connection slot until it goes away.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

impl AppState {
    /// State for serving `node`; the node's figures are added to the metrics registry.
    pub fn new(node: MetaNode, token: Token) -> Self {
        let metrics = Metrics::new(Some(Box::new(NodeCollector::new(node.clone()))));
        let readiness = Arc::new(Readiness::new(&node.status()));
        let forwarder = Forwarder::new(node.id(), token.clone());
        AppState {
            follower_reads: FollowerReads::new(
                node.id(),
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
        }
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

impl FromRef<AppState> for MetaNode {
    fn from_ref(state: &AppState) -> MetaNode {
        state.node.clone()
    }
}

impl FromRef<AppState> for Token {
    fn from_ref(state: &AppState) -> Token {
        state.token.clone()
    }
}

impl FromRef<AppState> for Metrics {
    fn from_ref(state: &AppState) -> Metrics {
        state.metrics.clone()
    }
}

/// `/readyz`: a member of a cluster with a known leader whose applied index has reached the
/// commit index this node knew when it started. The catch-up part latches once reached.
#[derive(Debug)]
pub struct Readiness {
    start_committed: u64,
    caught_up: AtomicBool,
}

impl Readiness {
    /// Remembers the commit index known now (at start).
    pub fn new(status: &ClusterStatus) -> Self {
        Readiness {
            start_committed: status.committed.unwrap_or(0),
            caught_up: AtomicBool::new(false),
        }
    }

    /// `Ok` when ready, otherwise what the node still waits for.
    pub fn check(&self, status: &ClusterStatus) -> Result<(), String> {
        let member = status.voters.contains(&status.id) || status.learners.contains(&status.id);
        if !member {
            return Err("not a member of a cluster".into());
        }
        if status.leader_id.is_none() {
            return Err("no leader known".into());
        }
        if !self.caught_up.load(Ordering::Acquire) {
            let applied = status.applied.unwrap_or(0);
            if applied < self.start_committed {
                return Err(format!(
                    "catching up: applied {applied} of {} committed at start",
                    self.start_committed
                ));
            }
            self.caught_up.store(true, Ordering::Release);
        }
        Ok(())
    }
}
