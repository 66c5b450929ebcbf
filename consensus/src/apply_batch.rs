//! Executes applied commands against the registry tree, collecting every write in memory
//! (reads see earlier writes of the same batch) so that the whole batch, including
//! last-applied and membership, becomes one atomic sled commit. A batch may span several
//! `apply` calls (see `state_machine.rs`): writes to the same key then cost one sled write.
//!
//! Execution is deterministic: it depends only on the registry state and the entries, so
//! every replica computes the same results, and re-applying after a restart is a no-op
//! because entries at or below the stored last-applied are skipped by the caller.

use std::collections::BTreeMap;

use crate::change_feed::{Change, ChangeEvent};
use crate::cluster_version::{FENCING_REMOVAL, PIECEWISE_REMOVAL, REMOVAL_MARK};
use crate::codec;
use crate::command::{Command, CommandResult, ShardReport};
use crate::error::{Error, Result};
use crate::keys;
use crate::records::{
    find, AppliedRecord, BucketEntry, DatanodeRecord, ReplicaBucket, ReplicaRecord,
};
use crate::types::{LogId, StoredMembership};

/// A prune piece stops once it has looked at this many replicas (of any datanode) in the
/// buckets it walked...
pub(crate) const PRUNE_PIECE_REPLICAS: usize = 4096;
/// ...or walked this many buckets.
pub(crate) const PRUNE_PIECE_BUCKETS: usize = 1024;

/// A pending write: encoded bytes, or a decoded replica bucket kept decoded until the batch
/// is committed, so that many changes to one bucket cost one decode and one encode. A bucket
/// keeps the bytes it was read from: one that encodes to them again is not written (a command
/// that only looked, like a prune that found nothing to drop, costs no write).
enum Pending {
    Raw(Option<Vec<u8>>),
    Replicas {
        bucket: ReplicaBucket,
        stored: Option<sled::IVec>,
    },
}

/// The writes of one batch, in key order: `None` deletes the key.
pub(crate) type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Bytes of keys and values in `writes`.
pub(crate) fn writes_bytes(writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> usize {
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
    /// What the commands executed since the last [`ApplyBatch::take_changes`] changed.
    changes: Vec<ChangeEvent>,
}

impl ApplyBatch {
    /// Tests: a batch without last-applied until [`Self::set_applied`] sets it.
    #[cfg(test)]
    pub(crate) fn new(tree: sled::Tree, replicas: u64) -> Self {
        Self::resuming(tree, replicas, None)
    }

    /// A batch on top of a registry at last-applied `applied`: committed before any entry
    /// executes, it writes `applied` again rather than forget it.
    pub(crate) fn resuming(tree: sled::Tree, replicas: u64, applied: Option<LogId>) -> Self {
        ApplyBatch {
            tree,
            pending: BTreeMap::new(),
            replicas,
            datanodes_delta: 0,
            applied,
            changes: Vec::new(),
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
            Some(Pending::Replicas { .. }) => Err(Error::Raft(format!(
                "{what}: pending value of another kind"
            ))),
        }
    }

    /// Bucket `b` as the batch writes it, if it does.
    pub(crate) fn pending_bucket(&self, b: u64) -> Option<ReplicaBucket> {
        match self.pending.get(&keys::replica_bucket(b)[..]) {
            Some(Pending::Replicas { bucket, .. }) => Some(bucket.clone()),
            Some(Pending::Raw(_)) | None => None,
        }
    }

    /// What the commands executed since the last call changed, in log order (for the change
    /// feed). Commands that changed nothing recorded nothing.
    pub(crate) fn take_changes(&mut self) -> Vec<ChangeEvent> {
        std::mem::take(&mut self.changes)
    }

    fn changed(&mut self, index: u64, change: Change) {
        self.changes.push(ChangeEvent { index, change });
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
            let stored = self.tree_get(&key)?;
            let bucket: ReplicaBucket =
                decode_opt(stored.as_deref(), "replica bucket")?.unwrap_or_default();
            self.pending
                .insert(key.to_vec(), Pending::Replicas { bucket, stored });
        }
        match self.pending.get_mut(&key[..]) {
            Some(Pending::Replicas { bucket, .. }) => Ok(bucket),
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
            Command::RegisterDatanode { id, addr } => self.register_datanode(index, *id, addr, 0),
            Command::RegisterDatanodeAtLeast {
                id,
                addr,
                min_epoch,
            } => self.register_datanode(index, *id, addr, *min_epoch),
            Command::RegisterShards {
                datanode,
                epoch,
                shards,
            } => self.register_shards(index, *datanode, *epoch, shards),
            Command::DeregisterShards { datanode, shards } => {
                self.deregister_shards(index, *datanode, None, shards)
            }
            Command::DeregisterShardsOf {
                datanode,
                epoch,
                shards,
            } => self.deregister_shards(index, *datanode, Some(*epoch), shards),
            Command::RemoveDatanode { id } => self.remove_datanode(index, *id),
            Command::PruneReplicas {
                datanode,
                epoch,
                from_bucket,
            } => self.prune_replicas(index, *datanode, *epoch, *from_bucket),
            Command::Put {
                key,
                value,
                if_revision,
            } => self.put_kv(index, key, value, *if_revision),
            Command::Delete { key, if_revision } => self.delete_kv(index, key, *if_revision),
            Command::SetClusterVersion { version } => self.set_cluster_version(*version),
            Command::RemoveDatanodePiece {
                id,
                registered_index,
            } => self.remove_datanode_piece(index, *id, *registered_index),
            Command::RaiseEpochFloor { at_least } => self.raise_epoch_floor(*at_least),
            Command::ClaimForRestore { at_least } => self.claim_for_restore(*at_least),
            Command::BeginRestore { at_least, origin } => {
                self.begin_restore(index, *at_least, origin)
            }
            Command::EndRestore => self.end_restore(),
            Command::RestorePut { key, value } => self.restore_put(index, key, value),
            Command::BeginRestoreHoldingKeys { at_least, origin } => {
                let claimed = self.begin_restore(index, *at_least, origin)?;
                if let CommandResult::EpochFloor { .. } = claimed {
                    self.put(keys::RESTORE_KEYS_HELD, &index)?;
                }
                Ok(claimed)
            }
        }
    }

    /// A datanode's new epoch is the command's log index, or more: one above its current epoch
    /// (epochs never go back while it stays registered, also after a restore raised them), one
    /// above the epoch it had when it was last removed, if that was kept (its epoch floor, kept
    /// since cluster version 3), at least the cluster's epoch floor (since version 4), and at
    /// least `min_epoch`. Fencing compares epochs for equality, so a zombie of a removed
    /// incarnation, or of the cluster a restore replaced, whose epoch a floor or `min_epoch`
    /// raised above the log index stays fenced; liveness orders incarnations by
    /// `registered_index`. While a restore runs, only its own registrations (with a `min_epoch`
    /// of at least its floor) are taken.
    fn register_datanode(
        &mut self,
        index: u64,
        id: u64,
        addr: &str,
        min_epoch: u64,
    ) -> Result<CommandResult> {
        if let Some(refused) = self.refused_while_restoring(min_epoch)? {
            return Ok(refused);
        }
        let key = keys::datanode(id);
        let (shards, epoch) = match self.get::<DatanodeRecord>(&key, "datanode")? {
            Some(r) => {
                // Registered again while it was being removed: it stays, unmarked (the
                // removal's next piece finds another incarnation and ends).
                let mark = keys::epoch_floor(id);
                if self.get::<u64>(&mark, "removal mark")?.is_some() {
                    self.remove(&mark);
                }
                (r.shards, index.max(r.epoch.saturating_add(1)))
            }
            None => {
                self.datanodes_delta += 1;
                let floor_key = keys::epoch_floor(id);
                let floor = self.get::<u64>(&floor_key, "epoch floor")?;
                if floor.is_some() {
                    // The record's epoch is above it from now on, and is kept at the next removal.
                    self.remove(&floor_key);
                }
                (0, index.max(floor.map_or(0, |f| f.saturating_add(1))))
            }
        };
        let epoch = epoch.max(min_epoch).max(self.cluster_epoch_floor()?);
        let rec = DatanodeRecord {
            addr: addr.to_string(),
            epoch,
            registered_index: index,
            shards,
        };
        self.put(&key, &rec)?;
        self.changed(
            index,
            Change::DatanodeRegistered {
                id,
                addr: addr.to_string(),
                epoch,
            },
        );
        Ok(CommandResult::DatanodeRegistered { id, epoch })
    }

    /// The record of `datanode` if `epoch` is its current incarnation, else the result that
    /// refuses the command (unknown datanode, fenced, or being removed: whatever the epoch).
    fn current_incarnation(
        &self,
        datanode: u64,
        epoch: u64,
    ) -> Result<std::result::Result<DatanodeRecord, CommandResult>> {
        let Some(dn) = self.get::<DatanodeRecord>(&keys::datanode(datanode), "datanode")? else {
            return Ok(Err(CommandResult::UnknownDatanode { id: datanode }));
        };
        let mark = self.get::<u64>(&keys::epoch_floor(datanode), "removal mark")?;
        Ok(if crate::records::being_removed(&dn, mark) {
            Err(CommandResult::FencedForRemoval {
                current_epoch: dn.epoch,
            })
        } else if dn.epoch != epoch {
            Err(CommandResult::Fenced {
                current_epoch: dn.epoch,
            })
        } else {
            Ok(dn)
        })
    }

    fn register_shards(
        &mut self,
        index: u64,
        datanode: u64,
        epoch: u64,
        shards: &[ShardReport],
    ) -> Result<CommandResult> {
        let dkey = keys::datanode(datanode);
        let mut dn = match self.current_incarnation(datanode, epoch)? {
            Ok(dn) => dn,
            Err(refused) => return Ok(refused),
        };
        let (mut accepted, mut unchanged, mut stale) = (0u64, 0u64, Vec::new());
        let mut changed = Vec::new();
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
                Ok(i) if same_content(&bucket[i].replica, &new) => {
                    // At most the incarnation differs: kept for a prune, invisible to readers
                    // and watchers, so a restart storm of unchanged replicas changes nothing.
                    bucket[i].replica.epoch = epoch;
                    unchanged += 1;
                }
                Ok(i) => {
                    bucket[i].replica = new;
                    accepted += 1;
                    changed.push(s.id);
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
                    changed.push(s.id);
                }
            }
        }
        if accepted > 0 {
            self.put(&dkey, &dn)?;
            let shards = changed;
            self.changed(index, Change::ReplicasRegistered { datanode, shards });
        }
        Ok(CommandResult::ShardsRegistered {
            accepted,
            unchanged,
            stale,
        })
    }

    /// Drops `datanode`'s replicas of `shards`; with `epoch`, only for that incarnation (else
    /// `Fenced`).
    fn deregister_shards(
        &mut self,
        index: u64,
        datanode: u64,
        epoch: Option<u64>,
        shards: &[u64],
    ) -> Result<CommandResult> {
        let dn = match epoch {
            Some(epoch) => match self.current_incarnation(datanode, epoch)? {
                Ok(dn) => dn,
                Err(refused) => return Ok(refused),
            },
            None => {
                if let Some(refused) = self.refused_while_restoring(0)? {
                    return Ok(refused);
                }
                match self.get::<DatanodeRecord>(&keys::datanode(datanode), "datanode")? {
                    Some(dn) => dn,
                    None => return Ok(CommandResult::UnknownDatanode { id: datanode }),
                }
            }
        };
        let mut gone = Vec::new();
        for &shard in shards {
            let b = keys::bucket_of(shard);
            let bucket = self.bucket(b)?;
            if let Ok(i) = find(bucket, shard, datanode) {
                bucket.remove(i);
                self.index(datanode, b, true)?;
                gone.push(shard);
            }
        }
        let removed = self.replicas_dropped(index, datanode, dn, gone)?;
        Ok(CommandResult::ShardsDeregistered { removed })
    }

    /// Accounts for the replicas of `datanode` (record `dn`) that a command dropped from their
    /// buckets (`gone`, by shard id): its count, the total and the change. Returns how many.
    fn replicas_dropped(
        &mut self,
        index: u64,
        datanode: u64,
        mut dn: DatanodeRecord,
        gone: Vec<u64>,
    ) -> Result<u64> {
        let removed = gone.len() as u64;
        if removed > 0 {
            dn.shards = dn.shards.saturating_sub(removed);
            self.replicas = self.replicas.saturating_sub(removed);
            self.put(&keys::datanode(datanode), &dn)?;
            let shards = gone;
            self.changed(index, Change::ReplicasRemoved { datanode, shards });
        }
        Ok(removed)
    }

    /// Drops the replicas of `datanode` registered before incarnation `epoch` (every replica
    /// a batch of that incarnation registered or re-registered carries `epoch`), in its buckets
    /// from `from` on, until the piece has looked at [`PRUNE_PIECE_REPLICAS`] replicas or
    /// [`PRUNE_PIECE_BUCKETS`] buckets: about the work of one storm batch, so that a prune
    /// never holds up the entries behind it for longer than a batch does.
    fn prune_replicas(
        &mut self,
        index: u64,
        datanode: u64,
        epoch: u64,
        from: u64,
    ) -> Result<CommandResult> {
        let dn = match self.current_incarnation(datanode, epoch)? {
            Ok(dn) => dn,
            Err(refused) => return Ok(refused),
        };
        let (gone, next) = self.drop_in_piece(datanode, from, Some(epoch))?;
        let removed = self.replicas_dropped(index, datanode, dn, gone)?;
        Ok(CommandResult::Pruned { removed, next })
    }

    /// One piece's walk: drops the replicas of `datanode` registered by an incarnation below
    /// `epoch_below` (a prune), or all of them (`None`: a removal), in its buckets from `from` on,
    /// until it has looked at [`PRUNE_PIECE_REPLICAS`] replicas (of any datanode) or walked
    /// [`PRUNE_PIECE_BUCKETS`] buckets. Returns the shards whose replica it dropped and the bucket
    /// the next piece starts from (`None`: it walked them all).
    fn drop_in_piece(
        &mut self,
        datanode: u64,
        from: u64,
        epoch_below: Option<u64>,
    ) -> Result<(Vec<u64>, Option<u64>)> {
        let (buckets, mut next) = self.buckets_from(datanode, from, PRUNE_PIECE_BUCKETS)?;
        let mut gone = Vec::new();
        let mut looked = 0;
        for b in buckets {
            if looked >= PRUNE_PIECE_REPLICAS {
                next = Some(b);
                break;
            }
            let bucket = self.bucket(b)?;
            looked += bucket.len();
            let before = gone.len();
            bucket.retain(|e| {
                let drop = e.datanode == datanode
                    && epoch_below.is_none_or(|below| e.replica.epoch < below);
                if drop {
                    gone.push(e.shard);
                }
                !drop
            });
            // A removal clears the bucket's index entry even where it dropped nothing (an entry
            // out of step), so that no entry outlives the datanode; a prune writes it only where
            // it dropped something, as builds before removals in pieces did.
            if gone.len() > before || epoch_below.is_none() {
                self.index(datanode, b, true)?;
            }
        }
        Ok((gone, next))
    }

    /// Up to `limit` buckets holding replicas of `datanode`, from bucket `from` on, in order
    /// (the tree merged with pending writes), and the bucket to go on from if there may be more
    /// (`usize::MAX`: all of them).
    fn buckets_from(
        &self,
        datanode: u64,
        from: u64,
        limit: usize,
    ) -> Result<(Vec<u64>, Option<u64>)> {
        let start = keys::by_datanode(datanode, from);
        let end = keys::successor(&keys::by_datanode(datanode, u64::MAX));
        let mut set = std::collections::BTreeSet::new();
        let mut bound = None;
        for item in self.tree.range(start.to_vec()..end.clone()) {
            let (k, _) = item.map_err(|e| Error::registry("scan during apply", e))?;
            let Some((_, b)) = keys::two_ids(&k) else {
                continue;
            };
            // The bound must come from the merged view, as every replica sees it whether or
            // not it committed the batch's writes yet: a bucket the batch took away counts not.
            if matches!(self.pending.get(&k[..]), Some(Pending::Raw(None))) {
                continue;
            }
            if set.len() == limit {
                bound = Some(b);
                break;
            }
            set.insert(b);
        }
        // Pending writes below the bound: buckets the batch gave the datanode, or took away.
        for (k, v) in self.pending.range(start.to_vec()..end) {
            let Some((_, b)) = keys::two_ids(k) else {
                continue;
            };
            if bound.is_some_and(|bound| b >= bound) {
                break;
            }
            match v {
                Pending::Raw(None) => set.remove(&b),
                _ => set.insert(b),
            };
        }
        let mut buckets: Vec<u64> = set.into_iter().collect();
        if buckets.len() > limit {
            bound = Some(buckets[limit]);
            buckets.truncate(limit);
        }
        Ok((buckets, bound))
    }

    /// Removes a datanode and every replica it holds in one entry, however many (the removal
    /// of a cluster whose version is below 3). In a cluster of version 3 or more (a raise may commit
    /// between the leader's choice and this entry) its epoch is kept as a floor, as
    /// [`ApplyBatch::remove_datanode_piece`] keeps it.
    fn remove_datanode(&mut self, index: u64, id: u64) -> Result<CommandResult> {
        let Some(dn) = self.get::<DatanodeRecord>(&keys::datanode(id), "datanode")? else {
            return Ok(CommandResult::DatanodeRemoved {
                existed: false,
                replicas_removed: 0,
            });
        };
        let mut n = 0u64;
        let (buckets, _) = self.buckets_from(id, 0, usize::MAX)?;
        for b in buckets {
            let bucket = self.bucket(b)?;
            let before = bucket.len();
            bucket.retain(|e| e.datanode != id);
            n += (before - bucket.len()) as u64;
            self.remove(&keys::by_datanode(id, b));
        }
        self.replicas = self.replicas.saturating_sub(n);
        let keep_floor = self.cluster_version()? >= PIECEWISE_REMOVAL;
        self.drop_datanode(index, id, dn.epoch, n, keep_floor)?;
        Ok(CommandResult::DatanodeRemoved {
            existed: true,
            replicas_removed: n,
        })
    }

    /// One piece of a removal: drops the replicas of datanode `id` in its first buckets, until
    /// the piece has looked at [`PRUNE_PIECE_REPLICAS`] replicas or [`PRUNE_PIECE_BUCKETS`]
    /// buckets (the bound of a prune's piece). When it leaves the datanode none (also one that a
    /// registration gave replicas since the removal began: the pieces start from its first
    /// bucket every time), it drops the record too and keeps its epoch as the id's epoch floor.
    /// A piece for the incarnation registered at `incarnation` finds the datanode registered
    /// again is refused (`Fenced`), and changes nothing.
    ///
    /// From cluster version 4 (decided by the applied version, so every member writes the same),
    /// a first piece that leaves the datanode replicas also raises its epoch by one: the
    /// incarnation's batches, prunes and heartbeats are fenced from then on, as they are once it
    /// is gone, so a live datanode registering replicas cannot keep its removal going (a piece
    /// drops at most 4,096 replicas, a batch adds up to 10,000). A datanode told so registers
    /// again, and the removal's next piece ends it with `Fenced`, as for any registration.
    /// From version 7 that first piece also keeps the raised epoch under the id's epoch floor
    /// key (the record stays): the datanode is being removed, and the raised epoch, which no
    /// registration gave, is fenced too (`records::being_removed`). The piece that drops the
    /// record keeps the floor there, as any removal does.
    fn remove_datanode_piece(
        &mut self,
        index: u64,
        id: u64,
        incarnation: Option<u64>,
    ) -> Result<CommandResult> {
        let Some(dn) = self.get::<DatanodeRecord>(&keys::datanode(id), "datanode")? else {
            return Ok(CommandResult::UnknownDatanode { id });
        };
        if incarnation.is_some_and(|i| i != dn.registered_index) {
            return Ok(CommandResult::Fenced {
                current_epoch: dn.epoch,
            });
        }
        let registered_index = dn.registered_index;
        let (gone, more) = self.drop_in_piece(id, 0, None)?;
        if more.is_some() {
            let mut dn = dn;
            if incarnation.is_none() && self.cluster_version()? >= FENCING_REMOVAL {
                dn.epoch = dn.epoch.saturating_add(1);
                self.put(&keys::datanode(id), &dn)?;
                if self.cluster_version()? >= REMOVAL_MARK {
                    self.put(&keys::epoch_floor(id), &dn.epoch)?;
                }
            }
            let removed = self.replicas_dropped(index, id, dn, gone)?;
            return Ok(CommandResult::RemovalPiece {
                removed,
                gone: false,
                registered_index,
            });
        }
        let removed = gone.len() as u64;
        self.replicas = self.replicas.saturating_sub(removed);
        self.drop_datanode(index, id, dn.epoch, removed, true)?;
        Ok(CommandResult::RemovalPiece {
            removed,
            gone: true,
            registered_index,
        })
    }

    /// Drops the record of datanode `id` (whose epoch was `epoch`; `replicas_removed` went with
    /// it in the same entry), keeping its epoch as the id's floor if `keep_floor`.
    fn drop_datanode(
        &mut self,
        index: u64,
        id: u64,
        epoch: u64,
        replicas_removed: u64,
        keep_floor: bool,
    ) -> Result<()> {
        self.remove(&keys::datanode(id));
        if keep_floor {
            self.put(&keys::epoch_floor(id), &epoch)?;
        }
        self.datanodes_delta -= 1;
        self.changed(
            index,
            Change::DatanodeRemoved {
                id,
                replicas_removed,
            },
        );
        Ok(())
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
                Pending::Replicas { bucket, stored } => {
                    let value = match bucket.is_empty() {
                        true => None,
                        false => Some(codec::encode(&bucket).map_err(enc)?),
                    };
                    if value.as_deref() == stored.as_deref() {
                        continue;
                    }
                    value
                }
            };
            writes.push((k, value));
        }
        Ok(writes)
    }
}

/// Whether two records of a replica say the same to a reader (generation and size).
fn same_content(a: &ReplicaRecord, b: &ReplicaRecord) -> bool {
    (a.generation, a.size) == (b.generation, b.size)
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

mod kv;
mod settings;

#[cfg(test)]
mod epoch_floor_tests;
#[cfg(test)]
mod prune_tests;
#[cfg(test)]
mod removal_tests;
#[cfg(test)]
mod tests;
