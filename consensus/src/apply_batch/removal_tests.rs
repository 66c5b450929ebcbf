//! Tests of a removal in pieces (`RemoveDatanodePiece`) and of the epoch floor it keeps.

use super::tests::{apply, contents, dn, epoch, register, registry};
use super::*;
use crate::registry::Registry;

fn piece(id: u64, registered_index: Option<u64>) -> Command {
    Command::RemoveDatanodePiece {
        id,
        registered_index,
    }
}

/// Removes `id` piece by piece at consecutive indexes from `first`, as the API does (each piece
/// after the first names the incarnation the first found; `incarnation`: go on with a removal
/// of that one); returns each piece's result.
fn remove_in_pieces(
    reg: &Registry,
    first: u64,
    id: u64,
    mut incarnation: Option<u64>,
) -> Vec<CommandResult> {
    let mut out = Vec::new();
    loop {
        let r = apply(reg, first + out.len() as u64, &[piece(id, incarnation)]).remove(0);
        out.push(r.clone());
        let CommandResult::RemovalPiece {
            gone: false,
            registered_index,
            ..
        } = r
        else {
            return out;
        };
        assert!(incarnation.is_none_or(|i| i == registered_index));
        incarnation = Some(registered_index);
        assert!(out.len() < 1_000, "a removal makes progress");
    }
}

/// Registers datanode 1 (entry 1, so epoch 1) with replicas of `shards`.
fn register_datanode_1(reg: &Registry, shards: &[u64]) {
    let mut cmds = vec![dn(1)];
    cmds.extend(register(1, 1, shards));
    apply(reg, 1, &cmds);
}

fn removed(pieces: &[CommandResult]) -> u64 {
    pieces
        .iter()
        .map(|r| match r {
            CommandResult::RemovalPiece { removed, .. } => *removed,
            other => panic!("unexpected {other:?}"),
        })
        .sum()
}

/// Whether any key of the tree names datanode `id`: its record, an index entry, a replica.
fn anything_of(reg: &Registry, id: u64) -> bool {
    contents(reg).iter().any(|(k, v)| match k[0] {
        keys::DATANODE | keys::BY_DATANODE => keys::one_id(&k[..9]) == Some(id),
        keys::REPLICA => codec::decode::<ReplicaBucket>(v)
            .unwrap()
            .iter()
            .any(|e| e.datanode == id),
        _ => false,
    })
}

#[test]
fn a_large_removal_goes_in_pieces_of_bounded_work_and_drops_the_record_last() {
    let (_dir, reg) = registry();
    // Datanode 1: 10,000 shards in full buckets. Datanode 2: 2,500 shards, one per bucket.
    // Datanode 3 holds a replica of every shard of datanode 1.
    let dense: Vec<u64> = (0..10_000).collect();
    let scattered: Vec<u64> = (0..2_500).map(|b| 100_000 + b * 64).collect();
    let mut cmds = vec![dn(1), dn(2), dn(3)];
    cmds.extend(register(1, 1, &dense));
    cmds.extend(register(2, 2, &scattered));
    cmds.extend(register(3, 3, &dense));
    apply(&reg, 1, &cmds);

    let pieces = remove_in_pieces(&reg, 100, 1, None);
    // 157 buckets of 64 replicas of datanode 1 (and 64 of datanode 3): 32 buckets (4,096
    // replicas looked at) per piece.
    assert_eq!(pieces.len(), 5, "{pieces:?}");
    assert_eq!(removed(&pieces), 10_000);
    let scattered_pieces = remove_in_pieces(&reg, 200, 2, None);
    // 2,500 buckets of one replica: 1,024 buckets per piece.
    assert_eq!(scattered_pieces.len(), 3, "{scattered_pieces:?}");
    assert_eq!(removed(&scattered_pieces), 2_500);
    // Only the last piece of each dropped the record.
    for p in [&pieces, &scattered_pieces] {
        let gone: Vec<bool> = p
            .iter()
            .map(|r| matches!(r, CommandResult::RemovalPiece { gone: true, .. }))
            .collect();
        assert_eq!(gone.iter().filter(|g| **g).count(), 1);
        assert!(gone[gone.len() - 1]);
    }

    assert!(reg.datanode(1).unwrap().is_none());
    assert!(reg.datanode(2).unwrap().is_none());
    assert!(!anything_of(&reg, 1) && !anything_of(&reg, 2));
    assert_eq!(reg.datanode(3).unwrap().unwrap().shards, 10_000);
    assert_eq!(reg.current().replica_count().unwrap(), 10_000);
    assert_eq!(
        reg.shard(5).unwrap().unwrap().replicas.len(),
        1,
        "datanode 3's replica stays"
    );
    // Gone: a piece finds no datanode.
    assert_eq!(
        remove_in_pieces(&reg, 300, 1, None),
        vec![CommandResult::UnknownDatanode { id: 1 }]
    );
}

#[test]
fn replicas_registered_while_a_removal_runs_go_with_the_datanode() {
    let (_dir, reg) = registry();
    let all: Vec<u64> = (0..10_000).collect();
    register_datanode_1(&reg, &all);
    // The first piece empties the first buckets; then the datanode registers shards there
    // again, and in a bucket far past its others.
    let first = apply(&reg, 10, &[piece(1, None)]);
    assert_eq!(
        first,
        vec![CommandResult::RemovalPiece {
            removed: 4_096,
            gone: false,
            registered_index: 1,
        }]
    );
    // Registered by the same incarnation: the removal goes on.
    apply(&reg, 11, &register(1, 1, &[0, 1, 2, 1_000_000]));
    let rest = remove_in_pieces(&reg, 12, 1, Some(1));
    assert_eq!(removed(&rest), 10_000 - 4_096 + 4);
    assert!(!anything_of(&reg, 1), "no replica outlives its datanode");
    assert_eq!(reg.current().replica_count().unwrap(), 0);
}

#[test]
fn from_version_4_the_first_piece_fences_the_incarnation_it_removes() {
    for version in [3, 4] {
        let (_dir, reg) = registry();
        let all: Vec<u64> = (0..10_000).collect();
        let mut cmds = vec![Command::SetClusterVersion { version }, dn(1)];
        cmds.extend(register(1, 2, &all));
        apply(&reg, 1, &cmds);
        let first = apply(&reg, 10, &[piece(1, None)]);
        assert!(
            matches!(first[..], [CommandResult::RemovalPiece { gone: false, .. }]),
            "{first:?}"
        );
        let late = apply(&reg, 11, &register(1, 2, &[0, 1, 2, 1_000_000]));
        let prune = Command::PruneReplicas {
            datanode: 1,
            epoch: 2,
            from_bucket: 0,
        };
        let pruned = apply(&reg, 12, &[prune]);
        let rest = remove_in_pieces(&reg, 13, 1, Some(2));
        if version == 3 {
            // The incarnation's batches still land, and go with it.
            assert!(
                matches!(late[..], [CommandResult::ShardsRegistered { .. }]),
                "{late:?}"
            );
            assert_eq!(removed(&rest), 10_000 - 4_096 + 4);
        } else {
            // Its batch and its prune are fenced: the removal has only what was there left.
            let fenced = vec![CommandResult::Fenced { current_epoch: 3 }];
            assert_eq!((late, pruned), (fenced.clone(), fenced));
            assert_eq!(removed(&rest), 10_000 - 4_096);
        }
        assert!(!anything_of(&reg, 1));
        assert_eq!(reg.current().replica_count().unwrap(), 0);
        // The floor kept is the fenced epoch: the id's next registration starts above it (at
        // index 1, below the floor, so the floor decides).
        let floor = if version == 3 { 2 } else { 3 };
        assert_eq!(epoch(&apply(&reg, 1, &[dn(1)])[0]), floor + 1);
    }
}

#[test]
fn a_removal_stops_at_a_new_incarnation() {
    let (_dir, reg) = registry();
    let all: Vec<u64> = (0..5_000).collect();
    register_datanode_1(&reg, &all);
    let r = apply(&reg, 10, &[piece(1, None)]);
    assert!(
        matches!(
            r[0],
            CommandResult::RemovalPiece {
                gone: false,
                registered_index: 1,
                ..
            }
        ),
        "{r:?}"
    );
    // The datanode registers again (epoch 11) and reports a shard: the removal's next piece,
    // for the incarnation registered at index 1, is fenced and changes nothing.
    let mut again = vec![dn(1)];
    again.extend(register(1, 11, &[0]));
    apply(&reg, 11, &again);
    let before = reg.content().unwrap();
    let r = apply(&reg, 13, &[piece(1, Some(1))]);
    assert_eq!(r, vec![CommandResult::Fenced { current_epoch: 11 }]);
    assert!(
        reg.content().unwrap() == before,
        "a fenced piece changes nothing"
    );
    assert_eq!(reg.datanode(1).unwrap().unwrap().shards, 5_000 - 4_096 + 1);
}

#[test]
fn pieces_record_the_replicas_they_drop_and_the_last_the_removal() {
    let (_dir, reg) = registry();
    let all: Vec<u64> = (0..5_000).collect();
    register_datanode_1(&reg, &all);
    let g = reg.current();
    let mut b = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
    b.execute(10, &piece(1, None)).unwrap();
    let first = b.take_changes();
    b.execute(11, &piece(1, Some(1))).unwrap();
    let last = b.take_changes();
    assert_eq!(
        first,
        vec![ChangeEvent {
            index: 10,
            change: Change::ReplicasRemoved {
                datanode: 1,
                shards: (0..4_096).collect()
            }
        }]
    );
    assert_eq!(
        last,
        vec![ChangeEvent {
            index: 11,
            change: Change::DatanodeRemoved {
                id: 1,
                replicas_removed: 5_000 - 4_096
            }
        }]
    );
}

#[test]
fn a_removed_datanode_comes_back_with_an_epoch_above_its_last() {
    let (_dir, reg) = registry();
    let raised = Command::RegisterDatanodeAtLeast {
        id: 1,
        addr: "a:1".into(),
        min_epoch: 100,
    };
    let out = apply(&reg, 5, &[raised, piece(1, None)]);
    assert_eq!(epoch(&out[0]), 100);
    // Registered again when the log reaches the former epoch: one above it, so a zombie of
    // the removed incarnation is fenced.
    let out = apply(&reg, 100, &[dn(1)]);
    assert_eq!(epoch(&out[0]), 101);
    let zombie = register(1, 100, &[7]);
    assert_eq!(
        apply(&reg, 101, &zombie),
        vec![CommandResult::Fenced { current_epoch: 101 }]
    );
    // The floor went with the registration (the record holds the epoch now); the next
    // removal keeps the new one.
    let floors = |reg: &Registry| -> Vec<(Vec<u8>, Vec<u8>)> {
        contents(reg)
            .into_iter()
            .filter(|(k, _)| k[0] == keys::EPOCH_FLOOR)
            .collect()
    };
    assert!(floors(&reg).is_empty());
    apply(&reg, 102, &[piece(1, None)]);
    assert_eq!(
        floors(&reg),
        vec![(
            keys::epoch_floor(1).to_vec(),
            codec::encode(&101u64).unwrap()
        )]
    );
    // Below the log index the floor changes nothing.
    assert_eq!(epoch(&apply(&reg, 200, &[dn(1)])[0]), 200);
}

#[test]
fn a_removal_in_one_entry_keeps_the_floor_only_in_a_cluster_of_version_3() {
    let raised = |id| Command::RegisterDatanodeAtLeast {
        id,
        addr: "a:1".into(),
        min_epoch: 100,
    };
    // Version 2 (as every build of version 2 applies it): the epoch starts again at the index.
    let (_dir, reg) = registry();
    apply(&reg, 1, &[Command::SetClusterVersion { version: 2 }]);
    apply(&reg, 5, &[raised(1), Command::RemoveDatanode { id: 1 }]);
    assert_eq!(epoch(&apply(&reg, 100, &[dn(1)])[0]), 100);
    // Version 3: it is kept.
    let (_dir, reg) = registry();
    apply(&reg, 1, &[Command::SetClusterVersion { version: 3 }]);
    apply(&reg, 5, &[raised(1), Command::RemoveDatanode { id: 1 }]);
    assert_eq!(epoch(&apply(&reg, 100, &[dn(1)])[0]), 101);
}

#[test]
fn a_removal_leaves_no_index_entry_behind_even_one_out_of_step() {
    let (_dir, reg) = registry();
    register_datanode_1(&reg, &[1, 2, 3]);
    // An index entry naming a bucket where the datanode holds nothing.
    let tree = &reg.current().tree;
    tree.insert(&keys::by_datanode(1, 999)[..], keys::PRESENT)
        .unwrap();
    let pieces = remove_in_pieces(&reg, 10, 1, None);
    assert_eq!(removed(&pieces), 3);
    assert!(!anything_of(&reg, 1), "{:?}", contents(&reg).len());
}

/// From version 7 the first piece marks the datanode as being removed: the epoch it raised the
/// datanode to, which no registration gave, is fenced too (a client that read it from the
/// datanode's view, or from a 409, could otherwise revive the datanode under it, and the
/// removal would silently drop what it registered). Below 7 nothing marks it, as older builds
/// apply it.
#[test]
fn from_version_7_no_request_is_taken_under_the_epoch_a_removal_raised() {
    for version in [6, 7] {
        let (_dir, reg) = registry();
        let all: Vec<u64> = (0..10_000).collect();
        let mut cmds = vec![Command::SetClusterVersion { version }, dn(1)];
        cmds.extend(register(1, 2, &all));
        apply(&reg, 1, &cmds);
        apply(&reg, 10, &[piece(1, None)]);
        let raised = reg.datanode(1).unwrap().unwrap();
        assert_eq!(raised.epoch, 3);
        assert_eq!(raised.removing, version == 7);
        let marks = |reg: &Registry| {
            contents(reg)
                .iter()
                .filter(|(k, _)| k[0] == keys::EPOCH_FLOOR)
                .count()
        };
        assert_eq!(marks(&reg), usize::from(version == 7));
        let before = reg.content().unwrap();
        // Under the raised epoch, and under the removed incarnation's own.
        let requests = [
            register(1, 3, &[1_000_000]).remove(0),
            Command::PruneReplicas {
                datanode: 1,
                epoch: 3,
                from_bucket: 0,
            },
            Command::DeregisterShardsOf {
                datanode: 1,
                epoch: 3,
                shards: vec![9_999],
            },
            register(1, 2, &[1_000_001]).remove(0),
        ];
        let answers = apply(&reg, 11, &requests);
        if version == 6 {
            assert!(
                matches!(
                    answers[0],
                    CommandResult::ShardsRegistered { accepted: 1, .. }
                ),
                "{answers:?}"
            );
            continue;
        }
        let fenced = CommandResult::FencedForRemoval { current_epoch: 3 };
        assert_eq!(answers, vec![fenced; 4]);
        assert!(reg.content().unwrap() == before, "fenced: nothing changed");
        // The removal ends with what the first piece left; the mark becomes the floor.
        let rest = remove_in_pieces(&reg, 20, 1, Some(2));
        assert_eq!(removed(&rest), 10_000 - 4_096);
        assert!(!anything_of(&reg, 1));
        assert_eq!(epoch(&apply(&reg, 1, &[dn(1)])[0]), 4);
        assert_eq!(marks(&reg), 0, "a registration takes the floor");
    }
}

/// A datanode that registers again while it is being removed stays, unmarked: its new
/// incarnation's requests are taken, and the removal's next piece ends it.
#[test]
fn a_registration_during_a_removal_drops_its_mark() {
    let (_dir, reg) = registry();
    let all: Vec<u64> = (0..10_000).collect();
    let mut cmds = vec![Command::SetClusterVersion { version: 7 }, dn(1)];
    cmds.extend(register(1, 2, &all));
    apply(&reg, 1, &cmds);
    apply(&reg, 10, &[piece(1, None)]);
    assert!(reg.datanode(1).unwrap().unwrap().removing);
    let mut again = vec![dn(1)];
    again.extend(register(1, 11, &[1_000_000]));
    let answers = apply(&reg, 11, &again);
    assert!(
        matches!(
            answers[1],
            CommandResult::ShardsRegistered { accepted: 1, .. }
        ),
        "{answers:?}"
    );
    let back = reg.datanode(1).unwrap().unwrap();
    assert_eq!((back.epoch, back.removing), (11, false));
    assert!(!contents(&reg)
        .iter()
        .any(|(k, _)| k[0] == keys::EPOCH_FLOOR));
    assert_eq!(
        apply(&reg, 13, &[piece(1, Some(2))]),
        vec![CommandResult::Fenced { current_epoch: 11 }]
    );
}
