//! The openraft type configuration of the metaserver: node ids are `u64`, a node is its
//! address, log entries carry registry [`Command`]s and produce [`CommandResult`]s.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::command::{Command, CommandResult};
use crate::state_machine::StateMachine;

/// A member's id in the cluster.
pub type NodeId = u64;

/// What the cluster knows about a member: the address its peers and clients reach it at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Node {
    pub addr: String,
}

impl Node {
    pub fn new(addr: impl Into<String>) -> Self {
        Node { addr: addr.into() }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.addr)
    }
}

openraft::declare_raft_types!(
    /// The metaserver's openraft type configuration.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = NodeId,
        Node = Node,
);

/// The Raft handle of a metaserver node.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;
/// A log id (leader and index) of this configuration.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// A vote of this configuration.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// A log entry of this configuration.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// Membership as stored with the log id that introduced it.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// Snapshot metadata (last log id and membership).
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
