//! What reads return: read-only views of the registry, pages with opaque cursors, and the
//! consistency a read asks for.

use serde::{Deserialize, Serialize};

use crate::command::CommandResult;

/// A committed and applied write: the command's log index and its result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    pub index: u64,
    pub result: CommandResult,
}

/// How fresh a read must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Consistency {
    /// Confirms leadership with a quorum (read index), then waits until this node applied up to
    /// the read index. Answers `ForwardToLeader` on a follower.
    #[default]
    Linearizable,
    /// This node's applied state, possibly stale.
    Local,
    /// Like `Linearizable`, but the leader skips the round to a quorum while its lease holds: a
    /// quorum acknowledged it (a heartbeat or an append) within the leader lease (the maximum
    /// election timeout), and a node that acknowledged a leader votes for no other until the
    /// lease has passed, so no other leader can exist yet. Past the lease it confirms leadership
    /// as `Linearizable` does. Assumes the nodes' clocks advance at about the same rate (not
    /// that they agree). Answers `ForwardToLeader` on a follower.
    Lease,
}

/// A registered datanode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeInfo {
    pub id: u64,
    pub addr: String,
    /// The incarnation: the log index of its latest registration.
    pub epoch: u64,
    pub registered_index: u64,
    /// How many replicas it holds.
    pub shards: u64,
    /// A removal of it began and has not ended (cluster version 7): every request of it is
    /// fenced, whatever its epoch (`epoch` is the one the removal raised it to).
    pub removing: bool,
}

/// One replica of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    pub datanode: u64,
    pub generation: u64,
    pub size: u64,
    pub epoch: u64,
}

/// A shard and its replica set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub id: u64,
    pub replicas: Vec<ReplicaInfo>,
}

/// One (shard, datanode) replica in a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub shard: u64,
    pub datanode: u64,
    pub generation: u64,
    pub size: u64,
}

/// A page of a listing; `next` is the opaque cursor for the following page (None at the end).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// A key-value entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEntry {
    pub key: String,
    pub value: Vec<u8>,
    /// Log index of the key's last write.
    pub revision: u64,
}

/// A key in a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvKey {
    pub key: String,
    pub revision: u64,
}

/// A snapshot written by this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Last log index the snapshot covers.
    pub index: u64,
    /// Payload bytes.
    pub bytes: u64,
}

/// The leader's answer to a datanode's heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heartbeat {
    /// Recorded: the datanode is alive for `timeout` from now.
    Recorded { timeout: std::time::Duration },
    /// The heartbeat's epoch is not the datanode's current one, or the datanode is being
    /// removed (`removing`, whatever the epoch): it must register again.
    Fenced { current_epoch: u64, removing: bool },
    /// No such datanode is registered.
    UnknownDatanode,
}

/// Every registered datanode's liveness, as the leader sees it.
#[derive(Clone, Debug)]
pub struct LivenessReport {
    /// The leader that answers.
    pub leader: crate::types::NodeId,
    /// After how long without a heartbeat a datanode is down.
    pub timeout: std::time::Duration,
    /// How long this leader has collected heartbeats (datanodes it has not heard from are
    /// `unknown` until this reaches the timeout).
    pub collecting: std::time::Duration,
    /// Registered datanodes, by id, with their liveness: every one, or a page of them.
    pub datanodes: Vec<(DatanodeInfo, crate::liveness::DatanodeLiveness)>,
    /// Of a page: the id of its last datanode, when more of those asked for follow.
    pub next: Option<u64>,
}
