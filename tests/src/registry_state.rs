//! One node's whole registry as seen through the API: every replica, datanode and key-value entry.

use std::collections::BTreeMap;

use crate::client::{Api, Consistency, DatanodeEntry};
use crate::model::{ReplicaKey, ReplicaValue};

/// A node's registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryState {
    /// Every replica in the listing.
    pub replicas: BTreeMap<ReplicaKey, ReplicaValue>,
    /// Replicas the listing returned more than once.
    pub duplicates: Vec<ReplicaKey>,
    /// Datanodes by id.
    pub datanodes: BTreeMap<u64, DatanodeEntry>,
    /// Keys under the fetched prefix with value and revision.
    pub kv: BTreeMap<String, (Vec<u8>, u64)>,
}

impl RegistryState {
    /// Reads the registry of the node behind `api` (all pages), and the keys under `kv_prefix` with
    /// their values.
    pub async fn fetch(
        api: &Api,
        consistency: Consistency,
        kv_prefix: &str,
    ) -> anyhow::Result<RegistryState> {
        let mut state = RegistryState::default();
        for entry in api.list_shards(None, consistency).await? {
            let value = ReplicaValue {
                generation: entry.generation,
                size: entry.size,
            };
            if state
                .replicas
                .insert((entry.shard, entry.datanode), value)
                .is_some()
            {
                state.duplicates.push((entry.shard, entry.datanode));
            }
        }
        for datanode in api.datanodes(consistency).await? {
            state.datanodes.insert(datanode.id, datanode);
        }
        for (key, revision) in api.kv_list(kv_prefix, consistency).await? {
            let Some((value, rev)) = api.kv_get(&key, consistency).await? else {
                anyhow::bail!("key {key:?} listed but not found");
            };
            anyhow::ensure!(
                rev == revision,
                "key {key:?} listed at revision {revision}, read at {rev}"
            );
            state.kv.insert(key, (value, revision));
        }
        Ok(state)
    }

    /// A short description of how `self` differs from `other`.
    pub fn diff(&self, other: &RegistryState) -> String {
        let mut out = Vec::new();
        for (key, value) in &self.replicas {
            if other.replicas.get(key) != Some(value) {
                out.push(format!(
                    "replica {key:?}: {value:?} vs {:?}",
                    other.replicas.get(key)
                ));
            }
        }
        for (key, value) in &other.replicas {
            if !self.replicas.contains_key(key) {
                out.push(format!("replica {key:?}: missing vs {value:?}"));
            }
        }
        if self.datanodes != other.datanodes {
            out.push(format!(
                "datanodes {:?} vs {:?}",
                self.datanodes, other.datanodes
            ));
        }
        for (key, value) in &self.kv {
            if other.kv.get(key) != Some(value) {
                out.push(format!(
                    "key {key:?}: revision {} vs {:?}",
                    value.1,
                    other.kv.get(key).map(|v| v.1)
                ));
            }
        }
        for key in other.kv.keys() {
            if !self.kv.contains_key(key) {
                out.push(format!("key {key:?}: missing vs present"));
            }
        }
        if self.duplicates != other.duplicates {
            out.push(format!(
                "duplicates {:?} vs {:?}",
                self.duplicates, other.duplicates
            ));
        }
        let total = out.len();
        out.truncate(20);
        format!(
            "{total} differences, first {}:\n  {}",
            out.len(),
            out.join("\n  ")
        )
    }
}
