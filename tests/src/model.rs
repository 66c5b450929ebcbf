//! The model of acknowledged writes, and the check of a node's registry against it: whatever was
//! acknowledged with a 2xx is present exactly once with its value; a write that got no answer is
//! either wholly present or wholly absent; a write that was refused left nothing behind.

use std::collections::{BTreeMap, BTreeSet};

use crate::client::ShardReport;
use crate::registry_state::RegistryState;

/// A replica: (shard id, datanode id).
pub type ReplicaKey = (u64, u64);

/// What a replica records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaValue {
    /// Generation.
    pub generation: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Identifies one batch that was sent (possibly several times).
pub type BatchId = u64;

#[derive(Clone, Debug)]
struct Batch {
    datanode: u64,
    shards: Vec<ShardReport>,
}

impl Batch {
    fn replicas(&self) -> impl Iterator<Item = (ReplicaKey, ReplicaValue)> + '_ {
        self.shards.iter().map(|s| {
            (
                (s.id, self.datanode),
                ReplicaValue {
                    generation: s.generation,
                    size: s.size,
                },
            )
        })
    }
}

/// Everything the test sent and what came back.
#[derive(Clone, Debug, Default)]
pub struct Model {
    replicas: BTreeMap<ReplicaKey, ReplicaValue>,
    acked_batches: u64,
    acked_replicas: u64,
    uncertain: BTreeMap<BatchId, Batch>,
    rejected: Vec<Batch>,
    datanodes: BTreeMap<u64, u64>,
    uncertain_datanodes: BTreeSet<u64>,
    kv: BTreeMap<String, (Vec<u8>, u64)>,
    kv_uncertain: BTreeMap<String, Vec<u8>>,
    next_batch: BatchId,
    /// Answers that contradict the API contract, seen by the workload (e.g. a batch reported stale).
    pub anomalies: Vec<String>,
}

impl Model {
    /// A batch is about to be sent: until it is resolved it counts as unanswered.
    pub fn batch_sent(&mut self, datanode: u64, shards: &[ShardReport]) -> BatchId {
        let id = self.next_batch;
        self.next_batch += 1;
        self.uncertain.insert(
            id,
            Batch {
                datanode,
                shards: shards.to_vec(),
            },
        );
        id
    }

    /// The batch was acknowledged (by any of its attempts).
    pub fn batch_acked(&mut self, id: BatchId) {
        if let Some(batch) = self.uncertain.remove(&id) {
            self.acked_batches += 1;
            self.acked_replicas += batch.shards.len() as u64;
            for (key, value) in batch.replicas() {
                self.replicas.insert(key, value);
            }
        }
    }

    /// The batch was refused with a 4xx by its only attempt that could have landed.
    pub fn batch_rejected(&mut self, id: BatchId) {
        if let Some(batch) = self.uncertain.remove(&id) {
            self.rejected.push(batch);
        }
    }

    /// A datanode registration was sent and got no answer.
    pub fn datanode_uncertain(&mut self, id: u64) {
        self.uncertain_datanodes.insert(id);
    }

    /// A datanode registration was acknowledged with `epoch`.
    pub fn datanode_acked(&mut self, id: u64, epoch: u64) {
        let entry = self.datanodes.entry(id).or_insert(0);
        *entry = (*entry).max(epoch);
    }

    /// The acknowledged epoch of a datanode.
    pub fn datanode_epoch(&self, id: u64) -> Option<u64> {
        self.datanodes.get(&id).copied()
    }

    /// A key-value write is about to be sent.
    pub fn kv_sent(&mut self, key: &str, value: &[u8]) {
        self.kv_uncertain.insert(key.to_owned(), value.to_vec());
    }

    /// A key-value write was acknowledged with `revision`.
    pub fn kv_acked(&mut self, key: &str, value: &[u8], revision: u64) {
        self.kv_uncertain.remove(key);
        self.kv.insert(key.to_owned(), (value.to_vec(), revision));
    }

    /// The keys whose writes were acknowledged.
    pub fn acked_keys(&self) -> impl Iterator<Item = &String> {
        self.kv.keys()
    }

    /// A key-value write was refused.
    pub fn kv_rejected(&mut self, key: &str) {
        self.kv_uncertain.remove(key);
    }

    /// Acknowledged batches and replicas so far.
    pub fn acked(&self) -> (u64, u64) {
        (self.acked_batches, self.acked_replicas)
    }

    /// Number of acknowledged key-value writes.
    pub fn acked_kv(&self) -> usize {
        self.kv.len()
    }

    /// Batches that never got an answer.
    pub fn unresolved_batches(&self) -> usize {
        self.uncertain.len()
    }

    /// The acknowledged replicas.
    pub fn replicas(&self) -> &BTreeMap<ReplicaKey, ReplicaValue> {
        &self.replicas
    }

    /// Every way in which `state` (one node's registry) breaks the promise; empty when it keeps it.
    /// `kv_prefix` limits the key-value check to the keys the test wrote.
    pub fn violations(&self, state: &RegistryState, kv_prefix: &str) -> Vec<String> {
        let mut out = self.anomalies.clone();
        for key in &state.duplicates {
            out.push(format!("replica {key:?} listed more than once"));
        }
        // Values a replica may have: the acknowledged one, or one from an unanswered batch.
        let mut uncertain_values: BTreeMap<ReplicaKey, Vec<ReplicaValue>> = BTreeMap::new();
        for batch in self.uncertain.values() {
            for (key, value) in batch.replicas() {
                uncertain_values.entry(key).or_default().push(value);
            }
        }
        for (key, want) in &self.replicas {
            match state.replicas.get(key) {
                None => out.push(format!("acknowledged replica {key:?} lost")),
                Some(got) if got == want => {}
                Some(got) if uncertain_values.get(key).is_some_and(|v| v.contains(got)) => {}
                Some(got) => out.push(format!("replica {key:?} is {got:?}, acknowledged {want:?}")),
            }
        }
        for (key, got) in &state.replicas {
            if self.replicas.contains_key(key) {
                continue;
            }
            if !uncertain_values.get(key).is_some_and(|v| v.contains(got)) {
                out.push(format!(
                    "replica {key:?} = {got:?} was never acknowledged nor left unanswered"
                ));
            }
        }
        for (id, batch) in &self.uncertain {
            let candidates: Vec<_> = batch
                .replicas()
                .filter(|(k, _)| !self.replicas.contains_key(k))
                .collect();
            let present = candidates
                .iter()
                .filter(|(k, v)| state.replicas.get(k) == Some(v))
                .count();
            if present != 0 && present != candidates.len() {
                out.push(format!(
                    "unanswered batch {id} (datanode {}) half applied: {present} of {} replicas present",
                    batch.datanode,
                    candidates.len()
                ));
            }
        }
        for batch in &self.rejected {
            for (key, value) in batch.replicas() {
                if self.replicas.contains_key(&key) || uncertain_values.contains_key(&key) {
                    continue;
                }
                if state.replicas.get(&key) == Some(&value) {
                    out.push(format!("replica {key:?} of a refused batch landed"));
                }
            }
        }
        let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
        for (_, datanode) in state.replicas.keys() {
            *counts.entry(*datanode).or_default() += 1;
        }
        for (id, epoch) in &self.datanodes {
            match state.datanodes.get(id) {
                None => out.push(format!("acknowledged datanode {id} lost")),
                Some(entry) if entry.epoch == *epoch => {}
                Some(entry) if entry.epoch > *epoch && self.uncertain_datanodes.contains(id) => {}
                Some(entry) => out.push(format!(
                    "datanode {id} has epoch {}, acknowledged {epoch}",
                    entry.epoch
                )),
            }
        }
        for (id, entry) in &state.datanodes {
            if !self.datanodes.contains_key(id) && !self.uncertain_datanodes.contains(id) {
                out.push(format!("datanode {id} was never registered"));
            }
            let listed = counts.get(id).copied().unwrap_or(0);
            if entry.shards != listed {
                out.push(format!(
                    "datanode {id} reports {} shards, the listing has {listed}",
                    entry.shards
                ));
            }
        }
        for (key, (value, revision)) in &self.kv {
            match state.kv.get(key) {
                None => out.push(format!("acknowledged key {key:?} lost")),
                Some((v, r)) if v == value && r == revision => {}
                Some((v, r)) => out.push(format!(
                    "key {key:?} is {:?} at revision {r}, acknowledged {:?} at revision {revision}",
                    String::from_utf8_lossy(v),
                    String::from_utf8_lossy(value)
                )),
            }
        }
        for (key, (value, _)) in state.kv.iter().filter(|(k, _)| k.starts_with(kv_prefix)) {
            if self.kv.contains_key(key) {
                continue;
            }
            if self.kv_uncertain.get(key) != Some(value) {
                out.push(format!(
                    "key {key:?} was never acknowledged nor left unanswered"
                ));
            }
        }
        out
    }

    /// Panics with a report when `state` of `node` breaks the promise.
    pub fn assert_matches(&self, node: u64, state: &RegistryState, kv_prefix: &str) {
        let violations = self.violations(state, kv_prefix);
        if !violations.is_empty() {
            let shown: Vec<_> = violations.iter().take(30).cloned().collect();
            panic!(
                "node {node} does not match the model ({} violations, first {}):\n  {}",
                violations.len(),
                shown.len(),
                shown.join("\n  ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::DatanodeEntry;

    fn report(id: u64) -> ShardReport {
        ShardReport {
            id,
            generation: 1,
            size: id * 10,
        }
    }

    fn state_with(replicas: &[(u64, u64)]) -> RegistryState {
        let mut state = RegistryState::default();
        for (shard, dn) in replicas {
            state.replicas.insert(
                (*shard, *dn),
                ReplicaValue {
                    generation: 1,
                    size: shard * 10,
                },
            );
        }
        let mut count = BTreeMap::new();
        for (_, dn) in replicas {
            *count.entry(*dn).or_insert(0u64) += 1;
        }
        for (dn, shards) in count {
            state.datanodes.insert(
                dn,
                DatanodeEntry {
                    id: dn,
                    addr: String::new(),
                    epoch: 5,
                    shards,
                },
            );
        }
        state
    }

    #[test]
    fn detects_lost_half_applied_and_phantom_replicas() {
        let mut model = Model::default();
        model.datanode_acked(7, 5);
        let a = model.batch_sent(7, &[report(1), report(2)]);
        model.batch_acked(a);
        let _b = model.batch_sent(7, &[report(3), report(4)]);
        let c = model.batch_sent(7, &[report(5)]);
        model.batch_rejected(c);

        assert!(model
            .violations(&state_with(&[(1, 7), (2, 7)]), "x/")
            .is_empty());
        assert!(model
            .violations(&state_with(&[(1, 7), (2, 7), (3, 7), (4, 7)]), "x/")
            .is_empty());
        let lost = model.violations(&state_with(&[(1, 7)]), "x/");
        assert!(lost.iter().any(|v| v.contains("lost")), "{lost:?}");
        let half = model.violations(&state_with(&[(1, 7), (2, 7), (3, 7)]), "x/");
        assert!(half.iter().any(|v| v.contains("half applied")), "{half:?}");
        let refused = model.violations(&state_with(&[(1, 7), (2, 7), (5, 7)]), "x/");
        assert!(
            refused.iter().any(|v| v.contains("never acknowledged")),
            "{refused:?}"
        );
    }
}
