//! Tests of the cluster's epoch floor (`RaiseEpochFloor`): every registration from the raise on
//! gets an epoch of at least the floor, and the floor never falls; and of a restore's claim on
//! the cluster, with the mark it keeps until the restore ends.

use super::tests::{apply, dn, epoch, register, registry};
use super::*;
use crate::records::{RestoreMark, RestoreOrigin};
use crate::registry::Registry;

fn raise(at_least: u64) -> Command {
    Command::RaiseEpochFloor { at_least }
}

#[test]
fn every_registration_after_the_raise_starts_at_the_floor_or_above() {
    let (_dir, reg) = registry();
    // Registered before the raise: at its log index.
    assert_eq!(epoch(&apply(&reg, 3, &[dn(1)])[0]), 3);
    assert_eq!(
        apply(&reg, 4, &[raise(1_000)]),
        vec![CommandResult::EpochFloor { floor: 1_000 }]
    );
    // A datanode the cluster never saw, and one registering again, start at the floor; a zombie
    // of the earlier incarnation is fenced as ever.
    let out = apply(&reg, 5, &[dn(2), dn(1)]);
    assert_eq!((epoch(&out[0]), epoch(&out[1])), (1_000, 1_000));
    assert_eq!(
        apply(&reg, 7, &register(1, 3, &[9])),
        vec![CommandResult::Fenced {
            current_epoch: 1_000
        }]
    );
    // Above the floor, epochs go on rising as before.
    assert_eq!(epoch(&apply(&reg, 8, &[dn(1)])[0]), 1_001);
    assert_eq!(epoch(&apply(&reg, 2_000, &[dn(2)])[0]), 2_000);
    // `min_epoch` above the floor still counts.
    let at_least = Command::RegisterDatanodeAtLeast {
        id: 3,
        addr: "a:1".into(),
        min_epoch: 5_000,
    };
    assert_eq!(epoch(&apply(&reg, 2_001, &[at_least])[0]), 5_000);
}

#[test]
fn the_floor_never_falls_and_the_highest_counts_removed_datanodes_too() {
    let (_dir, reg) = registry();
    let out = apply(&reg, 1, &[raise(500), raise(200), raise(0)]);
    assert_eq!(out, vec![CommandResult::EpochFloor { floor: 500 }; 3]);
    assert_eq!(reg.highest_epoch_floor().unwrap(), 500);
    assert_eq!(epoch(&apply(&reg, 4, &[dn(1)])[0]), 500);
    // A removed datanode's floor above the cluster's is the highest.
    apply(&reg, 5, &[dn(1), Command::RemoveDatanode { id: 1 }]);
    apply(&reg, 7, &[Command::SetClusterVersion { version: 4 }]);
    apply(&reg, 8, &[dn(2), Command::RemoveDatanode { id: 2 }]);
    assert_eq!(reg.highest_epoch_floor().unwrap(), 500);
    let raised = Command::RegisterDatanodeAtLeast {
        id: 3,
        addr: "a:1".into(),
        min_epoch: 900,
    };
    apply(&reg, 10, &[raised, Command::RemoveDatanode { id: 3 }]);
    assert_eq!(reg.highest_epoch_floor().unwrap(), 900);
}

fn claim(at_least: u64) -> Command {
    Command::ClaimForRestore { at_least }
}

fn put(key: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: b"v".to_vec(),
        if_revision: None,
    }
}

/// A restore's claim takes a fresh cluster only: the first of two claims raises the floor, and
/// the floor it raised refuses the second; a datanode or a key refuses one too, also one that
/// the same batch writes (and not one it deletes). A refused claim changes nothing.
#[test]
fn a_claim_takes_a_fresh_cluster_once() {
    let (_dir, reg) = registry();
    let out = apply(&reg, 1, &[claim(700), claim(900)]);
    assert_eq!(out[0], CommandResult::EpochFloor { floor: 700 });
    let refused = CommandResult::NotFresh {
        floor: 700,
        datanodes: false,
        keys: false,
    };
    assert_eq!(out[1], refused);
    assert_eq!(apply(&reg, 3, &[claim(900)]), vec![refused]);
    assert_eq!(reg.highest_epoch_floor().unwrap(), 700);

    let (_dir, reg) = registry();
    let out = apply(&reg, 1, &[dn(1), claim(700), put("k"), claim(700)]);
    assert_eq!(
        (&out[1], &out[3]),
        (
            &CommandResult::NotFresh {
                floor: 0,
                datanodes: true,
                keys: false,
            },
            &CommandResult::NotFresh {
                floor: 0,
                datanodes: true,
                keys: true,
            }
        )
    );
    assert_eq!(reg.highest_epoch_floor().unwrap(), 0);
    // What the batch deletes does not count; what it writes does, before it is committed.
    let delete = |key: &str| Command::Delete {
        key: key.into(),
        if_revision: None,
    };
    let out = apply(&reg, 5, &[Command::RemoveDatanode { id: 1 }, delete("k")]);
    assert!(matches!(
        out[0],
        CommandResult::DatanodeRemoved { existed: true, .. }
    ));
    let out = apply(&reg, 7, &[put("a"), claim(700), delete("a"), claim(800)]);
    assert!(matches!(out[1], CommandResult::NotFresh { keys: true, .. }));
    assert_eq!(out[3], CommandResult::EpochFloor { floor: 800 });
}

fn begin(at_least: u64) -> Command {
    Command::BeginRestore {
        at_least,
        origin: RestoreOrigin {
            index: 40,
            datanodes: 2,
            replicas: 7,
            keys: 1,
        },
    }
}

fn mark(reg: &Registry) -> Option<RestoreMark> {
    reg.current().restore_mark().unwrap()
}

/// A marked claim marks the cluster only when it takes it: the mark names the claim's index and
/// the backup, and stays while the restore writes, until its end removes it. An end in a cluster
/// without a mark changes nothing.
#[test]
fn a_marked_claim_marks_the_cluster_until_its_restore_ends() {
    let (_dir, reg) = registry();
    let out = apply(&reg, 3, &[begin(700), begin(900)]);
    assert_eq!(out[0], CommandResult::EpochFloor { floor: 700 });
    assert!(matches!(out[1], CommandResult::NotFresh { floor: 700, .. }));
    let marked = mark(&reg).expect("the claim marks the cluster");
    assert_eq!(marked.claimed_at, 3);
    assert_eq!(
        (marked.origin.index, marked.origin.replicas),
        (40, 7),
        "{marked:?}"
    );
    assert_eq!(marked.floor, 700);
    // The restore's writes leave it.
    let restored = Command::RegisterDatanodeAtLeast {
        id: 1,
        addr: "a:1".into(),
        min_epoch: 700,
    };
    apply(&reg, 5, &[restored, put("k")]);
    assert_eq!(mark(&reg), Some(marked));
    let out = apply(&reg, 8, &[Command::EndRestore, Command::EndRestore]);
    let none = CommandResult::RestoreEnded { ended: None };
    assert_eq!(
        out,
        vec![
            CommandResult::RestoreEnded {
                ended: Some(marked),
            },
            none.clone(),
        ]
    );
    assert_eq!(mark(&reg), None);
    assert_eq!(reg.highest_epoch_floor().unwrap(), 700);
    // A datanode registers again once the restore ended.
    assert!(matches!(
        apply(&reg, 10, &[dn(2)])[0],
        CommandResult::DatanodeRegistered { id: 2, .. }
    ));

    // A claim refused (the cluster holds a datanode) marks nothing; an end without a mark is
    // answered as such.
    let (_dir, reg) = registry();
    let out = apply(&reg, 1, &[dn(1), begin(700), Command::EndRestore]);
    assert!(matches!(out[1], CommandResult::NotFresh { .. }));
    assert_eq!(out[2], none);
    assert_eq!(mark(&reg), None);
}

/// While a restore runs, a datanode's registration that is not the restore's (it asks for no
/// epoch of at least the restore's floor) and a drop of replicas fenced by no epoch are refused,
/// with nothing written; the restore's registrations, and what their epochs fence, go on.
#[test]
fn a_datanode_waits_while_a_restore_runs() {
    let (_dir, reg) = registry();
    apply(&reg, 3, &[begin(700)]);
    let under_way = CommandResult::RestoreUnderWay { claimed_at: 3 };
    let below = Command::RegisterDatanodeAtLeast {
        id: 2,
        addr: "a:1".into(),
        min_epoch: 699,
    };
    assert_eq!(apply(&reg, 4, &[dn(1), below]), vec![under_way.clone(); 2]);
    assert_eq!(reg.datanode_count().unwrap(), 0);
    let restored = Command::RegisterDatanodeAtLeast {
        id: 1,
        addr: "a:1".into(),
        min_epoch: 700,
    };
    assert_eq!(epoch(&apply(&reg, 6, &[restored])[0]), 700);
    let out = apply(&reg, 7, &register(1, 700, &[5, 6]));
    assert!(matches!(
        out[0],
        CommandResult::ShardsRegistered { accepted: 2, .. }
    ));
    let unfenced = Command::DeregisterShards {
        datanode: 1,
        shards: vec![5],
    };
    assert_eq!(
        apply(&reg, 8, std::slice::from_ref(&unfenced)),
        vec![under_way]
    );
    let fenced = Command::DeregisterShardsOf {
        datanode: 1,
        epoch: 700,
        shards: vec![6],
    };
    assert_eq!(
        apply(&reg, 9, &[fenced]),
        vec![CommandResult::ShardsDeregistered { removed: 1 }]
    );
    apply(&reg, 10, &[Command::EndRestore]);
    assert_eq!(
        apply(&reg, 11, &[unfenced]),
        vec![CommandResult::ShardsDeregistered { removed: 1 }]
    );
}

fn restore_put(key: &str) -> Command {
    Command::RestorePut {
        key: key.into(),
        value: b"restored".to_vec(),
    }
}

/// The value of `key`, if it exists.
fn value(reg: &Registry, key: &str) -> Option<Vec<u8>> {
    reg.kv_get(key).unwrap().map(|e| e.value)
}

fn begin_holding_keys(at_least: u64) -> Command {
    let Command::BeginRestore { origin, .. } = begin(at_least) else {
        unreachable!()
    };
    Command::BeginRestoreHoldingKeys { at_least, origin }
}

/// While a restore whose claim held keys back runs, only its own key writes go on: a client's
/// write or delete of a key is refused with nothing written, and the restore's write creates its
/// key, never overwrites one. Without a mark the restore's writes are refused; once it ends, the
/// clients' go on again. A claim refused (the cluster is not fresh) holds nothing back.
#[test]
fn keys_wait_while_a_restore_that_holds_them_runs() {
    let (_dir, reg) = registry();
    let not_restoring = vec![CommandResult::NotRestoring];
    assert_eq!(apply(&reg, 2, &[restore_put("a")]), not_restoring);
    assert_eq!(value(&reg, "a"), None);
    apply(&reg, 3, &[begin_holding_keys(700)]);
    assert_eq!(mark(&reg).map(|m| m.claimed_at), Some(3));
    let under_way = CommandResult::RestoreUnderWay { claimed_at: 3 };
    let delete = Command::Delete {
        key: "a".into(),
        if_revision: None,
    };
    let out = apply(
        &reg,
        4,
        &[put("k"), restore_put("a"), restore_put("a"), put("a")],
    );
    assert_eq!(
        out,
        vec![
            under_way.clone(),
            CommandResult::Put { revision: 5 },
            CommandResult::RevisionMismatch { current: 5 },
            under_way.clone(),
        ]
    );
    assert_eq!(
        apply(&reg, 8, std::slice::from_ref(&delete)),
        vec![under_way]
    );
    assert_eq!(value(&reg, "a").as_deref(), Some(&b"restored"[..]));
    assert_eq!(value(&reg, "k"), None);

    apply(&reg, 9, &[Command::EndRestore]);
    assert_eq!(apply(&reg, 10, &[restore_put("b")]), not_restoring);
    let out = apply(&reg, 11, &[put("k"), delete, begin_holding_keys(900)]);
    assert_eq!(
        out[..2],
        [
            CommandResult::Put { revision: 11 },
            CommandResult::Deleted {
                existed: true,
                revision: 12
            },
        ]
    );
    assert!(matches!(out[2], CommandResult::NotFresh { .. }), "{out:?}");
    assert_eq!(
        apply(&reg, 14, &[put("k")]),
        vec![CommandResult::Put { revision: 14 }]
    );
}

/// A restore whose claim did not hold keys back (an older build's, `BeginRestore`) lets clients
/// write keys while it runs, as its own key writes are plain ones; its own `RestorePut`s are
/// taken too.
#[test]
fn keys_are_written_during_a_restore_that_does_not_hold_them() {
    let (_dir, reg) = registry();
    apply(&reg, 2, &[begin(700)]);
    assert_eq!(
        apply(&reg, 3, &[put("k"), restore_put("a")]),
        vec![
            CommandResult::Put { revision: 3 },
            CommandResult::Put { revision: 4 }
        ]
    );
    assert!(mark(&reg).is_some());
}
