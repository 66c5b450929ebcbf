//! The registry's commands (the application data of the Raft log) and their per-command
//! results.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cluster_version::{
    BASE_VERSION, CLUSTER_EPOCH_FLOOR, FENCED_DEREGISTRATION, PIECEWISE_REMOVAL, RESTORE_CLAIM,
    RESTORE_KEYS, RESTORE_MARK,
};
use crate::records::{RestoreMark, RestoreOrigin};

/// What one piece of a prune weighs in the leader's admission window, in shards.
const PRUNE_PIECE_WEIGHT: usize = 1_000;

/// One shard replica as reported by a datanode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReport {
    pub id: u64,
    pub generation: u64,
    pub size: u64,
}

/// A change to the registry. Each command is one Raft log entry; its log index is what the
/// registry uses as a datanode's epoch and as a key's revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Registers (or re-registers) a datanode; its new epoch is this command's log index (or
    /// one above its current epoch, or above the epoch it had when it was removed, if that is
    /// higher: epochs never go back), which fences every batch sent by a former incarnation.
    RegisterDatanode { id: u64, addr: String },
    /// Registers a batch of replicas held by `datanode` under incarnation `epoch`.
    RegisterShards {
        datanode: u64,
        epoch: u64,
        shards: Vec<ShardReport>,
    },
    /// Drops the given replicas of `datanode`.
    DeregisterShards { datanode: u64, shards: Vec<u64> },
    /// Drops a datanode and all its replicas.
    RemoveDatanode { id: u64 },
    /// Writes a key if its revision matches `if_revision` (`Some(0)`: the key must not exist).
    Put {
        key: String,
        value: Vec<u8>,
        if_revision: Option<u64>,
    },
    /// Deletes a key if its revision matches `if_revision`.
    Delete {
        key: String,
        if_revision: Option<u64>,
    },
    /// Registers a datanode like `RegisterDatanode`, with an epoch of at least `min_epoch`: a
    /// restore gives every datanode an epoch above any the old cluster handed out (its log
    /// indexes), so that a batch sent under an old epoch is fenced.
    RegisterDatanodeAtLeast {
        id: u64,
        addr: String,
        min_epoch: u64,
    },
    /// One piece of ending a full report: drops the replicas of `datanode` that incarnation
    /// `epoch` has not registered (its `RegisterShards` batches under `epoch` were the whole of
    /// what it holds), in the datanode's shard buckets from `from_bucket` on, as far as one
    /// piece's bounded work goes. The result (`Pruned`) says where the next piece starts.
    /// Fenced like a batch when `epoch` is not the datanode's current epoch.
    PruneReplicas {
        datanode: u64,
        epoch: u64,
        from_bucket: u64,
    },
    /// Raises the cluster's version to `version` (see `cluster_version.rs`); never lowers it.
    /// Proposed by the leader only once every member's build answered with at least `version`;
    /// a member whose build is older stops at this entry rather than apply later commands it
    /// cannot decode (a build that predates versions cannot decode this one either, and stops
    /// at it too).
    SetClusterVersion { version: u32 },
    /// One piece of removing a datanode: drops its replicas in its first buckets, as far as one
    /// piece's bounded work goes; the piece that leaves it none also drops its record, and keeps
    /// its epoch as the floor of the id's next registration (a zombie of the removed incarnation
    /// stays fenced). The result (`RemovalPiece`) says whether the datanode is gone, and names
    /// the incarnation (`registered_index`) that the next pieces carry: a piece finding another
    /// one (the datanode registered again meanwhile) is refused as `Fenced`. The leader proposes
    /// the first piece for a `RemoveDatanode` once the cluster's version is 3. From version 4, a
    /// first piece (`registered_index: None`) that leaves the datanode replicas also raises its
    /// epoch by one, fencing the incarnation it removes.
    RemoveDatanodePiece {
        id: u64,
        registered_index: Option<u64>,
    },
    /// Raises the cluster's epoch floor to `at_least` (never lowers it): every registration
    /// from this entry on gets an epoch of at least the floor, whatever its id. A restore raises
    /// it above every epoch the old cluster handed out, so that a datanode the backup does not
    /// name, registering for the first time in the new cluster, cannot get an epoch a zombie of
    /// the old cluster still sends with (the new cluster's log indexes start again from 1).
    RaiseEpochFloor { at_least: u64 },
    /// Drops the given replicas of `datanode`, sent by its incarnation `epoch`: fenced like a
    /// batch when `epoch` is not the datanode's current epoch, so that a former incarnation's
    /// late deregistration cannot drop a replica the current one registered. Proposed once the
    /// cluster's version is 5.
    DeregisterShardsOf {
        datanode: u64,
        epoch: u64,
        shards: Vec<u64>,
    },
    /// A restore's claim on the cluster it goes into: raises the epoch floor to `at_least` (at
    /// least 1) if the cluster is fresh (no datanode, no key, and a floor never raised), and
    /// else changes nothing (`NotFresh`). The raised floor is the claim: a second restore run
    /// at once finds it and is refused before it writes anything, where both used to pass an
    /// emptiness check made before either wrote. Proposed once the cluster's version is 6.
    ClaimForRestore { at_least: u64 },
    /// A restore's claim, as `ClaimForRestore`, that also marks the cluster as being restored
    /// (`RestoreMark`, naming this entry's index and `origin`, the backup) until an
    /// `EndRestore`: a restore cut off part way leaves a cluster that says so. Proposed once the
    /// cluster's version is 8.
    BeginRestore {
        at_least: u64,
        origin: RestoreOrigin,
    },
    /// Ends the restore that the cluster's mark names, if any: removes the mark (a cluster is
    /// claimed once, so there is one at most). Proposed once the cluster's version is 8.
    EndRestore,
    /// A restore's write of a key of its backup, which must not exist yet (as a `Put` with
    /// `if_revision: Some(0)`): taken only while the cluster holds a restore's mark
    /// (`NotRestoring` else). Proposed once the cluster's version is 9.
    RestorePut { key: String, value: Vec<u8> },
    /// A restore's marked claim, as `BeginRestore`, that also holds keys back until the restore
    /// ends: every key write and delete is refused (`RestoreUnderWay`) but the restore's own
    /// (`RestorePut`). Proposed once the cluster's version is 9.
    BeginRestoreHoldingKeys {
        at_least: u64,
        origin: RestoreOrigin,
    },
}

impl Command {
    /// The cluster version a member's build needs to apply this command
    /// (`cluster_version.rs`): the leader proposes it only in a cluster of that version.
    pub fn required_version(&self) -> u32 {
        match self {
            Command::PruneReplicas { .. } => 2,
            Command::RemoveDatanodePiece { .. } => PIECEWISE_REMOVAL,
            Command::RaiseEpochFloor { .. } => CLUSTER_EPOCH_FLOOR,
            Command::DeregisterShardsOf { .. } => FENCED_DEREGISTRATION,
            Command::ClaimForRestore { .. } => RESTORE_CLAIM,
            Command::BeginRestore { .. } | Command::EndRestore => RESTORE_MARK,
            Command::RestorePut { .. } | Command::BeginRestoreHoldingKeys { .. } => RESTORE_KEYS,
            Command::SetClusterVersion { version } => *version,
            _ => BASE_VERSION,
        }
    }

    /// What the command does, in words an operator knows it by, for a refusal that names it
    /// (the commands that need a cluster version above the base; the rest by their `Display`).
    pub fn described(&self) -> String {
        match self {
            Command::PruneReplicas { datanode, .. } => {
                format!("a prune of datanode {datanode}'s replicas")
            }
            Command::RemoveDatanodePiece { id, .. } => {
                format!("the removal of datanode {id} in pieces")
            }
            Command::RaiseEpochFloor { at_least } => {
                format!("raising the cluster's epoch floor to {at_least}")
            }
            Command::DeregisterShardsOf {
                datanode, epoch, ..
            } => format!("a drop of datanode {datanode}'s replicas fenced by epoch {epoch}"),
            Command::ClaimForRestore { .. } => {
                "a restore's claim on the cluster (an epoch floor raised if fresh)".to_owned()
            }
            Command::BeginRestore { .. } => {
                "a restore's claim on the cluster, marking it as being restored".to_owned()
            }
            Command::EndRestore => "the end of a restore (its mark removed)".to_owned(),
            Command::RestorePut { key, .. } => format!("a restore's write of key {key:?}"),
            Command::BeginRestoreHoldingKeys { .. } => {
                "a restore's claim on the cluster, marking it as being restored and holding its \
                 keys back"
                    .to_owned()
            }
            Command::SetClusterVersion { version } => {
                format!("raising the cluster's version to {version}")
            }
            other => other.to_string(),
        }
    }

    /// How much apply work the command is, in shards: a batch's shard count, a prune piece's
    /// equivalent, 0 for the rest.
    pub fn weight(&self) -> u32 {
        let n = match self {
            Command::RegisterShards { shards, .. } => shards.len(),
            Command::DeregisterShards { shards, .. }
            | Command::DeregisterShardsOf { shards, .. } => shards.len(),
            // A piece looks at up to 4,096 replicas in whole buckets, as a batch of 1,000
            // shards does with three replicas each: it weighs as much, so the admission window
            // keeps the prunes of many datanodes from queueing up in front of reads.
            Command::PruneReplicas { .. } | Command::RemoveDatanodePiece { .. } => {
                PRUNE_PIECE_WEIGHT
            }
            _ => 0,
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::RegisterDatanode { id, addr } => write!(f, "RegisterDatanode({id}, {addr})"),
            Command::RegisterDatanodeAtLeast {
                id,
                addr,
                min_epoch,
            } => write!(f, "RegisterDatanode({id}, {addr}, epoch >= {min_epoch})"),
            Command::RegisterShards {
                datanode,
                epoch,
                shards,
            } => write!(
                f,
                "RegisterShards(datanode {datanode}, epoch {epoch}, {} shards)",
                shards.len()
            ),
            Command::DeregisterShards { datanode, shards } => write!(
                f,
                "DeregisterShards(datanode {datanode}, {} shards)",
                shards.len()
            ),
            Command::RemoveDatanode { id } => write!(f, "RemoveDatanode({id})"),
            Command::RemoveDatanodePiece {
                id,
                registered_index,
            } => write!(
                f,
                "RemoveDatanodePiece({id}, registered at {registered_index:?})"
            ),
            Command::PruneReplicas {
                datanode,
                epoch,
                from_bucket,
            } => write!(
                f,
                "PruneReplicas(datanode {datanode}, epoch {epoch}, from bucket {from_bucket})"
            ),
            Command::Put {
                key, if_revision, ..
            } => write!(f, "Put({key:?}, if {if_revision:?})"),
            Command::Delete { key, if_revision } => {
                write!(f, "Delete({key:?}, if {if_revision:?})")
            }
            Command::SetClusterVersion { version } => write!(f, "SetClusterVersion({version})"),
            Command::RaiseEpochFloor { at_least } => write!(f, "RaiseEpochFloor({at_least})"),
            Command::ClaimForRestore { at_least } => write!(f, "ClaimForRestore({at_least})"),
            Command::BeginRestore { at_least, origin } => write!(
                f,
                "BeginRestore({at_least}, backup at index {})",
                origin.index
            ),
            Command::EndRestore => write!(f, "EndRestore"),
            Command::RestorePut { key, .. } => write!(f, "RestorePut({key:?})"),
            Command::BeginRestoreHoldingKeys { at_least, origin } => write!(
                f,
                "BeginRestoreHoldingKeys({at_least}, backup at index {})",
                origin.index
            ),
            Command::DeregisterShardsOf {
                datanode,
                epoch,
                shards,
            } => write!(
                f,
                "DeregisterShards(datanode {datanode}, epoch {epoch}, {} shards)",
                shards.len()
            ),
        }
    }
}

/// The outcome of applying one command (or a blank/membership entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum CommandResult {
    /// Blank and membership entries.
    #[default]
    Empty,
    DatanodeRegistered {
        id: u64,
        epoch: u64,
    },
    /// `accepted` replicas were new or changed, `unchanged` were re-registrations with the
    /// stored generation and size (their epoch is brought up to the batch's, which the admin
    /// API does not show and no watch event reports) and the ids in `stale` carried a
    /// generation lower than the stored one.
    ShardsRegistered {
        accepted: u64,
        unchanged: u64,
        stale: Vec<u64>,
    },
    /// The batch's epoch is not the datanode's current epoch; nothing was written.
    Fenced {
        current_epoch: u64,
    },
    UnknownDatanode {
        id: u64,
    },
    ShardsDeregistered {
        removed: u64,
    },
    DatanodeRemoved {
        existed: bool,
        replicas_removed: u64,
    },
    /// The key now has `revision` (the command's log index).
    Put {
        revision: u64,
    },
    /// `revision` is the command's log index.
    Deleted {
        existed: bool,
        revision: u64,
    },
    /// The compare-and-swap failed; `current` is the key's revision (0 = absent).
    RevisionMismatch {
        current: u64,
    },
    /// A piece of a prune dropped `removed` replicas; the next piece starts at bucket `next`
    /// (`None`: the prune is complete).
    Pruned {
        removed: u64,
        next: Option<u64>,
    },
    /// The cluster's version after a `SetClusterVersion`.
    ClusterVersion {
        version: u32,
    },
    /// A piece of a removal dropped `removed` replicas of the incarnation registered at
    /// `registered_index`; `gone`: it also dropped the datanode's record (it holds no replica
    /// any more).
    RemovalPiece {
        removed: u64,
        gone: bool,
        registered_index: u64,
    },
    /// The cluster's epoch floor after a `RaiseEpochFloor`, or a `ClaimForRestore` that took
    /// the cluster.
    EpochFloor {
        floor: u64,
    },
    /// A `ClaimForRestore` found the cluster not fresh: what it holds (its epoch floor, 0 if
    /// never raised); nothing changed.
    NotFresh {
        floor: u64,
        datanodes: bool,
        keys: bool,
    },
    /// The datanode is being removed (cluster version 7: a removal's first piece marked it, and
    /// it has not ended): the command is refused whatever its epoch; nothing was written.
    /// `current_epoch` is the one the removal raised it to, which no registration gave.
    /// Last of the variants: builds of version 6 and older cannot decode it, and never get it.
    FencedForRemoval {
        current_epoch: u64,
    },
    /// An `EndRestore` removed `ended` (`None`: the cluster held no mark, nothing changed).
    /// Builds of version 7 and older never get it.
    RestoreEnded {
        ended: Option<RestoreMark>,
    },
    /// A restore into the cluster, claimed at `claimed_at`, has not ended: a datanode's
    /// registration (one that is not the restore's), an unfenced drop of replicas, and, if the
    /// claim held keys back, a key's write or delete (other than `RestorePut`) is refused until
    /// it does; nothing was written. Builds of version 7 and older never get it.
    RestoreUnderWay {
        claimed_at: u64,
    },
    /// A `RestorePut` found no restore under way (the cluster holds no mark: the restore was
    /// ended, by hand say, or never marked the cluster); nothing was written. Builds of version
    /// 8 and older never get it.
    NotRestoring,
}
