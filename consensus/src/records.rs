//! The values stored in the registry tree (encoded with the crate's codec).

use serde::{Deserialize, Serialize};

/// A datanode: address, current incarnation and replica count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeRecord {
    pub addr: String,
    pub epoch: u64,
    pub registered_index: u64,
    pub shards: u64,
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
