//! A node's status for operators and the HTTP layer: role, leader, indexes, membership,
//! replication lag, registry size, and WAL, state machine and snapshot figures.

use std::collections::BTreeMap;

use meta_store::WalMetrics;
use serde::{Deserialize, Serialize};

use crate::records::RestoreMark;
use crate::sm_stats::StateMachineStats;
use crate::types::NodeId;

/// What this node is in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Leader,
    /// Openraft still holds leadership here, but no quorum acknowledged it within the election
    /// timeout (partitioned or overloaded): it cannot commit and another node may lead already.
    LeaderWithoutQuorum,
    Follower,
    Candidate,
    Learner,
    /// This node belongs to no cluster yet: it was never initialized nor added to one.
    Uninitialized,
    /// The membership this node holds names other members but not this node: it was removed
    /// (stop it, or add it again as a learner). A removed follower that never received the
    /// membership without it cannot tell, and reports what it last knew.
    Removed,
    Shutdown,
}

impl From<openraft::ServerState> for Role {
    fn from(s: openraft::ServerState) -> Self {
        match s {
            openraft::ServerState::Leader => Role::Leader,
            openraft::ServerState::Follower => Role::Follower,
            openraft::ServerState::Candidate => Role::Candidate,
            openraft::ServerState::Learner => Role::Learner,
            openraft::ServerState::Shutdown => Role::Shutdown,
        }
    }
}

/// How far a member's log is behind the leader's (only on the leader).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationLag {
    pub node: NodeId,
    /// Highest index known to be replicated to it.
    pub matched: Option<u64>,
    /// Leader's last log index minus `matched`.
    pub lag: u64,
    /// Milliseconds since the leader last heard from it, or since it took office if it never
    /// has (`None` only in the moment before the leader notes when it took office).
    pub heard_ms: Option<u64>,
    /// Why it refused the leader's last snapshot for want of room, if it did lately: it
    /// cannot catch up until it has room.
    pub snapshot_refused: Option<String>,
}

/// A node's status.
#[derive(Clone, Debug)]
pub struct ClusterStatus {
    pub id: NodeId,
    pub role: Role,
    pub leader_id: Option<NodeId>,
    pub leader_addr: Option<String>,
    pub term: u64,
    /// The voters: of every voter set, while a voter change is half done.
    pub voters: Vec<NodeId>,
    /// The voter sets: one, or the old and the new while a voter change is half done (a joint
    /// membership, whose commits need a majority of each).
    pub voter_sets: Vec<Vec<NodeId>>,
    pub learners: Vec<NodeId>,
    /// Every member's address.
    pub nodes: BTreeMap<NodeId, String>,
    pub last_log_index: Option<u64>,
    pub committed: Option<u64>,
    pub applied: Option<u64>,
    pub purged: Option<u64>,
    /// Index of the newest snapshot, and its payload bytes.
    pub snapshot_index: Option<u64>,
    pub snapshot_bytes: Option<u64>,
    /// Replication progress per member (leader only).
    pub replication: Vec<ReplicationLag>,
    pub datanodes: u64,
    pub replicas: u64,
    /// This node's write-ahead log.
    pub wal: WalMetrics,
    pub state_machine: StateMachineStats,
    /// Snapshot pacing: rate (bytes/s, 0 = unlimited), pauses and time paused.
    pub snapshot_rate: u64,
    pub snapshot_throttle_pauses: u64,
    pub snapshot_throttle_millis: u64,
    /// Watches waiting for a change (`MetaNode::watch`).
    pub watches_waiting: u64,
    /// Every change after this log index is kept for watchers.
    pub watch_floor: u64,
    /// The cluster's version as this node applied it, and the highest this node's build
    /// applies (see `cluster_version.rs`).
    pub cluster_version: u32,
    pub build_version: u32,
    /// The cluster's epoch floor as this node applied it (0: never raised): every
    /// registration's epoch is at least this.
    pub epoch_floor: u64,
    /// The mark of a restore into the cluster that has not ended (under way, or cut off part
    /// way), as this node applied it.
    pub restore: Option<RestoreMark>,
    /// The version each member's build answered with recently (`None`: no recent answer);
    /// leader only.
    pub member_versions: BTreeMap<NodeId, Option<u32>>,
    /// Bytes free to this process on the data dir's file system (`None`: it cannot be read),
    /// and the reserve below which the leader refuses writes that add data.
    pub data_dir_free_bytes: Option<u64>,
    pub min_free_bytes: u64,
    /// While this node rejoins (it started with no Raft state and does not hold the cluster's
    /// log yet): what it learned of the cluster's term (`node/rejoin_gate.rs`).
    pub rejoin: Option<RejoinStatus>,
    /// With [`Role::Removed`]: the membership that left this node out, as it learned it (from
    /// its own log, or from a member's notice when the leader stopped replicating to it first).
    /// `voters`, `learners` and `nodes` are then the membership this node last held, which
    /// may still name it.
    pub removal: Option<crate::Removal>,
    /// The members whose answers lately refused this node's messages as another cluster's
    /// (`peer_refusals.rs`): on a node initialized on its own by mistake, its former peers; on
    /// their leader, that node.
    pub refused_by: Vec<NodeId>,
    /// The members whose answers lately refused this node's token (401): on a member started
    /// with another `--token`, the others; on their leader, that member.
    pub token_refused_by: Vec<NodeId>,
    /// This node began a planned stop: it hands its leadership over (if it leads) and closes.
    pub stopping: bool,
    /// Why this node refused the leader's snapshot for want of room, if it did in the last
    /// minute (`MetaNode::snapshot_refused`).
    pub snapshot_refused: Option<String>,
}

/// A rejoining node's progress (see [`ClusterStatus::rejoin`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejoinStatus {
    /// The newest term enough other voters answered with: it admits leaders of that term or
    /// newer. `None` until enough of them answered.
    pub term_floor: Option<u64>,
    /// Why the last probe fell short (which voters did not answer), if it did.
    pub waiting: Option<String>,
    /// Whether it knows which cluster it belongs to (a member's message, or the question
    /// asked before it was added, told it): it waits for that cluster's leader, not for an
    /// init.
    pub knows_cluster: bool,
}
