//! Tests of the apply batch: atomic commits with their redo record, and recovery from one.

use super::*;
use crate::change_feed::{Change, ChangeEvent};
use crate::registry::Registry;

pub(super) fn report(id: u64, generation: u64) -> ShardReport {
    ShardReport {
        id,
        generation,
        size: 7,
    }
}

pub(super) fn dn(id: u64) -> Command {
    Command::RegisterDatanode {
        id,
        addr: "a:1".into(),
    }
}

/// `RegisterShards` commands of 10,000 shards at most each.
pub(super) fn register(datanode: u64, epoch: u64, ids: &[u64]) -> Vec<Command> {
    ids.chunks(10_000)
        .map(|c| Command::RegisterShards {
            datanode,
            epoch,
            shards: c.iter().map(|&i| report(i, 1)).collect(),
        })
        .collect()
}

/// The epoch a registration answered.
pub(super) fn epoch(r: &CommandResult) -> u64 {
    match r {
        CommandResult::DatanodeRegistered { epoch, .. } => *epoch,
        other => panic!("unexpected {other:?}"),
    }
}

/// Applies `cmds` as one batch at consecutive indexes from `first`.
pub(super) fn apply(reg: &Registry, first: u64, cmds: &[Command]) -> Vec<CommandResult> {
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

pub(super) fn registry() -> (tempfile::TempDir, Registry) {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    (dir, reg)
}

/// Every key and value of the active generation.
pub(super) fn contents(reg: &Registry) -> Vec<(Vec<u8>, Vec<u8>)> {
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
pub(super) fn writes_of(reg: &Registry, first: u64, cmds: &[Command]) -> Writes {
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

/// Datanode 1 registered with a replica of shard 0: a small commit, through the redo record.
fn datanode_with_shard_0() -> [Command; 2] {
    [
        Command::RegisterDatanode {
            id: 1,
            addr: "a".into(),
        },
        Command::RegisterShards {
            datanode: 1,
            epoch: 1,
            shards: vec![report(0, 1)],
        },
    ]
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
    // Small: through the redo record.
    let first = datanode_with_shard_0();
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

#[test]
fn epochs_never_go_back_and_a_restore_raises_them() {
    let (_dir, reg) = registry();
    let epoch = |r: &CommandResult| match r {
        CommandResult::DatanodeRegistered { epoch, .. } => *epoch,
        other => panic!("unexpected {other:?}"),
    };
    let plain = |id| Command::RegisterDatanode {
        id,
        addr: "a:1".into(),
    };
    let at_least = |id, min_epoch| Command::RegisterDatanodeAtLeast {
        id,
        addr: "a:1".into(),
        min_epoch,
    };
    let out = apply(
        &reg,
        5,
        &[
            plain(1),
            at_least(1, 1_000),
            plain(1),
            plain(2),
            at_least(3, 2),
        ],
    );
    let epochs: Vec<u64> = out.iter().map(epoch).collect();
    // The log index; raised by the floor; one above the raised epoch (not back to the index 7);
    // a new datanode's index; a floor below the index changes nothing.
    assert_eq!(epochs, vec![5, 1_000, 1_001, 8, 9]);
}

#[test]
fn each_command_records_what_it_changed_and_nothing_else() {
    let (_dir, reg) = registry();
    let g = reg.current();
    let mut b = ApplyBatch::new(g.tree.clone(), 0);
    let mut run = |index: u64, c: Command| {
        b.execute(index, &c).unwrap();
        b.take_changes()
    };
    let one = |index, change| vec![ChangeEvent { index, change }];
    let register = |epoch, shards: Vec<ShardReport>| Command::RegisterShards {
        datanode: 1,
        epoch,
        shards,
    };
    let dn = Command::RegisterDatanode {
        id: 1,
        addr: "a:1".into(),
    };
    let registered = Change::DatanodeRegistered {
        id: 1,
        addr: "a:1".into(),
        epoch: 1,
    };
    assert_eq!(run(1, dn), one(1, registered));
    let added = |shards: Vec<u64>| Change::ReplicasRegistered {
        datanode: 1,
        shards,
    };
    assert_eq!(
        run(2, register(1, vec![report(5, 1), report(6, 1)])),
        one(2, added(vec![5, 6]))
    );
    // 5 unchanged, 6 stale, 7 new: only 7 changed.
    let mixed = vec![report(5, 1), report(6, 0), report(7, 1)];
    assert_eq!(run(3, register(1, mixed)), one(3, added(vec![7])));
    // A newer generation changes the replica.
    assert_eq!(
        run(4, register(1, vec![report(5, 2)])),
        one(4, added(vec![5]))
    );
    // Identical again, fenced, unknown datanode: nothing.
    assert_eq!(run(5, register(1, vec![report(5, 2)])), vec![]);
    assert_eq!(run(6, register(9, vec![report(8, 1)])), vec![]);
    let unknown = Command::RegisterShards {
        datanode: 2,
        epoch: 1,
        shards: vec![report(8, 1)],
    };
    assert_eq!(run(7, unknown), vec![]);
    let drop_some = Command::DeregisterShards {
        datanode: 1,
        shards: vec![6, 7, 99],
    };
    let removed = Change::ReplicasRemoved {
        datanode: 1,
        shards: vec![6, 7],
    };
    assert_eq!(run(8, drop_some), one(8, removed));
    let none_held = Command::DeregisterShards {
        datanode: 1,
        shards: vec![99],
    };
    assert_eq!(run(9, none_held), vec![]);
    let put = |if_revision| Command::Put {
        key: "k".into(),
        value: b"v".to_vec(),
        if_revision,
    };
    assert_eq!(
        run(10, put(Some(0))),
        one(10, Change::KvPut { key: "k".into() })
    );
    assert_eq!(run(11, put(Some(3))), vec![], "a failed compare-and-swap");
    let delete = |if_revision| Command::Delete {
        key: "k".into(),
        if_revision,
    };
    assert_eq!(run(12, delete(Some(3))), vec![]);
    let deleted = Change::KvDeleted { key: "k".into() };
    assert_eq!(run(13, delete(None)), one(13, deleted));
    assert_eq!(run(14, delete(None)), vec![], "already gone");
    let remove = Command::RemoveDatanode { id: 1 };
    let gone = Change::DatanodeRemoved {
        id: 1,
        replicas_removed: 1,
    };
    assert_eq!(run(15, remove.clone()), one(15, gone));
    assert_eq!(run(16, remove), vec![], "already gone");
}

#[test]
fn a_bucket_that_did_not_change_is_not_written() {
    let (_dir, reg) = registry();
    let dn = Command::RegisterDatanode {
        id: 1,
        addr: "a:1".into(),
    };
    let register = Command::RegisterShards {
        datanode: 1,
        epoch: 1,
        shards: vec![report(5, 1), report(70, 1)],
    };
    apply(&reg, 1, &[dn, register.clone()]);
    let buckets = |w: &Writes| -> usize { w.iter().filter(|(k, _)| k[0] == keys::REPLICA).count() };
    // Looked at, not changed: an identical registration, a prune that finds nothing to drop,
    // a deregistration of a replica it does not hold (in a bucket it has others in).
    let idle = [
        register,
        Command::PruneReplicas {
            datanode: 1,
            epoch: 1,
            from_bucket: 0,
        },
        Command::DeregisterShards {
            datanode: 1,
            shards: vec![6],
        },
    ];
    for cmd in idle {
        let w = writes_of(&reg, 3, std::slice::from_ref(&cmd));
        assert_eq!(buckets(&w), 0, "{cmd}: {w:?}");
    }
    // A change writes its bucket, and only that one.
    let w = writes_of(
        &reg,
        3,
        &[Command::DeregisterShards {
            datanode: 1,
            shards: vec![70],
        }],
    );
    assert_eq!(buckets(&w), 1, "{w:?}");
}

/// A deregistration that names its incarnation is fenced once the datanode registered again:
/// a former incarnation's late delete cannot drop the replica the current one registered. One
/// without an epoch drops it, whichever incarnation asks.
#[test]
fn a_deregistration_of_a_former_incarnation_is_fenced() {
    let (_d, reg) = registry();
    let e1 = epoch(&apply(&reg, 1, &[dn(1)])[0]);
    apply(&reg, 2, &register(1, e1, &[5, 6]));
    let e2 = epoch(&apply(&reg, 3, &[dn(1)])[0]);
    assert!(e2 > e1);
    apply(&reg, 4, &register(1, e2, &[5, 6]));
    let of = |epoch, shard| Command::DeregisterShardsOf {
        datanode: 1,
        epoch,
        shards: vec![shard],
    };
    assert_eq!(
        apply(&reg, 5, &[of(e1, 5)]),
        vec![CommandResult::Fenced { current_epoch: e2 }]
    );
    assert!(reg.shard(5).unwrap().is_some(), "the replica is kept");
    assert_eq!(
        apply(&reg, 6, &[of(e2, 5)]),
        vec![CommandResult::ShardsDeregistered { removed: 1 }]
    );
    assert!(reg.shard(5).unwrap().is_none());
    assert_eq!(reg.datanode(1).unwrap().unwrap().shards, 1);
    let unfenced = Command::DeregisterShards {
        datanode: 1,
        shards: vec![6],
    };
    assert_eq!(
        apply(&reg, 7, &[unfenced]),
        vec![CommandResult::ShardsDeregistered { removed: 1 }]
    );
    assert_eq!(
        apply(
            &reg,
            8,
            &[Command::DeregisterShardsOf {
                datanode: 9,
                epoch: 1,
                shards: vec![1],
            }]
        ),
        vec![CommandResult::UnknownDatanode { id: 9 }]
    );
}

/// A large commit of many writes goes in parts (not one sled batch): cut by a crash before any
/// sled operation of it, a reopen shows the commit before it whole, or it whole, never a mix,
/// and keeps none of its parts.
#[test]
fn a_commit_in_parts_cut_anywhere_is_whole_or_absent_after_reopen() {
    use crate::generation::CUT_PARTED_AT;
    let first = datanode_with_shard_0();
    // One shard per bucket, and the shard the small commit wrote: thousands of writes.
    let large = [Command::RegisterShards {
        datanode: 1,
        epoch: 1,
        shards: (0..3000).map(|i| report(i * 64, 2)).collect(),
    }];
    let reopened = |dir: &std::path::Path| contents(&Registry::open(dir, 1 << 20).unwrap());
    // Commits `first`, then `large` cut before operation `cut` (none: not cut); the number of
    // writes of `large`, and whether the cut came.
    let run = |dir: &std::path::Path, cut: Option<usize>| {
        let reg = Registry::open(dir, 1 << 20).unwrap();
        reg.current().commit(writes_of(&reg, 1, &first)).unwrap();
        let writes = writes_of(&reg, 3, &large);
        let n = writes.len();
        CUT_PARTED_AT.with(|c| c.set(cut));
        let done = reg.current().commit(writes);
        CUT_PARTED_AT.with(|c| c.set(None));
        (n, done.is_err())
    };
    let (only_first, whole, writes) = {
        let a = tempfile::tempdir().unwrap();
        {
            let reg = Registry::open(a.path(), 1 << 20).unwrap();
            reg.current().commit(writes_of(&reg, 1, &first)).unwrap();
        }
        let b = tempfile::tempdir().unwrap();
        let (writes, cut) = run(b.path(), None);
        assert!(!cut);
        (reopened(a.path()), reopened(b.path()), writes)
    };
    assert!(
        writes > 512,
        "{writes} writes: the test needs a parted commit"
    );
    assert_ne!(only_first, whole);
    let has_parts = |c: &[(Vec<u8>, Vec<u8>)]| c.iter().any(|(k, _)| k.starts_with(b"mredo/"));
    assert!(!has_parts(&whole));
    // Before the parts, between them, at the record naming them, among the data writes, at the
    // record of last-applied and among the parts' removals (a few parts: a few operations).
    let (mut absent, mut present, mut past_the_end) = (0, 0, 0);
    for cut in (0..=8).chain([writes / 2]).chain(writes - 2..=writes + 12) {
        let dir = tempfile::tempdir().unwrap();
        let (_, was_cut) = run(dir.path(), Some(cut));
        if !was_cut {
            // Past the commit's last operation.
            past_the_end += 1;
            continue;
        }
        let seen = reopened(dir.path());
        assert!(!has_parts(&seen), "cut before operation {cut}: parts left");
        if seen == only_first {
            absent += 1;
        } else {
            assert!(
                seen == whole,
                "cut before operation {cut}: neither commit whole"
            );
            present += 1;
        }
    }
    assert!(
        absent >= 2 && present >= 10 && past_the_end >= 2,
        "{absent} cuts before, {present} after, {past_the_end} past the end"
    );
}
