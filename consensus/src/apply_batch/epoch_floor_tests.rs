//! Tests of the cluster's epoch floor (`RaiseEpochFloor`): every registration from the raise on
//! gets an epoch of at least the floor, and the floor never falls.

use super::tests::{apply, dn, epoch, register, registry};
use super::*;

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
