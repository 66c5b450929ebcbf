//! The values stored in the registry tree (encoded with the crate's codec).

use serde::{Deserialize, Serialize};

use crate::types::LogId;

/// What every apply writes: the last applied log id and the total replica count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRecord {
    pub applied: Option<LogId>,
    pub replicas: u64,
}

/// A datanode: address, current incarnation and replica count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeRecord {
    pub addr: String,
    pub epoch: u64,
    pub registered_index: u64,
    pub shards: u64,
}

/// Whether the datanode whose record is `dn` is being removed, given the value `mark` under
/// its id's epoch floor key: from cluster version 7 a removal's first piece keeps there the epoch
/// it raised the record to, while the record stays. A registration drops the mark, so a record
/// and a floor key never coexist otherwise (a removal puts the floor as it drops the record).
pub fn being_removed(dn: &DatanodeRecord, mark: Option<u64>) -> bool {
    mark == Some(dn.epoch)
}

/// A restore under way, or one cut off part way (cluster version 8): the claim that began it
/// puts it, and the restore's end removes it. While it stays, the cluster may hold part of a
/// backup only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreMark {
    /// The log index of the claim.
    pub claimed_at: u64,
    /// The epoch floor the claim raised: every epoch the restore gives is at least this, and
    /// a registration that does not ask for as much is not the restore's.
    pub floor: u64,
    /// The backup the restore replays, as it told the claim.
    pub origin: RestoreOrigin,
}

/// What a backup holds, as a restore tells its claim: the index of its snapshot and its counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOrigin {
    pub index: u64,
    pub datanodes: u64,
    pub replicas: u64,
    pub keys: u64,
}

/// One replica of a shard on a datanode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub generation: u64,
    pub size: u64,
    pub epoch: u64,
}

/// A key-value entry with its revision (log index of its last write).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvRecord {
    pub value: Vec<u8>,
    pub revision: u64,
}

/// One replica in a shard bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketEntry {
    pub shard: u64,
    pub datanode: u64,
    pub replica: ReplicaRecord,
}

/// The replicas of the shards of one bucket, sorted by (shard, datanode), without duplicates.
pub type ReplicaBucket = Vec<BucketEntry>;

/// Finds (shard, datanode) in a bucket: `Ok(position)` or `Err(insertion point)`.
pub fn find(bucket: &[BucketEntry], shard: u64, datanode: u64) -> Result<usize, usize> {
    bucket.binary_search_by(|e| (e.shard, e.datanode).cmp(&(shard, datanode)))
}
