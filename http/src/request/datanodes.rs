//! Bodies of the datanode routes: registration (with an epoch floor), shard batches, and the
//! epoch that prunes and heartbeats carry.

use std::collections::HashSet;

use serde::Deserialize;

use meta_consensus::Command;

use super::fields::{not_null, validate_addr};
use super::object_only::objects;
use crate::error::ApiError;
use crate::limits::MAX_SHARDS_PER_BATCH;

/// Body of `PUT /v1/datanodes/{id}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterDatanodeBody {
    /// The datanode's address, `host:port`.
    pub addr: String,
    /// The new epoch is at least this (a restore sets it; at most [`MAX_MIN_EPOCH`]).
    #[serde(default, deserialize_with = "not_null")]
    pub min_epoch: Option<u64>,
}

/// Largest `min_epoch`, 2^52: every registration after one at the floor adds one, and 2^52
/// of them still keep epochs at most 2^53, the largest integer every JSON reader (doubles
/// included) holds exactly. Restores set floors near the time in microseconds, about 2^51.
pub const MAX_MIN_EPOCH: u64 = 1 << 52;

pub(super) fn validate_min_epoch(min_epoch: u64) -> Result<(), ApiError> {
    if min_epoch > MAX_MIN_EPOCH {
        return Err(ApiError::invalid(
            "invalid_epoch",
            format!("min_epoch must be at most {MAX_MIN_EPOCH}, not {min_epoch}"),
        ));
    }
    Ok(())
}

/// One shard replica in a registration batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardBody {
    /// Shard id.
    pub id: u64,
    /// The replica's generation; a lower one than stored is rejected as stale.
    pub generation: u64,
    /// The replica's size in bytes.
    pub size: u64,
}

/// Body of `POST /v1/datanodes/{id}/shards`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterShardsBody {
    /// The datanode's epoch the batch belongs to.
    pub epoch: u64,
    /// 1 to 10,000 distinct shards.
    #[serde(deserialize_with = "objects")]
    pub shards: Vec<ShardBody>,
}

/// Body of `POST /v1/datanodes/{id}/prune` and `POST /v1/datanodes/{id}/heartbeat`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochBody {
    /// The incarnation that sends it: the datanode's current epoch.
    pub epoch: u64,
}

impl RegisterDatanodeBody {
    /// Checks the address and the epoch floor.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_addr(&self.addr)?;
        self.min_epoch.map_or(Ok(()), validate_min_epoch)
    }

    /// The command that registers datanode `id` as this body asks.
    pub fn command(self, id: u64) -> Command {
        match self.min_epoch {
            None => Command::RegisterDatanode {
                id,
                addr: self.addr,
            },
            Some(min_epoch) => Command::RegisterDatanodeAtLeast {
                id,
                addr: self.addr,
                min_epoch,
            },
        }
    }
}

impl RegisterShardsBody {
    /// Checks the batch: 1 to 10,000 shards (413 `batch_too_large` above), no shard twice.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_shard_ids(self.shards.iter().map(|s| s.id), self.shards.len())
    }
}

/// Checks the `n` shard ids of a batch: 1 to 10,000 (413 `batch_too_large` above), none twice.
pub(super) fn validate_shard_ids(ids: impl Iterator<Item = u64>, n: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::invalid(
            "empty_batch",
            "a batch must carry at least one shard",
        ));
    }
    if n > MAX_SHARDS_PER_BATCH {
        return Err(ApiError::too_large(
            "batch_too_large",
            format!("a batch carries at most {MAX_SHARDS_PER_BATCH} shards, this one {n}"),
        ));
    }
    let mut seen = HashSet::with_capacity(n);
    for id in ids {
        if !seen.insert(id) {
            return Err(ApiError::invalid(
                "duplicate_shard",
                format!("shard {id} appears more than once in the batch"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ObjectOnly;

    #[test]
    fn shard_batches() {
        let shard = |id| ShardBody {
            id,
            generation: 1,
            size: 10,
        };
        let batch = |shards| RegisterShardsBody { epoch: 1, shards };
        assert!(batch(vec![shard(1)]).validate().is_ok());
        assert!(batch((0..10_000).map(shard).collect()).validate().is_ok());
        assert_eq!(batch(vec![]).validate().unwrap_err().code(), "empty_batch");
        let too_many = batch((0..10_001).map(shard).collect())
            .validate()
            .unwrap_err();
        assert_eq!(too_many.code(), "batch_too_large");
        assert_eq!(too_many.status().as_u16(), 413);
        assert_eq!(
            batch(vec![shard(1), shard(1)])
                .validate()
                .unwrap_err()
                .code(),
            "duplicate_shard"
        );
    }

    #[test]
    fn shards_must_be_objects() {
        let ok: ObjectOnly<RegisterShardsBody> =
            serde_json::from_str(r#"{"epoch":3,"shards":[{"id":1,"generation":2,"size":3}]}"#)
                .unwrap();
        assert_eq!(ok.0.shards[0].size, 3);
        for bad in [
            r#"{"epoch":3,"shards":[[1,2,3]]}"#,
            r#"[3,[{"id":1,"generation":2,"size":3}]]"#,
            r#"{"epoch":3,"shards":[{"id":1,"generation":2,"size":3,"x":0}]}"#,
            r#"{"epoch":3,"shards":{"id":1}}"#,
        ] {
            assert!(
                serde_json::from_str::<ObjectOnly<RegisterShardsBody>>(bad).is_err(),
                "{bad}"
            );
        }
    }
}
