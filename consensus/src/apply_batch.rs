//! Executes applied commands against the registry tree, collecting every write in memory
//! (reads see earlier writes of the same batch) so that the whole batch, including
//! last-applied and membership, becomes one atomic sled commit. A batch may span several
//! `apply` calls (see `state_machine.rs`): writes to the same key then cost one sled write.
//!
//! Execution is deterministic: it depends only on the registry state and the entries, so
//! every replica computes the same results, and re-applying after a restart is a no-op
//! because entries at or below the stored last-applied are skipped by the caller.

use std::collections::BTreeMap;

use crate::codec;
use crate::command::{Command, CommandResult, ShardReport};
use crate::error::{Error, Result};
use crate::keys;
use crate::records::{
    find, AppliedRecord, BucketEntry, DatanodeRecord, KvRecord, ReplicaBucket, ReplicaRecord,
};
use crate::types::{LogId, StoredMembership};

/// A pending write: encoded bytes, or a decoded replica bucket kept decoded until the batch
/// is committed, so that many changes to one bucket cost one decode and one encode.
enum Pending {
    Raw(Option<Vec<u8>>),
    Replicas(ReplicaBucket),
}

/// The writes of one batch, in key order: `None` deletes the key.
pub(crate) type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Bytes of keys and values in `writes`.
pub(crate) fn writes_bytes(writes: &Writes) -> usize {
    writes
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum()
}

pub(crate) struct ApplyBatch {
    tree: sled::Tree,
    /// key -> new value.
    pending: BTreeMap<Vec<u8>, Pending>,
    replicas: u64,
    /// Datanodes added minus datanodes removed by this batch.
    datanodes_delta: i64,
    applied: Option<LogId>,
}

impl ApplyBatch {
    pub(crate) fn new(tree: sled::Tree, replicas: u64) -> Self {
        ApplyBatch {
            tree,
            pending: BTreeMap::new(),
            replicas,
            datanodes_delta: 0,
            applied: None,
        }
    }

    /// Datanodes added minus datanodes removed by this batch.
    pub(crate) fn datanodes_delta(&self) -> i64 {
        self.datanodes_delta
    }

    /// The value the batch writes to `key`, decoded: `None` if it does not write the key,
    /// `Some(None)` if it deletes it.
    pub(crate) fn pending<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        what: &str,
    ) -> Result<Option<Option<T>>> {
        match self.pending.get(key) {
            None => Ok(None),
            Some(Pending::Raw(v)) => decode_opt(v.as_deref(), what).map(Some),
            Some(Pending::Replicas(_)) => Err(Error::Raft(format!(
                "{what}: pending value of another kind"
            ))),
        }
    }

    /// Bucket `b` as the batch writes it, if it does.
    pub(crate) fn pending_bucket(&self, b: u64) -> Option<ReplicaBucket> {
        match self.pending.get(&keys::replica_bucket(b)[..]) {
            Some(Pending::Replicas(bucket)) => Some(bucket.clone()),
            Some(Pending::Raw(_)) | None => None,
        }
    }

    /// How many keys the batch writes (besides last-applied).
    pub(crate) fn keys(&self) -> usize {
        self.pending.len()
    }

    /// The replica count including this batch's changes.
    pub(crate) fn replicas(&self) -> u64 {
        self.replicas
    }

    fn tree_get(&self, key: &[u8]) -> Result<Option<sled::IVec>> {
        self.tree
            .get(key)
            .map_err(|e| Error::registry("read during apply", e))
    }

    fn get<T: serde::de::DeserializeOwned>(&self, key: &[u8], what: &str) -> Result<Option<T>> {
        let bytes = match self.pending.get(key) {
            Some(Pending::Raw(v)) => return decode_opt(v.as_deref(), what),
            Some(_) => {
                return Err(Error::Raft(format!(
                    "{what}: pending value of another kind"
                )))
            }
            None => self.tree_get(key)?,
        };
        decode_opt(bytes.as_deref(), what)
    }

    fn exists(&self, key: &[u8]) -> Result<bool> {
        match self.pending.get(key) {
            Some(Pending::Raw(v)) => Ok(v.is_some()),
            Some(_) => Ok(true),
            None => Ok(self.tree_get(key)?.is_some()),
        }
    }

    fn put<T: serde::Serialize>(&mut self, key: &[u8], value: &T) -> Result<()> {
        let v = codec::encode(value).map_err(|e| Error::corrupt("encode record", e))?;
        self.pending.insert(key.to_vec(), Pending::Raw(Some(v)));
        Ok(())
    }

    fn remove(&mut self, key: &[u8]) {
        self.pending.insert(key.to_vec(), Pending::Raw(None));
    }

    /// The replica bucket `b`, decoded into the pending map.
    fn bucket(&mut self, b: u64) -> Result<&mut ReplicaBucket> {
        let key = keys::replica_bucket(b);
        if !self.pending.contains_key(&key[..]) {
            let bucket: ReplicaBucket =
                decode_opt(self.tree_get(&key)?.as_deref(), "replica bucket")?.unwrap_or_default();
            self.pending.insert(key.to_vec(), Pending::Replicas(bucket));
        }
        match self.pending.get_mut(&key[..]) {
            Some(Pending::Replicas(b)) => Ok(b),
            _ => Err(Error::Raft("replica bucket pending as another kind".into())),
        }
    }

    /// Keeps the index entry of (`datanode`, bucket `b`) in step with the bucket: present while
    /// the bucket holds a replica of the datanode. Writes only when that changes, so callers
    /// pass `before`, whether the bucket held one before their change.
    fn index(&mut self, datanode: u64, b: u64, before: bool) -> Result<()> {
        let after = self.bucket(b)?.iter().any(|e| e.datanode == datanode);
        if before != after {
            let key = keys::by_datanode(datanode, b);
            let value = after.then(|| keys::PRESENT.to_vec());
            self.pending.insert(key.to_vec(), Pending::Raw(value));
        }
        Ok(())
    }

    /// Records the applied log id (written with the replica count by `finish`).
    pub(crate) fn set_applied(&mut self, log_id: &LogId) {
        self.applied = Some(*log_id);
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
        let shards = match self.get::<DatanodeRecord>(&key, "datanode")? {
            Some(r) => r.shards,
            None => {
                self.datanodes_delta += 1;
                0
            }
        };
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
            let b = keys::bucket_of(s.id);
            let new = ReplicaRecord {
                generation: s.generation,
                size: s.size,
                epoch,
            };
            let bucket = self.bucket(b)?;
            let held = bucket.iter().any(|e| e.datanode == datanode);
            match find(bucket, s.id, datanode) {
                Ok(i) if s.generation < bucket[i].replica.generation => stale.push(s.id),
                Ok(i) if bucket[i].replica == new => unchanged += 1,
                Ok(i) => {
                    bucket[i].replica = new;
                    accepted += 1;
                }
                Err(i) => {
                    bucket.insert(
                        i,
                        BucketEntry {
                            shard: s.id,
                            datanode,
                            replica: new,
                        },
                    );
                    self.index(datanode, b, held)?;
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
            let b = keys::bucket_of(shard);
            let bucket = self.bucket(b)?;
            if let Ok(i) = find(bucket, shard, datanode) {
                bucket.remove(i);
                self.index(datanode, b, true)?;
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

    /// The buckets holding replicas of `datanode`, merging the tree with pending writes.
    fn buckets_of(&self, datanode: u64) -> Result<Vec<u64>> {
        let prefix = keys::by_datanode_prefix(datanode);
        let mut set = std::collections::BTreeSet::new();
        for item in self.tree.scan_prefix(prefix) {
            let (k, _) = item.map_err(|e| Error::registry("scan during apply", e))?;
            if let Some((_, b)) = keys::two_ids(&k) {
                set.insert(b);
            }
        }
        for (k, v) in self.pending.range(prefix.to_vec()..) {
            if !k.starts_with(&prefix) {
                break;
            }
            if let Some((_, b)) = keys::two_ids(k) {
                match v {
                    Pending::Raw(None) => set.remove(&b),
                    _ => set.insert(b),
                };
            }
        }
        Ok(set.into_iter().collect())
    }

    fn remove_datanode(&mut self, id: u64) -> Result<CommandResult> {
        let dkey = keys::datanode(id);
        if !self.exists(&dkey)? {
            return Ok(CommandResult::DatanodeRemoved {
                existed: false,
                replicas_removed: 0,
            });
        }
        let mut n = 0u64;
        for b in self.buckets_of(id)? {
            let bucket = self.bucket(b)?;
            let before = bucket.len();
            bucket.retain(|e| e.datanode != id);
            n += (before - bucket.len()) as u64;
            self.remove(&keys::by_datanode(id, b));
        }
        self.remove(&dkey);
        self.datanodes_delta -= 1;
        self.replicas = self.replicas.saturating_sub(n);
        Ok(CommandResult::DatanodeRemoved {
            existed: true,
            replicas_removed: n,
        })
    }

    /// The key's current revision (0 if absent), or the `RevisionMismatch` result when
    /// `if_revision` asks for another one.
    fn check_revision(
        &self,
        k: &[u8],
        if_revision: Option<u64>,
    ) -> Result<std::result::Result<u64, CommandResult>> {
        let current = self
            .get::<KvRecord>(k, "kv")?
            .map(|r| r.revision)
            .unwrap_or(0);
        Ok(match if_revision {
            Some(want) if want != current => Err(CommandResult::RevisionMismatch { current }),
            _ => Ok(current),
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
        if let Err(mismatch) = self.check_revision(&k, if_revision)? {
            return Ok(mismatch);
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
        let current = match self.check_revision(&k, if_revision)? {
            Ok(current) => current,
            Err(mismatch) => return Ok(mismatch),
        };
        let existed = current != 0;
        if existed {
            self.remove(&k);
        }
        Ok(CommandResult::Deleted {
            existed,
            revision: index,
        })
    }

    /// Every pending write (with the replica count), in key order: `None` deletes the key.
    /// Empty buckets are deleted.
    pub(crate) fn finish(mut self) -> Result<Writes> {
        let rec = AppliedRecord {
            applied: self.applied,
            replicas: self.replicas,
        };
        self.put(keys::META_APPLIED, &rec)?;
        let mut writes = Vec::with_capacity(self.pending.len());
        let enc = |e| Error::corrupt("encode record", e);
        for (k, v) in self.pending {
            let value = match v {
                Pending::Raw(v) => v,
                Pending::Replicas(b) if b.is_empty() => None,
                Pending::Replicas(b) => Some(codec::encode(&b).map_err(enc)?),
            };
            writes.push((k, value));
        }
        Ok(writes)
    }
}

fn decode_opt<T: serde::de::DeserializeOwned>(
    bytes: Option<&[u8]>,
    what: &str,
) -> Result<Option<T>> {
    match bytes {
        None => Ok(None),
        Some(v) => codec::decode(v)
            .map(Some)
            .map_err(|e| Error::corrupt(what.to_string(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    fn report(id: u64, generation: u64) -> ShardReport {
        ShardReport {
            id,
            generation,
            size: 7,
        }
    }

    /// Applies `cmds` as one batch at consecutive indexes from `first`.
    fn apply(reg: &Registry, first: u64, cmds: &[Command]) -> Vec<CommandResult> {
        let g = reg.current();
        let mut b = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
        let out = cmds
            .iter()
            .enumerate()
            .map(|(i, c)| b.execute(first + i as u64, c).unwrap())
            .collect();
        g.commit(b.finish().unwrap()).unwrap();
        out
    }

    fn registry() -> (tempfile::TempDir, Registry) {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path(), 1 << 20).unwrap();
        (dir, reg)
    }

    /// Every key and value of the active generation.
    fn contents(reg: &Registry) -> Vec<(Vec<u8>, Vec<u8>)> {
        reg.current()
            .tree
            .iter()
            .map(|kv| {
                let (k, v) = kv.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect()
    }

    /// The writes of `cmds` applied at consecutive indexes from `first` on top of `reg`.
    fn writes_of(reg: &Registry, first: u64, cmds: &[Command]) -> Writes {
        let g = reg.current();
        let mut b = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
        for (i, c) in cmds.iter().enumerate() {
            b.execute(first + i as u64, c).unwrap();
        }
        let leader = openraft::vote::leader_id_adv::LeaderId {
            term: 1,
            node_id: 1,
        };
        b.set_applied(&LogId::new(leader, first));
        b.finish().unwrap()
    }

    #[test]
    fn a_commit_cut_after_any_write_is_whole_after_reopen() {
        let first = [Command::RegisterDatanode {
            id: 1,
            addr: "a".into(),
        }];
        let second = [Command::RegisterShards {
            datanode: 1,
            epoch: 1,
            shards: [3, 64, 200, 1 << 33]
                .iter()
                .map(|&i| report(i, 1))
                .collect(),
        }];
        // Each state as a clean reopen shows it.
        let reopened = |dir: &std::path::Path| contents(&Registry::open(dir, 1 << 20).unwrap());
        let (only_first, both) = {
            let dir = tempfile::tempdir().unwrap();
            let reg = Registry::open(dir.path(), 1 << 20).unwrap();
            reg.current().commit(writes_of(&reg, 1, &first)).unwrap();
            drop(reg);
            let only_first = reopened(dir.path());
            let reg = Registry::open(dir.path(), 1 << 20).unwrap();
            reg.current().commit(writes_of(&reg, 2, &second)).unwrap();
            drop(reg);
            (only_first, reopened(dir.path()))
        };
        assert_ne!(only_first, both);
        let applied = |c: &[(Vec<u8>, Vec<u8>)]| {
            c.iter()
                .find(|(k, _)| k == keys::META_APPLIED)
                .map(|(_, v)| v.clone())
        };
        assert_ne!(applied(&only_first), applied(&both), "last applied moves");
        // A crash before the second commit's redo record: the first commit, whole.
        // A crash after it, with any number of its writes done: the second, whole.
        // Every cut, from none of the second commit's writes done to all of them.
        let mut done = 0;
        loop {
            let dir = tempfile::tempdir().unwrap();
            let total = {
                let reg = Registry::open(dir.path(), 1 << 20).unwrap();
                reg.current().commit(writes_of(&reg, 1, &first)).unwrap();
                let writes = writes_of(&reg, 2, &second);
                let total = writes.len();
                assert!(total > 3, "the test needs a multi-write commit");
                reg.current().commit_interrupted(writes, done).unwrap();
                total
            };
            assert_eq!(reopened(dir.path()), both, "cut after {done} writes");
            if done == total {
                break;
            }
            done += 1;
        }
        let dir = tempfile::tempdir().unwrap();
        {
            let reg = Registry::open(dir.path(), 1 << 20).unwrap();
            reg.current().commit(writes_of(&reg, 1, &first)).unwrap();
        }
        assert_eq!(reopened(dir.path()), only_first);
    }

    #[test]
    fn a_large_commit_is_atomic_and_a_stale_redo_record_is_not_redone_over_it() {
        let dir = tempfile::tempdir().unwrap();
        let shards = |generation: u64| Command::RegisterShards {
            datanode: 1,
            epoch: 1,
            // One shard per bucket: far more than the redo record's limit.
            shards: (0..3000).map(|i| report(i * 64, generation)).collect(),
        };
        let first = [
            Command::RegisterDatanode {
                id: 1,
                addr: "a".into(),
            },
            // Small: through the redo record.
            Command::RegisterShards {
                datanode: 1,
                epoch: 1,
                shards: vec![report(0, 1)],
            },
        ];
        let (want, applied) = {
            let reg = Registry::open(dir.path(), 1 << 20).unwrap();
            reg.current().commit(writes_of(&reg, 1, &first)).unwrap();
            // Large, and it changes the shard the small commit wrote.
            let large = writes_of(&reg, 3, &[shards(2)]);
            let bytes = writes_bytes(&large);
            assert!(bytes > 96 * 1024, "{bytes} bytes");
            reg.current().commit(large).unwrap();
            assert_eq!(reg.shard(0).unwrap().unwrap().replicas[0].generation, 2);
            (reg.content().unwrap(), reg.current().applied().unwrap().0)
        };
        assert_eq!(applied.map(|l| l.index), Some(3));
        let reg = Registry::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            reg.content().unwrap(),
            want,
            "the large commit survives the reopen"
        );
        assert_eq!(reg.current().applied().unwrap().0, applied);
        assert_eq!(reg.current().replica_count().unwrap(), 3000);
    }

    /// The index writes of a batch: (datanode, bucket) -> present after it.
    fn index_writes(w: &Writes) -> Vec<((u64, u64), bool)> {
        w.iter()
            .filter(|(k, _)| k[0] == keys::BY_DATANODE)
            .map(|(k, v)| (keys::two_ids(k).unwrap(), v.is_some()))
            .collect()
    }

    #[test]
    fn the_index_changes_only_with_a_datanodes_first_and_last_replica_in_a_bucket() {
        let (_d, reg) = registry();
        let dn = |id| Command::RegisterDatanode {
            id,
            addr: "a".into(),
        };
        apply(&reg, 1, &[dn(1), dn(2)]);
        let reg_shard = |datanode, epoch, id| Command::RegisterShards {
            datanode,
            epoch,
            shards: vec![report(id, 1)],
        };
        let dereg = |datanode, id| Command::DeregisterShards {
            datanode,
            shards: vec![id],
        };
        let commit = |first, cmds: &[Command]| {
            let w = writes_of(&reg, first, cmds);
            reg.current().commit(w.clone()).unwrap();
            index_writes(&w)
        };
        // Datanode 1's first replica in bucket 0 adds the entry; more in the bucket write none.
        assert_eq!(commit(3, &[reg_shard(1, 1, 1)]), vec![((1, 0), true)]);
        assert_eq!(commit(4, &[reg_shard(1, 1, 2)]), vec![]);
        assert_eq!(commit(5, &[reg_shard(2, 2, 1)]), vec![((2, 0), true)]);
        // A registry written before this layout holds a count there: still an entry.
        reg.current()
            .tree
            .insert(keys::by_datanode(1, 0), codec::encode(&2u64).unwrap())
            .unwrap();
        let listed = |d| -> Vec<u64> {
            let page = reg.datanode_shards(d, None, 10).unwrap();
            page.items.iter().map(|e| e.shard).collect()
        };
        assert_eq!(listed(1), vec![1, 2]);
        // Losing one of two replicas keeps the entry, losing the last drops it; another
        // datanode's replica in the same bucket does not count.
        assert_eq!(commit(6, &[dereg(1, 1)]), vec![]);
        assert_eq!(commit(7, &[dereg(1, 2)]), vec![((1, 0), false)]);
        assert_eq!(listed(1), Vec::<u64>::new());
        assert_eq!(listed(2), vec![1]);
        // Within one batch, gaining and then losing leaves no entry.
        let w = commit(8, &[reg_shard(1, 1, 3), dereg(1, 3)]);
        assert!(w.iter().all(|(_, present)| !present), "{w:?}");
        assert!(reg
            .current()
            .tree
            .get(keys::by_datanode(1, 0))
            .unwrap()
            .is_none());
        // Removing a datanode drops its entries.
        assert_eq!(
            commit(9, &[Command::RemoveDatanode { id: 2 }]),
            vec![((2, 0), false)]
        );
        assert!(reg
            .content()
            .unwrap()
            .keys()
            .all(|k| k[0] == keys::DATANODE));
    }

    #[test]
    fn buckets_hold_scattered_replicas_and_reads_see_them_in_order() {
        let (_d, reg) = registry();
        let ids: Vec<u64> = vec![5, 64, 63, 1 << 40, 1000, 1001, 6400];
        let r = apply(
            &reg,
            1,
            &[
                Command::RegisterDatanode {
                    id: 1,
                    addr: "a".into(),
                },
                Command::RegisterDatanode {
                    id: 2,
                    addr: "b".into(),
                },
                Command::RegisterShards {
                    datanode: 1,
                    epoch: 1,
                    shards: ids.iter().map(|&i| report(i, 1)).collect(),
                },
                // Same call: sees the writes above (read-your-writes within a batch).
                Command::RegisterShards {
                    datanode: 2,
                    epoch: 2,
                    shards: vec![report(5, 1), report(64, 1)],
                },
                Command::RegisterShards {
                    datanode: 1,
                    epoch: 1,
                    shards: vec![report(5, 1), report(64, 0), report(63, 2)],
                },
            ],
        );
        assert_eq!(
            r[4],
            CommandResult::ShardsRegistered {
                accepted: 1,
                unchanged: 1,
                stale: vec![64]
            }
        );
        assert_eq!(reg.current().replica_count().unwrap(), 9);
        let s5 = reg.shard(5).unwrap().unwrap();
        assert_eq!(
            s5.replicas.iter().map(|r| r.datanode).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(reg.shard(63).unwrap().unwrap().replicas[0].generation, 2);
        assert!(reg.shard(62).unwrap().is_none());

        let page = reg.shards(None, 100).unwrap();
        let got: Vec<(u64, u64)> = page.items.iter().map(|e| (e.shard, e.datanode)).collect();
        let mut want: Vec<(u64, u64)> = ids.iter().map(|&i| (i, 1)).collect();
        want.extend([(5, 2), (64, 2)]);
        want.sort();
        assert_eq!(got, want);
        // Page through in twos.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let p = reg.shards(after.as_deref(), 2).unwrap();
            seen.extend(p.items.iter().map(|e| (e.shard, e.datanode)));
            match p.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, want);
        let mine: Vec<u64> = reg
            .datanode_shards(1, None, 100)
            .unwrap()
            .items
            .iter()
            .map(|e| e.shard)
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(mine, sorted);
        let p = reg.datanode_shards(1, None, 3).unwrap();
        let rest = reg.datanode_shards(1, p.next.as_deref(), 100).unwrap();
        assert_eq!(rest.items.len(), ids.len() - 3);
        assert!(rest.next.is_none());

        // Deregister and remove clean up buckets and index entries.
        let r = apply(
            &reg,
            10,
            &[
                Command::DeregisterShards {
                    datanode: 1,
                    shards: vec![5, 5, 999],
                },
                Command::RemoveDatanode { id: 2 },
                Command::RemoveDatanode { id: 2 },
            ],
        );
        assert_eq!(r[0], CommandResult::ShardsDeregistered { removed: 1 });
        assert_eq!(
            r[1],
            CommandResult::DatanodeRemoved {
                existed: true,
                replicas_removed: 2
            }
        );
        assert_eq!(
            r[2],
            CommandResult::DatanodeRemoved {
                existed: false,
                replicas_removed: 0
            }
        );
        assert!(reg.shard(5).unwrap().is_none());
        assert_eq!(reg.datanode(1).unwrap().unwrap().shards, 6);
        assert_eq!(reg.current().replica_count().unwrap(), 6);
        let r = apply(&reg, 20, &[Command::RemoveDatanode { id: 1 }]);
        assert_eq!(
            r[0],
            CommandResult::DatanodeRemoved {
                existed: true,
                replicas_removed: 6
            }
        );
        // Nothing but metadata is left.
        assert!(reg.content().unwrap().is_empty());
        assert!(reg
            .current()
            .tree
            .iter()
            .keys()
            .all(|k| k.unwrap()[0] == b'm'));
    }
}
