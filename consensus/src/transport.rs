//! The in-process transport: Raft RPCs between nodes of one process, through direct calls
//! on the target node, with links that tests and benches can cut and heal.
//!
//! An RPC over a cut link, or to a node that is not registered (stopped), fails with
//! openraft's `Unreachable` error, so openraft backs off before retrying (the backoff comes
//! from the node's configuration). Snapshots take the streaming `full_snapshot` path: the
//! leader's snapshot file is copied into a file the target created for it, which the target
//! verifies and installs, as the HTTP transport does between processes. A removal notice that
//! a member gives with its answer to a vote request reaches the candidate, as over HTTP.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{RaftNetworkFactory, RaftNetworkV2};
use parking_lot::RwLock;

use crate::node::MetaNode;
use crate::snapshot_data::SnapshotData;
use crate::term_probe::{ProbeMembers, TermAnswer, TermProbe};
use crate::types::{Node, NodeId, TypeConfig, Vote};

#[derive(Default)]
struct RouterInner {
    nodes: RwLock<HashMap<NodeId, MetaNode>>,
    /// Cut directed links (from, to).
    cut: RwLock<HashSet<(NodeId, NodeId)>>,
    /// What nodes that are not running answer a term probe with (`LocalRouter::stand_in`).
    stand_ins: RwLock<HashMap<NodeId, TermAnswer>>,
    /// Held directed links (from, to): their messages wait, unanswered, until released.
    held: RwLock<HashSet<(NodeId, NodeId)>>,
    /// Bumped whenever a held link is released.
    released: tokio::sync::watch::Sender<u64>,
}

/// Connects the nodes of one process. Cheap to clone.
#[derive(Clone, Default)]
pub struct LocalRouter {
    inner: Arc<RouterInner>,
}

impl LocalRouter {
    pub fn new() -> Self {
        LocalRouter::default()
    }

    /// The network factory for node `from` (pass it to [`MetaNode::open`]).
    pub fn network(&self, from: NodeId) -> LocalNetwork {
        LocalNetwork {
            router: self.clone(),
            from,
        }
    }

    /// Makes `node` reachable under its id (replacing a previous registration).
    pub fn register(&self, node: MetaNode) {
        self.inner.nodes.write().insert(node.id(), node);
    }

    /// Makes node `id` unreachable (e.g. it was stopped).
    pub fn unregister(&self, id: NodeId) -> Option<MetaNode> {
        self.inner.nodes.write().remove(&id)
    }

    /// The registered node `id`.
    pub fn node(&self, id: NodeId) -> Option<MetaNode> {
        self.inner.nodes.read().get(&id).cloned()
    }

    /// Cuts the links between `a` and `b` in both directions.
    pub fn cut(&self, a: NodeId, b: NodeId) {
        let mut cut = self.inner.cut.write();
        cut.insert((a, b));
        cut.insert((b, a));
    }

    /// Heals the links between `a` and `b` in both directions.
    pub fn heal(&self, a: NodeId, b: NodeId) {
        let mut cut = self.inner.cut.write();
        cut.remove(&(a, b));
        cut.remove(&(b, a));
    }

    /// Cuts the link from `from` to `to` only: `from`'s messages are lost, `to`'s arrive.
    pub fn cut_one_way(&self, from: NodeId, to: NodeId) {
        self.inner.cut.write().insert((from, to));
    }

    /// Cuts every link of `a` to the registered nodes.
    pub fn isolate(&self, a: NodeId) {
        let ids: Vec<NodeId> = self.inner.nodes.read().keys().copied().collect();
        for b in ids.into_iter().filter(|b| *b != a) {
            self.cut(a, b);
        }
    }

    /// Has node `id`, while it is not running, answer a rejoining node's term probe with
    /// `answer`: a test's stand-in for a node that is down and whose messages the test crafts.
    pub fn stand_in(&self, id: NodeId, answer: TermAnswer) {
        self.inner.stand_ins.write().insert(id, answer);
    }

    /// What node `id` answers a term probe from `from` with: the running node's answer, or
    /// its stand-in's.
    fn term_answer(&self, from: NodeId, id: NodeId) -> Result<TermAnswer, String> {
        match self.target(from, id) {
            Ok(node) => Ok(node.term_answer()),
            Err(e) => match self.inner.stand_ins.read().get(&id) {
                Some(answer) if !self.inner.cut.read().contains(&(from, id)) => Ok(answer.clone()),
                _ => Err(e.to_string()),
            },
        }
    }

    /// Heals every link, and releases every held one.
    pub fn heal_all(&self) {
        self.inner.cut.write().clear();
        self.inner.held.write().clear();
        self.inner.released.send_modify(|n| *n += 1);
    }

    /// Holds the links between `a` and `b` in both directions: their messages wait, unanswered,
    /// until [`LocalRouter::heal_all`] (as a paused process's do), where a cut link fails them
    /// at once.
    pub fn hold(&self, a: NodeId, b: NodeId) {
        let mut held = self.inner.held.write();
        held.insert((a, b));
        held.insert((b, a));
    }

    /// Completes once the link from `from` to `to` is not held.
    async fn unheld(&self, from: NodeId, to: NodeId) {
        let mut released = self.inner.released.subscribe();
        while self.inner.held.read().contains(&(from, to)) {
            if released.changed().await.is_err() {
                return;
            }
        }
    }

    fn target(&self, from: NodeId, to: NodeId) -> Result<MetaNode, Unreachable<TypeConfig>> {
        if self.inner.cut.read().contains(&(from, to)) {
            return Err(Unreachable::from_string(format!(
                "link {from}->{to} is cut"
            )));
        }
        self.node(to)
            .ok_or_else(|| Unreachable::from_string(format!("node {to} is not running")))
    }
}

/// The network factory of one node.
#[derive(Clone)]
pub struct LocalNetwork {
    router: LocalRouter,
    from: NodeId,
}

impl ProbeMembers for LocalNetwork {
    fn term_probe(&self) -> Arc<dyn TermProbe> {
        Arc::new(LocalProbe {
            router: Arc::downgrade(&self.router.inner),
            from: self.from,
        })
    }
}

/// Asks the nodes of one process for their term, over the router's links. Holds the router
/// weakly: the nodes it holds must not keep it alive.
struct LocalProbe {
    router: std::sync::Weak<RouterInner>,
    from: NodeId,
}

impl TermProbe for LocalProbe {
    fn ask(
        &self,
        id: NodeId,
        _addr: Option<String>,
    ) -> futures::future::BoxFuture<'static, Result<TermAnswer, String>> {
        let answer = match self.router.upgrade() {
            Some(inner) => LocalRouter { inner }.term_answer(self.from, id),
            None => Err("the router is gone".to_string()),
        };
        Box::pin(std::future::ready(answer))
    }
}

impl RaftNetworkFactory<TypeConfig> for LocalNetwork {
    type Network = LocalConnection;

    async fn new_client(&mut self, target: NodeId, _node: &Node) -> LocalConnection {
        LocalConnection {
            router: self.router.clone(),
            from: self.from,
            target,
        }
    }
}

/// RPCs from one node to another.
pub struct LocalConnection {
    router: LocalRouter,
    from: NodeId,
    target: NodeId,
}

impl LocalConnection {
    /// The target node, if the link to it is up; the sender notes the version of its build,
    /// or forgets it and notes that the target is not connected when the link is down, as the
    /// HTTP transport does.
    fn target(&self) -> Result<MetaNode, RPCError<TypeConfig>> {
        let target = self.router.target(self.from, self.target);
        if let Some(me) = self.router.node(self.from) {
            let (versions, refusals) = (&me.config().peer_versions, &me.config().peer_refusals);
            match &target {
                Ok(t) => {
                    versions.note(self.target, t.config().build_version);
                    refusals.answered(self.target);
                }
                Err(_) => {
                    versions.forget(self.target);
                    // A node not running is a connection refused; a cut link, one not made.
                    refusals.not_connecting(self.target);
                }
            }
        }
        target.map_err(RPCError::Unreachable)
    }
}

impl LocalConnection {
    /// Asks the target for its vote (or pre-vote), and hands a removal notice that comes back
    /// with the answer to the candidate (this node).
    async fn ask_vote(
        &self,
        rpc: VoteRequest<TypeConfig>,
        pre: bool,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.router.unheld(self.from, self.target).await;
        let target = self.target()?;
        let removal = target.removal_of(&rpc);
        let answer = if pre {
            target.pre_vote(rpc).await
        } else {
            target.vote(rpc).await
        };
        let answer = answer.map_err(|e| RPCError::Unreachable(unreachable(e)))?;
        if let (Some(removal), Some(me)) = (removal, self.router.node(self.from)) {
            me.note_removal(removal);
        }
        Ok(answer)
    }
}

/// A stopped target answers `Fatal`; to the caller that is an unreachable peer.
fn unreachable(e: impl std::fmt::Display) -> Unreachable<TypeConfig> {
    Unreachable::from_string(e.to_string())
}

impl RaftNetworkV2<TypeConfig> for LocalConnection {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.router.unheld(self.from, self.target).await;
        let target = self.target()?;
        target
            .append_entries(rpc)
            .await
            .map_err(|e| RPCError::Unreachable(unreachable(e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.ask_vote(rpc, false).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        // Openraft's default grants every pre-vote, which would test another protocol than
        // the HTTP transport runs.
        self.ask_vote(rpc, true).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let target = self.target()?;
        let dest = target
            .snapshot_receive_file()
            .await
            .map_err(|e| StreamingError::Network(NetworkError::from_string(e)))?;
        let src = snapshot.snapshot.path().to_path_buf();
        let dest_path = dest.to_path_buf();
        let copy = tokio::task::spawn_blocking(move || std::fs::copy(&src, &dest_path));
        tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            copied = copy => {
                copied
                    .map_err(|e| StreamingError::Network(NetworkError::from_string(e)))?
                    .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
            }
        }
        // The link may have been cut while the bytes moved.
        let target = self.target()?;
        target
            .install_received_snapshot(vote, dest)
            .await
            .map_err(|e| StreamingError::Unreachable(unreachable(e)))
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.router.unheld(self.from, self.target).await;
        let target = self.target()?;
        target
            .handle_transfer_leader(req)
            .await
            .map_err(|e| RPCError::Unreachable(unreachable(e)))
    }
}
