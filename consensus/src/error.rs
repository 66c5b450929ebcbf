//! The error type of the `meta-consensus` crate.

use std::path::PathBuf;

use crate::cluster_version::{describe_behind, Behind};
use crate::codec::CodecError;
use crate::types::{NodeId, Vote};

/// Everything that can go wrong in `meta-consensus`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This node is not the leader; the request must go to `leader_id` at `leader_addr`.
    #[error("not the leader; forward to node {leader_id} at {leader_addr}")]
    ForwardToLeader {
        leader_id: NodeId,
        leader_addr: String,
    },
    /// No leader is known (election in progress, or no quorum).
    #[error("no leader known")]
    NoLeader,
    /// Too many voters refuse this node's messages, as another cluster's, for it to elect a
    /// leader (`peer_refusals.rs`): it was initialized on its own (a wiped node started with
    /// `--init`), and `refusing` are the voters of the cluster they belong to.
    #[error("members {refusing:?} belong to another cluster and refuse this node's messages")]
    RefusedByMembers { refusing: Vec<NodeId> },
    /// This node belongs to no cluster yet: it was neither initialized nor added.
    #[error("not a member of a cluster")]
    NotMember,
    /// This node was removed from the cluster it belonged to (its membership names `members`,
    /// not this node).
    #[error("removed from the cluster (members {members:?})")]
    Removed { members: Vec<NodeId> },
    /// The request could not complete in time; a write's outcome is unknown.
    #[error("timed out")]
    Timeout,
    /// The write was submitted but its answer is lost: its entry was discarded when leadership
    /// changed, or this node's Raft stopped under it. It may or may not commit.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The cluster was initialized before (on this node, ever).
    #[error("the cluster is already initialized")]
    AlreadyInitialized,
    #[error("not found: {0}")]
    NotFound(String),
    /// The request conflicts with the cluster's state (a membership change under way, a
    /// learner not caught up); nothing changed.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The data dir's file system is short of free space: writes that add data are refused.
    #[error(
        "the leader's disk is nearly full ({free} bytes free, {reserve} kept in reserve): writes \
         that add data are refused until space is freed (deletes still work)"
    )]
    InsufficientStorage { free: u64, reserve: u64 },
    /// The leader's disk is nearly full, and another voter may have room: the leader hands its
    /// leadership over (the HTTP layer's disk hand-over looks every few seconds) and refuses
    /// writes that add data until then. Nothing was proposed: the next leader takes the write.
    #[error(
        "this leader's disk is nearly full ({free} bytes free, {reserve} kept in reserve) and it \
         hands its leadership to a voter with room: nothing was written; ask again in a moment"
    )]
    HandingOverForDisk { free: u64, reserve: u64 },
    /// Voters short of disk (or down: not heard within an election timeout) leave no majority of
    /// the voters (of each voter set, while a change is half done) with room: writes would fill
    /// their disks and stop them, and the cluster with them. Every write is refused (deletes
    /// too: they are written to the voters' logs) until space is freed there.
    #[error(
        "voters {short:?} are short of disk (less than their --min-free-bytes free) or down \
         (not heard within an election timeout): without them no majority of the voters has \
         room for writes, which would fill their disks and stop them; free space there, or \
         add voters with room"
    )]
    QuorumShortOfDisk { short: Vec<NodeId> },
    /// A snapshot from the leader was refused: receiving or installing it could fill the data
    /// dir's file system. The node keeps its registry and log as they were; the leader sends
    /// the snapshot again.
    #[error(
        "no room for a snapshot from the leader ({bytes} bytes: its size, or what arrived of it \
         so far): {free} bytes free, {need} needed (to keep the reserve free, and to install it, \
         room for the file, less what of it landed, and for the registry its records make): free \
         space on this member; the leader sends the snapshot again"
    )]
    NoRoomForSnapshot { bytes: u64, free: u64, need: u64 },
    /// A requested snapshot could not be built: the data dir's file system ran out of space
    /// (or quota) while it was written. The partial file is deleted; the older snapshot, if
    /// any, stands in, and the registry and log are as they were.
    #[error(
        "no room to build a snapshot ({0}): free space on this member and ask again; the older \
         snapshot, if any, stands in"
    )]
    NoRoomToBuildSnapshot(String),
    /// A message or a node belongs to another cluster than this node (`cluster_id.rs`).
    /// The message names neither id: the cluster's id is never shown to clients (a member's
    /// replayed read is told from a client's by it); logs name both.
    #[error(
        "this node and the other side belong to different clusters (a node initialized on its \
         own, e.g. started with --init, cannot join another cluster: wipe its data dir and start \
         it without --init)"
    )]
    OtherCluster { ours: u64, theirs: u64 },
    /// A watch asked for changes after `after`, which this node no longer keeps (or never
    /// kept: it restarted, or installed a snapshot since); it keeps those after `floor`.
    #[error(
        "the changes after index {after} are no longer kept here (this member keeps those after \
         {floor}): read the state again, then watch from the index a watch without `after` answers"
    )]
    Compacted { after: u64, floor: u64 },
    /// Bad input (a bad cursor, an empty key, a bad membership); nothing changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The write-ahead log or snapshot files failed.
    #[error("storage ({op}): {source}")]
    Storage {
        op: &'static str,
        #[source]
        source: meta_store::Error,
    },
    /// The registry database (sled) failed.
    #[error("registry database ({op}): {source}")]
    Registry {
        op: &'static str,
        #[source]
        source: sled::Error,
    },
    /// The registry's files cannot be read (sled found a damaged page, or panicked decoding
    /// one). Opening answers it by rebuilding the registry from the snapshot and the log.
    #[error("registry {path} cannot be read: {reason}")]
    RegistryUnreadable { path: PathBuf, reason: String },
    /// The registry is not to be reopened and the node holds nothing to rebuild it from (the
    /// log was purged past the newest snapshot): it is kept, and the node does not start.
    #[error("registry {path} {reason}")]
    RegistryNotRebuildable { path: PathBuf, reason: String },
    /// The log ends before entries the registry applied, on the only voter of its cluster, and
    /// the registry cannot be kept as a snapshot: the node does not start, and nothing changed.
    #[error("log {path} {reason}")]
    LogBehindRegistry { path: PathBuf, reason: String },
    /// The log lacks records that nothing else on this member holds (its oldest segment was
    /// lost): the node does not start, and nothing changed.
    #[error("log {path} {reason}")]
    LogDamaged { path: PathBuf, reason: String },
    /// The data dir cannot be used: another process holds it, or it belongs to another node.
    #[error("data dir {path} {reason}")]
    DataDir { path: PathBuf, reason: String },
    /// A file outside the log and snapshot stores (e.g. the data dir) failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Stored or received bytes did not decode.
    #[error("corrupt data ({what}): {source}")]
    Corrupt {
        what: String,
        #[source]
        source: CodecError,
    },
    /// A log record passed its checksum but does not decode: a newer build wrote it (a record
    /// damaged on disk fails its checksum first). The data dir is intact.
    #[error(
        "log record {lsn} passed its checksum, but this build cannot decode it ({source}): a \
         newer metaserver build wrote it, most likely; run a build at least as new on this data \
         dir, which is intact (do not wipe it)"
    )]
    UndecodableLogRecord {
        lsn: u64,
        #[source]
        source: CodecError,
    },
    /// A snapshot failed verification or could not be built/installed.
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// Openraft reported an error (including a fatal storage error).
    #[error("raft: {0}")]
    Raft(String),
    /// This node refuses to vote: it holds no Raft state and the cluster is past its first
    /// election (see `MetaNode::vote`).
    #[error("not voting: {0}")]
    NotVoting(String),
    /// This node, rejoining, may not acknowledge that leader (yet): see
    /// `node/rejoin_gate.rs`. The message was not handed to openraft.
    #[error("rejoining: {0}")]
    Rejoining(String),
    /// This node, rejoining, refuses node `leader`, which leads term `term`: the other voters
    /// told it of term `floor`, newer, in which another leader may have been elected
    /// (`node/rejoin_gate.rs`). The message was not handed to openraft; the leader is answered
    /// with the higher vote `higher` (this node's, in term `floor`), so that it steps down as it
    /// does when a member that kept its data answers with a newer term.
    #[error(
        "rejoining: node {leader} leads term {term}, and the members answered with term {floor}: \
         it was deposed"
    )]
    Deposed {
        leader: NodeId,
        term: u64,
        floor: u64,
        higher: Vote,
    },
    /// The node is shut down.
    #[error("node is shut down")]
    Shutdown,
    /// The node's Raft core stopped after a failure (a log or registry write failed, which is
    /// never retried), named here: the node serves nothing until it is restarted.
    #[error(
        "this node stopped after a failure and serves nothing until it is restarted (its log \
         names the failure): {0}"
    )]
    Stopped(String),
    /// A command needs a cluster version (`cluster_version.rs`) the cluster does not have, and
    /// cannot be given yet: the members in `behind` run older builds or did not answer.
    /// Nothing was proposed.
    #[error(
        "{what} needs cluster version {needed}, the cluster's version is {current}, and it is \
         raised only once every member runs a build of version {needed} or later ({}): upgrade \
         those members (or bring them back) and ask again",
        describe_behind(.behind)
    )]
    ClusterVersionTooLow {
        what: String,
        needed: u32,
        current: u32,
        behind: Vec<Behind>,
    },
    /// This node's build is older than its cluster's version: it cannot apply the cluster's log.
    #[error(
        "this build applies cluster versions up to {build}, but the cluster's version is \
         {cluster}: run a newer metaserver build on this node (a cluster's version never goes \
         back)"
    )]
    BuildTooOld { build: u32, cluster: u32 },
    /// A node to add as a learner runs a build older than the cluster's version.
    #[error(
        "node {node} runs a build of version {build}, older than the cluster's version \
         {cluster}: upgrade it before adding it"
    )]
    LearnerTooOld {
        node: NodeId,
        build: u32,
        cluster: u32,
    },
    /// A node to add as a learner has not answered, so its build is unknown, and the cluster's
    /// version is past the one every build applies.
    #[error(
        "node {node} has not answered at the address given (is it started, and is that where \
         it listens?), so its build is unknown, and the cluster's version is {cluster}: start \
         it there before adding it"
    )]
    LearnerNotHeard { node: NodeId, cluster: u32 },
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn registry(op: &'static str, source: sled::Error) -> Self {
        Error::Registry { op, source }
    }

    pub(crate) fn storage(op: &'static str, source: meta_store::Error) -> Self {
        Error::Storage { op, source }
    }

    pub(crate) fn corrupt(what: impl Into<String>, source: CodecError) -> Self {
        Error::Corrupt {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Whether an IO error in this error's chain of sources says the file system is out of
    /// space or the user is over quota (`ENOSPC`, `EDQUOT`).
    pub(crate) fn is_out_of_space(&self) -> bool {
        self.io_kinds().any(|kind| {
            matches!(
                kind,
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            )
        })
    }

    /// The kinds of the IO errors in this error's chain of sources, outermost first.
    pub(crate) fn io_kinds(&self) -> impl Iterator<Item = std::io::ErrorKind> + '_ {
        let first: &(dyn std::error::Error + 'static) = self;
        std::iter::successors(Some(first), |e| e.source())
            .filter_map(|e| e.downcast_ref::<std::io::Error>().map(std::io::Error::kind))
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io { source, .. } => source,
            other => std::io::Error::other(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_space_is_found_anywhere_in_the_chain() {
        let os = std::io::Error::from_raw_os_error;
        let store = |e| Error::storage("finish snapshot", meta_store::Error::io("write", "f", e));
        assert!(store(os(libc::ENOSPC)).is_out_of_space());
        assert!(store(os(libc::EDQUOT)).is_out_of_space());
        assert!(Error::io("write", "f", os(libc::ENOSPC)).is_out_of_space());
        let wrapped = std::io::Error::other(store(os(libc::ENOSPC)));
        assert!(Error::io("export", "f", wrapped).is_out_of_space());
        assert!(!store(os(libc::ENOTDIR)).is_out_of_space());
        assert!(!store(os(libc::EIO)).is_out_of_space());
        assert!(!Error::Snapshot("no space".into()).is_out_of_space());
    }
}
