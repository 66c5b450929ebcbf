//! Tests of full reports: a prune drops what the current incarnation did not report, in
//! pieces of bounded work that every replica cuts the same way.

use super::tests::{apply, contents, dn, register, registry, report};
use super::*;
use crate::change_feed::{Change, ChangeEvent};
use crate::registry::Registry;

#[test]
fn a_prune_drops_only_what_the_current_incarnation_has_not_registered() {
    let (_dir, reg) = registry();
    let dn = |id| Command::RegisterDatanode {
        id,
        addr: "a:1".into(),
    };
    let register = |datanode, epoch, ids: &[u64]| Command::RegisterShards {
        datanode,
        epoch,
        shards: ids.iter().map(|&i| report(i, 1)).collect(),
    };
    let prune = |datanode, epoch| Command::PruneReplicas {
        datanode,
        epoch,
        from_bucket: 0,
    };
    // Datanode 1 (epoch 1) holds 5, 6 and 70 (bucket 1); datanode 2 (epoch 2) holds 5 and 6.
    apply(
        &reg,
        1,
        &[
            dn(1),
            dn(2),
            register(1, 1, &[5, 6, 70]),
            register(2, 2, &[5, 6]),
        ],
    );
    // Datanode 1 restarts (epoch 10) and reports 5 only.
    let r = apply(
        &reg,
        10,
        &[
            dn(1),
            prune(1, 1),
            register(1, 10, &[5]),
            prune(1, 10),
            prune(1, 10),
            prune(3, 1),
        ],
    );
    assert_eq!(r[1], CommandResult::Fenced { current_epoch: 10 });
    assert_eq!(
        r[2],
        CommandResult::ShardsRegistered {
            accepted: 0,
            unchanged: 1,
            stale: vec![]
        },
        "a replica reported again under a new epoch is unchanged to readers"
    );
    assert_eq!(
        r[3],
        CommandResult::Pruned {
            removed: 2,
            next: None
        }
    );
    assert_eq!(
        r[4],
        CommandResult::Pruned {
            removed: 0,
            next: None
        }
    );
    assert_eq!(r[5], CommandResult::UnknownDatanode { id: 3 });

    let holders = |shard| -> Vec<u64> {
        reg.shard(shard)
            .unwrap()
            .map(|s| s.replicas.iter().map(|r| r.datanode).collect())
            .unwrap_or_default()
    };
    assert_eq!(holders(5), vec![1, 2]);
    assert_eq!(holders(6), vec![2], "the other datanode's replica stays");
    assert!(holders(70).is_empty());
    assert_eq!(reg.datanode(1).unwrap().unwrap().shards, 1);
    assert_eq!(reg.datanode(2).unwrap().unwrap().shards, 2);
    assert_eq!(reg.current().replica_count().unwrap(), 3);
    // The index forgets bucket 1 for datanode 1, keeps bucket 0.
    let indexed: Vec<(u64, u64)> = reg
        .current()
        .tree
        .scan_prefix([keys::BY_DATANODE])
        .keys()
        .map(|k| keys::two_ids(&k.unwrap()).unwrap())
        .collect();
    assert_eq!(indexed, vec![(1, 0), (2, 0)]);
    let mine: Vec<u64> = reg
        .datanode_shards(1, None, 100)
        .unwrap()
        .items
        .iter()
        .map(|e| e.shard)
        .collect();
    assert_eq!(mine, vec![5]);
}

#[test]
fn a_prune_records_the_replicas_it_dropped() {
    let (_dir, reg) = registry();
    let g = reg.current();
    let mut b = ApplyBatch::new(g.tree.clone(), 0);
    let mut run = |index: u64, c: Command| {
        b.execute(index, &c).unwrap();
        b.take_changes()
    };
    let dn = || Command::RegisterDatanode {
        id: 1,
        addr: "a:1".into(),
    };
    run(1, dn());
    run(
        2,
        Command::RegisterShards {
            datanode: 1,
            epoch: 1,
            shards: vec![report(200, 1), report(3, 1), report(100, 1)],
        },
    );
    run(3, dn());
    // Reported again by the new incarnation, unchanged: no event, and the prune keeps it.
    let again = Command::RegisterShards {
        datanode: 1,
        epoch: 3,
        shards: vec![report(100, 1)],
    };
    assert_eq!(run(4, again), vec![]);
    let prune = Command::PruneReplicas {
        datanode: 1,
        epoch: 3,
        from_bucket: 0,
    };
    let removed = Change::ReplicasRemoved {
        datanode: 1,
        shards: vec![3, 200],
    };
    assert_eq!(
        run(5, prune.clone()),
        vec![ChangeEvent {
            index: 5,
            change: removed
        }]
    );
    assert_eq!(run(6, prune), vec![], "nothing left to drop");
    let fenced = Command::PruneReplicas {
        datanode: 1,
        epoch: 1,
        from_bucket: 0,
    };
    assert_eq!(run(7, fenced), vec![]);
}

/// Prunes `datanode` piece by piece at consecutive indexes from `first`, as the API does;
/// returns each piece's result.
fn prune_in_pieces(reg: &Registry, first: u64, datanode: u64, epoch: u64) -> Vec<CommandResult> {
    let mut out = Vec::new();
    let mut from_bucket = 0;
    loop {
        let cmd = Command::PruneReplicas {
            datanode,
            epoch,
            from_bucket,
        };
        let r = apply(reg, first + out.len() as u64, &[cmd]).remove(0);
        out.push(r.clone());
        match r {
            CommandResult::Pruned {
                next: Some(next), ..
            } => {
                assert!(next > from_bucket, "a piece makes progress");
                from_bucket = next;
            }
            _ => return out,
        }
    }
}

#[test]
fn a_large_prune_goes_in_pieces_of_bounded_work() {
    let (_dir, reg) = registry();
    // Datanode 1: 10,000 shards in full buckets. Datanode 2: 2,500 shards, one per bucket.
    let dense: Vec<u64> = (0..10_000).collect();
    let scattered: Vec<u64> = (0..2_500).map(|b| 100_000 + b * 64).collect();
    let mut cmds = vec![dn(1), dn(2)];
    cmds.extend(register(1, 1, &dense));
    cmds.extend(register(2, 2, &scattered));
    apply(&reg, 1, &cmds);
    // Both come back (epochs 10 and 11) having lost every hundredth shard.
    let kept = |ids: &[u64]| -> Vec<u64> {
        ids.iter()
            .enumerate()
            .filter(|(k, _)| k % 100 != 99)
            .map(|(_, &id)| id)
            .collect()
    };
    let mut cmds = vec![dn(1), dn(2)];
    cmds.extend(register(1, 10, &kept(&dense)));
    cmds.extend(register(2, 11, &kept(&scattered)));
    apply(&reg, 10, &cmds);

    let dense_pieces = prune_in_pieces(&reg, 100, 1, 10);
    let scattered_pieces = prune_in_pieces(&reg, 200, 2, 11);
    let total = |pieces: &[CommandResult]| -> u64 {
        pieces
            .iter()
            .map(|r| match r {
                CommandResult::Pruned { removed, .. } => *removed,
                other => panic!("unexpected {other:?}"),
            })
            .sum()
    };
    // 157 buckets of 64 replicas: 64 buckets (4,096 replicas) per piece.
    assert_eq!(dense_pieces.len(), 3, "{dense_pieces:?}");
    assert_eq!(total(&dense_pieces), 100);
    // 2,500 buckets of one replica: 1,024 buckets per piece.
    assert_eq!(scattered_pieces.len(), 3, "{scattered_pieces:?}");
    assert_eq!(total(&scattered_pieces), 25);

    assert_eq!(reg.datanode(1).unwrap().unwrap().shards, 9_900);
    assert_eq!(reg.datanode(2).unwrap().unwrap().shards, 2_475);
    assert_eq!(reg.current().replica_count().unwrap(), 9_900 + 2_475);
    let held: Vec<u64> = reg
        .datanode_shards(2, None, 10_000)
        .unwrap()
        .items
        .iter()
        .map(|e| e.shard)
        .collect();
    assert_eq!(held, kept(&scattered));
    // Done: a prune again finds nothing, in the same pieces.
    let again = prune_in_pieces(&reg, 300, 1, 10);
    assert_eq!((again.len(), total(&again)), (3, 0));
}

#[test]
fn prune_pieces_see_the_batchs_own_writes() {
    let (_dir, reg) = registry();
    let dn = Command::RegisterDatanode {
        id: 1,
        addr: "a:1".into(),
    };
    // 1,100 replicas, one in each even bucket.
    let old: Vec<u64> = (0..1_100).map(|i| i * 128).collect();
    let register = |epoch, ids: &[u64]| Command::RegisterShards {
        datanode: 1,
        epoch,
        shards: ids.iter().map(|&i| report(i, 1)).collect(),
    };
    apply(&reg, 1, &[dn.clone(), register(1, &old)]);

    // In one batch: a new incarnation (epoch 10) registers replicas in 21 odd buckets, one old
    // replica is deregistered, and the prune runs piece by piece over the pending writes.
    let g = reg.current();
    let mut b = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
    b.execute(10, &dn).unwrap();
    let new: Vec<u64> = (0..21).map(|i| 64 + i * 128).collect();
    b.execute(11, &register(10, &new)).unwrap();
    let deregister = Command::DeregisterShards {
        datanode: 1,
        shards: vec![0],
    };
    b.execute(12, &deregister).unwrap();
    b.take_changes();
    let (mut from_bucket, mut pieces, mut index) = (0, 0, 13);
    let mut dropped = Vec::new();
    loop {
        let cmd = Command::PruneReplicas {
            datanode: 1,
            epoch: 10,
            from_bucket,
        };
        let r = b.execute(index, &cmd).unwrap();
        index += 1;
        pieces += 1;
        for c in b.take_changes() {
            if let Change::ReplicasRemoved { shards, .. } = c.change {
                dropped.extend(shards);
            }
        }
        match r {
            CommandResult::Pruned {
                next: Some(next), ..
            } => from_bucket = next,
            CommandResult::Pruned { next: None, .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    g.commit(b.finish().unwrap()).unwrap();
    assert_eq!(pieces, 2);
    assert_eq!(
        dropped,
        old[1..].to_vec(),
        "every old replica but the deregistered one"
    );
    let held: Vec<u64> = reg
        .datanode_shards(1, None, 10_000)
        .unwrap()
        .items
        .iter()
        .map(|e| e.shard)
        .collect();
    assert_eq!(held, new);
    assert_eq!(reg.datanode(1).unwrap().unwrap().shards, 21);
    assert_eq!(reg.current().replica_count().unwrap(), 21);
}

/// A piece covers the same buckets whether the batch's earlier writes are still pending or
/// already committed (they are on one member and not on another), so every member drops the
/// same replicas.
#[test]
fn a_piece_is_the_same_with_the_batchs_writes_pending_or_committed() {
    let dn = Command::RegisterDatanode {
        id: 1,
        addr: "a:1".into(),
    };
    let old = Command::RegisterShards {
        datanode: 1,
        epoch: 1,
        shards: (0..1_100).map(|b| report(b * 64, 1)).collect(),
    };
    let deregister = Command::DeregisterShards {
        datanode: 1,
        shards: (0..50).map(|b| b * 64).collect(),
    };
    let piece = |from_bucket| Command::PruneReplicas {
        datanode: 1,
        epoch: 10,
        from_bucket,
    };
    // Member A committed the deregistration before the piece; member B applies them together.
    let (_da, a) = registry();
    apply(&a, 1, &[dn.clone(), old.clone()]);
    apply(&a, 10, &[dn.clone(), deregister.clone()]);
    let ra = apply(&a, 12, &[piece(0)]).remove(0);
    let (_db, b) = registry();
    apply(&b, 1, &[dn.clone(), old]);
    let rb = apply(&b, 10, &[dn, deregister, piece(0)]).remove(2);
    assert_eq!(ra, rb, "the first piece differs");
    let CommandResult::Pruned {
        next: Some(next), ..
    } = ra
    else {
        panic!("{ra:?}");
    };
    assert_eq!(apply(&a, 13, &[piece(next)]), apply(&b, 13, &[piece(next)]));
    assert_eq!(a.datanode(1).unwrap().unwrap().shards, 0);
    assert_eq!(contents(&a), contents(&b));
}
