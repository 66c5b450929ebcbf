//! Executes the commands of one `apply` call against the registry tree, collecting every
//! write in memory (reads see earlier writes of the same call) so that the whole call,
//! including last-applied and membership, becomes one atomic sled batch.
//!
//! Execution is deterministic: it depends only on the registry state and the entries, so
//! every replica computes the same results, and re-applying after a restart is a no-op
//! because entries at or below the stored last-applied are skipped by the caller.

use std::collections::BTreeMap;

use crate::codec;
use crate::command::{Command, CommandResult, ShardReport};
use crate::error::{Error, Result};
use crate::keys;
use crate::records::{DatanodeRecord, KvRecord, ReplicaRecord};
use crate::types::{LogId, StoredMembership};

/// The pending writes of one `apply` call.
pub(crate) struct ApplyBatch<'a> {
    tree: &'a sled::Tree,
    /// key -> new value (`None` = delete).
    pending: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    replicas: u64,
}

impl<'a> ApplyBatch<'a> {
    pub(crate) fn new(tree: &'a sled::Tree, replicas: u64) -> Self {
        ApplyBatch {
            tree,
            pending: BTreeMap::new(),
            replicas,
        }
    }

    /// The replica count including this batch's changes.
    pub(crate) fn replicas(&self) -> u64 {
        self.replicas
    }

    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(p) = self.pending.get(key) {
            return Ok(p.clone());
        }
        self.tree
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| Error::registry("read during apply", e))
    }

    fn get<T: serde::de::DeserializeOwned>(&self, key: &[u8], what: &str) -> Result<Option<T>> {
        match self.raw_get(key)? {
            None => Ok(None),
            Some(v) => codec::decode(&v)
                .map(Some)
                .map_err(|e| Error::corrupt(what.to_string(), e)),
        }
    }

    fn put<T: serde::Serialize>(&mut self, key: &[u8], value: &T) -> Result<()> {
        let v = codec::encode(value).map_err(|e| Error::corrupt("encode record", e))?;
        self.pending.insert(key.to_vec(), Some(v));
        Ok(())
    }

    fn put_raw(&mut self, key: &[u8], value: Vec<u8>) {
        self.pending.insert(key.to_vec(), Some(value));
    }

    fn remove(&mut self, key: &[u8]) {
        self.pending.insert(key.to_vec(), None);
    }

    /// Records the applied log id (and the membership, when the entry carries one).
    pub(crate) fn set_applied(&mut self, log_id: &LogId) -> Result<()> {
        self.put(keys::META_APPLIED, log_id)
    }

    pub(crate) fn set_membership(&mut self, m: &StoredMembership) -> Result<()> {
        self.put(keys::META_MEMBERSHIP, m)
    }

    /// Applies one command at log `index`.
    pub(crate) fn execute(&mut self, index: u64, cmd: &Command) -> Result<CommandResult> {
        match cmd {
            Command::RegisterDatanode { id, addr } => self.register_datanode(index, *id, addr),
            Command::RegisterShards {
                datanode,
                epoch,
                shards,
            } => self.register_shards(*datanode, *epoch, shards),
            Command::DeregisterShards { datanode, shards } => {
                self.deregister_shards(*datanode, shards)
            }
            Command::RemoveDatanode { id } => self.remove_datanode(*id),
            Command::Put {
                key,
                value,
                if_revision,
            } => self.put_kv(index, key, value, *if_revision),
            Command::Delete { key, if_revision } => self.delete_kv(index, key, *if_revision),
        }
    }

    fn register_datanode(&mut self, index: u64, id: u64, addr: &str) -> Result<CommandResult> {
        let key = keys::datanode(id);
        let shards = self
            .get::<DatanodeRecord>(&key, "datanode")?
            .map(|r| r.shards)
            .unwrap_or(0);
        let rec = DatanodeRecord {
            addr: addr.to_string(),
            epoch: index,
            registered_index: index,
            shards,
        };
        self.put(&key, &rec)?;
        Ok(CommandResult::DatanodeRegistered { id, epoch: index })
    }

    fn register_shards(
        &mut self,
        datanode: u64,
        epoch: u64,
        shards: &[ShardReport],
    ) -> Result<CommandResult> {
        let dkey = keys::datanode(datanode);
        let Some(mut dn) = self.get::<DatanodeRecord>(&dkey, "datanode")? else {
            return Ok(CommandResult::UnknownDatanode { id: datanode });
        };
        if dn.epoch != epoch {
            return Ok(CommandResult::Fenced {
                current_epoch: dn.epoch,
            });
        }
        let (mut accepted, mut unchanged, mut stale) = (0u64, 0u64, Vec::new());
        for s in shards {
            let rkey = keys::replica(s.id, datanode);
            let new = ReplicaRecord {
                generation: s.generation,
                size: s.size,
                epoch,
            };
            match self.get::<ReplicaRecord>(&rkey, "replica")? {
                Some(old) if s.generation < old.generation => stale.push(s.id),
                Some(old) if old == new => unchanged += 1,
                Some(_) => {
                    self.put(&rkey, &new)?;
                    accepted += 1;
                }
                None => {
                    self.put(&rkey, &new)?;
                    self.put_raw(&keys::by_datanode(datanode, s.id), Vec::new());
                    dn.shards += 1;
                    self.replicas += 1;
                    accepted += 1;
                }
            }
        }
        if accepted > 0 {
            self.put(&dkey, &dn)?;
        }
        Ok(CommandResult::ShardsRegistered {
            accepted,
            unchanged,
            stale,
        })
    }

    fn deregister_shards(&mut self, datanode: u64, shards: &[u64]) -> Result<CommandResult> {
        let dkey = keys::datanode(datanode);
        let Some(mut dn) = self.get::<DatanodeRecord>(&dkey, "datanode")? else {
            return Ok(CommandResult::UnknownDatanode { id: datanode });
        };
        let mut removed = 0u64;
        for &shard in shards {
            let rkey = keys::replica(shard, datanode);
            if self.raw_get(&rkey)?.is_some() {
                self.remove(&rkey);
                self.remove(&keys::by_datanode(datanode, shard));
                removed += 1;
            }
        }
        if removed > 0 {
            dn.shards = dn.shards.saturating_sub(removed);
            self.replicas = self.replicas.saturating_sub(removed);
            self.put(&dkey, &dn)?;
        }
        Ok(CommandResult::ShardsDeregistered { removed })
    }

    /// The shard ids indexed under `datanode`, merging the tree with pending writes.
    fn shards_of(&self, datanode: u64) -> Result<Vec<u64>> {
        let prefix = keys::by_datanode_prefix(datanode);
        let mut set = std::collections::BTreeSet::new();
        for item in self.tree.scan_prefix(prefix) {
            let (k, _) = item.map_err(|e| Error::registry("scan during apply", e))?;
            if let Some((_, shard)) = keys::two_ids(&k) {
                set.insert(shard);
            }
        }
        for (k, v) in self.pending.range(prefix.to_vec()..) {
            if !k.starts_with(&prefix) {
                break;
            }
            if let Some((_, shard)) = keys::two_ids(k) {
                if v.is_some() {
                    set.insert(shard);
                } else {
                    set.remove(&shard);
                }
            }
        }
        Ok(set.into_iter().collect())
    }

    fn remove_datanode(&mut self, id: u64) -> Result<CommandResult> {
        let dkey = keys::datanode(id);
        if self.raw_get(&dkey)?.is_none() {
            return Ok(CommandResult::DatanodeRemoved {
                existed: false,
                replicas_removed: 0,
            });
        }
        let shards = self.shards_of(id)?;
        for &shard in &shards {
            self.remove(&keys::replica(shard, id));
            self.remove(&keys::by_datanode(id, shard));
        }
        self.remove(&dkey);
        let n = shards.len() as u64;
        self.replicas = self.replicas.saturating_sub(n);
        Ok(CommandResult::DatanodeRemoved {
            existed: true,
            replicas_removed: n,
        })
    }

    fn put_kv(
        &mut self,
        index: u64,
        key: &str,
        value: &[u8],
        if_revision: Option<u64>,
    ) -> Result<CommandResult> {
        let k = keys::kv(key);
        let current = self
            .get::<KvRecord>(&k, "kv")?
            .map(|r| r.revision)
            .unwrap_or(0);
        if let Some(want) = if_revision {
            if want != current {
                return Ok(CommandResult::RevisionMismatch { current });
            }
        }
        self.put(
            &k,
            &KvRecord {
                value: value.to_vec(),
                revision: index,
            },
        )?;
        Ok(CommandResult::Put { revision: index })
    }

    fn delete_kv(
        &mut self,
        index: u64,
        key: &str,
        if_revision: Option<u64>,
    ) -> Result<CommandResult> {
        let k = keys::kv(key);
        let current = self
            .get::<KvRecord>(&k, "kv")?
            .map(|r| r.revision)
            .unwrap_or(0);
        if let Some(want) = if_revision {
            if want != current {
                return Ok(CommandResult::RevisionMismatch { current });
            }
        }
        let existed = current != 0;
        if existed {
            self.remove(&k);
        }
        Ok(CommandResult::Deleted {
            existed,
            revision: index,
        })
    }

    /// The sled batch of every pending write (with the replica count), and the keys it
    /// touches (for capture pre-images).
    pub(crate) fn finish(mut self) -> Result<(sled::Batch, Vec<Vec<u8>>)> {
        let replicas = self.replicas;
        self.put(keys::META_REPLICAS, &replicas)?;
        let mut batch = sled::Batch::default();
        let mut touched = Vec::with_capacity(self.pending.len());
        for (k, v) in self.pending {
            match v {
                Some(v) => batch.insert(k.as_slice(), v),
                None => batch.remove(k.as_slice()),
            }
            touched.push(k);
        }
        Ok((batch, touched))
    }
}
